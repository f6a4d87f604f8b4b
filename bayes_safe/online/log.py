"""The decision log: every decision and its feedback, as they happen, in SQLite or PostgreSQL.

``DecisionLog(target)``: ``target`` a file path (SQLite, embedded: the default) or a URL
``postgresql://user@host:port/db`` (``postgres://`` too; PostgreSQL through psycopg 3, the
``postgres`` extra). Both behave the same: the same methods, answers and errors of arguments.
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
* ``meta``: ``key``, ``value`` (text): ``schema_version`` (``SCHEMA_VERSION``, written when the
  log is created or first opened for writing; a log without one, written before logs had it, is
  version 1; a log of a newer version than this code is refused); ``decider_id`` (the Decider the
  log belongs to) and ``first_id`` (its id counter then; the log holds the decisions from that id
  on), written when a ``Decider`` first writes to the log. ``Decider.load`` and ``Decider.replay``
  compare them with a snapshot and refuse a log that does not belong to it (``Decider.check_log``).

On PostgreSQL both tables also have ``seq``, an identity column (the insertion order SQLite's
``rowid`` gives: ``feedback_for``, ``feedback_rows_after``); times are double precision seconds,
integers BIGINT. The decision ids stay text, and the queries that read them as numbers give what
SQLite's ``CAST(decision_id AS INTEGER)`` gives (the integer prefix, 0 when there is none) for
ids that are not a Decider's. A pool of at most ``PG_CONNECTIONS`` connections per
``DecisionLog``, one per calling thread at a time (the replicas' service writes from several
threads at once; an SQLite log is one connection behind a lock). A failure of the server or of the connection raises
``LogUnavailable`` (a ``ConnectionError``, so an ``OSError``; the service answers 503) and the
next call connects again; any other PostgreSQL error raises ``LogError``. ``path`` is the URL
without its password (``LogURL``), so it can be printed.
"""

from __future__ import annotations

import contextlib
import json
import select
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import pandas as pd

__all__ = ["SCHEMA_VERSION", "DecisionLog", "LogError", "LogURL", "LogUnavailable", "is_log_url", "log_location"]

