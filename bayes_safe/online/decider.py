"""``Decider``: a policy in production, one context at a time, with propensities and delayed feedback.

```python
from bayes_safe.online import Decider, DecisionLog

decider = Decider(policy, log=DecisionLog("decisions.sqlite"), update_every=100, seed=0)
d = decider.decide(candidates, baseline=0)    # candidates [K, d]: numpy, list, DataFrame, tensor
...                                            # play d.action; the outcome arrives later
decider.feedback(d.decision_id, reward=1.0, constraints=[0.0])
decider.save("state/")                         # atomic; Decider.load("state/", log=...) resumes
```

**Propensities.** A Thompson policy plays the best action of one posterior draw. The decision
records ``propensity = (1 + n_a) / S``: ``S`` (``num_draws``) independent draws from the posterior
are made in one batched call (``policy.select`` under a ``bayes_safe.random.DrawBatch``, what
``Policy.action_probabilities`` counts), the first one is played, and ``n_a`` of the other
``S - 1`` choose the played action ``a``. With
``n_a ~ Binomial(S - 1, p)`` given that ``a`` was played, ``E[1 / propensity] =
(1 - (1 - p)^S) / p``: the inverse propensity that IPS weights by is unbiased for ``1 / p`` up
to ``(1 - p)^S / p`` (negligible for ``S p >> 1``), and the propensity is never 0. (Independent
draws alone would give ``E[p_hat] = p`` but ``E[1 / p_hat] > 1 / p`` by Jensen's inequality, and
``p_hat = 0`` with probability ``(1 - p)^S``.) ``probabilities`` holds every action's frequency among the
same ``S`` draws (so ``probabilities[action] == propensity``), for estimators that need the whole
logging distribution.

**Per engine** (``bayes_safe.random.DrawBatch(S, played=True)``; the draws never change a model's
state beyond the played draw, so what is saved after any number of decisions loads):

* conjugate Gaussian / Normal-Inverse-Gamma, NUTS / SVI (``S`` of the stored draws; a refit that
  is due runs first, as for any draw), the probit GP's views (``S`` draws of ``q(w)``, shared by
  the reward and constraint views), per-arm models: ``S`` independent posterior draws in one
  vectorised call; nothing is kept.
* Gibbs (Laplace, Student-t, horseshoe; probit, logistic): the sweep of an ordinary draw runs
  once (latent variables, scales) and its last weight step draws ``S`` weights from the same
  Gaussian conditional (``S`` triangular solves); the chain continues from the first, played,
  draw. The propensity is exact given the sweep's latent variables. About one extra sweep.
* Langevin: the shared steps run once, then ``S`` copies each take the last MALA step; the chain
  continues from the first. ``S`` gradient evaluations per decision: lower ``num_draws``.

**Feedback** may arrive late, out of order, twice (the second is acknowledged and ignored) or
never (the decision stays pending; ``pending`` lists them). It is applied to the posterior in
batches of ``update_every`` (or on ``refresh()``), as production refits are; each application
increments ``model_version``, which every decision records.

**Restarts.** The log is the record; a snapshot (``save``) is a checkpoint of it. ``load(directory,
log=...)`` first checks that the log belongs to the snapshot (``check_log``: the same Decider,
not older than the snapshot, no gap or foreign id past it; a ``StateError`` naming the log and
the mismatch otherwise, before anything is applied), then ``replay``s what the log holds beyond
the snapshot: decisions made after it become pending (their ids are not issued again) and the
feedback logged for pending decisions is applied, in the order it arrived, exactly once.

**Decision ids** are ``'<n>-<tag>'``: ``n`` the decision's number (0, 1, ...; the key of the
log's rows and of ``pending``) and ``tag`` 32 hex digits of a keyed BLAKE2b MAC of ``n`` under a
256-bit key drawn when the Decider is made and kept in its saved state (``public_id(n)``). A
client cannot guess another decision's id, and ``feedback`` refuses any id that is not exactly
one this Decider issued (``'05'``, a wrong tag, a number not issued yet) with the same message,
which says nothing of the ids that exist. A duplicate of a valid id is acknowledged and
ignored. (States saved before ids were signed keep accepting the plain ids they issued.)

**Limits.** Every feature must satisfy ``|x| <= feature_limit`` and every outcome
``|y| <= outcome_limit`` (both 1e6 by default: standardise features, or raise the limits for
outcomes in large units); a metric learned by a binary model (probit or logistic likelihood,
the probit GP's success) takes 0 or 1 only. Input over a limit raises ``ValueError`` naming the
field and the limit before anything reaches the posterior or the log (one enormous but finite
number would otherwise dominate the posterior for good, and the log would replay it).
``num_draws`` is at most ``MAX_DRAWS``.

**The outlier guard** (issue 40). A bound on each number cannot stop a pair of them from pinning a
weight: a feature of 1e3 then a reward of 1e6 (both inside the default limits) moved a weight from
0.95 to 999.99 with sd 0.0005, and every later decision played one offer. So ``feedback`` also
asks each model of a real-valued metric (``BayesianLinear`` of any engine, ``PerArmLinear``) how far
the outcome lies from its one-step posterior predictive, ``z = (y - x^T m) / sqrt(sigma^2 + x^T
Sigma x)`` (``predictive_residual``), and refuses the outcome (``ValueError`` naming the metric, the
decision stays pending, nothing is logged) when ``|z| > outlier_sd`` (100 by default). This is the
hard form of the outlier rejection a heavy-tailed likelihood gives (O'Hagan 1979, "On outlier
rejection phenomena in Bayes inference", JRSS B 41: an observation far enough out is discounted
whole), decided at the boundary so that the log keeps only what the posterior learned and a
replay needs no second judgement. The data decide the scale: the same reward is ordinary for a
decision whose features predict it and refused for one whose do not. Ordinary data are untouched
(an outcome within 100 predictive sd is learned exactly as before; by Chebyshev's inequality one
of any distribution with the model's predictive variance lies further out with probability at
most 1e-4). Refusals are counted per metric (``outliers``; ``/metrics``:
``bayes_safe_feedback_outliers_total``). Metrics learned by a binary model need no guard (0 or 1
only). What it does not catch: an outcome that agrees with the prediction at a feature far outside
the data (a feature of 1e6 with a reward of 1e6 when the weight is near 1) is evidence the model is
right to take, and it shrinks that weight's sd to 1e-6; ``feature_limit`` set to your features'
real range (standardised features: 10 or 100) is the guard there.

Inputs are coerced once at the boundary: candidate features ``[K, d]`` as numpy arrays,
lists, tensors (float32 or float64) or a ``pandas.DataFrame`` whose columns are the
``feature_names``; a list of dicts (one per candidate); or, for per-arm policies (one model per
arm over a shared context) and with ``featurize``, one context as a vector, a dict of named
features or a ``pandas.Series``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .._validation import _TRUST, trusted_inputs
from ..io import atomic_output_dir
from ..random import DrawBatch
from ..state import StateError, load_state, save_state
from .log import DecisionLog, log_location
from .metrics import metric_names

__all__ = ["MAX_DRAWS", "Decider", "Decision", "FeedbackRowsError"]

#: drift alarms (a model's change detector restarting it) are logged here as WARNINGs (``Decider._watch_drift``)
_logger = logging.getLogger(__name__)

#: the largest ``num_draws`` a Decider takes (each decision draws ``S`` posterior samples)
MAX_DRAWS = 100_000
#: the outlier guard's default: an outcome more than this many posterior predictive sd from its
#: model's prediction is refused (module docstring: limits). By Chebyshev's inequality an outcome of
#: any distribution with the model's predictive variance lies this far out with probability at most
#: 1e-4 (a Gaussian one: never, 1e-2173); the one-observation pinning of issue 40 lies 1e3 to 1e4 out.
OUTLIER_SD = 100.0
#: a decision id: ``'<n>-<32 hex digits>'`` (module docstring)
_ID = re.compile(r"(0|[1-9][0-9]{0,17})-([0-9a-f]{32})")

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


class FeedbackRowsError(ValueError):
    """``Decider.feedback_many`` refused its rows (nothing was applied); ``problems`` lists every
    bad row as ``(index, decision_id, message)``, the message naming the field (``reward: ...``)."""

    def __init__(self, problems: list[tuple[int, str, str]]):
        self.problems = list(problems)
        shown = "; ".join(f"[{i}] decision_id {k!r}: {m}" for i, k, m in self.problems)
        super().__init__(f"{len(self.problems)} bad feedback row(s), nothing applied: {shown}")


def _shown(value, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters (a client's input, echoed in an error)."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def _finite(value, what: str) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a number, got {value!r}")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{what}: expected a finite number, got an integer of {len(str(value))} digits "
                         "(too large for float64)") from None
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected a number, got {_shown(value)}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what}: expected a finite number, got {value!r}")
    return out


_INFERENCE_GUARD = getattr(torch._C, "_InferenceMode", None)


class _QuietInference:
    """``trusted_inputs`` and ``torch.inference_mode`` together (models that never need
    gradients), as one context manager."""

    __slots__ = ("mode", "old")

    def __enter__(self):
        # trusted_inputs' switch set here (what its __enter__ does, one object and call fewer), and
        # torch's own guard (what torch.inference_mode enters), without that wrapper's Python set-up
        # (0.5 us against 1.5 a use; the wrapper where torch has no such guard)
        self.old, _TRUST.on = _TRUST.on, True
        self.mode = _INFERENCE_GUARD(True) if _INFERENCE_GUARD else torch.inference_mode()
        self.mode.__enter__()

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        _TRUST.on = self.old


_INDEX: list[torch.Tensor] = []


def _unknown_id(decision_id) -> ValueError:
    """The one answer to any decision id that is not one this Decider issued (module docstring)."""
    return ValueError(f"decision_id: unknown decision {_shown(decision_id)}: not an id this Decider issued "
                      "(expected the decision_id a decision returned, '<number>-<32 hex digits>')")


def _partial(reward, constraints) -> bool:
    """Whether an outcome ``(reward, constraints)`` reports only some metrics (a None among them; issue 45)."""
    return reward is None or (constraints is not None and None in constraints)


def _sums_in_order(us: list[list[float]], cols: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per row ``m``: ``sum_i us[m][i] * cols[m][i]`` and ``sum_i cols[m][i]^2``, each added in order to 0.0:
    what numpy's ``(u * col).sum(1)`` and ``(col * col).sum(1)`` give for rows of fewer than 8 numbers (its
    pairwise summation adds a block that short one number after another, from 0: a row of -0.0 sums to 0.0;
    tests/test_single_stream_speed_paths.py)."""
    means, spreads = [], []
    for u, c in zip(us, cols):
        mean = spread = 0.0
        for i in range(len(c)):
            mean += u[i] * c[i]
            spread += c[i] * c[i]
        means.append(mean)
        spreads.append(spread)
    return means, spreads


