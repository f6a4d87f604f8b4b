"""Where a study lives: Ax's SQL store (SQLite by default, a server database by URL), and JSON export.

Measured pitfalls of Ax 1.3.1's SQL store, and what this module does about them:

* **No tables by itself.** ``ax.api.Client(storage_config=...)`` opens the engine but never
  creates the schema: the first save fails with "no such table". ``connect`` runs Ax's
  ``create_all_tables`` (idempotent) on every database it opens.
* **One engine per process.** Ax keeps a single global session factory
  (``ax.storage.sqa_store.db.SESSION_FACTORY``); ``init_engine_and_session_factory`` silently
  keeps the first engine when called again with another URL, so a second study in the same
  process would write into the first study's database. ``connect`` re-initialises the
  engine (``force_init=True``) whenever the URL changes.
* **SQLAlchemy version.** Ax 1.3.1's store runs on SQLAlchemy 1.4 *and* 2.x (its SQL classes
  import ``Mapped`` when present; its ``mysql`` extra still pins 1.4.17, which is outdated):
  measured here with SQLAlchemy 2.1.9 (create, save, reload, resume).
* **Errors that do not open.** A URL whose driver is missing or whose file cannot be created
  fails late inside Ax with a long traceback; ``connect`` opens a connection first and
  raises one ``ValueError`` naming the URL (password hidden).
* ``tabulate`` is needed by some of Ax's error paths (its ``DataFrame.to_markdown`` calls).

A plain path (``runs/a/study.sqlite``) is taken as an SQLite file.

**PostgreSQL** (``postgresql://user@host:port/db``; measured with PostgreSQL 15+, psycopg 3.3,
SQLAlchemy 2.1; the ``[postgres]`` extra):

* **Driver.** A plain ``postgresql://`` URL is opened with psycopg 3 (``postgresql+psycopg://``,
  ``engine_url``): SQLAlchemy 2.0 would pick psycopg2, which bayes_safe does not install. A URL
  naming its driver (``postgresql+psycopg2://``) is used as written. Passwords belong in
  ``PGPASSWORD`` or ``~/.pgpass`` (libpq reads both); a password in the URL works but is never
  printed (``display_url``). Connections time out after ``CONNECT_TIMEOUT`` seconds unless the
  URL sets ``connect_timeout``, and Ax's pooled connections are checked before use
  (``pool_pre_ping``), so a server restart between two saves costs no trial.
* **Ax's schema does not create on PostgreSQL as declared**: its MySQL-sized columns
  (``Text(2**32 - 1)``, ``String(2**32 - 1)``) are rejected ("type modifier is not allowed for
  type text"). On PostgreSQL every Ax string column longer than 255 characters is created as
  ``TEXT`` (``_postgresql_types``; Ax's JSON columns, ``VARCHAR(4096)`` as declared, hold no
  limit then, as on SQLite), names and short labels keep their lengths. Other tables (MLflow's,
  in the same process) are untouched.
* **Locking.** ``study_lock`` holds a PostgreSQL session advisory lock keyed by the study's name
  (two studies in one database run side by side; one study runs in one process) on a connection
  of its own, idle outside any transaction. The server releases it when that connection ends,
  also when the process is killed (SIGKILL: the kernel closes the socket).
* ``check_server`` opens one connection before any work, so a server that does not answer is one
  line naming the option and ``host:port``.

**Reading before writing.** ``connect`` creates Ax's tables, so it must never be the first thing
done to a database a study is *resumed* from: ``stored_studies`` reads the stored studies
without writing (an SQLite file is opened read-only, ``mode=ro``; a server database through a
plain SQLAlchemy engine) and refuses a missing file, a file that is not SQLite, a database
without Ax's tables or without a bayes_safe study, each with one line. ``experiment_names``
answers ``[]`` for an existing SQLite file without Ax's tables instead of creating them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import stat
import urllib.parse
import zlib
from pathlib import Path

__all__ = [
    "DEFAULT_FILENAME",
    "check_server",
    "connect",
    "display_url",
    "engine_url",
    "experiment_names",
    "is_postgresql",
    "resolve_url",
    "sqlite_path",
    "storage_config",
    "stored_studies",
    "study_lock",
]

DEFAULT_FILENAME = "study.sqlite"
#: the Ax experiment table and the experiment property bayes_safe studies carry
#: (``bayes_safe.tuning.study.PROPERTY_KEY``; tests/test_tuning_trust.py checks they agree)
EXPERIMENT_TABLE = "experiment_v2"
PROPERTY_KEY = "bayes_safe_tuning"
_CURRENT_URL: str | None = None
#: seconds a PostgreSQL connection attempt may take (unless the URL sets connect_timeout)
CONNECT_TIMEOUT = 10
#: Ax's string columns longer than this are TEXT on PostgreSQL (Ax's LONG_STRING_FIELD_LENGTH)
_PG_MAX_VARCHAR = 255
#: the first key of the advisory locks of bayes_safe studies (the second is the study's name)
_LOCK_NAMESPACE = zlib.crc32(b"bayes_safe.tuning.study") & 0x7FFFFFFF
_PG_TYPES_READY = False


def resolve_url(storage: str | os.PathLike | None, out: str | os.PathLike | None = None) -> str:
    """The database URL of a study: ``storage`` (a URL or an SQLite file path) or ``out/study.sqlite``."""
    if storage is None or str(storage) == "":
        if out is None:
            raise ValueError("storage: expected a database URL or an SQLite path (or an output directory to hold one)")
        return "sqlite:///" + str((Path(out) / DEFAULT_FILENAME).resolve())
    text = str(storage)
    if "://" in text:
        return text
    return "sqlite:///" + str(Path(text).expanduser().resolve())


def sqlite_path(url: str) -> Path | None:
    """The file of an ``sqlite:///`` URL (``None`` for other databases or in-memory SQLite)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix) and ":memory:" not in url:
        return Path(url[len(prefix):].split("?", 1)[0])
    return None


