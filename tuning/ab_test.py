"""One trial of a tuning study: a simulated A/B test of a parameterized policy against the baseline.

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 5.3: "Each parameterization is
evaluated using an A/B test which allows us to measure the mean and standard error of each
metric." Here the A/B test is simulated:

* one stream of ``n_users`` units (uploads) arrives in ``batches`` batches;
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

The problem is pluggable: ``ABProblem`` is what the A/B test needs from one (a stream of
units, outcomes of actions, the policy factory, the feedback a policy learns from, and the
per-unit metrics). ``VideoUploadProblem`` is the paper's problem on the simulator
``bayes_safe.envs.video_upload``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bayes_safe._validation import check_positive_int
from bayes_safe.envs.video_upload import (
    ACTION_NAMES,
    CONNECTIONS,
    FEATURE_DIM,
    RESOLUTIONS,
    VideoUpload,
    percent_change,
)
from bayes_safe.threads import single_thread

__all__ = ["PROBLEMS", "ABProblem", "ABTest", "Range", "VideoUploadProblem", "make_problem"]


# ---------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Range:
    """A real (or integer) parameter of a study, searched in ``[low, high]``.

    Args:
        name: the parameter's name (what the problem's ``make_env`` / ``make_policy`` read).
        low, high: bounds, ``low < high`` (an empty or reversed range is an error).
        log: search on a log scale (needs ``low > 0``).
        integer: an integer parameter.
    """

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"parameter name: expected an identifier (letters, digits, _), got {self.name!r}")
        for key in ("low", "high"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"parameter {self.name!r}: expected a finite number for {key}, got {v!r}")
        if self.low == self.high:
            raise ValueError(f"parameter {self.name!r}: bounds [{self.low}, {self.high}] are empty; expected low < high")
        if self.low > self.high:
            raise ValueError(f"parameter {self.name!r}: bounds [{self.low}, {self.high}] are reversed; expected low < high")
        if self.log and self.low <= 0:
            raise ValueError(f"parameter {self.name!r}: a log-scale range needs low > 0, got low={self.low}")

    def to_dict(self) -> dict:
        return {"name": self.name, "low": self.low, "high": self.high, "log": self.log, "integer": self.integer}

    @classmethod
    def parse(cls, text: str) -> Range:
        """``"name=low:high"`` (optionally ``":log"`` / ``":int"`` appended), as on the command line."""
        name, sep, rest = str(text).partition("=")
        parts = rest.split(":")
        if not sep or len(parts) < 2:
            raise ValueError(f"--parameter: expected NAME=LOW:HIGH[:log][:int], got {text!r}")
        flags = set(parts[2:])
        if flags - {"log", "int"}:
            raise ValueError(f"--parameter {text!r}: unknown flags {sorted(flags - {'log', 'int'})}; expected log or int")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"--parameter {text!r}: expected numbers for LOW and HIGH") from None
        return cls(name.strip(), low, high, log="log" in flags, integer="int" in flags)


# ---------------------------------------------------------------------- problems
class ABProblem:
    """What ``ABTest`` needs from a problem. Subclass it for your own problem.

    A unit (an upload, a request, a patient) arrives with candidate actions; the problem
    gives a seeded stream of units and their outcomes under any actions, using the same
    random numbers whatever the actions (common random numbers). Required:

    * ``make_env(parameters, seed)`` -> an environment with ``draw(n)`` returning units that
      have ``features [n, K, d]``, ``baseline [n]`` and ``valid [n, K]`` (or ``None``), and
      ``outcomes(units, actions [n])``;
    * ``make_policy(kind, parameters, env, *, seed, refit_every)`` -> a
      ``Policy`` (``select`` / ``update``); ``kind`` is the
      arm's name (``"ts-asc"``, ``"ts"``, ...) and ``refit_every`` the batch size;
    * ``feedback(env, units, outcomes)`` -> ``(reward [n], constraints [n, C] or None)``, what
      a policy learns from;
    * ``unit_metrics(env, units, outcomes)`` -> ``{name: (values [n], mask [n] or None)}``,
      per-unit values whose means are compared with the baseline's (``mask`` restricts a
      metric to some units, e.g. uploads with a 1080p source).

    Offline problems (``offline = True``, e.g. ``bayes_safe.tuning.logged.LoggedDataProblem``) replace
    the simulation: ``estimate(parameters, seed)`` returns the trial's ``{metric: (mean, sem)}``
    directly and ``metric_names()`` lists every metric by its full name.

    Optional: ``level_metrics(env, units, outcomes, baseline_outcomes, parameters)`` ->
    ``{name: values [n]}`` reported as means (not as changes); ``config()`` (a JSON-safe dict
    that rebuilds the problem through ``make_problem``, so a stored study can be resumed
    from the command line); the study defaults ``parameters``, ``objective``,
    ``outcome_constraints`` and ``surface`` (the two parameters of the response-surface plots).
    """

    name: str = "custom"
    policies: tuple[str, ...] = ()
    #: arms compared with the tuned one by default (``ABTest(compare=None)``)
    compare: tuple[str, ...] = ()
    #: True: trials are estimated by ``estimate`` (no simulation)
    offline: bool = False
    parameters: tuple[Range, ...] = ()
    objective: str | None = None
    outcome_constraints: tuple[str, ...] = ()
    surface: tuple[str, str] | None = None

    def metric_names(self) -> tuple[str, ...]:
        """Names of the per-unit metrics ``unit_metrics`` returns (without the ``_change`` suffix)."""
        raise NotImplementedError

    def level_metric_names(self) -> tuple[str, ...]:
        return ()

    def check_parameters(self, ranges: Sequence[Range]) -> None:
        """Raise ``ValueError`` for parameters this problem does not read or cannot take."""

    def make_env(self, parameters: Mapping, seed: int):
        raise NotImplementedError

    def make_policy(self, kind: str, parameters: Mapping, env, *, seed: int, refit_every: int):
        raise NotImplementedError

    def feedback(self, env, units, outcomes):
        raise NotImplementedError

    def unit_metrics(self, env, units, outcomes) -> dict:
        raise NotImplementedError

    def level_metrics(self, env, units, outcomes, baseline_outcomes, parameters) -> dict:
        return {}

    def config(self) -> dict | None:
        return None

    def estimate(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        """An offline problem's trial: ``{metric: (mean, sem)}`` for ``parameters``."""
        raise NotImplementedError(f"problem {self.name!r}: estimate() is for offline problems (offline = True)")

    # -- how the report (bayes_safe.tuning.report) words a study of this problem
    #: what one trial is, in the set-up line; its observed metrics; the work a trial does
    trial_noun: str = "A/B test"
    observed_label: str = "A/B test mean"
    trial_work: str = "simulation"
    report_intro: str = (
        "Bayesian optimisation of TS-ASC's alpha and reward offsets (Daulton et al. 2019, section 5.3): each trial "
        "is a simulated A/B test of one parameterization against the baseline policy on common random numbers; "
        "metrics are % changes against the baseline with paired delta-method standard errors.")

    def tuned_label(self, ab_test) -> str:
        """The tuned arm's name in the figures."""
        return "TS-ASC" if ab_test.policy == "ts-asc" else ab_test.policy

    def describe(self, ab_test) -> str:
        """How a trial runs, for the report's set-up line."""
        text = (f"{ab_test.n_users:,} users per arm in {ab_test.batches} batches (the policy refits after each); "
                f"tuned arm `{ab_test.policy}`")
        if ab_test.compare:
            text += ", compared arms " + ", ".join(f"`{c}`" for c in ab_test.compare)
        return text


