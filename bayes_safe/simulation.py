"""The batched runner: advance every replication of a problem in lockstep."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ._validation import check_positive_int, trusted_inputs
from .random import CounterRNG, ReplicationRNG, replication_seeds
from .threads import single_thread
from .trace import FIELDS, Trace

if TYPE_CHECKING:
    from .envs.problem import Units

__all__ = ["TRACE_FIELDS", "simulate"]


def _check_policy(policy) -> None:
    missing = [m for m in ("select", "update") if not callable(getattr(policy, m, None))]
    if missing:
        raise TypeError(f"policy: expected a Policy (with select and update, see bayes_safe.policies), got "
                        f"{type(policy).__name__} without {' and '.join(missing)}")


def simulate(policy, env, horizon: int, seed: int | Sequence[int] = 0, *, progress: bool | str = "auto",
             callback: Callable[[int, dict], None] | None = None, generator: ReplicationRNG | None = None,
             record: str | Sequence[str] | None = None, delays: Mapping[str, object] | None = None,
             device: str | torch.device | None = None) -> Trace:
    """Run ``policy`` on the problem ``env`` for ``horizon`` steps, all replications at once.

    ``env`` is any ``bayes_safe.envs.Problem``: a built-in one or your own class with ``draw``
    and ``outcomes`` (``bayes_safe.envs.problem`` documents the protocol). Each step ``t``:

    1. ``units = env.draw(R, generator)``: ``R = env.replications`` units, with candidate
       features ``[R, K, d]``, a baseline action ``[R]`` and optionally a mask ``[R, K]``
       (``env.draw(R, generator, step=t)`` when ``draw`` has a parameter named ``step``: a
       time-varying problem, see ``bayes_safe.envs.problem``);
    2. the policy selects ``[R]`` actions;
    3. ``env.outcomes(units, actions)`` gives the observed ``[R, M]`` metrics (the reward in
       column 0, the constraint metrics after it); the policy updates on the chosen features;
    4. when the problem knows its mean outcomes (``expected_all`` or ``expected``), every play
       is judged against the problem's declared ``Constraint`` s on those true means
       (Daulton et al. 2019, s.3.1: the instance-level constraint ``E[c | x, a] >= (1 - alpha)
       E[c | x, b]``, judged against the baseline's value for the same unit, generalised to the
       forms of ``Constraint``): ``trace.constraint_violation [T, R, C]`` marks, per declared
       constraint in declaration order, the plays whose true means break it, and
       ``trace.violation`` those that break any. The baseline's plays are counted like any
       other: an absolute constraint judges the baseline action like any action; a relative
       one cannot be broken by the baseline action itself (its bound is relative to that
       action's own value: the papers' rule), so a baseline play never breaks it. A chance
       constraint (``confidence``) is counted against the true mean like any other: the
       policy's posterior probability is its own affair, the count is about the truth.
       ``bayes_safe.metrics.violation_breakdown`` says which share the baseline's plays caused.
       The regret is measured against the best action that meets every declared constraint
       in expectation among the allowed ones (``units.valid``; the baseline is always
       allowed when it meets every constraint, even if masked); a unit for which no action
       meets them all is compared with its baseline action.
       Without means, regret, expected metrics and violations are unavailable: NaN in the
       trace (violations all False) and ``trace.attrs["regret_available"] = False``, never zero.

    Randomness: the policy draws from one ``ReplicationRNG`` (a stream per replication). A
    problem with ``replication_streams = True`` (the built-in linear bandits) draws from the
    same object under its own keys, so replication ``r`` of this run equals a run of that
    replication alone with ``seed=[replication_seeds(seed, R)[r]]`` (on a problem built for
    that replication). Other problems get a ``torch.Generator`` seeded from ``(seed, t)``:
    the same seed gives the same trace, but replication ``r`` of a batch is not the run of
    that replication alone.

    Everything a user's methods return is checked (shape, numbers, finiteness; float32 and
    numpy accepted, converted once to float64) with an error naming the method, the step and
    the metric, raised before the trace exists. The user's methods run outside
    ``torch.inference_mode`` (their tensors are ordinary tensors). The loop runs with one
    torch intra-op thread (see ``bayes_safe.threads``).

    Args:
        policy: any ``Policy``.
        env: a ``bayes_safe.envs.Problem``.
        horizon: number of steps ``T`` (>= 1).
        seed: an int or one seed per replication.
        progress: ``"auto"`` (default): a progress bar once the run has taken 2 s, in a notebook or
            on a terminal (``bayes_safe.progress``); ``True`` / ``False``: always / never.
        callback: called as ``callback(t, info)`` after every step (``info`` holds the step's
            ``actions``, ``expected`` ``[R, M]``, ``observed``, ``policy`` and ``units``); for
            live monitoring.
        generator: the ``ReplicationRNG`` to draw from instead of one seeded from ``seed`` (its
            ``replications`` must equal the problem's). Runs given streams that share rows
            (``bayes_safe.experiments.SharedStreams``) compare several settings of one
            replication on common random numbers.
        record: the ``Trace`` fields to record, a subset of ``TRACE_FIELDS`` (``"actions"``,
            ``"baseline"``, ``"expected"``, ``"baseline_expected"``, ``"observed"``,
            ``"optimal_reward"``, ``"regret"``, ``"violation"``, ``"constraint_violation"``), or
            one name; None (default):
            all of them. Fields not asked for are not computed and are ``None`` in the trace
            (``trace.recorded`` lists the others). An unknown name raises ``ValueError``.
        delays: outcomes that arrive late (issue 45), per metric: a dict ``{metric name: lag}``
            whose names are the problem's ``metric_names`` (``"reward"`` also names metric 0);
            a metric not named arrives at once (lag 0). A lag, in steps, is an int ``>= 0``
            (fixed), a ``torch.distributions.Distribution`` of scalars over steps ``>= 0`` (a
            continuous one is rounded up: an outcome due 2.3 steps later is learned at the third),
            or an elementwise quantile function ``u -> lags`` (uniforms in ``[0, 1)`` of any
            shape to integer lags ``>= 0`` of that shape). A random lag is drawn per decision
            from the run's ``ReplicationRNG`` (stream ``"delay/<name>"``, by inverse CDF), so
            replication ``r`` of a batch still equals its run alone. The outcome of metric ``m``
            of the decision at step ``t`` is delivered to the policy at step ``t + lag`` (after
            that step's decision; lag 0 is today's update), each exactly once, the rows due at a
            step together; outcomes due at or after ``horizon`` are never learned. Regret,
            violations and ``observed`` stay those of the decision (realised at step ``t``);
            ``trace.learned_at [T, R, M]`` says when each outcome was learned (-1: never) and
            ``trace.pending()`` / ``attrs["pending_at_end"]`` how many were still pending.
            Delivery: when the metrics the policy learns share one fixed lag, its ``update``
            takes each decision late, whole (any policy that allows it: not CLUCB, CLUCB2-ASC-C
            or TS-ASC with ``chance_recalibrate``, whose update is tied to the last ``select``);
            otherwise each of its models learns its own metric when it arrives (TS-ASC,
            ThompsonSampling, Greedy, LinUCB), and a random lag needs models that can learn a
            subset of replications at a step (the conjugate ``BayesianLinear`` without
            forgetting, decay or change detection). A combination that cannot be delivered,
            an unknown name or a bad lag raises ``ValueError`` / ``TypeError`` before the run.
            None (default) or all lags 0: the run without delays, bit for bit. A TS-ASC built
            with ``pending="margin"`` holds each decision's late constraint metrics as pending
            (``hold_pending``) from its step until they are delivered (``release_pending``), so its
            constraint checks keep a margin for them (``bayes_safe.policies.ts_asc``, "Pending
            outcomes").

    Fallbacks: for a policy that can play a fallback when no action is allowed
    (``policy.fallback_constraints`` not None: TS-ASC under an absolute or chance constraint), the
    trace also holds ``fallback [T, R]`` and ``fallback_by [T, R, G]`` (``policy.last_fallback`` and
    ``last_fallback_by`` after each step's ``select``), whatever ``record`` asks, and
    ``attrs["fallback_constraints"]``; None otherwise (``bayes_safe.metrics.fallback_breakdown``).

    Device (issue 46): the run's tensors (its random streams' draws, the records, the rows it
    indexes) live on ``device``, by default the problem's (its ``device`` attribute, else its
    ``arm_features``' device, else the CPU); the models must be on it too (a model follows its
    prior's device). The returned ``Trace`` is on the CPU (moved once, at the end; on the CPU
    nothing moves). Random numbers: on the CPU the run's streams are a ``ReplicationRNG`` (numpy's
    numbers); off the CPU they are a ``bayes_safe.random.CounterRNG`` computed on the device (a
    ``ReplicationRNG`` refills its blocks with a Python loop over replications, about 1 s per step
    at a million replications). Both keep replication ``r`` equal to its run alone; the same seed
    gives the same numbers on the same device, and CPU and GPU runs of one seed agree in law. For
    the same numbers on every device pass the same ``generator`` (either kind, made on the run's
    device) to both runs.

    Recording: each field is written into one preallocated ``[T, R, ...]`` tensor, a chunk of
    steps at a time (the steps' tensors are kept by reference until their chunk is written, so
    a step costs a few list appends), and the trace returns those tensors without copying:
    the run's extra memory is the trace itself plus a chunk of steps. A policy with chance
    constraints (TS-ASC with ``Constraint(..., confidence=q)``) also fills
    ``trace.chance_claims``: per step the probability it claimed for the played action and
    whether the truth meets it (``bayes_safe.diagnostics.chance_calibration`` reads it); no
    other policy does any work for it.

    Returns:
        A ``Trace`` of shape ``[T, R]``.
    """
    from .envs.problem import check_problem

    T = check_positive_int(horizon, "horizon")
    _check_policy(policy)
    if env is None or isinstance(env, (str, bytes)):
        raise TypeError(f"env: expected a problem (a bayes_safe.envs.Problem such as bayes_safe.envs.daulton2019(...), "
                        f"or your own class with draw and outcomes), got {env!r}")
    check_problem(env, "env")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback: expected a callable (t, info) or None, got {type(callback).__name__}")
    if generator is not None:
        if not isinstance(generator, ReplicationRNG):
            raise TypeError(f"generator: expected a bayes_safe.random.ReplicationRNG or None, got {type(generator).__name__}")
        if generator.replications != int(env.replications):
            raise ValueError(f"generator: it has {generator.replications} replications but the problem has "
                             f"{int(env.replications)}")
    fields = _check_record(record)
    names = [str(n) for n in env.metric_names]
    lags = _check_delays(delays, names, str(getattr(env, "name", None) or type(env).__name__), T)
    return _run(policy, env, T, seed, progress=progress, callback=callback, generator=generator, record=fields,
                delays=lags, device=_run_device(env, device))


def _run_device(env, device) -> torch.device:
    """``simulate``'s device: the one given, else the problem's (``device``, else ``arm_features``'), else the CPU."""
    if device is None:
        from .envs.problem import problem_device

        device = problem_device(env)
    try:
        return torch.device("cpu" if device is None else device)
    except (TypeError, RuntimeError):
        raise ValueError(f"device: expected a torch device or its name ('cpu', 'cuda', 'cuda:1'), got {device!r}") from None


#: the fields of a ``Trace`` that ``simulate`` can record (``record=``)
TRACE_FIELDS = FIELDS

#: numbers per field written into the trace at a time: a chunk is ``2^16 / R`` steps (between 8 and
#: 1,024), so the pending steps' tensors stay small at large R and flushes are rare at small R
_CHUNK_NUMBERS = 1 << 16


def _chunk_steps(R: int) -> int:
    """Steps per recording chunk at ``R`` replications."""
    return max(8, min(1024, _CHUNK_NUMBERS // R))


def _check_record(record) -> tuple[str, ...]:
    """``record`` as a tuple of trace field names in ``TRACE_FIELDS`` order (None: all)."""
    if record is None:
        return TRACE_FIELDS
    names = (record,) if isinstance(record, str) else record
    allowed = ", ".join(repr(f) for f in TRACE_FIELDS)
    try:
        names = list(names)
    except TypeError:
        raise ValueError(f"record: expected None, a field name or a sequence of field names among {allowed}; "
                         f"got {record!r}") from None
    bad = [n for n in names if not isinstance(n, str) or n not in TRACE_FIELDS]
    if bad:
        raise ValueError(f"record: unknown field name(s) {bad}; allowed: {allowed} (or None for all)")
    return tuple(f for f in TRACE_FIELDS if f in names)


# ---------------------------------------------------------------------- delays (issue 45)
def _delays_form(names: list[str]) -> str:
    alias = " ('reward' also names metric 0)" if names[0] != "reward" else ""
    return (f"a dict {{metric name: lag}} with names among {names}{alias}; a lag is an int >= 0 (steps), a "
            "torch.distributions.Distribution of scalars over steps >= 0, or an elementwise quantile function "
            "u -> lags (uniforms in [0, 1) to integer lags >= 0)")


def _check_delays(delays, names: list[str], problem: str, T: int) -> dict[int, object] | None:
    """``simulate``'s ``delays`` checked before any work: ``{metric index: int lag | quantile function}``
    (None when there are none). Errors name the argument and the expected form."""
    if delays is None:
        return None
    if not isinstance(delays, Mapping):
        raise TypeError(f"delays: expected None or {_delays_form(names)}; got {type(delays).__name__}")
    unknown = [k for k in delays if not isinstance(k, str) or (k not in names and k != "reward")]
    if unknown:
        raise ValueError(f"delays: unknown metric name(s) {unknown} for problem {problem!r}; expected "
                         f"{_delays_form(names)}")
    out: dict[int, object] = {}
    for key, spec in delays.items():
        m = names.index(key) if key in names else 0
        if m in out:
            raise ValueError(f"delays: metric 0 given twice, as 'reward' and as {names[0]!r}; give it once")
        out[m] = _delay_spec(spec, f"delays[{key!r}]", T)
    return out


def _delay_spec(spec, what: str, T: int):
    """One metric's lag: an int ``>= 0``, or a quantile function ``u [..] -> lags [..]`` (long)."""
    if isinstance(spec, bool):
        raise TypeError(f"{what}: expected an int >= 0, a torch Distribution or a quantile function, got a bool")
    if isinstance(spec, (int, np.integer)):
        if int(spec) < 0:
            raise ValueError(f"{what}: expected a lag >= 0 (steps), got {int(spec)}")
        return int(spec)
    if isinstance(spec, torch.distributions.Distribution):
        return _distribution_quantile(spec, what, T)
    if callable(spec):
        return _CheckedQuantile(spec, what)
    raise TypeError(f"{what}: expected an int >= 0 (steps), a torch.distributions.Distribution or a quantile "
                    f"function u -> lags, got {type(spec).__name__}")


class _CheckedQuantile:
    """A user's quantile function, its lags checked (shape, finite, >= 0) and rounded up to steps."""

    def __init__(self, fn, what: str):
        self.fn, self.what = fn, what

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        try:
            lags = self.fn(u)
        except Exception as exc:
            raise ValueError(f"{self.what}: the quantile function raised {type(exc).__name__}: {exc}") from exc
        lags = torch.as_tensor(np.asarray(lags) if not isinstance(lags, torch.Tensor) else lags)
        if tuple(lags.shape) != tuple(u.shape):
            raise ValueError(f"{self.what}: the quantile function returned shape {list(lags.shape)} for uniforms of "
                             f"shape {list(u.shape)}; expected one lag per uniform (elementwise)")
        if lags.dtype == torch.bool or lags.is_complex():
            raise TypeError(f"{self.what}: the quantile function returned {lags.dtype}; expected integer lags")
        lags = lags.to(torch.float64)
        if not bool(torch.isfinite(lags).all()) or bool((lags < 0).any()):
            bad = lags[~torch.isfinite(lags) | (lags < 0)].reshape(-1)[:3].tolist()
            raise ValueError(f"{self.what}: the quantile function returned lags {bad}; expected finite lags >= 0")
        return lags.ceil().to(torch.long)


def _distribution_quantile(dist, what: str, T: int):
    """The quantile function of ``dist``'s lags on steps ``0..T-1`` (``T``: never within the run):
    ``min{k : P(lag <= k) > u}`` of its CDF table (a continuous lag is rounded up)."""
    if tuple(dist.batch_shape) or tuple(dist.event_shape):
        raise ValueError(f"{what}: expected a distribution of scalar lags, got batch_shape {list(dist.batch_shape)} "
                         f"and event_shape {list(dist.event_shape)}")
    support = dist.support
    # the table on the distribution's own device (its parameters'), made once before the run
    device = next((v.device for v in vars(dist).values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    steps = torch.arange(T, dtype=torch.float64, device=device)
    try:
        negative = bool(support.check(torch.tensor(-1.0 if support.is_discrete else -1e-9, dtype=torch.float64,
                                                   device=device)))
    except Exception:  # noqa: BLE001 - a support that cannot say: judged by its CDF below
        negative = False
    if negative:
        raise ValueError(f"{what}: {type(dist).__name__}'s support includes negative lags; expected a distribution "
                         "over steps >= 0")
    try:
        if support.is_discrete:
            inside = support.check(steps)
            p = torch.zeros(T, dtype=torch.float64, device=device)
            if bool(inside.any()):
                p[inside] = dist.log_prob(steps[inside]).to(torch.float64).exp()
            cdf = p.cumsum(0)
            upper = getattr(support, "upper_bound", None)
            if upper is not None and float(upper) < T:  # all the mass is within the run
                cdf[int(float(upper)):] = 1.0
        else:
            import copy

            quiet = copy.copy(dist)
            quiet._validate_args = False  # the CDF at steps outside a bounded support (clamped below)
            cdf = quiet.cdf(steps).to(torch.float64)
    except NotImplementedError:
        raise ValueError(f"{what}: {type(dist).__name__} has no {'log_prob' if support.is_discrete else 'cdf'}; "
                         "give a quantile function u -> lags instead") from None
    cdf = cdf.nan_to_num(0.0).clamp(0.0, 1.0).cummax(0).values
    if bool(cdf[0] < 0) or not bool(torch.isfinite(cdf).all()):
        raise ValueError(f"{what}: {type(dist).__name__} gave no usable CDF over steps >= 0")
    return _TableQuantile(cdf)


class _TableQuantile:
    """``min{k : cdf[k] > u}`` (``len(cdf)`` when none: beyond the run)."""

    def __init__(self, cdf: torch.Tensor):
        self.cdf = cdf.contiguous()

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        if self.cdf.device != u.device:  # (the run's device: the table moved once)
            self.cdf = self.cdf.to(u.device)
        return torch.searchsorted(self.cdf, u.contiguous(), right=True)


def _is_conjugate_linear(model) -> bool:
    """Whether ``model`` can learn a subset of its replications at a step, exactly
    (``BayesianLinear._update_elements``: conjugate, no forgetting, decay or change detection)."""
    from .models.linear import BayesianLinear

    return (type(model) is BayesianLinear and bool(model.conjugate) and model.forgetting is None
            and getattr(model, "decay", None) is None and getattr(model, "_detector", None) is None)


def _model_learners(policy, learned: list[int]):
    """``[(model, metric column)]`` for a policy whose ``update`` is each model learning its own metric
    (nothing else), else None."""
    from .policies.greedy import Greedy
    from .policies.thompson import ThompsonSampling
    from .policies.ts_asc import TSASC
    from .policies.ucb import LinUCB

    update = getattr(type(policy), "update", None)
    if update is TSASC.update:
        if getattr(policy, "chance_recalibrate", False):
            return None
        return [(policy.reward_model, 0), *zip(policy.constraint_models, learned[1:])]
    if update in (ThompsonSampling.update, Greedy.update, LinUCB.update):
        return [(policy.model, 0)]
    return None


def _late_whole_refusal(policy) -> str | None:
    """Why ``policy.update`` cannot take a decision's outcomes after later ``select`` calls (None: it can)."""
    from .policies.clucb import CLUCB, CLUCB2ASC
    from .policies.ts_asc import TSASC

    if isinstance(policy, CLUCB) or (isinstance(policy, CLUCB2ASC) and policy.mode == "cumulative"):
        return f"{type(policy).__name__}'s update settles the step of the last select (its conservative sums)"
    if isinstance(policy, TSASC) and getattr(policy, "chance_recalibrate", False):
        return "TS-ASC with chance_recalibrate records each update against the last select's claims"
    return None


class _Delivery:
    """Delivers each metric's outcomes at ``t + lag`` (``simulate``'s ``delays``).

    Modes: ``"step"`` (every metric the policy learns arrives at once: the loop's own update),
    ``"whole"`` (they share one fixed lag ``L > 0``: ``policy.update`` of the decision of step
    ``t - L`` at step ``t``, from a ring of ``L + 1`` steps' tensors) and ``"models"`` (each model
    learns its metric: a fixed lag from the ring, a random one from buffers ``[W, R, ...]`` with
    the rows due at each step found once by one stable sort of the due steps, learned in one
    ``_update_elements`` call per model and step). Random lags are drawn for the whole run before
    it starts (the same numbers as per step: a stream gives its numbers in order).
    """

    def __init__(self, lags: dict[int, object], policy, lean, columns, names: list[str], T: int, R: int, rng):
        M = len(names)
        self.T, self.R, self.M, self.names = T, R, M, names
        # the metrics the policy learns: the reward, and the constraint columns of a policy with constraint models
        # (a reward-only policy, num_constraints 0, is handed the constraint columns but learns none of them)
        learned = [0]
        if getattr(policy, "num_constraints", 0) or getattr(policy, "metric_names", None) is not None:
            learned += list(range(M))[columns] if isinstance(columns, slice) else list(columns or ())
        self.fixed: dict[int, int] = {m: lags.get(m, 0) for m in range(M) if isinstance(lags.get(m, 0), int)}
        self.random: dict[int, torch.Tensor] = {}  # metric -> lags [T, R] (long; T: never), drawn once checked
        random = [m for m in range(M) if m not in self.fixed]
        described = {names[m]: (str(v) if isinstance(v, int) else repr(getattr(v, "fn", v))) for m, v in lags.items()}
        self.described = described
        fixed_learned = {self.fixed[m] for m in learned if m in self.fixed}
        self.random = dict.fromkeys(random)  # (the lags are drawn below, once the policy is known to take them)
        if all(m in self.fixed for m in learned) and fixed_learned == {0}:
            self.mode = "step"
        elif all(m in self.fixed for m in learned) and len(fixed_learned) == 1:
            self.mode = "whole"
            self.whole_lag = next(iter(fixed_learned))
            why = _late_whole_refusal(policy)
            if why is not None:
                raise ValueError(f"delays: {why}, so it cannot learn a decision {fixed_learned.pop()} steps late; "
                                 "simulate it without delays on the metrics it learns "
                                 f"({[names[m] for m in learned]})")
        else:
            self.mode = "models"
            learners = _model_learners(policy, learned)
            if learners is None:
                raise ValueError(f"delays: {type(policy).__name__} learns {[names[m] for m in learned]} through one "
                                 "update call, so it cannot learn them at different steps or after random lags; give "
                                 "them one fixed lag (an int), or use a policy whose models learn one metric each "
                                 "(TSASC without chance_recalibrate, ThompsonSampling, Greedy, LinUCB)")
            for model, m in learners:
                if m in self.random and not _is_conjugate_linear(model):
                    raise ValueError(f"delays[{names[m]!r}]: a random lag needs a model that learns a subset of "
                                     f"replications at a step (a conjugate BayesianLinear without forgetting, decay or "
                                     f"change detection); {type(policy).__name__}'s model of {names[m]!r} is "
                                     f"{type(model).__name__}; give a fixed lag (an int)")
            self.learners = learners
        for m in random:  # per decision, by inverse CDF of the replications' own uniforms
            u = torch.stack([rng.uniform((), key=f"delay/{names[m]}") for _ in range(T)])  # [T, R]
            self.random[m] = lags[m](u).clamp_(max=T)
        self.lean, self.policy, self.columns = lean, policy, columns
        # pending="margin" (TS-ASC, issue 45): the constraint models whose metric arrives late hold each decision
        # as pending until its outcome is delivered ({constraint model j: metric m})
        self.held: dict[int, int] = {}
        if getattr(policy, "pending", "ignore") != "ignore" and self.mode != "step":
            for j in range(len(policy.constraint_models)):
                m = learned[j + 1] if j + 1 < len(learned) else None  # the metric constraint model j learns
                if m is not None and (m in self.random or self.fixed[m] > 0):
                    self.held[j] = m
        self.held_cols = sorted(self.held)
        from .policies._fast import update_model

        self.update_model = update_model  # a model's update of rows checked here (TS-ASC's own path)
        horizon_fixed = max([v for m, v in self.fixed.items() if m in learned and v < T] or [0])
        self.ring_size = horizon_fixed + 1
        self.ring: list = [None] * self.ring_size
        # random lags: [W, R, d + M] features and outcomes of the last W steps (made at the first step)
        self.buffer = self.d = None
        self.buffered = self.mode == "models" and any(m in self.random for _, m in self.learners)
        if self.buffered:
            due_lags = torch.cat([self.random[m][self.random[m] < T] for _, m in self.learners if m in self.random])
            self.W = int(due_lags.max()) + 1 if due_lags.numel() else 1
            self.schedule = {}
            for _, m in self.learners:
                if m not in self.random or m in self.schedule:
                    continue
                steps = torch.arange(T, device=self.random[m].device)[:, None]  # (the run's device)
                due = (steps + self.random[m]).reshape(-1)
                order = torch.sort(due, stable=True).indices  # by due step, then decision step, then replication
                order = order[: int((due < T).sum())]
                bounds = torch.zeros(T + 1, dtype=torch.long, device=due.device)
                bounds[1:] = torch.bincount(due[due < T], minlength=T).cumsum(0)
                s, r = order // R, order % R
                # per due row: its replication, and its row in the buffers' flat [W * R] view
                self.schedule[m] = (r, (s % self.W) * R + r, bounds.tolist())

    def step(self, t: int, chosen: torch.Tensor, obs: torch.Tensor, a: torch.Tensor) -> None:
        """After step ``t``'s decision: keep its rows, deliver what is due at ``t``."""
        ring, n = self.ring, self.ring_size
        ring[t % n] = (chosen, obs, a)
        if self.held:  # pending="margin": the decision's late constraint metrics held as pending
            self.policy.hold_pending(chosen, self.held_cols)
        if self.mode == "whole":
            s = t - self.whole_lag
            if s >= 0:
                x, o, act = ring[s % n]
                if self.held:
                    self.policy.release_pending(x, self.held_cols)
                if self.lean is not None:
                    self.lean.update(x, o[:, 0])
                else:
                    cols = self.columns
                    self.policy.update(x, o[:, 0], o[:, cols] if cols is not None else None, actions=act)
            return
        if self.buffered:  # random lags: the step's chosen features and outcomes, side by side
            buffer, d = self.buffer, self.d
            if buffer is None:
                d = self.d = chosen.shape[-1]
                buffer = self.buffer = torch.empty(self.W, self.R, d + self.M, dtype=torch.float64, device=chosen.device)
            row = buffer[t % self.W]
            row[:, :d] = chosen
            row[:, d:] = obs
            flat = buffer.view(-1, d + self.M)
        for model, m in self.learners:
            if m in self.random:
                r, at, bounds = self.schedule[m]
                lo, hi = bounds[t], bounds[t + 1]
                if hi > lo:  # the rows due now, of any earlier step, learned in one call
                    rows = flat.index_select(0, at[lo:hi])
                    j = self._held_column(model)
                    if j is not None:
                        self.policy.release_pending(rows[:, :d], [j], index=r[lo:hi])
                    model._update_elements(r[lo:hi], rows[:, :d], rows[:, d + m])
                continue
            s = t - self.fixed[m]
            if s >= 0:
                x, o, act = ring[s % n]
                j = self._held_column(model)
                if j is not None:
                    self.policy.release_pending(x, [j])
                self.update_model(model, x, o[:, m], act)

    def _held_column(self, model) -> int | None:
        """The constraint model index ``j`` of ``model`` when it holds pending rows (``pending="margin"``), else None."""
        if not self.held:
            return None
        for j in self.held_cols:
            if self.policy.constraint_models[j] is model:
                return j
        return None

    def learned_at(self) -> torch.Tensor:
        """``[T, R, M]`` int32: the step each outcome was delivered at, -1 when never (pending at the end)."""
        T, R, M = self.T, self.R, self.M
        out = torch.empty(T, R, M, dtype=torch.int32, device="cpu")
        steps = torch.arange(T, dtype=torch.int32, device="cpu")
        for m in range(M):
            if m in self.random:
                due = self.random[m].to(device="cpu", dtype=torch.int32) + steps[:, None]  # (the trace: on the CPU)
            else:
                due = (steps + min(self.fixed[m], T))[:, None].expand(T, R)
            out[..., m] = torch.where(due < T, due, -1)
        return out


def _step_generator(seeds: list[int], t: int, device=None) -> torch.Generator:
    """The problem's generator of step ``t``: seeded from the run's seeds and ``t`` only (on the CPU: the
    problems draw their numbers there and move them, the same numbers on every device)."""
    state = np.random.SeedSequence([*seeds, t]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device="cpu").manual_seed(int(state[0]) << 32 | int(state[1]))


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


def _check_units(units, R: int, t: int, device=None) -> Units:
    """The ``Units`` of ``problem.draw(R, generator)``, checked and converted (features float64, on the
    run's ``device``: a user's problem that draws on the CPU is moved there)."""
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
    if device is not None and feats.device != device:
        feats = feats.to(device)
    K = feats.shape[1]
    base = units.baseline
    if isinstance(base, (int, np.integer)) and not isinstance(base, bool):
        base = torch.full((R,), int(base), dtype=torch.long, device=feats.device)
    base = torch.as_tensor(np.asarray(base) if not isinstance(base, torch.Tensor) else base, device=feats.device)
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
        valid = torch.as_tensor(np.asarray(valid) if not isinstance(valid, torch.Tensor) else valid, device=feats.device)
        if valid.dtype != torch.bool or tuple(valid.shape) != (R, K):
            raise ValueError(f"problem.draw returned valid of dtype {valid.dtype} and shape {list(valid.shape)} at "
                             f"step {t}; expected a bool mask [{R}, {K}] (or None)")
    return Units(feats, base, valid, units.context)


def _judge(means: torch.Tensor, units, declared, index: dict, rows: torch.Tensor):
    """What a step's mean table ``[R, K, M]`` says, per the declared constraints (``simulate``'s
    docstring, step 4): ``(broken [R, K, C], any_broken [R, K], base_means [R, M], best [R])``.

    ``broken[r, k, j]``: action ``k``'s true means break constraint ``j`` (``Constraint.violated``:
    a relative constraint never marks the baseline action itself, an absolute one judges it like
    any action). ``best``: the largest true reward among the allowed actions
    (``units.valid``) that break none, the baseline allowed when it breaks none; a unit with no
    such action gets its baseline's reward (the comparator of the regret).
    """
    R, K = means.shape[0], means.shape[1]
    base = units.baseline
    base_means = means[rows, base]
    columns = []
    for c in declared:
        columns.append(c.violated(means[..., index[c.metric]], base))
    if len(columns) == 1:
        any_broken = columns[0]
        broken = any_broken[..., None]
    elif columns:
        broken = torch.stack(columns, -1)
        any_broken = broken.any(-1)
    else:
        broken = torch.zeros(R, K, 0, dtype=torch.bool, device=means.device)
        any_broken = torch.zeros(R, K, dtype=torch.bool, device=means.device)
    feasible = ~any_broken
    if units.valid is not None:
        feasible &= units.valid
        feasible[rows, base] = ~any_broken[rows, base]  # the baseline is allowed even when masked
    best = means[..., 0].masked_fill(~feasible, float("-inf")).max(-1).values
    if declared or units.valid is not None:
        none = best == float("-inf")  # no allowed action meets every constraint: the baseline's reward
        best = torch.where(none, base_means[:, 0], best)
    return broken, any_broken, base_means, best


def _run(policy, problem, T: int, seed, *, progress: bool | str, callback, generator=None,
         record: tuple[str, ...] = TRACE_FIELDS, delays: dict[int, object] | None = None,
         device: torch.device | None = None) -> Trace:
    """The loop of ``simulate`` (see its docstring)."""
    device = torch.device("cpu") if device is None else device
    from .envs.problem import chosen_rows, expected_table, outcome_metrics

    R = int(problem.replications)
    names = [str(n) for n in problem.metric_names]
    M = len(names)
    name = str(getattr(problem, "name", None) or type(problem).__name__)
    declared = tuple(getattr(problem, "constraints", ()) or ())
    columns = _constraint_columns(policy, names, name)
    models = dict(policy.models()) if callable(getattr(policy, "models", None)) else {}
    for role, m in models.items():
        shape = getattr(m, "batch_shape", None)
        if shape is not None and tuple(shape) != (R,):
            raise ValueError(f"policy: its {role} model has batch_shape {list(shape)} but problem {name!r} has {R} "
                             f"replication(s); build the models with batch_shape=[{R}] (one posterior per replication)")
    index = {n: m for m, n in enumerate(names)}
    if generator is None:
        seeds = replication_seeds(seed, R)
        rng = ReplicationRNG(seeds) if device.type == "cpu" else CounterRNG(seeds, device=device)
    else:  # the seed of each row (shared streams map rows to replications)
        rng = generator
        rows_of = getattr(generator, "rows", None)
        seeds = list(generator.seeds) if rows_of is None else [generator.seeds[int(i)] for i in rows_of]
    shared_streams = bool(getattr(problem, "replication_streams", False))
    # the library's own problems return float64 tensors of the right shapes: their outputs are not re-checked
    checked = not getattr(problem, "_trusted_outputs", False)
    rows = torch.arange(R, device=device)
    if columns is not None and columns == list(range(1, M)):
        columns = slice(1, M)  # a view, as before
    rec = _Recorder(record, T, R, M, declared, index, rows, trusted_baseline=not checked, device=device)
    timed = _draw_takes_step(problem)
    lean = _lean_thompson(policy)
    falls = _FallbackRecord.of(policy, T, R, device) if lean is None else None
    chance = _ChanceRecord.of(policy, names, columns, T, R, device) if lean is None else None
    if lean is not None:
        from .models.linear import _ThompsonStep

        lean_step = _ThompsonStep(lean, rng, "reward")
    delivery = late = None
    if delays is not None:  # checked before the loop: a policy that cannot take them is refused here
        delivery = _Delivery(delays, policy, lean_step if lean is not None else None, columns, names, T, R, rng)
        late = delivery if delivery.mode != "step" else None

    available = True
    steps = range(T)
    from .progress import progress_bar

    bar = progress_bar(T, f"simulate {name}", unit="step", progress=progress)  # "auto": only a long run shows one
    start = time.perf_counter()
    # Inference mode trims per-op bookkeeping (measured: +17% decisions/s at R = 1). It is
    # used only when every model of the policy is an exact conjugate posterior or samples without
    # gradients (the Gibbs engine: ``needs_autograd = False``): models that train by gradient
    # (NUTS, SVI, the probit GP) need autograd inside ``update``.
    no_autograd = all(getattr(m, "conjugate", False) or getattr(m, "needs_autograd", True) is False
                      for m in models.values())
    grad_mode = torch.inference_mode() if no_autograd else contextlib.nullcontext()
    user = (lambda: torch.inference_mode(False)) if no_autograd and checked else contextlib.nullcontext
    # what reaches the policy is checked here first (user problems) or made by the library:
    # the policy's own scans of the values are skipped
    with single_thread(), grad_mode, trusted_inputs():
        for t in steps:
            with user():
                stream = rng if shared_streams else _step_generator(seeds, t, device)
                raw = problem.draw(R, stream, step=t) if timed else problem.draw(R, stream)
                units = _check_units(raw, R, t, device) if checked else raw
            K = units.features.shape[1]
            try:
                if lean is not None and units.features.shape[-1] == lean.dim:
                    a = lean_step.choose(units.features, units.valid)
                else:
                    a = policy.select(units.features, units.baseline, generator=rng, valid=units.valid)
            except ValueError as exc:
                if not checked or not str(exc).startswith("features"):
                    raise
                raise ValueError(f"problem.draw returned features of shape {list(units.features.shape)} at step {t} "
                                 f"that the policy does not accept: {exc}") from exc
            if falls is not None:
                falls.step(t, policy)
            with user():
                obs = outcome_metrics(problem.outcomes(raw, a.clone() if checked else a))
                if checked:
                    obs = _as_float64(obs, "problem.outcomes", t, (R, M), names).to(device)
                means = expected_table(problem, raw) if available else None
                if means is None and available:
                    if t > 0:
                        raise ValueError(f"problem.expected returned None at step {t} after returning means at "
                                         "earlier steps; return means always or never")
                    available = False
                elif means is not None and checked:
                    means = _as_float64(means, "problem.expected", t, (R, K, M), names).to(device)
            if chance is not None:
                chance.step(t, policy, a, units, means, rows)
            chosen = chosen_rows(units.features, rows, a)
            if late is not None:  # delays: the outcomes due at this step (issue 45)
                late.step(t, chosen, obs, a)
            elif lean is not None:
                lean_step.update(chosen, obs[:, 0])
            else:
                policy.update(chosen, obs[:, 0], obs[:, columns] if columns is not None else None, actions=a)
            rec.step(t, a, units, obs, means)
            if callback is not None:
                mean = means[rows, a] if means is not None else torch.full((R, M), float("nan"), dtype=torch.float64,
                                                                            device=device)
                callback(t, {"actions": a, "expected": mean, "observed": obs, "policy": policy, "units": units})
            bar.update(1)
        rec.flush(T)
    bar.close()
    if device.type != "cpu":  # a posterior factor that failed on the device, even with jitter: raised now
        from .models._gaussian import check_device_factors

        check_device_factors(device)
    elapsed = time.perf_counter() - start
    fields = rec.finish(available)
    alpha = getattr(problem, "alpha", None)
    if not isinstance(alpha, float):
        relative = [c for c in declared if c.versus_baseline and not c.at_most]
        alpha = 1.0 - relative[0].bound if len(relative) == len(declared) == 1 else None
    attrs = {"problem": name, "policy": type(policy).__name__, "elapsed_seconds": elapsed,
             "decisions_per_second": T * R / max(elapsed, 1e-12), "regret_available": available,
             "constraints": [c.to_dict() for c in declared]}
    if record != TRACE_FIELDS:
        attrs["recorded"] = list(record)
        attrs["shape"] = [T, R]
    if chance is not None:
        fields["chance_claims"] = chance.finish(available)
    if falls is not None:
        fields.update(fallback=falls.fallback, fallback_by=falls.by)
        attrs["fallback_constraints"] = falls.guards
    if delivery is not None:
        fields["learned_at"] = learned = delivery.learned_at()
        attrs["delays"] = delivery.described
        attrs["delivery"] = delivery.mode
        attrs["pending_at_end"] = {n: int((learned[..., m] < 0).sum()) for m, n in enumerate(names)}
    if device.type != "cpu":  # the trace on the CPU, moved once
        fields = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in fields.items()}
    return Trace(**fields, metric_names=names, alpha=alpha, seeds=seeds, attrs=attrs)


class _FallbackRecord:
    """The trace's ``fallback [T, R]`` and ``fallback_by [T, R, G]`` (issue 39): the policy's
    ``last_fallback`` / ``last_fallback_by`` after each ``select``, copied in (two small copies per
    step, only for a policy that can fall back: ``Policy.fallback_constraints`` not None)."""

    def __init__(self, policy, guards, T: int, R: int, device=None):
        self.guards = [c.to_dict() if callable(getattr(c, "to_dict", None)) else str(c) for c in guards]
        self.name = type(policy).__name__
        # made outside inference mode: the trace's tensors are ordinary tensors
        self.fallback = torch.zeros(T, R, dtype=torch.bool, device=device)
        self.by = torch.zeros(T, R, len(self.guards), dtype=torch.bool, device=device)

    @classmethod
    def of(cls, policy, T: int, R: int, device=None):
        guards = getattr(policy, "fallback_constraints", None)
        return None if guards is None else cls(policy, tuple(guards), T, R, device)

    def step(self, t: int, policy) -> None:
        fell, by = policy.last_fallback, policy.last_fallback_by
        if fell is None or by is None:
            raise ValueError(f"policy: {self.name} declares fallback_constraints but its select set no last_fallback "
                             "/ last_fallback_by (bool [R] and [G, R]; bayes_safe.policies.base.Policy)")
        self.fallback[t] = fell
        self.by[t] = by.mT


class _ChanceRecord:
    """The trace's ``chance_claims`` (issue 39): per step, the posterior probability a policy with
    chance constraints (``chance_guards``, ``last_chance_claims``: TS-ASC) gave the played action per
    chance constraint, whether the problem's true means meet it, and, summed over replications, the
    reliability bins of every candidate action (allowed or not). Vectorised over replications: a
    gather and three ``scatter_add`` per step; made only for a policy with chance constraints."""

    #: inner edges of the reliability bins of claimed probability (``bucketize``, right-closed: the
    #: last bin holds exactly 1, all S draws safe)
    EDGES = (0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 1.0)

    def __init__(self, guards, names: list[str], columns, T: int, R: int, device=None):
        index = {n: m for m, n in enumerate(names)}
        learned = [0, *(list(range(1, len(names))) if columns is None else
                        (list(range(len(names)))[columns] if isinstance(columns, slice) else list(columns)))]
        self.guards = [c for _, c in guards]
        # the problem's metric column each chance constraint is judged on
        self.cols = [index.get(c.metric, learned[m] if m < len(learned) else m) for m, c in guards]
        G, B = len(self.guards), len(self.EDGES) + 1
        self.G, self.B = G, B
        self.edges = torch.tensor(self.EDGES, dtype=torch.float64, device=device)
        # made outside inference mode: the trace's tensors are ordinary tensors
        self.claimed = torch.full((T, R, G), float("nan"), dtype=torch.float64, device=device)
        self.met = torch.zeros(T, R, G, dtype=torch.bool, device=device)
        self.allowed = torch.zeros(T, R, dtype=torch.bool, device=device)
        self.count = torch.zeros(T, G, 2 * B, dtype=torch.float64, device=device)
        self.met_count = torch.zeros(T, G, 2 * B, dtype=torch.float64, device=device)
        self.claimed_sum = torch.zeros(T, G, 2 * B, dtype=torch.float64, device=device)

    @classmethod
    def of(cls, policy, names, columns, T: int, R: int, device=None):
        guards = tuple(getattr(policy, "chance_guards", ()) or ())
        return cls(guards, names, columns, T, R, device) if guards else None

    def step(self, t: int, policy, a: torch.Tensor, units, means, rows) -> None:
        claims = getattr(policy, "last_chance_claims", None)
        if claims is None:
            raise ValueError(f"policy: {type(policy).__name__} declares chance_guards but its select set no "
                             "last_chance_claims ((probabilities [G, R, K], allowed [R, K]))")
        probs, allowed = claims
        self.claimed[t] = probs[:, rows, a].mT
        self.allowed[t] = allowed[rows, a]
        if means is None:
            return
        base = units.baseline
        met = torch.stack([c.satisfied(means[..., col], means[rows, base, col])
                           for c, col in zip(self.guards, self.cols)])  # [G, R, K]
        for j, c in enumerate(self.guards):
            if c.versus_baseline:
                met[j, rows, base] = True  # the baseline meets a bound relative to itself (simulate's rule)
        self.met[t] = met[:, rows, a].mT
        G = self.G
        flat = (torch.bucketize(probs, self.edges, right=True) + self.B * allowed.long()).reshape(G, -1)
        self.count[t].scatter_add_(1, flat, torch.ones(flat.shape, dtype=torch.float64, device=flat.device))
        self.met_count[t].scatter_add_(1, flat, met.reshape(G, -1).to(torch.float64))
        self.claimed_sum[t].scatter_add_(1, flat, probs.reshape(G, -1).to(torch.float64))

    def finish(self, available: bool) -> dict:
        T, G, B = self.count.shape[0], self.G, self.B
        shape = (T, G, 2, B)
        return {"labels": [c.describe() for c in self.guards], "confidence": [float(c.confidence) for c in self.guards],
                "constraints": [c.to_dict() for c in self.guards], "edges": list(self.EDGES),
                "claimed": self.claimed, "met": self.met, "allowed": self.allowed, "truth_available": bool(available),
                "count": self.count.view(shape), "met_count": self.met_count.view(shape),
                "claimed_sum": self.claimed_sum.view(shape)}


def _draw_takes_step(problem) -> bool:
    """Whether ``problem.draw`` takes the step (a parameter named ``step``, positional-or-keyword or
    keyword-only): the Problem protocol's time-varying problems, asked once per run."""
    try:
        parameter = inspect.signature(problem.draw).parameters.get("step")
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return parameter is not None and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                        inspect.Parameter.KEYWORD_ONLY)


def _constraint_columns(policy, names: list[str], name: str) -> list[int] | None:
    """The problem's metric columns the policy's constraint models learn, in the order of its
    ``update(..., constraints [R, C])``; None when it learns none.

    A policy with ``metric_names`` (TS-ASC's, reward first) names them; otherwise the policy has
    one constraint model per metric after the reward, in the problem's order (its
    ``constraints``, when given, must name those metrics in that order)."""
    M = len(names)
    own = getattr(policy, "metric_names", None)
    if own is not None:
        own = [str(n) for n in own]
        unknown = [n for n in own if n not in names]
        if unknown:
            raise ValueError(f"policy: its metric_names {own} name {unknown}, not metrics of problem {name!r} "
                             f"({names})")
        if own[0] != names[0]:
            raise ValueError(f"policy: its metric_names start with {own[0]!r} but the reward (metric 0) of problem "
                             f"{name!r} is {names[0]!r}; give the reward first")
        return [names.index(n) for n in own[1:]] or None
    needed = getattr(policy, "num_constraints", 0)
    if needed and needed != M - 1:
        raise ValueError(f"policy: it models {needed} constraint metrics but problem {name!r} has {M - 1} "
                         f"({names[1:]}); give one constraint model per constraint metric (or name the "
                         "metrics each model learns with metric_names=)")
    for j, c in enumerate(getattr(policy, "constraints", None) or ()):
        metric = getattr(c, "metric", None)
        if isinstance(metric, str) and j + 1 < M and metric != names[j + 1]:
            raise ValueError(f"policy: its constraints[{j}] guards {metric!r} but its constraint model {j} learns "
                             f"metric {j + 1} of problem {name!r}, {names[j + 1]!r}; declare the "
                             "constraints in the order of the problem's metric_names")
    return list(range(1, M)) if M > 1 else None


def _lean_thompson(policy):
    """The model of a plain ``ThompsonSampling`` over a conjugate, known-noise ``BayesianLinear``
    (the lean path of the loop), else None.

    On that path a ``models.linear._ThompsonStep`` made once per run decides (the draw, the
    scores and the argmax fused) and updates: the same operations ``policy.select`` and
    ``policy.update`` run (so the same numbers, tested), without their per-call checks of data the
    loop made itself. Subclasses of either class take the general path.
    """
    from .models.linear import BayesianLinear
    from .policies.thompson import ThompsonSampling

    if type(policy) is not ThompsonSampling:
        return None
    model = policy.model
    if type(model) is not BayesianLinear or not model.conjugate or model.noise_prior is not None:
        return None
    return model


class _Recorder:
    """The trace's fields, written into preallocated ``[T, R, ...]`` tensors a chunk of steps at a time.

    Each step hands over its actions ``[R]``, units, observations ``[R, M]`` and mean table
    ``[R, K, M]`` (or None); ``step`` only keeps references (list appends and identity checks).
    ``flush`` writes the pending steps: one ``torch.stack(out=)`` per per-step field, and the
    fields judged from the mean table (``expected``, ``regret``, ``violation``,
    ``constraint_violation``, ...) by one gather each over the chunk, which is why a chunk ends
    when the table changes (fixed arms give the same table, baseline and mask every step: judged
    once per chunk). Only the fields
    in ``record`` are computed. With one declared constraint, ``violation`` is a view of
    ``constraint_violation`` (the same numbers; one gather fills both).
    """

    def __init__(self, record: tuple[str, ...], T: int, R: int, M: int, declared, index, rows, trusted_baseline: bool,
                 device=None):
        self.record, self.T, self.R, self.M = record, T, R, M
        self.declared, self.index, self.rows = declared, index, rows
        self.trusted_baseline = trusted_baseline
        shapes = {"actions": ((T, R), torch.long), "baseline": ((T, R), torch.long),
                  "expected": ((T, R, M), torch.float64), "baseline_expected": ((T, R, M), torch.float64),
                  "observed": ((T, R, M), torch.float64), "optimal_reward": ((T, R), torch.float64),
                  "regret": ((T, R), torch.float64), "violation": ((T, R), torch.bool),
                  "constraint_violation": ((T, R, len(declared)), torch.bool)}
        # made outside inference mode: the trace's tensors are ordinary tensors
        self.out = {f: torch.empty(*shapes[f][0], dtype=shapes[f][1], device=device) for f in record}
        self.C = len(declared)
        if self.C == 1 and "constraint_violation" in self.out:
            # one constraint: "any" is that constraint's column (a view; contiguous, as C = 1)
            self.single = self.out["constraint_violation"][..., 0]
            if "violation" in self.out:
                self.out["violation"] = self.single
        judged = ("expected", "baseline_expected", "optimal_reward", "regret", "violation", "constraint_violation")
        self.judging = any(f in record for f in judged)
        self.needs_actions = "actions" in record or any(
            f in record for f in ("expected", "regret", "violation", "constraint_violation"))
        self.chunk = _chunk_steps(R)
        self.scratch = None if "actions" in record or not self.needs_actions else torch.empty(
            min(self.chunk, T), R, dtype=torch.long, device=device)
        self.t0 = 0
        self.actions: list[torch.Tensor] = []
        self.observed: list[torch.Tensor] = []
        self.baselines: list[tuple[int, torch.Tensor]] = []  # (first step, baseline [R]) of each run of one tensor
        self.judged = None  # (means, baseline, valid, broken, any_broken, base_means, best) of the current table

    def step(self, t: int, a: torch.Tensor, units, obs: torch.Tensor, means: torch.Tensor | None) -> None:
        """Keep step ``t``'s tensors (by reference) until its chunk is written."""
        if means is not None and self.judging:
            j = self.judged
            if j is None or not (means is j[0] and units.baseline is j[1] and units.valid is j[2]):
                self.flush(t)
                self.judged = (means, units.baseline, units.valid, *self._judge(means, units))
        if t - self.t0 >= self.chunk:
            self.flush(t)
        if self.needs_actions:
            self.actions.append(a)
        if "observed" in self.record:
            self.observed.append(obs)
        if "baseline" in self.record:
            base = units.baseline
            if not self.trusted_baseline:  # a user's tensor: copied now, they may reuse it
                self.out["baseline"][t] = base
            elif not self.baselines or self.baselines[-1][1] is not base:
                self.baselines.append((t, base))

    def _judge(self, means: torch.Tensor, units):
        """What a mean table ``[R, K, M]`` says: ``(broken [R*K, C], any_broken [R*K], base_means [R, M],
        best [R])`` (see ``_judge``), flattened for the gathers of ``flush``."""
        broken, any_broken, base_means, best = _judge(means, units, self.declared, self.index, self.rows)
        R, K = means.shape[0], means.shape[1]
        return broken.reshape(R * K, self.C), any_broken.reshape(-1), base_means, best

    def flush(self, t: int) -> None:
        """Write the pending steps ``[t0, t)`` into the trace's tensors."""
        t0, n = self.t0, t - self.t0
        if n <= 0:
            return
        out, R = self.out, self.R
        if self.needs_actions:
            A = out["actions"][t0:t] if "actions" in out else self.scratch[:n]
            torch.stack(self.actions, out=A)
            self.actions.clear()
        if "observed" in out:
            torch.stack(self.observed, out=out["observed"][t0:t])
            self.observed.clear()
        if self.baselines:
            for i, (s, base) in enumerate(self.baselines):
                end = self.baselines[i + 1][0] if i + 1 < len(self.baselines) else t
                out["baseline"][s:end] = base
            self.baselines = [(t, self.baselines[-1][1])]
        if self.judged is not None:
            means, _, _, broken, any_broken, base_means, best = self.judged
            K = means.shape[1]
            flat = None
            if any(f in out for f in ("expected", "regret", "violation", "constraint_violation")):
                flat = torch.add(A, self.rows, alpha=K)  # [n, R]: index of (r, A[., r]) in the flat [R * K] table
            if "expected" in out:
                torch.index_select(means.reshape(R * K, self.M), 0, flat.reshape(-1),
                                   out=out["expected"][t0:t].view(n * R, self.M))
            if "baseline_expected" in out:
                out["baseline_expected"][t0:t] = base_means
            if "optimal_reward" in out:
                out["optimal_reward"][t0:t] = best
            if "regret" in out:
                reward = out["expected"][t0:t, :, 0] if "expected" in out else torch.take(means[..., 0], flat)
                torch.sub(best, reward, out=out["regret"][t0:t])
            if "violation" in out:  # with one constraint, this fills constraint_violation too (a view)
                torch.take(any_broken, flat, out=out["violation"][t0:t])
            if "constraint_violation" in out:
                if self.C > 1:
                    torch.index_select(broken, 0, flat.reshape(-1),
                                       out=out["constraint_violation"][t0:t].view(n * R, self.C))
                elif self.C == 1 and "violation" not in out:
                    torch.take(any_broken, flat, out=self.single[t0:t])
        self.t0 = t

    def finish(self, available: bool) -> dict:
        """The trace's fields (None for those not recorded); NaN / False when no means were given."""
        out = self.out
        if not available:
            for f in ("expected", "baseline_expected", "optimal_reward", "regret"):
                if f in out:
                    out[f].fill_(float("nan"))
            for f in ("violation", "constraint_violation"):
                if f in out:
                    out[f].fill_(False)
        return {f: out.get(f) for f in TRACE_FIELDS}


# ---------------------------------------------------------------------- memory, before allocating
def estimate_simulation_bytes(horizon: int, replications: int, num_arms: int, dim: int, num_metrics: int,
                              num_constraints: int = 1) -> dict[str, int]:
    """About the memory ``simulate`` and writing its trace need, from the sizes alone (nothing allocated).

    * ``trace``: the ``Trace``'s ``[T, R, ...]`` tensors (``_Recorder``): ``actions``,
      ``baseline`` (int64), ``optimal_reward``, ``regret`` (float64), ``expected``,
      ``baseline_expected``, ``observed`` (float64 ``[T, R, M]``), ``violation`` and
      ``baseline_played`` (bool), ``constraint_violation`` (bool ``[T, R, C]``);
    * ``output``: what the command line builds from it: the NetCDF file in memory (about the
      trace again) and the per-step summaries (a few float64 ``[T, R]`` temporaries);
    * ``run``: per step, the units' features and means (``[R, K, d]``, ``[R, K, M]`` float64,
      a few copies), and the replications' posteriors (``[R, d, d]`` per metric, a few copies).

    Returns ``{"trace", "output", "run", "total"}`` in bytes (an estimate, not a bound).
    """
    T, R, K, d, M, C = (max(0, int(v)) for v in (horizon, replications, num_arms, dim, num_metrics, num_constraints))
    cells = T * R
    trace = cells * (4 * 8 + 3 * 8 * M + 2 + C)
    output = trace + cells * 3 * 8
    run = R * K * (d + 2 * M) * 8 * 4 + R * max(M, 1) * (d * d + 2 * d) * 8 * 4
    return {"trace": trace, "output": output, "run": run, "total": trace + output + run}


def available_memory_bytes() -> int | None:
    """Memory this process can still take without swapping: ``MemAvailable`` of ``/proc/meminfo``
    (else the available physical pages of ``os.sysconf``), lowered to a cgroup v2 limit's
    headroom when there is one; ``None`` when unknown."""
    import os

    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE")))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit.isdigit():
            found.append(max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    return min(found) if found else None
