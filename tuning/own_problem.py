"""Tuning your own problem: ``SimulatedProblem`` runs any ``bayes_safe.envs.Problem`` as A/B tests.

``ABTest(problem)`` and ``Study(ABTest(problem))`` wrap a ``Problem`` (``draw`` / ``outcomes`` /
``Constraint`` declarations) in ``SimulatedProblem``, the ``ABProblem`` the engine runs:

* the environment of a trial draws its units with ``problem.draw(n, generator)``, the
  generator seeded from the trial's seed (so a trial is a pure function of its parameters and
  seed), and gives ``problem.outcomes`` (converted to float64 ``[n, M]``, NaN an error naming
  the metric);
* the arms are TS-ASC (``"ts-asc"``, tuned) and vanilla Thompson sampling (``"ts"``, compared),
  with conjugate Bayesian ridge models (``BayesianLinear``, prior ``N(0, sigma^2 / ridge I)``,
  known noise ``sigma``): one per metric, ``batch_shape=()`` (one posterior shared by the units
  of a batch). ``sigma`` is ``problem.noise_std[m]`` when the problem declares it, else 1.0 (the
  protocol's default; declare 0.5 for a 0/1 metric, the largest standard deviation it can have);
* TS-ASC guards every declared constraint with its own bound, set by one tuned parameter per
  constraint, ``tolerance_<metric>``: for a relative constraint the factor's distance from 1
  (``at_most``: the policy keeps ``metric <= (1 + t) x baseline``; ``at_least``:
  ``metric >= (1 - t) x baseline``, i.e. the paper's alpha); for an absolute one the margin
  added to the level in the metric's units (``at_most``: ``metric <= level + t``; ``at_least``:
  ``metric >= level - t``). The declared bound itself is the study's outcome constraint, on what
  the A/B test measures: ``relative(m, at_most=1.02)`` -> ``m_change <= 2`` (% vs the
  baseline), ``relative(m, at_least=0.99)`` -> ``m_change >= -1``, ``absolute(m, at_most=v)``
  -> ``m <= v`` (the arm's mean level);
* the objective is ``<reward>_change``, maximised; every metric ``m`` is reported as ``m_change``
  (% change against the baseline, paired delta-method SE), ``m`` and ``baseline_m``.

The default search space is ``problem.search_space`` (dicts or ``Range`` of ``tolerance_*`` names)
or, when empty, one range per constraint: relative ``[0, 2 |bound - 1|]`` (at least 0.02 wide;
capped at 0.9 for ``at_least``), absolute ``[-s, s]`` with ``s = |level| / 4`` (0.1 for a level 0).

A study of a problem class importable by ``module:Class`` (not ``__main__``, not defined inside
a function) stores that path and the constructor's parameters (read back from the instance's
attributes of the same names, as a dataclass keeps them; or given as ``params=``), so
``bayes-safe tune resume`` rebuilds it; ``load_problem_class`` is how it (and ``--problem``)
imports one. Otherwise the study is resumed in Python (``Study.load(..., ab_test=...)``).
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
from bayes_safe.envs.problem import Constraint, Units, check_problem, outcome_metrics

__all__ = ["SimulatedProblem", "import_problem", "load_problem_class", "outcome_constraint", "tolerance_name"]

#: the arms a trial of a custom problem can run
ARMS = ("ts-asc", "ts")


# ---------------------------------------------------------------------- importing a problem class
def load_problem_class(path: str, what: str = "--problem"):
    """The class named by ``path`` (``"pkg.module:Class"``), checked against the ``Problem`` protocol
    (``bayes_safe._cli_args.load_problem_class``: one-line errors naming ``what``)."""
    from bayes_safe._problem_import import load_problem_class as load

    return load(path, what)


def import_problem(path: str, params: Mapping | None = None, what: str = "--problem"):
    """``Class(**params)`` from ``"module:Class"`` (``bayes_safe._cli_args.load_problem``)."""
    from bayes_safe._problem_import import load_problem

    return load_problem(path, params, what)


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
def tolerance_name(constraint: Constraint) -> str:
    """``tolerance_<metric>``: the tuned parameter that sets the policy's bound for ``constraint``."""
    return "tolerance_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in constraint.metric)


