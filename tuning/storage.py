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
import sqlite3
import stat
import urllib.parse
from pathlib import Path

__all__ = [
    "DEFAULT_FILENAME",
    "connect",
    "display_url",
    "experiment_names",
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
    try:
        db.init_engine_and_session_factory(url=url, force_init=_CURRENT_URL is not None and _CURRENT_URL != url)
        if db.SESSION_FACTORY is not None and _CURRENT_URL is None:
            # an engine someone else opened in this process: make sure it is ours
            bound = db.get_engine().url.render_as_string(hide_password=False)
            if bound != sqlalchemy.engine.make_url(url).render_as_string(hide_password=False):
                db.init_engine_and_session_factory(url=url, force_init=True)
        engine = db.get_engine()
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        db.create_all_tables(engine)
    except Exception as exc:
        _CURRENT_URL = None
        if db.SESSION_FACTORY is not None:
            with contextlib.suppress(Exception):
                db.get_engine().dispose()
            db.SESSION_FACTORY = None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"storage {shown}: cannot open the database: {type(exc).__name__}: {reason}") from exc
    _CURRENT_URL = url


def storage_config(url: str):
    """An ``ax.api.configs.StorageConfig`` for ``url`` (call ``connect`` first)."""
    from ax.api.configs import StorageConfig

    return StorageConfig(url=url)


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
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
    except Exception as exc:  # noqa: BLE001 - a missing driver, a bad URL
        raise ValueError(f"{what} {display_url(url)}: cannot open the database: {type(exc).__name__}: {exc}") from None
    try:
        with engine.connect() as conn:
            if not sqlalchemy.inspect(conn).has_table(EXPERIMENT_TABLE):
                return None
            rows = conn.execute(sqlalchemy.text(f"SELECT name, properties FROM {EXPERIMENT_TABLE}")).all()
            return [(str(n), p) for n, p in rows]
    except Exception as exc:  # noqa: BLE001 - any driver error becomes one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{what} {display_url(url)}: cannot read the database: {reason}") from None
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
    existing SQLite file that holds no Ax tables, so looking never creates them)."""
    path = sqlite_path(url)
    if path is not None and path.is_file() and url != _CURRENT_URL and _read_sqlite(path, "storage") is None:
        return []
    connect(url)
    from ax.storage.sqa_store.db import session_scope
    from ax.storage.sqa_store.sqa_classes import SQAExperiment

    with session_scope() as session:
        return sorted(row[0] for row in session.query(SQAExperiment.name).all())


@contextlib.contextmanager
def study_lock(url: str):
    """Hold an exclusive lock on an SQLite study while it runs (released by the OS even on SIGKILL).

    Two processes running one study would both treat the other's running trials as
    interrupted; the lock turns that into a clear error. Server databases are not locked.
    """
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
