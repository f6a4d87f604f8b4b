"""The Ax/BoTorch outer loop: a persistent study whose trials are A/B tests.

Daulton et al. (2019), section 5.3: jointly tune TS-ASC's ``alpha`` and the reward offsets
``omega`` with Bayesian optimisation; the objective is the quality preserved at 1080p, the
outcome constraint is reliability no lower than the baseline's, each parameterization is an A/B
test measuring the mean and standard error of every metric, and the acquisition function is
Noisy Expected Improvement.

Built on ``ax.api.Client`` (``AxClient`` is deprecated). Choices where the issue is silent:

* **Generation strategy, built explicitly**: a Sobol node (``sobol_trials`` quasi-random
  trials; it hands over once that many trials exist *and* half of them are observed), then a
  BoTorch node (``Generators.BOTORCH_MODULAR``: Ax's default surrogate, a ``SingleTaskGP``
  over the unit-cube-normalised parameters with standardised outcomes, one per modelled
  metric) with ``botorch_acqf_class=qLogNoisyExpectedImprovement`` named explicitly (the
  numerically robust form of the paper's Noisy EI; ``acquisition="qNoisyExpectedImprovement"``
  selects the original). The trials' standard errors go to Ax as known observation noise
  (``(mean, sem)`` data: the GP uses them as fixed heteroskedastic noise). Only the objective
  and constraint metrics are modelled (``fit_tracking_metrics=False``): the others are
  recorded for the report.
* **Trials in flight**: ``Study.run`` keeps ``parallel`` trials running (Ax generates a
  new one with the running ones as pending points); each runs in its own worker process
  (``bayes_safe.tuning.runners``) or on a Dask cluster.
* **Seeds**: trial ``i`` runs its A/B test with seed ``seed * 100003 + i`` (stored in the
  trial's run metadata); a trial is a pure function of (parameters, seed).
* **Crash safety**: Ax saves every trial to the database as it is created, and again (with its
  data) when it completes, so a completed trial is never lost. When a study starts running
  (``run``, after ``load``), trials still marked RUNNING were interrupted: one whose
  data was already saved (the process died between saving the data and the status) is marked
  completed, any other is marked ABANDONED with ``interrupted`` in its run metadata (kept in
  the study, never modelled) and its parameters are run again as a new trial, so nothing is
  counted twice. A study is locked while it runs (an SQLite file, or a PostgreSQL advisory lock;
  ``bayes_safe.tuning.storage.study_lock``), and loading it writes nothing (``Study.load`` does
  not re-save what it read, as Ax's ``Client.load_from_database`` does), so a second process
  refused by the lock has not touched the running study.
* **The re-run queue lives in the database, not in memory**: it is derived, every time a run
  starts, from the stored trials: an ABANDONED ``interrupted`` trial is owed a re-run while no
  later trial has the same parameters (the same arm). A re-run trial is created with its
  ``rerun_of`` link in one save, and it has the abandoned trial's arm, so a kill at any point
  neither loses a re-run (the queue is derived again) nor doubles one (a re-run that was
  itself interrupted is abandoned and owed one re-run in its turn; the earlier trial is not).
  The study also stores its parallelism (``parallel`` in its properties) as the run starts,
  so ``tune resume`` after a crash keeps it (``--parallel`` overrides it).
* **Signals**: while ``run`` works in the main thread it handles SIGINT, SIGTERM and SIGHUP
  (those whose handler is the default: a ``nohup`` run still ignores SIGHUP) alike: the loop
  stops at its next step (within 0.25 s, or once a BoTorch candidate being generated is
  ready), the worker processes are killed, the trials in flight are marked ABANDONED
  ``interrupted`` (re-run on resume), the session is recorded, and ``StudyInterrupted`` (a
  ``KeyboardInterrupt``; ``exit_status`` 128 + the signal number: 130, 143, 129) is raised.
  A second signal during that stop interrupts at once (what it leaves RUNNING is settled on
  resume). A trial whose worker died while a signal was pending (SIGTERM sent to the whole
  process group) is abandoned, not failed. Worker processes die with the study process, even
  after SIGKILL (``bayes_safe.tuning.runners``).
* **Infrastructure failures**: losing the Dask scheduler fails no trial: the study stops at
  once, marks the trials in flight ABANDONED ``interrupted`` (re-run on resume, on any runner)
  and raises ``InfrastructureError`` (a ``RuntimeError``) naming the scheduler's address.
* **Failures**: a trial whose simulation raises is marked FAILED with the error as its reason,
  and the study goes on; it stops with an error after ``max_failures`` failures in one run.
* **Budget**: ``run(trials=N)`` runs until ``N`` trials are completed (failed and abandoned
  ones do not count).
* **Tracking**: ``Study(tracker=...)`` (a ``bayes_safe.tuning.tracking.Tracker``, e.g.
  ``MlflowTracker``) logs every trial when it finishes (completed or failed), after Ax has saved
  it; ``run`` first logs the finished trials the tracker lacks, so a crash loses none, and the
  tracker knows a trial by the study's ``uid`` and its index, so none is logged twice. A
  tracker that fails does not stop the study (``tracking_failed`` events; the trial is logged
  by the next run).
* **Torch threads**: Ax/BoTorch runs with one torch thread. Measured on this 2-core machine
  under load: generating one BoTorch candidate took 77 s with torch's default two threads and
  3.3 s with one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence

from bayes_safe.envs.tolerance import TOLERANCE_MEANING
from bayes_safe.progress import progress_bar
from bayes_safe.threads import single_thread

from . import storage as _storage
from .ab_test import ABTest, Range
from .ranges import Choice, parse_parameter

__all__ = ["ACQUISITION_FUNCTIONS", "MDC_FACTOR", "InfrastructureError", "Study", "StudyInterrupted", "check_optimizer",
           "make_generation_strategy"]

PROPERTY_KEY = "bayes_safe_tuning"
ACQUISITION_FUNCTIONS = ("qLogNoisyExpectedImprovement", "qNoisyExpectedImprovement")
#: Ax's default budget of the acquisition optimiser (multi-start L-BFGS-B: 20 restarts chosen
#: from 1,024 raw samples); a study uses it unless the user lowers it (``optimizer=``)
OPTIMIZER = {"num_restarts": 20, "raw_samples": 1024}
#: minimum detectable change in standard errors: z(0.975) + z(0.80), 5 % two-sided level, 80 % power
MDC_FACTOR = 1.959964 + 0.841621
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: seconds between two checks for a stop signal while trials run
POLL_SECONDS = 0.25
#: the signals ``Study.run`` turns into a clean stop (those present on this system)
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _trial_list(indices: Sequence[int]) -> str:
    if not indices:
        return "no trial was in flight"
    return (f"trial{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))} in flight marked abandoned "
            "(re-run on resume)")


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def _log_ndtr(z: float) -> float:
    """``log Phi(z)``, accurate far in the lower tail (``torch.special.log_ndtr``: no underflow to
    ``log 0`` where ``Phi`` itself is below the smallest double)."""
    import torch

    return float(torch.special.log_ndtr(torch.tensor(float(z), dtype=torch.float64)))


def _standardised_margin(value: float, sd: float, op: str, bound: float) -> float:
    """How many SDs ``value`` lies inside its bound (negative: outside). An SD of 0 is floored at a
    billionth of the numbers' scale, so the margin stays finite (and hugely negative when outside)."""
    sd = max(float(sd), 1e-9 * max(1.0, abs(bound), abs(value)))
    z = (value - bound) / sd
    return z if op == ">=" else -z


def log_feasibility(constraints, metrics: Mapping[str, tuple[float, float]]) -> float:
    """``log P(every constraint holds)`` from ``{metric: (mean, sd)}`` (a model's prediction or a
    trial's mean and SEM), the constraints treated as independent: the sum over constraints of
    ``log Phi(standardised margin)`` (``_log_ndtr``). Finite however far a trial misses (where
    ``P`` underflows to 0 and every trial would tie); NaN when a metric is missing.
    ``constraints``: ``Study.constraints`` (``[(weights, op, bound)]``)."""
    total = 0.0
    for weights, op, bound in constraints:
        if any(m not in metrics for m in weights):
            return float("nan")
        mean = sum(w * metrics[m][0] for m, w in weights.items())
        sd = math.sqrt(sum((w * metrics[m][1]) ** 2 for m, w in weights.items()))
        total += _log_ndtr(_standardised_margin(mean, sd, op, bound))
    return total


@contextlib.contextmanager
def _quiet_best_point():
    """Ax's best-point utility (``ax.service.utils.best_point``) logs ERROR "Encountered error while
    trying to identify the best point" when no trial is feasible: a normal outcome of a study, which
    the report states in its own words. That one logger is silenced for the call, then restored."""
    log = logging.getLogger("ax.service.utils.best_point")
    previous = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(previous)


def _num(v) -> str:
    return f"{float(v):.4g}"


def _prob_text(logp: float) -> str:
    """A probability given by its log, readable however small: ``12 %``, ``3.1e-27``, ``10^-412.3``."""
    if logp is None or math.isnan(logp):
        return "n/a"
    if logp >= math.log(0.01):
        return f"{100 * math.exp(logp):.0f} %"
    if logp >= -700:
        return f"{math.exp(logp):.2g}"
    return f"10^{logp / math.log(10):.0f}"


def _spearman(x, y) -> float:
    import numpy as np

    if len(x) < 3:
        return float("nan")
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _cv_verdict(metric: str, n: int, coverage: float, rank: float) -> dict:
    """A verdict in words on a metric's leave-one-out cross-validation."""
    if n < 5:
        return {"ok": None, "verdict": f"too few trials ({n}) to judge the model of {metric}"}
    if coverage < 0.8:
        return {"ok": False, "verdict": (f"poor: {100 * (1 - coverage):.0f} % of held-out trials fall outside the model's "
                                         f"95 % intervals; do not trust its surface or predictions of {metric}")}
    if not (rank >= 0.5):
        return {"ok": False, "verdict": (f"uninformative: the intervals cover the held-out trials but the model barely "
                                         f"ranks them (rank correlation {rank:.2f}); it has learned little about {metric} "
                                         "beyond the noise")}
    return {"ok": True, "verdict": (f"good: held-out trials fall inside the 95 % intervals ({100 * coverage:.0f} %) and "
                                    f"the model ranks them (rank correlation {rank:.2f})")}


