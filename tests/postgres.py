"""A real PostgreSQL server for the tests (issue 29), started by the test run and stopped after it.

Debian's ``postgresql`` package (``make postgres`` installs it; its server binaries are under
``/usr/lib/postgresql/<version>/bin``): ``initdb`` into a temporary directory and ``pg_ctl start``
listening on 127.0.0.1 on a free port, trust authentication for the one user ``bayes`` (the
server accepts connections from this machine only). ``initdb`` refuses to run as root, so as root
both run as the ``postgres`` user, in a directory it owns. Without the binaries the fixture
fails, naming the make target: a test is never skipped silently.

    from postgres import postgres_server   # the session fixture (tests/conftest.py imports it)

    def test_something(postgres_server):
        url = postgres_server.url("mydb")        # a new, empty database each call
"""

from __future__ import annotations

import pytest

from bayes_safe.online.local_postgres import USER, LocalPostgres, bin_dir  # noqa: F401  (the server, in the package)

PostgresServer = LocalPostgres


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for the whole test run (fails, naming ``make postgres``, when not installed)."""
    try:
        server = PostgresServer()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()
