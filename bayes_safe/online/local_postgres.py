"""A throwaway PostgreSQL server on this machine, for trying replicas and for the tests and tutorials.

Replicas (``bayes-safe serve --replica``) share one PostgreSQL decision log. To try them on one
machine without a database server of your own, ``LocalPostgres`` runs Debian's ``postgresql``
server binaries (``make postgres`` installs them; they live under
``/usr/lib/postgresql/<version>/bin``): ``initdb`` into a temporary directory and ``pg_ctl start``
listening on 127.0.0.1 only, on a free port, with trust authentication for the one user ``bayes``.
``initdb`` refuses to run as root, so as root both run as the ``postgres`` user, in a directory it
owns. Not for production: no password, ``fsync=off``, and ``cleanup`` deletes everything.

    from bayes_safe.online.local_postgres import LocalPostgres

    pg = LocalPostgres()
    pg.start()
    url = pg.url("news")          # postgresql://bayes@127.0.0.1:PORT/news, a new empty database
    ...
    pg.cleanup()                  # stop it and delete its directory
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["LocalPostgres", "bin_dir"]

USER = "bayes"


def bin_dir() -> Path | None:
    """The newest PostgreSQL server binaries installed (``initdb`` and ``pg_ctl``), or None."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb") if Path(p).with_name("pg_ctl").exists()]
    if not found:
        return None
    return max(found, key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()] or [0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """One PostgreSQL server in a temporary directory on 127.0.0.1 (``start`` / ``stop`` /
    ``restart`` / ``cleanup``); ``url(name)`` creates a database and returns its URL. A
    ``RuntimeError`` naming ``make postgres`` when the server binaries are not installed."""

    def __init__(self):
        binaries = bin_dir()
        if binaries is None:
            raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `make postgres` "
                               "(Debian's postgresql package), which `make test` does")
        self.bin = binaries
        self.root = Path(tempfile.mkdtemp(prefix="bayes_safe_pg_"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._user = None
        if os.geteuid() == 0:  # initdb refuses root: the server runs as the postgres user, in a directory it owns
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._user = "postgres"
        self._count = 0
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True, check=check,
                              user=self._user, cwd=self.root, timeout=120)

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def url(self, name: str | None = None) -> str:
        """A new empty database (``name``, or a numbered one) and its URL."""
        self._count += 1
        name = name or f"db{self._count}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