def display_url(url: str) -> str:
    """``url`` with its password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a display helper never raises
        return url.split("@")[-1] if "@" in url else url


def _scheme(url: str) -> str:
    head, sep, _ = url.partition("://")
    return head.lower() if sep else ""


def is_postgresql(url: str) -> bool:
    """A PostgreSQL URL (``postgresql://`` or ``postgresql+DRIVER://``)."""
    return _scheme(url).split("+")[0] == "postgresql"


def engine_url(url: str) -> str:
    """The URL SQLAlchemy opens: a plain ``postgresql://`` becomes ``postgresql+psycopg://``
    (psycopg 3, the ``[postgres]`` extra; SQLAlchemy 2.0 would pick psycopg2); any other URL,
    and a PostgreSQL URL naming its driver, is returned unchanged."""
    if _scheme(url) == "postgresql":
        return "postgresql+psycopg://" + url.partition("://")[2]
    return url


def _engine_options(url: str) -> dict:
    """``create_engine`` options of a server database: a bounded connection attempt (unless the
    URL sets ``connect_timeout``) and pooled connections checked before use."""
    if not is_postgresql(url):
        return {}
    options: dict = {"pool_pre_ping": True}
    if "connect_timeout" not in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query):
        options["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT}
    return options


def _where(url: str) -> str:
    """``host:port`` of a server URL (for messages)."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(engine_url(url))
    except Exception:  # noqa: BLE001 - a display helper never raises
        return "?"
    port = parsed.port or (5432 if is_postgresql(url) else None)
    host = parsed.host or ("the local socket" if is_postgresql(url) else "?")
    return f"{host}:{port}" if port else host


def _reason(exc: BaseException, url: str) -> str:
    """The driver's own first line of ``exc`` without the libpq boilerplate and any password."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    line = text.splitlines()[0].strip() if text else type(exc).__name__
    for prefix in ("connection failed:", "(psycopg.OperationalError)", "(psycopg2.OperationalError)"):
        if line.startswith(prefix):
            line = line[len(prefix):].strip()
    if line.startswith("connection to server") and " failed: " in line:
        line = line.split(" failed: ", 1)[1]
    line = " ".join(line.replace("FATAL:", "").split())
    with contextlib.suppress(Exception):
        from sqlalchemy.engine import make_url

        password = make_url(engine_url(url)).password
        if password:
            line = line.replace(str(password), "***")
    return line or type(exc).__name__


def _server_error(exc: BaseException, url: str, what: str) -> str:
    """One line: ``what`` could not connect to the server of ``url`` (password hidden)."""
    if isinstance(exc, ModuleNotFoundError) or type(exc).__name__ == "NoSuchModuleError":
        if is_postgresql(url):
            return (f"{what} {display_url(url)}: the PostgreSQL driver is not installed "
                    f"({_reason(exc, url)}); pip install 'bayes-safe[postgres]' (psycopg 3)")
        return f"{what} {display_url(url)}: the database driver is not installed ({_reason(exc, url)})"
    return f"{what} {display_url(url)}: cannot open the database on the server at {_where(url)}: {_reason(exc, url)}"


def _plain_engine(url: str, **extra):
    """A SQLAlchemy engine of its own (no pool) for ``url``; driver errors as ``ValueError``."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    options = {k: v for k, v in _engine_options(url).items() if k != "pool_pre_ping"}
    if extra.get("connect_args"):
        options["connect_args"] = {**options.get("connect_args", {}), **extra.pop("connect_args")}
    return sqlalchemy.create_engine(engine_url(url), poolclass=NullPool, **options, **extra)


def check_server(url: str, what: str = "storage") -> None:
    """Open (and close) one connection to the server database ``url`` before any work is done;
    ``ValueError`` naming ``what`` and ``host:port`` when it does not open. SQLite: nothing."""
    if _scheme(url).split("+")[0] in ("", "sqlite"):
        return
    import sqlalchemy

    try:
        engine = _plain_engine(url)
    except Exception as exc:  # noqa: BLE001 - a missing driver, a bad URL
        raise ValueError(_server_error(exc, url, what)) from None
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - refused, unknown host, no such database, bad credentials
        raise ValueError(_server_error(exc, url, what)) from None
    finally:
        engine.dispose()


def _postgresql_types() -> None:
    """Create Ax's string columns longer than 255 characters as ``TEXT`` on PostgreSQL (see the
    module docstring); registered once per process, for the columns of Ax's tables only."""
    global _PG_TYPES_READY
    if _PG_TYPES_READY:
        return
    from ax.storage.sqa_store.db import Base
    from sqlalchemy import types
    from sqlalchemy.ext.compiler import compiles

    def text_when_long(type_, compiler, **kw):
        table = getattr(kw.get("type_expression"), "table", None)
        length = getattr(type_, "length", None)
        if length and length > _PG_MAX_VARCHAR and getattr(table, "metadata", None) is Base.metadata:
            return "TEXT"
        return getattr(compiler, f"visit_{type_.__visit_name__}")(type_, **kw)

    for cls in (types.String, types.Text, types.VARCHAR):
        compiles(cls, "postgresql")(text_when_long)
    _PG_TYPES_READY = True


