"""The decision log: every decision and its feedback, as they happen, in SQLite.

Each ``write_decision`` / ``write_feedback`` is one transaction (a row is written whole or not
at all, and a killed process loses at most the row being written). The log reads back as a
``pandas.DataFrame``, as the toolkit's ``bayes_safe.offline.LoggedData`` (for IPS, SNIPS, DR
and tuning from logs) and as obp's ``bandit_feedback`` dictionary (``to_obp``).

Schema (one row per decision; feedback joins by ``decision_id``):

* ``decisions``: ``decision_id`` (text, primary key), ``time`` (Unix seconds), ``action``
  (int), ``propensity`` (the probability of the played action under the posterior that
  decided), ``propensity_se``, ``model_version``, ``num_actions`` (K), ``context`` (JSON list:
  the decision's context vector, or its flattened candidate features), ``probabilities`` (JSON
  list, the Monte-Carlo probability of every action), ``baseline`` (int or NULL);
* ``feedback``: ``decision_id`` (primary key: feedback is idempotent), ``time``, ``reward``,
  ``constraints`` (JSON list or NULL);
* ``meta``: ``key``, ``value`` (text), created when a ``Decider`` first writes to the log:
  ``decider_id`` (the Decider the log belongs to) and ``first_id`` (its id counter then; the log
  holds the decisions from that id on). ``Decider.load`` and ``Decider.replay`` compare them with
  a snapshot and refuse a log that does not belong to it (``Decider.check_log``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["DecisionLog"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY, time REAL NOT NULL, action INTEGER NOT NULL, propensity REAL NOT NULL,
    propensity_se REAL NOT NULL, model_version INTEGER NOT NULL, num_actions INTEGER NOT NULL,
    context TEXT NOT NULL, probabilities TEXT NOT NULL, baseline INTEGER
);
CREATE TABLE IF NOT EXISTS feedback (
    decision_id TEXT PRIMARY KEY, time REAL NOT NULL, reward REAL NOT NULL, constraints TEXT
);
"""


