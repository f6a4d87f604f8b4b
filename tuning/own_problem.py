"""Tuning your own problem: ``SimulatedProblem`` runs any ``bayes_safe.envs.Problem`` as A/B tests.

``ABTest(problem)`` and ``Study(ABTest(problem))`` wrap a ``Problem`` (``draw`` / ``outcomes`` /
``Constraint`` declarations) in ``SimulatedProblem``, the ``ABProblem`` the engine runs:

* the environment of a trial draws its units with ``problem.draw(n, generator)``, the
  generator seeded from the trial's seed (so a trial is a pure function of its parameters and
  seed), and gives ``problem.outcomes`` (converted to float64 ``[n, M]``, NaN an error naming
  the metric). A time-varying problem (``draw`` has a parameter named ``step``, the Problem
  protocol's note) is drawn with ``step=b`` for batch ``b`` of the A/B test (``ABTest``), the
  step numbering of ``simulate``, and its probes (the feature width, whether it knows its means)
  with ``step=0``;
* the arms are TS-ASC (``"ts-asc"``, tuned) and vanilla Thompson sampling (``"ts"``, compared).
  Their posteriors are **the problem's own** when it declares them (``Problem.models``, read by
  ``bayes_safe.factory.problem_models(problem, None)``: one model per metric, reward first,
  ``batch_shape=()``, i.e. one posterior shared by the units of a batch); only a problem that
  declares none gets the **ridge default**: conjugate Bayesian ridge models
  (``BayesianLinear``, prior ``N(0, sigma^2 / ridge I)``, known noise ``sigma``), ``sigma`` from
  ``problem.noise_std[m]`` when declared, else 1.0 (the protocol's default; declare 0.5 for a
  0/1 metric, the largest standard deviation it can have). ``describe`` and the report say
  which ran (``bayes_safe.factory.describe_model``). TS learns the reward model; TS-ASC the
  reward model and one model per guarded metric other than the reward;
* TS-ASC (Daulton et al. 2019, Algorithm 1, with the constraint forms of
  ``bayes_safe.envs.Constraint``) is built with every declared constraint, matched to its model
  by metric name (``TSASC(..., metric_names=...)``): a guardrail on the reward is judged on the
  reward's own draw, a chance constraint keeps its ``confidence``; the problem's ``fallback``
  (``"safest"`` or ``"baseline"``) says what it plays when no action is allowed;
* each constraint's bound in the policy is set by one tuned parameter, ``tolerance_<metric>``:
  the slack around the declared limit in every form (``bayes_safe.envs.tolerance``): for a
  relative constraint ``metric <= (c + t) x baseline`` (``at_most``) or ``metric >= (c - t) x
  baseline`` (``at_least``), for an absolute one ``metric <= level + t`` or ``metric >= level - t``
  (``t = 0``: the declared limit). The declared
  bound itself is the study's outcome constraint, on what the A/B test measures:
  ``relative(m, at_most=1.02)`` -> ``m_change <= 2`` (% vs the baseline),
  ``relative(m, at_least=0.99)`` -> ``m_change >= -1``, ``absolute(m, at_most=v)`` -> ``m <= v``
  (the arm's mean level). A guardrail on the reward is the exception: its level would constrain
  the objective's own metric, which Ax refuses in a single-objective study (and maximising the
  reward already pushes it up); its per-unit violation rate is reported and can be bounded;
* **per-unit violations**: when the problem knows its means (``expected`` / ``expected_all``,
  read by ``bayes_safe.envs.problem.expected_table``), each arm's share of units whose played
  action breaks a declared constraint in expectation is reported, in % of units, as
  ``<metric>_violations`` (tuned arm), ``baseline_<metric>_violations`` (the baseline's own plays)
  and ``ts_<metric>_violations``: the definition ``simulate`` counts (``Constraint.violated``
  of the true means: the baseline's plays count under an absolute constraint and never under a
  relative one; a chance constraint counted against the true mean). ``max_violations={"m": 0.01}``
  adds the outcome constraint ``m_violations <= 1`` (at most 1 % of units), beside the level;
* the objective is ``<reward>_change``, maximised; every metric ``m`` is reported as ``m_change``
  (% change against the baseline, paired delta-method SE), ``m`` and ``baseline_m``.

* ``forgetting`` (issue 30): a study may tune the models' forgetting factor too
  (``--parameter forgetting=0.95:1``): the default models (conjugate ridge) are built with
  ``BayesianLinear(..., forgetting=value)``, the stabilised rule (1: no forgetting). Or a choice
  of settings (``--parameter forgetting=none,0.99,adaptive``, a ``Choice``): ``"none"``, a factor
  written as a string, or ``"adaptive"`` (restart from the prior when a change is detected,
  ``bayes_safe.models.change_detection``). A problem whose ``models`` hook builds its own models
  gets the trial's setting through the hook: ``models(self, replications, forgetting=None)``
  receives ``forgetting`` (None for no forgetting, a factor in (0, 1), or ``"adaptive"``: what
  ``BayesianLinear(..., forgetting=...)`` takes; not passed when the trial does not set it, so
  the hook's default applies), and ``models(self, replications, parameters=None)`` receives every
  parameter of the trial (``forgetting`` already converted so). A hook that takes neither cannot
  be told the factor, and the parameter is refused with that reason and the signature to write.

The default search space is ``problem.search_space`` (dicts or ``Range`` of ``tolerance_*`` names)
or, when empty, one range per constraint: relative ``[0, 2 |bound - 1|]`` (at least 0.02 wide;
capped at 0.9 for ``at_least``), absolute ``[-s, s]`` with ``s = |level| / 4`` (0.1 for a level 0).
With ``max_violations`` a pilot sizes those ranges before the study (``pilot_ranges``): the strict
end of a limited tolerance is extended until the pilot's violation rate there meets the limit,
so that a per-unit limit a stricter setting meets can be reached (issue 39).

A constraint's ``confidence`` is a parameter too, ``confidence_<metric>`` (a range in (0, 1) or a
choice of probabilities and ``"none"``): the policy keeps the constraint as a chance constraint
with that confidence (``policy_constraints``). The study's outcome constraint is always the
declared limit (``outcome_constraint`` reads ``Constraint.declared_bound``).

A study of a problem class importable by ``module:Class`` (not ``__main__``, not defined inside
a function) stores that path and the constructor's parameters (read back from the instance's
attributes of the same names, as a dataclass keeps them; or given as ``params=``), so
``bayes-safe tune resume`` rebuilds it, and with it the problem's own models;
``load_problem_class`` is how it (and ``--problem``) imports one. A stored name runs code, so it
is imported only with the user's consent (``tune resume --trust-source`` or the same
``--problem`` again; ``Study.load(..., trust_source=True)``; see ``bayes_safe._problem_import``).
Otherwise the study is resumed in Python (``Study.load(..., ab_test=...)``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import sys
from collections.abc import Mapping

import torch

from bayes_safe.envs.ab_problem import ABProblem
from bayes_safe.envs.problem import (
    Constraint,
    Units,
    check_problem,
    expected_table,
    outcome_metrics,
)
from bayes_safe.envs.tolerance import (
    _numbered,
    confidence_name,
    default_range,
    parse_confidence,
    policy_constraint,
    strictest_tolerance,
    tolerance_name,
)
from bayes_safe.simulation import _draw_takes_step

__all__ = ["SimulatedProblem", "import_problem", "load_problem_class", "outcome_constraint", "tolerance_name",
           "violation_name"]

#: the arms a trial of a custom problem can run
ARMS = ("ts-asc", "ts")
#: pilot runs that may extend a tolerance range toward stricter bounds (``SimulatedProblem.pilot_ranges``)
PILOT_STEPS = 4


# ---------------------------------------------------------------------- importing a problem class
def load_problem_class(path: str, what: str = "--problem"):
    """The class named by ``path`` (``"pkg.module:Class"``), checked against the ``Problem`` protocol
    (``bayes_safe._cli_args.load_problem_class``: one-line errors naming ``what``)."""
    from bayes_safe._problem_import import load_problem_class as load

    return load(path, what)


def import_problem(path: str, params: Mapping | None = None, what: str = "--problem", *, stored: bool = False):
    """``Class(**params)`` from ``"module:Class"`` (``bayes_safe._problem_import.load_problem``;
    ``stored=True`` for a name read from a study, imported only after
    ``bayes_safe._problem_import.check_import_consent``)."""
    from bayes_safe._problem_import import load_problem

    return load_problem(path, params, what, stored=stored)


def _json_safe(value) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


def _import_path_of(problem) -> str | None:
    cls = type(problem)
    if cls.__module__ in ("__main__", "builtins") or "<locals>" in cls.__qualname__:
        return None
    obj = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    if obj is not cls:  # not importable by its name (a class made in a notebook cell, an exec'd namespace)
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def _constructor_params(problem) -> dict | None:
    """The constructor arguments of ``problem`` read back from its attributes (a dataclass, or
    a class that stores each argument under its own name); None when some cannot be found."""
    try:
        sig = inspect.signature(type(problem))
    except (TypeError, ValueError):
        return None
    out = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if hasattr(problem, name):
            value = getattr(problem, name)
            if isinstance(value, tuple):
                value = list(value)
            if not _json_safe(value):
                return None
            if p.default is not p.empty and _json_safe(p.default) and value == p.default:
                continue
            out[name] = value
        elif p.default is p.empty:
            return None
    return out


# ---------------------------------------------------------------------- constraints
def violation_name(constraint: Constraint) -> str:
    """``<metric>_violations``: the A/B test's per-unit violation rate (% of units) of ``constraint``."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in constraint.metric) + "_violations"