#: the paper's search space (section 5.3): omega_360p = 1 fixed; the open lower bounds (0, ...]
#: become 1e-4 (omega must be positive: the reward must strictly increase with quality)
VIDEO_UPLOAD_PARAMETERS = (
    Range("alpha", 0.0, 0.06),
    Range("omega_480", 1e-4, 0.05),
    Range("omega_720", 1e-4, 0.04),
    Range("omega_1080", 1e-4, 0.03),
)

_OMEGA_NAMES = ("omega_360", "omega_480", "omega_720", "omega_1080")
_WARM_CACHE: dict = {}


@dataclass
class VideoUploadProblem(ABProblem):
    """The paper's video-upload problem (section 5) on ``VideoUpload``.

    Parameters read: ``alpha`` (TS-ASC's tolerated relative drop of success probability) and
    the reward offsets ``omega_480``, ``omega_720``, ``omega_1080`` (``omega_360`` = 1 unless
    given); a parameter a study does not tune takes its value from ``defaults``.

    Arms: ``"ts-asc"`` (TS-ASC, Algorithm 1, reward view ``ScaledOutcome(model, cumsum(omega))``
    and constraint view ``SuccessProbability(model)`` of one ``ProbitGP``)
    and ``"ts"`` (vanilla Thompson sampling on the reward view; alpha is irrelevant to it).

    Warm start (as ``studies/video_upload.py``): before the A/B test, ``warmup`` uploads are
    logged under a uniformly random valid action and one ProbitGP is fitted on them; every arm
    starts from a copy. The log is the same for every trial of a study (``warmup_seed``): it is
    the study's historical exploration data, not part of any trial's randomness, and its
    fitted model is cached per process.

    Args:
        warmup: size of the exploration log.
        warmup_seed: seed of the log and of the warm-start fit.
        model: keyword arguments of ``ProbitGP``.
        defaults: values of parameters a study does not tune.
    """

    warmup: int = 4_000
    warmup_seed: int = 0
    model: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=lambda: {"alpha": 0.01, "omega_360": 1.0, "omega_480": 0.02,
                                                    "omega_720": 0.02, "omega_1080": 0.02})

    name = "video-upload"
    policies = ("ts-asc", "ts")
    compare = ("ts",)
    parameters = VIDEO_UPLOAD_PARAMETERS
    objective = "q_1080p_change"
    outcome_constraints = ("reliability_change >= 0",)
    surface = ("alpha", "omega_1080")

    def __post_init__(self):
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 10:
            raise ValueError(f"warmup: expected an int >= 10 (size of the exploration log), got {self.warmup!r}")
        if not isinstance(self.model, dict):
            raise TypeError(f"model: expected a dict of ProbitGP keyword arguments, got {type(self.model).__name__}")
        unknown = set(self.defaults) - {"alpha", *_OMEGA_NAMES}
        if unknown:
            raise ValueError(f"defaults: unknown parameters {sorted(unknown)}; expected alpha, {', '.join(_OMEGA_NAMES)}")

    # -- metadata
    def metric_names(self) -> tuple[str, ...]:
        return ("reliability", "expected_reliability", "q_1080p", "delivered_quality",
                *[f"share_{q}" for q in ACTION_NAMES], *[f"reliability_{c}" for c in CONNECTIONS])

    def level_metric_names(self) -> tuple[str, ...]:
        return ("violation_rate",)

    def check_parameters(self, ranges: Sequence[Range]) -> None:
        for r in ranges:
            if r.name not in ("alpha", *_OMEGA_NAMES):
                raise ValueError(f"parameter {r.name!r}: the video-upload problem reads only alpha and "
                                 f"{', '.join(_OMEGA_NAMES)}")
            if r.name == "alpha" and not (0 <= r.low and r.high < 1):
                raise ValueError(f"parameter 'alpha': bounds [{r.low}, {r.high}] must lie in [0, 1)")
            if r.name.startswith("omega") and r.low <= 0:
                raise ValueError(f"parameter {r.name!r}: reward offsets must be positive, got low={r.low} "
                                 "(the paper's (0, x] interval: use a small positive lower bound such as 1e-4)")
            if r.integer:
                raise ValueError(f"parameter {r.name!r}: expected a real parameter, not an integer one")

    def config(self) -> dict:
        return {"name": self.name, "warmup": self.warmup, "warmup_seed": self.warmup_seed, "model": dict(self.model),
                "defaults": dict(self.defaults)}

    def describe(self, ab_test) -> str:
        text = super().describe(ab_test) + f"; warm start from an exploration log of {self.warmup:,} uploads"
        return text + (f"; model options {self.model}" if self.model else "")

    # -- the problem
    def _value(self, parameters: Mapping, name: str) -> float:
        return float(parameters[name]) if name in parameters else float(self.defaults[name])

    def make_env(self, parameters: Mapping, seed: int) -> VideoUpload:
        omega = [self._value(parameters, n) for n in _OMEGA_NAMES]
        return VideoUpload(omega=omega, seed=int(seed))

    def _warm_model(self):
        """The ProbitGP fitted on the exploration log (cached per process)."""
        key = (self.warmup, self.warmup_seed, repr(sorted(self.model.items())))
        model = _WARM_CACHE.get(key)
        if model is None:
            from bayes_safe.models import ProbitGP

            env = VideoUpload(seed=10_007 + self.warmup_seed)
            logged = env.draw(self.warmup)
            gen = torch.Generator().manual_seed(20_011 + self.warmup_seed)
            a0 = torch.rand(len(logged), 4, generator=gen, dtype=torch.float64).masked_fill(~logged.valid, -1).argmax(-1)
            o0 = env.outcomes(logged, a0)
            model = ProbitGP(FEATURE_DIM, **{"seed": self.warmup_seed, **self.model, "refit_every": None})
            model.update(logged.features[torch.arange(len(logged)), a0], o0.success.double())
            model.fit()
            if len(_WARM_CACHE) >= 4:
                _WARM_CACHE.pop(next(iter(_WARM_CACHE)))
            _WARM_CACHE[key] = model
        return model

    def make_policy(self, kind: str, parameters: Mapping, env: VideoUpload, *, seed: int, refit_every: int):
        from bayes_safe.models import ScaledOutcome, SuccessProbability
        from bayes_safe.policies import TSASC, ThompsonSampling

        model = copy.deepcopy(self._warm_model())
        model.refit_every = int(refit_every)
        if kind == "ts-asc":
            return TSASC(ScaledOutcome(model, env.reward_scale), SuccessProbability(model),
                         alpha=self._value(parameters, "alpha"))
        if kind == "ts":
            return ThompsonSampling(ScaledOutcome(model, env.reward_scale))
        raise ValueError(f"policy: expected one of {list(self.policies)} for the video-upload problem, got {kind!r}")

    def feedback(self, env, units, outcomes):
        return outcomes.reward, outcomes.success.double()[:, None]

    def unit_metrics(self, env, units, outcomes) -> dict:
        success = outcomes.success.double()
        source = units.groups["source_resolution"]
        lines = torch.tensor(RESOLUTIONS, dtype=torch.float64)[outcomes.actions]
        out = {
            "reliability": (success, None),
            "expected_reliability": (outcomes.success_prob, None),
            "q_1080p": (outcomes.preserved_1080p.double(), source == 3),
            "delivered_quality": (success * lines, None),
        }
        for j, q in enumerate(ACTION_NAMES):
            out[f"share_{q}"] = ((outcomes.actions == j).double(), None)
        for i, c in enumerate(CONNECTIONS):
            out[f"reliability_{c}"] = (success, units.groups["connection"] == i)
        return out

    def level_metrics(self, env, units, outcomes, baseline_outcomes, parameters) -> dict:
        alpha = self._value(parameters, "alpha")
        return {"violation_rate": (outcomes.success_prob < (1 - alpha) * baseline_outcomes.success_prob).double()}