def _index(i: int) -> torch.Tensor:
    """``torch.tensor([i])`` (long), one shared tensor per small ``i`` (the baseline and the played
    action as the policies take them: read as indices, never written)."""
    if i >= 64:
        return torch.tensor([i])
    while len(_INDEX) <= i:
        with torch.inference_mode(False):
            _INDEX.append(torch.tensor([len(_INDEX)]))
    return _INDEX[i]


def provenance_lines(provenance: dict | None) -> list[str]:
    """Lines that say where a state came from (``bayes-safe study show``, the deploy command)."""
    if not provenance:
        return ["provenance: none recorded (the state was not made by bayes-safe deploy)"]
    p = provenance
    lines = [(f"deployed from study {p.get('study')!r} ({p.get('storage')}), trial {p.get('trial')} "
              f"[{p.get('chosen_by')}] on {p.get('deployed_at')} with bayes_safe {p.get('bayes_safe')}"),
             f"  problem {p.get('problem')}, policy {p.get('policy')}",
             "  parameters: " + ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in (p.get("parameters") or {}).items())]
    if p.get("recommendation"):
        pf = p.get("p_feasible")
        lines.append(f"  recommendation: {p['recommendation']}" + (f" (P(feasible) {pf:.3g})" if pf is not None else ""))
    for b in p.get("policy_bounds") or []:
        if isinstance(b, dict) and b.get("text"):
            lines.append(f"  {b['text']}")
    return lines


def _per_arm(policy) -> int | None:
    """The number of arms when every model of ``policy`` keeps one posterior per arm (a shared context)."""
    arms = {getattr(m, "num_arms", None) for m in policy.models().values()}
    return arms.pop() if len(arms) == 1 and None not in arms else None


def _played_features(context: list[float], action: int, num_actions: int, dim: int | None, per_arm: bool,
                     decision_id: str, path) -> list[float]:
    """The features the posterior learns from for a logged decision (what ``decide`` keeps in
    ``pending``): row ``action`` of the flattened candidates, or the one logged context."""
    if dim is None and num_actions and len(context) % num_actions == 0:
        dim = len(context) // num_actions
    if dim is not None and len(context) == num_actions * dim:
        return context[action * dim:(action + 1) * dim]
    if per_arm and dim is not None and len(context) == dim:
        return list(context)
    raise StateError(f"{path}: decision {decision_id!r} has a context of {len(context)} values; expected "
                     f"{num_actions} x {dim} candidate features" + (f" or one context of {dim}" if per_arm else ""))


def _log_mismatch(log: DecisionLog, decider_id: str | None, next_id: int, pending: Mapping[str, dict],
                  replicas: bool = False) -> str | None:
    """Why ``log`` is not the decision log of a Decider state (its id, id counter and pending
    decisions), or None when it is (read-only: nothing is written). ``replicas``: the decisions
    past the counter may be replicas' (numbered in blocks, with gaps), not one unbroken run."""
    ids = log.id_summary()
    if ids["foreign"]:
        return (f"{ids['foreign']} of its decision ids were not issued by a Decider (which issues '0', '1', ...): "
                "not a Decider's log")
    owner = log.identity()
    if owner is not None and decider_id is not None and owner["decider_id"] != decider_id:
        return (f"it is the log of another Decider (id {owner['decider_id']}; this state's id is {decider_id}): "
                "give each state its own log")
    if owner is None and not ids["count"]:
        return None  # a new log: it starts at this state's counter
    first = owner["first_id"] if owner is not None else ids["low"]
    end = max(first, ids["high"] + 1 if ids["count"] else 0)
    if next_id > end:
        return (f"the state has issued decision ids up to {next_id - 1} but the log's last is "
                f"{end - 1 if end else 'none'}: the log is older than the snapshot (or another state's)")
    past = 0 if replicas else log.count_from(next_id)
    if past and past != end - next_id:
        return (f"it holds {past} decisions past the state's counter {next_id} with ids up to {end - 1}, not the "
                f"run of ids {next_id} to {end - 1} that a crash after the snapshot leaves: not this state's log")
    logged = log.actions_of(k for k in pending if k.isdigit() and int(k) >= first)
    for k, entry in sorted(pending.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1):
        if not k.isdigit() or int(k) < first:
            continue
        if k not in logged:
            return f"decision {k!r}, pending in the state, is not in the log"
        if logged[k] != int(entry["action"]):
            return f"decision {k!r} played action {entry['action']} in the state but action {logged[k]} in the log"
    answered = sorted(log.unanswered_below(next_id, first) - set(pending), key=int)
    if answered:
        return (f"the state has applied feedback for decision(s) {answered[:5]} that the log has none for: the log "
                "is older than the snapshot (or another state's)")
    orphans = log.orphan_feedback(first)
    if orphans:
        return f"it holds feedback for decision(s) {orphans} but not the decisions themselves"
    return None


def _identity(st) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _read_snapshot(directory: Path, read_extra: Callable, allow_imports: bool, attempts: int = 50) -> tuple:
    """``(decider.json's text, policy, the policy's load error or None, read_extra(directory))``, all
    read from one version of ``directory``.

    ``save`` replaces the whole directory at once (a rename exchange), so reading its files one
    path at a time may pair one snapshot's ``decider.json`` with another's policy (issue 40).
    The directory is opened first, which pins its inode (it cannot be reused while open), and
    after every file is read the path must still name that inode; if a save replaced it in
    between, everything is read again. A missing ``decider.json`` is returned as the
    ``FileNotFoundError`` raised by ``read_text`` (``load`` words it)."""
    for attempt in range(attempts):
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            fd = None  # no directory: read as before, so load words what is missing
        try:
            pinned = None if fd is None else _identity(os.fstat(fd))
            error = policy = extra = None
            try:
                text = (directory / "decider.json").read_text()
                try:
                    policy = load_state(directory / "policy", allow_imports=allow_imports)
                except Exception as exc:  # noqa: BLE001 (whatever load_state raises) raised by load after the log's check
                    error = exc
                extra = read_extra(directory)
            except FileNotFoundError as exc:
                text, error = exc, exc
            try:
                now = _identity(os.stat(directory))
            except OSError:
                now = None
            if pinned == now:  # one version of the directory was read (or none exists)
                if isinstance(text, FileNotFoundError):
                    raise text
                return text, policy, error, extra
        finally:
            if fd is not None:
                os.close(fd)
        time.sleep(0.001 * min(attempt + 1, 10))  # a save replaced it while it was read: read it again
    raise StateError(f"{directory}: replaced by another save during each of {attempts} reads")


def _check_bookkeeping(next_id: int, model_version: int, legacy_below: int, pending: dict, queued: list) -> None:
    """``ValueError`` unless a saved state's counters and entries are ones a Decider could have written."""
    if next_id < 0 or model_version < 0 or not 0 <= legacy_below <= next_id:
        raise ValueError(f"counters next_id={next_id}, model_version={model_version}, legacy_below={legacy_below}: "
                         "expected 0 <= legacy_below <= next_id and model_version >= 0")
    for key, entry in [*pending.items(), *((q["decision_id"], q) for q in queued)]:
        if not (key.isdigit() and str(int(key)) == key and int(key) < next_id):
            raise ValueError(f"decision {key!r} is not one of the numbers 0 .. {next_id - 1} the state issued")
        if entry["action"] < 0 or not all(math.isfinite(x) for x in entry["features"]):
            raise ValueError(f"decision {key!r} has action {entry['action']} or non-finite features")


