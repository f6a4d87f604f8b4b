"""One trial of a tuning study: a simulated A/B test of a parameterized policy against the baseline.

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 5.3: "Each parameterization is
evaluated using an A/B test which allows us to measure the mean and standard error of each
metric." Here the A/B test is simulated:

* one stream of ``n_users`` units (uploads) arrives in ``batches`` batches; batch ``b`` is
  drawn at step ``b`` (``draw(n, generator, step=b)`` for a problem whose ``draw`` has a
  parameter named ``step``, detected as ``simulate`` detects it; others are called
  ``draw(n, generator)`` as before), so a time-varying problem drifts inside a trial as it does
  in ``simulate``: one step is one round of decisions with one posterior, then one update;
* every arm sees the same units, and an outcome is decided by the same random numbers under
  every arm (common random numbers: ``VideoUpload.outcomes`` decides success as
  ``u_i < p(x_i, a)`` with one uniform per upload), so the comparison with the baseline is
  paired;
* the learning arms (TS-ASC, and vanilla TS for the paper's Figure 3c) decide a whole batch
  with their current posterior (one Thompson draw per unit), then record the batch and refit
  (as a production policy refitting daily would); the baseline arm plays the baseline action;
* every metric is reported as the percent change of the arm's mean against the baseline's,
  ``100 (mean_arm / mean_baseline - 1)``, with the paired ratio-estimator delta-method
  standard error of ``bayes_safe.envs.video_upload.percent_change`` (per-unit paired
  values, so it uses the pairing), plus the arm's and the baseline's levels.

A trial is a pure function of ``(parameters, seed)``: ``ABTest.evaluate`` builds the
problem, the policies and every random stream from them, so it can run in another process
or on another machine and give the same numbers bit for bit there.

The problem is pluggable: ``ABProblem`` (``bayes_safe.envs.ab_problem``) is what the A/B
test needs from one (a stream of units, outcomes of actions, the policy factory, the feedback
a policy learns from, and the per-unit metrics). ``VideoUploadProblem`` is the paper's problem,
beside its simulator in ``bayes_safe.envs.video_upload``. This module keeps the engine
(``ABTest``), the search space (``Range``) and the registry of problems buildable by name
(``PROBLEMS``, ``make_problem``); it re-exports both problem classes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from bayes_safe._validation import check_positive_int
from bayes_safe.envs.ab_problem import ABProblem
from bayes_safe.envs.problem import Problem, problem_device
from bayes_safe.envs.video_upload import VideoUploadProblem, percent_change
from bayes_safe.simulation import _draw_takes_step
from bayes_safe.threads import single_thread

from .ranges import Range

__all__ = ["DEFAULT_REPLICATES", "PROBLEMS", "ABProblem", "ABTest", "Range", "VideoUploadProblem", "combine_replicates",
           "make_problem", "replicate_seed"]

#: independent A/B tests per trial (see ``combine_replicates``); measured in benchmarks/tuning.py
#: ``--calibration``: with one, the reported SEM understates the spread of re-runs several-fold
DEFAULT_REPLICATES = 4


# ---------------------------------------------------------------------- problems
#: problems buildable by name (the command line and stored studies use these)
PROBLEMS: dict[str, Callable[..., ABProblem]] = {"video-upload": VideoUploadProblem}


def _problems() -> dict[str, Callable[..., ABProblem]]:
    from bayes_safe.online.tuning import LoggedAlpha

    from .logged import LoggedDataProblem

    return {**PROBLEMS, "logged-data": LoggedDataProblem, "decision-log": LoggedAlpha}


def make_problem(config: Mapping | str, *, trust_source: bool | str = False) -> ABProblem:
    """Build a problem from its name (``"video-upload"``, ``"logged-data"``) or its ``config()`` dict.

    A user's problem is stored as ``{"name": "import", "import": "module:Class", "params": {...}}``
    (``SimulatedProblem.config()``). Importing it runs that module's code, so it is imported only
    with consent: ``trust_source=True``, or ``trust_source`` the same ``"module:Class"``; without
    it a ``ValueError`` names the module, the class and the file that would run (found without
    running it; ``bayes_safe._problem_import.check_import_consent``). The module is looked up on
    ``sys.path`` as it is (the current directory only when it is found nowhere else, and only
    with consent), the class checked against the ``Problem`` protocol and built with ``params``.
    A module that cannot be imported or a class that is not a problem is one ``ValueError`` /
    ``TypeError`` naming the stored path."""
    cfg = {"name": config} if isinstance(config, str) else dict(config)
    name = cfg.pop("name", None)
    if name == "import":
        from bayes_safe._problem_import import check_import_consent

        from .own_problem import SimulatedProblem, import_problem

        path = cfg.pop("import", None)
        params = cfg.pop("params", None) or {}
        try:
            check_import_consent(path, trust_source, what="trust_source",
                                 how=f"pass trust_source=True (or trust_source={path!r}) to Study.load / make_problem")
            problem = import_problem(path, params, what=f"problem (stored {path!r})", stored=True)
        except ValueError as exc:
            if "no module named" not in str(exc):
                raise
            raise ValueError(f"{exc}; resume from the directory that holds it, or put it on PYTHONPATH") from None
        return SimulatedProblem(problem, import_path=path, params=params, **cfg)
    problems = _problems()
    if name not in problems:
        raise ValueError(f"problem: expected one of {sorted(problems)}, got {name!r}")
    return problems[name](**cfg)


# ---------------------------------------------------------------------- replicates
def replicate_seed(seed: int, replicate: int) -> int:
    """The seed of a trial's replicate ``replicate`` (0: ``seed`` itself, so one replicate is the plain A/B test)."""
    if replicate == 0:
        return int(seed)
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 15_485_863, int(replicate)]).generate_state(1, dtype=np.uint32)
    return int(state[0]) & 0x7FFFFFFF