class StudyInterrupted(KeyboardInterrupt):
    """``Study.run`` stopped on a signal (SIGINT, SIGTERM, SIGHUP).

    Attributes:
        signum: the signal.
        abandoned: the trials in flight, marked ABANDONED (re-run when the study runs again).
        exit_status: ``128 + signum`` (130 for Ctrl-C, 143 for SIGTERM), the shell's convention.
    """

    def __init__(self, signum: int, abandoned: Sequence[int] = ()):
        self.signum = int(signum)
        self.abandoned = list(abandoned)
        self.exit_status = 128 + self.signum
        super().__init__(f"interrupted by {_signal_name(self.signum)}: {_trial_list(self.abandoned)}")


class InfrastructureError(RuntimeError):
    """Where the trials run was lost (the Dask scheduler); no trial failed for it.

    Attributes:
        abandoned: the trials in flight, marked ABANDONED (re-run when the study runs again).
    """

    def __init__(self, message: str, abandoned: Sequence[int] = ()):
        self.abandoned = list(abandoned)
        super().__init__(message)


class _Stop(Exception):
    """Internal: a stop signal was received; raised at the run loop's next step."""


class _StopSignals:
    """Turn SIGINT / SIGTERM / SIGHUP into a flag the run loop checks (main thread only; a signal
    whose handler is not the default, e.g. SIGHUP under ``nohup``, is left alone)."""

    def __init__(self):
        self.signum: int | None = None
        self.stopping = False
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                current = signal.getsignal(sig)
                if current is signal.SIG_DFL or current is signal.default_int_handler:
                    with contextlib.suppress(ValueError, OSError):
                        self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        elif not self.stopping:
            self.stopping = True
            raise StudyInterrupted(signum)  # a second signal: stop now

    def check(self) -> None:
        if self.signum is not None:
            raise _Stop

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)
        self._previous.clear()


def _acqf_class(name: str):
    if name == "qLogNoisyExpectedImprovement":
        from botorch.acquisition.logei import qLogNoisyExpectedImprovement

        return qLogNoisyExpectedImprovement
    if name == "qNoisyExpectedImprovement":
        from botorch.acquisition.monte_carlo import qNoisyExpectedImprovement

        return qNoisyExpectedImprovement
    raise ValueError(f"acquisition: expected one of {list(ACQUISITION_FUNCTIONS)}, got {name!r}")


def _botorch_kwargs(acquisition: str) -> dict:
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig, SurrogateSpec

    return {
        "surrogate_spec": SurrogateSpec(model_configs=[ModelConfig(name="SingleTaskGP (Ax default)")]),
        "botorch_acqf_class": _acqf_class(acquisition),
        "fit_tracking_metrics": False,
    }


def check_optimizer(optimizer) -> dict | None:
    """``None`` (Ax's default budget) or ``{"num_restarts": int, "raw_samples": int}`` (either key)."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, Mapping) or not optimizer or set(optimizer) - set(OPTIMIZER):
        raise ValueError(f"optimizer: expected a dict with num_restarts and/or raw_samples, got {optimizer!r}")
    out = {}
    for key, v in optimizer.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"optimizer: {key} expects a positive int, got {v!r}")
        out[key] = v
    if out.get("num_restarts", OPTIMIZER["num_restarts"]) > out.get("raw_samples", OPTIMIZER["raw_samples"]):
        raise ValueError(f"optimizer: num_restarts cannot exceed raw_samples, got {out}")
    return out


def make_generation_strategy(sobol_trials: int, seed: int | None = 0,
                             acquisition: str = "qLogNoisyExpectedImprovement", optimizer: Mapping | None = None):
    """Sobol for ``sobol_trials`` trials, then BoTorch with (log) noisy expected improvement; the
    acquisition optimiser runs with Ax's default budget unless ``optimizer`` lowers it."""
    from ax.adapter.registry import Generators
    from ax.core.trial_status import TrialStatus
    from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials

    if isinstance(sobol_trials, bool) or not isinstance(sobol_trials, int) or sobol_trials < 1:
        raise ValueError(f"sobol_trials: expected a positive int, got {sobol_trials!r}")
    optimizer = check_optimizer(optimizer)
    bo_name = "BoTorch"
    sobol = GenerationNode(
        name="Sobol",
        generator_specs=[GeneratorSpec(generator_enum=Generators.SOBOL, generator_kwargs={"seed": seed})],
        transition_criteria=[
            MinTrials(threshold=sobol_trials, transition_to=bo_name, use_all_trials_in_exp=True,
                      not_in_statuses=[TrialStatus.FAILED, TrialStatus.ABANDONED]),
            MinTrials(threshold=max(1, math.ceil(sobol_trials / 2)), transition_to=bo_name, use_all_trials_in_exp=True,
                      only_in_statuses=[TrialStatus.COMPLETED], count_only_trials_with_data=True),
        ],
        should_deduplicate=True,
    )
    botorch = GenerationNode(
        name=bo_name,
        generator_specs=[GeneratorSpec(generator_enum=Generators.BOTORCH_MODULAR, generator_kwargs=_botorch_kwargs(acquisition),
                                       generator_gen_kwargs={"model_gen_options": {"optimizer_kwargs": {**OPTIMIZER, **optimizer}}}
                                       if optimizer else {})],
        should_deduplicate=True,
    )
    return GenerationStrategy(name=f"Sobol+BoTorch({acquisition})", nodes=[sobol, botorch])


def _quiet_ax(verbose: bool = False) -> None:
    """Import Ax without its import-time INFO lines (unless ``verbose``). Its level while a study
    works is ``_ax_context``'s, and only for the length of the call: another user of Ax in the
    same process keeps the logging it set."""
    previous = logging.root.manager.disable
    if not verbose:
        logging.disable(logging.INFO)  # Ax logs at import time, before its level can be set
    try:
        import ax.api.client  # noqa: F401
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _ax_stderr(verbose: bool):
    """Ax's stderr handler at ERROR (INFO when ``verbose``) for the block, then as it was: Ax logs
    every generated and completed trial at INFO and routine warnings (a constant tracking metric,
    ...) at WARNING."""
    from ax.utils.common.logger import ROOT_STREAM_HANDLER

    previous = ROOT_STREAM_HANDLER.level
    ROOT_STREAM_HANDLER.setLevel(logging.INFO if verbose else logging.ERROR)
    try:
        yield
    finally:
        ROOT_STREAM_HANDLER.setLevel(previous)


@contextlib.contextmanager
def _ax_context(url: str | None = None, verbose: bool = False):
    """One torch thread, BoTorch's routine numerical warnings silenced, Ax's log quiet unless
    ``verbose`` (``_ax_stderr``), and Ax's (process-global) SQL engine pointed at this study's
    database ``url`` (several studies can live in one process)."""
    if url is not None:
        _storage.connect(url)
    with single_thread(), _ax_stderr(verbose), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"botorch\..*")
        warnings.filterwarnings("ignore", module=r"ax\..*")
        warnings.filterwarnings("ignore", module=r"linear_operator\..*")
        warnings.filterwarnings("ignore", module=r"gpytorch\..*")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"scipy\..*")
        yield


def _load_client(client_class, name: str, url: str):
    """``Client.load_from_database`` without its writes.

    Ax 1.3.1's ``load_from_database`` saves the experiment and the generation strategy it has
    just read (``set_experiment`` and ``set_generation_strategy`` both save). Loading a study
    while another process runs it therefore wrote that snapshot over the running study: measured
    on PostgreSQL, a ``tune resume`` refused by the running study's lock had already turned a
    trial the study had completed back to RUNNING and replaced data rows. Here the stored
    experiment and generation strategy are read the same way and attached without a save:
    loading never writes, and the run's lock is the first thing that decides.
    """
    from ax.api.utils.storage import db_settings_from_storage_config
    from ax.storage.sqa_store.with_db_settings_base import WithDBSettingsBase

    config = _storage.storage_config(url)
    reader = WithDBSettingsBase(db_settings=db_settings_from_storage_config(storage_config=config))
    experiment, generation_strategy = reader._load_experiment_and_generation_strategy(experiment_name=name)
    if experiment is None:
        raise ValueError(f"name: no study named {name!r} in {_storage.display_url(url)}")
    client = client_class(storage_config=config)
    client._maybe_experiment = experiment
    if generation_strategy is not None:
        client._maybe_generation_strategy = generation_strategy
        generation_strategy._experiment = experiment
    return client


def _to_ax_parameter(p):
    from ax.api.configs import ChoiceParameterConfig, RangeParameterConfig

    if isinstance(p, Range):
        return RangeParameterConfig(name=p.name, bounds=(float(p.low), float(p.high)),
                                    parameter_type="int" if p.integer else "float", scaling="log" if p.log else None)
    if isinstance(p, RangeParameterConfig):
        Range(p.name, p.bounds[0], p.bounds[1], log=p.scaling == "log", integer=p.parameter_type == "int")  # validates
        return p
    if isinstance(p, ChoiceParameterConfig):
        if len(p.values) < 2:
            raise ValueError(f"parameter {p.name!r}: expected at least two values, got {p.values!r}")
        return p
    if isinstance(p, Choice):
        return ChoiceParameterConfig(name=p.name, values=list(p.values), parameter_type="str", is_ordered=False)
    if isinstance(p, Mapping):
        return _to_ax_parameter(Choice(**p) if "values" in p else Range(**p))
    if isinstance(p, str):
        return _to_ax_parameter(parse_parameter(p))
    raise TypeError(f"parameters: expected Range, ax RangeParameterConfig / ChoiceParameterConfig, dict or "
                    f"'name=low:high' entries, got {type(p).__name__}")


def _check_tracker(tracker) -> None:
    if tracker is None:
        return
    missing = [m for m in ("open", "log_trial", "close") if not callable(getattr(tracker, m, None))]
    if missing:
        raise TypeError(f"tracker: expected a bayes_safe.tuning.tracking.Tracker (open, log_trial, close), got "
                        f"{type(tracker).__name__} without {', '.join(missing)}")