class Decider:
    """Wrap a policy (``R = 1``) for production: decide, record the propensity, learn from feedback.

    Args:
        policy: any ``bayes_safe`` policy whose models have no batch shape (the one-stream case,
            ``BayesianLinear(prior, noise_std=1.0)``) or ``batch_shape=[1]``; any engine
            (conjugate, Normal-Inverse-Gamma, Gibbs, Langevin, NUTS / SVI, the probit GP's views,
            per-arm models). The propensity draws never change a model's state beyond the one
            draw that is played (module docstring).
        feature_names: the names of the ``d`` features (columns of a DataFrame, keys of a dict);
            None: inputs are positional.
        num_draws: ``S``, the Monte-Carlo draws behind each propensity (>= 2). The default 200
            gives a standard error ``sqrt(p (1 - p) / S)`` of at most 0.035 (0.016 at
            ``p = 0.05``) and a relative bias ``(1 - p)^S`` of the inverse propensity under 2 %
            for ``p >= 0.02``; the draws are the largest part of a decision's cost (a conjugate
            TS-ASC decide + feedback took 0.22 ms of CPU at 200 draws, 4,540 a second per CPU
            second, on the shared 2-core machine this project is built on, under a load average of
            5: ``benchmarks/single_stream.py``). Raise it when rare actions matter to the
            off-policy estimates.
        update_every: apply feedback to the posterior after this many arrive (>= 1).
        log: a ``DecisionLog`` (or a path to one) that records every decision and feedback.
        featurize: ``context [p] -> candidate features [K, d]`` for shared-weight policies that
            are given one context (not saved: pass it again to ``load``).
        seed: seed of the decisions' random stream.
        feature_limit: the largest ``|x|`` a feature may have (module docstring: limits).
        outcome_limit: the largest ``|y|`` a reward or constraint value may have (binary metrics:
            0 or 1).
        outlier_sd: the outlier guard (module docstring: limits): an outcome more than this many
            posterior predictive sd from its model's prediction is refused (default
            ``OUTLIER_SD = 100``; None: no guard).
        outcome_windows: ``{constraint metric name: (seconds, default)}`` (names as
            ``metrics.metric_names`` gives them): a metric not reported within ``seconds`` of its
            decision becomes ``default`` (a refund not reported in 30 days is a 0), logged with
            origin ``"window"`` and learned once, like a reported one (``close_windows``; issue 45).
            Decisions and feedback close the windows due, at most once a second.

    A new Decider starts at decision id ``'0'``: its ``log`` must hold no decisions yet (to go on
    with a log that has some, ``load`` the state that wrote it). The log records which Decider it
    belongs to (``decider_id``, a random id kept in the saved state).
    """

    def __init__(self, policy, *, feature_names: Sequence[str] | None = None, num_draws: int = 200,
                 update_every: int = 1, log: DecisionLog | str | Path | None = None,
                 featurize: Callable | None = None, seed: int = 0, feature_limit: float = 1e6,
                 outcome_limit: float = 1e6, outlier_sd: float | None = OUTLIER_SD,
                 outcome_windows: Mapping | None = None):
        if not (callable(getattr(policy, "select", None)) and callable(getattr(policy, "update", None))):
            raise TypeError(f"policy: expected a bayes_safe policy (select and update), got {type(policy).__name__}")
        for role, m in policy.models().items():
            shape = getattr(m, "batch_shape", None)
            if shape is not None and tuple(shape) not in ((), (1,)):
                raise ValueError(f"policy: its {role} model has batch_shape {list(shape)}; a Decider serves one "
                                 "stream of decisions: build the models without a batch shape (or batch_shape=[1])")
            device = getattr(m, "device", None)
            if isinstance(device, torch.device) and device.type != "cpu":
                # one decision at a time: kernel launches and copies cost more than the 4 x 4 arithmetic, and the
                # log, the propensities and the requests live on the host (issue 46)
                raise ValueError(f"policy: its {role} model lives on {device}; a Decider serves one decision at a "
                                 "time on the CPU: build the serving models with their prior on the CPU (a GPU "
                                 "pays off for batched simulation and studies: bayes_safe.simulate)")
        if isinstance(num_draws, bool) or not isinstance(num_draws, int) or not 2 <= num_draws <= MAX_DRAWS:
            raise ValueError(f"num_draws: expected an int in [2, {MAX_DRAWS}] (the played draw and at least one more), "
                             f"got {num_draws!r}")
        for name, limit in (("feature_limit", feature_limit), ("outcome_limit", outcome_limit)):
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
                raise ValueError(f"{name}: expected a positive finite number, got {limit!r}")
        if outlier_sd is not None and (isinstance(outlier_sd, bool) or not isinstance(outlier_sd, (int, float))
                                       or not 0 < outlier_sd < math.inf):
            raise ValueError(f"outlier_sd: expected a positive finite number of predictive sd, or None (no guard), "
                             f"got {outlier_sd!r}")
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
        self.feature_limit, self.outcome_limit = float(feature_limit), float(outcome_limit)
        roles = policy.models()
        C = int(getattr(policy, "num_constraints", 0))
        #: per metric (the reward, then each constraint): whether its model learns 0 / 1 outcomes
        self._binary = tuple(bool(getattr(roles.get(r), "binary_outcomes", False))
                             for r in ("reward", *(f"constraint{j}" for j in range(C))))
        self.outlier_sd = None if outlier_sd is None else float(outlier_sd)
        #: per metric: the model the outlier guard asks (None: a binary model, or one without a predictive residual)
        self._guarded = tuple(
            m if callable(getattr(m, "predictive_residual", None)) and not binary else None
            for m, binary in zip((roles.get(r) for r in ("reward", *(f"constraint{j}" for j in range(C)))), self._binary))
        # the guarded models whose residual has the numpy path: one-stream conjugate BayesianLinear
        self._fast_guard = {id(m) for m in self._guarded if m is not None and type(m).__name__ == "BayesianLinear"
                            and m.conjugate and math.prod(m.batch_shape) == 1}
        #: per metric: outcomes the outlier guard refused (in this process since it started)
        self.outliers = [0] * (1 + C)
        # drift (issue 43): whether any model detects changes, and (policy, [(metric, model)], alarms seen)
        self._drifting = bool(_drift_sources(policy))
        self._drift_watch = None
        self._id_key = secrets.token_bytes(32)
        self._legacy_below = 0  # plain ids '0' .. below this were issued before ids were signed
        self.log = DecisionLog(log) if isinstance(log, (str, Path)) else log
        self.model_version = 0
        self.next_id = 0
        self.pending: dict[str, dict] = {}    # decided, no feedback yet
        self.queued: list[dict] = []          # feedback not yet applied to the posterior
        self.decider_id = uuid.uuid4().hex
        #: what the last ``replay`` applied: ``{"decisions": n, "feedback": m}``
        self.replayed = {"decisions": 0, "feedback": 0}
        #: where this state came from (``bayes_safe.tuning.deploy``: the study, trial and parameters), a
        #: JSON-able dict saved with the state, or None; ``/health`` and ``GET /posterior`` show it
        self.provenance: dict | None = None
        self._count_fallbacks()
        self.outcome_windows = self._windows(outcome_windows)
        #: TS-ASC with ``pending="margin"`` (issue 45): the constraint checks keep a margin for the decisions whose
        #: constraint outcomes the models have not learned yet; ``{decision key: [constraint indices held]}``
        self._held_pending: dict[str, list[int]] = {}
        self._margin = getattr(policy, "pending", "ignore") != "ignore"
        if self._margin and getattr(self, "_replica", False):
            raise ValueError(f"pending={policy.pending!r}: replicas do not hold pending outcomes yet (their decisions "
                             "wait in the log); serve one process, or build the policy with pending='ignore'")
        self._swept = 0.0  # time.monotonic() of the last close_windows the loop ran
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.RLock()
        # Inside decide and refresh (after this class's own checks of every input): the policy's
        # second look at the values is skipped (``trusted_inputs``, per thread), and models that
        # never train by gradient (conjugate, Gibbs) run without autograd bookkeeping
        # (``torch.inference_mode``, as ``simulate`` runs them): together about a fifth of a
        # conjugate decide + feedback (``benchmarks/single_stream.py``).
        grad_free = all(getattr(m, "conjugate", False) or getattr(m, "needs_autograd", True) is False
                        for m in policy.models().values())
        self._quiet = _QuietInference if grad_free else trusted_inputs
        if self.log is not None:
            owner = self.log.identity()
            if owner is not None:
                raise StateError(f"{self.log.path}: the decision log of another Decider (id {owner['decider_id']}); a "
                                 "new Decider needs a log of its own (Decider.load the state that wrote this log with it "
                                 "to go on)")
            if len(self.log):
                raise StateError(f"{self.log.path}: already holds {len(self.log)} decisions; a new Decider starts at "
                                 "id '0' and needs a log without decisions (Decider.load the state that wrote this log "
                                 "with it to go on)")
            if not self.log.read_only:
                self.log.bind(self.decider_id, 0)

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
        if (type(features) is np.ndarray and features.dtype == np.float64 and features.ndim == 2
                and features.shape[0] >= 1 and (self.feature_names is None or features.shape[1] == len(self.feature_names))):
            # the common case, candidates [K, d] as a float64 array: the checks below in three steps (a copy:
            # the caller may reuse the array)
            # a finite sum proves every entry finite; a small table is summed in Python (0.4 us
            # against 1 us for numpy's reduction); an overflowing sum is looked at entry by entry
            if features.size <= 256:
                values = features.ravel().tolist()
                total, biggest = sum(values), max(max(values), -min(values))
            else:
                total, biggest = features.sum(), None
            if not math.isfinite(total) and not np.isfinite(features).all():
                raise ValueError("features: expected finite numbers, got NaN or inf")
            if biggest is None or biggest > self.feature_limit or not math.isfinite(total):
                self._check_magnitude(features)
            x = features.copy(order="C")
            return torch.from_numpy(x[None]), x.reshape(-1)  # numpy's [None] view: no tensor operation
        import pandas as pd

        context = None
        if isinstance(features, pd.DataFrame):
            repeated = features.columns[features.columns.duplicated()].unique().tolist()
            if repeated:
                raise ValueError(f"features: a DataFrame with one column per feature, got column(s) "
                                 f"{[str(c) for c in repeated][:10]} more than once")
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
            except OverflowError:
                raise ValueError("features: expected finite numbers, got an integer too large for float64") from None
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
        self._check_magnitude(x)
        if x.ndim == 1:  # one context: per-arm models read it directly; shared-weight models need featurize
            arms = _per_arm(self.policy)
            if self.featurize is not None:
                x = np.asarray(self.featurize(x), dtype=np.float64)
                if x.ndim != 2 or not np.isfinite(x).all():
                    raise ValueError(f"featurize: expected finite candidate features [K, d], got shape {list(x.shape)}")
                self._check_magnitude(x, "featurize")
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

    def _check_magnitude(self, x: np.ndarray, what: str = "features") -> None:
        """``ValueError`` naming the limit when an entry of ``x`` exceeds ``feature_limit`` in size."""
        if x.size:
            biggest = float(np.abs(x).max())
            if biggest > self.feature_limit:
                raise ValueError(f"{what}: expected |value| <= {self.feature_limit:g} (the Decider's feature_limit; "
                                 f"standardise the features or raise the limit), got {biggest:g}")

    def _baseline(self, baseline, K: int):
        if baseline is None:
            return None
        if isinstance(baseline, bool) or not isinstance(baseline, (int, np.integer)):
            raise TypeError(f"baseline: expected an action index (int) or None, got {baseline!r}")
        if not 0 <= int(baseline) < K:
            raise ValueError(f"baseline: expected an action index in [0, {K}), got {baseline}")
        return _index(int(baseline))

    # ------------------------------------------------------------------ the loop
    def decide(self, features, baseline: int | None = None, valid=None) -> Decision:
        """Decide one unit: ``features`` (module docstring), the baseline's action, an optional mask ``[K]``."""
        prepared = self._prepare(features, baseline, valid)
        with self._lock:
            decision, row, entry = self._decision(*prepared)
            if self.log is not None:  # first: a failed write issues no id and leaves nothing pending
                self.log.write_decision(*row)
            self.next_id += 1
            self.pending[row[0]] = entry
            if self._margin:  # every constraint metric of the decision is pending (TS-ASC pending="margin")
                self._hold(row[0], entry["features"], range(int(self.policy.num_constraints)))
            if self.outcome_windows:
                entry["time"] = time.time()
                self._sweep()
        return decision

    def _prepare(self, features, baseline, valid) -> tuple:
        """``decide``'s arguments checked (before the lock): ``(candidates [1, K, d], context, baseline, valid)``."""
        cand, context = self._candidates(features)
        K = int(cand.shape[1])
        base = self._baseline(baseline, K)
        if valid is not None:
            valid = torch.as_tensor(np.asarray(valid))
            if valid.dtype != torch.bool or tuple(valid.shape) != (K,):
                raise ValueError(f"valid: expected a bool mask of the {K} actions, got {list(valid.shape)} {valid.dtype}")
            if not bool(valid.any()):
                raise ValueError("valid: every action is masked out; allow at least one (a decision needs an action "
                                 "it may play)")
            valid = valid[None]
        return cand, context, base, valid

    def _decision(self, cand, context, base, valid) -> tuple[Decision, tuple, dict]:
        """Decision number ``next_id`` (the caller holds the lock and moves the counter):
        ``(decision, the log's write_decision arguments, the pending entry)``."""
        K = int(cand.shape[1])
        S = self.num_draws
        # S independent draws in one batched call; the first is played (module docstring)
        # played=True: a chain engine (Gibbs, Langevin) continues from the first, played draw
        # one DrawBatch per (S, generator), kept: it holds no state between calls
        batch = self.__dict__.get("_draw_batch")
        if batch is None or batch.num_draws != S or batch.generator is not self._generator:
            batch = self._draw_batch = DrawBatch(S, 1, self._generator, played=True)
        draw_actions = getattr(self.policy, "_draw_actions", None)
        b = None if base is None else int(base)  # the baseline's index (read once: the log's and TS-ASC's)
        with self._quiet():
            # TS-ASC of conjugate models: its select's actions [S] as numpy (the same numbers, after the
            # checks above, which select's would pass unchanged; ts_asc.TSASC._draw_actions), else select
            played = None if draw_actions is None else draw_actions(cand, b, batch, valid)
            actions = self.policy.select(cand, base, generator=batch, valid=valid) if played is None else None
        if self.fallback_guards is not None:
            self._fallback_of_played()
        if played is not None:
            action = int(played[0])
            probs = [c / S for c in np.bincount(played, minlength=K).tolist()]
        elif tuple(actions.shape) == (1,):  # no randomness reached the decision: deterministic
            action, probs = int(actions[0]), torch.nn.functional.one_hot(actions[0], K).to(torch.float64)
        elif tuple(actions.shape) == (S, 1):
            played = actions.numpy().reshape(S)  # numpy's view: no tensor operation
            action = int(played[0])
            # counts / S in Python: the same correctly rounded quotients as float64 tensors, fewer ops
            # (numpy's bincount: the same counts as torch's, 1.7 us against 3.1)
            probs = [c / S for c in np.bincount(played, minlength=K).tolist()]
        else:
            raise NotImplementedError(f"{type(self.policy).__name__}: its select returned shape {list(actions.shape)} "
                                      f"for {S} batched draws (expected [{S}, 1]); its models do not broadcast a "
                                      "sample dimension")
        if not isinstance(probs, list):
            probs = probs.tolist()
        p = float(probs[action])
        key = str(self.next_id)
        decision = Decision(self.public_id(self.next_id), action, p, math.sqrt(p * (1 - p) / S),
                            self.model_version, tuple(probs))
        row = (key, action, p, decision.propensity_se, self.model_version, context, probs, b)  # (probs: the floats of
        # decision.probabilities, as the list they were made in: the log writes them without converting them)
        solve = self.policy.__dict__.get("_last_solve") if played is not None and self.outlier_sd is not None else None
        # the decision solved L^-1 x for every candidate: the played column, with the factors it used, is
        # the outlier guard's solve at this decision's feedback while those factors stand (``_outlying``);
        # kept for the last decision only (a feedback that follows its decision, the common case)
        if solve is None:
            self._last_guard_solve = None
        else:  # per model: x^T m = u . L^-1 x and x^T Sigma x = |L^-1 x|^2 at the played candidate, as floats
            col = solve[0][:, :, action]  # [M, d] (the solve's numpy arrays, ``TSASC._stacked_actions``)
            u = solve[1][:, :, 0]
            if col.shape[1] < 8:
                # numpy sums fewer than 8 numbers one after another, from 0 (``_sums_in_order``): the same sums of
                # the same products as ``(u * col).sum(1)`` and ``(col * col).sum(1)``, in Python floats (one
                # conversion each instead of four array operations)
                means, spreads = _sums_in_order(u.tolist(), col.tolist())
            else:
                means, spreads = (u * col).sum(1).tolist(), (col * col).sum(1).tolist()
            self._last_guard_solve = (key, solve[2], solve[3], means, spreads)
        return decision, row, {"features": cand.numpy()[0, action].tolist(), "action": action}

    def _count_fallbacks(self) -> None:
        """Start the fallback counters (issue 39): ``fallback_guards`` (labels of the policy's guards,
        ``Policy.fallback_constraints``; None when the policy cannot fall back), ``fallbacks`` (the
        decisions that played the fallback) and ``fallbacks_by`` (per guard, those it bound), counted
        in this process since it started (a restart starts from 0; not saved with the state)."""
        guards = getattr(self.policy, "fallback_constraints", None)
        self.fallback_guards = None if guards is None else [
            c.describe() if callable(getattr(c, "describe", None)) else str(c) for c in guards]
        self.fallbacks = 0
        self.fallbacks_by = [0] * len(self.fallback_guards or ())

    def _fallback_of_played(self) -> None:
        """Count the played draw's fallback (the first of the batch: the one served)."""
        fell, by = self.policy.last_fallback, self.policy.last_fallback_by
        if fell is None or not bool(fell.reshape(-1)[0]):
            return
        self.fallbacks += 1
        for g, bound in enumerate(by.reshape(by.shape[0], -1)[:, 0].tolist()):
            self.fallbacks_by[g] += int(bound)

    def feedback(self, decision_id: str, reward=None, constraints=None) -> bool:
        """Record the outcome of a decision; True if new, False for a duplicate (ignored).

        The outcomes may arrive metric by metric (issue 45): ``feedback(id, reward=1.0)`` now and
        ``feedback(id, constraints=[None, 1.0])`` or ``constraints={"refund": 1.0}`` (by the names of
        ``/metrics``, ``metrics.metric_names``) later, a metric not known yet left out or None. Each
        model learns its metric when it arrives, exactly once: a metric already known is ignored (the
        answer is False when nothing in the call was new), and the decision stays pending until every
        metric is known (module docstring: outcomes apart).

        Raises ``ValueError`` for an id this Decider never issued (module docstring: decision ids)."""
        reward, constraints = self._outcome(reward, constraints)
        if _partial(reward, constraints):
            return self._feedback_apart(decision_id, reward, constraints)
        with self._lock:
            decision_id = self._resolve(decision_id)
            entry = self.pending.get(decision_id)
            if entry is None:  # an issued id that is no longer pending has had its feedback
                return False
            if entry.get("known") is not None:  # some metrics arrived before: only the others are new
                return self._apart_locked(decision_id, entry, reward, constraints)
            problem = self._outlier(entry, reward, constraints, decision_id)
            if problem:
                raise ValueError(problem)
            del self.pending[decision_id]
            if self.log is not None:
                try:
                    self.log.write_feedback(decision_id, reward, constraints)
                except BaseException:
                    self.pending[decision_id] = entry  # not recorded: still pending, the client may retry
                    raise
            if (self.update_every == 1 and self._learns_at_once and constraints is not None and not self.queued
                    and not self._held_pending and not self._drifting):
                self._learn_now(decision_id, entry, reward, constraints)
            else:
                self._queue(decision_id, entry, reward, constraints)
        return True

    #: whether ``feedback`` may learn an outcome at once (``_learn_now``): this class's ``_queue``, ``refresh``
    #: and ``_apply`` are Decider's own (a subclass that changes them queues every outcome)
    _learns_at_once = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._learns_at_once = (cls._queue is Decider._queue and cls.refresh is Decider.refresh
                               and cls._apply is Decider._apply)

    def _learn_now(self, decision_id: str, entry: dict, reward: float, constraints: list) -> None:
        """``_queue`` then ``refresh`` of one outcome (all its metrics) when nothing else waits
        (``update_every = 1``, nothing queued, no pending row held, no drift watched), for a policy that
        learns it from one row (TS-ASC of conjugate models, ``TSASC._learn_values``): what ``_apply``
        does with that one outcome, without the queue's entry and the calls around it; else ``_queue``.
        An error while learning leaves the outcome queued, as ``refresh`` leaves it. A policy that
        refused a row once (its models do not learn rows this way) has its outcomes queued from then
        on, without the row made for nothing. The caller holds the lock."""
        learn_values = getattr(self.policy, "_learn_values", None)
        if learn_values is not None and self.__dict__.get("_rows_refused") is not self.policy:
            f = entry["features"]
            row = np.array([[*f, reward, *constraints]], dtype=np.float64)  # (``_apply``'s row)
            try:
                with self._quiet():
                    learned = learn_values(row, len(f))
            except BaseException:
                self.queued.append({"decision_id": decision_id, "reward": reward, "constraints": constraints, **entry})
                raise
            if learned:
                self.model_version += 1
                return
            self._rows_refused = self.policy
        self._queue(decision_id, entry, reward, constraints)

    def _windows(self, windows) -> dict[int, tuple[float, float]]:
        """``outcome_windows`` checked: ``{constraint index: (seconds, default)}``."""
        if windows is None:
            return {}
        names = metric_names(self.policy)
        if not isinstance(windows, Mapping):
            raise TypeError(f"outcome_windows: expected {{constraint metric name: (seconds, default)}}, got "
                            f"{type(windows).__name__}")
        out = {}
        for name, spec in windows.items():
            if name not in names[1:]:
                why = (" (the reward has no window: report it, or leave the decision pending)" if name == names[0]
                       else "")
                raise ValueError(f"outcome_windows: {name!r} is not a constraint metric of this policy{why}; its "
                                 f"constraint metrics are {names[1:]}")
            try:
                seconds, default = spec
                seconds, default = float(seconds), float(default)
            except (TypeError, ValueError):
                raise ValueError(f"outcome_windows[{name!r}]: expected (seconds, default), got {spec!r}") from None
            if not 0 < seconds < math.inf:
                raise ValueError(f"outcome_windows[{name!r}]: expected a positive finite number of seconds, got {seconds}")
            j = names.index(name) - 1
            out[j] = (seconds, self._bounded(_finite(default, f"outcome_windows[{name!r}] default"),
                                             f"outcome_windows[{name!r}] default", j + 1))
        if out:
            self._check_apart()
            if getattr(self, "_replica", False):
                raise ValueError("outcome_windows: replicas do not close windows yet; serve one process, or report the "
                                 "defaults yourself")
        return out

    def close_windows(self, now: float | None = None) -> int:
        """Give every pending decision's constraint metric whose window (``outcome_windows``) has closed by
        ``now`` (Unix seconds; default: the clock) its declared default: logged with origin ``"window"``,
        learned once. Returns how many metrics were closed."""
        if not self.outcome_windows:
            return 0
        now = time.time() if now is None else float(now)
        closed = 0
        with self._lock:
            C = int(self.policy.num_constraints)
            for key, entry in list(self.pending.items()):
                at = entry.get("time")
                if at is None:
                    continue
                known = entry.get("known") or [False] * (1 + C)
                due = [None] * C
                for j, (seconds, default) in self.outcome_windows.items():
                    if not known[j + 1] and at + seconds <= now:
                        due[j] = default
                if any(v is not None for v in due):
                    if self.log is not None:
                        self.log.write_outcomes([(key, j, v) for j, v in enumerate(due) if v is not None],
                                                origin="window")
                    self._apart_locked(key, entry, None, due, write=False)
                    closed += sum(v is not None for v in due)
        return closed

    def _sweep(self) -> None:
        """``close_windows`` from the loop, at most once a second."""
        tick = time.monotonic()
        if tick - self._swept >= 1.0:
            self._swept = tick
            self.close_windows()

    def _feedback_apart(self, decision_id, reward, constraints) -> bool:
        """``feedback`` of some of a decision's metrics (the others None): checked, then applied under the lock."""
        self._check_apart()
        with self._lock:
            decision_id = self._resolve(decision_id)
            entry = self.pending.get(decision_id)
            if entry is None:
                return False
            return self._apart_locked(decision_id, entry, reward, constraints)

    def _check_apart(self) -> None:
        """``ValueError`` naming the policy unless it learns each metric with its own model (TS-ASC)."""
        from ..policies.ts_asc import TSASC

        policy = self.policy
        if not isinstance(policy, TSASC) or type(policy).update is not TSASC.update or policy.chance_recalibrate:
            why = (" with chance_recalibrate (it recalibrates on the reward and constraints of a decision together)"
                   if isinstance(policy, TSASC) and policy.chance_recalibrate else "")
            raise ValueError(f"reward, constraints: {type(policy).__name__}{why} learns a decision's outcomes together; "
                             "give the reward and every constraint in one feedback (outcomes metric by metric need "
                             "TS-ASC, whose models each learn their own metric)")
        shared = [getattr(m, "model", None) for m in (policy.reward_model, *policy.constraint_models)]
        shared = [id(m) for m in shared if m is not None]
        if len(shared) != len(set(shared)):
            raise ValueError(f"reward, constraints: this TS-ASC's metrics are views of one model "
                             f"({type(policy.reward_model).__name__} and "
                             f"{', '.join(type(m).__name__ for m in policy.constraint_models)}: one outcome seen two "
                             "ways); give the reward and every constraint in one feedback")

    def _apart_locked(self, key: str, entry: dict, reward, constraints, write: bool = True) -> bool:
        """The metrics of ``(reward, constraints)`` (None: not in this report) that ``entry`` does not
        know yet: checked by the outlier guard, logged, queued for their models; the entry leaves
        ``pending`` once every metric is known. The caller holds the lock and checked the policy (a decision
        some of whose metrics are known passed ``_check_apart`` when the first arrived)."""
        values = [reward, *(constraints or [None] * int(self.policy.num_constraints))]
        known = entry.get("known") or [False] * len(values)
        new = [None if k or v is None else v for k, v in zip(known, values)]
        if all(v is None for v in new):
            return False  # every metric of this report is known already: acknowledged and ignored
        if write:
            problem = self._outlier(entry, new[0], new[1:] or None, key)
            if problem:
                raise ValueError(problem)
        if self.log is not None and write:
            if new[0] is not None:  # the reward's row carries the constraints known with it (the others null)
                self.log.write_feedback(key, new[0], new[1:] or None)
            else:
                self.log.write_outcomes([(key, j, v) for j, v in enumerate(new[1:]) if v is not None])
        known = [k or v is not None for k, v in zip(known, new)]
        if all(known):
            del self.pending[key]
        else:
            entry["known"] = known
        self._queue(key, {"features": entry["features"], "action": entry["action"]}, new[0], new[1:] or None)
        return True

    def public_id(self, number: int) -> str:
        """The id a client is given for decision number ``number`` (the log's ``decision_id``):
        ``'<number>-<32 hex digits>'`` (module docstring)."""
        # keyed BLAKE2b, a MAC by design (RFC 7693 s.2.5): 16 bytes, 128 bits. The keyed state (the key's
        # block compressed) is made once per key and copied per id: the same digest as
        # blake2b(text, key=...), at the same cost for every number (2.2 us against 3.3 to 4; decide
        # and feedback each make one)
        keyed = self.__dict__.get("_keyed_mac")
        if keyed is None or keyed[0] is not self._id_key:
            keyed = self._keyed_mac = (self._id_key, hashlib.blake2b(key=self._id_key, digest_size=16))
        text = str(int(number))
        mac = keyed[1].copy()
        mac.update(text.encode())
        return f"{text}-{mac.hexdigest()}"

    def _resolve(self, decision_id) -> str:
        """The decision number (as the log and ``pending`` key it) of an id this Decider issued;
        ``ValueError`` for anything else, the same message whatever exists."""
        if isinstance(decision_id, (int, np.integer)) and not isinstance(decision_id, bool):
            decision_id = str(int(decision_id))  # only ever a legacy plain id
        if isinstance(decision_id, str):
            match = _ID.fullmatch(decision_id)
            if match is not None:
                number = int(match.group(1))
                # the tag is compared whatever the number, in constant time: no timing says which numbers exist
                if hmac.compare_digest(self.public_id(number), decision_id) and self._issued(number):
                    return match.group(1)
            elif (self._legacy_below and decision_id.isdigit() and str(int(decision_id)) == decision_id
                  and int(decision_id) < self._legacy_below):
                return decision_id
        raise _unknown_id(decision_id)

    def _issued(self, number: int) -> bool:
        """Whether this Decider has issued decision number ``number`` (its tag checked already)."""
        return number < self.next_id

    def _outcome(self, reward, constraints) -> tuple[float, list[float] | None]:
        """One outcome checked and coerced (``feedback`` and ``feedback_many``): the reward a finite
        float, the constraints one finite float per constraint metric of the policy (None without)."""
        C = int(getattr(self.policy, "num_constraints", 0))
        if (type(reward) is float and type(constraints) is list and len(constraints) == C and C
                and all(type(v) is float for v in constraints)):
            # the common case (a float reward and C Python floats): the checks below, in one pass, with the
            # messages made only for a value that fails them
            limit, binary = self.outcome_limit, self._binary
            for i, v in enumerate((reward, *constraints)):
                if not (abs(v) <= limit if not binary[i] else (v == 0.0 or v == 1.0)):
                    break  # (NaN fails both tests) the general path names the value and the check it fails
            else:
                return reward, list(constraints)
        if reward is None or isinstance(constraints, Mapping) or (C and constraints is None) or (
                C and type(constraints) in (list, tuple) and None in constraints):
            return self._outcome_apart(reward, constraints, C)
        reward = self._bounded(_finite(reward, "reward"), "reward", 0)
        if C:
            if constraints is None:
                raise ValueError(f"constraints: the policy learns {C} constraint metric(s); give {C} value(s), or "
                                 "None for one not known yet")
            if type(constraints) in (list, tuple) and len(constraints) == C and all(type(v) is float for v in constraints):
                values = constraints  # C Python floats (the common case): what the array below would hold
            else:
                try:
                    values = np.atleast_1d(np.asarray(constraints, dtype=object))
                except (TypeError, ValueError):
                    values = None
                if values is None or values.shape != (C,):
                    raise ValueError(f"constraints: expected {C} value(s), got {_shown(constraints)}")
            return reward, [self._bounded(_finite(v, f"constraints[{i}]"), f"constraints[{i}]", i + 1)
                            for i, v in enumerate(values)]
        if constraints is not None and (not isinstance(constraints, (list, tuple, np.ndarray)) or len(constraints)):
            raise ValueError("constraints: this policy learns no constraint metric; leave constraints out")
        return reward, None

    def _outcome_apart(self, reward, constraints, C: int) -> tuple[float | None, list | None]:
        """``_outcome`` of a report of some metrics: ``(reward or None, [value or None] * C or None)``;
        ``constraints`` a list with None for metrics not in the report, or ``{name: value}`` by the
        constraint metrics' names (``metrics.metric_names``)."""
        if reward is not None:
            reward = self._bounded(_finite(reward, "reward"), "reward", 0)
        if isinstance(constraints, Mapping):
            names = metric_names(self.policy)[1:]
            unknown = [str(k) for k in constraints if k not in names]
            if unknown:
                raise ValueError(f"constraints: unknown metric name(s) {unknown[:5]}; this policy's constraint metrics "
                                 f"are {names}")
            constraints = [constraints.get(name) for name in names]
        if C and constraints is None:
            constraints = [None] * C  # left out: none known yet
        if constraints is not None:
            if not C:
                if any(v is not None for v in constraints):
                    raise ValueError("constraints: this policy learns no constraint metric; leave constraints out")
                constraints = None
            elif not isinstance(constraints, (list, tuple)) or len(constraints) != C:
                raise ValueError(f"constraints: expected {C} value(s) (None for one not known yet), got "
                                 f"{_shown(constraints)}")
            else:
                constraints = [None if v is None else self._bounded(_finite(v, f"constraints[{i}]"), f"constraints[{i}]",
                                                                    i + 1) for i, v in enumerate(constraints)]
        if reward is None and (constraints is None or all(v is None for v in constraints)):
            raise ValueError("reward, constraints: give the reward, a constraint metric's value, or both (a metric not "
                             "known yet is left out or None)")
        return reward, constraints

    def _bounded(self, value: float, what: str, metric: int) -> float:
        """``value`` if within the outcome limit (and 0 / 1 for a binary metric), else ``ValueError``."""
        if self._binary[metric]:
            if value != 0.0 and value != 1.0:
                raise ValueError(f"{what}: expected 0 or 1 (its model learns binary outcomes), got {value:g}")
        elif abs(value) > self.outcome_limit:
            raise ValueError(f"{what}: expected |value| <= {self.outcome_limit:g} (the Decider's outcome_limit; raise "
                             f"it for outcomes in larger units), got {value:g}")
        return value

    def _outlier(self, entry: dict, reward: float, constraints, key: str | None = None) -> str | None:
        """The outlier guard (module docstring: limits): None when every outcome of the decision
        ``entry`` lies within ``outlier_sd`` predictive sd of its model's prediction, else the
        message naming the first that does not (and each such outcome is counted in ``outliers``).
        Asked under the lock, of the posterior as the last ``refresh`` left it."""
        found = self._outlying(entry, reward, constraints, key)
        for metric, _ in found:
            self.outliers[metric] += 1
        return found[0][1] if found else None

    def _outlying(self, entry: dict, reward: float, constraints, key: str | None = None) -> list[tuple[int, str]]:
        """``[(metric, message)]`` of the outcomes of ``entry`` beyond ``outlier_sd`` (``_outlier``;
        counts nothing)."""
        if self.outlier_sd is None:
            return []
        found = []
        row = None  # the features as one float64 array, made once for every model that asks (the same numbers)
        solve = self.__dict__.get("_last_guard_solve")
        if solve is not None and solve[0] != key:
            solve = None  # another decision's solve
        for metric, value in enumerate((reward, *(constraints or ()))):
            model = self._guarded[metric]
            if model is None or value is None:  # (None: a metric not in this report)
                continue
            if id(model) in self._fast_guard:
                z = None
                if (solve is not None and metric < len(solve[2]) and solve[2][metric] is model
                        and solve[1][metric] is model._factor and model._dirty is None and model.noise_prior is None):
                    # the decision's solve under the same factor: ``_residual_one``'s numbers from it
                    z = (value - solve[3][metric]) / math.sqrt(1.0 / model._scale + solve[4][metric])
                if z is None:
                    if row is None:
                        row = np.array(entry["features"], dtype=np.float64)
                    z = model._residual_one(row, value)
            else:
                with self._quiet():
                    if getattr(model, "num_arms", None) is not None:  # a model per arm (PerArmLinear): the played arm's
                        z = float(model.predictive_residual(torch.tensor(entry["features"], dtype=torch.float64),
                                                            value, entry["action"]))
                    else:
                        shape = tuple(model.batch_shape)
                        x = torch.tensor(entry["features"], dtype=torch.float64).reshape(*shape, -1)
                        z = float(model.predictive_residual(x, torch.full(shape, float(value), dtype=torch.float64))
                                  .reshape(-1)[0])
            if not abs(z) <= self.outlier_sd:
                what = "reward" if metric == 0 else f"constraints[{metric - 1}]"
                found.append((metric, (
                    f"{what}: {value:g} lies {abs(z):.3g} predictive sd from its model's prediction for this decision; "
                    f"the Decider's outlier_sd refuses more than {self.outlier_sd:g} (one such outcome would dominate "
                    "the posterior: check the value and the decision's features, or raise outlier_sd, or the model's "
                    "noise_std, if outcomes this far out are real)")))
        return found

    def feedback_many(self, rows, *, check_only: bool = False) -> list[bool]:
        """Record many outcomes at once, all or nothing: ``rows`` of ``(decision_id, reward,
        constraints)``; returns per row True if new, False for a duplicate (a decision that
        already had feedback, or an id earlier in ``rows``: acknowledged and ignored).
        ``check_only``: the checks and the answer alone, nothing recorded.

        Every row is checked first (as ``feedback`` does); any bad one raises ``FeedbackRowsError``
        naming every bad row, with nothing applied or logged. The new rows are written to the log
        in one transaction (committed before this returns: a crash after it loses none, ``replay``
        applies them) and then applied in order, exactly as the same calls to ``feedback`` would."""
        checked, problems = self._checked_rows(rows)
        with self._lock:
            new, seen, apart, seen_apart, apart_keys = [], set(), [], set(), set()
            for i, decision_id, reward, constraints in checked:
                try:
                    key = self._resolve(decision_id)
                except ValueError as exc:
                    problems.append((i, str(decision_id)[:80], str(exc)))
                    continue
                if key in self.pending and key not in seen and (
                        _partial(reward, constraints) or self.pending[key].get("known") is not None
                        or key in apart_keys):
                    # some metrics of the decision (module docstring: outcomes apart): the ones not known yet
                    try:
                        self._check_apart()
                    except ValueError as exc:
                        problems.append((i, str(decision_id)[:80], str(exc)))
                        continue
                    known = self.pending[key].get("known") or [False] * (1 + len(constraints or ()))
                    values = [None if k or (key, m) in seen_apart else v
                              for m, (k, v) in enumerate(zip(known, [reward, *(constraints or ())]))]
                    if all(v is None for v in values):
                        continue
                    problem = self._outlier(self.pending[key], values[0], values[1:] or None, key)
                    if problem:
                        problems.append((i, str(decision_id)[:80], problem))
                        continue
                    seen_apart.update((key, m) for m, v in enumerate(values) if v is not None)
                    apart_keys.add(key)
                    apart.append((i, key, values[0], values[1:] or None))
                elif key in self.pending and key not in seen:
                    problem = self._outlier(self.pending[key], reward, constraints, key)
                    if problem:
                        problems.append((i, str(decision_id)[:80], problem))
                        continue
                    seen.add(key)
                    new.append((i, key, reward, constraints))
            if problems:
                raise FeedbackRowsError(sorted(problems))
            if check_only:
                ids = {i for i, *_ in new} | {i for i, *_ in apart}
                return [i in ids for i, *_ in checked]
            if self.log is not None and new:
                self.log.write_feedback_many([(k, r, c) for _, k, r, c in new])  # one transaction: all or none
            accepted = [False] * (len(checked))
            position = {i: n for n, (i, *_) in enumerate(checked)}
            for i, decision_id, reward, constraints in new:
                self._queue(decision_id, self.pending.pop(decision_id), reward, constraints)
                accepted[position[i]] = True
            # outcomes metric by metric: each row's new metrics logged (its own transaction) and queued, in order
            for i, key, reward, constraints in apart:
                accepted[position[i]] = self._apart_locked(key, self.pending[key], reward, constraints)
        return accepted

    def _checked_rows(self, rows) -> tuple[list[tuple], list[tuple]]:
        """``feedback_many``'s first pass: ``([(i, decision_id, reward, constraints)], [(i, id, problem)])``,
        each row's outcome checked and coerced (``_outcome``), the bad ones named."""
        checked, problems = [], []
        for i, row in enumerate(rows):
            try:
                decision_id, reward, constraints = row
            except (TypeError, ValueError):
                problems.append((i, "", "expected (decision_id, reward, constraints)"))
                continue
            try:
                reward, constraints = self._outcome(reward, constraints)
            except (TypeError, ValueError) as exc:
                problems.append((i, str(decision_id)[:80], str(exc)))
                continue
            checked.append((i, decision_id, reward, constraints))
        return checked, problems

    def _queue(self, decision_id: str, entry: dict, reward: float, constraints) -> None:
        self.queued.append({"decision_id": decision_id, "reward": reward, "constraints": constraints, **entry})
        if len(self.queued) >= self.update_every:
            self.refresh()

    def refresh(self) -> int:
        """Apply the queued feedback to the posterior now; returns how many were applied."""
        with self._lock:
            n = len(self.queued)
            with self._quiet():
                self._apply(self.queued)
            self.queued = []
            if n:
                self.model_version += 1
            return n

    def _apply(self, queued: list[dict]) -> None:
        """``policy.update`` with each queued outcome, in order (checked when it was received)."""
        watch = self._drift_watched() if self._drifting else None  # the alarms before these rows (issue 43)
        learn_values = getattr(self.policy, "_learn_values", None)
        for q in queued:
            if self._held_pending:  # the constraint metrics learned now leave the margin (pending="margin")
                self._release(q)
            # one float64 array [[features, reward, constraints]] (the same numbers as torch.tensor of the
            # floats) and tensors on numpy's views of it: no tensor operation for the slicing (1.2 us
            # for the array against 3 for torch.tensor, 0.6 a view against 1 to 1.5)
            f, cs = q["features"], q["constraints"]
            if _partial(q["reward"], cs):
                self._learn_apart(q)
                if watch is not None:
                    self._watch_drift(watch, q.get("decision_id"))
                continue
            d = len(f)
            row = np.array([[*f, q["reward"], *(cs or ())]], dtype=np.float64)
            # TS-ASC of conjugate models: update's one-row path without its second look at these rows, the
            # models held jointly learning them together (ts_asc.TSASC._learn_values), else update
            if learn_values is None or cs is None or not learn_values(row, d):
                x, y = torch.from_numpy(row[:, :d]), torch.from_numpy(row[:, d])
                c = None if cs is None else torch.from_numpy(row[:, d + 1:])
                self.policy.update(x, y, c, actions=_index(q["action"]))
            if watch is not None:
                self._watch_drift(watch, q.get("decision_id"))

    def _learn_apart(self, q: dict) -> None:
        """The models of the metrics ``q`` reports learn them (its other metrics are not known yet):
        TS-ASC's update, model by model (``_check_apart`` admitted the policy)."""
        policy = self.policy
        x = torch.tensor([q["features"]], dtype=torch.float64)
        actions = _index(q["action"])
        values = [q["reward"], *(q["constraints"] or ())]
        for model, value in zip((policy.reward_model, *policy.constraint_models), values):
            if value is not None:
                model.update(x, torch.tensor([float(value)], dtype=torch.float64), actions=actions)

    # ------------------------------------------------------------------ pending outcomes (issue 45)
    def _hold(self, key: str, features, constraints) -> None:
        """Hold decision ``key``'s constraint metrics ``constraints`` as pending (TS-ASC ``pending="margin"``)."""
        cols = [int(j) for j in constraints]
        if not cols:
            return
        self.policy.hold_pending(torch.tensor([features], dtype=torch.float64), cols)
        self._held_pending[key] = sorted(set(self._held_pending.get(key, [])) | set(cols))

    def _release(self, q: dict) -> None:
        """Release the held constraint metrics that the queued outcome ``q`` reports: its models learn them now."""
        key = q.get("decision_id")
        held = self._held_pending.get(key)
        if not held:
            return
        values = q.get("constraints") or ()
        now = [j for j in held if j < len(values) and values[j] is not None]
        if not now:
            return
        self.policy.release_pending(torch.tensor([q["features"]], dtype=torch.float64), now)
        rest = [j for j in held if j not in now]
        if rest:
            self._held_pending[key] = rest
        else:
            del self._held_pending[key]

    def _hold_all(self) -> None:
        """Hold every constraint metric the models have not learned yet (after ``load``): the pending decisions'
        unknown metrics and the queued outcomes' constraint metrics, not applied yet."""
        self.policy.clear_pending()
        self._held_pending = {}
        C = int(self.policy.num_constraints)
        for key, entry in self.pending.items():
            known = entry.get("known") or [False] * (1 + C)
            self._hold(key, entry["features"], [j for j in range(C) if not known[j + 1]])
        for q in self.queued:
            values = q.get("constraints") or ()
            self._hold(q["decision_id"], q["features"], [j for j, v in enumerate(values) if v is not None])

    # ------------------------------------------------------------------ the log
    def check_log(self, log: DecisionLog | str | Path | None = None) -> None:
        """Raise ``StateError`` (naming the log and the mismatch) unless ``log`` (default: this
        Decider's) is this state's decision log: written by this Decider (its ``decider_id``),
        not older than this state (every decision id it issued and every feedback it applied from
        the log's first id on are there, with the same actions), and past this state's counter
        only the unbroken run of ids a crash after a snapshot leaves. Reads only."""
        log = self._log_arg(log)
        with self._lock:
            problem = _log_mismatch(log, self.decider_id, self.next_id, self.pending)
        if problem:
            raise StateError(f"{log.path}: not the decision log of this Decider state: {problem}")

    def replay(self, log: DecisionLog | str | Path | None = None) -> dict:
        """Bring this state up to date with its decision log; returns ``{"decisions": n, "feedback": m}``.

        ``check_log`` first (nothing is applied if it fails). Then the decisions the log holds past
        this state's counter (made after its snapshot) become pending, and the counter moves past
        them so no id is issued twice; the random stream is reseeded from ``(seed, counter)``,
        since the snapshot's would repeat the lost decisions' draws. Then the feedback logged for
        every pending decision is applied, in the order it was logged (the batches of
        ``update_every`` fall as they did). Feedback this state already applied is for decisions
        no longer pending, so a second ``replay`` applies nothing. ``log`` defaults to this
        Decider's; a Decider without one adopts ``log`` and writes to it from then on.
        """
        log = self._log_arg(log)
        with self._lock:
            problem = _log_mismatch(log, self.decider_id, self.next_id, self.pending)
            if problem:
                raise StateError(f"{log.path}: not the decision log of this Decider state: {problem}")
            later = log.decisions_from(self.next_id)
            dims = {getattr(m, "dim", None) for m in self.policy.models().values()}
            dim = dims.pop() if len(dims) == 1 else None
            per_arm = _per_arm(self.policy) is not None
            added = {}
            for decision_id, action, num_actions, context in later:  # all checked before any is applied
                added[decision_id] = {"features": _played_features(context, action, num_actions, dim, per_arm,
                                                                   decision_id, log.path), "action": action}
                if self.outcome_windows:  # (its window counted from the replay: never closed early)
                    added[decision_id]["time"] = time.time()
            feedback = log.feedback_for([*self.pending, *added], with_time=True)
            late = log.outcomes_for([*self.pending, *added])
            if late:  # constraint outcomes logged apart from their reward, merged in the order they were logged
                C = int(getattr(self.policy, "num_constraints", 0))
                feedback = sorted(feedback + [(k, t, None, [v if i == j else None for i in range(C)])
                                              for k, j, v, t, _ in late], key=lambda row: row[1])
            if log.identity() is None and not log.read_only:
                log.bind(self.decider_id, self.next_id)
            if self.log is None:
                self.log = log
            if later:
                self.pending.update(added)
                if self._margin:  # decisions made after the snapshot: every constraint metric pending
                    for key, entry in added.items():
                        self._hold(key, entry["features"], range(int(self.policy.num_constraints)))
                self.next_id = int(later[-1][0]) + 1
                self._generator.manual_seed(int(np.random.SeedSequence([self.seed % 2**64, self.next_id]).generate_state(1)[0]))
            applied = 0
            for decision_id, _, reward, constraints in feedback:
                entry = self.pending.get(decision_id)
                if entry is None:
                    continue
                if entry.get("known") is not None or _partial(reward, constraints):
                    # (outcomes metric by metric) the log has them already: applied without writing them again
                    applied += self._apart_locked(decision_id, entry, reward, constraints, write=False)
                    continue
                del self.pending[decision_id]  # the log has it already: applied without writing it again
                self._queue(decision_id, entry, reward, constraints)
                applied += 1
            self.replayed = {"decisions": len(later), "feedback": applied}
            return dict(self.replayed)

    def _log_arg(self, log) -> DecisionLog:
        if log is None:
            if self.log is None:
                raise ValueError("log: this Decider has no decision log; pass one")
            return self.log
        if isinstance(log, (str, Path)):
            # a file path or a postgresql:// URL, compared as the log names itself (a URL without its password)
            if self.log is not None and log_location(log).resolve() == self.log.path.resolve():
                return self.log
            log = DecisionLog(log)
        if not isinstance(log, DecisionLog):
            raise TypeError(f"log: expected a DecisionLog or the path of one, got {type(log).__name__}")
        if self.log is not None and log is not self.log and log.path.resolve() != self.log.path.resolve():
            raise ValueError(f"log: this Decider writes to {self.log.path}; it replays that log, not {log.path}")
        return log

    # ------------------------------------------------------------------ state
    def save(self, directory) -> Path:
        """Write the policy and this Decider's bookkeeping to ``directory``, whole or not at all."""
        with self._lock:
            meta = {"format": FORMAT, "version": VERSION, "decider_id": self.decider_id,
                    "feature_names": self.feature_names,
                    "num_draws": self.num_draws, "update_every": self.update_every, "seed": self.seed,
                    "model_version": self.model_version, "next_id": self.next_id, "pending": self.pending,
                    "queued": self.queued,
                    "generator": base64.b64encode(self._generator.get_state().numpy().tobytes()).decode(),
                    "id_key": base64.b64encode(self._id_key).decode(), "legacy_below": self._legacy_below,
                    "feature_limit": self.feature_limit, "outcome_limit": self.outcome_limit,
                    "outlier_sd": self.outlier_sd, "provenance": self.provenance} | self._extra_meta()
            if self.outcome_windows:
                names = metric_names(self.policy)
                meta["outcome_windows"] = {names[j + 1]: list(w) for j, w in self.outcome_windows.items()}
            with atomic_output_dir(directory, replace=True) as out:
                save_state(self.policy, out / "policy")
                self._save_extra(out)
                # the id key signs decision ids: readable by the owner only, whatever the umask (issue 40)
                fd = os.open(out / "decider.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(meta))
        return Path(directory)

    @classmethod
    def _restored(cls, policy, **settings) -> Decider:
        """A Decider of this class with the saved ``settings``, without a log (``load`` fills it in)."""
        out = cls.__new__(cls)
        Decider.__init__(out, policy, **settings)
        return out

    def _extra_meta(self) -> dict:
        """What a subclass adds to ``decider.json`` (``ReplicaDecider``: its watermark)."""
        return {}

    def _save_extra(self, out: Path) -> None:
        """What a subclass adds to the saved directory ``out`` (``ReplicaDecider``: its base)."""

    @classmethod
    def _read_extra(cls, directory: Path):
        """What a subclass reads from ``directory`` in ``load``'s one read of it (``ReplicaDecider``: its base)."""

    @classmethod
    def load(cls, directory, *, log: DecisionLog | str | Path | None = None, featurize: Callable | None = None,
             allow_imports: bool = False) -> Decider:
        """Resume from ``save``: the same posterior, pending decisions and id counter.

        With ``log`` (a ``DecisionLog`` or its path), the log is checked against the snapshot
        first (``check_log``: a ``StateError`` naming the log and the mismatch, raised before any
        problem of the policy files and with nothing applied or written), then ``replay``ed onto it
        (``replayed`` says what it applied): the Decider returned is the one that wrote the log.
        ``allow_imports``: import the module of a prior saved as ``module:function`` (a callable
        Pyro prior, e.g. of a Langevin model; ``bayes_safe.state.load_state``).

        The directory is read as one version: ``decider.json`` and the policy (and what a subclass
        adds) come from the same ``save``, read again when another process's ``save`` replaced
        the directory meanwhile (``_read_snapshot``; issue 40).
        """
        directory = Path(directory)
        meta_path = directory / "decider.json"
        try:
            text, policy, policy_error, extra = _read_snapshot(directory, cls._read_extra, allow_imports)
            meta = json.loads(text)
        except FileNotFoundError:
            raise StateError(f"{meta_path}: missing; expected a directory written by Decider.save") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateError(f"{meta_path}: not JSON ({exc})") from None
        except RecursionError:
            raise StateError(f"{meta_path}: not a Decider state (JSON nested too deep)") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise StateError(f"{meta_path}: not a Decider state (format {FORMAT!r})")
        if meta.get("version") != VERSION:
            raise StateError(f"{meta_path}: format version {meta.get('version')!r}; this bayes_safe reads {VERSION}")
        if "replica" in meta and not getattr(cls, "_replica", False):
            raise StateError(f"{meta_path}: a state saved by a replica (ReplicaDecider), whose posterior holds its "
                             "log's feedback up to row {}: load it with ReplicaDecider.load (bayes-safe serve "
                             "--replica); a one-process Decider would learn that feedback again".format(
                                 meta["replica"].get("log_seq") if isinstance(meta["replica"], dict) else "?"))
        try:
            next_id, model_version = int(meta["next_id"]), int(meta["model_version"])
            pending = {str(k): {"features": [float(x) for x in v["features"]], "action": int(v["action"])}
                       | ({"known": [bool(b) for b in v["known"]]} if v.get("known") is not None else {})
                       | ({"time": float(v["time"])} if v.get("time") is not None else {})
                       for k, v in dict(meta["pending"]).items()}
            queued = [{"decision_id": str(q["decision_id"]), "reward": None if q["reward"] is None else float(q["reward"]),
                       "constraints": None if q["constraints"] is None else [
                           None if c is None else float(c) for c in q["constraints"]],
                       "features": [float(x) for x in q["features"]], "action": int(q["action"])}
                      for q in meta["queued"]]
            decider_id = meta.get("decider_id")  # None: saved before states had one
            if decider_id is not None and not isinstance(decider_id, str):
                raise TypeError(f"decider_id {decider_id!r} is not a string")
            generator = torch.from_numpy(np.frombuffer(base64.b64decode(meta["generator"]), dtype=np.uint8).copy())
            id_key = meta.get("id_key")  # None: saved before ids were signed (they were '0', '1', ...)
            if id_key is not None:
                id_key = base64.b64decode(id_key, validate=True)
                if len(id_key) != 32:
                    raise ValueError(f"id_key of {len(id_key)} bytes, expected 32")
            legacy_below = int(meta.get("legacy_below", next_id if id_key is None else 0))
            limits = {k: meta[k] for k in ("feature_limit", "outcome_limit", "outlier_sd", "outcome_windows") if k in meta}
            _check_bookkeeping(next_id, model_version, legacy_below, pending, queued)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"{meta_path}: malformed Decider state ({type(exc).__name__}: {exc})") from None
        opened = None
        if isinstance(log, (str, Path)):
            log = opened = DecisionLog(log)
        elif log is not None and not isinstance(log, DecisionLog):
            raise TypeError(f"log: expected a DecisionLog or the path of one, got {type(log).__name__}")
        try:
            if log is not None:
                problem = _log_mismatch(log, decider_id, next_id, pending)
                if problem:
                    raise StateError(f"{log.path}: not the decision log of the state {meta_path}: {problem}")
                owner = log.identity()
                if decider_id is None and owner is not None:
                    decider_id = owner["decider_id"]  # an older state adopts the log it wrote
            if policy_error is not None:  # raised after the log's check, as when the policy was read here
                raise policy_error
            try:
                out = cls._restored(policy, feature_names=meta["feature_names"], num_draws=meta["num_draws"],
                                    update_every=meta["update_every"], featurize=featurize, seed=meta["seed"],
                                    **limits)
                dims = {getattr(m, "dim", None) for m in policy.models().values()} - {None}
                for key, entry in [*pending.items(), *((q["decision_id"], q) for q in queued)]:
                    if dims and len(entry["features"]) not in dims:
                        raise ValueError(f"decision {key!r} holds {len(entry['features'])} features; the policy's "
                                         f"models take {sorted(dims)}")
                out.model_version, out.next_id, out.pending, out.queued = model_version, next_id, pending, queued
                if out._margin:
                    out._hold_all()
                out._legacy_below = legacy_below
                if id_key is not None:
                    out._id_key = id_key
                out._generator.set_state(generator)
            except (KeyError, TypeError, ValueError, RuntimeError) as exc:
                raise StateError(f"{meta_path}: malformed Decider state ({type(exc).__name__}: {exc})") from None
            if decider_id is not None:
                out.decider_id = decider_id
            provenance = meta.get("provenance")
            if provenance is not None and not isinstance(provenance, dict):
                raise StateError(f"{meta_path}: malformed Decider state (provenance is a "
                                 f"{type(provenance).__name__}, expected an object)")
            out.provenance = provenance
            out._snapshot = (meta, extra)  # what the one read of the directory gave besides the policy
            if log is not None:
                out.log = log
                out.replay()
        except BaseException:
            if opened is not None:
                opened.close()
            raise
        return out

    # ------------------------------------------------------------------ drift (issue 43)
    @property
    def drift_alarms(self) -> dict[str, int]:
        """Per metric whose model detects changes (adaptive forgetting: ``forgetting="adaptive"`` or an
        ``AdaptiveForgetting``, conjugate, per-arm or ``inference="laplace"``), the alarms its detector
        has raised so far: the model's ``change_points`` summed (over arms for a per-arm model). Each
        alarm restarted that posterior from its base prior. Saved with the model, so it counts since
        the model was made, across restarts, and a replica's equals every other replica's at the same
        ``log_seq``; ``{}`` when no model detects changes. Each new alarm is logged as a WARNING
        (logger ``bayes_safe.online.decider``); ``/metrics``: ``bayes_safe_drift_alarms_total``."""
        return {name: _change_count(model) for name, model in _drift_sources(self.policy)}

    @property
    def drift_observations(self) -> dict[str, list[int]]:
        """Per metric whose model detects changes, the observations each of its posteriors (one, or
        one per arm) has learned since its last alarm (or since it was made): how much of the
        current world it has seen. ``/metrics``: ``bayes_safe_drift_observations_since_change``."""
        out = {}
        for name, model in _drift_sources(self.policy):
            det = _detector_of(model)
            if det is not None:
                out[name] = [int(n) for n in det.since.reshape(-1).tolist()]
        return out

    def _drift_watched(self) -> tuple:
        """``(policy, [(metric, model)], alarms so far)`` before ``_apply`` learns rows: kept from the
        last rows (``_watch_drift`` moves the counts), made again for a new policy (a replica's repair)."""
        watch = self._drift_watch
        if watch is None or watch[0] is not self.policy:
            sources = _drift_sources(self.policy)
            watch = self._drift_watch = (self.policy, sources, [_change_count(m) for _, m in sources])
        return watch

    def _watch_drift(self, watch: tuple, decision_id) -> None:
        """After ``_apply`` learned the feedback of ``decision_id`` (the log's key, the decision's
        number): a WARNING for each model whose detector raised an alarm at it (and restarted)."""
        _, sources, seen = watch
        for i, (name, model) in enumerate(sources):
            count = _change_count(model)
            if count > seen[i]:
                _logger.warning("drift alarm: the %s model detected a change at the feedback of decision %s and "
                                "restarted from its base prior (%d alarm(s) on it so far)", name, decision_id, count,
                                extra={"event": "drift_alarm", "metric": name, "decision_id": decision_id,
                                       "alarms": count, "new_alarms": count - seen[i]})
            seen[i] = count

    def __repr__(self) -> str:
        return (f"Decider({type(self.policy).__name__}, model_version={self.model_version}, decisions={self.next_id}, "
                f"pending={len(self.pending)}, queued={len(self.queued)})")