def combine_replicates(results: list[Mapping], *, shared_rows: bool = False
                       ) -> tuple[dict[str, tuple[float, float]], dict[str, dict]]:
    """One trial's ``{metric: (mean, sem)}`` from its replicates' ``{metric: (mean, within-run sem)}``.

    The mean is the replicates' average. Its SEM must cover two sources of noise: the units
    (what one run's SEM measures) and the learning (a policy re-run on other units and other
    Thompson draws learns another posterior; on video-upload two runs of the same parameters
    differ by several of their own SEMs). The spread of the replicates' means measures both:
    ``between = sd(means) / sqrt(R)``. With few replicates that estimate is itself noisy, and it
    cannot be smaller than the unit noise alone, ``within = sqrt(mean(sem_r^2) / R)``, in
    expectation: the SEM reported is ``max(between, within)``. A metric reported by a single
    replicate keeps that replicate's SEM.

    ``shared_rows``: the replicates re-estimate the same logged rows (an offline problem whose
    ``replicates_share_rows`` is true: only the Thompson draws or the split differ), so their unit
    noise is one and the same and does not average out: the SEM is ``sqrt(mean(sem_r^2) +
    between^2)``, never below one estimate's (issue 39).

    Returns ``(metrics, noise)``, ``noise[metric] = {"within": ..., "between": ..., "n": R}``
    (empty for a single replicate).
    """
    if not results:
        raise ValueError("results: expected at least one replicate")
    if len(results) == 1:
        return {k: (float(m), float(s)) for k, (m, s) in results[0].items()}, {}
    names = list(dict.fromkeys(k for r in results for k in r))
    metrics: dict[str, tuple[float, float]] = {}
    noise: dict[str, dict] = {}
    for name in names:
        pairs = [r[name] for r in results if name in r]
        means = np.array([float(m) for m, _ in pairs])
        sems = np.array([float(s) for _, s in pairs])
        n = len(pairs)
        mean = float(means.mean())
        within = float(math.sqrt(np.mean(sems**2) / (1 if shared_rows else n)))
        if n < 2:
            metrics[name] = (mean, within)
            continue
        between = float(means.std(ddof=1) / math.sqrt(n))
        metrics[name] = (mean, math.hypot(within, between) if shared_rows else max(between, within))
        noise[name] = {"within": within, "between": between, "n": n}
    return metrics, noise


# ---------------------------------------------------------------------- the A/B test
def _prefix(kind: str) -> str:
    return kind.replace("-", "_") + "_"


def _violation_names(problem) -> tuple[str, ...]:
    """The per-unit violation rates ``problem`` reports (its optional ``violation_metric_names()``)."""
    names = getattr(problem, "violation_metric_names", None)
    return tuple(names()) if callable(names) else ()


def fallback_names(guards) -> list[str]:
    """``fallback_rate_<metric>`` per guard (``Policy.fallback_constraints``), made distinct with
    ``_2``, ... (two guards on one metric): the A/B test's per-guard fallback rates."""
    from bayes_safe.envs.tolerance import _numbered

    return _numbered(["fallback_rate_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(c.metric))
                      for c in guards])