def _timestamp(when) -> float | None:
    """Unix seconds of an Ax trial time, to the whole second: Ax's SQL store keeps whole seconds, so a
    trial just completed and the same trial loaded give the same record."""
    return None if when is None else float(when.replace(microsecond=0).timestamp())


def _parameter_names(p) -> str:
    return p.name


def _metric_names_in(expression: str) -> list[str]:
    return [t for t in _IDENT_RE.findall(expression) if t != "baseline"]


def _check_tolerance_meaning(props: dict, ab_test, experiment, name: str) -> None:
    """A study stored before a relative tolerance meant the slack around the declared factor (issue 41;
    ``bayes_safe.envs.tolerance``) and that tunes one: a ``ValueError`` saying so, since its trials'
    parameters would now build other policies than the ones it measured."""
    if props.get("tolerance_meaning") == TOLERANCE_MEANING:
        return
    from bayes_safe.envs.tolerance import tolerance_name

    declared = getattr(ab_test.problem, "declared", ()) or ()
    searched = set(experiment.search_space.parameters)
    relative = [tolerance_name(c) for c in declared if c.versus_baseline and tolerance_name(c) in searched]
    if relative:
        raise ValueError(f"name: study {name!r} was tuned when a relative tolerance ({', '.join(relative)}) was the "
                         "factor's distance from 1 (at_least=1 - t); it is now the slack around the declared factor "
                         "(at_least=c - t, docs/tuning.md: migration note), so its trials' parameters would build "
                         "other policies than the ones it measured. Its report and best.json stay true as written "
                         "(policy_bounds); start a new study to go on")