def _detector_of(model):
    """The change detector (``CusumDetector``) of a model with adaptive forgetting (a per-arm
    model's is its arms'), or None."""
    for m in (model, getattr(model, "arms", None)):
        det = getattr(m, "_detector", None) if m is not None else None
        if det is not None:
            return det
    return None


def _change_count(model) -> int:
    """The alarms ``model``'s detector has raised (``change_points`` summed over its batch or arms)."""
    det = _detector_of(model)
    if det is not None:
        # tolist: 1 us against 10 for a tensor sum (it runs after each feedback row learned)
        return sum(det.alarms.reshape(-1).tolist())  # (a list's sum: a fifth of a tensor sum's cost)
    points = getattr(model, "change_points", None)
    return 0 if points is None else int(torch.as_tensor(points).sum())


def _drift_sources(policy) -> list[tuple[str, object]]:
    """``[(metric name, model)]`` of the models of ``policy`` that detect changes (issue 43): the
    reward's and each constraint's, named as ``/metrics`` names them (``metrics.metric_names``);
    another role by its role."""
    names = metric_names(policy)
    out = []
    for role, model in policy.models().items():
        if _detector_of(model) is None and getattr(model, "change_points", None) is None:
            continue
        role = str(role)
        index = 0 if role == "reward" else (int(role[10:]) + 1 if role.startswith("constraint")
                                             and role[10:].isdigit() else None)
        out.append((names[index] if index is not None and index < len(names) else role, model))
    return out
