"""What every policy answers, and helpers shared by the policies.

A policy acts on a batch of ``R`` replications at once:

* ``select(features [R, K, d], baseline [R] | None, generator=None, valid=None) -> actions [R]``
* ``update(features_chosen [R, d], reward [R], constraints [R, C] | None, actions [R] | None)``

Policies depend only on the posterior interface of their models (``update``, ``predict``,
``sample_at``), never on a model class.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import weakref

import torch

from .. import _validation
from .._validation import as_tensor, check_finite
from ..random import Generator

__all__ = ["Policy", "check_model", "check_select_inputs", "check_step_inputs", "check_update_inputs", "masked_argmax"]


#: ``.on`` while ``Policy.row_probabilities`` asks a policy for many rows of one stream at once: models of
#: batch shape ``[1]`` that draw rows independently (``row_draws``) then take features ``[n, K, d]``
_SEPARATE_ROWS = threading.local()


@contextlib.contextmanager
def _separate_rows():
    before = getattr(_SEPARATE_ROWS, "on", False)
    _SEPARATE_ROWS.on = True
    try:
        yield
    finally:
        _SEPARATE_ROWS.on = before


_CPU = torch.device("cpu")


def model_device(model) -> torch.device:
    """The device of a posterior model's tensors (``model.device``: a ``BayesianLinear``'s prior's); the
    CPU for a model that names none (the probit GP and other CPU-only models). A policy makes the
    tensors it keeps on it; what it makes per step follows the features' device."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else _CPU