def _share_se(flags: torch.Tensor) -> tuple[float, float]:
    """A share of ``n`` units in %, and its binomial SE with the share shrunk to ``(k + 0.5) / (n + 1)``
    in the SE only: 0 (or all) of ``n`` units is not known exactly, and a zero SE would tell Ax so."""
    n = flags.numel()
    k = float(flags.sum())
    shrunk = (k + 0.5) / (n + 1)
    return 100.0 * k / n, 100.0 * math.sqrt(shrunk * (1 - shrunk) / n)


def _mean_se(values: torch.Tensor) -> tuple[float, float]:
    n = values.numel()
    if n == 0:
        return float("nan"), float("nan")
    v = values.double()
    se = float(v.std() / math.sqrt(n)) if n > 1 else float("nan")
    return float(v.mean()), se


def _learn_due(policy, queue: list, b: int, lags: tuple[int, ...], kind: str) -> None:
    """After batch ``b``: the outcomes of ``queue`` (``(batch, features, reward, constraints, actions)``) whose
    lag has passed, learned once each (``ABTest.delays``); entries fully learned leave the queue.

    A TS-ASC built with ``pending="margin"`` holds the late constraint metrics of batch ``b``'s units as
    pending from now until they are learned (``hold_pending`` / ``release_pending``: its constraint checks
    keep a margin for them; ``bayes_safe.policies.ts_asc``, "Pending outcomes")."""
    late = _held_columns(policy, lags)
    if late and queue and queue[-1][0] == b:  # the batch just played: its late constraint metrics are pending
        policy.hold_pending(queue[-1][1], late, index=_stream_index(policy, queue[-1][1]))
    if len(set(lags)) == 1:  # one lag for every metric: whole batches late, any policy
        while queue and queue[0][0] + lags[0] == b:
            _, x, reward, constraints, a = queue.pop(0)
            if late:
                policy.release_pending(x, late, index=_stream_index(policy, x))
            policy.update(x, reward, constraints, actions=a)
        return
    models = (getattr(policy, "reward_model", None), *getattr(policy, "constraint_models", ()))
    if (models[0] is None or len(models) != len(lags) or getattr(policy, "chance_recalibrate", False)
            or not all(callable(getattr(m, "update", None)) for m in models)):
        raise ValueError(f"delays: the {kind!r} arm ({type(policy).__name__}) learns a unit's outcomes together; give "
                         "every learned metric the same lag, or tune TS-ASC, whose models each learn their own metric")
    for entry in queue:
        b0, x, reward, constraints, a = entry
        for m, (model, lag) in enumerate(zip(models, lags)):
            if b0 + lag == b:
                if m - 1 in late:
                    policy.release_pending(x, [m - 1], index=_stream_index(policy, x))
                model.update(x, reward if m == 0 else constraints[:, m - 1], actions=a)
    queue[:] = [e for e in queue if e[0] + max(lags) > b]


def _check_on_cpu(problem) -> None:
    """``ValueError`` naming the device when a user's problem lives off the CPU: an A/B trial draws its units
    in batches of thousands with CPU generators and refits the arms between them (issue 46: the trial's
    cost is its refits, not its arithmetic; ``bayes_safe.simulate`` is what runs on a GPU)."""
    device = problem_device(problem)
    try:
        device = torch.device(device) if device is not None else None
    except (TypeError, RuntimeError):
        return
    if device is not None and device.type != "cpu":
        raise ValueError(f"problem: it lives on {device}; the A/B tuner runs its trials on the CPU (batches of units "
                         "with CPU generators, refits between them): build the problem on the CPU for tuning, and "
                         "use bayes_safe.simulate for runs on the GPU")


def _held_columns(policy, lags: tuple[int, ...]) -> list[int]:
    """The constraint models (indices) whose metric arrives late, when ``policy`` keeps a margin for pending
    outcomes (TS-ASC ``pending="margin"``); empty otherwise."""
    if getattr(policy, "pending", "ignore") == "ignore" or not callable(getattr(policy, "hold_pending", None)):
        return []
    return [j for j in range(len(lags) - 1) if lags[j + 1] > 0]


