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
  completed, any other is marked ABANDONED (kept in the study, never modelled) and its
  parameters are run again as a new trial, so nothing is counted twice. An SQLite study is
  locked while it runs.
* **Failures**: a trial whose simulation raises is marked FAILED with the error as its reason,
  and the study goes on; it stops with an error after ``max_failures`` failures in one run.
* **Budget**: ``run(trials=N)`` runs until ``N`` trials are completed (failed and abandoned
  ones do not count).
* **Torch threads**: Ax/BoTorch runs with one torch thread. Measured on this 2-core machine
  under load: generating one BoTorch candidate took 77 s with torch's default two threads and
  3.3 s with one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

from bayes_safe.threads import single_thread

from . import storage as _storage
from .ab_test import ABTest, Range

__all__ = ["ACQUISITION_FUNCTIONS", "Study", "make_generation_strategy"]

PROPERTY_KEY = "bayes_safe_tuning"
ACQUISITION_FUNCTIONS = ("qLogNoisyExpectedImprovement", "qNoisyExpectedImprovement")
#: acquisition optimisation (multi-start L-BFGS-B): fewer starts than Ax's defaults (20 restarts
#: from 1,024 raw samples), ample for 4 parameters; halves BoTorch's generation time here
OPTIMIZER = {"num_restarts": 8, "raw_samples": 256}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def make_generation_strategy(sobol_trials: int, seed: int | None = 0,
                             acquisition: str = "qLogNoisyExpectedImprovement"):
    """Sobol for ``sobol_trials`` trials, then BoTorch with (log) noisy expected improvement."""
    from ax.adapter.registry import Generators
    from ax.core.trial_status import TrialStatus
    from ax.generation_strategy.generation_strategy import GenerationNode, GenerationStrategy
    from ax.generation_strategy.generator_spec import GeneratorSpec
    from ax.generation_strategy.transition_criterion import MinTrials

    if isinstance(sobol_trials, bool) or not isinstance(sobol_trials, int) or sobol_trials < 1:
        raise ValueError(f"sobol_trials: expected a positive int, got {sobol_trials!r}")
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
                                       generator_gen_kwargs={"model_gen_options": {"optimizer_kwargs": dict(OPTIMIZER)}})],
        should_deduplicate=True,
    )
    return GenerationStrategy(name=f"Sobol+BoTorch({acquisition})", nodes=[sobol, botorch])


def _quiet_ax(verbose: bool = False) -> None:
    """Ax logs every generated and completed trial at INFO on stderr, and routine warnings (a
    constant tracking metric, ...) at WARNING: keep errors only unless ``verbose``."""
    previous = logging.root.manager.disable
    if not verbose:
        logging.disable(logging.INFO)  # Ax logs at import time, before its level can be set
    try:
        import ax.api.client  # noqa: F401
        from ax.utils.common.logger import set_stderr_log_level
    finally:
        logging.disable(previous)
    set_stderr_log_level(logging.INFO if verbose else logging.ERROR)


@contextlib.contextmanager
def _ax_context(url: str | None = None):
    """One torch thread, BoTorch's routine numerical warnings silenced, and Ax's (process-global)
    SQL engine pointed at this study's database ``url`` (several studies can live in one process)."""
    if url is not None:
        _storage.connect(url)
    with single_thread(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"botorch\..*")
        warnings.filterwarnings("ignore", module=r"ax\..*")
        warnings.filterwarnings("ignore", module=r"linear_operator\..*")
        warnings.filterwarnings("ignore", module=r"gpytorch\..*")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"scipy\..*")
        yield


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
    if isinstance(p, Mapping):
        return _to_ax_parameter(Range(**p))
    if isinstance(p, str):
        return _to_ax_parameter(Range.parse(p))
    raise TypeError(f"parameters: expected Range, ax RangeParameterConfig / ChoiceParameterConfig, dict or "
                    f"'name=low:high' entries, got {type(p).__name__}")


def _parameter_names(p) -> str:
    return p.name