class Study:
    """A tuning study: an Ax experiment (search space, objective, outcome constraints,
    generation strategy) whose trials are ``ABTest`` evaluations.

    Args:
        ab_test: evaluates one parameterization (default: ``ABTest`` on the video-upload
            problem with vanilla TS compared).
        name: the experiment's name in the database (default: the problem's name).
        storage: a database URL (``sqlite:///path``, ``postgresql://...``) or an SQLite file
            path; ``None`` keeps the study in memory only (it cannot be resumed).
        parameters: the search space: ``Range`` entries, dicts
            (``{"name", "low", "high"}``), ``"name=low:high"`` strings or Ax
            ``RangeParameterConfig`` / ``ChoiceParameterConfig``; default: the problem's
            (the paper's alpha in [0, 0.06], omega_480 in (0, 0.05], omega_720 in (0, 0.04],
            omega_1080 in (0, 0.03]). For a problem with ``pilot_ranges`` (your own problem with
            ``max_violations``) the default space is sized by a range pilot first (stored as
            ``range_pilot``); ``confidence_<metric>`` parameters given alone join the default space.
        objective: an Ax objective string over the A/B test's metrics (``"q_1080p_change"``
            maximises it, ``"-m"`` minimises ``m``); default: the problem's.
        outcome_constraints: Ax constraint strings (``"reliability_change >= 0"``); default: the
            problem's.
        sobol_trials: quasi-random initial trials (default ``max(5, 2 * number of parameters)``).
        seed: seeds Ax (Sobol, BoTorch) and the trials' A/B tests.
        acquisition: ``"qLogNoisyExpectedImprovement"`` (default) or ``"qNoisyExpectedImprovement"``.
        optimizer: ``None`` (default): the acquisition optimiser has Ax's default budget (20
            restarts from 1,024 raw samples); ``{"num_restarts": 8, "raw_samples": 256}`` lowers it
            (faster candidates on a slow machine, possibly worse ones).
        tracker: a ``bayes_safe.tuning.tracking.Tracker`` (e.g. ``MlflowTracker("runs/mlruns")``)
            that logs every finished trial; ``None`` (default) logs nowhere. The study never
            closes it.

    Raises:
        ValueError: empty or reversed bounds, an objective or constraint naming a metric the A/B
            test does not report, a storage URL that cannot be opened, a name already stored.

    Example:
        >>> study = Study(ABTest(n_users=4_000, batches=2), storage="runs/s.sqlite")  # doctest: +SKIP
        >>> study.run(trials=20, parallel=2)                                           # doctest: +SKIP
        >>> Study.load("runs/s.sqlite").run(trials=30)  # resume, later or after a crash # doctest: +SKIP
    """

    def __init__(self, ab_test: ABTest | None = None, *, name: str | None = None, storage=None,
                 parameters: Sequence | None = None, objective: str | None = None,
                 outcome_constraints: Sequence[str] | None = None, sobol_trials: int | None = None,
                 seed: int = 0, acquisition: str = "qLogNoisyExpectedImprovement", optimizer: Mapping | None = None,
                 verbose: bool = False, tracker=None):
        _quiet_ax(verbose)
        optimizer = check_optimizer(optimizer)
        _check_tracker(tracker)
        ab_test = ABTest() if ab_test is None else ab_test
        if not isinstance(ab_test, ABTest):
            raise TypeError(f"ab_test: expected an ABTest, got {type(ab_test).__name__}")
        problem = ab_test.problem
        name = problem.name if name is None else name
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"name: expected 1-100 letters, digits, '_', '-' or '.', got {name!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
        _acqf_class(acquisition)
        # -- search space
        added: list = []
        confidence_names = getattr(problem, "confidence_names", None)
        if parameters is not None and callable(confidence_names) and list(parameters):
            given = [_to_ax_parameter(p) for p in parameters]
            if all(p.name in set(confidence_names()) for p in given):
                # only confidences given: they join the default search space (tolerances included)
                added, parameters = given, None
        params = list(problem.parameters if parameters is None else parameters) + added
        if not params:
            raise ValueError("parameters: expected at least one parameter to tune")
        ax_params = [_to_ax_parameter(p) for p in params]
        names = [p.name for p in ax_params]
        if len(set(names)) != len(names):
            raise ValueError(f"parameters: duplicate names in {names}")
        problem.check_parameters([Range(p.name, p.bounds[0], p.bounds[1], integer=p.parameter_type == "int")
                                  for p in ax_params if hasattr(p, "bounds")])
        for p in ax_params:  # a choice: each of its values is one the problem can run
            for value in getattr(p, "values", None) or ():
                problem.check_parameter_values({p.name: value})
        # -- optimisation config
        objective = problem.objective if objective is None else objective
        constraints = list(problem.outcome_constraints if outcome_constraints is None else outcome_constraints)
        if not objective or not isinstance(objective, str):
            raise ValueError(f"objective: expected a metric name (optionally '-name' to minimise), got {objective!r}")
        known = set(ab_test.metric_names())
        for label, expr in [("objective", objective)] + [("outcome constraint", c) for c in constraints]:
            if not isinstance(expr, str):
                raise TypeError(f"{label}: expected a string, got {type(expr).__name__}")
            if "baseline" in _metric_names_in(expr) or re.search(r"\bbaseline\b", expr):
                raise ValueError(f"{label} {expr!r}: relative ('* baseline') bounds are not supported; the A/B test's "
                                 "*_change metrics are already % changes against the baseline (e.g. 'reliability_change >= 0')")
            unknown = [m for m in _metric_names_in(expr) if m not in known]
            if unknown:
                raise ValueError(f"{label} {expr!r}: unknown metric {unknown[0]!r}; the A/B test reports: "
                                 f"{', '.join(sorted(known))}")
        from ax.api.utils.instantiation.from_string import optimization_config_from_string

        try:
            oc = optimization_config_from_string(objective_str=objective, outcome_constraint_strs=constraints)
        except Exception as exc:
            raise ValueError(f"objective / outcome constraints: Ax cannot parse {objective!r} / {constraints!r}: {exc}") from exc
        if oc.is_moo_problem:
            raise ValueError(f"objective {objective!r}: expected a single objective (multi-objective studies are not supported)")
        if sobol_trials is None:
            sobol_trials = max(5, 2 * len(ax_params))
        # -- storage, then Ax
        url = None
        if storage is not None:
            url = _storage.resolve_url(storage)
            _storage.connect(url)
            if name in _storage.experiment_names(url):
                raise ValueError(f"name: a study named {name!r} already exists in {_storage.display_url(url)}; "
                                 "resume it (Study.load / `bayes-safe tune resume`) or choose another name")
        # -- the default tolerance ranges sized by a pilot, so that a per-unit violation limit some
        # setting meets can be reached (SimulatedProblem.pilot_ranges; only for the default space)
        range_pilot = None
        sizer = getattr(problem, "pilot_ranges", None)
        if parameters is None and callable(sizer):
            sized = sizer(ab_test, seed)
            if sized is not None:
                sized_params, range_pilot = sized
                ax_params = [_to_ax_parameter(p) for p in sized_params] + added
        from ax.api.client import Client

        with _ax_context(url, verbose):
            client = Client(storage_config=_storage.storage_config(url) if url else None, random_seed=seed)
            client.configure_experiment(parameters=ax_params, name=name,
                                        description=f"bayes_safe tuning study of problem {problem.name!r}")
            client._experiment._properties[PROPERTY_KEY] = {
                "version": 1, "seed": seed, "ab_test": ab_test.config(), "sobol_trials": sobol_trials,
                "acquisition": acquisition, "optimizer": optimizer, "objective": objective, "outcome_constraints": constraints,
                "surface": list(problem.surface) if problem.surface else None, "target_trials": None, "sessions": [],
                "uid": uuid.uuid4().hex, **({"range_pilot": range_pilot} if range_pilot is not None else {}),
                "tolerance_meaning": TOLERANCE_MEANING,
            }
            client.configure_optimization(objective=objective, outcome_constraints=constraints or None)
            client.set_generation_strategy(make_generation_strategy(sobol_trials, seed, acquisition, optimizer))
        self._init(client, ab_test, url, tracker, verbose)

    # ------------------------------------------------------------------ construction
    def _init(self, client, ab_test: ABTest, url: str | None, tracker=None, verbose: bool = False) -> None:
        self.client = client
        self.verbose = bool(verbose)  # Ax's own log lines while the study works
        self.ab_test = ab_test
        self.url = url
        self.tracker = tracker
        #: trials this process logged to the tracker, and those whose logging failed ({trial: reason})
        self.tracking: dict = {"logged": [], "failed": {}}
        self.timings: dict[str, list[float]] = {"gen": [], "complete": [], "sim": [], "recover": []}
        self._last_gen_error: BaseException | None = None

    @classmethod
    def load(cls, storage, name: str | None = None, ab_test: ABTest | None = None, verbose: bool = False,
             tracker=None, *, trust_source: bool | str = False) -> Study:
        """Reopen a stored study (to resume it, or to report on it).

        Args:
            storage: the database URL or SQLite path the study was created with.
            name: the study's name (default: the only study in the database).
            ab_test: the A/B test (default: rebuilt from the stored description; needed for a
                study of a custom problem, which cannot be described).
            tracker: a ``Tracker`` that logs the finished trials (those it lacks first, when
                the study runs).
            trust_source: consent to import the problem class a study of your own problem
                stores as ``module:Class`` (importing runs that module's code): ``True``, or
                the same ``"module:Class"``. Without it such a study is refused with a
                ``ValueError`` naming the module, the class and the file that would run, and
                nothing is imported (``ab_test=`` given: nothing is imported either way).

        Raises:
            ValueError: no such database or study; a stored problem class without consent.
        """
        _quiet_ax(verbose)
        _check_tracker(tracker)
        url = _storage.resolve_url(storage)
        path = _storage.sqlite_path(url)
        if path is not None and not path.exists():
            raise ValueError(f"storage {url}: no study database at {path}")
        names = _storage.experiment_names(url)
        if name is None:
            if len(names) != 1:
                raise ValueError(f"name: the database {_storage.display_url(url)} holds "
                                 f"{'no study' if not names else 'several studies: ' + ', '.join(names)}; pass one name")
            name = names[0]
        elif name not in names:
            raise ValueError(f"name: no study named {name!r} in {_storage.display_url(url)} (found: {', '.join(names) or 'none'})")
        from ax.api.client import Client

        with _ax_context(url, verbose):
            client = _load_client(Client, name, url)
        props = client._experiment._properties.get(PROPERTY_KEY)
        if props is None:
            raise ValueError(f"name: the Ax experiment {name!r} was not created by bayes_safe tuning (no {PROPERTY_KEY} properties)")
        if ab_test is None:
            if props.get("ab_test") is None:
                raise ValueError(f"ab_test: study {name!r} uses a custom problem or policy factory; pass ab_test= to load it")
            ab_test = ABTest.from_config(props["ab_test"], trust_source=trust_source)
        _check_tolerance_meaning(props, ab_test, client._experiment, name)
        study = cls.__new__(cls)
        study._init(client, ab_test, url, tracker, verbose)
        return study

    def __repr__(self) -> str:
        """What a notebook shows: the problem, the search space, the objective and outcome
        constraints, and how far the study got (``counts``)."""
        from ax.core.parameter import ChoiceParameter, RangeParameter

        space = []
        for name, p in self.experiment.search_space.parameters.items():
            if isinstance(p, RangeParameter):
                space.append(f"{name} in [{p.lower:g}, {p.upper:g}]{' (log)' if p.log_scale else ''}")
            elif isinstance(p, ChoiceParameter):
                space.append(f"{name} in {{{', '.join(str(v) for v in p.values)}}}")
            else:
                space.append(name)
        constraints = []
        for weights, op, bound in self.constraints:
            lhs = " + ".join(m if w == 1 else f"{w:g} {m}" for m, w in weights.items())
            constraints.append(f"{lhs} {op} {bound:g}")
        problem = getattr(getattr(self.ab_test, "problem", None), "name", None)
        counts = ", ".join(f"{k.lower()} {v}" for k, v in sorted(self.counts().items())) or "no trials yet"
        return (f"Study(name={self.name!r}, problem={problem!r}, parameters=[{'; '.join(space)}], "
                f"objective={'minimise' if self.minimize else 'maximise'} {self.objective_name}, "
                f"outcome_constraints=[{'; '.join(constraints)}], trials: {counts})")

    # ------------------------------------------------------------------ accessors
    @property
    def experiment(self):
        """The Ax ``Experiment`` (``ax.api.Client`` keeps it private)."""
        return self.client._experiment

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def properties(self) -> dict:
        return self.experiment._properties[PROPERTY_KEY]

    @property
    def seed(self) -> int:
        return int(self.properties["seed"])

    @property
    def objective_name(self) -> str:
        return self.experiment.optimization_config.objective.metric_names[0]

    @property
    def minimize(self) -> bool:
        return bool(self.experiment.optimization_config.objective.minimize)

    @property
    def constraints(self) -> list:
        """``[(weights {metric: w}, ">=" or "<=", bound)]`` of the outcome constraints."""
        out = []
        for c in self.experiment.optimization_config.outcome_constraints:
            op = ">=" if c.op.name == "GEQ" else "<="
            out.append(({name: w for name, w in zip(c.metric_names, [w for _, w in c.metric_weights])}, op, float(c.bound)))
        return out

    @property
    def parameter_names(self) -> list[str]:
        return list(self.experiment.search_space.parameters)

    def trial_seed(self, index: int) -> int:
        return (self.seed * 100_003 + int(index)) % (2**31 - 1)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.experiment.trials.values():
            out[t.status.name] = out.get(t.status.name, 0) + 1
        return out

    def observed(self) -> dict[int, dict[str, tuple[float, float]]]:
        """``{trial index: {metric: (mean, sem)}}`` of the completed trials."""
        from ax.core.trial_status import TrialStatus

        df = self.experiment.lookup_data().df
        out: dict[int, dict] = {}
        completed = {t.index: t for t in self.experiment.trials.values() if t.status == TrialStatus.COMPLETED}
        for idx, t in completed.items():
            # every metric (kept in the run metadata; a study made before issue 18 kept them in Ax's data)
            for name, (m, s) in ((t.run_metadata or {}).get("metrics") or {}).items():
                out.setdefault(idx, {})[name] = (float(m), float(s))
        for row in df.itertuples(index=False):
            # Ax's data only fills in what the run metadata lacks: it keeps 10 significant digits,
            # the metadata full precision (so a trial reads the same live, loaded or tracked)
            if row.trial_index in completed:
                out.setdefault(int(row.trial_index), {}).setdefault(row.metric_name, (float(row.mean), float(row.sem)))
        return dict(sorted(out.items()))

    def is_feasible(self, metrics: Mapping[str, tuple[float, float]]) -> bool:
        """Whether observed means satisfy every outcome constraint."""
        for weights, op, bound in self.constraints:
            if any(m not in metrics for m in weights):
                return False
            value = sum(w * metrics[m][0] for m, w in weights.items())
            if (op == ">=" and value < bound) or (op == "<=" and value > bound):
                return False
        return True

    def best_observed(self) -> tuple[int, dict] | None:
        """The completed trial with the best observed objective among observed-feasible ones."""
        best = None
        for idx, metrics in self.observed().items():
            if self.objective_name not in metrics or not self.is_feasible(metrics):
                continue
            value = metrics[self.objective_name][0] * (-1 if self.minimize else 1)
            if best is None or value > best[0]:
                best = (value, idx, metrics)
        return None if best is None else (best[1], best[2])

    # ------------------------------------------------------------------ tracking
    @property
    def uid(self) -> str:
        """The study's unique id (stored with it; a tracker's key with the trial index). A study
        made before trackers existed gets one here (saved when it next runs or is tracked)."""
        return self.properties.setdefault("uid", uuid.uuid4().hex)

    def trial_record(self, index: int):
        """The ``TrialRecord`` of a finished (COMPLETED or FAILED) trial, from what the study stores."""
        from ax.core.trial_status import TrialStatus

        from .tracking import TrialRecord

        trial = self.experiment.trials[index]
        if trial.status not in (TrialStatus.COMPLETED, TrialStatus.FAILED):
            raise ValueError(f"index: trial {index} is {trial.status.name}; only finished trials (completed, failed) "
                             "have a record")
        md = trial.run_metadata or {}
        completed = trial.status == TrialStatus.COMPLETED
        metrics: dict[str, tuple[float, float]] = {}
        if completed:
            # the run metadata holds every metric at full precision (Ax's stored data rounds to 10 digits),
            # the same whether the trial was just completed or loaded; Ax's data fills in a study made
            # before issue 18, which kept the modelled metrics there only
            metrics = {k: (float(m), float(s)) for k, (m, s) in (md.get("metrics") or {}).items()}
            for row in self.experiment.lookup_data(trial_indices=[index]).df.itertuples(index=False):
                metrics.setdefault(row.metric_name, (float(row.mean), float(row.sem)))
        started, finished = _timestamp(trial.time_run_started), _timestamp(trial.time_completed)
        timings = {k: float(md[k]) for k in ("sim_seconds", "gen_seconds") if md.get(k) is not None}
        if started is not None and finished is not None:
            timings["wall_seconds"] = finished - started
        return TrialRecord(
            study=self.name, study_uid=self.uid, trial=int(index), status=trial.status.name,
            parameters=dict(trial.arm.parameters) if trial.arm is not None else {}, metrics=metrics,
            feasible=self.is_feasible(metrics) if completed and self.constraints else None,
            seed=md.get("seed"), node=md.get("node"), replicates=md.get("replicates") if completed else None,
            rerun_of=md.get("rerun_of"), timings=timings, started=started, finished=finished,
            error=None if completed else (md.get("error") or trial.failed_reason))

    def _tracking_description(self) -> dict[str, str]:
        return {"storage": _storage.display_url(self.url) if self.url else "in memory", "objective": self.properties["objective"],
                "outcome_constraints": "; ".join(self.properties.get("outcome_constraints") or []) or "none",
                "seed": str(self.seed)}

    def _log_trial(self, index: int, emit: Callable[[dict], None] | None = None) -> bool:
        """Log one finished trial to the tracker; a failure is recorded and reported, never raised."""
        if self.tracker is None:
            return False
        try:
            done = bool(self.tracker.log_trial(self.trial_record(index)))
        except Exception as exc:  # noqa: BLE001 - tracking must not stop a study; logged by the next run
            reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
            self.tracking["failed"][index] = reason
            if emit is not None:
                emit({"event": "tracking_failed", "trial": index, "reason": reason})
            return False
        self.tracking["failed"].pop(index, None)
        if done:
            self.tracking["logged"].append(index)
        return done

    def track(self, tracker=None, progress: Callable[[dict], None] | None = None) -> dict:
        """Log every finished trial the tracker does not have yet (``Study.run`` does this first).

        Args:
            tracker: a ``Tracker`` (default: the study's own, ``Study(tracker=...)``); it becomes
                the study's tracker.
            progress: called with ``tracking_failed`` events.

        Returns:
            ``{"logged": [trials logged now], "already": count already there, "failed": {trial: reason}}``.
        """
        from ax.core.trial_status import TrialStatus

        if tracker is not None:
            _check_tracker(tracker)
            self.tracker = tracker
        if self.tracker is None:
            raise ValueError("tracker: the study has no tracker; pass one (e.g. MlflowTracker('runs/mlruns'))")
        if "uid" not in self.properties:
            self.properties["uid"] = self.uid
            self._save_properties()
        self.tracker.open(self.name, self.uid, self._tracking_description())
        finished = sorted(i for i, t in self.experiment.trials.items() if t.status in (TrialStatus.COMPLETED, TrialStatus.FAILED))
        logged, already = [], 0
        for idx in finished:
            if self._log_trial(idx, progress):
                logged.append(idx)
            elif idx not in self.tracking["failed"]:
                already += 1
        return {"logged": logged, "already": already, "failed": dict(self.tracking["failed"])}

    # ------------------------------------------------------------------ power
    def pilot_point(self) -> dict:
        """The centre of the search space (geometric centre of a log range; first value of a choice)."""
        from ax.core.parameter import ChoiceParameter, FixedParameter, RangeParameter

        point = {}
        for name, p in self.experiment.search_space.parameters.items():
            if isinstance(p, RangeParameter):
                lo, hi = float(p.lower), float(p.upper)
                v = math.sqrt(lo * hi) if p.log_scale and lo > 0 else (lo + hi) / 2
                point[name] = round(v) if p.parameter_type.name == "INT" else v
            elif isinstance(p, ChoiceParameter):
                point[name] = p.values[0]
            elif isinstance(p, FixedParameter):
                point[name] = p.value
        return point

    def check_power(self, *, refresh: bool = False) -> dict:
        """Minimum detectable change of every outcome constraint, from a pilot trial (stored).

        The pilot is one trial (all its replicates, paired with their baselines) at the centre of
        the search space, run here before the study's trials; its SEM of each constraint metric
        is what a trial at these units per arm can resolve. The minimum detectable change (MDC)
        at 80 % power and a 5 % two-sided level is ``2.80 x SEM``. A constraint whose bound lies
        closer than one MDC to "no change" (0 for a ``*_change`` metric; the baseline's level, or
        the pilot's value when there is no baseline, for a level) gets a warning: a trial whose
        true value is near no change cannot be told feasible from infeasible, so the study can
        confirm the constraint only for policies that move the metric by more than the MDC.

        Returns (and stores in the study's properties, ``power``) ``{"point", "seed", "units_per_arm",
        "replicates", "seconds", "constraints": [{"metric", "op", "bound", "reference", "se", "mdc",
        "slack", "warn", "units_needed", "text"}]}``.
        """
        if not refresh and isinstance(self.properties.get("power"), dict):
            return self.properties["power"]
        point = self.pilot_point()
        seed = (self.seed * 100_003 + 99_989) % (2**31 - 1)
        start = time.perf_counter()
        metrics, _ = self.ab_test.evaluate_with_noise(point, seed)
        seconds = time.perf_counter() - start
        ab = self.ab_test
        offline = bool(getattr(ab.problem, "offline", False))
        units = None if offline else ab.n_users
        names = getattr(ab.problem, "violation_metric_names", None)
        rates = list(names()) if callable(names) and not offline else []
        shares = set(rates) | {f"{c.replace('-', '_')}_{v}" for c in getattr(ab, "compare", ()) for v in rates}
        rows = []
        for weights, op, bound in self.constraints:
            if len(weights) != 1:
                continue
            (metric, w), = weights.items()
            if metric not in metrics:
                rows.append({"metric": metric, "op": op, "bound": bound, "se": None, "mdc": None, "warn": False,
                             "text": f"`{metric} {op} {bound:g}`: the pilot did not report {metric}; no power estimate."})
                continue
            value, se = metrics[metric]
            se = abs(w) * se
            bound_m = bound / w
            if metric.endswith("_change"):
                reference, ref_text, unit = 0.0, "no change", " %"
            elif f"baseline_{metric}" in metrics:
                reference, ref_text, unit = metrics[f"baseline_{metric}"][0], "the baseline's level", ""
            else:
                reference, ref_text, unit = value, "the pilot's value", ""
            mdc = MDC_FACTOR * se
            slack = abs(bound_m - reference)
            warn = slack < mdc
            needed = None
            if warn and units and slack > 0:
                needed = math.ceil(units * (mdc / slack) ** 2)
            where = (f"{units:,} units per arm, " if units else "") + f"{ab.replicates} replicate(s) per trial"
            text = (f"`{metric} {op} {bound:g}`: minimum detectable change {mdc:.3g}{unit} (80 % power, 5 % two-sided; "
                    f"trial SE {se:.3g}{unit} from the pilot, {where}); the bound is {slack:.3g}{unit} from {ref_text}.")
            if warn:
                confirm = bound_m - 1.96 * se if op == "<=" else bound_m + 1.96 * se
                text += (f" WARNING: the bound is closer to {ref_text} than the minimum detectable change: a trial near "
                         f"{ref_text} cannot be told feasible from infeasible; ")
                if metric in shares and op == "<=" and confirm < 0:
                    # a per-unit violation rate cannot go below 0 %: even a trial with none is not confirmed
                    text += (f"no trial can be confirmed feasible (95 % interval inside the bound) at this size: that "
                             f"needs an observed rate below {confirm:.3g} %, and a rate is at least 0 %.")
                else:
                    text += (f"a trial is confirmed feasible (95 % interval inside the bound) only when its observed value "
                             f"is {'below' if op == '<=' else 'above'} {confirm:.3g}{unit}.")
                if needed:
                    text += f" About {needed:,} units per arm would make the bound's distance one MDC."
                elif units:
                    text += " More units do not help a bound at no change: only policies that move the metric can confirm it."
            rows.append({"metric": metric, "op": op, "bound": bound_m, "reference": reference, "se": se, "mdc": mdc,
                         "slack": slack, "warn": warn, "units_needed": needed, "text": text})
        power = {"point": point, "seed": seed, "units_per_arm": units, "replicates": ab.replicates, "seconds": seconds,
                 "constraints": rows}
        self.properties["power"] = power
        self._save_properties()
        return power

    # ------------------------------------------------------------------ running
    def _save_properties(self) -> None:
        """Write this study's properties (only them: one UPDATE, whatever the trials' in-memory state)."""
        if self.url is None:
            return
        with _ax_context(self.url, self.verbose):
            self.client._update_experiment_properties_in_db(self.experiment)

    def recover(self) -> dict:
        """Settle trials left RUNNING by an interrupted run (see the module docstring).

        Returns ``{"completed": [...], "abandoned": [...], "rerun": [(trial, parameters), ...]}``:
        the trials completed and abandoned now, and every re-run owed (``pending_reruns``),
        including those of earlier interruptions.
        """
        from ax.core.trial_status import TrialStatus

        start = time.perf_counter()
        needed = set(self.experiment.optimization_config.metric_names)
        result = {"completed": [], "abandoned": [], "rerun": []}
        with _ax_context(self.url, self.verbose):
            for trial in list(self.experiment.trials.values()):
                if trial.status != TrialStatus.RUNNING:
                    continue
                df = self.experiment.lookup_data(trial_indices=[trial.index]).df
                has_data = len(df) > 0 and needed <= set(df["metric_name"])
                if has_data:
                    self.client.complete_trial(trial.index)
                    result["completed"].append(trial.index)
                else:
                    self._abandon([trial.index], "interrupted: the study process stopped before the trial finished")
                    result["abandoned"].append(trial.index)
        result["rerun"] = self.pending_reruns()
        self.timings["recover"].append(time.perf_counter() - start)
        return result

    def pending_reruns(self) -> list[tuple[int, dict]]:
        """``[(trial, parameters)]``: the interrupted (ABANDONED) trials owed a re-run, derived from
        the stored trials: those no later trial repeats (see the module docstring)."""
        from ax.core.trial_status import TrialStatus

        trials = sorted(self.experiment.trials.items())
        last = {t.arm.signature: i for i, t in trials if t.arm is not None}
        return [(i, dict(t.arm.parameters)) for i, t in trials
                if t.status == TrialStatus.ABANDONED and t.run_metadata.get("interrupted") and t.arm is not None
                and last[t.arm.signature] == i]

    def _abandon(self, indices, reason: str) -> list[int]:
        """Mark the RUNNING trials among ``indices`` ABANDONED ``interrupted`` (each in one save)."""
        from ax.core.trial_status import TrialStatus

        done = []
        with _ax_context(self.url, self.verbose):
            for idx in sorted(indices):
                trial = self.experiment.trials[idx]
                if trial.status != TrialStatus.RUNNING:
                    continue
                trial.update_run_metadata({"interrupted": True, "error": reason[:2000]})
                self.client.mark_trial_abandoned(idx)
                done.append(idx)
        return done

    def run(self, trials: int, parallel: int = 1, scheduler: str | None = None, *, inline: bool = False,
            progress: Callable[[dict], None] | bool | str = "auto", max_failures: int | None = None) -> dict:
        """Run trials until ``trials`` are completed, ``parallel`` at a time.

        Args:
            trials: the number of completed trials to reach (counting those already completed).
            parallel: trials in flight at once, each in its own worker process (or Dask task).
            scheduler: address of a Dask distributed scheduler to run trials on instead.
            inline: run trials in this process, one at a time (debugging).
            progress: ``"auto"`` (default): a progress bar of the completed trials in a notebook or
                on a terminal (``bayes_safe.progress``); ``True`` / ``False``: always / never; or a
                callable, called with an event dict (``event`` = ``"recovered"``, ``"tracked"``,
                ``"started"``, ``"completed"``, ``"failed"``, ``"tracking_failed"``) as the study
                advances (no bar).
            max_failures: stop with an error after this many failed trials in this run
                (default ``max(3, trials // 2)``).

        Returns:
            A summary: counts, wall time, Ax and simulation seconds.

        Raises:
            StudyInterrupted: on SIGINT, SIGTERM or SIGHUP (see the module docstring).
            InfrastructureError: the Dask scheduler was lost.
            RuntimeError: too many failures, or Ax generates no trial.
        """
        from .runners import InfrastructureLost, make_runner

        for key, v in (("trials", trials), ("parallel", parallel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}: expected a positive int, got {v!r}")
        max_failures = max(3, trials // 2) if max_failures is None else int(max_failures)
        if callable(progress):
            emit, bar = progress, progress_bar(None, "", progress=False)
        else:
            bar = progress_bar(trials, f"study {self.name}", unit="trial", progress=progress,
                               initial=min(self.counts().get("COMPLETED", 0), trials))

            def emit(event: dict) -> None:
                if event["event"] == "completed":
                    bar.update(1)
                    bar.set_postfix_str(f"trial {event['trial']}")
                elif event["event"] == "failed":
                    bar.set_postfix_str(f"trial {event['trial']} failed")
        import cloudpickle

        payload = cloudpickle.dumps(self.ab_test)
        lock = _storage.study_lock(self.url, self.name) if self.url else contextlib.nullcontext()
        wall = time.perf_counter()
        failures = 0
        stop = _StopSignals()
        with bar, lock, stop:
            # the target and parallelism first: a run killed in its power pilot resumes with them
            self.properties["target_trials"] = trials
            self.properties["parallel"] = parallel
            self.properties["uid"] = self.uid
            self._save_properties()
            if self.constraints and "power" not in self.properties and not self.experiment.trials:
                self.check_power()  # a new study: the pilot before its first trial
            recovered = self.recover()
            rerun = list(recovered["rerun"])
            if recovered["completed"] or recovered["abandoned"] or rerun:
                emit({"event": "recovered", **recovered})
            if self.tracker is not None:
                # the finished trials the tracker lacks (a crash after Ax's save, a tracker added on resume)
                try:
                    tracked = self.track(progress=emit)
                except Exception as exc:  # noqa: BLE001 - opening the tracker failed: the study goes on
                    emit({"event": "tracking_failed", "trial": None, "reason": f"{type(exc).__name__}: {exc}"[:500]})
                else:
                    emit({"event": "tracked", **tracked})
            runner = make_runner(parallel, scheduler, inline=inline)
            pending: dict = {}
            in_flight: set[int] = set()  # started, neither completed nor failed (abandoned if the run stops)
            closed = False
            try:
                while True:
                    stop.check()
                    completed = self.counts().get("COMPLETED", 0)
                    want = min(parallel - len(pending), trials - completed - len(pending))
                    if want > 0:
                        for idx, params in self._start_trials(want, rerun):
                            in_flight.add(idx)
                            emit({"event": "started", "trial": idx, "parameters": params,
                                  "node": self.experiment.trials[idx].run_metadata.get("node")})
                            pending[runner.submit(payload, params, self.trial_seed(idx))] = idx
                    if not pending:
                        if completed >= trials:
                            break
                        err = self._last_gen_error
                        raise RuntimeError("Ax generated no new trial and none is running; "
                                           f"{completed} of {trials} trials completed"
                                           + (f" (last error: {type(err).__name__}: {err})" if err else ""))
                    stop.check()
                    for handle in runner.wait(list(pending), timeout=POLL_SECONDS):
                        idx = pending.pop(handle)
                        try:
                            out = runner.result(handle)
                        except InfrastructureLost:
                            raise
                        except Exception as exc:
                            if stop.signum is not None:
                                continue  # its worker died of the same signal: abandoned below, not failed
                            in_flight.discard(idx)
                            failures += 1
                            reason = self._fail(idx, exc)
                            emit({"event": "failed", "trial": idx, "reason": reason, "failures": failures})
                            self._log_trial(idx, emit)
                            if failures > max_failures:
                                raise RuntimeError(f"{failures} trials failed in this run (more than max_failures="
                                                   f"{max_failures}); last: trial {idx}: {reason}") from exc
                            continue
                        in_flight.discard(idx)
                        self._complete(idx, out)
                        self._log_trial(idx, emit)
                        best = self.best_observed()
                        emit({"event": "completed", "trial": idx, "parameters": dict(self.experiment.trials[idx].arm.parameters),
                              "metrics": out["metrics"], "sim_seconds": out["sim_seconds"],
                              "node": self.experiment.trials[idx].run_metadata.get("node"),
                              "best": None if best is None else {"trial": best[0], "metrics": best[1],
                                                                 "parameters": dict(self.experiment.trials[best[0]].arm.parameters)},
                              "completed": self.counts().get("COMPLETED", 0), "target": trials})
            except InfrastructureLost as exc:
                stop.stopping = True
                closed = self._close_runner(runner, pending, force=True)
                abandoned = self._abandon(in_flight, str(exc))
                raise InfrastructureError(f"{exc}; the study stopped, {_trial_list(abandoned)}; no trial failed for it",
                                          abandoned) from None
            except (_Stop, KeyboardInterrupt) as exc:
                stop.stopping = True
                signum = stop.signum or getattr(exc, "signum", None) or signal.SIGINT
                closed = self._close_runner(runner, pending, force=True)
                abandoned = self._abandon(in_flight, f"interrupted by {_signal_name(signum)}")
                raise StudyInterrupted(signum, abandoned) from None
            finally:
                stop.stopping = True
                if not closed:
                    self._close_runner(runner, pending, force=bool(pending))
                summary = self._session_summary(time.perf_counter() - wall, parallel, scheduler, runner.description, failures)
                if stop.signum is not None:
                    summary["stopped_by"] = _signal_name(stop.signum)
                with contextlib.suppress(Exception):
                    self.properties.setdefault("sessions", []).append(summary)
                    self._save_properties()
        return summary

    @staticmethod
    def _close_runner(runner, pending: dict, force: bool) -> bool:
        for handle in list(pending):
            with contextlib.suppress(Exception):
                runner.cancel(handle)
        with contextlib.suppress(Exception):
            runner.close(force=force)
        return True

    def _start_trials(self, want: int, rerun: list) -> list[tuple[int, dict]]:
        started = []
        with _ax_context(self.url, self.verbose):
            while rerun and len(started) < want:
                old, params = rerun.pop(0)
                t = time.perf_counter()
                # the trial (RUNNING, the abandoned trial's arm) and its ``rerun_of`` link in one save
                _, idx = self.experiment.attach_trial(parameterizations=[dict(params)])
                trial = self.experiment.trials[idx]
                trial.update_run_metadata({"rerun_of": old, "seed": self.trial_seed(idx), "node": "rerun",
                                           "gen_seconds": time.perf_counter() - t})
                self.client._save_or_update_trial_in_db_if_possible(experiment=self.experiment, trial=trial)
                started.append((idx, dict(params)))
            if len(started) < want:
                t = time.perf_counter()
                try:
                    new = self.client.get_next_trials(max_trials=want - len(started))
                    self._last_gen_error = None
                except Exception as exc:  # noqa: BLE001 - e.g. no data yet for the model
                    new = {}
                    self._last_gen_error = exc
                elapsed = time.perf_counter() - t
                self.timings["gen"].append(elapsed)
                for idx, params in new.items():
                    trial = self.experiment.trials[idx]
                    node = trial.generator_runs[0]._generation_node_name if trial.generator_runs else None
                    trial.update_run_metadata({"seed": self.trial_seed(idx), "node": node, "gen_seconds": elapsed / len(new)})
                    started.append((idx, dict(params)))
        return started

    def _complete(self, idx: int, out: dict) -> None:
        t = time.perf_counter()
        trial = self.experiment.trials[idx]
        modelled = set(self.experiment.optimization_config.metric_names)
        noise = {m: v for m, v in (out.get("noise") or {}).items() if m in modelled}
        trial.update_run_metadata({"sim_seconds": out.get("sim_seconds"), "worker": out.get("worker"),
                                   "replicates": out.get("replicates", 1), "noise": noise})
        metrics = {k: (float(m), float(s)) for k, (m, s) in out["metrics"].items()}
        # Ax gets the modelled metrics (objective, constraints) only: an unmodelled metric in the
        # experiment's data breaks Ax's own analyses (compute_analyses, cross-validation); every
        # metric is kept in the trial's run metadata for the report
        trial.update_run_metadata({"metrics": {k: [m, s] for k, (m, s) in metrics.items()}})
        with _ax_context(self.url, self.verbose):
            self.client.complete_trial(idx, raw_data={k: v for k, v in metrics.items() if k in modelled})
        self.timings["complete"].append(time.perf_counter() - t)
        if out.get("sim_seconds") is not None:
            self.timings["sim"].append(float(out["sim_seconds"]))

    def _fail(self, idx: int, exc: BaseException) -> str:
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        trial = self.experiment.trials[idx]
        trial.update_run_metadata({"error": reason[:2000]})
        with _ax_context(self.url, self.verbose):
            # the database column holds 100 characters
            self.client.mark_trial_failed(idx, failed_reason=reason[:100])
        return reason

    def _session_summary(self, wall: float, parallel: int, scheduler, runner: str, failures: int) -> dict:
        def total(key):
            return float(sum(self.timings[key]))

        n_done = max(1, len(self.timings["complete"]))
        return {
            "wall_seconds": wall, "parallel": parallel, "scheduler": scheduler, "runner": runner,
            "trials_completed": len(self.timings["complete"]), "trials_failed": failures, "counts": self.counts(),
            "ax_gen_seconds": total("gen"), "ax_complete_seconds": total("complete"), "ax_recover_seconds": total("recover"),
            "ax_seconds_per_trial": (total("gen") + total("complete") + total("recover")) / n_done,
            "sim_seconds_total": total("sim"), "sim_seconds_per_trial": total("sim") / max(1, len(self.timings["sim"])),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    # ------------------------------------------------------------------ model and export
    def fit_model(self):
        """A BoTorch model (Ax ``TorchAdapter``) of the objective and constraint metrics on all completed trials."""
        from ax.adapter.registry import Generators

        with _ax_context(verbose=self.verbose):
            return Generators.BOTORCH_MODULAR(experiment=self.experiment, data=self.experiment.lookup_data(),
                                              **_botorch_kwargs(self.properties.get("acquisition", ACQUISITION_FUNCTIONS[0])))

    def predict(self, points: Sequence[Mapping], model=None) -> list[dict[str, tuple[float, float]]]:
        """Model mean and standard deviation of the modelled metrics at ``points`` (full parameterizations)."""
        from ax.core.observation import ObservationFeatures

        model = self.fit_model() if model is None else model
        with _ax_context(verbose=self.verbose):
            mean, cov = model.predict([ObservationFeatures(parameters=dict(p)) for p in points])
        return [{m: (float(mean[m][i]), float(math.sqrt(max(cov[m][m][i], 0.0)))) for m in mean} for i in range(len(points))]

    def feasibility_probability(self, predicted: Mapping[str, tuple[float, float]]) -> float:
        """The model's posterior probability that every outcome constraint holds at a point
        (``predicted``: ``{metric: (mean, sd)}``; constraints treated as independent):
        ``exp(log_feasibility_probability)``, which may underflow to 0 for a point far outside."""
        return math.exp(self.log_feasibility_probability(predicted))

    def log_feasibility_probability(self, predicted: Mapping[str, tuple[float, float]]) -> float:
        """``log`` of ``feasibility_probability``, computed in log space (``log_feasibility``):
        finite and comparable however far a point misses its constraints."""
        return log_feasibility(self.constraints, predicted)

    def constraint_margins(self, metrics: Mapping[str, tuple[float, float]], predicted=None) -> list[dict]:
        """How a trial stands against each outcome constraint (at its declared limit):
        ``[{"constraint", "metric", "op", "bound", "observed", "se", "shortfall", "shortfall_se",
        "predicted_z"}]``. ``shortfall`` is how far the observed mean misses the bound in the metric's
        units (positive: misses, negative: inside by that much), ``shortfall_se`` the same in SEs;
        ``predicted_z`` the model's standardised margin (negative: predicted outside)."""
        out = []
        for weights, op, bound in self.constraints:
            lhs = " + ".join(m if w == 1 else f"{w:g} {m}" for m, w in weights.items())
            row = {"constraint": f"{lhs} {op} {bound:g}", "metric": lhs, "op": op, "bound": bound, "observed": None,
                   "se": None, "shortfall": None, "shortfall_se": None, "predicted_z": None}
            if all(m in metrics for m in weights):
                value = sum(w * metrics[m][0] for m, w in weights.items())
                se = math.sqrt(sum((w * metrics[m][1]) ** 2 for m, w in weights.items()))
                short = (bound - value) if op == ">=" else (value - bound)
                row.update(observed=value, se=se, shortfall=short,
                           shortfall_se=-_standardised_margin(value, se, op, bound))
            if predicted is not None and all(m in predicted for m in weights):
                mean = sum(w * predicted[m][0] for m, w in weights.items())
                sd = math.sqrt(sum((w * predicted[m][1]) ** 2 for m, w in weights.items()))
                row["predicted_z"] = _standardised_margin(mean, sd, op, bound)
            out.append(row)
        return out

    def unreachable_constraints(self) -> list[dict]:
        """The outcome constraints no completed trial comes near: the trial closest to each bound
        (smallest observed shortfall in SEs) still misses it by more than its SE. Such a limit
        looks unreachable in this search space (widen the tolerance toward stricter bounds, or tune
        the constraint's confidence). ``[{"constraint", "trial", "shortfall", "se", "parameters"}]``."""
        observed = self.observed()
        rows: dict[str, dict] = {}
        for i, metrics in observed.items():
            for m in self.constraint_margins(metrics):
                if m["shortfall_se"] is None:
                    continue
                kept = rows.get(m["constraint"])
                if kept is None or m["shortfall_se"] < kept["shortfall_se"]:
                    rows[m["constraint"]] = {**m, "trial": i, "parameters": dict(self.experiment.trials[i].arm.parameters)}
        return [{"constraint": r["constraint"], "trial": r["trial"], "shortfall": r["shortfall"], "se": r["se"],
                 "parameters": r["parameters"]}
                for r in rows.values() if r["shortfall"] > 0 and r["shortfall_se"] > 1]

    def keep_setting(self) -> tuple[str, dict | None]:
        """What to deploy when no trial is confidently feasible: ``("keep the baseline", None)``; for a
        study of a served policy's decision log ``("keep the served setting", {its parameters})``; for
        one of logged data ``("keep the logging policy", None)``."""
        problem = self.ab_test.problem
        if getattr(problem, "state_path", None) is not None and hasattr(problem, "policy"):
            served = None
            if getattr(problem, "tune", None) == "constraints" and callable(getattr(problem, "_served_tolerances", None)):
                served = {k: float(v) for k, v in problem._served_tolerances().items()}
            elif getattr(problem, "tune", None) == "alpha" and getattr(problem.policy, "alpha", None) is not None:
                served = {"alpha": float(problem.policy.alpha)}
            return "keep the served setting", served
        if getattr(problem, "offline", False):
            return "keep the logging policy", None
        return "keep the baseline", None

    def policy_bounds(self, parameters: Mapping) -> list[dict] | None:
        """The declared limit and the policy's bound of every declared constraint at ``parameters``
        (a problem with ``policy_constraints``, e.g. ``SimulatedProblem``): ``[{"metric", "declared",
        "declared_bound", "policy_bound", "confidence", "text"}]``; None for a problem without them."""
        problem = self.ab_test.problem
        make = getattr(problem, "policy_constraints", None)
        if not callable(make):
            return None
        try:
            cons = make(dict(parameters))
        except Exception:  # noqa: BLE001 - a description only
            return None
        declared = list(getattr(problem, "declared", None) or ())
        out = []
        for k, c in enumerate(cons):
            limit = declared[k] if len(declared) == len(cons) else c.as_declared()
            unit = " x baseline" if c.versus_baseline else ""
            text = (f"{limit.describe()} (declared); the policy keeps {c.metric} {'<=' if c.at_most else '>='} "
                    f"{c.bound:.4g}{unit}" + ("" if c.confidence is None else f" with P >= {c.confidence:g}"))
            out.append({"metric": c.metric, "declared": limit.describe(), "declared_bound": float(c.declared_bound),
                        "policy_bound": float(c.bound), "relative": bool(c.versus_baseline), "at_most": bool(c.at_most),
                        "confidence": c.confidence, "text": text})
        return out

    def on_bounds(self, parameters: Mapping, tolerance: float = 0.02) -> list[str]:
        """The range parameters of ``parameters`` within ``tolerance`` of the range's width (on its
        own scale) from a bound of the search space: ``["alpha at its upper bound 0.06", ...]``."""
        from ax.core.parameter import RangeParameter

        out = []
        for name, p in self.experiment.search_space.parameters.items():
            if not isinstance(p, RangeParameter) or name not in parameters:
                continue
            lo, hi, v = float(p.lower), float(p.upper), float(parameters[name])
            if p.log_scale and lo > 0 and v > 0:
                lo, hi, v = math.log(lo), math.log(hi), math.log(v)
            if v - lo <= tolerance * (hi - lo):
                out.append(f"{name} at its lower bound {_num(p.lower)}")
            elif hi - v <= tolerance * (hi - lo):
                out.append(f"{name} at its upper bound {_num(p.upper)}")
        return out

    def best(self, model=None, confidence: float = 0.9) -> dict | None:
        """The recommended parameterization among completed trials, chosen with the model's posterior;
        or, when no trial is confidently feasible, the advice to keep what runs now.

        Each completed trial's arm gets the model's posterior probability of meeting every outcome
        constraint at its declared limit, computed in log space (``log_feasibility_probability``).
        The best is the highest model mean of the objective among arms feasible with probability
        at least ``confidence``; it comes with ``parameters``, ``predicted`` and ``observed``
        metrics, ``p_feasible``, ``log_p_feasible``, ``confident: True``, ``on_bounds`` (parameters
        at a bound of the search space), ``policy_bounds`` (declared limit and tuned policy bound of
        every constraint, ``policy_bounds``) and ``rule``.

        When no arm is feasible with that probability there is **no recommendation**: the result
        has no ``parameters``; ``trial`` is None, ``confident`` False, ``recommendation`` says what to
        keep (``keep_setting``: the baseline; the served setting for a study of a decision log,
        with its parameters as ``served_setting``) and ``closest_infeasible`` ranks every completed
        trial safest first: by the model's ``log_p_feasible`` (ties: the observed one), each with
        its ``misses`` against every constraint (``constraint_margins``: observed shortfall in the
        metric's units and in SEs, the model's standardised margin), ``log_p_feasible_observed``
        (from the trial's own means and SEMs) and ``relative_miss`` (the sum over constraints of
        the observed shortfall beyond the limit divided by the limit, ``|bound|``, 1 for a bound of
        0; SEs ignored); ``ranked_by_observed`` orders the same trials by the observed margins alone
        (``relative_miss``, ties by ``log_p_feasible_observed``). ``None`` without completed trials.
        """
        observed = self.observed()
        if not observed:
            return None
        model = self.fit_model() if model is None else model
        indices = list(observed)
        params = [dict(self.experiment.trials[i].arm.parameters) for i in indices]
        preds = self.predict(params, model=model)
        sign = -1 if self.minimize else 1
        cands = []
        for i, p, pred in zip(indices, params, preds):
            if self.objective_name not in pred:
                continue
            logp = self.log_feasibility_probability(pred) if self.constraints else 0.0
            if math.isnan(logp):
                continue
            cands.append((i, p, pred, logp))
        if not cands:
            return None
        threshold = math.log(confidence) if confidence > 0 else -math.inf
        confident = [c for c in cands if c[3] >= threshold]
        if not confident:
            return self._no_recommendation(cands, observed, confidence)
        i, p, pred, logp = max(confident, key=lambda c: sign * c[2][self.objective_name][0])
        rule = (f"the completed trial with the best model-predicted {self.objective_name} among those the model "
                f"predicts feasible with probability at least {confidence:g}")
        return {"trial": i, "parameters": p, "predicted": pred, "observed": observed[i], "p_feasible": math.exp(logp),
                "log_p_feasible": logp, "confident": True, "confidence": confidence, "on_bounds": self.on_bounds(p),
                "policy_bounds": self.policy_bounds(p), "rule": rule, "recommendation": f"deploy trial {i}'s parameters"}

    def _no_recommendation(self, cands: list, observed: dict, confidence: float) -> dict:
        """``best`` when no trial is confidently feasible: keep what runs now; the trials ranked by how
        far they miss (safest first)."""
        keep, served = self.keep_setting()
        ranked = []
        for i, p, pred, logp in cands:
            obs = observed[i]
            logp_obs = log_feasibility(self.constraints, obs)
            ranked.append({"trial": i, "parameters_tried": p, "predicted": pred, "observed": obs,
                           "log_p_feasible": logp, "p_feasible": math.exp(logp),
                           "log_p_feasible_observed": None if math.isnan(logp_obs) else logp_obs,
                           "misses": self.constraint_margins(obs, pred), "on_bounds": self.on_bounds(p),
                           "policy_bounds": self.policy_bounds(p)})

        def observed_key(r):
            v = r["log_p_feasible_observed"]
            return -math.inf if v is None else v

        for r in ranked:
            # how far the trial's own means lie beyond the limits, each relative to its limit (SEs ignored)
            r["relative_miss"] = sum(max(0.0, m["shortfall"]) / (abs(m["bound"]) or 1.0) if m["shortfall"] is not None
                                     else math.inf for m in r["misses"])
        ranked.sort(key=lambda r: (-r["log_p_feasible"], -observed_key(r), r["trial"]))
        by_observed = [r["trial"] for r in sorted(ranked, key=lambda r: (r["relative_miss"], -observed_key(r), r["trial"]))]
        top = ranked[0]
        rule = (f"no completed trial is predicted feasible with probability {confidence:g} (the highest is "
                f"{_prob_text(top['log_p_feasible'])}, trial {top['trial']}): there is no recommendation; "
                f"{keep}. The trials are ranked by how likely they are to meet every outcome constraint, "
                "safest first (log-probabilities, so a far miss still ranks)")
        out = {"trial": None, "confident": False, "confidence": confidence, "recommendation": keep,
               "rule": rule, "closest_infeasible": ranked, "ranked_by_observed": by_observed}
        if served is not None:
            out["served_setting"] = served
        return out

    def rerun_seed(self, index: int) -> int:
        """The seed of the confirmation re-run of trial ``index``: fresh, never a trial's
        (``seed * 100003 + i``) nor the pilot's, and the same every time it is asked."""
        import numpy as np

        state = np.random.SeedSequence([self.seed, int(index), 27_644_437]).generate_state(1, dtype=np.uint32)
        return int(state[0]) & 0x7FFFFFFF

    def rerun(self, index: int, replicates: int | None = None, *, refresh: bool = False) -> dict:
        """Re-run trial ``index``'s parameterization with fresh seeds (the winner's-curse check).

        The best point is the trial that looked best among many noisy ones, so its own estimate
        is biased in its favour (a trial with a lucky draw, or a small SEM by chance, wins). A
        re-run with seeds no trial used measures the same parameterization again, free of the
        selection: ``replicates`` independent A/B tests (default the study's own per-trial count,
        at least 2 so the re-run has its own spread), combined as a trial is
        (``bayes_safe.tuning.ab_test.combine_replicates``). Stored in the study's properties
        (``reruns``), so a report written again does not run it again unless ``refresh``.

        Returns ``{"trial", "parameters", "seed", "replicates", "metrics" {m: [mean, sem]},
        "feasible" (the re-run's means meet every outcome constraint), "seconds"}``.
        """
        from .ab_test import combine_replicates

        trial = self.experiment.trials[int(index)]
        if trial.arm is None:
            raise ValueError(f"index: trial {index} has no parameters to re-run")
        reruns = self.properties.setdefault("reruns", {})
        replicates = max(2, int(getattr(self.ab_test, "replicates", 1))) if replicates is None else int(replicates)
        key = str(int(index))
        done = reruns.get(key)
        if not refresh and isinstance(done, dict) and done.get("replicates") == replicates:
            return done
        params = dict(trial.arm.parameters)
        seed = self.rerun_seed(int(index))
        start = time.perf_counter()
        shared = bool(getattr(self.ab_test.problem, "replicates_share_rows", False))  # a study of logs
        metrics, _ = combine_replicates(self.ab_test.evaluate_replicates(params, seed, replicates=replicates),
                                        shared_rows=shared)
        out = {"trial": int(index), "parameters": params, "seed": seed, "replicates": replicates,
               "metrics": {k: [float(m), float(se)] for k, (m, se) in metrics.items()},
               "feasible": self.is_feasible(metrics) if self.constraints else None,
               "seconds": time.perf_counter() - start}
        reruns[key] = out
        self._save_properties()
        return out

    def sem_ratio(self, index: int, metric: str | None = None) -> dict | None:
        """How trial ``index``'s SEM of ``metric`` (default the objective) compares with the study's
        typical SEM: ``{"metric", "sem", "median_sem", "ratio", "trials", "small"}``, ``small`` when
        the ratio is below 1/3 (a trial whose replicates agreed by chance: its estimate is less
        certain than its SEM says, and the model trusts it more than it should). None without
        at least 3 completed trials reporting the metric."""
        metric = metric or self.objective_name
        observed = self.observed()
        sems = sorted(m[metric][1] for m in observed.values() if metric in m)
        if len(sems) < 3 or index not in observed or metric not in observed[index]:
            return None
        median = sems[len(sems) // 2] if len(sems) % 2 else 0.5 * (sems[len(sems) // 2 - 1] + sems[len(sems) // 2])
        sem = observed[index][metric][1]
        ratio = sem / median if median > 0 else float("nan")
        return {"metric": metric, "sem": sem, "median_sem": median, "ratio": ratio, "trials": len(sems),
                "small": bool(median > 0 and ratio < 1 / 3)}

    def cross_validate(self, model=None) -> dict:
        """Leave-one-out cross-validation of the model (Ax's ``cross_validate``): every completed
        trial predicted by the model fitted without it, for the objective and each constraint.

        Returns ``{metric: {"points": [{"trial", "observed": (mean, sem), "predicted": (mean, sd)}],
        "coverage", "z_sd", "rank_correlation", "verdict", "ok"}}``: ``coverage`` is the share of
        held-out trials inside the 95 % interval of prediction and observation
        (``1.96 sqrt(sd^2 + sem^2)``), ``z_sd`` the standard deviation of the standardized errors
        (1 when the intervals are honest), ``rank_correlation`` Spearman's between predictions
        and observations (does the model rank the trials?).
        """
        import numpy as np
        from ax.adapter.cross_validation import cross_validate

        model = self.fit_model() if model is None else model
        with _ax_context(verbose=self.verbose):
            results = cross_validate(model, folds=-1)
        metrics = [self.objective_name] + [m for w, _, _ in self.constraints for m in w]
        out = {}
        for metric in dict.fromkeys(metrics):
            pts = []
            for r in results:
                obs, pred = r.observed.data, r.predicted
                if metric not in obs.metric_signatures or metric not in pred.metric_signatures:
                    continue
                j, k = obs.metric_signatures.index(metric), pred.metric_signatures.index(metric)
                pts.append({"trial": r.observed.features.trial_index,
                            "observed": (float(obs.means[j]), float(math.sqrt(max(obs.covariance[j][j], 0.0)))),
                            "predicted": (float(pred.means[k]), float(math.sqrt(max(pred.covariance[k][k], 0.0))))})
            if not pts:
                continue
            z = np.array([(p["observed"][0] - p["predicted"][0]) / max(1e-12, math.hypot(p["observed"][1], p["predicted"][1]))
                          for p in pts])
            coverage = float(np.mean(np.abs(z) <= 1.96))
            rank = _spearman([p["predicted"][0] for p in pts], [p["observed"][0] for p in pts])
            out[metric] = {"points": pts, "coverage": coverage, "z_sd": float(np.sqrt(np.mean(z**2))),
                           "rank_correlation": rank, **_cv_verdict(metric, len(pts), coverage, rank)}
        return out

    def ax_best(self) -> dict | None:
        """What Ax answers on this study: ``Client.get_best_parameterization()`` (its own rule: the
        model's best point when the model fits the objective, else the best raw observation)."""
        with _ax_context(verbose=self.verbose), _quiet_best_point():
            try:
                params, prediction, trial, arm = self.client.get_best_parameterization()
            except Exception as exc:  # noqa: BLE001 - e.g. no completed trial
                if isinstance(exc, AssertionError) and "None" in str(exc) and self.constraints:
                    # Ax's best-point utility found no trial within its outcome constraints (and returned None)
                    return {"error": "Ax finds no trial whose observations meet every outcome constraint (its own "
                                     "rule: within their 95 % intervals)", "no_feasible": True}
                return {"error": f"{type(exc).__name__}: {exc}"}
        return {"trial": int(trial), "arm": arm, "parameters": dict(params),
                "prediction": {k: [float(v) if v is not None else None for v in (val if isinstance(val, tuple) else (val,))]
                               for k, val in (prediction or {}).items()}}

    def export_json(self, path) -> None:
        """Write the whole study (experiment, data, generation strategy) as Ax's JSON snapshot.

        ``ax.api.Client.load_from_json_file(path)`` reads it back.
        """
        import json

        from bayes_safe.io import atomic_write_text

        with _ax_context(verbose=self.verbose):
            snapshot = self.client._to_json_snapshot()
        atomic_write_text(path, json.dumps(snapshot) + "\n")