def outcome_constraint(constraint: Constraint) -> str:
    """The study's outcome constraint (an Ax expression on the A/B test's metrics) for a declaration:
    always its declared limit (``Constraint.declared_bound``), never a tuned policy bound."""
    constraint = constraint.as_declared()
    op = "<=" if constraint.at_most else ">="
    if constraint.versus_baseline:
        return f"{constraint.metric}_change {op} {100 * (constraint.bound - 1):.10g}"
    return f"{constraint.metric} {op} {constraint.bound:.10g}"


def _forgetting_setting(value) -> float | str | None:
    """A trial's ``forgetting`` -> the models' setting: a number in (0, 1] or its string (a choice's
    value), ``"adaptive"``, or ``"none"`` / None (no forgetting). Bad values name the parameter."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, str) and value.strip().lower() == "adaptive":
        return "adaptive"
    try:
        factor = float(value)
    except (TypeError, ValueError):
        factor = math.nan
    if isinstance(value, bool) or not 0 < factor <= 1:
        raise ValueError(f"parameters: 'forgetting' expected a number in (0, 1] (the weight an observation keeps "
                         f"per update), 'adaptive' or 'none', got {value!r}")
    return None if factor == 1 else factor


# ---------------------------------------------------------------------- a models hook and the trial's settings
#: the arguments a problem's ``models`` hook may declare (beside ``replications``) to receive a trial's settings
HOOK_ARGUMENTS = ("forgetting", "parameters")


def _hook_arguments(problem) -> dict[str, bool]:
    """Which of ``HOOK_ARGUMENTS`` ``problem.models`` declares (a parameter of that name,
    positional-or-keyword or keyword-only, as ``simulate`` detects ``draw``'s ``step``):
    ``{name: required}`` (required: it has no default)."""
    hook = getattr(problem, "models", None)
    if not callable(hook):
        return {}
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return {}
    out = {}
    for name in HOOK_ARGUMENTS:
        p = signature.parameters.get(name)
        if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out[name] = p.default is p.empty
    return out


def _hook_kwargs(takes: Mapping, parameters: Mapping) -> dict:
    """The keyword arguments the hook receives for a trial's ``parameters``: ``forgetting`` (its
    models' setting, ``_forgetting_setting``) when the trial sets it or the hook requires it (None:
    no forgetting), ``parameters`` (every parameter, ``forgetting`` converted) always."""
    settings = dict(parameters)
    if "forgetting" in settings:
        settings["forgetting"] = _forgetting_setting(settings["forgetting"])
    kwargs = {}
    if "forgetting" in takes and ("forgetting" in settings or takes["forgetting"]):
        kwargs["forgetting"] = settings.get("forgetting")
    if "parameters" in takes:
        kwargs["parameters"] = settings
    return kwargs


class _HookCall:
    """The problem as ``problem_models`` reads it, its ``models`` hook called with a trial's settings
    (made a subclass named like the problem's class, so that the checks' messages name it)."""

    def __init__(self, problem, kwargs: Mapping):
        self.metric_names = problem.metric_names
        self._hook, self._kwargs = problem.models, dict(kwargs)

    def models(self, replications):
        return self._hook(replications, **self._kwargs)


def _own_models(problem, parameters: Mapping) -> list | None:
    """``problem_models(problem, None)`` (the A/B tuner's arms: ``batch_shape=()``), the hook given
    the trial's settings when it declares ``forgetting`` / ``parameters``."""
    from bayes_safe.factory import problem_models

    kwargs = _hook_kwargs(_hook_arguments(problem), parameters)
    if not kwargs:
        return problem_models(problem, None)
    return problem_models(type(type(problem).__name__, (_HookCall,), {})(problem, kwargs), None)


def _draw_probe(problem) -> Units:
    """One probe unit from its own generator (step 0 for a time-varying problem)."""
    generator = torch.Generator().manual_seed(0)
    return problem.draw(1, generator, step=0) if _draw_takes_step(problem) else problem.draw(1, generator)


# ---------------------------------------------------------------------- the environment of one trial
@dataclasses.dataclass
class _Batch:
    """The units of a batch as the engine and the policies read them (float64 features, long
    baseline, bool mask), with the problem's own ``Units`` for its ``outcomes``."""

    features: torch.Tensor
    baseline: torch.Tensor
    valid: torch.Tensor | None
    units: Units
    #: the problem's mean table ``[n, K, M]`` (``expected_table``), computed once for every arm
    means: torch.Tensor | None = None
    judged: bool = False

    def __len__(self) -> int:
        return int(self.features.shape[0])


class _Env:
    """The user's problem with every draw and outcome checked (a ``Problem`` itself: ``draw(n, generator)``)."""

    def __init__(self, problem, seed: int):
        self.problem = problem
        self.generator = torch.Generator().manual_seed(int(seed))
        self.draws = 0
        self.timed = _draw_takes_step(problem)

    def draw(self, n: int, generator: torch.Generator | None = None, step: int | None = None) -> _Batch:
        """``n`` units; ``step`` (the A/B test's batch index) is passed on to a problem whose ``draw``
        takes one (when None, such a problem is called without it: its own default applies)."""
        generator = self.generator if generator is None else generator
        if self.timed and step is not None:
            units = self.problem.draw(int(n), generator, step=int(step))
        else:
            units = self.problem.draw(int(n), generator)
        self.draws += 1
        return _as_batch(self.problem, units, int(n), f"draw (batch {self.draws})")

    def outcomes(self, batch: _Batch, actions: torch.Tensor) -> torch.Tensor:
        out = self.problem.outcomes(batch.units, actions)
        return _check_outcomes(self.problem, out, len(batch), f"outcomes (batch {self.draws})")


def _as_batch(problem, units, n: int, where: str) -> _Batch:
    name = type(problem).__name__
    if not all(hasattr(units, a) for a in ("features", "baseline")):
        raise TypeError(f"{name}.{where}: expected bayes_safe.envs.Units (features, baseline, valid, context), "
                        f"got {type(units).__name__}")
    features = torch.as_tensor(units.features)
    if features.dim() != 3 or features.shape[0] != n:
        raise ValueError(f"{name}.{where}: expected features [n={n}, K, d], got shape {tuple(features.shape)}")
    if not (features.is_floating_point() or features.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{name}.{where}: expected real features, got {features.dtype}")
    features = features.double()
    if not torch.isfinite(features).all():
        raise ValueError(f"{name}.{where}: features contain NaN or inf")
    baseline = torch.as_tensor(units.baseline)
    if baseline.shape != (n,) or baseline.is_floating_point():
        raise ValueError(f"{name}.{where}: expected baseline actions [n={n}] (integers), got "
                         f"{baseline.dtype} of shape {tuple(baseline.shape)}")
    baseline = baseline.long()
    K = features.shape[1]
    if n and (int(baseline.min()) < 0 or int(baseline.max()) >= K):
        raise ValueError(f"{name}.{where}: baseline actions must lie in [0, {K - 1}]")
    valid = getattr(units, "valid", None)
    if valid is not None:
        valid = torch.as_tensor(valid).bool()
        if valid.shape != (n, K):
            raise ValueError(f"{name}.{where}: expected valid [n={n}, K={K}], got shape {tuple(valid.shape)}")
    return _Batch(features, baseline, valid, units)


def _check_outcomes(problem, out, n: int, where: str) -> torch.Tensor:
    name = type(problem).__name__
    names = list(problem.metric_names)
    out = torch.as_tensor(outcome_metrics(out))
    if out.dim() == 1 and len(names) == 1:
        out = out[:, None]
    if out.shape != (n, len(names)):
        raise ValueError(f"{name}.{where}: expected outcomes [n={n}, M={len(names)}] ({', '.join(names)}), "
                         f"got shape {tuple(out.shape)}")
    out = out.double()
    bad = ~torch.isfinite(out)
    if bad.any():
        metric = names[int(bad.any(0).nonzero()[0])]
        raise ValueError(f"{name}.{where}: metric {metric!r} has NaN or inf outcomes")
    return out


# ---------------------------------------------------------------------- the ABProblem
def _check_max_violations(value, names: list[str], declared, problem_name: str) -> dict[str, float]:
    """``{violation metric: largest share}`` from ``max_violations`` (keys: a guarded metric, which
    bounds every constraint on it, or a violation metric's own name; values: shares in [0, 1])."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"max_violations: expected a mapping of metric to share of units, e.g. {{'adverse_event': 0.01}}, "
                        f"got {type(value).__name__}")
    by_metric: dict[str, list[str]] = {}
    for c, name in zip(declared, names):
        by_metric.setdefault(c.metric, []).append(name)
    out: dict[str, float] = {}
    for key, share in value.items():
        if key in by_metric:
            targets = by_metric[key]
        elif key in names:
            targets = [key]
        else:
            raise ValueError(f"max_violations: {key!r} is not a guarded metric of problem {problem_name!r}; expected one "
                             f"of {sorted(by_metric) or 'none (it declares no constraints)'}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or not 0 <= share <= 1:
            raise ValueError(f"max_violations: {key!r} expects a share of units in [0, 1] (0.01 for 1 %), got {share!r}")
        for t in targets:
            out[t] = float(share)
    return out


class SimulatedProblem(ABProblem):
    """A user's ``Problem`` as an ``ABProblem``: TS-ASC tuned against its baseline (module docstring).

    Args:
        problem: an instance of a ``bayes_safe.envs.Problem`` (``draw``, ``outcomes``,
            ``metric_names``, ``constraints``; optionally ``models``, ``fallback``,
            ``expected`` / ``expected_all``).
        ridge: the ridge penalty of the default Bayesian linear models (prior
            ``N(0, sigma^2 / ridge I)``); not used when the problem declares its own models.
        import_path, params: the ``"module:Class"`` and constructor arguments that rebuild the
            problem when a stored study is resumed (found from the instance by default: its
            class's import path and the constructor arguments read from its attributes).
        max_violations: ``{metric: share}``, e.g. ``{"adverse_event": 0.01}``: an outcome
            constraint on the per-unit violation rate of every constraint on ``metric``
            (``adverse_event_violations <= 1``, in % of units), beside the declared level. Needs
            a problem that knows its means. A violation metric's own name
            (``"adverse_event_violations_2"``) picks one of several constraints on a metric.
    """

    policies = ARMS
    compare = ("ts",)
    trial_noun = "A/B test"
    observed_label = "A/B test mean"
    trial_work = "simulation"

    def __init__(self, problem, *, ridge: float = 1.0, import_path: str | None = None, params: Mapping | None = None,
                 max_violations: Mapping | None = None):
        from bayes_safe.factory import describe_model

        if isinstance(problem, ABProblem):
            raise TypeError("problem: already an ABProblem; pass it to ABTest directly")
        check_problem(problem, "problem")
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not math.isfinite(ridge) or ridge <= 0:
            raise ValueError(f"ridge: expected a number > 0, got {ridge!r}")
        self.problem = problem
        self.ridge = float(ridge)
        self.name = str(getattr(problem, "name", None) or type(problem).__name__)
        self.import_path = import_path if import_path is not None else _import_path_of(problem)
        self.params = dict(params) if params is not None else (
            _constructor_params(problem) if self.import_path is not None else None)
        self.declared = tuple(getattr(problem, "constraints", ()) or ())
        self.fallback = getattr(problem, "fallback", "safest")
        names = list(problem.metric_names)
        guarded = {c.metric for c in self.declared}
        #: the metrics TS-ASC learns besides the reward: every guarded one (a reward guardrail uses the reward's model)
        self.model_columns = [j for j, m in enumerate(names) if j > 0 and m in guarded]
        if self.declared and not self.model_columns:
            self.model_columns = list(range(1, len(names)))  # only the reward guarded: the others learned, unguarded
        self.noise = self._noise(names)
        # the problem's own models, checked now (a bad hook fails here, not in a worker): None -> the ridge default
        own = _own_models(problem, {})
        self.own_models = own is not None
        #: the trial settings the problem's own models hook takes (``forgetting``, ``parameters``)
        self.hook_takes = _hook_arguments(problem) if self.own_models else {}
        self._model_names = [describe_model(m) for m in own] if own is not None else None
        self.violation_names = tuple(_numbered([violation_name(c) for c in self.declared]))
        clash = [v for v in self.violation_names if v in names or f"baseline_{v}" in names]
        if clash:
            raise ValueError(f"problem.metric_names: {clash[0]!r} is the name of the violation rate the A/B test reports; "
                             "rename the metric")
        self.max_violations = _check_max_violations(max_violations, list(self.violation_names), self.declared, self.name)
        self._knows_means = None
        own_space = tuple(getattr(problem, "search_space", ()) or ())
        self.parameters = own_space or tuple(
            {**default_range(c), "name": n} for c, n in zip(self.declared, self.tolerance_names()))
        self.objective = f"{names[0]}_change"
        # a guardrail on the reward is the objective's own metric: Ax refuses an outcome constraint on the
        # objective (single-objective studies), so its average level is not one; its per-unit violation rate is
        # reported and max_violations can bound it
        self.outcome_constraints = tuple(outcome_constraint(c) for c in self.declared if c.metric != names[0])
        if self.max_violations:
            if not self.knows_means():
                raise ValueError(f"max_violations: problem {self.name!r} gives no expected means (define expected or "
                                 "expected_all), so per-unit violations cannot be counted")
            self.outcome_constraints += tuple(f"{v} <= {100 * share:.10g}" for v, share in self.max_violations.items())
        ranges = [p["name"] if isinstance(p, Mapping) else getattr(p, "name", None) for p in self.parameters]
        self.surface = tuple(ranges[:2]) if len(ranges) >= 2 else None
        self._dim = None

    def _noise(self, names) -> list[float]:
        declared = getattr(self.problem, "noise_std", None)
        if declared is None:
            return [1.0] * len(names)
        values = [float(v) for v in declared]
        if len(values) != len(names) or not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"problem.noise_std: expected {len(names)} numbers > 0 (one per metric), got {declared!r}")
        return values

    # -- metadata
    def metric_names(self) -> tuple[str, ...]:
        return tuple(self.problem.metric_names)

    def tolerance_names(self) -> list[str]:
        """``tolerance_<metric>`` per declared constraint (``_2``, ... for a second constraint on one metric)."""
        return _numbered([tolerance_name(c) for c in self.declared])

    def confidence_names(self) -> list[str]:
        """``confidence_<metric>`` per declared constraint: the policy's confidence of the constraint,
        tunable like its tolerance (a range in (0, 1), or a choice of probabilities and ``"none"``)."""
        return _numbered([confidence_name(c) for c in self.declared])

    def known_parameters(self) -> tuple[str, ...]:
        # the forgetting factor is tunable for the default models and for a models hook that takes it
        forgets = not self.own_models or bool(self.hook_takes)
        return (*self.tolerance_names(), *self.confidence_names(), *(("forgetting",) if forgets else ()))

    def _check_names(self, names, what: str) -> None:
        known = self.known_parameters()
        unknown = [n for n in names if n not in known]
        if "forgetting" in unknown:
            hook = self.problem.models
            try:
                signature = str(inspect.signature(hook))
            except (TypeError, ValueError):
                signature = "(replications)"
            cls = type(self.problem).__name__
            raise ValueError(
                f"{what}: unknown parameter name(s) {unknown} for problem {self.name!r}; it reads "
                f"{', '.join(known) or 'no parameter'}. 'forgetting' is refused because {cls}.models{signature} builds the "
                "problem's own models and takes neither a `forgetting` nor a `parameters` argument, so a trial's "
                f"forgetting setting cannot reach them. To tune it, write the hook as `def models(self, replications, "
                "forgetting=None)` and build each model with `BayesianLinear(..., forgetting=forgetting)` (None: no "
                "forgetting; a factor in (0, 1); 'adaptive'), or as `def models(self, replications, parameters=None)` "
                "to receive every parameter of the trial")
        super()._check_names(names, what)

    def check_parameter_values(self, parameters: Mapping) -> None:
        confidences = set(self.confidence_names())
        if isinstance(parameters, Mapping) and any(k in confidences and isinstance(v, str) for k, v in parameters.items()):
            for k, v in parameters.items():
                if k in confidences:
                    parse_confidence(v, k)  # a choice's value ("0.95", "none"): checked here, not as a number
            self._check_names([k for k in parameters if k in confidences], "parameters")
            parameters = {k: v for k, v in parameters.items() if not (k in confidences and isinstance(v, str))}
        if isinstance(parameters, Mapping) and isinstance(parameters.get("forgetting"), str):
            _forgetting_setting(parameters["forgetting"])  # a choice's value: checked here, not as a number
            parameters = {k: v for k, v in parameters.items() if k != "forgetting"}
            self._check_names(["forgetting"], "parameters")
        super().check_parameter_values(parameters)
        if "forgetting" in parameters:
            _forgetting_setting(parameters["forgetting"])

    def check_parameters(self, ranges) -> None:
        super().check_parameters(ranges)
        for r in ranges:
            if r.name == "forgetting" and not 0 < r.low < r.high <= 1:
                raise ValueError(f"parameter 'forgetting': expected bounds within (0, 1] (1: no forgetting), got "
                                 f"[{r.low}, {r.high}]")
            if r.name in self.confidence_names() and not 0 < r.low < r.high < 1:
                raise ValueError(f"parameter {r.name!r}: expected bounds within (0, 1) (the posterior probability the "
                                 f"policy requires of the constraint), got [{r.low}, {r.high}]")

    def knows_means(self) -> bool:
        """Whether the problem gives its mean outcomes (``expected`` / ``expected_all``), asked once
        on a probe unit: then the A/B test reports per-unit violation rates."""
        if self._knows_means is None:
            probe = _draw_probe(self.problem)
            self._knows_means = bool(self.declared) and expected_table(self.problem, probe) is not None
        return self._knows_means

    def violation_metric_names(self) -> tuple[str, ...]:
        """The per-unit violation rates an A/B test reports (``ABTest`` adds ``baseline_`` and the
        compared arms' prefixes): one per declared constraint when the problem knows its means."""
        return self.violation_names if self.knows_means() else ()

    def config(self) -> dict | None:
        if self.import_path is None or self.params is None:
            return None
        out = {"name": "import", "import": self.import_path, "params": dict(self.params), "ridge": self.ridge}
        if self.max_violations:
            out["max_violations"] = dict(self.max_violations)
        return out

    def model_names(self) -> dict[str, str]:
        """``{metric: model}`` of the metrics the arms learn (reward first), e.g.
        ``{"efficacy": "BayesianLinear (conjugate NIG)", ...}``."""
        from bayes_safe.factory import describe_model

        names = self.metric_names()
        used = [0, *self.model_columns] if self.declared else [0]
        if self._model_names is not None:
            return {names[j]: self._model_names[j] for j in used}
        return {names[j]: describe_model(self.model(j)) for j in used}

    def models_text(self) -> str:
        """Which models the arms run, and whose they are (the report's and ``describe``'s words)."""
        listed = ", ".join(f"`{m}` {d}" for m, d in self.model_names().items())
        if self.own_models:
            given = " and ".join(f"`{a}`" for a in self.hook_takes)
            return (f"models: the problem's own (`{type(self.problem).__name__}.models`): {listed}"
                    + (f" (as the hook builds them by default; each trial's {given} is passed to the hook)" if given else ""))
        noise = ", ".join(f"{v:g}" for v in (self.noise[j] for j in [0, *self.model_columns]))
        return (f"models: the ridge default (the problem declares no `models`): {listed}, prior N(0, sigma^2 / {self.ridge:g} I), "
                f"known noise sigma = {noise}")

    def describe(self, ab_test) -> str:
        guards = "; ".join(c.describe() for c in self.declared) or "no constraints"
        text = (f"`{self.import_path or type(self.problem).__name__}`, metrics {', '.join(self.metric_names())} "
                f"(reward `{self.metric_names()[0]}`; guarded: {guards}); {ab_test.n_users:,} units per arm in "
                f"{ab_test.batches} batches (the policy refits after each); tuned arm `{ab_test.policy}`")
        if ab_test.compare:
            text += ", compared arms " + ", ".join(f"`{c}`" for c in ab_test.compare)
        text += "; " + self.models_text()
        if self.declared and ab_test.policy == "ts-asc":
            text += f"; fallback when no action is allowed: `{self.fallback}`"
        reward_guards = [c for c in self.declared if c.metric == self.metric_names()[0]]
        if reward_guards:
            text += ("; the guardrail on the reward (" + ", ".join(f"`{c.describe()}`" for c in reward_guards)
                     + ") is enforced by the policy but is no outcome constraint on the objective's own metric "
                     "(Ax refuses one); its per-unit violation rate is reported")
        if self.violation_metric_names():
            text += ("; per-unit violation rates (% of units whose played action breaks a constraint in expectation, "
                     "the baseline's plays included): " + ", ".join(f"`{v}`" for v in self.violation_metric_names()))
        return text

    @property
    def report_intro(self) -> str:
        reward = self.metric_names()[0]
        guards = ", ".join(f"`{c.describe()}`" for c in self.declared) or "none"
        tol = ", ".join(f"`{n}`" for n in self.known_parameters()) or "none"
        return (f"Bayesian optimisation of TS-ASC's tolerances ({tol}) on the problem `{self.name}`: each trial is a "
                f"simulated A/B test of one parameterization against the baseline policy on common random numbers. "
                f"Objective: raise `{reward}`; constraints as declared: {guards}. Metrics are % changes against the "
                f"baseline with paired delta-method standard errors. The arms run "
                + ("the problem's own models." if self.own_models else "the ridge default models (the problem declares none)."))

    # -- the trial
    def make_env(self, parameters: Mapping, seed: int) -> _Env:
        return _Env(self.problem, seed)

    def dim(self) -> int:
        """The feature width ``d`` (one probe draw of a unit, from its own generator)."""
        if self._dim is None:
            batch = _as_batch(self.problem, _draw_probe(self.problem), 1, "draw (probe)")
            self._dim = int(batch.features.shape[-1])
        return self._dim

    def model(self, metric: int, forgetting: float | str | None = None):
        """The default conjugate Bayesian ridge model of metric ``metric`` (a new posterior), forgetting
        at ``forgetting`` (a factor under the stabilised rule, ``"adaptive"``; None or 1: none)."""
        import pyro.distributions as dist

        from bayes_safe.models import BayesianLinear

        sigma = self.noise[metric]
        scale = torch.tensor(sigma / self.ridge**0.5, dtype=torch.float64)
        prior = dist.Normal(torch.zeros((), dtype=torch.float64), scale).expand([self.dim()]).to_event(1)
        return BayesianLinear(prior, noise_std=sigma, batch_shape=(), forgetting=forgetting)

    def arm_models(self, columns, forgetting: float | str | None = None, parameters: Mapping | None = None) -> list:
        """New posteriors of the metrics ``columns``: the problem's own (``Problem.models(None)``) when
        it declares them, else the ridge default (with ``forgetting``). A hook that takes ``forgetting``
        or ``parameters`` receives the trial's (``parameters``; module docstring)."""
        own = _own_models(self.problem, parameters or {}) if self.own_models else None
        if self.own_models and own is None:
            raise ValueError(f"problem.models: {type(self.problem).__name__}.models(None) returned None in this "
                             "process, but returned models when the study was built")
        return [own[j] for j in columns] if own is not None else [self.model(j, forgetting) for j in columns]

    def policy_constraints(self, parameters: Mapping) -> list[Constraint]:
        """The constraints TS-ASC keeps for ``parameters``: each declared constraint at its tuned
        tolerance (not given: the declared bound) and tuned confidence (``confidence_<metric>``;
        not given: the declared one). Each remembers its declared limit (``Constraint.declared``)."""
        out = []
        for c, name, conf in zip(self.declared, self.tolerance_names(), self.confidence_names()):
            confidence = parameters.get(conf, ...)
            out.append(policy_constraint(c, parameters.get(name, 0.0), confidence)
                       if name in parameters or conf in parameters else c)
        return out

    def pilot_ranges(self, ab_test, seed: int, steps: int = PILOT_STEPS) -> tuple[tuple, dict] | None:
        """The default search space sized by a pilot so that a per-unit violation limit some setting
        meets can be reached (``max_violations``); None when there is nothing to size (the problem
        declares its own ``search_space``, no ``max_violations``, or no known means).

        The rule: start from ``default_range`` of every ``tolerance_<metric>``. Run one A/B test
        (one replicate, ``ab_test.evaluate_once``) with every tolerance that carries a per-unit limit
        at the strict (low) end of its range, the others at their centre. A limit whose observed
        violation rate there is above it gets its range extended toward stricter bounds by the
        range's width (the width doubles), never past ``strictest_tolerance`` (an absolute cap of
        0, a relative cap of 0.05 x baseline, a floor twice the declared one), and the pilot runs
        again; at most ``steps`` times.
        A limit met at the strict end is ``reached``; one still missed at the strictest bound
        (or after ``steps`` extensions) is not, and the report says so. The loose (high) end is
        never moved. Returns ``(parameters, record)``; ``record`` is stored with the study.
        """
        if getattr(self.problem, "search_space", None) or not self.max_violations or not self.knows_means():
            return None
        ranges = {n: {**default_range(c), "name": n} for c, n in zip(self.declared, self.tolerance_names())}
        limited = {}
        for c, tn, vn in zip(self.declared, self.tolerance_names(), self.violation_names):
            if vn in self.max_violations:
                limited[tn] = {"parameter": tn, "violation": vn, "limit": 100 * self.max_violations[vn],
                               "default": [ranges[tn]["low"], ranges[tn]["high"]], "strictest": strictest_tolerance(c),
                               "reached": None, "rate_at_strict_end": None}
        if not limited:
            return None
        probes = []
        open_ = set(limited)
        for step in range(steps + 1):
            point = {n: (r["low"] if n in limited else 0.5 * (r["low"] + r["high"])) for n, r in ranges.items()}
            probe_seed = (int(seed) * 100_003 + 99_971 + step) % (2**31 - 1)
            metrics = ab_test.evaluate_once(point, probe_seed)
            probes.append({"point": point, "seed": probe_seed,
                           "rates": {limited[n]["violation"]: (list(metrics[limited[n]["violation"]])
                                                               if limited[n]["violation"] in metrics else None)
                                     for n in limited}})
            for n in sorted(open_):
                row = limited[n]
                rate = metrics.get(row["violation"])
                row["rate_at_strict_end"] = None if rate is None else [float(rate[0]), float(rate[1])]
                if rate is None:
                    open_.discard(n)
                    continue
                if rate[0] <= row["limit"]:
                    row["reached"] = True
                    open_.discard(n)
                    continue
                low, high = ranges[n]["low"], ranges[n]["high"]
                floor = row["strictest"]
                if low <= floor + 1e-12 or step == steps:
                    row["reached"] = False
                    open_.discard(n)
                    continue
                new = low - (high - low)
                ranges[n]["low"] = round(float(max(new, floor)), 10)
            if not open_:
                break
        for row in limited.values():
            row["range"] = [ranges[row["parameter"]]["low"], ranges[row["parameter"]]["high"]]
        record = {"rule": "strict end extended by the range's width until the pilot's violation rate there meets "
                          "the limit (at most the strictest bound)", "constraints": list(limited.values()),
                  "probes": probes, "replicates": 1, "units_per_arm": ab_test.n_users}
        return tuple(ranges[n] for n in self.tolerance_names()), record

    def make_policy(self, kind: str, parameters: Mapping, env, *, seed: int, refit_every: int):
        from bayes_safe.policies import TSASC, ThompsonSampling

        forgetting = _forgetting_setting(parameters.get("forgetting"))
        if kind == "ts":
            return ThompsonSampling(self.arm_models([0], forgetting, parameters)[0])
        if kind == "ts-asc":
            if not self.declared:
                raise ValueError(f"policy: 'ts-asc' needs a constraint; problem {self.name!r} declares none (use 'ts')")
            names = self.metric_names()
            reward, *constraint_models = self.arm_models([0, *self.model_columns], forgetting, parameters)
            return TSASC(reward, constraint_models, constraints=self.policy_constraints(parameters),
                         metric_names=[names[j] for j in (0, *self.model_columns)], fallback=self.fallback)
        raise ValueError(f"policy: expected one of {list(ARMS)} for problem {self.name!r}, got {kind!r}")

    def feedback(self, env, units, outcomes):
        return outcomes[:, 0], (outcomes[:, self.model_columns] if self.model_columns else None)

    def unit_metrics(self, env, units, outcomes) -> dict:
        return {m: (outcomes[:, j], None) for j, m in enumerate(self.metric_names())}

    def _means(self, batch: _Batch) -> torch.Tensor | None:
        """The batch's mean table ``[n, K, M]`` (float64), once for all arms; None when unknown."""
        if not batch.judged:
            table = expected_table(self.problem, batch.units)
            if table is not None:
                table = torch.as_tensor(table).double()
                n, K = batch.features.shape[:2]
                M = len(self.metric_names())
                if table.shape != (n, K, M):
                    raise ValueError(f"{type(self.problem).__name__}.expected_all: expected means [n={n}, K={K}, M={M}], "
                                     f"got shape {tuple(table.shape)}")
                bad = ~torch.isfinite(table)
                if bad.any():
                    metric = self.metric_names()[int(bad.reshape(-1, M).any(0).nonzero()[0])]
                    raise ValueError(f"{type(self.problem).__name__}.expected_all: metric {metric!r} has NaN or inf means")
            batch.means, batch.judged = table, True
        return batch.means

    def unit_violations(self, env, units: _Batch, actions: torch.Tensor) -> dict | None:
        """``{<metric>_violations: bool [n]}``: which units' played ``actions`` break each declared
        constraint in expectation (``Constraint.violated`` of the true means, the rule ``simulate``
        counts by; a chance constraint against the true mean). None
        when the problem does not know its means."""
        table = self._means(units)
        if table is None or not self.declared:
            return None
        rows = torch.arange(len(units))
        names = list(self.metric_names())
        return {name: c.violated(table[..., names.index(c.metric)], units.baseline)[rows, actions.long()]
                for c, name in zip(self.declared, self.violation_names)}