def connect(url: str) -> None:
    """Point Ax's (process-global) SQL engine at ``url``, check it opens, create Ax's tables.

    Raises:
        ValueError: the database cannot be opened (message names the URL and the reason).
    """
    global _CURRENT_URL
    try:
        import sqlalchemy
        from ax.storage.sqa_store import db
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ValueError(f"storage: Ax's SQL store needs SQLAlchemy ({exc})") from exc
    if url == _CURRENT_URL and db.SESSION_FACTORY is not None:
        return
    shown = display_url(url)
    path = sqlite_path(url)
    if path is not None and not path.parent.is_dir():
        raise ValueError(f"storage {shown}: cannot open the database: directory {path.parent} does not exist")
    target = engine_url(url)
    step = "open"
    try:
        db.init_engine_and_session_factory(url=target, force_init=_CURRENT_URL is not None and _CURRENT_URL != url,
                                           **_engine_options(url))
        if db.SESSION_FACTORY is not None and _CURRENT_URL is None:
            # an engine someone else opened in this process: make sure it is ours
            bound = db.get_engine().url.render_as_string(hide_password=False)
            if bound != sqlalchemy.engine.make_url(target).render_as_string(hide_password=False):
                db.init_engine_and_session_factory(url=target, force_init=True, **_engine_options(url))
        engine = db.get_engine()
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        step = "tables"
        if engine.dialect.name == "postgresql":
            _postgresql_types()
        db.create_all_tables(engine)
    except Exception as exc:
        _CURRENT_URL = None
        if db.SESSION_FACTORY is not None:
            with contextlib.suppress(Exception):
                db.get_engine().dispose()
            db.SESSION_FACTORY = None
        if path is None and step == "open":
            raise ValueError(_server_error(exc, url, "storage")) from exc
        reason = _reason(exc, url)
        doing = "cannot open the database" if step == "open" else "cannot create Ax's tables"
        raise ValueError(f"storage {shown}: {doing}: {type(exc).__name__}: {reason}") from exc
    _CURRENT_URL = url