#: problems buildable by name (the command line and stored studies use these)
PROBLEMS: dict[str, Callable[..., ABProblem]] = {"video-upload": VideoUploadProblem}


def _problems() -> dict[str, Callable[..., ABProblem]]:
    from .logged import LoggedDataProblem

    return {**PROBLEMS, "logged-data": LoggedDataProblem}


def make_problem(config: Mapping | str) -> ABProblem:
    """Build a problem from its name (``"video-upload"``, ``"logged-data"``) or its ``config()`` dict."""
    cfg = {"name": config} if isinstance(config, str) else dict(config)
    name = cfg.pop("name", None)
    problems = _problems()
    if name not in problems:
        raise ValueError(f"problem: expected one of {sorted(problems)}, got {name!r}")
    return problems[name](**cfg)


# ---------------------------------------------------------------------- the A/B test
def _prefix(kind: str) -> str:
    return kind.replace("-", "_") + "_"


def _mean_se(values: torch.Tensor) -> tuple[float, float]:
    n = values.numel()
    if n == 0:
        return float("nan"), float("nan")
    v = values.double()
    se = float(v.std() / math.sqrt(n)) if n > 1 else float("nan")
    return float(v.mean()), se


@dataclass
class ABTest:
    """Evaluate one parameterization by a simulated A/B test against the baseline policy.

    Args:
        problem: the problem (default: ``VideoUploadProblem``).
        n_users: units per arm (every arm sees the same units).
        batches: the stream arrives in this many batches; learning arms refit after each
            (except the last: nothing is decided after it).
        policy: the arm being tuned (``"ts-asc"``).
        compare: further learning arms evaluated on the same units, reported with the prefix
            ``"<arm>_"`` (``("ts",)``: vanilla TS for the paper's Figure 3c). ``()`` for none;
            ``None`` (default) for the problem's own choice (``problem.compare``).
        policy_factory: ``(kind, parameters, env, *, seed, refit_every) -> Policy`` to use
            instead of ``problem.make_policy``.

    For an offline problem (``problem.offline``: trials estimated from logs, see
    ``bayes_safe.tuning.logged``) ``evaluate`` returns ``problem.estimate(parameters, seed)``;
    ``n_users``, ``batches``, ``policy`` and ``compare`` do not apply.

    Otherwise ``evaluate`` returns ``{metric: (mean, sem)}`` with, for each per-unit metric ``m``
    of the problem: ``m_change`` (% change of the tuned arm against the baseline),
    ``m`` (the tuned arm's level), ``baseline_m`` (the baseline's level) and, for each
    compared arm ``c``, ``c_m_change`` and ``c_m``; and the problem's level metrics (``v``,
    ``c_v``). Metrics whose value is undefined (e.g. no unit in a metric's mask) are left out.
    """

    problem: ABProblem = field(default_factory=VideoUploadProblem)
    n_users: int = 20_000
    batches: int = 4
    policy: str = "ts-asc"
    compare: tuple[str, ...] | None = None
    policy_factory: Callable | None = None

    def __post_init__(self):
        if not isinstance(self.problem, ABProblem):
            raise TypeError(f"problem: expected an ABProblem, got {type(self.problem).__name__}")
        for key in ("n_users", "batches"):
            setattr(self, key, check_positive_int(getattr(self, key), key))
        if self.n_users < 2 * self.batches:
            raise ValueError(f"n_users: expected at least 2 units per batch ({2 * self.batches}), got {self.n_users}")
        self.compare = tuple(self.problem.compare if self.compare is None else self.compare)
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

    # -- metadata
    def metric_names(self) -> list[str]:
        """Every metric ``evaluate`` can report (objective and constraints must be among them)."""
        if self.problem.offline:
            return list(self.problem.metric_names())
        base = list(self.problem.metric_names())
        levels = list(self.problem.level_metric_names())
        names = [f"{m}_change" for m in base] + base + [f"baseline_{m}" for m in base] + levels
        for kind in self.compare:
            p = _prefix(kind)
            names += [f"{p}{m}_change" for m in base] + [f"{p}{m}" for m in base] + [f"{p}{v}" for v in levels]
        return names

    def config(self) -> dict | None:
        """A JSON-safe description that ``from_config`` turns back into this A/B test
        (``None`` when the problem or the policy factory cannot be described)."""
        problem = self.problem.config()
        if problem is None or self.policy_factory is not None:
            return None
        return {"problem": problem, "n_users": self.n_users, "batches": self.batches, "policy": self.policy,
                "compare": list(self.compare)}

    @classmethod
    def from_config(cls, config: Mapping) -> ABTest:
        cfg = dict(config)
        return cls(problem=make_problem(cfg.pop("problem")), **{k: (tuple(v) if k == "compare" else v) for k, v in cfg.items()})

    def batch_sizes(self) -> list[int]:
        base, extra = divmod(self.n_users, self.batches)
        return [base + (1 if i < extra else 0) for i in range(self.batches)]

    # -- the trial
    def evaluate(self, parameters: Mapping, seed: int = 0) -> dict[str, tuple[float, float]]:
        """Run the A/B test of ``parameters`` with random streams from ``seed``; ``{metric: (mean, sem)}``."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        if not isinstance(parameters, Mapping):
            raise TypeError(f"parameters: expected a mapping of parameter name to value, got {type(parameters).__name__}")
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
            records: dict[str, list] = {"units": [], "baseline": [], **{kind: [] for kind in arms}}
            for b, n in enumerate(sizes):
                units = env.draw(n)
                records["units"].append(units)
                records["baseline"].append(env.outcomes(units, units.baseline))
                rows = torch.arange(n)
                for kind, policy in arms.items():
                    a = policy.select(units.features, units.baseline, generator=gens[kind], valid=units.valid)
                    out = env.outcomes(units, a)
                    records[kind].append(out)
                    if b < len(sizes) - 1:
                        reward, constraints = self.problem.feedback(env, units, out)
                        policy.update(units.features[rows, a], reward, constraints, actions=a)
            return self._summarize(env, records, parameters)

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
        """``evaluate`` plus its wall time: ``{"metrics": ..., "sim_seconds": ...}``."""
        start = time.perf_counter()
        metrics = self.evaluate(parameters, seed)
        return {"metrics": metrics, "sim_seconds": time.perf_counter() - start}