def policy_constraint(constraint: Constraint, tolerance: float) -> Constraint:
    """The bound TS-ASC keeps for ``constraint`` with tolerance ``t`` (see the module docstring)."""
    t = float(tolerance)
    if constraint.versus_baseline:
        factor = 1 + t if constraint.at_most else 1 - t
        if factor <= 0:
            raise ValueError(f"{tolerance_name(constraint)}: {t:g} leaves no factor > 0 of the baseline's "
                             f"{constraint.metric}; expected < 1")
        return Constraint(constraint.metric, factor, constraint.at_most, True)
    level = constraint.bound + t if constraint.at_most else constraint.bound - t
    if constraint.at_most and level < 0:
        level = 0.0
    return Constraint(constraint.metric, level, constraint.at_most, False)


def default_range(constraint: Constraint) -> dict:
    if constraint.versus_baseline:
        slack = max(2 * abs(constraint.bound - 1), 0.02)
        high = slack if constraint.at_most else min(slack, 0.9)
        return {"name": tolerance_name(constraint), "low": 0.0, "high": round(float(high), 10)}
    s = round(abs(constraint.bound) / 4, 10) or 0.1
    return {"name": tolerance_name(constraint), "low": -float(s), "high": float(s)}


def outcome_constraint(constraint: Constraint) -> str:
    """The study's outcome constraint (an Ax expression on the A/B test's metrics) for a declaration."""
    op = "<=" if constraint.at_most else ">="
    if constraint.versus_baseline:
        return f"{constraint.metric}_change {op} {100 * (constraint.bound - 1):.10g}"
    return f"{constraint.metric} {op} {constraint.bound:.10g}"


# ---------------------------------------------------------------------- the environment of one trial
@dataclasses.dataclass
class _Batch:
    """The units of a batch as the engine and the policies read them (float64 features, long
    baseline, bool mask), with the problem's own ``Units`` for its ``outcomes``."""

    features: torch.Tensor
    baseline: torch.Tensor
    valid: torch.Tensor | None
    units: Units

    def __len__(self) -> int:
        return int(self.features.shape[0])