def storage_config(url: str):
    """An ``ax.api.configs.StorageConfig`` for ``url`` (call ``connect`` first)."""
    from ax.api.configs import StorageConfig

    return StorageConfig(url=engine_url(url))


def _read_sqlite(path: Path, what: str) -> list[tuple[str, str | None]] | None:
    """``[(name, properties JSON)]`` of the Ax experiments in the SQLite file ``path``, opened
    read-only (nothing is created or written); ``None`` when it holds no Ax experiment table."""
    # A kill in the middle of a write leaves a hot journal beside the database, which SQLite
    # rolls back on the next read, and only with write access: open read-write then (mode=rw
    # never creates a file), so a study killed mid-write still resumes. Without a journal the
    # file is opened read-only.
    hot = any(Path(f"{path}{suffix}").is_file() and Path(f"{path}{suffix}").stat().st_size > 0
              for suffix in ("-journal", "-wal"))
    uri = "file:" + urllib.parse.quote(str(path)) + ("?mode=rw" if hot else "?mode=ro")
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise ValueError(f"{what} {path}: cannot open the database read-only ({exc})") from None
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if EXPERIMENT_TABLE not in tables:
            return None
        return [(str(n), p) for n, p in conn.execute(f"SELECT name, properties FROM {EXPERIMENT_TABLE}")]
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{what} {path}: not an SQLite study database ({exc})") from None
    finally:
        conn.close()


def _read_server(url: str, what: str) -> list[tuple[str, str | None]] | None:
    """The same for a server database, through a plain SQLAlchemy engine (no table is created)."""
    import sqlalchemy

    try:
        engine = _plain_engine(url)
    except Exception as exc:  # noqa: BLE001 - a missing driver, a bad URL
        raise ValueError(_server_error(exc, url, what)) from None
    try:
        try:
            conn = engine.connect()
        except Exception as exc:  # noqa: BLE001 - any driver error becomes one line
            raise ValueError(_server_error(exc, url, what)) from None
        with conn:
            if not sqlalchemy.inspect(conn).has_table(EXPERIMENT_TABLE):
                return None
            rows = conn.execute(sqlalchemy.text(f"SELECT name, properties FROM {EXPERIMENT_TABLE}")).all()
            return [(str(n), p) for n, p in rows]
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - any driver error becomes one line
        raise ValueError(f"{what} {display_url(url)}: cannot read the database: {_reason(exc, url)}") from None
    finally:
        engine.dispose()


def stored_studies(url: str, what: str = "storage") -> dict[str, dict]:
    """``{name: bayes_safe properties}`` of the bayes_safe studies stored at ``url``, read without
    writing anything (SQLite is opened with ``mode=ro``; no Ax table is created).

    Args:
        url: the database URL (``resolve_url``).
        what: the argument the database came from, for messages (``--out``, ``--storage``).

    Raises:
        ValueError: (one line naming ``what``) no such SQLite file, not an SQLite database,
            no Ax tables, or no experiment with bayes_safe's property.
    """
    path = sqlite_path(url)
    if path is not None:
        if not path.exists():
            raise ValueError(f"{what}: no study database at {path} (start a study first; resume never creates one)")
        if not path.is_file():
            raise ValueError(f"{what}: {path} is not a file")
        rows = _read_sqlite(path, what)
        shown = str(path)
    else:
        rows = _read_server(url, what)
        shown = display_url(url)
    if rows is None:
        raise ValueError(f"{what} {shown}: holds no bayes_safe study (no Ax tables); refusing to write to it")
    studies: dict[str, dict] = {}
    for name, raw in rows:
        try:
            props = json.loads(raw) if isinstance(raw, str) else (raw or {})
        except ValueError:
            props = {}
        if isinstance(props, dict) and isinstance(props.get(PROPERTY_KEY), dict):
            studies[name] = props[PROPERTY_KEY]
    if not studies:
        others = ", ".join(sorted(n for n, _ in rows)) or "none"
        raise ValueError(f"{what} {shown}: holds no bayes_safe study (Ax experiments: {others}); refusing to write to it")
    return studies


