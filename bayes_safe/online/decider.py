"""``Decider``: a policy in production, one context at a time, with propensities and delayed feedback.

```python
from bayes_safe.online import Decider, DecisionLog

decider = Decider(policy, log=DecisionLog("decisions.sqlite"), update_every=100, seed=0)
d = decider.decide(candidates, baseline=0)    # candidates [K, d]: numpy, list, DataFrame, tensor
...                                            # play d.action; the outcome arrives later
decider.feedback(d.decision_id, reward=1.0, constraints=[0.0])
decider.save("state/")                         # atomic; Decider.load("state/") resumes
```

**Propensities.** A Thompson policy plays the best action of one posterior draw. The decision
records ``propensity = (1 + n_a) / S``: the played draw counted as one of ``S`` draws, the other
``S - 1`` (``num_draws - 1``) drawn independently from the same posterior in one batched call
(``Policy.action_probabilities``), ``n_a`` of which choose the played action ``a``. With
``n_a ~ Binomial(S - 1, p)`` given that ``a`` was played, ``E[1 / propensity] =
(1 - (1 - p)^S) / p``: the inverse propensity that IPS weights by is unbiased for ``1 / p`` up
to ``(1 - p)^S / p`` (negligible for ``S p >> 1``), and the propensity is never 0. (Independent
draws alone would give ``E[p_hat] = p`` but ``E[1 / p_hat] > 1 / p`` by Jensen's inequality, and
``p_hat = 0`` with probability ``(1 - p)^S``.) ``probabilities`` holds every action's frequency among the
same ``S`` draws (so ``probabilities[action] == propensity``), for estimators that need the whole
logging distribution.

**Feedback** may arrive late, out of order, twice (the second is acknowledged and ignored) or
never (the decision stays pending; ``pending`` lists them). It is applied to the posterior in
batches of ``update_every`` (or on ``refresh()``), as production refits are; each application
increments ``model_version``, which every decision records.

Inputs are coerced once at the boundary: candidate features ``[K, d]`` as numpy arrays,
lists, tensors (float32 or float64) or a ``pandas.DataFrame`` whose columns are the
``feature_names``; a list of dicts (one per candidate); or, for per-arm policies (one model per
arm over a shared context) and with ``featurize``, one context as a vector, a dict of named
features or a ``pandas.Series``.
"""

from __future__ import annotations

import base64
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_output_dir
from ..state import StateError, load_state, save_state
from .log import DecisionLog

__all__ = ["Decider", "Decision"]

#: the format of ``decider.json``
FORMAT, VERSION = "bayes_safe.decider", 1


@dataclass(frozen=True)
class Decision:
    """One decision.

    Attributes:
        decision_id: the id to send feedback for.
        action: the action played (index into the candidates).
        propensity: the probability of ``action`` under the posterior that decided (module docstring).
        propensity_se: its Monte-Carlo standard error ``sqrt(p (1 - p) / S)``.
        model_version: how many feedback batches the posterior had learned from.
        probabilities: every action's frequency among the ``S`` draws, the played one among them
            ``[K]`` (``probabilities[action] == propensity``; they sum to 1).
    """

    decision_id: str
    action: int
    propensity: float
    propensity_se: float
    model_version: int
    probabilities: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self) | {"probabilities": list(self.probabilities)}


def _finite(value, what: str) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what}: expected a finite number, got {value!r}")
    return out


def _per_arm(policy) -> int | None:
    """The number of arms when every model of ``policy`` keeps one posterior per arm (a shared context)."""
    arms = {getattr(m, "num_arms", None) for m in policy.models().values()}
    return arms.pop() if len(arms) == 1 and None not in arms else None