class DecisionLog:
    """An append-only SQLite log of decisions and feedback.

    Args:
        path: the database file (created with its parent directory if missing).
        read_only: open an existing log for reading only (nothing is created or changed; a
            file that is not a decision log raises ``ValueError``).
    """

    def __init__(self, path, *, read_only: bool = False):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise ValueError(f"path: expected a database file, got the directory {self.path}")
        self._lock = threading.Lock()
        self.read_only = bool(read_only)
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"path: no such decision log {str(self.path)!r}")
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            try:
                tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            except sqlite3.DatabaseError as exc:
                self._db.close()
                raise ValueError(f"path: {self.path} is not a decision log (SQLite: {exc})") from None
            if not {"decisions", "feedback"} <= tables:
                self._db.close()
                raise ValueError(f"path: {self.path} is not a decision log (no 'decisions' and 'feedback' tables)")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise ValueError(f"path: {self.path} is not a decision log (SQLite: {exc})") from None

    # ------------------------------------------------------------------ writing
    def write_decision(self, decision_id: str, action: int, propensity: float, propensity_se: float,
                       model_version: int, context, probabilities, baseline: int | None = None) -> None:
        row = (str(decision_id), time.time(), int(action), float(propensity), float(propensity_se), int(model_version),
               len(probabilities), json.dumps([float(x) for x in context]),
               json.dumps([float(x) for x in probabilities]), None if baseline is None else int(baseline))
        with self._lock:
            self._db.execute("INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def write_feedback(self, decision_id: str, reward: float, constraints=None) -> bool:
        """Record feedback; False (and nothing written) when the decision already has some."""
        row = (str(decision_id), time.time(), float(reward),
               None if constraints is None else json.dumps([float(c) for c in constraints]))
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO feedback VALUES (?, ?, ?, ?)", row)
            return cur.rowcount == 1

    def write_feedback_many(self, rows) -> list[bool]:
        """Record the feedback ``rows`` (``(decision_id, reward, constraints)`` each) in one
        transaction: all of them are committed or none (an exception rolls back every row).
        Returns, per row, True if written, False if that decision already had feedback (a
        re-sent row, or the same id earlier in ``rows``: ignored)."""
        now = time.time()
        prepared = [(str(k), now, float(r), None if c is None else json.dumps([float(x) for x in c])) for k, r, c in rows]
        out = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for row in prepared:
                    out.append(self._db.execute("INSERT OR IGNORE INTO feedback VALUES (?, ?, ?, ?)", row).rowcount == 1)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return out

    # ------------------------------------------------------------------ identity
    def identity(self) -> dict | None:
        """``{"decider_id", "first_id"}`` of the Decider this log belongs to, or None for a log no
        Decider has bound yet (a new file, or one written before logs recorded their owner)."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is None:
                return None
            rows = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if "decider_id" not in rows:
            return None
        try:
            first_id = int(rows.get("first_id", 0))
        except ValueError:
            raise ValueError(f"log: {self.path} has a malformed first_id {rows.get('first_id')!r} in its meta table") from None
        return {"decider_id": str(rows["decider_id"]), "first_id": first_id}

    def bind(self, decider_id: str, first_id: int) -> None:
        """Record the Decider this log belongs to (once: an existing owner is kept)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                self._db.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)",
                                     [("decider_id", str(decider_id)), ("first_id", str(int(first_id)))])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def id_summary(self) -> dict:
        """What the log's decision ids are: ``count``, ``low`` and ``high`` (the integer ids, None
        when empty) and ``foreign``, the number of ids that are not a Decider's (``str(int)``)."""
        with self._lock:
            count, low, high, foreign = self._db.execute(
                "SELECT COUNT(*), MIN(CAST(decision_id AS INTEGER)), MAX(CAST(decision_id AS INTEGER)), "
                "TOTAL(CAST(CAST(decision_id AS INTEGER) AS TEXT) != decision_id) FROM decisions").fetchone()
        return {"count": int(count), "low": None if low is None else int(low),
                "high": None if high is None else int(high), "foreign": int(foreign)}

    def decisions_from(self, first: int) -> list[tuple[str, int, int, list[float]]]:
        """``(decision_id, action, num_actions, context)`` of the decisions with integer ids ``>= first``, by id."""
        with self._lock:
            rows = self._db.execute(
                "SELECT decision_id, action, num_actions, context FROM decisions "
                "WHERE CAST(decision_id AS INTEGER) >= ? AND CAST(CAST(decision_id AS INTEGER) AS TEXT) = decision_id "
                "ORDER BY CAST(decision_id AS INTEGER)", (int(first),)).fetchall()
        out = []
        for decision_id, action, num_actions, context in rows:
            try:
                ctx = [float(x) for x in json.loads(context)]
            except (ValueError, TypeError):
                raise ValueError(f"log: {self.path}: decision {decision_id!r} has a malformed context") from None
            out.append((decision_id, int(action), int(num_actions), ctx))
        return out

    def actions_of(self, decision_ids) -> dict[str, int]:
        """The logged action of each of ``decision_ids`` that the log holds."""
        ids = [str(i) for i in decision_ids]
        out: dict[str, int] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                out.update((k, int(a)) for k, a in self._db.execute(
                    f"SELECT decision_id, action FROM decisions WHERE decision_id IN ({marks})", chunk))
        return out

    def unanswered_below(self, end: int, start: int = 0) -> set[str]:
        """The ids in ``[start, end)`` of logged decisions without feedback."""
        with self._lock:
            return {r[0] for r in self._db.execute(
                "SELECT decision_id FROM decisions d WHERE CAST(decision_id AS INTEGER) >= ? "
                "AND CAST(decision_id AS INTEGER) < ? AND NOT EXISTS "
                "(SELECT 1 FROM feedback f WHERE f.decision_id = d.decision_id)", (int(start), int(end)))}

    def orphan_feedback(self, first: int = 0) -> list[str]:
        """Up to 5 ids ``>= first`` with feedback but no logged decision (a log that is not whole)."""
        with self._lock:
            return [r[0] for r in self._db.execute(
                "SELECT decision_id FROM feedback WHERE CAST(decision_id AS INTEGER) >= ? AND decision_id NOT IN "
                "(SELECT decision_id FROM decisions) LIMIT 5", (int(first),))]

    def count_from(self, first: int) -> int:
        """The number of decisions with integer ids ``>= first``."""
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM decisions WHERE CAST(decision_id AS INTEGER) >= ?",
                                        (int(first),)).fetchone()[0])

    def feedback_for(self, decision_ids) -> list[tuple[str, float, list[float] | None]]:
        """``(decision_id, reward, constraints)`` of the logged feedback of ``decision_ids``, in the order it was logged."""
        ids = [str(i) for i in decision_ids]
        rows = []
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                rows += self._db.execute(f"SELECT rowid, decision_id, reward, constraints FROM feedback "
                                         f"WHERE decision_id IN ({marks})", chunk).fetchall()
        rows.sort()
        try:
            return [(k, float(r), None if c is None else [float(x) for x in json.loads(c)]) for _, k, r, c in rows]
        except (ValueError, TypeError):
            raise ValueError(f"log: {self.path}: malformed constraints in its feedback") from None

    def feedback_rows_after(self, rowid: int, limit: int = 50_000) -> list[tuple]:
        """The feedback logged after feedback row ``rowid`` joined with its decision, oldest first, at
        most ``limit``: ``(rowid, feedback_time, reward, constraints (JSON text or None),
        decision_time, action, propensity, baseline)``; the decision's fields are None for feedback
        whose decision the log does not hold. For live monitors that read only what is new."""
        with self._lock:
            return self._db.execute(
                "SELECT f.rowid, f.time, f.reward, f.constraints, d.time, d.action, d.propensity, d.baseline "
                "FROM feedback f LEFT JOIN decisions d USING (decision_id) WHERE f.rowid > ? ORDER BY f.rowid LIMIT ?",
                (int(rowid), int(limit))).fetchall()

    def has_decision(self, decision_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM decisions WHERE decision_id = ?", (str(decision_id),)).fetchone() is not None

    def has_feedback(self, decision_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM feedback WHERE decision_id = ?", (str(decision_id),)).fetchone() is not None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ reading
    def to_dataframe(self, with_feedback_only: bool = False) -> pd.DataFrame:
        """One row per decision, its feedback joined (``reward`` NaN where none arrived)."""
        join = "JOIN" if with_feedback_only else "LEFT JOIN"
        query = (f"SELECT d.*, f.reward AS reward, f.constraints AS constraints, f.time AS feedback_time "
                 f"FROM decisions d {join} feedback f USING (decision_id) ORDER BY d.time, d.rowid")
        with self._lock:
            frame = pd.read_sql_query(query, self._db)
        for col in ("context", "probabilities"):
            frame[col] = frame[col].map(json.loads)
        frame["constraints"] = frame["constraints"].map(lambda s: None if s is None or pd.isna(s) else json.loads(s))
        return frame

    def to_logged_data(self):
        """The decisions with feedback as ``bayes_safe.offline.LoggedData`` (one domain, ``"all"``),
        with the logged propensities and every action's logging probability."""
        from ..offline import LoggedData

        frame = self.to_dataframe(with_feedback_only=True)
        if frame.empty:
            raise ValueError(f"log: {self.path} has no decision with feedback yet")
        K = int(frame["num_actions"].iloc[0])
        if (frame["num_actions"] != K).any():
            raise ValueError(f"log: decisions with different numbers of actions ({sorted(set(frame['num_actions']))})")
        contexts = np.array(frame["context"].tolist(), dtype=np.float32)
        probs = np.array(frame["probabilities"].tolist(), dtype=np.float32)
        return LoggedData.from_tensors(contexts, frame["action"].to_numpy(np.int64), frame["reward"].to_numpy(np.float32),
                                       frame["propensity"].to_numpy(np.float64), np.zeros(len(frame), dtype=np.int64),
                                       domain_names=["all"], n_actions=K, logging_probs=probs,
                                       row_labels=frame["decision_id"].to_numpy())

    def target_probabilities(self, policy, *, num_draws: int = 500, seed: int = 0):
        """Another policy's probability of every action at each logged decision with feedback, ``[N, K]``.

        The rows are those of ``to_logged_data()``, so ``bayes_safe.offline.ips(probs, data)``
        (or ``snips``, ``doubly_robust``, ``estimate_value``) estimates that policy's value from
        the log: e.g. TS-ASC with another ``alpha`` on the same posterior. The logged contexts
        must be the decisions' candidate features (what ``Decider`` logs when it is given
        candidates ``[K, d]``); each decision's logged baseline is passed on.
        """
        import torch

        frame = self.to_dataframe(with_feedback_only=True)
        if frame.empty:
            raise ValueError(f"log: {self.path} has no decision with feedback yet")
        generator = torch.Generator().manual_seed(int(seed))
        out = []
        for ctx, K, base in zip(frame["context"], frame["num_actions"], frame["baseline"]):
            if len(ctx) % int(K):
                raise ValueError(f"log: a logged context of length {len(ctx)} is not the candidate features of "
                                 f"{K} actions (the Decider logged a context vector, not candidates)")
            cand = torch.tensor(ctx, dtype=torch.float64).reshape(1, int(K), -1)
            b = None if base is None or pd.isna(base) else torch.tensor([int(base)])
            probs, _ = policy.action_probabilities(cand, b, num_draws=num_draws, generator=generator)
            out.append(probs[0])
        return torch.stack(out)

    def to_obp(self) -> dict:
        """obp's ``bandit_feedback`` dictionary (``n_rounds``, ``n_actions``, ``action``, ``reward``,
        ``pscore``, ``context``, ``position``) of the decisions with feedback."""
        frame = self.to_dataframe(with_feedback_only=True)
        K = int(frame["num_actions"].iloc[0]) if len(frame) else 0
        return {"n_rounds": len(frame), "n_actions": K, "action": frame["action"].to_numpy(np.int64),
                "reward": frame["reward"].to_numpy(np.float64), "pscore": frame["propensity"].to_numpy(np.float64),
                "context": np.array(frame["context"].tolist(), dtype=np.float64).reshape(len(frame), -1),
                "position": np.zeros(len(frame), dtype=np.int64)}

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])

    def __repr__(self) -> str:
        return f"DecisionLog({str(self.path)!r}, decisions={len(self)})"