def _stream_index(policy, x: torch.Tensor) -> torch.Tensor | None:
    """The flat batch index of each unit's row: 0 for a policy of one stream (the A/B test's arms), None for
    models with a batch of one row per unit."""
    shape = tuple(getattr(policy.constraint_models[0], "batch_shape", ()) or ())
    return None if shape else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


@dataclass
class ABTest:
    """Evaluate one parameterization by a simulated A/B test against the baseline policy.

    Args:
        problem: the problem (default: ``VideoUploadProblem``); a ``bayes_safe.envs.Problem`` (your
            own: ``draw``, ``outcomes``, constraint declarations) is wrapped in
            ``bayes_safe.tuning.SimulatedProblem`` (TS-ASC with one tuned tolerance per constraint, on
            the problem's own models when it declares them, else ridge models; per-unit violation
            rates when it knows its means).
        n_users: units per arm (every arm sees the same units).
        batches: the stream arrives in this many batches; learning arms refit after each
            (except the last: nothing is decided after it). Batch ``b`` is the problem's step
            ``b`` (``0, ..., batches - 1``): a problem whose ``draw`` takes a ``step`` receives it,
            so a change at step ``T`` is seen from batch ``T`` on (never when ``T >= batches``).
        policy: the arm being tuned (``"ts-asc"``).
        compare: further learning arms evaluated on the same units, reported with the prefix
            ``"<arm>_"`` (``("ts",)``: vanilla TS for the paper's Figure 3c). ``()`` for none;
            ``None`` (default) for the problem's own choice (``problem.compare``).
        policy_factory: ``(kind, parameters, env, *, seed, refit_every) -> Policy`` to use
            instead of ``problem.make_policy``.
        delays: outcomes that arrive late (issue 45), ``{metric name: lag in batches}``: the learning
            arms learn a metric of batch ``b`` after batch ``b + lag`` (lag 0: after its own batch, as
            without delays; an outcome due after the last batch is never learned). Names:
            ``"reward"`` and the metrics the constraint models learn (``delay_names()``). When every
            learned metric has the same lag the arms' ``update`` takes whole batches late (any
            policy); otherwise each model learns its own metric when it arrives (TS-ASC; other
            arms are refused by name at the trial). What the arms play is scored as it happened. A
            TS-ASC arm built with ``pending="margin"`` (a ``policy_factory``'s) holds the late
            constraint metrics as pending until they are learned, as ``simulate`` does.
        replicates: independent A/B tests per trial (other units, other Thompson draws, other
            refits; each paired with its own baseline). The trial reports their mean and an SEM
            that covers the run-to-run variability of the learning policy (``combine_replicates``);
            with ``replicates=1`` the SEM measures the unit noise of one run only, which
            understates the noise of re-running a learning policy.

    For an offline problem (``problem.offline``: trials estimated from logs, see
    ``bayes_safe.tuning.logged``) ``evaluate`` returns ``problem.estimate(parameters, seed)``;
    ``n_users``, ``batches``, ``policy`` and ``compare`` do not apply; ``replicates`` does (each replicate
    trains and estimates with its own seed).

    Otherwise ``evaluate`` returns ``{metric: (mean, sem)}`` with, for each per-unit metric ``m``
    of the problem: ``m_change`` (% change of the tuned arm against the baseline),
    ``m`` (the tuned arm's level), ``baseline_m`` (the baseline's level) and, for each
    compared arm ``c``, ``c_m_change`` and ``c_m``; and the problem's level metrics (``v``,
    ``c_v``). Metrics whose value is undefined (e.g. no unit in a metric's mask) are left out.

    Per-unit violation rates: a problem with ``violation_metric_names()`` and
    ``unit_violations(env, units, actions) -> {name: bool [n]}`` (``SimulatedProblem`` of a problem
    that knows its means) gets, per name ``v``, the share of units (in %) whose played action
    violates: ``v`` for the tuned arm, ``baseline_v`` for the baseline's own plays and ``c_v`` for
    each compared arm, with the binomial SE of one run (``_share_se``; then combined over replicates).

    Fallbacks (an arm whose policy can play one, ``Policy.fallback_constraints``: TS-ASC under an
    absolute or chance constraint): ``fallback_rate`` (% of units that played the fallback),
    ``fallback_rate_<metric>`` per guard (``_2``, ... for a second guard on one metric: the units
    whose fallback that guard bound; ``fallback_names``) and, with per-unit violation rates,
    ``v_fallback`` (% of units whose fallback play broke it; ``v - v_fallback`` came from allowed
    plays); a compared arm's with its prefix. Not in ``metric_names()`` (they exist only for arms
    that can fall back): recorded with every trial, not for Ax to model.
    """

    problem: ABProblem = field(default_factory=VideoUploadProblem)
    n_users: int = 20_000
    batches: int = 4
    policy: str = "ts-asc"
    compare: tuple[str, ...] | None = None
    policy_factory: Callable | None = None
    replicates: int = DEFAULT_REPLICATES
    delays: Mapping[str, int] | None = None

    def __post_init__(self):
        if not isinstance(self.problem, ABProblem):
            # a user's Problem (bayes_safe.envs.Problem: draw / outcomes / constraints): TS-ASC tuned on it
            if isinstance(self.problem, Problem) or hasattr(self.problem, "draw") or hasattr(self.problem, "outcomes"):
                from .own_problem import SimulatedProblem

                _check_on_cpu(self.problem)
                self.problem = SimulatedProblem(self.problem)
            else:
                raise TypeError(f"problem: expected a bayes_safe.envs.Problem (draw, outcomes, metric_names) or an "
                                f"ABProblem, got {type(self.problem).__name__}")
        for key in ("n_users", "batches", "replicates"):
            setattr(self, key, check_positive_int(getattr(self, key), key))
        if self.n_users < 2 * self.batches:
            raise ValueError(f"n_users: expected at least 2 units per batch ({2 * self.batches}), got {self.n_users}")
        self.compare = tuple(self.problem.compare if self.compare is None else self.compare)
        if self.problem.offline and self.delays:
            raise ValueError(f"delays: problem {self.problem.name!r} estimates trials from logs (whose pending outcomes "
                             "it leaves out); delays apply to simulated A/B tests")
        self._lags = None if self.problem.offline else self._check_delays(self.delays)
        if self.problem.offline:
            if self.compare:
                raise ValueError(f"compare: problem {self.problem.name!r} estimates trials from logs; it has no "
                                 f"arms to compare, got {self.compare}")
            if self.policy_factory is not None:
                raise ValueError(f"policy_factory: problem {self.problem.name!r} trains its own policy from logs")
            return
        arms = (self.policy, *self.compare)
        if len(set(arms)) != len(arms):
            raise ValueError(f"compare: expected arms different from each other and from policy={self.policy!r}, got {self.compare}")
        if self.problem.policies and self.policy_factory is None:
            bad = [a for a in arms if a not in self.problem.policies]
            if bad:
                raise ValueError(f"policy: expected arms among {list(self.problem.policies)} for problem "
                                 f"{self.problem.name!r}, got {bad}")
        if self.policy_factory is not None and not callable(self.policy_factory):
            raise TypeError("policy_factory: expected a callable (kind, parameters, env, *, seed, refit_every) -> Policy")

    def delay_names(self) -> list[str]:
        """The metric names ``delays`` takes: ``"reward"``, then the metric each constraint model learns
        (a ``Problem``'s own names; ``constraint0``, ... for a problem that does not name them)."""
        names = list(self.problem.metric_names())
        columns = getattr(self.problem, "model_columns", None)
        if columns is not None:
            return ["reward", *(names[c] for c in columns)]
        return ["reward", *(f"constraint{j}" for j in range(max(len(names) - 1, 0)))]

    def _check_delays(self, delays) -> tuple[int, ...] | None:
        """``delays`` checked before any trial: the lag of each learned metric (reward first), or None."""
        if delays is None:
            return None
        names = self.delay_names()
        if not isinstance(delays, Mapping):
            raise TypeError(f"delays: expected None or {{metric name: lag in batches}} with names among {names}, got "
                            f"{type(delays).__name__}")
        unknown = [k for k in delays if k not in names]
        if unknown:
            raise ValueError(f"delays: unknown metric name(s) {unknown}; the learned metrics are {names}")
        for k, v in delays.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"delays[{k!r}]: expected a lag >= 0 in batches (an int), got {v!r}")
        lags = tuple(int(delays.get(n, 0)) for n in names)
        return None if not any(lags) else lags

    # -- metadata
    def metric_names(self) -> list[str]:
        """Every metric ``evaluate`` can report (objective and constraints must be among them)."""
        if self.problem.offline:
            return list(self.problem.metric_names())
        base = list(self.problem.metric_names())
        levels = list(self.problem.level_metric_names())
        violations = list(_violation_names(self.problem))
        names = [f"{m}_change" for m in base] + base + [f"baseline_{m}" for m in base] + levels
        names += violations + [f"baseline_{v}" for v in violations]
        for kind in self.compare:
            p = _prefix(kind)
            names += [f"{p}{m}_change" for m in base] + [f"{p}{m}" for m in base] + [f"{p}{v}" for v in levels]
            names += [f"{p}{v}" for v in violations]
        return names

    def config(self) -> dict | None:
        """A JSON-safe description that ``from_config`` turns back into this A/B test
        (``None`` when the problem or the policy factory cannot be described)."""
        problem = self.problem.config()
        if problem is None or self.policy_factory is not None:
            return None
        out = {"problem": problem, "n_users": self.n_users, "batches": self.batches, "policy": self.policy,
               "compare": list(self.compare), "replicates": self.replicates}
        if self.delays:
            out["delays"] = {str(k): int(v) for k, v in self.delays.items()}
        return out

    @classmethod
    def from_config(cls, config: Mapping, *, trust_source: bool | str = False) -> ABTest:
        """The A/B test ``config()`` described; ``trust_source`` as for ``make_problem`` (consent
        to import a user's stored ``module:Class``)."""
        cfg = dict(config)
        cfg.setdefault("replicates", 1)  # a study stored before replicates existed ran one A/B test per trial
        return cls(problem=make_problem(cfg.pop("problem"), trust_source=trust_source),
                   **{k: (tuple(v) if k == "compare" else v) for k, v in cfg.items()})

    def batch_sizes(self) -> list[int]:
        base, extra = divmod(self.n_users, self.batches)
        return [base + (1 if i < extra else 0) for i in range(self.batches)]

    # -- the trial
    def evaluate(self, parameters: Mapping, seed: int = 0) -> dict[str, tuple[float, float]]:
        """Run the trial of ``parameters`` (``replicates`` A/B tests, random streams from ``seed``);
        ``{metric: (mean, sem)}``, the SEM covering the run-to-run variability of the learning policy
        (``combine_replicates``)."""
        return self.evaluate_with_noise(parameters, seed)[0]

    def evaluate_with_noise(self, parameters: Mapping, seed: int = 0) -> tuple[dict, dict]:
        """``evaluate`` and, per metric, its noise components ``{"within": se, "between": se}``
        (``combine_replicates``; empty for a single replicate)."""
        return combine_replicates(self.evaluate_replicates(parameters, seed),
                                  shared_rows=bool(getattr(self.problem, "replicates_share_rows", False)))

    def evaluate_replicates(self, parameters: Mapping, seed: int = 0, replicates: int | None = None) -> list[dict]:
        """The trial's independent A/B tests (``replicates`` of them, default ``self.replicates``), each
        ``{metric: (mean, within-run sem)}``; replicate 0 runs with ``seed`` itself, replicate ``r``
        with ``replicate_seed(seed, r)``."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        replicates = self.replicates if replicates is None else check_positive_int(replicates, "replicates")
        return [self.evaluate_once(parameters, replicate_seed(seed, r)) for r in range(replicates)]

    def evaluate_once(self, parameters: Mapping, seed: int = 0) -> dict[str, tuple[float, float]]:
        """One A/B test of ``parameters`` with random streams from ``seed``; ``{metric: (mean, sem)}``,
        the SEM measuring the unit-level noise of this one run only."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        if not isinstance(parameters, Mapping):
            raise TypeError(f"parameters: expected a mapping of parameter name to value, got {type(parameters).__name__}")
        # a name the problem does not read (a misspelled "alhpa") would run the trial with the default
        self.problem.check_parameter_values(parameters)
        if self.problem.offline:
            return self.problem.estimate(parameters, int(seed))
        seeds = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 7_919]).generate_state(2 + len(self.compare), dtype=np.uint32)
        sizes = self.batch_sizes()
        with single_thread():
            env = self.problem.make_env(parameters, int(seeds[0]))
            factory = self.policy_factory or self.problem.make_policy
            arms = {}
            for k, kind in enumerate((self.policy, *self.compare)):
                arms[kind] = factory(kind, parameters, env, seed=int(seeds[1 + k]), refit_every=min(sizes))
            gens = {kind: torch.Generator().manual_seed(int(seeds[1 + k]) + 1) for k, kind in enumerate(arms)}
            # the units' stream: the trial's environment is a bayes_safe.envs.Problem (draw(n, generator)); one
            # whose draw takes the step (a time-varying problem) gets the batch's index, as simulate passes its step
            stream = torch.Generator().manual_seed(int(seeds[0]))
            timed = _draw_takes_step(env)
            records: dict[str, list] = {"units": [], "baseline": [], **{kind: [] for kind in arms}}
            actions: dict[str, list] = {kind: [] for kind in arms}
            falls: dict[str, list] = {kind: [] for kind in arms}  # (fell [n], by [G, n]) of arms that can fall back
            late: dict[str, list] = {kind: [] for kind in arms}  # (batch, played features, reward, constraints, actions)
            for b, n in enumerate(sizes):
                units = env.draw(n, stream, step=b) if timed else env.draw(n, stream)
                records["units"].append(units)
                records["baseline"].append(env.outcomes(units, units.baseline))
                rows = torch.arange(n)
                for kind, policy in arms.items():
                    a = policy.select(units.features, units.baseline, generator=gens[kind], valid=units.valid)
                    if getattr(policy, "fallback_constraints", None) is not None:
                        falls[kind].append((policy.last_fallback.clone(), policy.last_fallback_by.clone()))
                    out = env.outcomes(units, a)
                    records[kind].append(out)
                    actions[kind].append(a)
                    if b < len(sizes) - 1:
                        reward, constraints = self.problem.feedback(env, units, out)
                        if self._lags is None:
                            policy.update(units.features[rows, a], reward, constraints, actions=a)
                        else:  # outcomes that arrive late: what is due after batch b
                            late[kind].append((b, units.features[rows, a], reward, constraints, a))
                            _learn_due(policy, late[kind], b, self._lags, kind)
            result = self._summarize(env, records, parameters)
            result.update(self._violations(env, records["units"], actions, falls))
            result.update(self._fallbacks(arms, falls))
            result.update(self._chance_calibration(env, arms, records["units"], actions, falls))
            return result

    def _chance_calibration(self, env, arms: dict, units: list, actions: dict, falls: dict) -> dict:
        """Per chance constraint of an arm (``TSASC.chance_guards``) whose declaration the problem counts
        per unit (``unit_violations``): ``chance_claimed_<metric>``, the confidence it claims for every
        allowed play, and ``chance_realised_<metric>``, the share of the allowed (non-fallback) plays
        whose true mean meets the declared limit (binomial SE of this run), as fractions; compared arms
        with their prefix. What ``bayes-safe simulate`` shows as ``claimed >= 0.95 safe, realised
        0.90`` (``bayes_safe.diagnostics.chance``), for the tuning report (issue 39)."""
        names = _violation_names(self.problem)
        declared = list(getattr(self.problem, "declared", ()) or ())
        if not names or len(names) != len(declared):
            return {}
        out: dict[str, tuple[float, float]] = {}
        for k, (kind, policy) in enumerate(arms.items()):
            guards = getattr(policy, "chance_guards", ())
            if not guards:
                continue
            prefix = "" if k == 0 else _prefix(kind)
            per_batch = [self.problem.unit_violations(env, u, a) for u, a in zip(units, actions[kind])]
            if any(v is None for v in per_batch):
                continue
            fell = (torch.cat([f for f, _ in falls[kind]]).reshape(-1) if falls.get(kind)
                    else torch.zeros(sum(len(u) for u in units), dtype=torch.bool))
            for _, c in guards:
                j = next((i for i, d in enumerate(declared) if d.metric == c.metric and d.at_most == c.at_most
                          and d.versus_baseline == c.versus_baseline), None)
                if j is None:
                    continue
                broken = torch.cat([v[names[j]].reshape(-1) for v in per_batch]).bool()[~fell]
                label = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in c.metric)
                if f"{prefix}chance_claimed_{label}" in out or not broken.numel():
                    continue
                share, se = _share_se(~broken)
                out[f"{prefix}chance_claimed_{label}"] = (float(c.confidence), 0.0)
                out[f"{prefix}chance_realised_{label}"] = (share / 100.0, se / 100.0)
        return out

    def _fallbacks(self, arms: dict, falls: dict) -> dict[str, tuple[float, float]]:
        """Per arm that can fall back (``Policy.fallback_constraints``; TS-ASC off the paper's path), the
        share of units (in %, binomial SE of this run) that played the fallback: ``fallback_rate``, and
        per guard the share whose fallback it bound: ``fallback_rate_<metric>`` (``_2``, ... for a
        second guard on one metric); compared arms with their prefix (``ts_fallback_rate``)."""
        out: dict[str, tuple[float, float]] = {}
        for k, (kind, policy) in enumerate(arms.items()):
            if not falls[kind]:
                continue
            prefix = "" if k == 0 else _prefix(kind)
            out[f"{prefix}fallback_rate"] = _share_se(torch.cat([f for f, _ in falls[kind]]))
            by = torch.cat([b for _, b in falls[kind]], -1)  # [G, units]
            for g, name in enumerate(fallback_names(policy.fallback_constraints)):
                out[f"{prefix}{name}"] = _share_se(by[g])
        return out

    def _violations(self, env, units: list, actions: dict, falls: dict | None = None) -> dict[str, tuple[float, float]]:
        """Per-unit violation rates (% of units, binomial SE of this run) of every arm, the baseline
        included (its own plays: ``units.baseline``); none when the problem does not count them.
        For an arm that can fall back, also ``<name>_fallback``: the units whose play was the fallback
        and broke the constraint (so ``<name> - <name>_fallback`` came from allowed plays)."""
        names = _violation_names(self.problem)
        if not names:
            return {}
        played = {"baseline_": [u.baseline for u in units]}
        fell = {}
        for k, kind in enumerate(actions):
            prefix = "" if k == 0 else _prefix(kind)
            played[prefix] = actions[kind]
            if falls and falls.get(kind):
                fell[prefix] = torch.cat([f for f, _ in falls[kind]])
        out: dict[str, tuple[float, float]] = {}
        for prefix, acts in played.items():
            per_batch = [self.problem.unit_violations(env, u, a) for u, a in zip(units, acts)]
            if any(v is None for v in per_batch):
                continue
            for name in names:
                flags = torch.cat([v[name].reshape(-1) for v in per_batch]).bool()
                if flags.numel():
                    out[f"{prefix}{name}"] = _share_se(flags)
                    if prefix in fell:
                        out[f"{prefix}{name}_fallback"] = _share_se(flags & fell[prefix])
        return out

    def _summarize(self, env, records: dict, parameters: Mapping) -> dict[str, tuple[float, float]]:
        def metrics_of(outs):
            per_batch = [self.problem.unit_metrics(env, u, o) for u, o in zip(records["units"], outs)]
            merged = {}
            for name in per_batch[0]:
                vals = torch.cat([pb[name][0].double() for pb in per_batch])
                masks = [pb[name][1] for pb in per_batch]
                mask = None if all(m is None for m in masks) else torch.cat(
                    [torch.ones(len(pb[name][0]), dtype=torch.bool) if m is None else m.bool() for pb, m in zip(per_batch, masks)])
                merged[name] = (vals, mask)
            return merged

        def levels_of(outs):
            per_batch = [self.problem.level_metrics(env, u, o, bo, parameters)
                         for u, o, bo in zip(records["units"], outs, records["baseline"])]
            return {name: torch.cat([pb[name].double() for pb in per_batch]) for name in per_batch[0]}

        base = metrics_of(records["baseline"])
        result: dict[str, tuple[float, float]] = {}
        for name, (vals, mask) in base.items():
            result[f"baseline_{name}"] = _mean_se(vals if mask is None else vals[mask])
        for k, kind in enumerate((self.policy, *self.compare)):
            prefix = "" if k == 0 else _prefix(kind)
            arm = metrics_of(records[kind])
            for name, (vals, mask) in arm.items():
                bvals = base[name][0]
                if mask is not None:
                    vals, bvals = vals[mask], bvals[mask]
                result[f"{prefix}{name}"] = _mean_se(vals)
                if vals.numel() >= 2:
                    result[f"{prefix}{name}_change"] = percent_change(vals, bvals)
            for name, vals in levels_of(records[kind]).items():
                result[f"{prefix}{name}"] = _mean_se(vals)
        return {k: (float(m), float(s)) for k, (m, s) in result.items() if math.isfinite(m) and math.isfinite(s)}

    def timed_evaluate(self, parameters: Mapping, seed: int = 0) -> dict:
        """``evaluate`` plus its wall time and noise components:
        ``{"metrics": ..., "noise": ..., "replicates": R, "sim_seconds": ...}``."""
        start = time.perf_counter()
        metrics, noise = self.evaluate_with_noise(parameters, seed)
        return {"metrics": metrics, "noise": noise, "replicates": self.replicates,
                "sim_seconds": time.perf_counter() - start}