def masked_argmax(scores: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """``argmax`` over the last dimension of ``scores [R, K]`` among ``valid [R, K]`` entries."""
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    # ``max`` returns the first maximal index like ``argmax`` and ran 2x faster here
    # (103 us vs 230 us on [1000, 100] float64)
    return scores.max(-1).indices


def check_step_inputs(features: torch.Tensor, baseline: torch.Tensor | None, dim: int | None = None) -> None:
    """Shape checks of one step's ``features [R, K, d]`` and ``baseline [R]`` (kept for callers
    of the old helper; policies use ``check_select_inputs``)."""
    check_select_inputs(features, baseline, None, dim=dim)


#: ``_model_dims`` per model object: a model's shape does not change after construction, and
#: the lookup runs twice per decision
_DIMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _model_dims(model) -> tuple[int | None, int | None, int | None]:
    """``(replications, num_arms, dim)`` a model expects of ``features [R, K, d]`` (None: any).

    Read from the model's ``batch_shape`` (``[R]``: one model per replication), ``num_arms``
    (per-arm models) and ``dim`` / ``input_dim``; wrappers (``model.model``) are unwrapped.
    """
    try:
        return _DIMS[model]
    except (KeyError, TypeError):
        pass
    out = _read_model_dims(model)
    try:
        _DIMS[model] = out
    except TypeError:  # not weakly referenceable: read every time
        pass
    return out


def _read_model_dims(model) -> tuple[int | None, int | None, int | None]:
    m, seen = model, 0
    while m is not None and seen < 4:
        dim = getattr(m, "dim", None)
        if dim is None:
            dim = getattr(m, "input_dim", None)
        if dim is not None or getattr(m, "batch_shape", None) is not None:
            break
        m, seen = getattr(m, "model", None), seen + 1
    if m is None:
        return None, None, None
    batch = tuple(getattr(m, "batch_shape", ()) or ())
    R = int(batch[0]) if len(batch) == 1 else None
    K = getattr(m, "num_arms", None)
    dim = getattr(m, "dim", None)
    if dim is None:
        dim = getattr(m, "input_dim", None)
    return R, (None if K is None else int(K)), (None if dim is None else int(dim))


def check_select_inputs(features, baseline=None, valid=None, *, dim: int | None = None,
                        replications: int | None = None, num_arms: int | None = None,
                        batch_shape: tuple | None = None, require_baseline: str | None = None,
                        empty_rows_ok: bool = False, models=()):
    """Validate and convert the inputs of ``Policy.select``; returns ``(features, baseline, valid)``.

    ``features``: a float tensor ``[R, K, d]`` (``[*batch_shape, K, d]`` when ``batch_shape`` is
    given), converted to float64; ``baseline``: ``None``, or integer action indices ``[R]`` (a
    Python int is broadcast; float or bool indices are an error); ``valid``: ``None`` or a bool
    mask ``[R, K]``. The expected ``R``, ``K`` and ``d`` come from the arguments and from the
    ``models`` (see ``_model_dims``). Shape and dtype checks always run (a few Python
    comparisons); the scans of values (NaN features, baseline range, rows of ``valid`` with no
    allowed action) are skipped for the library's own data (``_validation.trusted()``).

    Errors name the argument and the expected form: ``ValueError`` for shapes and values,
    ``TypeError`` for the wrong kind of object.
    """
    for m in models:
        r, k, d = _model_dims(m)
        if r is not None and replications is None and batch_shape is None:
            replications = r
        if k is not None and num_arms is None:
            num_arms = k
        if d is not None and dim is None:
            dim = d
    if replications == 1 and getattr(_SEPARATE_ROWS, "on", False) and models \
            and all(getattr(m, "row_draws", False) is True for m in models):
        # Policy.row_probabilities: the rows of features [n, K, d] are n decisions of this one stream
        replications = None
    if not isinstance(features, torch.Tensor) or features.dtype != torch.float64:
        if isinstance(features, torch.Tensor) and not (features.dtype.is_floating_point or features.dtype in (
                torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
            raise TypeError(f"features: expected a float tensor [R, K, d], got dtype {features.dtype}")
        features = as_tensor(features, "features")
    lead = tuple(batch_shape) if batch_shape is not None else None
    if lead is None and features.dim() == 2 and replications in (None, 1):
        # one context without the replication axis ([K, d]): a batch of one; the action comes
        # back as shape [1] (``int(action)`` reads it)
        features = features[None]
        if valid is not None and not isinstance(valid, torch.Tensor):
            valid = torch.as_tensor(valid, device=features.device)
        if isinstance(valid, torch.Tensor) and valid.dim() == 1:
            valid = valid[None]
        if isinstance(baseline, torch.Tensor) and baseline.dim() == 0:
            baseline = baseline[None]
    if lead is None:
        if features.dim() != 3:
            raise ValueError(f"features: expected shape [R, K, d] (replications, candidate actions, feature width), "
                             f"got {list(features.shape)}")
    elif tuple(features.shape[:-2]) != lead or features.dim() != len(lead) + 2:
        raise ValueError(f"features: expected shape {[*lead, 'K', 'd']} (batch shape {list(lead)}, candidate actions, "
                         f"feature width), got {list(features.shape)}")
    R, K, d = features.shape[0], features.shape[-2], features.shape[-1]
    if K < 1 or d < 1:
        raise ValueError(f"features: expected at least one candidate action and one feature, got shape {list(features.shape)}")
    if dim is not None and d != dim:
        raise ValueError(f"features: expected width d={dim} (the model's dimension), got {d} (shape {list(features.shape)})")
    if lead is None and replications is not None and R != replications:
        raise ValueError(f"features: expected a batch of R={replications} replications (the model's batch shape), "
                         f"got {R} (shape {list(features.shape)})")
    if num_arms is not None and K != num_arms:
        raise ValueError(f"features: expected K={num_arms} candidate actions (the model's arms), got {K} "
                         f"(shape {list(features.shape)})")
    if not _validation.trusted():
        check_finite(features, "features")
    rows_shape = tuple(features.shape[:-2])
    if baseline is None:
        if require_baseline:
            raise ValueError(f"baseline: {require_baseline} needs the baseline action b_t of every replication "
                             f"(integer indices, shape {list(rows_shape)})")
    else:
        if isinstance(baseline, bool):
            raise TypeError(f"baseline: expected integer action indices (shape {list(rows_shape)}), got a bool")
        if isinstance(baseline, numbers.Integral):
            baseline = torch.full(rows_shape, int(baseline), dtype=torch.long, device=features.device)
        elif not isinstance(baseline, torch.Tensor):
            if isinstance(baseline, numbers.Number):
                raise TypeError(f"baseline: expected integer action indices (shape {list(rows_shape)}), got {baseline!r}")
            try:
                baseline = torch.as_tensor(baseline, device=features.device)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"baseline: expected integer action indices (shape {list(rows_shape)}), "
                                f"got {type(baseline).__name__}") from None
        if baseline.dtype.is_floating_point or baseline.dtype.is_complex or baseline.dtype == torch.bool:
            raise TypeError(f"baseline: expected integer action indices (a long tensor of shape {list(rows_shape)}), "
                            f"got dtype {baseline.dtype}")
        if tuple(baseline.shape) != rows_shape:
            raise ValueError(f"baseline: expected shape {list(rows_shape)} (one action per replication), "
                             f"got {list(baseline.shape)}")
        if baseline.dtype != torch.long:
            baseline = baseline.long()
        if not _validation.trusted() and bool(((baseline < 0) | (baseline >= K)).any()):
            raise ValueError(f"baseline: expected action indices in [0, {K}), got values "
                             f"{sorted(set(baseline.reshape(-1).tolist()))[:10]}")
    if valid is not None:
        if not isinstance(valid, torch.Tensor):
            try:
                valid = torch.as_tensor(valid, device=features.device)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"valid: expected a bool mask of shape {[*rows_shape, K]}, got {type(valid).__name__}") from None
        if valid.dtype != torch.bool:
            raise TypeError(f"valid: expected a bool mask of shape {[*rows_shape, K]} (True = allowed), got dtype {valid.dtype}")
        if tuple(valid.shape) != (*rows_shape, K):
            raise ValueError(f"valid: expected shape {[*rows_shape, K]} (one flag per candidate action), got {list(valid.shape)}")
        if not empty_rows_ok and not _validation.trusted() and not bool(valid.any(-1).all()):
            raise ValueError("valid: some rows allow no action (every row needs at least one True)")
    return features, baseline, valid


def check_update_inputs(features_chosen, reward, constraints=None, *, num_constraints: int = 0, models=(),
                        dim: int | None = None):
    """Validate and convert the inputs of ``Policy.update``; returns ``(features_chosen, reward, constraints)``.

    ``features_chosen [R, d]``, ``reward [R]`` and, for policies with constraint models,
    ``constraints [R, C]``. Converted to float64 tensors; shapes checked against each other
    and against the models' ``dim`` and batch size; NaN/inf scans skipped for trusted data.
    """
    R_model = None
    for m in models:
        r, _, d = _model_dims(m)
        R_model = R_model if r is None else r
        dim = dim if d is None else d
    trusted = _validation.trusted()
    if not isinstance(features_chosen, torch.Tensor) or not features_chosen.dtype.is_floating_point:
        features_chosen = as_tensor(features_chosen, "features_chosen")
    if not isinstance(reward, torch.Tensor) or not reward.dtype.is_floating_point:
        reward = as_tensor(reward, "reward")
    if features_chosen.dim() == 1 and R_model in (None, 1) and reward.dim() == 0:
        # one observation without the replication axis: features [d], reward a scalar, constraints [C]
        features_chosen, reward = features_chosen[None], reward[None]
        if constraints is not None:
            if not isinstance(constraints, torch.Tensor) or not constraints.dtype.is_floating_point:
                constraints = as_tensor(constraints, "constraints")
            if constraints.dim() <= 1:
                constraints = constraints.reshape(1, -1)
    if features_chosen.dim() != 2:
        raise ValueError(f"features_chosen: expected shape [R, d] (the chosen action's features per replication), "
                         f"got {list(features_chosen.shape)}")
    R, d = features_chosen.shape
    if dim is not None and d != dim:
        raise ValueError(f"features_chosen: expected width d={dim} (the model's dimension), got shape {list(features_chosen.shape)}")
    if R_model is not None and R != R_model:
        raise ValueError(f"features_chosen: expected R={R_model} rows (the model's batch shape), got shape {list(features_chosen.shape)}")
    if tuple(reward.shape) != (R,):
        raise ValueError(f"reward: expected shape [{R}] (one observed reward per replication), got {list(reward.shape)}")
    if num_constraints:
        if constraints is None:
            raise ValueError(f"constraints: expected shape [{R}, {num_constraints}] (one column per constraint model), got None")
        if not isinstance(constraints, torch.Tensor) or not constraints.dtype.is_floating_point:
            constraints = as_tensor(constraints, "constraints")
        if tuple(constraints.shape) != (R, num_constraints):
            raise ValueError(f"constraints: expected shape [{R}, {num_constraints}] (one column per constraint model), "
                             f"got {list(constraints.shape)}")
    if not trusted:
        check_finite(features_chosen, "features_chosen")
        check_finite(reward, "reward")
        if num_constraints:
            check_finite(constraints, "constraints")
    return features_chosen, reward, constraints


def check_model(model, name: str, *methods: str):
    """``model`` if it has ``update`` and every method in ``methods``; else a ``TypeError`` naming ``name``."""
    missing = [m for m in ("update", *methods) if not callable(getattr(model, m, None))]
    if missing:
        raise TypeError(f"{name}: expected a posterior model with {', '.join(('update', *methods))} (e.g. a "
                        f"BayesianLinear), got {type(model).__name__} without {', '.join(missing)}")
    return model


class Policy:
    """Base class: subclasses implement ``select`` and, if they learn, ``update``."""

    #: names of the metrics the policy consumes: 0 = reward only; C = reward plus C constraints
    num_constraints: int = 0

    #: whether ``select`` decides the rows of features ``[n, K, d]`` as separate decisions when its
    #: models are of one stream and draw rows independently (``row_probabilities``): a policy that
    #: keeps no state across the rows of one call (Thompson sampling, TS-ASC)
    batched_rows: bool = False

    #: The fallback record (issue 39; ``simulate``, the ``Decider`` and the tuners read it).
    #: ``fallback_constraints``: the declared guards (``bayes_safe.envs.Constraint``) a policy that
    #: can play a fallback when no action is allowed reports against, None for a policy that never
    #: falls back. After each ``select`` such a policy sets ``last_fallback`` (bool, the shape of
    #: the returned actions: the rows where the fallback was played) and ``last_fallback_by``
    #: (bool ``[G, *that shape]``, per guard: the fallback rows that guard bound). TS-ASC off its
    #: paper path sets them (``bayes_safe.policies.ts_asc``).
    last_fallback: torch.Tensor | None = None
    last_fallback_by: torch.Tensor | None = None

    @property
    def fallback_constraints(self) -> tuple | None:
        """The guards the fallback record refers to; None: this policy never falls back (above)."""
        return None

    def select(self, features: torch.Tensor, baseline: torch.Tensor | None = None, generator: Generator = None,
               valid: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def update(self, features_chosen: torch.Tensor, reward: torch.Tensor, constraints: torch.Tensor | None = None,
               actions: torch.Tensor | None = None) -> None:
        return None

    def models(self) -> dict[str, object]:
        """The posterior models this policy keeps, by role (for saving and diagnostics)."""
        return {}

    def _settings(self) -> dict[str, object]:
        """What ``repr`` shows besides the models (subclasses add their own settings)."""
        alpha = getattr(self, "alpha", None)
        if isinstance(alpha, torch.Tensor):
            alpha = [round(a, 6) for a in alpha.reshape(-1).tolist()]
            alpha = alpha[0] if len(alpha) == 1 else alpha
        return {} if alpha is None else {"alpha": alpha}

    def __repr__(self) -> str:
        parts = [f"{role}={model!r}" for role, model in self.models().items()]
        parts += [f"{k}={v!r}" for k, v in self._settings().items()]
        return f"{type(self).__name__}({', '.join(parts)})"

    def action_probabilities(self, features, baseline=None, valid=None, *, num_draws: int = 1000,
                             generator: torch.Generator | None = None, seed: int = 0):
        """The probability of each action under the current posterior, ``([R, K], se [R, K])``.

        A Thompson policy plays the best action of one posterior draw, so the probability of
        action ``k`` is the posterior probability that ``k`` wins (for TS-ASC: wins among the
        actions the same draw deems feasible). It is estimated by ``num_draws`` independent
        draws in one batched call (``bayes_safe.random.DrawBatch``), with the binomial standard
        error ``sqrt(p (1 - p) / num_draws)``. A deterministic policy (Greedy, the UCB
        family) gets probability 1 on its choice and standard error 0.

        A query: no model's state changes (a Gibbs or Langevin chain is not advanced; its draws
        come from copies of the chain, see ``GibbsLinearPosterior._draw_batch`` and
        ``LangevinLinearPosterior._draw_batch`` for how and at what cost; NUTS / SVI models run a
        refit that is due first, as any draw would). Works with every engine, and with models
        without a batch shape (the one-stream case: features ``[K, d]`` give ``[1, K]``).

        Args:
            features: candidates ``[R, K, d]`` (or one context ``[K, d]``), as for ``select``.
            baseline, valid: as for ``select``.
            num_draws: Monte-Carlo draws ``S`` (>= 1).
            generator, seed: the ``torch.Generator`` of the draws, or a seed for a fresh one.
        """
        from ..random import DrawBatch

        features, baseline, valid = check_select_inputs(features, baseline, valid, models=tuple(self.models().values()))
        R, K = int(features.shape[0]), int(features.shape[1])
        draws = DrawBatch(num_draws, R, generator, seed)  # validates num_draws and generator before any draw
        actions = self.select(features, baseline, generator=draws, valid=valid)
        if tuple(actions.shape) == (R,):  # no randomness reached the decision: deterministic
            probs = torch.nn.functional.one_hot(actions, K).to(torch.float64)
            return probs, torch.zeros_like(probs)
        if tuple(actions.shape) != (num_draws, R):
            raise NotImplementedError(f"{type(self).__name__}.action_probabilities: its select returned shape "
                                      f"{list(actions.shape)} for {num_draws} batched draws (expected "
                                      f"[{num_draws}, {R}]); its models do not broadcast a sample dimension")
        probs = torch.nn.functional.one_hot(actions, K).to(torch.float64).mean(0)
        return probs, (probs * (1 - probs) / num_draws).sqrt()

    def row_draws(self) -> bool:
        """Whether ``row_probabilities`` can ask for many rows in one call: the policy decides rows
        separately (``batched_rows``) and every model draws the rows of features ``[n, K, d]``
        independently (``row_draws``: ``BayesianLinear`` of one stream, batch shape ``[]`` or ``[1]``,
        conjugate or NUTS / SVI; not the chain engines, nor batches of several streams)."""
        models = tuple(self.models().values())
        return bool(self.batched_rows and models and all(getattr(m, "row_draws", False) is True for m in models))

    def row_probabilities(self, features, baseline=None, valid=None, *, num_actions=None, num_draws: int = 1000,
                          generator: torch.Generator | None = None, seed: int = 0, batched: bool | None = None,
                          rows_per_call: int | None = None):
        """The probability of every action at ``n`` separate decisions of one stream under the current
        posterior (a decision log's rows), ``([n, K], se [n, K])``.

        Row ``i`` is the decision with candidates ``features[i, :num_actions[i]]``; the rest of the row
        is padding (``K`` is the largest number of candidates), with probability exactly 0. Each
        row's probabilities have the law of ``action_probabilities`` at that row alone (``num_draws``
        posterior draws of its own, independent of the other rows'; standard error
        ``sqrt(p (1 - p) / num_draws)``); no model's state changes.

        Batched (``row_draws()``: TS-ASC or Thompson sampling on models of one stream that draw rows
        independently, the conjugate and NUTS / SVI ``BayesianLinear``): ``rows_per_call``
        rows per call (default ``2**20 // (num_draws K)``) under a ``DrawBatch(independent_rows=True)``,
        the padding masked by ``valid`` (``BayesianLinear._row_draws_at``; TS-ASC with two conjugate
        models, 20,000 rows, 100 draws, d = 90, K = 20: 1.5 s, against 7.3 s row by row, one thread;
        benchmarks/log_propensities.py).
        Otherwise (chain engines: Gibbs, Langevin; other models or policies; ``batched=False``) one
        ``action_probabilities`` call per row on its own candidates, all from one generator: the
        numbers of the row-by-row loop. Both are reproducible given ``seed`` (or the generator's
        state); the two paths use their random numbers differently, so they agree in law, not
        number for number.

        Args:
            features: ``[n, K, d]`` candidates, padded (any values) beyond each row's ``num_actions``.
            baseline: ``[n]`` action indices (each below its row's ``num_actions``) or None.
            valid: ``[n, K]`` bool mask of allowed actions (besides the padding) or None.
            num_actions: ``[n]`` each row's number of candidates (default: all ``K``).
            num_draws: Monte-Carlo draws per row (>= 1).
            generator, seed: the ``torch.Generator`` of the draws, or a seed for a fresh one.
            batched: None (batched when possible), True (``ValueError`` when not possible), False (row
                by row).
            rows_per_call: rows per batched call (memory: about ``rows_per_call num_draws K`` numbers
                per model).
        """
        from ..random import DrawBatch

        if not isinstance(features, torch.Tensor) or features.dtype != torch.float64:
            features = as_tensor(features, "features")
        if features.dim() != 3 or min(features.shape) < 1:
            raise ValueError(f"features: expected shape [n, K, d] (rows, candidate actions, feature width), "
                             f"got {list(features.shape)}")
        n, K = int(features.shape[0]), int(features.shape[1])
        if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 1:
            raise ValueError(f"num_draws: expected an int >= 1, got {num_draws!r}")
        if num_actions is None:
            sizes = torch.full((n,), K, dtype=torch.long, device=features.device)
        else:
            sizes = torch.as_tensor(num_actions, device=features.device).reshape(-1)
            if sizes.dtype.is_floating_point or sizes.dtype == torch.bool or tuple(sizes.shape) != (n,):
                raise ValueError(f"num_actions: expected {n} integers (one per row), got {list(sizes.shape)} {sizes.dtype}")
            sizes = sizes.long()
            if bool(((sizes < 1) | (sizes > K)).any()):
                raise ValueError(f"num_actions: expected integers in [1, {K}], got values "
                                 f"{sorted(set(sizes.tolist()))[:10]}")
        if baseline is not None:
            baseline = torch.as_tensor(baseline, device=features.device).reshape(-1)
            if baseline.dtype.is_floating_point or baseline.dtype == torch.bool or tuple(baseline.shape) != (n,):
                raise ValueError(f"baseline: expected {n} integer action indices (one per row), got "
                                 f"{list(baseline.shape)} {baseline.dtype}")
            baseline = baseline.long()
            outside = (baseline < 0) | (baseline >= sizes)
            if bool(outside.any()):
                row = int(outside.nonzero()[0])
                raise ValueError(f"baseline: row {row}'s baseline {int(baseline[row])} is not one of its "
                                 f"{int(sizes[row])} candidates")
        if valid is not None:
            valid = torch.as_tensor(valid, device=features.device)
            if valid.dtype != torch.bool or tuple(valid.shape) != (n, K):
                raise ValueError(f"valid: expected a bool mask of shape [{n}, {K}], got {list(valid.shape)} {valid.dtype}")
        if generator is None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise TypeError(f"seed: expected an int, got {seed!r}")
            # a CPU generator, as action_probabilities' DrawBatch: the same propensities on every device
            generator = torch.Generator(device="cpu").manual_seed(int(seed))
        elif not isinstance(generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        can = self.row_draws()
        if batched and not can:
            raise ValueError(f"batched: {type(self).__name__} with these models cannot draw a log's rows in one "
                             "call (row_draws() is False: a chain engine, a batch shape, or another policy); "
                             "use batched=None or False")
        probs = torch.zeros((n, K), dtype=torch.float64, device=features.device)
        if batched is False or not can:
            for i in range(n):  # row by row, each on its own candidates: the padding never reaches the policy
                k = int(sizes[i])
                b = None if baseline is None else baseline[i:i + 1]
                v = None if valid is None else valid[i:i + 1, :k]
                p, _ = self.action_probabilities(features[i:i + 1, :k], b, v, num_draws=num_draws, generator=generator)
                probs[i, :k] = p[0]
            return probs, (probs * (1 - probs) / num_draws).sqrt()
        check_finite(features, "features")
        present = torch.arange(K, device=features.device) < sizes[:, None]
        mask = present if valid is None else present & valid
        step = rows_per_call if rows_per_call is not None else max(1, (1 << 20) // (num_draws * K))
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"rows_per_call: expected an int >= 1, got {rows_per_call!r}")
        for start in range(0, n, step):
            stop = min(n, start + step)
            draws = DrawBatch(num_draws, stop - start, generator, independent_rows=True)
            b = None if baseline is None else baseline[start:stop]
            with _separate_rows():
                actions = self.select(features[start:stop], b, generator=draws, valid=mask[start:stop])
            if tuple(actions.shape) == (stop - start,):  # deterministic
                probs[start:stop] = torch.nn.functional.one_hot(actions, K).to(torch.float64)
                continue
            if tuple(actions.shape) != (num_draws, stop - start):
                raise NotImplementedError(f"{type(self).__name__}.row_probabilities: its select returned shape "
                                          f"{list(actions.shape)} for {num_draws} draws of {stop - start} rows")
            flat = actions + torch.arange(stop - start, device=actions.device)[None] * K  # [S, rows]: each row's counts in one bincount
            counts = torch.bincount(flat.reshape(-1), minlength=(stop - start) * K).to(torch.float64)
            probs[start:stop] = counts.reshape(stop - start, K) / num_draws
        if bool(probs[~present].any()):  # the padding is masked out: a policy that played it ignored ``valid``
            raise RuntimeError(f"{type(self).__name__}.row_probabilities: the policy played a padded action "
                               "(it ignored the valid mask)")
        return probs, (probs * (1 - probs) / num_draws).sqrt()