def experiment_names(url: str) -> list[str]:
    """Names of the experiments stored at ``url`` (connects first; ``[]`` without touching an
    existing SQLite file or a server database that holds no Ax tables, so looking never creates them)."""
    path = sqlite_path(url)
    if path is not None and path.is_file() and url != _CURRENT_URL and _read_sqlite(path, "storage") is None:
        return []
    if path is None and url != _CURRENT_URL and _scheme(url).split("+")[0] not in ("", "sqlite") \
            and _read_server(url, "storage") is None:
        return []  # a server database without Ax's tables: looking creates none
    connect(url)
    from ax.storage.sqa_store.db import session_scope
    from ax.storage.sqa_store.sqa_classes import SQAExperiment

    with session_scope() as session:
        return sorted(row[0] for row in session.query(SQAExperiment.name).all())


@contextlib.contextmanager
def study_lock(url: str, name: str | None = None):
    """Hold an exclusive lock on a study while it runs (released even on SIGKILL).

    Two processes running one study would both treat the other's running trials as
    interrupted; the lock turns that into a clear error (``ValueError``: "another process is
    running ..."). An SQLite study locks its file (``flock`` on ``FILE.lock``; every study in
    the file); a PostgreSQL study holds a session advisory lock keyed by its ``name`` in its
    database, on a connection of its own that the server closes when the process dies. Other
    server databases are not locked.
    """
    if is_postgresql(url):
        with _advisory_lock(url, name or ""):
            yield
        return
    path = sqlite_path(url)
    if path is None:
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    # never follow a symlink (a planted `study.sqlite.lock -> ~/important` would be truncated),
    # and refuse anything that is not a regular file
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if lock_path.is_symlink():
            raise ValueError(f"storage {path}: the lock {lock_path} is a symbolic link; refusing to open it "
                             "(remove it if you did not put it there)") from None
        raise ValueError(f"storage {path}: cannot open the lock {lock_path} ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"storage {path}: the lock {lock_path} is not a regular file; refusing to use it")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"storage {path}: another process is running this study (lock {lock_path})") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid()}).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


#: the two int4 keys of the advisory lock functions (cast: a driver may bind a Python int as bigint)
_LOCK_ARGS = "CAST(:ns AS integer), CAST(:key AS integer)"


def _lock_key(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _lock_holder(conn, key: int) -> str:
    """Who holds the advisory lock of ``key`` (best effort: another user's session may be hidden)."""
    import sqlalchemy

    query = sqlalchemy.text(
        "SELECT a.application_name, a.pid FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = CAST(:ns AS oid) "
        "AND l.objid = CAST(:key AS oid) AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    with contextlib.suppress(Exception):
        row = conn.execute(query, {"ns": _LOCK_NAMESPACE, "key": key}).first()
        if row is not None:
            app, backend = row
            if app:
                return f"{app}, server backend {backend}"
            return f"server backend {backend}"
    return "another session"


@contextlib.contextmanager
def _advisory_lock(url: str, name: str):
    """``pg_try_advisory_lock(namespace, crc32(name))`` on a connection of its own (autocommit:
    idle, outside any transaction, while the study runs); unlocked and closed on exit."""
    import sqlalchemy

    shown = display_url(url)
    key = _lock_key(name)
    keys = {"ns": _LOCK_NAMESPACE, "key": key}
    # names this process in pg_stat_activity, so a refused second process can say who holds the lock
    me = f"bayes_safe pid {os.getpid()} on {socket.gethostname()}"[:63]
    try:
        engine = _plain_engine(url, connect_args={"application_name": me}, isolation_level="AUTOCOMMIT")
    except Exception as exc:  # noqa: BLE001 - a missing driver, a bad URL
        raise ValueError(_server_error(exc, url, "storage")) from None
    try:
        try:
            conn = engine.connect()
        except Exception as exc:  # noqa: BLE001 - refused, unknown host, ...
            raise ValueError(_server_error(exc, url, "storage")) from None
        try:
            held = conn.execute(sqlalchemy.text(f"SELECT pg_try_advisory_lock({_LOCK_ARGS})"), keys).scalar()
            if not held:
                raise ValueError(f"storage {shown}: another process is running study {name!r} (its PostgreSQL advisory "
                                 f"lock is held by {_lock_holder(conn, key)})")
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    conn.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock({_LOCK_ARGS})"), keys)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
    finally:
        engine.dispose()
