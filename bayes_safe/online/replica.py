"""Replicas: several Deciders serving one stream of decisions from one PostgreSQL decision log.

```python
from bayes_safe.online import Decider, ReplicaDecider

Decider(policy, seed=0).save("state/")          # once: the prior, the id key, the settings
r1 = ReplicaDecider.load("state/", log="postgresql://app@db:5432/decisions")
r2 = ReplicaDecider.load("state/", log="postgresql://app@db:5432/decisions")
d = r1.decide(candidates, baseline=0)
r2.feedback(d.decision_id, reward=1.0, constraints=[0.0])   # any replica takes any decision's feedback
r1.sync(); r2.sync()                              # both posteriors now hold it, in the same order
```

(``bayes-safe serve STATE_DIR --log postgresql://... --replica`` runs one per process and
syncs every ``--sync-every`` seconds.)

**The log is the posterior.** A replica's posterior is its snapshot's updated with every feedback
row the log committed after the snapshot's watermark ``log_seq``, one row at a time in the log's
order, and nothing else. Feedback sent to a replica is written to the log (committed before it
is acknowledged) and learned, like everyone else's, at the next ``sync``. So every replica that
has synced to the same row holds the posterior of the prior updated once with the same feedback
in the same order: for conjugate Gaussian and Normal-Inverse-Gamma models the same numbers on
every replica, and the numbers one process gets from that feedback (``benchmarks/replicas.py``
measures the largest difference). The log orders feedback by commit: its writers take turns on
one PostgreSQL advisory lock (``DecisionLog.write_feedback_shared``), so a row that commits
later has a larger ``seq`` and a sync never skips one.

**Other engines** learn the same rows in the same order: a Gibbs or Langevin chain, a NUTS / SVI
refit, the probit GP condition on the same data on every replica; their posterior *samples*
differ (each replica's chain runs on its own random stream), as two runs of one process with
different seeds do. So a model of theirs that detects changes (``forgetting="adaptive"``) is
refused by name: its change test reads that replica's own draws, and one replica could restart
at a row where another does not, after which their posteriors hold different data (issue 43: a
restart follows the same rule on every replica). The conjugate engines, the laplace engine and
``PerArmLinear`` test a deterministic predictive and are served on replicas with it.

``model_version`` of a replica is the number of feedback rows its posterior holds: the same on
every replica at the same point of the log, and recorded with every decision. ``update_every``
does not apply (a replica learns at each sync).

**Decision ids** stay ``'<n>-<tag>'`` under the key every replica loaded from the same state, so
any replica checks any id. The numbers ``n`` come from the log in blocks of ``NUMBER_BLOCK``
(``DecisionLog.reserve_numbers``): unique across replicas, with gaps (a killed replica leaves
the rest of its block unused). The log, not a replica, holds the decisions that wait for
feedback.

**Faults.** Nothing is acknowledged before its log transaction commits, so a replica killed at
any moment loses nothing acknowledged; a replica restarted from a snapshot learns the rows past
the snapshot's ``log_seq`` exactly once (the watermark and the posterior are saved together, and
``load`` reads them from one version of the snapshot directory: ``Decider.load`` reads it again
when a save replaced it meanwhile).
While the database is down, decisions and feedback raise ``LogUnavailable`` (the service answers
503) and ``sync`` raises it too; the next call connects again.

**The invariant** (issue 40): after ``load`` and after every sync that learned rows, ``check``
compares the feedback rows the posterior holds (``applied``; at ``load`` also the rows each
model counts itself, against the counts its snapshot recorded) with the log's rows up to
``log_seq`` (one count query). A mismatch is logged as a warning (logger
``bayes_safe.online.replica``), counted in ``repairs``, and repaired before the posterior serves
again: the snapshot's *base* (the posterior the replica state began from, with its watermark,
carried in ``STATE_DIR/base/`` by every snapshot) replayed with the log's rows. A snapshot
without a base whose check fails raises ``StateError``.

**Starting from a one-process state.** ``load`` takes a state saved by ``Decider.save`` (with or
without a log behind it): it first reads the log's last feedback row ``W``, then brings the
state up to date as ``Decider.replay`` would with the feedback up to ``W`` (the decisions made
after the snapshot, the feedback of every decision that was pending) and carries on from ``W``.
Replicas started at different times from the same one-process state end with the same
posterior. A state saved by a replica is refused by ``Decider.load`` (and by a one-process
``bayes-safe serve``), which would apply its log's feedback a second time.

**Reading a saved state** (tuning and off-policy evaluation from the log: ``bayes-safe tune
decision-log``, ``bayes_safe.online.tuning.LoggedAlpha``): ``saved_policy(directory, log=...)``
reads the posterior of a state saved by ``Decider.save`` or by a replica, writing nothing, after
checking that the log was written by that state (``StateError`` naming both otherwise).
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
import threading
from pathlib import Path

import torch

from ..models.linear import SAMPLED_ENGINES
from ..state import StateError, load_state, save_state
from .decider import (
    Decider,
    FeedbackRowsError,
    _detector_of,
    _log_mismatch,
    _partial,
    _per_arm,
    _played_features,
    _unknown_id,
)
from .log import NUMBER_BLOCK, DecisionLog

__all__ = ["ReplicaDecider", "saved_policy"]

_logger = logging.getLogger(__name__)
#: the directory of a replica snapshot that holds its base: the posterior it replays from on a repair
BASE = "base"
#: the key of ``decider.json`` that holds the rows each model counts and the base's watermark
CHECK = "replica_check"


def _refuse_sampled_detectors(policy) -> None:
    """A ``ValueError`` naming the model when ``policy`` holds a model of a sampled engine with
    adaptive forgetting (module docstring: its restarts would differ between replicas)."""
    for role, model in policy.models().items():
        engine = getattr(model, "engine_name", None)  # (a per-arm model's arms are conjugate)
        if _detector_of(model) is not None and engine in SAMPLED_ENGINES:
            raise ValueError(
                f"policy: the {role} model (the {engine} engine) detects changes (forgetting='adaptive') "
                "from its own posterior draws, which differ between replicas, so replicas could restart it at "
                "different rows; serve it from one process (Decider), or give replicas a conjugate or "
                "inference='laplace' model for adaptive forgetting")


class ReplicaDecider(Decider):
    """A ``Decider`` that shares its stream with other replicas through one PostgreSQL log (module docstring).

    Made by ``ReplicaDecider.load(directory, log=url)`` from a state saved by ``Decider.save``
    or by a replica, or new: ``ReplicaDecider(policy, log=url, ...)`` with ``Decider``'s arguments
    and a log no Decider has written to.

    Attributes:
        log_seq: the ``seq`` of the last log feedback row the posterior holds (the watermark).
        applied: the number of feedback rows the posterior holds (= ``model_version``).
        decided: decisions this replica made since it started; ``received``: feedback it accepted.
        repairs: the times this replica found its posterior did not hold exactly the log's rows up
            to its watermark and rebuilt it from its base (``check``; each one logs a warning).
    """

    _replica = True

    def __init__(self, policy, *, log=None, **kwargs):
        if log is None:
            raise ValueError("log: a ReplicaDecider needs its PostgreSQL decision log (postgresql://...)")
        _refuse_sampled_detectors(policy)
        log = _shared_log(log)
        super().__init__(policy, log=log, **kwargs)
        self._start_replica(log_seq=0, applied=0)
        self._allow_imports = False
        self._base = self._own_base()  # the prior, at row 0

    def _start_replica(self, log_seq: int, applied: int) -> None:
        self.log_seq, self.applied = int(log_seq), int(applied)
        self.model_version = self.applied
        self.decided = self.received = 0
        self.repairs = getattr(self, "repairs", 0)
        self._unchecked = False  # rows learned since the last check
        self._block_end = self.next_id  # the first decision reserves a block
        self._sync_lock = threading.Lock()
        self._tally = threading.Lock()  # decided and received: counted by the threads that write the log
        self.pending.clear()
        self.queued = []
        # decisions some but not all of whose metrics the posterior holds: {key: [known per metric]}, so a
        # metric the log holds twice (two reports racing) is learned once, the first in the log's order
        self._apart = getattr(self, "_apart", {})

    def _new_metrics(self, key: str, reward, constraints) -> list:
        """The values of a log row the posterior does not hold yet (None elsewhere), and the bookkeeping
        of ``_apart`` moved past it: a complete row of a decision not met before is all new."""
        C = int(getattr(self.policy, "num_constraints", 0))
        values = [reward, *(constraints or ())]
        values += [None] * (1 + C - len(values))
        known = self._apart.get(key)
        if known is None:
            if all(v is not None for v in values):
                return values
            known = [False] * (1 + C)
        new = [None if k else v for k, v in zip(known, values)]
        known = [k or v is not None for k, v in zip(known, values)]
        if all(known):
            self._apart.pop(key, None)
        else:
            self._apart[key] = known
        return new

    # ------------------------------------------------------------------ deciding
    def decide(self, features, baseline: int | None = None, valid=None):
        """``Decider.decide``, numbered from this replica's block of the log's decision numbers."""
        decision, row = self.decide_unlogged(features, baseline, valid)
        self.log.write_decision(*row)
        self.count("decided")
        return decision

    def decide_unlogged(self, features, baseline: int | None = None, valid=None) -> tuple:
        """``(decision, row)``: the decision, made under the lock, and the arguments of
        ``DecisionLog.write_decision`` that log it, for the caller to write after the lock is let
        go (the service's ``GroupCommit``, while the next request decides), then ``count("decided")``.
        The decision is issued only once written; a write that fails leaves its number unused
        (numbers have gaps)."""
        prepared = self._prepare(features, baseline, valid)
        with self._lock:
            if self.next_id >= self._block_end:
                start = self.log.reserve_numbers(self.next_id)
                self.next_id, self._block_end = start, start + NUMBER_BLOCK
            decision, row, _ = self._decision(*prepared)  # nothing pending: the log holds what waits
            self.next_id += 1
        return decision, row

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to ``decided`` or ``received`` (counted by whoever wrote the rows, from any thread)."""
        with self._tally:
            setattr(self, what, getattr(self, what) + n)

    def _issued(self, number: int) -> bool:
        return True  # a valid tag names a number some replica issued; the log says whether it was logged

    # ------------------------------------------------------------------ feedback
    def feedback(self, decision_id: str, reward=None, constraints=None) -> bool:
        """Write the outcome to the log (committed before this returns); True if new, False for a
        duplicate. Learned at the next ``sync``, by every replica. Outcomes may arrive metric by
        metric (``Decider.feedback``): the log keeps each metric of a decision once."""
        key, reward, constraints = self.feedback_row(decision_id, reward, constraints)
        if _partial(reward, constraints):
            return self.feedback_written(decision_id, self.log.write_apart_shared([(key, reward, constraints)])[0])
        new = self.log.write_feedback_shared([(key, reward, constraints)])[0]
        if new is False:  # the decision has a report: the metrics of this one it lacks, if any
            new = self.log.write_apart_shared([(key, reward, constraints)])[0]
        return self.feedback_written(decision_id, new)

    def feedback_row(self, decision_id: str, reward, constraints=None) -> tuple:
        """``(log key, reward, constraints)`` of an outcome checked as ``feedback`` checks it (an id
        this state's key did not make raises), for the caller to write (``GroupCommit``), then
        hand its answer to ``feedback_written``."""
        reward, constraints = self._outcome(reward, constraints)
        if _partial(reward, constraints):
            self._check_apart()
        key = self._resolve(decision_id)
        if self.outlier_sd is not None:
            problem = self._guard({key: (reward, constraints)}).get(key)
            if problem:
                raise ValueError(problem)
        return key, reward, constraints

    def _guard(self, outcomes: dict) -> dict[str, str]:
        """The outlier guard (``Decider._outlier``) for replicas: ``{key: message}`` of the outcomes
        ``{key: (reward, constraints)}`` that lie too far from this replica's posterior, the played
        features read from the log (one query); keys the log lacks are left to the caller."""
        if self.outlier_sd is None or not any(m is not None for m in self._guarded):
            return {}
        dims = {getattr(m, "dim", None) for m in self.policy.models().values()}
        dim = dims.pop() if len(dims) == 1 else None
        per_arm = _per_arm(self.policy) is not None
        logged = self.log.decisions_of(outcomes)
        found = {}
        with self._lock:  # the posterior as the last sync left it (a sync holds the lock)
            for key, (action, K, ctx) in logged.items():
                entry = {"features": _played_features(ctx, action, K, dim, per_arm, key, self.log.path),
                         "action": action}
                outlying = self._outlying(entry, *outcomes[key])
                if outlying:
                    found[key] = outlying
        if found:  # a metric the log knows already: a repeat is acknowledged and ignored, never judged
            known = self.log.known_metrics(list(found))
            for key in list(found):
                found[key] = [(m, text) for m, text in found[key] if m not in known.get(key, ())]
                if not found[key]:
                    del found[key]
        with self._lock:
            for outlying in found.values():
                for metric, _ in outlying:
                    self.outliers[metric] += 1
        return {key: outlying[0][1] for key, outlying in found.items()}

    def feedback_written(self, decision_id: str, new: bool | None) -> bool:
        """``feedback``'s answer for the log's answer ``new`` to the row of ``decision_id`` (counted)."""
        if new is None:  # a tag this state's key made, for a number whose decision was never logged
            raise _unknown_id(decision_id)
        if new:
            self.count("received")
        return new

    def feedback_many(self, rows, *, check_only: bool = False) -> list[bool]:
        """``Decider.feedback_many`` for replicas: every row checked (unknown ids named) before one
        log transaction writes them all; learned at the next ``sync``."""
        rows_checked, problems = self._checked_rows(rows)
        checked = []
        for i, decision_id, reward, constraints in rows_checked:
            try:
                if _partial(reward, constraints):
                    self._check_apart()
                key = self._resolve(decision_id)
            except ValueError as exc:
                problems.append((i, str(decision_id)[:80], str(exc)))
                continue
            checked.append((i, decision_id, key, reward, constraints))
        keys = {key for _, _, key, _, _ in checked}
        logged = self.log.actions_of(keys)
        problems += [(i, str(k)[:80], str(_unknown_id(k))) for i, k, key, _, _ in checked if key not in logged]
        if self.outlier_sd is not None:
            outlying = self._guard({key: (r, c) for _, _, key, r, c in checked if key in logged})
            problems += [(i, str(k)[:80], outlying[key]) for i, k, key, _, _ in checked if key in outlying]
        if problems:
            raise FeedbackRowsError(sorted(problems))
        if check_only:
            known = {k: set(v) for k, v in self.log.known_metrics(keys).items()}
            out = []
            for _, _, key, r, c in checked:
                metrics = {m for m, v in enumerate([r, *(c or ())]) if v is not None} - known.setdefault(key, set())
                out.append(bool(metrics))
                known[key] |= metrics
            return out
        if not checked:
            return []
        rows = [(key, r, c) for _, _, key, r, c in checked]
        if any(_partial(r, c) for _, r, c in rows):
            out = self.log.write_apart_shared(rows)  # some metric by metric: each row's new metrics, one transaction
        else:
            out = self.log.write_feedback_shared(rows)
            again = [n for n, x in enumerate(out) if x is False]
            if again:  # decisions with a report already: the metrics of these rows they lack, if any
                for n, x in zip(again, self.log.write_apart_shared([rows[n] for n in again])):
                    out[n] = x
        accepted = [bool(x) for x in out]
        self.count("received", sum(accepted))
        return accepted

    def refresh(self) -> int:
        """``sync``: a replica learns from the log, not from a queue of its own."""
        return self.sync()

    # ------------------------------------------------------------------ learning from the log
    def fetch(self, limit: int = 10_000) -> list[tuple]:
        """The feedback rows the log committed past ``log_seq`` (at most ``limit``; reads only).

        When rows were ``learn``ed since the last ``check``, it runs first (one count query): a
        service that syncs by ``fetch`` and ``learn`` (``bayes-safe serve``, in chunks) has each
        sync's rows checked at the start of its next sync; ``sync`` checks at its end."""
        if self._unchecked:
            self._unchecked = False
            self._checked(self._log_problem())
        return self.log.feedback_since(self.log_seq, limit)

    def learn(self, rows) -> int:
        """Apply ``fetch``'s rows to the posterior in the log's order and move ``log_seq`` past them.
        Rows at or below ``log_seq`` (read twice) are skipped; returns how many were applied."""
        dims = {getattr(m, "dim", None) for m in self.policy.models().values()}
        dim = dims.pop() if len(dims) == 1 else None
        per_arm = _per_arm(self.policy) is not None
        with self._lock:
            rows = [r for r in rows if r[0] > self.log_seq]
            if not rows:
                return 0
            entries = [{"decision_id": k, "reward": y, "constraints": c, "action": a,
                        "features": _played_features(ctx, a, K, dim, per_arm, k, self.log.path)}
                       for _, k, y, c, a, K, ctx in rows]
            with self._quiet():
                for entry, row in zip(entries, rows):
                    if self._apart or _partial(entry["reward"], entry["constraints"]):
                        new = self._new_metrics(entry["decision_id"], entry["reward"], entry["constraints"])
                        entry["reward"], entry["constraints"] = new[0], new[1:] or None
                    if entry["reward"] is not None or any(v is not None for v in entry["constraints"] or ()):
                        self._apply([entry])
                    self.log_seq, self.applied = row[0], self.applied + 1  # moved with each row applied
            self.model_version = self.applied
            self._unchecked = True
            return len(rows)

    def sync(self, limit: int = 10_000) -> int:
        """Learn every feedback row the log committed since the last sync (``fetch`` then
        ``learn``, in pages of ``limit``); returns how many. One sync runs at a time. A sync that
        learned rows then ``check``s the posterior against the log (one count query)."""
        with self._sync_lock:
            total = self._learn_all(self, limit)
            if self._unchecked:
                self._unchecked = False
                self._checked(self._log_problem())
            return total

    @staticmethod
    def _learn_all(target: ReplicaDecider, limit: int = 10_000) -> int:
        """Learn every row past ``target.log_seq`` (``fetch`` without its check)."""
        total = 0
        while True:
            rows = target.log.feedback_since(target.log_seq, limit)
            total += target.learn(rows)
            if len(rows) < limit:
                return total

    # ------------------------------------------------------------------ the invariant
    def _log_problem(self) -> str | None:
        """None when the posterior holds as many feedback rows as the log has up to the watermark."""
        with self._lock:
            seq, applied = self.log_seq, self.applied
        count = self.log.feedback_count(through=seq)
        if count != applied:
            return (f"its posterior holds {applied} feedback rows but the log {self.log.path} has {count} up to its "
                    f"watermark log_seq {seq}")
        return None

    def check(self) -> bool:
        """Check the invariant: the posterior holds exactly the log's feedback rows up to ``log_seq``
        (their number, counted in the log with one query). On a mismatch, warn (the ``bayes_safe``
        logger), count it in ``repairs`` and rebuild the posterior from the base: the snapshot's
        posterior proven consistent (the prior of a new log, the state a first load converted),
        replayed with the log's rows, before it serves again; a ``StateError`` if that fails.
        Returns True when the posterior was already consistent. ``load`` and every ``sync`` that
        learned rows run it."""
        with self._sync_lock:
            return self._checked(self._log_problem())

    def _checked(self, problem: str | None) -> bool:
        if problem is None:
            return True
        self.repairs += 1
        _logger.warning("replica: %s; rebuilding the posterior from its base (repair %d)", problem, self.repairs)
        self._repair(problem)
        again = self._log_problem()
        if again is not None:
            raise StateError(f"replica: the posterior rebuilt from its base is not the log's either: {again}")
        return False

    def _own_base(self) -> dict:
        """This posterior as the base: its policy's files, watermark and per-model counts."""
        with self._lock, tempfile.TemporaryDirectory(prefix="bayes_safe_base_") as tmp:
            save_state(self.policy, Path(tmp) / "policy")
            files = {name: (Path(tmp) / name).read_bytes() for name in sorted(os.listdir(tmp))}
            return {"log_seq": self.log_seq, "applied": self.applied, "learned": _learned(self.policy),
                    "apart": {k: list(v) for k, v in self._apart.items()}, "files": files}

    def _base_policy(self):
        with tempfile.TemporaryDirectory(prefix="bayes_safe_base_") as tmp:
            for name, data in self._base["files"].items():
                (Path(tmp) / name).write_bytes(data)
            return load_state(Path(tmp) / "policy", allow_imports=self._allow_imports)

    def _repair(self, problem: str) -> None:
        """Replace the posterior by the base's replayed with the log's rows past its watermark
        (built aside, then swapped in under the lock: nothing half-built is served)."""
        base = self._base
        if base is None:
            raise StateError(f"replica: {problem}, and its snapshot holds no base to rebuild from (a snapshot written "
                             "before issue 40): load it from the one-process state it was converted from")
        policy = self._base_policy()
        if _learned(policy) != base["learned"]:
            raise StateError(f"replica: {problem}, and its base's models hold {_learned(policy)} rows where the "
                             f"snapshot records {base['learned']}")
        count = self.log.feedback_count(through=base["log_seq"])
        if count != base["applied"]:
            raise StateError(f"replica: {problem}, and its base holds {base['applied']} rows where the log has {count} "
                             f"up to its watermark {base['log_seq']}")
        shadow = copy.copy(self)
        shadow.policy, shadow._lock = policy, threading.RLock()
        shadow.log_seq, shadow.applied = int(base["log_seq"]), int(base["applied"])
        shadow._apart = {k: list(v) for k, v in base.get("apart", {}).items()}
        shadow._unchecked = False
        self._learn_all(shadow)
        with self._lock:
            self.policy = shadow.policy
            self.log_seq, self.applied = shadow.log_seq, shadow.applied
            self._apart = shadow._apart
            self.model_version = self.applied

    # ------------------------------------------------------------------ state
    def _extra_meta(self) -> dict:
        # "replica": the watermark; CHECK: what load checks the posterior against (the rows each model
        # counts) and the base's watermark and counts (its files are in BASE)
        check = {"learned": _learned(self.policy)}
        if self._base is not None:
            # (the half-known decisions only when there are some: a state without them reads as before issue 45)
            check["base"] = {k: self._base[k] for k in ("log_seq", "applied", "learned", "apart") if self._base.get(k)
                             or k != "apart"}
        replica = {"log_seq": self.log_seq, "applied": self.applied}
        if self._apart:
            replica["apart"] = {k: list(v) for k, v in self._apart.items()}
        return {"replica": replica, CHECK: check,
                "next_id": max(self.next_id, self._block_end)}

    def _save_extra(self, out: Path) -> None:
        if self._base is not None:
            (out / BASE).mkdir()
            for name, data in self._base["files"].items():
                (out / BASE / name).write_bytes(data)

    @classmethod
    def _read_extra(cls, directory: Path):
        """The base's files (bytes by name), read with the rest of the snapshot; None without one."""
        try:
            names = sorted(os.listdir(directory / BASE))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return {name: (directory / BASE / name).read_bytes() for name in names}

    @classmethod
    def load(cls, directory, *, log=None, featurize=None, allow_imports: bool = False) -> ReplicaDecider:
        """A replica from a state saved by a replica or by ``Decider.save``, caught up with ``log``
        (module docstring). A ``StateError`` names the log and the mismatch when ``log`` is not
        the state's."""
        if log is None:
            raise ValueError("log: a ReplicaDecider needs its PostgreSQL decision log (postgresql://...)")
        directory = Path(directory)
        log, opened = (log, None) if isinstance(log, DecisionLog) else (None, log)
        if opened is not None:
            log = _shared_log(opened)
        else:
            _shared_log(log)
        try:
            out = super().load(directory, featurize=featurize, allow_imports=allow_imports)
            _refuse_sampled_detectors(out.policy)
            saved, base_files = out._snapshot  # decider.json and the base, read with the policy in one read
            meta = saved.get("replica")
            out._allow_imports = allow_imports
            problem = None
            owner = log.identity()
            if meta is not None:
                if owner is None or owner["decider_id"] != out.decider_id:
                    raise StateError(f"{log.path}: not the decision log of the replica state {directory} ("
                                     + ("no Decider has written to it" if owner is None else
                                        f"it is the log of Decider {owner['decider_id']}") + ")")
                seq, applied = int(meta["log_seq"]), int(meta["applied"])
                if log.feedback_high() < seq:
                    raise StateError(f"{log.path}: holds feedback up to row {log.feedback_high()} but the state "
                                     f"{directory} has learned up to row {seq}: the log is older than the snapshot")
                out.log = log
                out._apart = {str(k): [bool(b) for b in v] for k, v in dict(meta.get("apart") or {}).items()}
                out._start_replica(seq, applied)
                check = saved.get(CHECK) or {}
                problem = out._snapshot_problem(check, directory) or out._log_problem()
                base = check.get("base")
                if base is not None and base_files is not None:
                    out._base = {"log_seq": int(base["log_seq"]), "applied": int(base["applied"]),
                                 "learned": dict(base["learned"]), "files": base_files,
                                 "apart": {str(k): [bool(b) for b in v] for k, v in dict(base.get("apart") or {}).items()}}
                elif problem is None:  # a snapshot written before bases: proven consistent, it is the base
                    out._base = out._own_base()
                else:
                    out._base = None
            else:
                out._convert(log, directory)
                out._base = out._own_base()
            with out._sync_lock:
                out._checked(problem)
            out.sync()
        except BaseException:
            if opened is not None:
                log.close()
            raise
        return out

    def _snapshot_problem(self, check: dict, directory: Path) -> str | None:
        """None when the loaded posterior's models hold the rows its snapshot records for each."""
        recorded = check.get("learned")
        if recorded is None:  # a snapshot written before the counts were recorded
            return None
        held = _learned(self.policy)
        if held != recorded:
            return (f"the posterior loaded from {directory} holds {held} feedback rows per model where its snapshot "
                    f"records {recorded} (watermark log_seq {self.log_seq})")
        return None

    def _convert(self, log: DecisionLog, directory: Path) -> None:
        """Bring a one-process state up to the log's feedback row ``W`` read first (module docstring)."""
        problem = _log_mismatch(log, self.decider_id, self.next_id, self.pending, replicas=True)
        if problem:
            raise StateError(f"{log.path}: not the decision log of the state {directory}: {problem}")
        high = log.feedback_high()  # first: a row committed after this read has a larger seq, learned by sync
        dims = {getattr(m, "dim", None) for m in self.policy.models().values()}
        dim = dims.pop() if len(dims) == 1 else None
        per_arm = _per_arm(self.policy) is not None
        waiting = dict(self.pending)
        for decision_id, action, num_actions, context in log.decisions_from(self.next_id):
            waiting[decision_id] = {"features": _played_features(context, action, num_actions, dim, per_arm,
                                                                 decision_id, log.path), "action": action}
        if log.identity() is None:
            log.bind(self.decider_id, self.next_id)
        self.log = log
        # the snapshot's queued feedback was logged before any feedback of its pending decisions
        entries = list(self.queued)
        self._apart = {k: list(v["known"]) for k, v in waiting.items() if v.get("known") is not None}
        C = int(getattr(self.policy, "num_constraints", 0))
        rows = [(s, k, r, c) for s, k, r, c in log.feedback_for(waiting, through=high, with_seq=True)]
        rows += [(s, k, None, [v if i == j else None for i in range(C)])
                 for s, k, j, v, _, _ in log.outcomes_for(waiting, through=high, with_seq=True)]
        for _, decision_id, reward, constraints in sorted(rows, key=lambda row: row[0]):
            new = self._new_metrics(decision_id, reward, constraints)
            entry = waiting[decision_id]
            if any(v is not None for v in new):
                entries.append({"decision_id": decision_id, "reward": new[0], "constraints": new[1:] or None,
                                "features": entry["features"], "action": entry["action"]})
        with self._lock, self._quiet():
            self._apply(entries)
        self._start_replica(high, log.feedback_count(through=high))
        self.replayed = {"decisions": 0, "feedback": len(entries)}


def _learned(policy) -> dict[str, int]:
    """The feedback rows each model of ``policy`` counts itself (``num_observations``, summed over
    arms), by role: read from the posterior's own files, unlike the snapshot's ``applied``."""
    out = {}
    for role, model in policy.models().items():
        n = getattr(model, "num_observations", None)
        if n is None:  # a per-arm model counts in its arms
            n = getattr(getattr(model, "arms", None), "num_observations", None)
        if n is None or callable(n):
            continue
        try:
            out[str(role)] = int(torch.as_tensor(n).sum())
        except (TypeError, ValueError, RuntimeError):
            continue
    return out


def _shared_log(log) -> DecisionLog:
    """``log`` as a PostgreSQL ``DecisionLog`` (a ``ValueError`` naming ``log`` for anything else)."""
    if isinstance(log, (str, Path)):
        log = DecisionLog(log)
    if not isinstance(log, DecisionLog):
        raise TypeError(f"log: expected a DecisionLog or a postgresql:// URL, got {type(log).__name__}")
    if log.kind != "postgresql":
        raise ValueError(f"log: replicas share a PostgreSQL decision log (postgresql://user@host:port/db); {log.path} "
                         "is an SQLite file, which serves one process")
    return log



class _StateReader(Decider):
    """``Decider.load`` of any saved state, one-process or replica, without a log and writing nothing
    (``saved_policy``): the snapshot as saved, for reading its policy."""

    _replica = True


def saved_policy(directory, *, log=None, allow_imports: bool = False):
    """The policy (the posterior) of a state saved by ``Decider.save`` or by a replica, read only.

    With ``log`` (a ``DecisionLog``, an SQLite path or a ``postgresql://`` URL, opened read-only
    when given as a path), first check that the log was written by that state, writing nothing;
    a ``StateError`` naming the log (a URL without its password) and the state otherwise:

    * a one-process state: ``Decider.load``'s check of a log (``_log_mismatch``: the same
      ``decider_id``, the state's pending decisions logged with the same actions, no feedback the
      state applied missing from the log ...); on PostgreSQL the decisions past the state's
      counter may be replicas' (numbered in blocks, with gaps);
    * a replica's state: ``ReplicaDecider.load``'s (the log is its Decider's, and holds exactly
      the feedback rows the snapshot's posterior learned up to its watermark ``log_seq``).

    Nothing is replayed: the policy is the snapshot's (what tuning from the log starts from)."""
    directory = Path(directory)
    out = _StateReader.load(directory, allow_imports=allow_imports)
    if log is None:
        return out.policy
    meta, _ = out._snapshot
    opened = None
    if isinstance(log, (str, Path)):
        log = opened = DecisionLog(log, read_only=True)
    elif not isinstance(log, DecisionLog):
        raise TypeError(f"log: expected a DecisionLog or the path of one, got {type(log).__name__}")
    try:
        problem = _state_log_problem(log, meta, out)
    finally:
        if opened is not None:
            opened.close()
    if problem:
        raise StateError(f"{log.path}: not the decision log of the state {directory}: {problem}")
    return out.policy


def _state_log_problem(log: DecisionLog, meta: dict, state: Decider) -> str | None:
    """Why ``log`` was not written by the saved state (``meta``, its ``decider.json``; ``state``, as
    loaded), or None (``saved_policy``)."""
    decider_id = meta.get("decider_id")
    replica = meta.get("replica")
    if replica is None:
        return _log_mismatch(log, decider_id, state.next_id, state.pending, replicas=log.kind == "postgresql")
    foreign = log.id_summary()["foreign"]
    if foreign:
        return f"{foreign} of its decision ids were not issued by a Decider (which issues '0', '1', ...): not a Decider's log"
    owner = log.identity()
    if owner is None:
        return f"no Decider has written to it; the replica state's Decider is {decider_id}"
    if owner["decider_id"] != decider_id:
        return (f"it is the log of another Decider (id {owner['decider_id']}; this replica state's id is "
                f"{decider_id})")
    try:
        seq, applied = int(replica["log_seq"]), int(replica["applied"])
    except (KeyError, TypeError, ValueError):
        raise StateError(f"the replica state of Decider {decider_id} has a malformed watermark {replica!r}") from None
    high = log.feedback_high()
    if high < seq:
        return (f"it holds feedback up to row {high} but the replica state has learned up to row {seq}: the log is "
                "older than the snapshot")
    count = log.feedback_count(through=seq)
    if count != applied:
        return (f"the replica state's posterior holds {applied} feedback rows but the log has {count} up to its "
                f"watermark log_seq {seq}")
    return None
