"""The batched runner: advance every replication of a problem in lockstep."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ._validation import check_positive_int, trusted_inputs
from .random import ReplicationRNG, replication_seeds
from .threads import single_thread
from .trace import Trace

if TYPE_CHECKING:
    from .envs.problem import Units

__all__ = ["simulate"]


#: what ``simulate`` reads of a problem
_ENV_ATTRIBUTES = ("replications", "num_metrics", "step", "observe", "optimal_reward", "baseline_expected",
                   "metric_names", "alpha", "name")


def _check_policy(policy) -> None:
    missing = [m for m in ("select", "update") if not callable(getattr(policy, m, None))]
    if missing:
        raise TypeError(f"policy: expected a Policy (with select and update, see bayes_safe.policies), got "
                        f"{type(policy).__name__} without {' and '.join(missing)}")


def _check_env(env) -> None:
    missing = [a for a in _ENV_ATTRIBUTES if not hasattr(env, a)]
    if missing:
        raise TypeError(f"env: expected a problem such as bayes_safe.envs.daulton2019(...) (with {', '.join(_ENV_ATTRIBUTES)}), "
                        f"got {type(env).__name__} without {', '.join(missing)}")
    for a in ("step", "observe"):
        if not callable(getattr(env, a)):
            raise TypeError(f"env: expected {a} to be a method, got {type(getattr(env, a)).__name__}")
    check_positive_int(env.replications, "env.replications")
    check_positive_int(env.num_metrics, "env.num_metrics")


def simulate(policy, env, horizon: int, seed: int | Sequence[int] = 0, *, progress: bool = False,
             callback: Callable[[int, dict], None] | None = None) -> Trace:
    """Run ``policy`` on ``env`` for ``horizon`` steps, all replications at once.

    Each step: the problem shows the candidates ``[R, K, d]`` and the baseline action ``[R]``;
    the policy selects ``[R]`` actions; the problem returns expected and observed metrics; the
    policy updates on the chosen features and observed metrics.

    All randomness (posterior draws, observation noise, random tie-breaks) comes from one
    ``ReplicationRNG`` with a stream per replication, so replication
    ``r`` of this run equals a run of that replication alone with
    ``seed=[replication_seeds(seed, R)[r]]`` (on a problem built for that replication).

    The loop runs with one torch intra-op thread (see ``bayes_safe.threads``).

    Your own problem (a ``bayes_safe.envs.Problem``: ``draw`` and ``outcomes``, optionally
    ``expected``) runs the same loop; see ``_simulate_problem`` for what differs: each step
    draws ``problem.replications`` units with a ``torch.Generator`` seeded from
    ``(seed, t)``, so the same seed gives the same trace, but replication ``r`` of a batched
    run is *not* the run of that replication alone (replication separability holds only for
    the built-in problems). Regret and violations need ``expected``; without it they are
    reported as unavailable (NaN regret, ``trace.attrs["regret_available"] = False``).

    Args:
        policy: any ``Policy``.
        env: a ``bayes_safe.envs.Problem`` (or an object with ``draw`` and ``outcomes`` and no
            ``step``), or a built-in problem with ``replications``, ``step(t)``,
            ``observe(actions, generator)``, ``instance_feasible``, ``optimal_reward`` and
            ``baseline_expected``.
        horizon: number of steps ``T`` (>= 1).
        seed: an int or one seed per replication.
        progress: show a tqdm progress bar.
        callback: called as ``callback(t, info)`` after every step (``info`` holds the step's
            tensors); for live monitoring.

    Returns:
        A ``Trace`` of shape ``[T, R]``.
    """
    T = check_positive_int(horizon, "horizon")
    _check_policy(policy)
    if _is_problem(env):
        return _simulate_problem(policy, env, T, seed, progress=progress, callback=callback)
    _check_env(env)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback: expected a callable (t, info) or None, got {type(callback).__name__}")
    R, M = env.replications, env.num_metrics
    needed = getattr(policy, "num_constraints", 0)
    if needed and needed != env.num_metrics - 1:
        raise ValueError(
            f"policy: it models {needed} constraint metrics but problem {env.name!r} has {env.num_metrics - 1}; "
            "give one constraint model per constraint metric"
        )
    seeds = replication_seeds(seed, R)
    rng = ReplicationRNG(seeds)
    rows = torch.arange(R)
    # per-step records; appending (no copy) is cheaper than writing into preallocated rows
    actions, baseline, expected, base_exp, observed, optimal = [], [], [], [], [], []
    steps = range(T)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"simulate {env.name}", unit="step", mininterval=0.5)
    start = time.perf_counter()
    # Inference mode trims per-op bookkeeping (measured: +17% decisions/s at R = 1). It is
    # used only when every model of the policy is an exact conjugate posterior: models that
    # train by gradient (NUTS, SVI, the probit GP) need autograd inside ``update``.
    models = policy.models().values() if hasattr(policy, "models") else ()
    no_autograd = all(getattr(m, "conjugate", False) for m in models)
    grad_mode = torch.inference_mode() if no_autograd else contextlib.nullcontext()
    with single_thread(), trusted_inputs(), grad_mode:
        for t in steps:
            step = env.step(t)
            a = policy.select(step.features, step.baseline, generator=rng, valid=step.valid)
            mean, obs = env.observe(a, rng)
            chosen = step.features[rows, a]
            policy.update(chosen, obs[:, 0], obs[:, 1:] if M > 1 else None, actions=a)
            actions.append(a)
            baseline.append(step.baseline)
            expected.append(mean)
            observed.append(obs)
            base_exp.append(env.baseline_expected)
            optimal.append(env.optimal_reward)
            if callback is not None:
                callback(t, {"actions": a, "expected": mean, "observed": obs, "policy": policy})
    elapsed = time.perf_counter() - start
    actions, baseline, expected, base_exp, observed, optimal = (
        torch.stack(x) for x in (actions, baseline, expected, base_exp, observed, optimal))
    # instance-level violation against the baseline of the same step (problems whose baseline
    # changes per step are judged step by step)
    if M > 1 and env.alpha is not None:
        violation = (expected[..., 1:] < (1 - env.alpha) * base_exp[..., 1:]).any(-1)
    else:
        violation = torch.zeros(T, R, dtype=torch.bool)
    return Trace(
        actions=actions, baseline=baseline, expected=expected, baseline_expected=base_exp, observed=observed,
        optimal_reward=optimal, regret=optimal - expected[..., 0], violation=violation,
        metric_names=list(env.metric_names), alpha=env.alpha, seeds=seeds,
        attrs={"problem": env.name, "policy": type(policy).__name__, "elapsed_seconds": elapsed,
               "decisions_per_second": T * R / max(elapsed, 1e-12)},
    )


# --- your own problem (bayes_safe.envs.Problem) ---------------------------------------------


def _is_problem(env) -> bool:
    """A ``Problem`` subclass, or anything with ``draw`` and ``outcomes`` and no ``step``.

    A built-in problem with ``step`` and ``observe`` keeps its own loop even if it also
    implements ``Problem`` (its numbers stay bit for bit those of the step/observe loop).
    """
    from .envs.problem import Problem

    if callable(getattr(env, "step", None)) and callable(getattr(env, "observe", None)):
        return False
    if isinstance(env, Problem):
        return True
    return hasattr(env, "draw") and hasattr(env, "outcomes") and not hasattr(env, "step")


def _step_generator(seeds: list[int], t: int) -> torch.Generator:
    """The problem's generator of step ``t``: seeded from the run's seeds and ``t`` only."""
    state = np.random.SeedSequence([*seeds, t]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _as_float64(value, method: str, t: int, shape: tuple[int, ...], names=None) -> torch.Tensor:
    """``value`` (tensor, numpy array, list; float32 or float64) as a finite float64 tensor of ``shape``."""
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise TypeError(f"{method} returned a {value.dtype} tensor at step {t}; expected real numbers")
        out = value.detach().to(torch.float64, copy=True)  # the user may reuse their buffer
    else:
        try:
            out = torch.as_tensor(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{method} returned {type(value).__name__} at step {t}; expected a tensor or array "
                            f"of numbers of shape {list(shape)}") from exc
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{method} returned shape {list(out.shape)} at step {t}; expected {list(shape)}"
                         + (f" (units x metrics {list(names)})" if names is not None else ""))
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        what = "NaN" if bool(out[tuple(bad)].isnan()) else "inf"
        where = f"for metric {names[bad[-1]]!r} " if names is not None else f"at index {bad} "
        raise ValueError(f"{method} returned {what} {where}at step {t}")
    return out


def _check_units(units, R: int, t: int) -> Units:
    """The ``Units`` of ``problem.draw(R, generator)``, checked and converted (features float64)."""
    from .envs.problem import Units

    if not isinstance(units, Units):
        if not (hasattr(units, "features") and hasattr(units, "baseline")):
            raise TypeError(f"problem.draw returned {type(units).__name__} at step {t}; expected "
                            "bayes_safe.envs.Units(features [n, K, d], baseline [n], valid=None, context=None)")
        units = Units(units.features, units.baseline, getattr(units, "valid", None), getattr(units, "context", None))
    feats = units.features
    if not isinstance(feats, torch.Tensor):
        try:
            feats = torch.as_tensor(np.asarray(feats, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"problem.draw returned features of type {type(units.features).__name__} at step {t}; "
                            "expected a tensor or array [n, K, d]") from exc
    if feats.dim() != 3 or feats.shape[0] != R or feats.shape[1] < 1:
        raise ValueError(f"problem.draw returned features of shape {list(feats.shape)} at step {t}; "
                         f"expected [n={R}, K, d]")
    feats = _as_float64(feats, "problem.draw (features)", t, tuple(feats.shape))
    K = feats.shape[1]
    base = units.baseline
    if isinstance(base, (int, np.integer)) and not isinstance(base, bool):
        base = torch.full((R,), int(base), dtype=torch.long)
    base = torch.as_tensor(np.asarray(base) if not isinstance(base, torch.Tensor) else base)
    if base.dtype == torch.bool or base.is_floating_point() or base.is_complex():
        raise TypeError(f"problem.draw returned a baseline of dtype {base.dtype} at step {t}; expected integer "
                        "action indices [n]")
    if tuple(base.shape) != (R,):
        raise ValueError(f"problem.draw returned a baseline of shape {list(base.shape)} at step {t}; expected [{R}]")
    base = base.to(torch.long)
    if bool(((base < 0) | (base >= K)).any()):
        raise ValueError(f"problem.draw returned a baseline action outside [0, {K}) at step {t}: {base.tolist()}")
    valid = units.valid
    if valid is not None:
        valid = torch.as_tensor(np.asarray(valid) if not isinstance(valid, torch.Tensor) else valid)
        if valid.dtype != torch.bool or tuple(valid.shape) != (R, K):
            raise ValueError(f"problem.draw returned valid of dtype {valid.dtype} and shape {list(valid.shape)} at "
                             f"step {t}; expected a bool mask [{R}, {K}] (or None)")
    return Units(feats, base, valid, units.context)


def _simulate_problem(policy, problem, T: int, seed, *, progress: bool, callback) -> Trace:
    """``simulate`` for a ``bayes_safe.envs.Problem``.

    Each step ``t``: ``units = problem.draw(R, generator)`` with a ``torch.Generator`` seeded
    from ``(seed, t)`` (``R = problem.replications``); the policy selects ``[R]`` actions (the
    policy's own randomness comes from a ``ReplicationRNG`` of the seed, as for the built-in
    problems); ``problem.outcomes(units, actions)`` gives the observed ``[R, M]`` metrics the
    policy learns from (reward column 0, constraint columns 1..). When ``problem.expected``
    gives means (called once for each of the ``K`` candidate actions), the regret is measured
    against the best action that satisfies every declared ``Constraint`` in expectation
    (the baseline is always allowed; ``units.valid`` is respected), and a violation is a
    chosen action that breaks a declared constraint in expectation (Daulton et al. 2019,
    s.3.1: the instance-level constraint, judged against the baseline's expected value of
    the same unit). When ``expected`` returns None, regret, expected metrics and violations
    are unavailable: NaN in the trace and ``trace.attrs["regret_available"] = False``.

    Everything the user's methods return is checked (shape, numbers, finiteness; float32
    and numpy accepted, converted once to float64) with an error naming the method, the step
    and the metric, raised before the trace exists. The user's methods run outside
    ``torch.inference_mode`` (their tensors are ordinary tensors).
    """
    from .envs.problem import check_problem

    check_problem(problem)
    R = int(problem.replications)
    names = [str(n) for n in problem.metric_names]
    M = len(names)
    declared = tuple(getattr(problem, "constraints", ()) or ())
    needed = getattr(policy, "num_constraints", 0)
    if needed and needed != M - 1:
        raise ValueError(f"policy: it models {needed} constraint metrics but problem {problem.name!r} has {M - 1} "
                         f"({names[1:]}); give one constraint model per constraint metric")
    for j, c in enumerate(getattr(policy, "constraints", None) or ()):
        metric = getattr(c, "metric", None)
        if isinstance(metric, str) and j + 1 < M and metric != names[j + 1]:
            raise ValueError(f"policy: its constraints[{j}] guards {metric!r} but its constraint model {j} learns "
                             f"metric {j + 1} of problem {problem.name!r}, {names[j + 1]!r}; declare the "
                             "constraints in the order of the problem's metric_names")
    index = {n: m for m, n in enumerate(names)}
    seeds = replication_seeds(seed, R)
    rng = ReplicationRNG(seeds)
    rows = torch.arange(R)
    actions, baseline, expected, base_exp, observed, optimal, violation = [], [], [], [], [], [], []
    available = True
    steps = range(T)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"simulate {problem.name}", unit="step", mininterval=0.5)
    nan = torch.full((R, M), float("nan"), dtype=torch.float64)
    start = time.perf_counter()
    models = policy.models().values() if hasattr(policy, "models") else ()
    no_autograd = all(getattr(m, "conjugate", False) for m in models)
    grad_mode = torch.inference_mode() if no_autograd else contextlib.nullcontext()
    user = (lambda: torch.inference_mode(False)) if no_autograd else contextlib.nullcontext
    with single_thread(), grad_mode:
        for t in steps:
            with user():
                units = _check_units(problem.draw(R, _step_generator(seeds, t)), R, t)
            K = units.features.shape[1]
            try:
                with trusted_inputs():
                    a = policy.select(units.features, units.baseline, generator=rng, valid=units.valid)
            except ValueError as exc:
                raise ValueError(f"problem.draw returned features of shape {list(units.features.shape)} at step {t} "
                                 f"that the policy does not accept: {exc}") from exc
            with user():
                obs = _as_float64(problem.outcomes(units, a.clone()), "problem.outcomes", t, (R, M), names)
                means = None
                if available and not callable(getattr(problem, "expected", None)):
                    available = False
                if available:
                    per_action = [problem.expected(units, torch.full((R,), k, dtype=torch.long)) for k in range(K)]
                    if any(m is None for m in per_action):
                        if t > 0:
                            raise ValueError(f"problem.expected returned None at step {t} after returning means at "
                                             "earlier steps; return means always or never")
                        available = False
                    else:
                        means = torch.stack([_as_float64(m, "problem.expected", t, (R, M), names) for m in per_action], 1)
            chosen = units.features[rows, a]
            with trusted_inputs():
                policy.update(chosen, obs[:, 0], obs[:, 1:] if M > 1 else None, actions=a)
            if means is not None:  # [R, K, M]
                base_means = means[rows, units.baseline]
                satisfied = torch.ones(R, K, dtype=torch.bool)
                for c in declared:
                    satisfied &= c.satisfied(means[..., index[c.metric]], base_means[:, index[c.metric]])
                broke = ~satisfied[rows, a]
                feasible = satisfied if units.valid is None else satisfied & units.valid
                feasible[rows, units.baseline] = True
                mean = means[rows, a]
                best = means[..., 0].masked_fill(~feasible, float("-inf")).max(-1).values
            else:
                mean, base_means, best = nan, nan, nan[:, 0]
                broke = torch.zeros(R, dtype=torch.bool)
            actions.append(a)
            baseline.append(units.baseline)
            expected.append(mean)
            observed.append(obs)
            base_exp.append(base_means)
            optimal.append(best)
            violation.append(broke)
            if callback is not None:
                callback(t, {"actions": a, "expected": mean, "observed": obs, "policy": policy, "units": units})
    elapsed = time.perf_counter() - start
    actions, baseline, expected, base_exp, observed, optimal, violation = (
        torch.stack(x) for x in (actions, baseline, expected, base_exp, observed, optimal, violation))
    if not available:  # the first step's means (if any) were dropped too: all NaN
        expected, base_exp, optimal = (torch.full_like(x, float("nan")) for x in (expected, base_exp, optimal))
    relative = [c for c in declared if c.versus_baseline and not c.at_most]
    alpha = 1.0 - relative[0].bound if len(relative) == len(declared) == 1 else None
    return Trace(
        actions=actions, baseline=baseline, expected=expected, baseline_expected=base_exp, observed=observed,
        optimal_reward=optimal, regret=optimal - expected[..., 0], violation=violation,
        metric_names=names, alpha=alpha, seeds=seeds,
        attrs={"problem": str(problem.name), "policy": type(policy).__name__, "elapsed_seconds": elapsed,
               "decisions_per_second": T * R / max(elapsed, 1e-12), "regret_available": available,
               "constraints": [c.to_dict() for c in declared]},
    )