#: the version of the log's tables this code writes (and the newest it reads). 2 (issue 45): a
#: decision's outcomes may arrive metric by metric: ``feedback``'s ``constraints`` may hold ``null``
#: for a metric not known when the row was written, and the table ``outcomes`` holds the metrics
#: reported later. A version-1 log opened for writing gains the table (nothing else changes).
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY, time REAL NOT NULL, action INTEGER NOT NULL, propensity REAL NOT NULL,
    propensity_se REAL NOT NULL, model_version INTEGER NOT NULL, num_actions INTEGER NOT NULL,
    context TEXT NOT NULL, probabilities TEXT NOT NULL, baseline INTEGER
);
CREATE TABLE IF NOT EXISTS feedback (
    decision_id TEXT PRIMARY KEY, time REAL NOT NULL, reward REAL NOT NULL, constraints TEXT
);
CREATE TABLE IF NOT EXISTS outcomes (
    decision_id TEXT NOT NULL, metric INTEGER NOT NULL, value REAL NOT NULL, time REAL NOT NULL, origin TEXT,
    PRIMARY KEY (decision_id, metric)
);
"""

_PG_SCHEMA = [
    ("CREATE TABLE IF NOT EXISTS decisions (seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, "
     "decision_id TEXT PRIMARY KEY, time DOUBLE PRECISION NOT NULL, action BIGINT NOT NULL, "
     "propensity DOUBLE PRECISION NOT NULL, propensity_se DOUBLE PRECISION NOT NULL, model_version BIGINT NOT NULL, "
     "num_actions BIGINT NOT NULL, context TEXT NOT NULL, probabilities TEXT NOT NULL, baseline BIGINT)"),
    ("CREATE TABLE IF NOT EXISTS feedback (seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, decision_id TEXT PRIMARY KEY, "
     "time DOUBLE PRECISION NOT NULL, reward DOUBLE PRECISION NOT NULL, constraints TEXT)"),
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # seq drawn from feedback's own sequence: one order over both tables (a replica's watermark covers both)
    ("CREATE TABLE IF NOT EXISTS outcomes (seq BIGINT NOT NULL UNIQUE "
     "DEFAULT nextval(pg_get_serial_sequence('feedback', 'seq')::regclass), decision_id TEXT NOT NULL, "
     "metric BIGINT NOT NULL, value DOUBLE PRECISION NOT NULL, time DOUBLE PRECISION NOT NULL, origin TEXT, "
     "PRIMARY KEY (decision_id, metric))"),
]
_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_DECISION_COLUMNS = ("decision_id", "time", "action", "propensity", "propensity_se", "model_version", "num_actions",
                     "context", "probabilities", "baseline")
_FEEDBACK_COLUMNS = ("decision_id", "time", "reward", "constraints")
_SCHEMES = ("postgresql://", "postgres://")
#: what ``_SQLite.guard`` returns, and a one-row write's transaction (the statement's own)
_NO_GUARD = contextlib.nullcontext()
#: a key for pg_advisory_xact_lock: two processes creating one log's tables at once take turns
_PG_LOCK_KEY = 0x6261_7965_735F_6C67 & 0x7FFF_FFFF_FFFF_FFFF
#: replicas' feedback writers take turns on this key, so feedback ``seq`` follows commit order
_PG_FEEDBACK_KEY = _PG_LOCK_KEY ^ 0x0F
#: replicas take decision numbers in blocks of this many (``reserve_numbers``)
NUMBER_BLOCK = 64
#: a PostgreSQL log opens at most this many connections for its calls (4 replicas: 16 of the
#: server's default 100), plus one outside them
PG_CONNECTIONS = 4


class LogError(Exception):
    """A PostgreSQL decision log refused an operation (the server's error, with the log's URL)."""


class LogUnavailable(LogError, ConnectionError):
    """The PostgreSQL server of a decision log could not be reached, or the connection broke
    (a restart ...): nothing was written; the next call connects again."""


def is_log_url(target) -> bool:
    """Whether ``target`` names a PostgreSQL log (a ``postgresql://`` or ``postgres://`` URL)."""
    return isinstance(target, str) and target.lower().startswith(_SCHEMES)


def _redact(url: str) -> str:
    """``url`` without a password (in its user part or a ``password`` parameter)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = f"{user.split(':', 1)[0]}@{host}"
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k.lower() != "password"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return f"{url.split('://', 1)[0]}://(a URL that does not parse)"


class LogURL(str):
    """A PostgreSQL log's URL as it prints: without its password. The URL as given is kept (not
    printed) so that ``DecisionLog(log.path)`` opens the same log (the service's metrics reader)."""

    def __new__(cls, url: str):
        url = url._url if isinstance(url, LogURL) else str(url)
        self = super().__new__(cls, _redact(url))
        self._url = url
        return self

    def resolve(self) -> LogURL:  # what a Path's ``resolve`` is to a file: the same log, compared as text
        return self

    def __reduce__(self):
        return LogURL, (self._url,)


def log_location(target) -> Path | LogURL:
    """What ``DecisionLog(target).path`` is: a ``LogURL`` for a PostgreSQL URL, else the ``Path``
    (a string naming another URL scheme raises ``ValueError``)."""
    if is_log_url(target):
        return LogURL(target)
    if isinstance(target, str) and "://" in target:
        raise ValueError(f"path: expected a file path or a postgresql:// URL, got {target.split('://', 1)[0]}://...")
    return Path(target)


def _pg_int(col: str) -> str:
    """PostgreSQL's version of SQLite's ``CAST(col AS INTEGER)``: the integer prefix after leading
    white space (clamped to 64 bits), 0 when there is none; never an error."""
    # (no question mark: the queries' placeholders are written '?', turned into psycopg's)
    slow = (rf"LEAST(GREATEST(COALESCE(substring({col} FROM '^[ \t\n\r\f\v]*([+-]{{0,1}}[0-9]+)')::numeric, 0), "
            "-9223372036854775808), 9223372036854775807)::bigint")
    return f"(CASE WHEN {col} ~ '^[0-9]{{1,18}}$' THEN {col}::bigint ELSE {slow} END)"


class _SQLite:
    """The SQLite connection of a log (the caller holds the log's lock)."""

    kind = "sqlite"
    rowid = "rowid"

    def __init__(self, path: Path, read_only: bool):
        if read_only:
            if not path.is_file():
                raise FileNotFoundError(f"path: no such decision log {str(path)!r}")
            self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                      isolation_level=None)  # no transaction left open by a refused write
            try:
                tables = self.tables()
            except sqlite3.DatabaseError as exc:
                self.db.close()
                raise ValueError(f"path: {path} is not a decision log (SQLite: {exc})") from None
            if not {"decisions", "feedback"} <= tables:
                self.db.close()
                raise ValueError(f"path: {path} is not a decision log (no 'decisions' and 'feedback' tables)")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise ValueError(f"path: {path} is not a decision log (SQLite: {exc})") from None

    @staticmethod
    def int_(col: str) -> str:
        return f"CAST({col} AS INTEGER)"

    def count_true(self, condition: str) -> str:
        return f"TOTAL({condition})"

    def tables(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def ignore(self, table: str, columns: tuple[str, ...]) -> str:
        return f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def insert(self, table: str, columns: tuple[str, ...]) -> str:
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def rows(self, sql: str, params=()) -> list[tuple]:
        return self.db.execute(sql, params).fetchall()

    def run(self, sql: str, params=()) -> int:
        return self.db.execute(sql, params).rowcount

    @contextlib.contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def guard(self):
        # SQLite's errors are raised as they are: one shared, stateless nullcontext (a generator-based
        # context manager cost about 1 us a write, two writes a decision and its feedback)
        return _NO_GUARD

    def frame(self, sql: str) -> pd.DataFrame:
        return pd.read_sql_query(sql, self.db)

    def close(self, finished: bool = True) -> None:
        self.db.close()


class _Postgres:
    """The PostgreSQL connections of a log: a pool of at most ``PG_CONNECTIONS``, one lent to each
    thread for the duration of a log call (``session``), opened again after one broke.

    Threads that call the log at once run their statements on their own connections, so one
    thread's round trip to the server does not wait for another's (the replicas' service writes
    decisions and feedback from several threads). A thread that finds every connection lent waits
    for one. A statement run outside a session (the tables' creation, ``DecisionLog._db`` for tests
    and repairs) uses one more connection of its own."""

    kind = "postgresql"
    rowid = "seq"

    def __init__(self, url: LogURL, read_only: bool):
        try:
            import psycopg
        except ImportError:
            raise ImportError("a PostgreSQL decision log needs psycopg 3: pip install 'bayes-safe[postgres]'") from None
        self.psycopg = psycopg
        self.url = url
        self.read_only = read_only
        self.conn = None  # the connection outside sessions
        self.finished = False  # closed for good (DecisionLog.close): no connecting again
        self._local = threading.local()  # .conn: the connection lent to this thread (None: not yet opened)
        self._idle: list = []  # open connections no thread holds
        self._slots = threading.BoundedSemaphore(PG_CONNECTIONS)
        self._pool = threading.Lock()  # guards _idle
        with self.guard():
            if read_only:
                missing = {"decisions", "feedback"} - self.tables()
                if missing:
                    self.close()
                    raise ValueError(f"path: {url} is not a decision log (no 'decisions' and 'feedback' tables)")
            else:
                with self.transaction():
                    self.rows("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK_KEY,))
                    for statement in _PG_SCHEMA:
                        self.run(statement)

    def session(self) -> _Session:
        """A context in which this thread's statements run on one pooled connection (re-entrant)."""
        return _Session(self)

    def _lend(self) -> None:
        self._slots.acquire()
        with self._pool:
            conn = self._idle.pop() if self._idle else None
        if conn is not None and pg_stale(conn):  # its server went away while it was idle: a new one
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
        self._local.conn = conn

    def _give_back(self) -> None:
        conn, self._local.conn = self._local.conn, None
        try:
            if conn is not None:
                if self.finished or conn.closed or conn.broken:
                    with contextlib.suppress(Exception):
                        conn.close()
                else:
                    with self._pool:
                        self._idle.append(conn)
        finally:
            self._slots.release()

    def _connect(self):
        if self.finished:
            raise LogError(f"log: {self.url}: the log was closed")
        options = {} if "connect_timeout" in self.url._url else {"connect_timeout": 10}
        conn = self.psycopg.connect(self.url._url, autocommit=True, **options)
        if self.read_only:  # every transaction of the session (psycopg's read_only needs explicit ones)
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def connection(self):
        """This thread's open connection (its session's, or the one outside sessions), connecting
        first when there is none (or it broke)."""
        local = self._local
        if getattr(local, "depth", 0):
            conn = local.conn
            if conn is None or conn.closed or conn.broken:
                self._drop()
                local.conn = conn = self._connect()
            return conn
        if self.conn is None or pg_stale(self.conn):
            self._drop()
            self.conn = self._connect()
        return self.conn

    def _drop(self) -> None:
        """Close this thread's connection (it failed) and the idle ones (made to the same server, which
        evidently went away): the next statement of any thread connects again."""
        local = self._local
        if getattr(local, "depth", 0):
            conn, local.conn = local.conn, None
        else:
            conn, self.conn = self.conn, None
        with self._pool:
            conns, self._idle = [conn, *self._idle], []
        for c in conns:
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()

    @staticmethod
    def int_(col: str) -> str:
        return _pg_int(col)

    def count_true(self, condition: str) -> str:
        return f"COALESCE(SUM(CASE WHEN {condition} THEN 1 ELSE 0 END), 0)"

    def tables(self) -> set[str]:
        rows = self.rows("SELECT to_regclass('decisions') IS NOT NULL, to_regclass('feedback') IS NOT NULL, "
                         "to_regclass('meta') IS NOT NULL, to_regclass('outcomes') IS NOT NULL")
        return {name for name, there in zip(("decisions", "feedback", "meta", "outcomes"), rows[0]) if there}

    def ignore(self, table: str, columns: tuple[str, ...]) -> str:
        return self.insert(table, columns) + " ON CONFLICT DO NOTHING"

    def insert(self, table: str, columns: tuple[str, ...]) -> str:
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"

    def rows(self, sql: str, params=()) -> list[tuple]:
        with self.connection().cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.fetchall() if cur.description is not None else []

    def run(self, sql: str, params=()) -> int:
        with self.connection().cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.rowcount

    @contextlib.contextmanager
    def transaction(self):
        with self.connection().transaction():
            yield

    @contextlib.contextmanager
    def guard(self):
        """psycopg's errors as ``LogUnavailable`` (the connection is dropped: the next call connects
        again) or ``LogError``, naming the log without its password."""
        psycopg = self.psycopg
        try:
            yield
        except psycopg.Error as exc:
            if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
                self._drop()
            raise pg_error(self.url, exc) from None

    def frame(self, sql: str) -> pd.DataFrame:
        with self.connection().cursor() as cur:
            cur.execute(sql)
            columns = [c.name for c in cur.description]
            rows = cur.fetchall()
        if not rows:
            return pd.DataFrame(columns=columns)
        return pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)

    def close(self, finished: bool = False) -> None:
        """Close the idle connections and the one outside sessions (``finished``: for good; a
        connection a thread holds is closed when it is given back)."""
        self.finished = self.finished or finished
        with self._pool:
            conns, self._idle = [self.conn, *self._idle], []
        self.conn = None
        for conn in conns:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


class _Session:
    """``_Postgres.session()``: lends this thread a pooled connection; nested uses share it."""

    __slots__ = ("b",)

    def __init__(self, b: _Postgres):
        self.b = b

    def __enter__(self):
        local = self.b._local
        depth = getattr(local, "depth", 0)
        if not depth:
            self.b._lend()
        local.depth = depth + 1

    def __exit__(self, *exc):
        local = self.b._local
        local.depth -= 1
        if not local.depth:
            self.b._give_back()


def _floats_json(values) -> str:
    """``json.dumps([float(x) for x in values])``, the same text.

    A float64 array's ``tolist()`` gives the same Python floats as ``float(x)`` of its entries,
    without a numpy scalar each. For a list of finite floats ``repr`` of the list is the text
    ``json.dumps`` writes (both write each number as ``float.__repr__`` and join them with ", "
    in brackets) at about 80 % of its cost (20 values: 10 us against 12); a NaN or an infinity
    (``repr`` writes nan / inf, both with an "n", which no finite float's repr has) takes
    ``json.dumps`` itself, which writes NaN / Infinity as it always did."""
    if type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1:
        values = values.tolist()
    elif type(values) is not list or not all(type(x) is float for x in values):
        values = [float(x) for x in values]
    text = repr(values)
    return text if "n" not in text else json.dumps(values)


def decision_row(decision_id: str, action: int, propensity: float, propensity_se: float, model_version: int,
                 context, probabilities, baseline: int | None = None) -> tuple:
    """The ``decisions`` row (``_DECISION_COLUMNS``' order) of ``write_decision``'s arguments, timed now."""
    return (str(decision_id), time.time(), int(action), float(propensity), float(propensity_se), int(model_version),
            len(probabilities), _floats_json(context), _floats_json(probabilities),
            None if baseline is None else int(baseline))


def feedback_row(decision_id: str, reward: float, constraints=None, now: float | None = None) -> tuple:
    """The ``feedback`` row ``(decision_id, time, reward, constraints JSON or None)``, timed ``now``; a
    constraint metric not known yet is None in ``constraints`` and ``null`` in its JSON (schema 2)."""
    if constraints is None:
        text = None
    elif type(constraints) is list and all(type(v) is float for v in constraints):
        text = _floats_json(constraints)  # Python floats (the Decider's): no None among them to look for
    elif any(v is None for v in constraints):
        text = json.dumps([None if v is None else float(v) for v in constraints])
    else:
        text = _floats_json(constraints)
    return (str(decision_id), time.time() if now is None else now, float(reward), text)


def _constraint_list(text) -> list | None:
    """A ``feedback`` row's constraints JSON as floats, None where a metric was not known (schema 2)."""
    if text is None:
        return None
    return [None if x is None else float(x) for x in json.loads(text)]


def pg_stale(conn) -> bool:
    """Whether an idle psycopg connection is of no use: closed, broken, or with something to read
    (a connection between statements has nothing to read unless its server went away: a restart
    sends a termination notice, then the end of the stream). One system call; what the write
    that would otherwise fail on it costs the client: a 503 after the server is back."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def pg_error(url: LogURL, exc: Exception) -> LogError:
    """What a psycopg error of the log at ``url`` is raised as: ``LogUnavailable`` when the server
    or the connection failed (the caller drops the connection: the next call connects again),
    else ``LogError``; naming the log without its password."""
    import psycopg

    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return LogUnavailable(f"log: {url}: the PostgreSQL server is unavailable ({_first_line(exc)}); "
                              "the next call connects again")
    return LogError(f"log: {url}: PostgreSQL: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class DecisionLog:
    """An append-only log of decisions and feedback, in SQLite or PostgreSQL (module docstring).

    Args:
        path: the database file (created with its parent directory if missing), or the URL of a
            PostgreSQL database (``postgresql://user@host:port/db``; its tables are created if
            missing).
        read_only: open an existing log for reading only (nothing is created or changed; a
            file or database that is not a decision log raises ``ValueError``). On PostgreSQL
            the session's transactions are read-only.

    A log whose ``schema_version`` is newer than ``SCHEMA_VERSION`` raises ``ValueError``.
    """

    def __init__(self, path, *, read_only: bool = False):
        self.path = log_location(path)
        self.read_only = bool(read_only)
        # (PostgreSQL) the decision ids, and the feedback ids, whose write lost the connection: maybe committed
        self._uncertain: set[str] = set()
        self._uncertain_feedback: set[str] = set()
        self._marks = threading.Lock()  # guards the two sets
        # (PostgreSQL) past the last block reserve_numbers gave, once it has moved the sequence past the log's
        # decisions (0: not yet)
        self._numbers_ready = 0
        if isinstance(self.path, LogURL):
            self._b = _Postgres(self.path, self.read_only)
            # each call on a connection of the pool: threads' calls run at once (_Postgres)
            self._lock = self._b.session()
        else:
            if self.path.exists() and not self.path.is_file():
                raise ValueError(f"path: expected a database file, got the directory {self.path}")
            self._b = _SQLite(self.path, self.read_only)
            self._lock = threading.Lock()  # one connection: one call at a time
        # the writes' statements, worded once (a decision and its feedback are two writes)
        self._insert_decision = self._b.insert("decisions", _DECISION_COLUMNS)
        self._insert_feedback = (self._b.ignore("feedback", _FEEDBACK_COLUMNS), self._b.insert("feedback", _FEEDBACK_COLUMNS)
                                 + " ON CONFLICT (decision_id) DO UPDATE SET "
                                 + ", ".join(f"{c} = EXCLUDED.{c}" for c in _FEEDBACK_COLUMNS[1:]))
        try:
            with self._b.guard():
                self._check_version()
        except BaseException:
            self._b.close()
            raise

    @property
    def _db(self):
        """The open connection (``sqlite3.Connection``, or psycopg's, connected if it was not): for tests and repairs."""
        return self._b.db if self._b.kind == "sqlite" else self._b.connection()

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._b.kind

    def _meta(self) -> dict[str, str]:
        if "meta" not in self._b.tables():
            return {}
        return dict(self._b.rows("SELECT key, value FROM meta"))

    def _check_version(self) -> None:
        """Refuse a log of a newer schema; record this code's version in a log opened for writing without one."""
        b = self._b
        raw = self._meta().get("schema_version")
        try:
            version = 1 if raw is None else int(raw)
        except ValueError:
            raise ValueError(f"path: {self.path} has a malformed schema_version {raw!r} in its meta table") from None
        if version > SCHEMA_VERSION:
            raise ValueError(f"path: {self.path} is a decision log of schema version {version}, newer than this "
                             f"bayes_safe's {SCHEMA_VERSION}: open it with the bayes_safe that wrote it (or a newer one)")
        if version < SCHEMA_VERSION and not self.read_only:  # 1 -> 2: the table outcomes, made with the others
            with b.transaction():
                b.run(_META)
                b.run("DELETE FROM meta WHERE key = ?", ("schema_version",))
                b.run(b.ignore("meta", ("key", "value")), ("schema_version", str(SCHEMA_VERSION)))

    def schema_version(self) -> int:
        """The log's schema version (1 for a log written before logs recorded it)."""
        with self._lock, self._b.guard():
            return int(self._meta().get("schema_version", 1))

    # ------------------------------------------------------------------ writing
    def write_decision(self, decision_id: str, action: int, propensity: float, propensity_se: float,
                       model_version: int, context, probabilities, baseline: int | None = None) -> None:
        """Record a decision (an id already logged raises). After a ``LogUnavailable`` the write of that
        id may have been committed without its answer arriving: the next write of the same id
        replaces that row (the caller was told it failed, so the id was never issued)."""
        row = decision_row(decision_id, action, propensity, propensity_se, model_version, context, probabilities,
                           baseline)
        with self._lock:
            insert = self._insert_decision
            if row[0] in self._uncertain:
                # the last write of this id lost its connection: it may have been committed without an
                # answer; the id was not issued (the caller got the error), so this row replaces it
                updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _DECISION_COLUMNS[1:])
                insert += f" ON CONFLICT (decision_id) DO UPDATE SET {updates}"
            try:
                with self._b.guard():
                    self._b.run(insert, row)
            except LogUnavailable:
                with self._marks:
                    self._uncertain.add(row[0])
                raise
            if self._uncertain:
                with self._marks:
                    self._uncertain.discard(row[0])

    def write_feedback(self, decision_id: str, reward: float, constraints=None) -> bool:
        """Record feedback; False (and nothing written) when the decision already has some.

        After a ``LogUnavailable`` the write may have been committed without its answer arriving:
        the next feedback of that decision replaces it (the caller was told it failed, so what it
        sends again is the feedback it applies)."""
        row = feedback_row(decision_id, reward, constraints)
        if self._b.kind == "sqlite":
            # one statement, its own transaction (``_write_feedback`` of one row: no id is ever uncertain on
            # SQLite, a local file), without the list, the set and the context managers around it
            with self._lock:
                return self._b.run(self._insert_feedback[0], row) == 1
        return self._write_feedback([row])[0]

    def _write_feedback(self, prepared: list[tuple]) -> list[bool]:
        """Insert feedback ``prepared`` in one transaction (module docstring; ``write_feedback``)."""
        insert, replace = self._insert_feedback
        out = []
        with self._lock:
            uncertain = set()
            if self._uncertain_feedback:  # (PostgreSQL, after a lost connection; the set is only added to under it)
                with self._marks:
                    uncertain = self._uncertain_feedback & {row[0] for row in prepared}
            try:
                with self._b.guard(), self._b.transaction() if len(prepared) > 1 else _NO_GUARD:
                    for row in prepared:
                        if row[0] in uncertain:
                            uncertain.discard(row[0])  # the first of the id's rows replaces; a second is ignored
                            out.append(self._b.run(replace, row) == 1)
                        else:
                            out.append(self._b.run(insert, row) == 1)
            except LogUnavailable:
                with self._marks:
                    self._uncertain_feedback.update(row[0] for row in prepared)
                raise
            if self._uncertain_feedback:
                with self._marks:
                    self._uncertain_feedback.difference_update(row[0] for row in prepared)
        return out

    def write_outcomes(self, rows, origin: str | None = None) -> list[bool]:
        """Record constraint outcomes reported apart from the reward (schema 2, issue 45): ``rows`` of
        ``(decision_id, metric, value)`` (``metric`` the constraint's index), in one transaction, all
        or none. Per row: True if written, False if the log already holds that decision's metric
        (idempotent per (decision, metric); the first value is kept). ``origin``: None for a client's
        report, ``"window"`` for the declared default of a metric whose window closed."""
        now = time.time()
        prepared = [(str(k), int(j), float(v), now, origin) for k, j, v in rows]
        insert = self._b.ignore("outcomes", ("decision_id", "metric", "value", "time", "origin"))
        with self._lock, self._b.guard(), self._b.transaction() if len(prepared) > 1 else _NO_GUARD:
            return [self._b.run(insert, row) == 1 for row in prepared]

    def outcomes_for(self, decision_ids, through: int | None = None,
                     with_seq: bool = False) -> list[tuple[str, int, float, float, str | None]]:
        """``(decision_id, metric, value, time, origin)`` of the constraint outcomes logged apart from
        the reward for ``decision_ids`` (``write_outcomes``), in the order they were logged (only rows
        with ``seq <= through`` when given; ``with_seq``: each row led by its ``seq``, PostgreSQL's,
        shared with feedback, or SQLite's rowid)."""
        if not self._has_outcomes():
            return []
        rows = self._rows_for("outcomes", "decision_id, metric, value, time, origin", decision_ids, through)
        if with_seq:
            return [(int(s), k, int(j), float(v), float(t), o) for s, k, j, v, t, o in rows]
        return [(k, int(j), float(v), float(t), o) for _, k, j, v, t, o in rows]

    def _rows_for(self, table: str, columns: str, decision_ids, through: int | None = None) -> list[tuple]:
        """``(rowid or seq, *columns)`` of ``table``'s rows of ``decision_ids`` (with ``seq <= through`` when
        given), in the order they were logged; the ids asked 500 at a time."""
        ids = [str(i) for i in decision_ids]
        rows: list[tuple] = []
        r = self._b.rowid
        bound = "" if through is None else f" AND {r} <= {int(through)}"
        with self._lock, self._b.guard():
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                rows += self._b.rows(f"SELECT {r}, {columns} FROM {table} WHERE decision_id IN "
                                     f"({','.join('?' * len(chunk))}){bound}", chunk)
        rows.sort()
        return rows

    def _has_outcomes(self) -> bool:
        """Whether the log has the table ``outcomes`` (a version-1 log opened read-only has not)."""
        if not self.__dict__.get("_outcomes_table"):  # (only a True is kept: another process may migrate the log)
            with self._lock, self._b.guard():
                self._outcomes_table = "outcomes" in self._b.tables()
        return self._outcomes_table

    def write_feedback_many(self, rows) -> list[bool]:
        """Record the feedback ``rows`` (``(decision_id, reward, constraints)`` each) in one
        transaction: all of them are committed or none (an exception rolls back every row).
        Returns, per row, True if written, False if that decision already had feedback (a
        re-sent row, or the same id earlier in ``rows``: ignored). A row whose last write raised
        ``LogUnavailable`` replaces what that write may have committed (as ``write_feedback``)."""
        now = time.time()
        prepared = [feedback_row(k, r, c, now) for k, r, c in rows]
        return self._write_feedback(prepared)

    # ------------------------------------------------------------------ identity
    def identity(self) -> dict | None:
        """``{"decider_id", "first_id"}`` of the Decider this log belongs to, or None for a log no
        Decider has bound yet (a new file, or one written before logs recorded their owner)."""
        with self._lock, self._b.guard():
            rows = self._meta()
        if "decider_id" not in rows:
            return None
        try:
            first_id = int(rows.get("first_id", 0))
        except ValueError:
            raise ValueError(f"log: {self.path} has a malformed first_id {rows.get('first_id')!r} in its meta table") from None
        return {"decider_id": str(rows["decider_id"]), "first_id": first_id}

    def bind(self, decider_id: str, first_id: int) -> None:
        """Record the Decider this log belongs to (once: an existing owner is kept)."""
        b = self._b
        with self._lock, b.guard(), b.transaction():
            b.run(_META)
            for row in (("decider_id", str(decider_id)), ("first_id", str(int(first_id)))):
                b.run(b.ignore("meta", ("key", "value")), row)

    def id_summary(self) -> dict:
        """What the log's decision ids are: ``count``, ``low`` and ``high`` (the integer ids, None
        when empty) and ``foreign``, the number of ids that are not a Decider's (``str(int)``)."""
        b = self._b
        n = b.int_("decision_id")
        with self._lock, b.guard():
            count, low, high, foreign = b.rows(
                f"SELECT COUNT(*), MIN({n}), MAX({n}), {b.count_true(f'CAST({n} AS TEXT) != decision_id')} "
                "FROM decisions")[0]
        return {"count": int(count), "low": None if low is None else int(low),
                "high": None if high is None else int(high), "foreign": int(foreign)}

    def decisions_from(self, first: int) -> list[tuple[str, int, int, list[float]]]:
        """``(decision_id, action, num_actions, context)`` of the decisions with integer ids ``>= first``, by id."""
        b = self._b
        n = b.int_("decision_id")
        with self._lock, b.guard():
            rows = b.rows(f"SELECT decision_id, action, num_actions, context FROM decisions "
                          f"WHERE {n} >= ? AND CAST({n} AS TEXT) = decision_id ORDER BY {n}", (int(first),))
        out = []
        for decision_id, action, num_actions, context in rows:
            try:
                ctx = [float(x) for x in json.loads(context)]
            except (ValueError, TypeError):
                raise ValueError(f"log: {self.path}: decision {decision_id!r} has a malformed context") from None
            out.append((decision_id, int(action), int(num_actions), ctx))
        return out

    def decisions_of(self, decision_ids) -> dict[str, tuple[int, int, list[float]]]:
        """``{decision_id: (action, num_actions, context)}`` of each of ``decision_ids`` the log holds."""
        ids = [str(i) for i in decision_ids]
        out: dict[str, tuple[int, int, list[float]]] = {}
        with self._lock, self._b.guard():
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                for k, a, num, context in self._b.rows(
                        f"SELECT decision_id, action, num_actions, context FROM decisions WHERE decision_id IN ({marks})",
                        chunk):
                    try:
                        out[k] = (int(a), int(num), [float(x) for x in json.loads(context)])
                    except (ValueError, TypeError):
                        raise ValueError(f"log: {self.path}: decision {k!r} has a malformed context") from None
        return out

    def actions_of(self, decision_ids) -> dict[str, int]:
        """The logged action of each of ``decision_ids`` that the log holds."""
        ids = [str(i) for i in decision_ids]
        out: dict[str, int] = {}
        with self._lock, self._b.guard():
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ",".join("?" * len(chunk))
                out.update((k, int(a)) for k, a in self._b.rows(
                    f"SELECT decision_id, action FROM decisions WHERE decision_id IN ({marks})", chunk))
        return out

    def unanswered_below(self, end: int, start: int = 0) -> set[str]:
        """The ids in ``[start, end)`` of logged decisions without feedback."""
        n = self._b.int_("decision_id")
        with self._lock, self._b.guard():
            return {r[0] for r in self._b.rows(
                f"SELECT decision_id FROM decisions d WHERE {n} >= ? AND {n} < ? AND NOT EXISTS "
                "(SELECT 1 FROM feedback f WHERE f.decision_id = d.decision_id)", (int(start), int(end)))}

    def orphan_feedback(self, first: int = 0) -> list[str]:
        """Up to 5 ids ``>= first`` with feedback but no logged decision (a log that is not whole)."""
        n = self._b.int_("decision_id")
        with self._lock, self._b.guard():
            return [r[0] for r in self._b.rows(
                f"SELECT decision_id FROM feedback WHERE {n} >= ? AND decision_id NOT IN "
                f"(SELECT decision_id FROM decisions) ORDER BY {self._b.rowid} LIMIT 5", (int(first),))]

    def count_from(self, first: int) -> int:
        """The number of decisions with integer ids ``>= first``."""
        n = self._b.int_("decision_id")
        with self._lock, self._b.guard():
            return int(self._b.rows(f"SELECT COUNT(*) FROM decisions WHERE {n} >= ?", (int(first),))[0][0])

    def feedback_for(self, decision_ids, through: int | None = None, with_time: bool = False,
                     with_seq: bool = False) -> list[tuple]:
        """``(decision_id, reward, constraints)`` of the logged feedback of ``decision_ids``, in the
        order it was logged (only rows with ``seq <= through`` when given); ``with_time``:
        ``(decision_id, time, reward, constraints)``. A constraint not known when the row was written
        is None (outcomes metric by metric: ``outcomes_for`` has those reported later)."""
        rows = self._rows_for("feedback", "decision_id, reward, constraints, time", decision_ids, through)
        try:
            if with_seq:
                return [(int(s), k, float(r), _constraint_list(c)) for s, k, r, c, _ in rows]
            if with_time:
                return [(k, float(t), float(r), _constraint_list(c)) for _, k, r, c, t in rows]
            return [(k, float(r), _constraint_list(c)) for _, k, r, c, _ in rows]
        except (ValueError, TypeError):
            raise ValueError(f"log: {self.path}: malformed constraints in its feedback") from None

    def feedback_rows_after(self, rowid: int, limit: int = 50_000) -> list[tuple]:
        """The feedback logged after feedback row ``rowid`` joined with its decision, oldest first, at
        most ``limit``: ``(rowid, feedback_time, reward, constraints (JSON text or None),
        decision_time, action, propensity, baseline)``; the decision's fields are None for feedback
        whose decision the log does not hold. For live monitors that read only what is new
        (``rowid``: SQLite's rowid, PostgreSQL's ``seq``)."""
        r = self._b.rowid
        with self._lock, self._b.guard():
            return [tuple(row) for row in self._b.rows(
                f"SELECT f.{r}, f.time, f.reward, f.constraints, d.time, d.action, d.propensity, d.baseline "
                f"FROM feedback f LEFT JOIN decisions d USING (decision_id) WHERE f.{r} > ? ORDER BY f.{r} LIMIT ?",
                (int(rowid), int(limit)))]

    def outcome_rows_after(self, rowid: int, limit: int = 50_000) -> list[tuple]:
        """The constraint outcomes logged apart from their reward (``write_outcomes``) after row
        ``rowid`` joined with their decision, oldest first, at most ``limit``: ``(rowid, metric, value,
        decision_time, action, propensity, baseline)`` (the decision's fields None when the log lacks it);
        ``feedback_rows_after``'s twin for live monitors."""
        if not self._has_outcomes():
            return []
        r = self._b.rowid
        with self._lock, self._b.guard():
            return [tuple(row) for row in self._b.rows(
                f"SELECT o.{r}, o.metric, o.value, d.time, d.action, d.propensity, d.baseline "
                f"FROM outcomes o LEFT JOIN decisions d USING (decision_id) WHERE o.{r} > ? ORDER BY o.{r} LIMIT ?",
                (int(rowid), int(limit)))]

    # ------------------------------------------------------------------ replicas (PostgreSQL)
    def _shared(self, what: str):
        if self.kind != "postgresql":
            raise ValueError(f"log: {what} needs a PostgreSQL decision log (postgresql://...); an SQLite log "
                             f"({self.path}) serves one process")
        return self._b

    def reserve_numbers(self, at_least: int = 0) -> int:
        """The first of ``NUMBER_BLOCK`` decision numbers no other replica will use (PostgreSQL).

        The numbers come from the sequence ``decision_numbers`` (created on first use), which is
        first moved past ``at_least`` and past every decision the log holds, so a replica's
        numbers never meet an id issued before replicas shared the log. A replica that dies
        leaves the rest of its block unused (decision numbers have gaps; nothing else depends on
        them being consecutive in a log of replicas)."""
        b = self._shared("reserving decision numbers")
        n = b.int_("decision_id")
        if self._numbers_ready and at_least <= self._numbers_ready:
            # the sequence was moved past the log's decisions by this log's first reservation, and every
            # decision since was numbered from it: the next block is the sequence's next value (one short
            # statement, where the first reads the whole table)
            with self._lock, b.guard():
                start = int(b.rows("SELECT nextval('decision_numbers')")[0][0])
            if start >= at_least:
                self._numbers_ready = start + NUMBER_BLOCK
                return start
        with self._lock, b.guard(), b.transaction():
            b.rows("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK_KEY,))
            b.run(f"CREATE SEQUENCE IF NOT EXISTS decision_numbers MINVALUE 0 START WITH 0 INCREMENT BY {NUMBER_BLOCK}")
            high = b.rows(f"SELECT MAX({n}) FROM decisions WHERE CAST({n} AS TEXT) = decision_id")[0][0]
            floor = max(int(at_least), -1 if high is None else int(high) + 1)
            last, called = b.rows("SELECT last_value, is_called FROM decision_numbers")[0]
            if (int(last) + NUMBER_BLOCK if called else int(last)) < floor:
                b.rows("SELECT setval('decision_numbers', ?, false)", (floor,))
            start = int(b.rows("SELECT nextval('decision_numbers')")[0][0])
        self._numbers_ready = start + NUMBER_BLOCK
        return start

    def known_metrics(self, decision_ids) -> dict[str, set[int]]:
        """``{decision_id: metrics}`` of the metrics the log knows for ``decision_ids`` (0 the reward, ``j + 1``
        constraint ``j``): from their feedback rows and the outcomes reported apart; decisions without any are
        left out."""
        late = self._has_outcomes()
        with self._lock, self._b.guard():
            return self._known_locked([str(i) for i in decision_ids], late)

    def _known_locked(self, ids: list[str], late: bool) -> dict[str, set[int]]:
        """``known_metrics`` on the caller's connection (it holds the lock; ``late``: the log has ``outcomes``)."""
        out: dict[str, set[int]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for k, c in self._b.rows(f"SELECT decision_id, constraints FROM feedback WHERE decision_id IN ({marks})",
                                     chunk):
                out.setdefault(k, set()).update(
                    [0, *(j + 1 for j, v in enumerate(_constraint_list(c) or ()) if v is not None)])
            if late:
                for k, j in self._b.rows(f"SELECT decision_id, metric FROM outcomes WHERE decision_id IN ({marks})",
                                         chunk):
                    out.setdefault(k, set()).add(int(j) + 1)
        return out

    def write_apart_shared(self, rows) -> list[bool | None]:
        """Record outcomes reported metric by metric by replicas (PostgreSQL; issue 45): ``rows`` of
        ``(decision_id, reward or None, [constraint or None] * C)``, in one transaction under the
        replicas' advisory lock (so ``seq`` follows commit order, as ``write_feedback_shared``). Each
        row writes only the metrics the log does not know yet for its decision: the reward with the
        constraints known with it as a ``feedback`` row, else each new constraint as an ``outcomes``
        row. Per row: True if something was new, False if the log knew every metric of it, None if
        the log holds no such decision."""
        b = self._shared("feedback from replicas")
        now = time.time()
        out: list[bool | None] = []
        with self._lock, b.guard(), b.transaction():
            b.rows("SELECT pg_advisory_xact_lock(?)", (_PG_FEEDBACK_KEY,))  # first: the reads below see every commit
            for key, reward, constraints in rows:
                key = str(key)
                if not b.rows("SELECT 1 FROM decisions WHERE decision_id = ?", (key,)):
                    out.append(None)
                    continue
                known = self._known_locked([key], True).get(key, set())
                values = [reward, *(constraints or ())]
                new = [None if m in known else v for m, v in enumerate(values)]
                if all(v is None for v in new):
                    out.append(False)
                    continue
                if new[0] is not None:
                    b.run(b.insert("feedback", _FEEDBACK_COLUMNS), feedback_row(key, new[0], new[1:] or None, now))
                else:
                    for j, v in enumerate(new[1:]):
                        if v is not None:
                            b.run("INSERT INTO outcomes (decision_id, metric, value, time) VALUES (?, ?, ?, ?)",
                                  (key, j, float(v), now))
                out.append(True)
        return out

    def write_feedback_shared(self, rows) -> list[bool | None]:
        """Record the feedback ``rows`` (``(decision_id, reward, constraints)`` each) of replicas in
        one transaction, all or none (PostgreSQL). Per row: True if written, False if the decision
        already had feedback (the first committed is the one every replica learns), None if the
        log holds no such decision (nothing written for it).

        The writers of every replica take turns on one advisory lock for the transaction, so the
        feedback's ``seq`` follows the order of the commits: a replica that has read every row up to
        ``seq = s`` never meets a row below ``s`` later (``feedback_since``)."""
        b = self._shared("feedback from replicas")
        now = time.time()
        prepared = [(now, float(r), None if c is None else json.dumps([float(x) for x in c]), str(k))
                    for k, r, c in rows]
        # (a decision some of whose metrics were reported apart takes the rest through write_apart_shared)
        insert = ("INSERT INTO feedback (decision_id, time, reward, constraints) SELECT d.decision_id, ?, ?, ? "
                  "FROM decisions d WHERE d.decision_id = ? AND NOT EXISTS (SELECT 1 FROM outcomes o WHERE "
                  "o.decision_id = d.decision_id) ON CONFLICT DO NOTHING")
        out: list[bool | None] = []
        with self._lock, b.guard():
            if len(prepared) == 1:  # one statement, one round trip: the lock is its transaction's
                written = b.run("WITH turn AS (SELECT pg_advisory_xact_lock(?)) " + insert.replace(
                    "FROM decisions d WHERE", "FROM decisions d, turn WHERE"), (_PG_FEEDBACK_KEY, *prepared[0])) == 1
                out.append(True if written else None)
            else:
                with b.transaction():
                    b.rows("SELECT pg_advisory_xact_lock(?)", (_PG_FEEDBACK_KEY,))
                    out.extend(True if b.run(insert, row) == 1 else None for row in prepared)
            missing = [row[3] for row, new in zip(prepared, out) if new is None]
            if missing:  # not written: a duplicate (the decision is there) or an unknown decision
                there = set()
                for i in range(0, len(missing), 500):
                    chunk = missing[i:i + 500]
                    there.update(r[0] for r in b.rows(
                        f"SELECT decision_id FROM decisions WHERE decision_id IN ({','.join('?' * len(chunk))})", chunk))
                out = [False if new is None and row[3] in there else new for row, new in zip(prepared, out)]
        return out

    def feedback_high(self) -> int:
        """The ``seq`` of the last feedback row committed (0 for none; PostgreSQL's ``seq``, SQLite's rowid)."""
        r = self._b.rowid
        late = self._b.kind == "postgresql" and self._has_outcomes()  # (one order over both tables: PostgreSQL)
        with self._lock, self._b.guard():
            high = int(self._b.rows(f"SELECT COALESCE(MAX({r}), 0) FROM feedback")[0][0])
            if late:
                high = max(high, int(self._b.rows("SELECT COALESCE(MAX(seq), 0) FROM outcomes")[0][0]))
            return high

    def feedback_count(self, through: int | None = None) -> int:
        """The number of feedback rows (with ``seq <= through``)."""
        r = self._b.rowid
        where, params = ("", ()) if through is None else (f" WHERE {r} <= ?", (int(through),))
        late = self._b.kind == "postgresql" and self._has_outcomes()
        with self._lock, self._b.guard():
            count = int(self._b.rows(f"SELECT COUNT(*) FROM feedback{where}", params)[0][0])
            if late:  # PostgreSQL: the outcomes reported apart share feedback's seq (one stream of rows)
                count += int(self._b.rows(f"SELECT COUNT(*) FROM outcomes{where}", params)[0][0])
            return count

    def feedback_since(self, seq: int, limit: int = 10_000) -> list[tuple]:
        """The feedback logged after row ``seq`` with its decision, in log order, at most ``limit``:
        ``(seq, decision_id, reward, constraints (list or None), action, num_actions, context)``
        (what a replica learns at a sync; feedback whose decision the log lacks is left out).

        On PostgreSQL the constraint outcomes reported apart from their reward (``outcomes``, whose
        ``seq`` comes from feedback's sequence) are rows of the same stream, in the same order: a
        row ``(seq, decision_id, None, [None, ..., value], ...)`` with the value at its metric's
        index (the list as long as that index needs; the reader pads it to its policy's count)."""
        r = self._b.rowid
        late = self._b.kind == "postgresql" and self._has_outcomes()
        with self._lock, self._b.guard():
            if late:
                rows = self._b.rows(
                    "SELECT u.s, u.k, u.reward, u.constraints, u.metric, u.value, d.action, d.num_actions, d.context "
                    "FROM (SELECT seq AS s, decision_id AS k, reward, constraints, NULL::bigint AS metric, "
                    "NULL::float8 AS value FROM feedback WHERE seq > ? UNION ALL SELECT seq, decision_id, NULL, NULL, "
                    "metric, value FROM outcomes WHERE seq > ?) u JOIN decisions d ON d.decision_id = u.k "
                    "ORDER BY u.s LIMIT ?", (int(seq), int(seq), int(limit)))
            else:
                rows = [(*row[:4], None, None, *row[4:]) for row in self._b.rows(
                    f"SELECT f.{r}, f.decision_id, f.reward, f.constraints, d.action, d.num_actions, d.context "
                    f"FROM feedback f JOIN decisions d USING (decision_id) WHERE f.{r} > ? ORDER BY f.{r} LIMIT ?",
                    (int(seq), int(limit)))]
        try:
            return [(int(s), k, None if y is None else float(y),
                     [*([None] * int(j)), float(v)] if j is not None else _constraint_list(c), int(a), int(K),
                     [float(x) for x in json.loads(ctx)]) for s, k, y, c, j, v, a, K, ctx in rows]
        except (ValueError, TypeError):
            raise ValueError(f"log: {self.path}: malformed constraints or context in its feedback") from None

    def has_decision(self, decision_id: str) -> bool:
        with self._lock, self._b.guard():
            return bool(self._b.rows("SELECT 1 FROM decisions WHERE decision_id = ?", (str(decision_id),)))

    def has_feedback(self, decision_id: str) -> bool:
        with self._lock, self._b.guard():
            return bool(self._b.rows("SELECT 1 FROM feedback WHERE decision_id = ?", (str(decision_id),)))

    def close(self) -> None:
        with self._lock:
            self._b.close(finished=True)

    # ------------------------------------------------------------------ reading
    def to_dataframe(self, with_feedback_only: bool = False) -> pd.DataFrame:
        """One row per decision, its feedback joined (``reward`` NaN where none arrived).

        ``constraints``: the decision's constraint outcomes (a list, None entries for metrics not
        known yet: never 0), those reported with the reward and those reported apart from it
        (``write_outcomes``) merged; ``outcomes_pending``: how many of the decision's metrics
        (the reward and each constraint) are not known yet. ``with_feedback_only``: the
        decisions whose reward is known."""
        join = "JOIN" if with_feedback_only else "LEFT JOIN"
        columns = ", ".join(f"d.{c}" for c in _DECISION_COLUMNS)
        query = (f"SELECT {columns}, f.reward AS reward, f.constraints AS constraints, f.time AS feedback_time "
                 f"FROM decisions d {join} feedback f USING (decision_id) ORDER BY d.time, d.{self._b.rowid}")
        with self._lock, self._b.guard():
            frame = self._b.frame(query)
        for col in ("context", "probabilities"):
            frame[col] = frame[col].map(json.loads)
        frame["constraints"] = frame["constraints"].map(lambda s: None if s is None or pd.isna(s) else json.loads(s))
        late = self._outcome_values() if self._has_outcomes() else {}
        lengths = [len(c) for c in frame["constraints"] if c is not None]
        C = max([*lengths, *(j + 1 for values in late.values() for j in values)], default=0)
        if late:
            merged = []
            for key, c in zip(frame["decision_id"], frame["constraints"]):
                values = late.get(key)
                if values:
                    c = list(c) if c is not None else [None] * C
                    c += [None] * (C - len(c))
                    for j, v in values.items():
                        c[j] = v
                merged.append(c)
            frame["constraints"] = merged
        frame["outcomes_pending"] = [
            int(pd.isna(r)) + (C if c is None else sum(v is None for v in c) + C - len(c))
            for r, c in zip(frame["reward"], frame["constraints"])]
        return frame

    def _outcome_values(self) -> dict[str, dict[int, float]]:
        """``{decision_id: {metric: value}}`` of every constraint outcome logged apart from its reward."""
        out: dict[str, dict[int, float]] = {}
        with self._lock, self._b.guard():
            for k, j, v in self._b.rows(f"SELECT decision_id, metric, value FROM outcomes ORDER BY {self._b.rowid}"):
                out.setdefault(k, {})[int(j)] = float(v)
        return out

    def to_logged_data(self):
        """The decisions with feedback as ``bayes_safe.offline.LoggedData`` (one domain, ``"all"``),
        with the logged propensities and every action's logging probability.

        **Different numbers of candidates** (a Decider that served 8 and 12 candidates): the data
        has ``n_actions = K_max``, the largest ``K`` logged; row ``i``'s actions ``K_i .. K_max - 1``
        are padding, with ``action_mask`` False and logging probability 0 (the estimators weight
        the logged action only, so they need nothing else: a target policy's probabilities of the
        padding must be 0, as ``target_probabilities`` gives them). The contexts are the candidate
        features padded with zero rows and flattened, ``[N, K_max d]`` (row ``i``'s first ``K_i d``
        numbers are its logged context); a log of context vectors of one length (not candidates)
        keeps them as they are. A log of one ``K`` reads as before: ``n_actions = K``, the logged
        contexts, no ``action_mask``.
        """
        from ..offline import LoggedData

        frame = self.to_dataframe(with_feedback_only=True)
        if frame.empty:
            raise ValueError(f"log: {self.path} has no decision with feedback yet")
        sizes = frame["num_actions"].to_numpy(np.int64)
        K = int(sizes.max())
        mask = None
        if (sizes == K).all():
            contexts = np.array(frame["context"].tolist(), dtype=np.float32)
            probs = np.array(frame["probabilities"].tolist(), dtype=np.float32)
        else:
            lengths = {len(c) for c in frame["context"]}
            if len(lengths) == 1:  # context vectors of one length, not candidates: kept as they are
                contexts = np.array(frame["context"].tolist(), dtype=np.float32)
            else:
                contexts = _padded_candidates(frame, self.path, np.float32).reshape(len(frame), -1)
            probs = np.zeros((len(frame), K), dtype=np.float32)
            for i, row in enumerate(frame["probabilities"]):
                probs[i, :len(row)] = row
            mask = np.arange(K)[None, :] < sizes[:, None]
        return LoggedData.from_tensors(contexts, frame["action"].to_numpy(np.int64), frame["reward"].to_numpy(np.float32),
                                       frame["propensity"].to_numpy(np.float64), np.zeros(len(frame), dtype=np.int64),
                                       domain_names=["all"], n_actions=K, logging_probs=probs, action_mask=mask,
                                       row_labels=frame["decision_id"].to_numpy())

    def target_probabilities(self, policy, *, num_draws: int = 500, seed: int = 0, batched: bool | None = None):
        """Another policy's probability of every action at each logged decision with feedback, ``[N, K]``.

        The rows are those of ``to_logged_data()``, so ``bayes_safe.offline.ips(probs, data)``
        (or ``snips``, ``doubly_robust``, ``estimate_value``) estimates that policy's value from
        the log: e.g. TS-ASC with another ``alpha`` on the same posterior. The logged contexts
        must be the decisions' candidate features (what ``Decider`` logs when it is given
        candidates ``[K, d]``); each decision's logged baseline is passed on. ``K`` is the largest
        number of candidates logged: a decision with fewer gets probability exactly 0 on the rest.

        ``policy.row_probabilities`` computes them: in batched calls of many rows when the policy and
        its models allow it (TS-ASC or Thompson sampling on conjugate or NUTS / SVI models without a
        batch shape; ``batched=None``, the default), else (``batched=False``, chain engines, other
        policies) one decision at a time, as before this option existed (the same numbers). Each
        row has ``num_draws`` draws of its own either way; the two paths agree in law, not number for
        number, and each is reproducible given ``seed``.
        """
        import torch

        frame = self.to_dataframe(with_feedback_only=True)
        if frame.empty:
            raise ValueError(f"log: {self.path} has no decision with feedback yet")
        features = torch.from_numpy(_padded_candidates(frame, self.path, np.float64))
        sizes = torch.tensor(frame["num_actions"].to_numpy(np.int64))
        base = frame["baseline"]
        baseline = None
        if base.notna().any():
            if base.isna().any():  # some decisions without a baseline: each row on its own, as before
                return _rows_with_and_without_baselines(policy, features, sizes, base, num_draws, seed)
            baseline = torch.tensor(base.to_numpy(np.int64))
        probs, _ = policy.row_probabilities(features, baseline, num_actions=sizes, num_draws=num_draws, seed=int(seed),
                                            batched=batched)
        return probs

    def to_obp(self) -> dict:
        """obp's ``bandit_feedback`` dictionary (``n_rounds``, ``n_actions``, ``action``, ``reward``,
        ``pscore``, ``context``, ``position``) of the decisions with feedback. Different numbers of
        candidates: ``n_actions`` is the largest and ``context`` the padded candidate features, as in
        ``to_logged_data``."""
        frame = self.to_dataframe(with_feedback_only=True)
        K = int(frame["num_actions"].max()) if len(frame) else 0
        if len(frame) and ({len(c) for c in frame["context"]} != {len(frame["context"].iloc[0])}):
            context = _padded_candidates(frame, self.path, np.float64).reshape(len(frame), -1)
        else:
            context = np.array(frame["context"].tolist(), dtype=np.float64).reshape(len(frame), -1)
        return {"n_rounds": len(frame), "n_actions": K, "action": frame["action"].to_numpy(np.int64),
                "reward": frame["reward"].to_numpy(np.float64), "pscore": frame["propensity"].to_numpy(np.float64),
                "context": context, "position": np.zeros(len(frame), dtype=np.int64)}

    def __len__(self) -> int:
        with self._lock, self._b.guard():
            return int(self._b.rows("SELECT COUNT(*) FROM decisions")[0][0])

    def __repr__(self) -> str:
        return f"DecisionLog({str(self.path)!r}, decisions={len(self)})"


def _padded_candidates(frame, path, dtype) -> np.ndarray:
    """The logged candidate features of ``frame``'s decisions as ``[N, K_max, d]``, zero beyond each
    decision's ``num_actions`` (``DecisionLog.to_logged_data``); ``ValueError`` when a context is not
    the candidate features of its actions (the Decider was given a context vector) or the widths differ."""
    sizes = frame["num_actions"].to_numpy(np.int64)
    contexts = frame["context"].tolist()
    widths = set()
    for ctx, k, decision in zip(contexts, sizes, frame["decision_id"]):
        if k < 1 or len(ctx) % int(k):
            raise ValueError(f"log: decision {decision!r} logged a context of length {len(ctx)}, not the candidate "
                             f"features of {k} actions (the Decider was given a context vector, not candidates)")
        widths.add(len(ctx) // int(k))
    if len(widths) > 1:
        raise ValueError(f"log: {path}: the logged candidates have different feature widths ({sorted(widths)})")
    d, K = widths.pop(), int(sizes.max())
    if (sizes == K).all():
        return np.array(contexts, dtype=dtype).reshape(len(contexts), K, d)
    out = np.zeros((len(contexts), K * d), dtype=dtype)
    for i, ctx in enumerate(contexts):
        out[i, :len(ctx)] = ctx
    return out.reshape(len(contexts), K, d)


def _rows_with_and_without_baselines(policy, features, sizes, base, num_draws: int, seed: int):
    """``target_probabilities`` of a log where only some decisions logged a baseline: row by row, each with
    its own baseline or none (as before ``row_probabilities``)."""
    import torch

    generator = torch.Generator().manual_seed(int(seed))
    probs = torch.zeros(features.shape[:2], dtype=torch.float64)
    for i, b in enumerate(base):
        k = int(sizes[i])
        bt = None if b is None or pd.isna(b) else torch.tensor([int(b)])
        p, _ = policy.action_probabilities(features[i:i + 1, :k], bt, num_draws=num_draws, generator=generator)
        probs[i, :k] = p[0]
    return probs