class Decider:
    """Wrap a policy (``R = 1``) for production: decide, record the propensity, learn from feedback.

    Args:
        policy: any ``bayes_safe`` policy whose models have ``batch_shape=[1]``.
        feature_names: the names of the ``d`` features (columns of a DataFrame, keys of a dict);
            None: inputs are positional.
        num_draws: ``S``, the Monte-Carlo draws behind each propensity (>= 2).
        update_every: apply feedback to the posterior after this many arrive (>= 1).
        log: a ``DecisionLog`` (or a path to one) that records every decision and feedback.
        featurize: ``context [p] -> candidate features [K, d]`` for shared-weight policies that
            are given one context (not saved: pass it again to ``load``).
        seed: seed of the decisions' random stream.
    """

    def __init__(self, policy, *, feature_names: Sequence[str] | None = None, num_draws: int = 1000,
                 update_every: int = 1, log: DecisionLog | str | Path | None = None,
                 featurize: Callable | None = None, seed: int = 0):
        if not (callable(getattr(policy, "select", None)) and callable(getattr(policy, "update", None))):
            raise TypeError(f"policy: expected a bayes_safe policy (select and update), got {type(policy).__name__}")
        for role, m in policy.models().items():
            shape = getattr(m, "batch_shape", None)
            if shape is not None and tuple(shape) != (1,):
                raise ValueError(f"policy: its {role} model has batch_shape {list(shape)}; a Decider serves one "
                                 "stream of decisions: build the models with batch_shape=[1]")
        if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 2:
            raise ValueError(f"num_draws: expected an int >= 2 (the played draw and at least one more), got {num_draws!r}")
        if isinstance(update_every, bool) or not isinstance(update_every, int) or update_every < 1:
            raise ValueError(f"update_every: expected a positive int, got {update_every!r}")
        if feature_names is not None:
            if isinstance(feature_names, str) or not all(isinstance(n, str) for n in feature_names):
                raise TypeError(f"feature_names: expected a sequence of strings, got {feature_names!r}")
            if len(set(feature_names)) != len(feature_names):
                raise ValueError(f"feature_names: expected distinct names, got {list(feature_names)}")
        if featurize is not None and not callable(featurize):
            raise TypeError(f"featurize: expected a callable context -> [K, d], got {type(featurize).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {seed!r}")
        self.policy = policy
        self.feature_names = None if feature_names is None else list(feature_names)
        self.num_draws = num_draws
        self.update_every = update_every
        self.featurize = featurize
        self.seed = seed
        self.log = DecisionLog(log) if isinstance(log, (str, Path)) else log
        self.model_version = 0
        self.next_id = 0
        self.pending: dict[str, dict] = {}    # decided, no feedback yet
        self.queued: list[dict] = []          # feedback not yet applied to the posterior
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ inputs
    def _vector(self, row, what: str) -> np.ndarray:
        """A dict / Series of named features, in ``feature_names`` order."""
        names = self.feature_names
        if names is None:
            raise ValueError(f"{what}: named features need feature_names= on the Decider")
        row = dict(row)  # a dict or a pandas.Series (index -> value)
        keys = [str(k) for k in row]
        missing = [n for n in names if n not in keys]
        extra = [k for k in keys if k not in names]
        if missing or extra:
            raise ValueError(f"{what}: " + "; ".join(
                x for x in (f"missing feature(s) {missing}" if missing else "",
                            f"unexpected feature(s) {extra}" if extra else "") if x) + f" (expected {names})")
        return np.array([_finite(row[n], f"{what}[{n!r}]") for n in names], dtype=np.float64)

    def _candidates(self, features) -> tuple[torch.Tensor, np.ndarray]:
        """``(candidates [1, K, d] float64, context vector to log)``."""
        import pandas as pd

        context = None
        if isinstance(features, pd.DataFrame):
            rows = [self._vector(r, f"features row {i}") for i, (_, r) in enumerate(features.iterrows())]
            x = np.stack(rows) if rows else np.zeros((0, len(self.feature_names or ())))
        elif isinstance(features, (Mapping, pd.Series)):
            x = context = self._vector(features, "features")
        elif isinstance(features, (list, tuple)) and features and all(isinstance(r, Mapping) for r in features):
            x = np.stack([self._vector(r, f"features[{i}]") for i, r in enumerate(features)])
        else:
            try:
                x = (features.detach().cpu().numpy() if isinstance(features, torch.Tensor)
                     else np.asarray(features, dtype=np.float64))
            except (TypeError, ValueError):
                raise TypeError(f"features: expected candidate features [K, d] (array, list, tensor, DataFrame) or "
                                f"one context [d], got {type(features).__name__}") from None
            if x.dtype == object or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
                raise TypeError(f"features: expected numbers, got dtype {x.dtype}")
            x = x.astype(np.float64)
            if x.ndim == 1:
                context = x
        if not np.isfinite(x).all():
            raise ValueError("features: expected finite numbers, got NaN or inf")
        if x.ndim == 1:  # one context: per-arm models read it directly; shared-weight models need featurize
            arms = _per_arm(self.policy)
            if self.featurize is not None:
                x = np.asarray(self.featurize(x), dtype=np.float64)
                if x.ndim != 2 or not np.isfinite(x).all():
                    raise ValueError(f"featurize: expected finite candidate features [K, d], got shape {list(x.shape)}")
            elif arms is not None:
                x = np.broadcast_to(x, (arms, x.shape[0]))
            else:
                raise ValueError("features: one context [d] needs per-arm models or featurize=; give the candidate "
                                 "features [K, d] of the actions instead")
        if x.ndim != 2 or x.shape[0] < 1:
            raise ValueError(f"features: expected candidate features [K, d] with K >= 1, got shape {list(x.shape)}")
        if self.feature_names is not None and x.shape[1] != len(self.feature_names):
            raise ValueError(f"features: expected {len(self.feature_names)} features {self.feature_names}, got {x.shape[1]}")
        cand = torch.from_numpy(np.ascontiguousarray(x))[None]
        return cand, (context if context is not None else x.reshape(-1))

    def _baseline(self, baseline, K: int):
        if baseline is None:
            return None
        if isinstance(baseline, bool) or not isinstance(baseline, (int, np.integer)):
            raise TypeError(f"baseline: expected an action index (int) or None, got {baseline!r}")
        if not 0 <= int(baseline) < K:
            raise ValueError(f"baseline: expected an action index in [0, {K}), got {baseline}")
        return torch.tensor([int(baseline)])

    # ------------------------------------------------------------------ the loop
    def decide(self, features, baseline: int | None = None, valid=None) -> Decision:
        """Decide one unit: ``features`` (module docstring), the baseline's action, an optional mask ``[K]``."""
        cand, context = self._candidates(features)
        K = int(cand.shape[1])
        base = self._baseline(baseline, K)
        if valid is not None:
            valid = torch.as_tensor(np.asarray(valid))
            if valid.dtype != torch.bool or tuple(valid.shape) != (K,):
                raise ValueError(f"valid: expected a bool mask of the {K} actions, got {list(valid.shape)} {valid.dtype}")
            valid = valid[None]
        with self._lock:
            action = int(self.policy.select(cand, base, generator=self._generator, valid=valid)[0])
            probs, _ = self.policy.action_probabilities(cand, base, valid, num_draws=self.num_draws - 1,
                                                        generator=self._generator)
            S = self.num_draws
            # the frequencies of the S draws, the played one among them (module docstring)
            probs = (probs[0] * (S - 1) + torch.nn.functional.one_hot(torch.tensor(action), K)) / S
            p = float(probs[action])
            decision = Decision(str(self.next_id), action, p, math.sqrt(p * (1 - p) / S), self.model_version,
                                tuple(float(x) for x in probs))
            self.next_id += 1
            if self.log is not None:
                self.log.write_decision(decision.decision_id, action, p, decision.propensity_se, self.model_version,
                                        context, decision.probabilities, None if base is None else int(base))
            self.pending[decision.decision_id] = {"features": cand[0, action].tolist(), "action": action}
        return decision

    def feedback(self, decision_id: str, reward, constraints=None) -> bool:
        """Record the outcome of a decision; True if new, False for a duplicate (ignored).

        Raises ``ValueError`` for an id this Decider never issued."""
        decision_id = str(decision_id)
        reward = _finite(reward, "reward")
        C = int(getattr(self.policy, "num_constraints", 0))
        if C:
            if constraints is None:
                raise ValueError(f"constraints: the policy learns {C} constraint metric(s); give {C} value(s)")
            values = np.atleast_1d(np.asarray(constraints, dtype=object))
            if values.shape != (C,):
                raise ValueError(f"constraints: expected {C} value(s), got {list(np.atleast_1d(constraints))}")
            constraints = [_finite(v, f"constraints[{i}]") for i, v in enumerate(values)]
        elif constraints is not None and len(np.atleast_1d(constraints)):
            raise ValueError("constraints: this policy learns no constraint metric; leave constraints out")
        else:
            constraints = None
        with self._lock:
            entry = self.pending.pop(decision_id, None)
            if entry is None:
                # ids are issued in sequence: an issued id that is no longer pending has had its feedback
                if decision_id.isdigit() and int(decision_id) < self.next_id:
                    return False
                raise ValueError(f"decision_id: unknown decision {decision_id!r} (this Decider issued ids "
                                 f"'0' to '{self.next_id - 1}')")
            if self.log is not None:
                self.log.write_feedback(decision_id, reward, constraints)
            self.queued.append({"decision_id": decision_id, "reward": reward, "constraints": constraints, **entry})
            if len(self.queued) >= self.update_every:
                self.refresh()
        return True

    def refresh(self) -> int:
        """Apply the queued feedback to the posterior now; returns how many were applied."""
        with self._lock:
            n = len(self.queued)
            for q in self.queued:
                x = torch.tensor([q["features"]], dtype=torch.float64)
                c = None if q["constraints"] is None else torch.tensor([q["constraints"]], dtype=torch.float64)
                self.policy.update(x, torch.tensor([q["reward"]], dtype=torch.float64), c,
                                   actions=torch.tensor([q["action"]]))
            self.queued = []
            if n:
                self.model_version += 1
            return n

    # ------------------------------------------------------------------ state
    def save(self, directory) -> Path:
        """Write the policy and this Decider's bookkeeping to ``directory``, whole or not at all."""
        with self._lock:
            meta = {"format": FORMAT, "version": VERSION, "feature_names": self.feature_names,
                    "num_draws": self.num_draws, "update_every": self.update_every, "seed": self.seed,
                    "model_version": self.model_version, "next_id": self.next_id, "pending": self.pending,
                    "queued": self.queued,
                    "generator": base64.b64encode(self._generator.get_state().numpy().tobytes()).decode()}
            with atomic_output_dir(directory, replace=True) as out:
                save_state(self.policy, out / "policy")
                (out / "decider.json").write_text(json.dumps(meta))
        return Path(directory)

    @classmethod
    def load(cls, directory, *, log: DecisionLog | str | Path | None = None, featurize: Callable | None = None) -> Decider:
        """Resume from ``save``: the same posterior, pending decisions and id counter."""
        directory = Path(directory)
        meta_path = directory / "decider.json"
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise StateError(f"{meta_path}: missing; expected a directory written by Decider.save") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateError(f"{meta_path}: not JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise StateError(f"{meta_path}: not a Decider state (format {FORMAT!r})")
        if meta.get("version") != VERSION:
            raise StateError(f"{meta_path}: format version {meta.get('version')!r}; this bayes_safe reads {VERSION}")
        policy = load_state(directory / "policy")
        try:
            out = cls(policy, feature_names=meta["feature_names"], num_draws=meta["num_draws"],
                      update_every=meta["update_every"], log=log, featurize=featurize, seed=meta["seed"])
            out.model_version, out.next_id = int(meta["model_version"]), int(meta["next_id"])
            out.pending = {str(k): {"features": [float(x) for x in v["features"]], "action": int(v["action"])}
                           for k, v in dict(meta["pending"]).items()}
            out.queued = [{"decision_id": str(q["decision_id"]), "reward": float(q["reward"]),
                           "constraints": None if q["constraints"] is None else [float(c) for c in q["constraints"]],
                           "features": [float(x) for x in q["features"]], "action": int(q["action"])}
                          for q in meta["queued"]]
            state = torch.from_numpy(np.frombuffer(base64.b64decode(meta["generator"]), dtype=np.uint8).copy())
            out._generator.set_state(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise StateError(f"{meta_path}: malformed Decider state ({type(exc).__name__}: {exc})") from None
        return out

    def __repr__(self) -> str:
        return (f"Decider({type(self.policy).__name__}, model_version={self.model_version}, decisions={self.next_id}, "
                f"pending={len(self.pending)}, queued={len(self.queued)})")