def _metric_names_in(expression: str) -> list[str]:
    return [t for t in _IDENT_RE.findall(expression) if t != "baseline"]


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
            omega_1080 in (0, 0.03]).
        objective: an Ax objective string over the A/B test's metrics (``"q_1080p_change"``
            maximises it, ``"-m"`` minimises ``m``); default: the problem's.
        outcome_constraints: Ax constraint strings (``"reliability_change >= 0"``); default: the
            problem's.
        sobol_trials: quasi-random initial trials (default ``max(5, 2 * number of parameters)``).
        seed: seeds Ax (Sobol, BoTorch) and the trials' A/B tests.
        acquisition: ``"qLogNoisyExpectedImprovement"`` (default) or ``"qNoisyExpectedImprovement"``.

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
                 seed: int = 0, acquisition: str = "qLogNoisyExpectedImprovement", verbose: bool = False):
        _quiet_ax(verbose)
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
        params = list(problem.parameters if parameters is None else parameters)
        if not params:
            raise ValueError("parameters: expected at least one parameter to tune")
        ax_params = [_to_ax_parameter(p) for p in params]
        names = [p.name for p in ax_params]
        if len(set(names)) != len(names):
            raise ValueError(f"parameters: duplicate names in {names}")
        problem.check_parameters([Range(p.name, p.bounds[0], p.bounds[1], integer=p.parameter_type == "int")
                                  for p in ax_params if hasattr(p, "bounds")])
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
        from ax.api.client import Client

        with _ax_context(url):
            client = Client(storage_config=_storage.storage_config(url) if url else None, random_seed=seed)
            client.configure_experiment(parameters=ax_params, name=name,
                                        description=f"bayes_safe tuning study of problem {problem.name!r}")
            client._experiment._properties[PROPERTY_KEY] = {
                "version": 1, "seed": seed, "ab_test": ab_test.config(), "sobol_trials": sobol_trials,
                "acquisition": acquisition, "objective": objective, "outcome_constraints": constraints,
                "surface": list(problem.surface) if problem.surface else None, "target_trials": None, "sessions": [],
            }
            client.configure_optimization(objective=objective, outcome_constraints=constraints or None)
            client.configure_tracking_metrics([m for m in ab_test.metric_names() if m not in oc.metric_names])
            client.set_generation_strategy(make_generation_strategy(sobol_trials, seed, acquisition))
        self._init(client, ab_test, url)

    # ------------------------------------------------------------------ construction
    def _init(self, client, ab_test: ABTest, url: str | None) -> None:
        self.client = client
        self.ab_test = ab_test
        self.url = url
        self.timings: dict[str, list[float]] = {"gen": [], "complete": [], "sim": [], "recover": []}
        self._last_gen_error: BaseException | None = None

    @classmethod
    def load(cls, storage, name: str | None = None, ab_test: ABTest | None = None, verbose: bool = False) -> Study:
        """Reopen a stored study (to resume it, or to report on it).

        Args:
            storage: the database URL or SQLite path the study was created with.
            name: the study's name (default: the only study in the database).
            ab_test: the A/B test (default: rebuilt from the stored description; needed for a
                study of a custom problem, which cannot be described).
        """
        _quiet_ax(verbose)
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

        with _ax_context(url):
            client = Client.load_from_database(name, storage_config=_storage.storage_config(url))
        props = client._experiment._properties.get(PROPERTY_KEY)
        if props is None:
            raise ValueError(f"name: the Ax experiment {name!r} was not created by bayes_safe tuning (no {PROPERTY_KEY} properties)")
        if ab_test is None:
            if props.get("ab_test") is None:
                raise ValueError(f"ab_test: study {name!r} uses a custom problem or policy factory; pass ab_test= to load it")
            ab_test = ABTest.from_config(props["ab_test"])
        study = cls.__new__(cls)
        study._init(client, ab_test, url)
        return study

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
        completed = {t.index for t in self.experiment.trials.values() if t.status == TrialStatus.COMPLETED}
        for row in df.itertuples(index=False):
            if row.trial_index in completed:
                out.setdefault(int(row.trial_index), {})[row.metric_name] = (float(row.mean), float(row.sem))
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

    # ------------------------------------------------------------------ running
    def _save_properties(self) -> None:
        with _ax_context(self.url):
            self.client.set_experiment(self.experiment)

    def recover(self) -> dict:
        """Settle trials left RUNNING by an interrupted run (see the module docstring).

        Returns ``{"completed": [...], "abandoned": [...], "rerun": [parameters, ...]}``.
        """
        from ax.core.trial_status import TrialStatus

        start = time.perf_counter()
        needed = set(self.experiment.optimization_config.metric_names)
        result = {"completed": [], "abandoned": [], "rerun": []}
        with _ax_context(self.url):
            for trial in list(self.experiment.trials.values()):
                if trial.status != TrialStatus.RUNNING:
                    continue
                df = self.experiment.lookup_data(trial_indices=[trial.index]).df
                has_data = len(df) > 0 and needed <= set(df["metric_name"])
                if has_data:
                    self.client.complete_trial(trial.index)
                    result["completed"].append(trial.index)
                else:
                    trial.update_run_metadata({"interrupted": True})
                    self.client.mark_trial_abandoned(trial.index)
                    result["abandoned"].append(trial.index)
                    result["rerun"].append((trial.index, dict(trial.arm.parameters)))
        self.timings["recover"].append(time.perf_counter() - start)
        return result

    def run(self, trials: int, parallel: int = 1, scheduler: str | None = None, *, inline: bool = False,
            progress: Callable[[dict], None] | None = None, max_failures: int | None = None) -> dict:
        """Run trials until ``trials`` are completed, ``parallel`` at a time.

        Args:
            trials: the number of completed trials to reach (counting those already completed).
            parallel: trials in flight at once, each in its own worker process (or Dask task).
            scheduler: address of a Dask distributed scheduler to run trials on instead.
            inline: run trials in this process, one at a time (debugging).
            progress: called with an event dict (``event`` = ``"recovered"``, ``"started"``,
                ``"completed"``, ``"failed"``) as the study advances.
            max_failures: stop with an error after this many failed trials in this run
                (default ``max(3, trials // 2)``).

        Returns:
            A summary: counts, wall time, Ax and simulation seconds.
        """
        from .runners import make_runner

        for key, v in (("trials", trials), ("parallel", parallel)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}: expected a positive int, got {v!r}")
        max_failures = max(3, trials // 2) if max_failures is None else int(max_failures)
        emit = progress or (lambda event: None)
        import cloudpickle

        payload = cloudpickle.dumps(self.ab_test)
        lock = _storage.study_lock(self.url) if self.url else contextlib.nullcontext()
        wall = time.perf_counter()
        failures = 0
        with lock:
            recovered = self.recover()
            if recovered["completed"] or recovered["abandoned"]:
                emit({"event": "recovered", **recovered})
            self.properties["target_trials"] = trials
            self._save_properties()
            rerun = list(recovered["rerun"])
            runner = make_runner(parallel, scheduler, inline=inline)
            pending: dict = {}
            try:
                while True:
                    completed = self.counts().get("COMPLETED", 0)
                    want = min(parallel - len(pending), trials - completed - len(pending))
                    if want > 0:
                        for idx, params in self._start_trials(want, rerun):
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
                    for handle in runner.wait(list(pending)):
                        idx = pending.pop(handle)
                        try:
                            out = runner.result(handle)
                        except Exception as exc:
                            failures += 1
                            reason = self._fail(idx, exc)
                            emit({"event": "failed", "trial": idx, "reason": reason, "failures": failures})
                            if failures > max_failures:
                                raise RuntimeError(f"{failures} trials failed in this run (more than max_failures="
                                                   f"{max_failures}); last: trial {idx}: {reason}") from exc
                            continue
                        self._complete(idx, out)
                        best = self.best_observed()
                        emit({"event": "completed", "trial": idx, "parameters": dict(self.experiment.trials[idx].arm.parameters),
                              "metrics": out["metrics"], "sim_seconds": out["sim_seconds"],
                              "node": self.experiment.trials[idx].run_metadata.get("node"),
                              "best": None if best is None else {"trial": best[0], "metrics": best[1],
                                                                 "parameters": dict(self.experiment.trials[best[0]].arm.parameters)},
                              "completed": self.counts().get("COMPLETED", 0), "target": trials})
            finally:
                for handle in list(pending):
                    with contextlib.suppress(Exception):
                        runner.cancel(handle)
                runner.close(force=bool(pending))
                summary = self._session_summary(time.perf_counter() - wall, parallel, scheduler, runner.description, failures)
                with contextlib.suppress(Exception):
                    self.properties.setdefault("sessions", []).append(summary)
                    self._save_properties()
        return summary

    def _start_trials(self, want: int, rerun: list) -> list[tuple[int, dict]]:
        started = []
        with _ax_context(self.url):
            while rerun and len(started) < want:
                old, params = rerun.pop(0)
                t = time.perf_counter()
                idx = self.client.attach_trial(parameters=params)
                trial = self.experiment.trials[idx]
                trial.update_run_metadata({"rerun_of": old, "seed": self.trial_seed(idx), "node": "rerun",
                                           "gen_seconds": time.perf_counter() - t})
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
        trial.update_run_metadata({"sim_seconds": out.get("sim_seconds"), "worker": out.get("worker")})
        metrics = {k: (float(m), float(s)) for k, (m, s) in out["metrics"].items()}
        with _ax_context(self.url):
            self.client.complete_trial(idx, raw_data=metrics)
        self.timings["complete"].append(time.perf_counter() - t)
        if out.get("sim_seconds") is not None:
            self.timings["sim"].append(float(out["sim_seconds"]))

    def _fail(self, idx: int, exc: BaseException) -> str:
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        trial = self.experiment.trials[idx]
        trial.update_run_metadata({"error": reason[:2000]})
        with _ax_context(self.url):
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

        with _ax_context():
            return Generators.BOTORCH_MODULAR(experiment=self.experiment, data=self.experiment.lookup_data(),
                                              **_botorch_kwargs(self.properties.get("acquisition", ACQUISITION_FUNCTIONS[0])))

    def predict(self, points: Sequence[Mapping], model=None) -> list[dict[str, tuple[float, float]]]:
        """Model mean and standard deviation of the modelled metrics at ``points`` (full parameterizations)."""
        from ax.core.observation import ObservationFeatures

        model = self.fit_model() if model is None else model
        with _ax_context():
            mean, cov = model.predict([ObservationFeatures(parameters=dict(p)) for p in points])
        return [{m: (float(mean[m][i]), float(math.sqrt(max(cov[m][m][i], 0.0)))) for m in mean} for i in range(len(points))]

    def best(self, model=None) -> dict | None:
        """The best feasible parameterization among completed trials, by the model's posterior mean.

        Feasible: the model's mean satisfies every outcome constraint; best: the highest model
        mean of the objective among those (Ax's in-sample "best point" rule). Returns the
        trial, parameters, predicted and observed metrics, or ``None`` if no completed trial
        is predicted feasible.
        """
        observed = self.observed()
        if not observed:
            return None
        model = self.fit_model() if model is None else model
        indices = list(observed)
        params = [dict(self.experiment.trials[i].arm.parameters) for i in indices]
        preds = self.predict(params, model=model)
        best = None
        for i, p, pred in zip(indices, params, preds):
            if self.objective_name not in pred or not self.is_feasible(pred):
                continue
            value = pred[self.objective_name][0] * (-1 if self.minimize else 1)
            if best is None or value > best[0]:
                best = (value, {"trial": i, "parameters": p, "predicted": pred, "observed": observed[i]})
        return None if best is None else best[1]

    def export_json(self, path) -> None:
        """Write the whole study (experiment, data, generation strategy) as Ax's JSON snapshot.

        ``ax.api.Client.load_from_json_file(path)`` reads it back.
        """
        import json

        from bayes_safe.io import atomic_write_text

        with _ax_context():
            snapshot = self.client._to_json_snapshot()
        atomic_write_text(path, json.dumps(snapshot) + "\n")