class _Env:
    """The user's problem with every draw and outcome checked (a ``Problem`` itself: ``draw(n, generator)``)."""

    def __init__(self, problem, seed: int):
        self.problem = problem
        self.generator = torch.Generator().manual_seed(int(seed))
        self.draws = 0

    def draw(self, n: int, generator: torch.Generator | None = None) -> _Batch:
        units = self.problem.draw(int(n), self.generator if generator is None else generator)
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
class SimulatedProblem(ABProblem):
    """A user's ``Problem`` as an ``ABProblem``: TS-ASC tuned against its baseline (module docstring).

    Args:
        problem: an instance of a ``bayes_safe.envs.Problem`` (``draw``, ``outcomes``,
            ``metric_names``, ``constraints``).
        ridge: the ridge penalty of the Bayesian linear models (prior ``N(0, sigma^2 / ridge I)``).
        import_path, params: the ``"module:Class"`` and constructor arguments that rebuild the
            problem when a stored study is resumed (found from the instance by default: its
            class's import path and the constructor arguments read from its attributes).
    """

    policies = ARMS
    compare = ("ts",)
    trial_noun = "A/B test"
    observed_label = "A/B test mean"
    trial_work = "simulation"

    def __init__(self, problem, *, ridge: float = 1.0, import_path: str | None = None, params: Mapping | None = None):
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
        names = list(problem.metric_names)
        self.metric_columns = [names.index(c.metric) for c in self.declared]
        self.noise = self._noise(names)
        own = tuple(getattr(problem, "search_space", ()) or ())
        self.parameters = own or tuple(default_range(c) for c in self.declared)
        self.objective = f"{names[0]}_change"
        self.outcome_constraints = tuple(outcome_constraint(c) for c in self.declared)
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

    def known_parameters(self) -> tuple[str, ...]:
        return tuple(tolerance_name(c) for c in self.declared)

    def config(self) -> dict | None:
        if self.import_path is None or self.params is None:
            return None
        return {"name": "import", "import": self.import_path, "params": dict(self.params), "ridge": self.ridge}

    def describe(self, ab_test) -> str:
        guards = "; ".join(c.describe() for c in self.declared) or "no constraints"
        text = (f"`{self.import_path or type(self.problem).__name__}`, metrics {', '.join(self.metric_names())} "
                f"(reward `{self.metric_names()[0]}`; guarded: {guards}); {ab_test.n_users:,} units per arm in "
                f"{ab_test.batches} batches (the policy refits after each); tuned arm `{ab_test.policy}`")
        if ab_test.compare:
            text += ", compared arms " + ", ".join(f"`{c}`" for c in ab_test.compare)
        return text

    @property
    def report_intro(self) -> str:
        reward = self.metric_names()[0]
        guards = ", ".join(f"`{c.describe()}`" for c in self.declared) or "none"
        tol = ", ".join(f"`{n}`" for n in self.known_parameters()) or "none"
        return (f"Bayesian optimisation of TS-ASC's tolerances ({tol}) on the problem `{self.name}`: each trial is a "
                f"simulated A/B test of one parameterization against the baseline policy on common random numbers. "
                f"Objective: raise `{reward}`; constraints as declared: {guards}. Metrics are % changes against the "
                f"baseline with paired delta-method standard errors.")

    # -- the trial
    def make_env(self, parameters: Mapping, seed: int) -> _Env:
        return _Env(self.problem, seed)

    def dim(self) -> int:
        """The feature width ``d`` (one probe draw of a unit, from its own generator)."""
        if self._dim is None:
            batch = _as_batch(self.problem, self.problem.draw(1, torch.Generator().manual_seed(0)), 1, "draw (probe)")
            self._dim = int(batch.features.shape[-1])
        return self._dim

    def model(self, metric: int):
        """The conjugate Bayesian ridge model of metric ``metric`` (a new posterior)."""
        import pyro.distributions as dist

        from bayes_safe.models import BayesianLinear

        sigma = self.noise[metric]
        scale = torch.tensor(sigma / self.ridge**0.5, dtype=torch.float64)
        prior = dist.Normal(torch.zeros((), dtype=torch.float64), scale).expand([self.dim()]).to_event(1)
        return BayesianLinear(prior, noise_std=sigma, batch_shape=())

    def policy_constraints(self, parameters: Mapping) -> list[Constraint]:
        """The constraints TS-ASC keeps for ``parameters`` (a tolerance not given: the declared bound)."""
        out = []
        for c in self.declared:
            name = tolerance_name(c)
            if name in parameters:
                out.append(policy_constraint(c, parameters[name]))
            else:
                out.append(c)
        return out

    def make_policy(self, kind: str, parameters: Mapping, env, *, seed: int, refit_every: int):
        from bayes_safe.policies import TSASC, ThompsonSampling

        if kind == "ts":
            return ThompsonSampling(self.model(0))
        if kind == "ts-asc":
            if not self.declared:
                raise ValueError(f"policy: 'ts-asc' needs a constraint; problem {self.name!r} declares none (use 'ts')")
            models = [self.model(j) for j in self.metric_columns]
            return TSASC(self.model(0), models, constraints=self.policy_constraints(parameters))
        raise ValueError(f"policy: expected one of {list(ARMS)} for problem {self.name!r}, got {kind!r}")

    def feedback(self, env, units, outcomes):
        return outcomes[:, 0], (outcomes[:, self.metric_columns] if self.metric_columns else None)

    def unit_metrics(self, env, units, outcomes) -> dict:
        return {m: (outcomes[:, j], None) for j, m in enumerate(self.metric_names())}
