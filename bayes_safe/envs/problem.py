"""Your own problem: one protocol that ``simulate``, the tuning layer and the command line consume.

A problem is a stream of *units* (a user to email, an upload, a patient): each arrives with
candidate action features, the action today's policy (the baseline) would take, and
optionally a mask of allowed actions. The problem gives the outcomes of any actions for those
units, using common random numbers: the randomness of a unit is drawn once, in ``draw``, so
the outcome of action ``a`` for a unit is the same whichever policy asked (this is what makes
an A/B test against the baseline paired, and a simulation reproducible).

Metric 0 is the reward (higher is better); any metric (the reward too) may be guarded by ``Constraint``
declarations, each with its direction and form:

```python
Constraint.relative("unsubscribe", at_most=1.02)   # rate at most 1.02 x the baseline's
Constraint.relative("reliability", at_least=0.99)  # the paper's alpha = 0.01
Constraint.absolute("latency_ms", at_most=250.0)   # a fixed level
```

A minimal problem (the methods marked required), written by a user:

```python
class EmailTiming(Problem):
    name = "email-timing"
    metric_names = ("click", "unsubscribe")
    constraints = (Constraint.relative("unsubscribe", at_most=1.02),)

    def draw(self, n, generator):            # n units: features [n, K, d], baseline [n]
        ...
        return Units(features, baseline, context=noise)

    def outcomes(self, units, actions):      # observed metrics [n, M] (0/1 is fine)
        ...
```

Optional: ``expected(units, actions)`` (the mean outcomes ``[n, M]`` when the simulator knows
them; regret and violations are then reported, otherwise they are reported as unavailable,
never as zero), or its batched form ``expected_all(units)`` (``[n, K, M]``, every candidate at
once: one call per step instead of ``K``); ``replications`` (default 1); ``noise_std`` (per
metric, used by the default models of the command line); ``search_space`` (the default search
space of a tuning study); ``replication_streams`` (below).

``outcomes`` may return the ``[n, M]`` metrics themselves or a richer record of what happened
whose ``metrics`` attribute is that ``[n, M]`` table (the video-upload simulator returns its
``Outcomes``, which also carry the uploaded quality its reports read).

**Replication-separable streams.** By default ``simulate`` hands ``draw`` a ``torch.Generator``
seeded from ``(seed, t)``: the same seed gives the same run, but replication ``r`` of a batch
is not the run of replication ``r`` alone (one generator draws all ``R`` units). A problem that
sets ``replication_streams = True`` receives instead the run's ``bayes_safe.random.ReplicationRNG``
(one named stream per replication) and draws with ``bayes_safe.random.standard_normal((n, ...),
generator, key="env/...")`` (or ``standard_uniform``); then replication ``r`` of a batch equals a
one-replication run seeded with ``replication_seeds(seed, R)[r]``, as for the built-in linear
problems. Name the keys ``"env/..."`` so they never meet a policy's streams.

**Time-varying problems (the step).** A problem whose world drifts needs to know when its
units arrive. ``simulate`` passes the step ``t = 0, 1, ...`` as ``draw(n, generator, step=t)`` to
every problem whose ``draw`` has a parameter named ``step`` (looked up once per run from the
signature; a ``draw`` without one is called as before). Draw the step's randomness *and* keep what
the step's outcomes depend on (its mean table, its parameters) in ``Units.context``, so that
``outcomes`` and ``expected``/``expected_all`` answer for the step the units were drawn at; the
regret and the violations are then judged against that step's means (its optimum, its
constraints), on every path of ``simulate`` (the lean Thompson path included: it reads no means).
The A/B tuner (``bayes_safe.tuning.ABTest``) passes the step the same way: batch ``b`` of a trial
is drawn with ``step=b`` (one round of decisions with one posterior, then one update, as a step of
``simulate``), so a change at step ``T`` is seen from batch ``T`` on, and its probes draw at
``step=0``. Give ``step`` a default (``step: int = 0``) if the problem should also run where no
step is known (the command line's probes call ``draw(n, generator)``), or raise a
``ValueError`` naming ``step`` when it is missing. Return the same table object for steps whose
means do not change (``simulate`` judges a table once per run of identical objects) and a new
tensor when they change; never modify a table returned earlier in place. The built-in drifting
presets (``bayes_safe.envs.drifting``: an abrupt change and a slow rotation of the parameters)
are written this way.

Every built-in problem implements this protocol: the linear bandits of ``bayes_safe.envs``
(``daulton2019``, ``kazerouni2017``, ...; fixed arms, replication-separable streams) and the
video-upload simulator (``bayes_safe.envs.VideoUpload``; contextual, 0/1 success).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["REQUIRED_METHODS", "Constraint", "Problem", "Units", "check_problem", "expected_table", "outcome_metrics"]


@dataclass(frozen=True)
class Constraint:
    """A guardrail on one metric, judged against the baseline's value (relative) or a fixed level.

    Attributes:
        metric: the metric's name (one of the problem's ``metric_names``; the reward too: a
            guardrail on the reward is judged on the reward's own posterior draw).
        bound: the factor of the baseline's value (relative) or the level (absolute).
        at_most: True for a lower-is-better metric (``value <= bound x baseline`` or
            ``value <= bound``); False for higher-is-better (``>=``).
        versus_baseline: True: compared with the baseline action's value of the same unit
            (``bound`` is a factor); False: ``bound`` is a level.
        confidence: None (default): the papers' single-draw test, an action is allowed when one
            joint posterior draw meets the bound (TS-ASC as published). A probability in
            ``(0, 1)``: a chance constraint, an action is allowed when the posterior probability
            that it meets the bound is at least ``confidence`` (relative: the probability that
            its value meets the bound against the baseline's, jointly). How each policy
            evaluates it is in its docstring; ``simulate`` and the tuners count a chance
            constraint against the true mean, like any other.
        declared: None (default): ``bound`` is the business limit the constraint was declared
            with. A number: the declared business limit (a factor or a level, in ``bound``'s
            form) of a constraint whose ``bound`` is a policy's tuned bound around it
            (``bayes_safe.envs.tolerance.policy_constraint``: ``hide <= 0.02`` tuned to a policy
            bound of 0.0232 keeps ``declared=0.02``). The policy enforces ``bound``; every
            counter (``violated``), report and exported limit reads ``declared_bound``, so a
            tuned slack is never reported as the guardrail.

    What each layer does with each form: the user guide, "What a guardrail means".

    TS-ASC's ``alpha`` (Daulton et al. 2019, section 3.1, the instance-level constraint
    ``E[c | x, a] >= (1 - alpha) E[c | x, b]``) is ``Constraint.relative(metric, at_least=1 - alpha)``.

    The baseline's exemption belongs to relative constraints (it cannot break a bound relative
    to itself, the papers' rule); an absolute constraint judges the baseline like any action.
    """

    metric: str
    bound: float
    at_most: bool = False
    versus_baseline: bool = True
    confidence: float | None = None
    declared: float | None = None

    def __post_init__(self):
        if not isinstance(self.metric, str) or not self.metric:
            raise TypeError(f"metric: expected a metric name (str), got {self.metric!r}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, numbers.Real) or not math.isfinite(self.bound):
            raise ValueError(f"bound: expected a finite number for constraint on {self.metric!r}, got {self.bound!r}")
        object.__setattr__(self, "bound", float(self.bound))  # numpy scalars, ints: a Python float
        for flag in ("at_most", "versus_baseline"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag}: expected True or False for constraint on {self.metric!r}, "
                                f"got {getattr(self, flag)!r}")
        if self.versus_baseline and self.bound <= 0:
            raise ValueError(f"bound: a relative constraint on {self.metric!r} needs a factor > 0 of the baseline's "
                             f"value (e.g. at_most=1.02), got {self.bound}")
        if self.at_most and not self.versus_baseline and self.bound < 0:
            raise ValueError(f"bound: a lower-is-better threshold on {self.metric!r} must be >= 0, got {self.bound}")
        q = self.confidence
        if q is not None:
            if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 < float(q) < 1.0:
                raise ValueError(f"confidence: expected None or a probability in (0, 1) (e.g. 0.95) for the "
                                 f"constraint on {self.metric!r}, got {q!r}")
            object.__setattr__(self, "confidence", float(q))
        if self.declared is not None:
            v = self.declared
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"declared: expected None or the finite business limit the constraint on "
                                 f"{self.metric!r} was declared with, got {v!r}")
            v = float(v)
            if self.versus_baseline and v <= 0:
                raise ValueError(f"declared: a relative constraint on {self.metric!r} needs a declared factor > 0, got {v}")
            if self.at_most and not self.versus_baseline and v < 0:
                raise ValueError(f"declared: a lower-is-better threshold on {self.metric!r} must be >= 0, got {v}")
            object.__setattr__(self, "declared", None if v == self.bound else v)

    @classmethod
    def relative(cls, metric: str, *, at_least: float | None = None, at_most: float | None = None,
                 confidence: float | None = None) -> Constraint:
        """``metric >= at_least x baseline`` (higher is better) or ``<= at_most x baseline`` (lower is better);
        with ``confidence``, required with at least that posterior probability."""
        if (at_least is None) == (at_most is None):
            raise ValueError(f"Constraint.relative({metric!r}): give exactly one of at_least= and at_most=")
        return cls(metric, float(at_most if at_most is not None else at_least), at_most is not None, True, confidence)

    @classmethod
    def absolute(cls, metric: str, *, at_least: float | None = None, at_most: float | None = None,
                 confidence: float | None = None) -> Constraint:
        """``metric >= at_least`` or ``metric <= at_most``; with ``confidence``, required with at least
        that posterior probability (``absolute("ae", at_most=0.05, confidence=0.95)``)."""
        if (at_least is None) == (at_most is None):
            raise ValueError(f"Constraint.absolute({metric!r}): give exactly one of at_least= and at_most=")
        return cls(metric, float(at_most if at_most is not None else at_least), at_most is not None, False, confidence)

    @classmethod
    def from_alpha(cls, metric: str, alpha: float) -> Constraint:
        """The paper's form: at most a fraction ``alpha`` in ``[0, 1)`` lost against the baseline."""
        if not 0 <= float(alpha) < 1:
            raise ValueError(f"alpha: expected a value in [0, 1), got {alpha!r}")
        return cls(metric, 1.0 - float(alpha), False, True)

    @classmethod
    def from_dict(cls, data: Mapping) -> Constraint:
        """The inverse of ``to_dict`` (``confidence`` optional: older files have none)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"constraint: expected a mapping with metric, bound, at_most, versus_baseline, got "
                            f"{type(data).__name__}")
        keys = {"metric", "bound", "at_most", "versus_baseline"}
        if not keys <= set(data) or not set(data) <= keys | {"confidence", "declared"}:
            raise ValueError(f"constraint: expected the keys {sorted(keys)} (and optionally 'confidence', 'declared'), "
                             f"got {sorted(data)}")
        return cls(data["metric"], data["bound"], data["at_most"], data["versus_baseline"], data.get("confidence"),
                   data.get("declared"))

    @property
    def chance(self) -> bool:
        """Whether this is a chance constraint (``confidence`` set)."""
        return self.confidence is not None

    @property
    def declared_bound(self) -> float:
        """The business limit the constraint was declared with (``declared``, else ``bound``): a factor
        (relative) or a level (absolute)."""
        return self.bound if self.declared is None else self.declared

    @property
    def tuned(self) -> bool:
        """Whether the policy keeps a bound other than the declared limit (a tuned tolerance)."""
        return self.declared is not None

    def as_declared(self) -> Constraint:
        """The constraint as declared: ``bound`` the declared limit, no policy bound."""
        if self.declared is None:
            return self
        return Constraint(self.metric, self.declared, self.at_most, self.versus_baseline, self.confidence)

    def declared_threshold(self, baseline_value: torch.Tensor) -> torch.Tensor:
        """The declared limit in the metric's units (``threshold`` of ``as_declared()``)."""
        return self.as_declared().threshold(baseline_value)

    def threshold(self, baseline_value: torch.Tensor) -> torch.Tensor:
        """The bound in the metric's units: ``bound x baseline_value`` (relative) or ``bound``."""
        if self.versus_baseline:
            return self.bound * baseline_value
        return torch.full_like(baseline_value, self.bound)

    def satisfied(self, values: torch.Tensor, baseline_value: torch.Tensor) -> torch.Tensor:
        """Which ``values [..., K]`` meet the constraint, given the baseline's ``[...]`` -> bool ``[..., K]``.

        The plain inequality, for every action the baseline included: a relative constraint's
        baseline meets it whenever its value is >= 0 (callers that exempt the baseline say so)."""
        limit = self.threshold(baseline_value)[..., None]
        return values <= limit if self.at_most else values >= limit

    def violated(self, values: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
        """Which actions break the constraint in expectation, the rule every counter uses
        (``simulate``'s violations, the A/B tuner's violation rates) -> bool ``[n, K]``.

        Args:
            values: the true means of the guarded metric for every candidate, ``[n, K]``.
            baseline: the baseline action of each unit, ``[n]`` (long).

        The baseline's own plays count like any other under an absolute constraint; under a
        relative one the baseline action never breaks a bound relative to its own value (the
        papers' rule; without it a negative baseline value would break ``value >= 0.9 x value``).
        A chance constraint is counted against the true mean like any other, and a constraint
        with a tuned policy bound against its declared limit (``declared_bound``).
        """
        rows = torch.arange(values.shape[0], device=values.device)
        broken = ~self.as_declared().satisfied(values, values[rows, baseline])
        if self.versus_baseline:
            broken[rows, baseline] = broken.new_zeros(())  # a device scalar (no copy from the host)
        return broken

    def margin(self, values: torch.Tensor, baseline_value: torch.Tensor) -> torch.Tensor:
        """How far ``values [..., K]`` are inside the bound (>= 0: met), in the metric's units ``[..., K]``:
        ``limit - value`` for ``at_most``, ``value - limit`` for ``at_least``."""
        limit = self.threshold(baseline_value)[..., None]
        return limit - values if self.at_most else values - limit

    def describe(self) -> str:
        """``"unsubscribe <= 1.02 x baseline"``, ``"ae <= 0.05 with P >= 0.95"`` and the like, for reports;
        a tuned constraint names both: ``"hide <= 0.02 (policy bound 0.0232)"``."""
        op = "<=" if self.at_most else ">="
        limit = self.declared_bound
        text = (f"{self.metric} {op} {limit:g} x baseline" if self.versus_baseline
                else f"{self.metric} {op} {limit:g}")
        if self.declared is not None:
            text += f" (policy bound {self.bound:g})"
        return text if self.confidence is None else f"{text} with P >= {self.confidence:g}"

    def to_dict(self) -> dict:
        out = {"metric": self.metric, "bound": self.bound, "at_most": self.at_most, "versus_baseline": self.versus_baseline}
        if self.confidence is not None:
            out["confidence"] = self.confidence
        if self.declared is not None:
            out["declared"] = self.declared
        return out


@dataclass
class Units:
    """A batch of ``n`` units as a problem draws them.

    Attributes:
        features: candidate action features ``[n, K, d]``.
        baseline: the baseline policy's action per unit ``[n]`` (long).
        valid: optional mask ``[n, K]`` (bool) of the allowed actions (None: all).
        context: anything the problem needs later to give outcomes (its pre-drawn noise,
            the units' covariates, ...); never read by the library.
    """

    features: torch.Tensor
    baseline: torch.Tensor
    valid: torch.Tensor | None = None
    context: Any = None

    def __len__(self) -> int:
        return int(self.features.shape[0])


#: the methods a problem must define (``check_problem`` lists the missing ones)
REQUIRED_METHODS = ("draw", "outcomes")


class Problem:
    """Base class of a user's problem: subclass it and define ``draw`` and ``outcomes``.

    Class attributes:
        name: a short name for reports and file names.
        metric_names: the metrics ``outcomes`` returns, reward first.
        constraints: one ``Constraint`` per guarded metric (metrics after the reward).
        replications: independent copies ``simulate`` runs in lockstep (default 1).
        noise_std: per-metric noise scale for the default Bayesian linear models (default 1.0
            for each metric; 0/1 metrics: 0.5 is the largest standard deviation they can have).
        search_space: the default search space of a tuning study (dicts of ``name``, ``low``,
            ``high``); by default one tolerance per constraint.

    Methods to define:
        draw(n, generator) -> Units: ``n`` new units. Draw all the randomness of their
            outcomes here (common random numbers), from ``generator`` (a ``torch.Generator``).
            A time-varying problem declares ``draw(n, generator, step=0)`` and receives the step
            (module docstring, "Time-varying problems").
        outcomes(units, actions) -> ``[n, M]``: the observed metrics of ``actions [n]``
            (deterministic given the units).
        expected(units, actions) -> ``[n, M]`` or ``None``: optional, the mean outcomes.
        expected_all(units) -> ``[n, K, M]`` or ``None``: optional, the mean outcomes of every
            candidate (by default ``expected`` once per action).

    Class attribute ``replication_streams`` (default False): True to receive the run's
    ``ReplicationRNG`` in ``draw`` (replication-separable runs; module docstring).
    """

    name: str = "custom"
    metric_names: Sequence[str] = ("reward",)
    constraints: Sequence[Constraint] = ()
    replications: int = 1
    noise_std: Sequence[float] | None = None
    search_space: tuple = ()
    replication_streams: bool = False
    fallback: str = "safest"

    def draw(self, n: int, generator: torch.Generator) -> Units:  # pragma: no cover - the user's
        raise NotImplementedError

    def outcomes(self, units: Units, actions: torch.Tensor) -> torch.Tensor:  # pragma: no cover - the user's
        raise NotImplementedError

    def models(self, replications: int | None) -> Sequence | None:
        """The problem's own posterior models, one per metric (reward first), or None (the default:
        the entry points build ridge models from ``noise_std``). See the class docstring.

        A tuning study passes a trial's ``forgetting`` to a hook declared
        ``models(self, replications, forgetting=None)`` (None, a factor in (0, 1) or ``"adaptive"``,
        for ``BayesianLinear(..., forgetting=...)``), or every parameter of the trial to one declared
        ``models(self, replications, parameters=None)``; ``simulate`` calls ``models(replications)``."""
        return None

    def expected(self, units: Units, actions: torch.Tensor) -> torch.Tensor | None:
        """Mean outcomes ``[n, M]`` of ``actions`` when the simulator knows them; ``None`` otherwise."""
        return None

    def expected_all(self, units: Units) -> torch.Tensor | None:
        """Mean outcomes ``[n, K, M]`` of every candidate action; ``None`` when unknown.

        The default asks ``expected`` once per action; override it when one call is cheaper.
        """
        return _expected_by_action(self, units)


def _expected_by_action(problem, units) -> torch.Tensor | None:
    n, K = int(units.features.shape[0]), int(units.features.shape[1])
    device = units.features.device
    expected = getattr(problem, "expected", None)
    if not callable(expected):
        return None
    per_action = []
    for k in range(K):
        m = expected(units, torch.full((n,), k, dtype=torch.long, device=device))
        if m is None:
            return None
        per_action.append(torch.as_tensor(m, device=m.device if isinstance(m, torch.Tensor) else device).clone())  # copied now: the user may fill one buffer per call
    return torch.stack(per_action, 1)


def problem_device(problem):
    """The device a problem says its tensors live on: its ``device`` attribute, else its ``arm_features``'
    device (the linear bandits); None when it names none (as given: a ``torch.device`` or a name)."""
    device = getattr(problem, "device", None)
    if device is None and isinstance(getattr(problem, "arm_features", None), torch.Tensor):
        device = problem.arm_features.device
    return device


def chosen_rows(table: torch.Tensor, rows: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``table[rows, actions]``: the chosen candidates' rows ``[R, ...]`` of a ``[R, K, ...]`` table
    (features, means), by advanced indexing for small R and a flat ``index_select`` for large R
    (measured at R = 10,000, K = 100, d = 4: 0.3 ms instead of 0.9 ms; the same numbers)."""
    R, K = table.shape[0], table.shape[1]
    if R < 64 or not table.is_contiguous():
        return table[rows, actions]
    return table.view(R * K, *table.shape[2:]).index_select(0, torch.add(actions, rows, alpha=K))


def expected_table(problem, units) -> torch.Tensor | None:
    """``problem``'s mean outcomes of every candidate ``[n, K, M]`` (``expected_all`` when it
    defines one, else ``expected`` per action), or ``None`` when the simulator does not know them."""
    table = getattr(problem, "expected_all", None)
    if callable(table):
        return table(units)
    return _expected_by_action(problem, units)


def outcome_metrics(outcomes):
    """The ``[n, M]`` metrics of what ``outcomes`` returned: the table itself, or its ``metrics``."""
    metrics = getattr(outcomes, "metrics", None)
    return outcomes if metrics is None or callable(metrics) else metrics


def _defines(obj, method: str) -> bool:
    fn = getattr(obj, method, None)
    if not callable(fn):
        return False
    base = getattr(Problem, method, None)
    return getattr(fn, "__func__", fn) is not base


def check_problem(problem, what: str = "problem") -> None:
    """Raise ``TypeError`` naming every missing piece of the ``Problem`` protocol, and
    ``ValueError`` for inconsistent declarations (constraints on unknown metrics, an unknown fallback)."""
    missing = [m for m in REQUIRED_METHODS if not _defines(problem, m)]
    names = getattr(problem, "metric_names", None)
    if (names is None or isinstance(names, str) or not isinstance(names, Sequence) or len(names) < 1
            or not all(isinstance(n, str) for n in names)):
        missing.append("metric_names (a tuple of metric names, reward first)")
    if missing:
        raise TypeError(f"{what}: {type(problem).__name__} does not implement the Problem protocol "
                        f"(bayes_safe.envs.Problem); missing: {', '.join(missing)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}.metric_names: expected distinct names, got {list(names)}")
    constraints = tuple(getattr(problem, "constraints", ()) or ())
    for c in constraints:
        if not isinstance(c, Constraint):
            raise TypeError(f"{what}.constraints: expected Constraint declarations, got {type(c).__name__}")
        if c.metric not in names:
            raise ValueError(f"{what}.constraints: {c.metric!r} is not one of the metrics {list(names)}")
    fallback = getattr(problem, "fallback", "safest")
    if fallback not in ("safest", "baseline"):
        raise ValueError(f"{what}.fallback: expected 'safest' or 'baseline', got {fallback!r}")
    reps = getattr(problem, "replications", 1)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"{what}.replications: expected a positive int, got {reps!r}")
