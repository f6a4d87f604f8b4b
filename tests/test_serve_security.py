"""A service you can expose (issue 28, the HTTP part): tokens and roles, browser safety, limits
enforced before work, honest health.

Each finding of the audit is checked through a real ``bayes-safe serve`` process on 127.0.0.1
(port 0) and a real HTTP client (httpx, or a raw socket where the request must be malformed on
purpose). One server (``secured``) holds a token file with one token per role; a second one is
started with a file-size limit (``RLIMIT_FSIZE``, set in the child before it runs: a real write
failure, EFBIG, that root cannot bypass) so that its decision log stops being writable after a
few decisions, as on a full disk.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import ROOT, _state

from bayes_safe.cli import main

TOKENS = {"decide": "dEcIdE-0123456789abcdefghij", "feedback": "fEeDbAcK-0123456789abcdefghij",
          "read": "rEaD-0123456789abcdefghij", "all": "aLl-0123456789abcdefghij"}
EYE = np.eye(3).tolist()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAYES_SAFE_TOKEN")}
    return env | {"PYTHONPATH": str(ROOT)} | extra


def _token_file(path: Path, mode: int = 0o600) -> Path:
    path.write_text("# roles: decide, feedback, read, all\n"
                    + "".join(f"{token}  {role}\n" for role, token in TOKENS.items()))
    path.chmod(mode)
    return path


class Served:
    """``bayes-safe serve STATE --port 0 ...`` in a subprocess; ``url`` from its first line."""

    def __init__(self, state: Path, log: Path, *args: str, file_size_limit: int | None = None):
        # file_size_limit: set in the child before the command runs; every file it writes stops at this size
        code = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, "
                f"{file_size_limit})); from bayes_safe.cli import main; sys.exit(main(sys.argv[1:]))")
        start = ["-m", "bayes_safe.cli"] if file_size_limit is None else ["-c", code]
        self.proc = subprocess.Popen(
            [sys.executable, *start, "serve", str(state), "--port", "0", "--log", str(log), "--snapshot-every",
             "3600", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
        self.first_line = self.proc.stdout.readline()
        match = re.search(r"listening on http://(\S+):(\d+)", self.first_line)
        if not match:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {self.first_line!r} {self.proc.communicate()[1]}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = f"http://{self.host}:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def post(self, path: str, body, role: str | None = None, **headers) -> httpx.Response:
        auth = {"authorization": f"Bearer {TOKENS[role]}"} if role else {}
        return self.client.post(path, json=body, headers=auth | headers)

    def get(self, path: str, role: str | None = None, **headers) -> httpx.Response:
        auth = {"authorization": f"Bearer {TOKENS[role]}"} if role else {}
        return self.client.get(path, headers=auth | headers)

    def rss(self) -> int:
        """The server's resident memory, in bytes."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def raw(self, request: bytes, timeout: float = 5.0) -> tuple[int, dict]:
        """Send ``request`` as it is on a new connection; the status and JSON body of the answer."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    def stop(self) -> str:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.communicate(timeout=30)[1]


def _length(data: bytes) -> int:
    match = re.search(rb"content-length: (\d+)", data.split(b"\r\n\r\n", 1)[0], re.IGNORECASE)
    return int(match.group(1)) if match else 0


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """One server with a token per role and the default limits."""
    tmp = tmp_path_factory.mktemp("secured")
    server = Served(_state(tmp / "state"), tmp / "log.sqlite", "--token-file", str(_token_file(tmp / "tokens")))
    server.state = tmp / "state"
    server.tmp = tmp
    yield server
    server.stop()


def _decide(server, role="decide", **extra):
    r = server.post("/decide", {"features": EYE, "baseline": 0} | extra, role)
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------------------------- tokens and roles
def test_no_token_is_401_a_wrong_role_403_the_right_token_200(secured):
    for method, path, role in [("post", "/decide", "decide"), ("post", "/feedback", "feedback"),
                               ("get", "/posterior", "read"), ("get", "/metrics", "read")]:
        body = {"features": EYE, "baseline": 0} if path == "/decide" else {"decision_id": "0", "reward": 1.0}

        def send(method=method, path=path, body=body, **h):
            return secured.post(path, body, **h) if method == "post" else secured.get(path, **h)
        r = send()
        assert r.status_code == 401 and f"needs a token with the {role!r} role" in r.json()["detail"], r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
        wrong = "not-a-token-of-this-service-0123456789"
        r = send(authorization=f"Bearer {wrong}")
        assert r.status_code == 401 and wrong not in r.text and "not one of this service's" in r.json()["detail"]
        other = next(k for k in ("decide", "feedback", "read") if k != role)
        r = send(authorization=f"Bearer {TOKENS[other]}")
        assert r.status_code == 403 and f"needs a token with the {role!r} role" in r.json()["detail"], r.text
        assert TOKENS[other] not in r.text
    d = _decide(secured)
    assert secured.post("/feedback", {"decision_id": d["decision_id"], "reward": 0.5, "constraints": [1.0]},
                        "feedback").json() == {"accepted": True}
    assert secured.get("/posterior", "read").json()["model_version"] >= 1
    assert secured.get("/metrics", "read").text.startswith("# HELP")
    assert _decide(secured, "all")["action"] in (0, 1, 2)  # a token with several roles


def test_a_strangers_feedback_moves_no_posterior(secured):
    d = _decide(secured)
    before = secured.get("/posterior", "read").json()
    for headers in ({}, {"authorization": "Bearer " + "x" * 30}, {"authorization": f"Bearer {TOKENS['decide']}"}):
        r = secured.post("/feedback", {"decision_id": d["decision_id"], "reward": 100.0, "constraints": [1.0]},
                         **headers)
        assert r.status_code in (401, 403)
    assert secured.get("/posterior", "read").json() == before


def test_health_is_open_but_shows_counts_only_with_a_token(secured):
    r = secured.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = secured.get("/health", "read")
    assert r.status_code == 200 and r.json()["status"] == "ok" and "decisions" in r.json()


# ---------------------------------------------------------------------------------- browser safety
def test_a_post_that_is_not_json_is_415(secured):
    body = json.dumps({"features": EYE, "baseline": 0})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"authorization": f"Bearer {TOKENS['decide']}"} | ({"content-type": content_type}
                                                                      if content_type else {})
        r = secured.client.post("/decide", content=body, headers=headers)
        assert r.status_code == 415 and "Content-Type: expected application/json" in r.json()["detail"], r.text
    r = secured.client.post("/decide", content=body, headers={"authorization": f"Bearer {TOKENS['decide']}",
                                                              "content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_a_foreign_host_or_origin_is_refused(secured):
    r = secured.post("/decide", {"features": EYE, "baseline": 0}, "decide", host="attacker.example")
    assert r.status_code == 421 and "Host: 'attacker.example'" in r.json()["detail"]
    assert secured.get("/health", host=f"attacker.example:{secured.port}").status_code == 421  # every path
    assert secured.post("/decide", {"features": EYE, "baseline": 0}, "decide",
                        host=f"localhost:{secured.port}").status_code == 200
    assert secured.get("/health", host="[::1]").status_code == 200
    r = secured.post("/decide", {"features": EYE, "baseline": 0}, "decide", origin="https://attacker.example")
    assert r.status_code == 403 and "Origin: 'https://attacker.example' is not allowed" in r.json()["detail"]
    assert secured.get("/posterior", "read", origin="null").status_code == 403


# ---------------------------------------------------------------------------------- limits
def test_an_oversize_content_length_is_413_at_once_and_the_server_does_not_grow(secured):
    before = secured.rss()
    start = time.perf_counter()
    request = (b"POST /decide HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer " + TOKENS["decide"].encode() + b"\r\nContent-Length: 268435456\r\n\r\n"
               + b"[" * 1000)  # a 256 MiB body announced, a little of it sent
    status, body = secured.raw(request)
    assert status == 413 and body["detail"] == ("body: 268435456 bytes, more than the limit of 1048576 "
                                                "(bayes-safe serve --max-body-bytes)")
    assert time.perf_counter() - start < 2
    # a chunked body (no length announced) is cut off once it passes the limit, the rest never read
    chunk = b"x" * 262144
    request = (b"POST /feedback HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer " + TOKENS["feedback"].encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 4 + b"1\r\nx\r\n")  # 1 MiB + 1 byte, no last chunk
    status, body = secured.raw(request)
    assert status == 413 and "more than the limit of 1048576 bytes" in body["detail"]
    assert secured.rss() - before < 16 << 20
    assert _decide(secured)["action"] in (0, 1, 2)  # still serving


def test_too_many_candidates_or_feedback_items_are_413_naming_the_limit(secured):
    r = secured.post("/decide", {"features": [[1.0, 0.0, 0.0]] * 1001, "baseline": 0}, "decide")
    assert r.status_code == 413 and r.json()["detail"].startswith("features: 1001 candidates, more than the limit of "
                                                                  "1000 (bayes-safe serve --max-candidates)")
    assert secured.post("/decide", {"features": [[1.0, 0.0, 0.0]] * 1000, "baseline": 0}, "decide").status_code == 200
    r = secured.post("/feedback", [{"decision_id": str(i), "reward": 1.0} for i in range(10_001)], "feedback")
    assert r.status_code == 413 and "10001 feedback items, more than the limit of 10000" in r.json()["detail"]


def test_a_400_digit_integer_and_deep_json_are_422_naming_the_field(secured):
    huge = int("9" * 400)
    d = _decide(secured)
    cases = [("/decide", {"features": [[1.0, huge, 0.0]], "baseline": 0},
              r"^features\[0\]\[1\]: expected a number within the float range .* an integer of 400 digits"),
             ("/decide", {"features": [[1.0, 0.0, 0.0]], "baseline": huge}, r"^baseline: "),
             ("/feedback", {"decision_id": d["decision_id"], "reward": huge, "constraints": [1.0]},
              r"^reward: expected a number within the float range"),
             ("/feedback", {"decision_id": d["decision_id"], "reward": 1.0, "constraints": [-huge]},
              r"^constraints\[0\]: expected a number within the float range")]
    for path, body, match in cases:
        r = secured.post(path, body, path.strip("/"))
        assert r.status_code == 422 and re.search(match, r.json()["detail"]), r.text
    headers = {"authorization": f"Bearer {TOKENS['decide']}", "content-type": "application/json"}
    for depth in (100_000, 40):
        r = secured.client.post("/decide", content=b'{"features": ' + b"[" * depth + b"]" * depth + b"}",
                                headers=headers)
        assert r.status_code == 422 and r.json()["detail"] == "body: JSON nested deeper than 32 levels", r.text
    r = secured.client.post("/decide", content=b'{"features": [[1, ' + b"9" * 5000 + b', 0]]}', headers=headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("body: a number too large"), r.text
    r = secured.client.post("/decide", content=b'{"features": [["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 1, 0]]}',
                            headers=headers)  # brackets inside a string are not nesting
    assert r.status_code == 422 and r.json()["detail"].startswith("features[0][0]: expected a number"), r.text


# ---------------------------------------------------------------------------------- the command line
def test_a_non_loopback_host_without_tokens_is_refused(tmp_path):
    state = _state(tmp_path / "state")
    r = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "serve", str(state), "--host", "0.0.0.0", "--port",
                        "0"], capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("bayes-safe serve: error: --host: 0.0.0.0 is not a loopback address, and the service "
                               "has no tokens") and "--token-file" in r.stderr
    assert not (tmp_path / "state.log.sqlite").exists()  # refused before anything was opened


def test_a_malformed_token_file_is_refused_naming_the_file_and_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BAYES_SAFE_TOKEN_FILE", raising=False)
    state = _state(tmp_path / "state")
    tokens = tmp_path / "tokens"
    for text, message in [(f"# ok\n{TOKENS['read']} read\n{TOKENS['decide']}\n", ":3: expected 'TOKEN ROLE"),
                          (f"{TOKENS['read']} read,admin\n", ":1: unknown role 'admin'"),
                          ("short read\n", ":1: the token is 5 characters long; expected at least 16"),
                          (f"{TOKENS['read']} read\n{TOKENS['read']} decide\n", ":2: the same token as line 1"),
                          ("# nothing\n", ": no tokens")]:
        tokens.write_text(text)
        with pytest.raises(SystemExit) as exc:
            main(["serve", str(state), "--port", "0", "--token-file", str(tokens)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"--token-file: {tokens}{message}" in err, err
        assert TOKENS["read"] not in err and TOKENS["decide"] not in err
    monkeypatch.setenv("BAYES_SAFE_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(SystemExit) as exc:
        main(["serve", str(state), "--port", "0"])
    assert exc.value.code == 2 and "BAYES_SAFE_TOKEN_FILE: no such file" in capsys.readouterr().err
    assert not (tmp_path / "state.log.sqlite").exists()


def test_bayes_safe_feedback_url_sends_the_token(secured, tmp_path, capsys, monkeypatch):
    for name in ("BAYES_SAFE_TOKEN", "BAYES_SAFE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    decisions = [_decide(secured) for _ in range(4)]
    (tmp_path / "o.csv").write_text("decision_id,reward,constraint0\n"
                                    + "".join(f"{d['decision_id']},1.0,1.0\n" for d in decisions[:2]))
    command = ["feedback", str(secured.state), "--from", str(tmp_path / "o.csv"), "--url", secured.url]
    with pytest.raises(SystemExit) as exc:
        main(command)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "bayes-safe feedback: error: --token-file: the service at" in err and "refused the token" in err
    (tmp_path / "client-token").write_text(TOKENS["feedback"] + "\n")
    assert main([*command, "--token-file", str(tmp_path / "client-token")]) == 0
    assert "2 rows, 2 applied" in capsys.readouterr().out
    assert main([*command, "--token-file", str(secured.tmp / "tokens")]) == 0  # the service's file: its feedback token
    assert "2 rows, 0 applied, 2 already had feedback" in capsys.readouterr().out
    (tmp_path / "o.csv").write_text("decision_id,reward,constraint0\n"
                                    + "".join(f"{d['decision_id']},1.0,1.0\n" for d in decisions[1:]))
    monkeypatch.setenv("BAYES_SAFE_TOKEN", TOKENS["feedback"])  # the token from the environment
    assert main(command) == 0
    assert "3 rows, 2 applied, 1 already had feedback" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- honest health
def test_a_log_that_cannot_be_written_is_503_and_health_says_degraded(tmp_path):
    """The server's files may not grow past 160 KiB (``RLIMIT_FSIZE``): the log's WAL soon cannot,
    and every write fails with EFBIG as on a full disk (the limit leaves room for a few decisions and
    their feedback after the log's own tables: schema 2 has one more). The token file is readable by
    others: a warning."""
    server = Served(_state(tmp_path / "state"), tmp_path / "log.sqlite", "--token-file",
                    str(_token_file(tmp_path / "tokens", 0o644)), file_size_limit=160 << 10)
    try:
        ok, answer = [], None
        rows = (np.eye(3)[np.arange(300) % 3] + 0.123456789).tolist()  # about 17 kB of context per decision row
        for _ in range(40):
            r = server.post("/decide", {"features": rows, "baseline": 0}, "decide")
            if r.status_code != 200:
                answer = r
                break
            ok.append(r.json())
        assert answer is not None and ok, "the log never filled up"
        assert answer.status_code == 503, answer.text
        assert answer.json()["detail"].startswith("the decision log could not be written (OperationalError: ")
        health = server.get("/health", "read")
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert health.json()["problems"][0].startswith("decision log: the last write failed (OperationalError")
        assert health.json()["decisions"] == len(ok) and health.json()["pending"] == len(ok)  # nothing issued
        anonymous = server.get("/health")
        assert anonymous.status_code == 503 and anonymous.json() == {
            "status": "degraded", "problems": ["decision log: the last write failed"]}
        applied = 0  # (a feedback row is small: the first ones may still fit)
        for d in ok:
            r = server.post("/feedback", {"decision_id": d["decision_id"], "reward": 1.0, "constraints": [1.0]},
                            "feedback")
            if r.status_code != 200:
                break
            applied += 1
        assert r.status_code == 503 and "the decision log could not be written" in r.json()["detail"], r.text
        assert server.get("/posterior", "read").json()["pending"] == len(ok) - applied  # the client may retry
        assert server.get("/health").status_code == 503
    finally:
        err = server.stop()
    assert "Traceback" not in err
    assert f"warning: the token file {tmp_path / 'tokens'} can be read by other users (mode 0644)" in err


def test_a_failed_or_stale_snapshot_makes_health_degraded(tmp_path, monkeypatch):
    from bayes_safe.online import serve as served

    service = served.Service(_state(tmp_path / "state"))
    try:
        assert service.health(snapshot_every=60)["status"] == "ok"
        service.decide(json.dumps({"features": EYE, "baseline": 0}).encode())

        def full(*_):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(service.decider, "save", full)
        with pytest.raises(OSError):
            service.snapshot()
        health = service.health(snapshot_every=60)
        assert health["status"] == "degraded"
        assert health["problems"] == ["snapshot: the last snapshot failed (OSError: [Errno 28] No space left "
                                      + "on device)"]
        monkeypatch.undo()
        service._changed_since = time.time() - 200  # changes waiting for 200 s, snapshots every 60 s
        health = service.health(snapshot_every=60, detailed=False)
        assert health["problems"] == ["snapshot: the last snapshot failed",
                                      "snapshot: changes unsaved for 200 s (snapshots every 60 s)"]
        assert service.snapshot() and service.health(snapshot_every=60)["status"] == "ok"
    finally:
        service.close()


def test_the_fastapi_routes_apply_the_same_gate(tmp_path):
    """``serve(fast=False)`` answers every path through FastAPI: the same checks, through the middleware."""
    import asyncio

    from bayes_safe.online.auth import load_tokens
    from bayes_safe.online.serve import Gate, Service, create_app

    service = Service(_state(tmp_path / "state"))
    gate = Gate(load_tokens(_token_file(tmp_path / "tokens")), allowed_hosts=["testserver"], max_body_bytes=4096,
                max_candidates=5)
    try:
        asyncio.run(_through_fastapi(create_app(service, None, gate=gate)))
    finally:
        service.close()


async def _through_fastapi(app):
    decide = {"authorization": f"Bearer {TOKENS['decide']}"}
    body = {"features": EYE, "baseline": 0}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
        assert (await client.post("/decide", json=body)).status_code == 401
        r = await client.post("/decide", json=body, headers={"authorization": f"Bearer {TOKENS['read']}"})
        assert r.status_code == 403
        assert (await client.post("/decide", json=body, headers=decide)).status_code == 200
        r = await client.post("/decide", content=b"{}", headers=decide | {"content-type": "text/plain"})
        assert r.status_code == 415
        assert (await client.get("/health", headers={"host": "attacker.example"})).status_code == 421
        assert (await client.get("/health", headers={"origin": "https://attacker.example"})).status_code == 403
        r = await client.post("/decide", json={"features": [[0.0] * 3] * 400, "baseline": 0}, headers=decide)
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]
        r = await client.post("/decide", json={"features": [[0.0] * 3] * 6, "baseline": 0}, headers=decide)
        assert r.status_code == 413 and r.json()["detail"].startswith("features: 6 candidates")
        assert (await client.get("/health")).json() == {"status": "ok"}
        assert (await client.get("/posterior", headers=decide)).status_code == 403


def test_a_host_with_a_userinfo_or_a_bad_port_names_no_allowed_host(secured):
    """``127.0.0.1:PORT@attacker.example`` is not 127.0.0.1 (issue 40): only a numeric port is dropped."""
    for host in (f"127.0.0.1:{secured.port}@attacker.example", "localhost:80x", "[::1]:x", "[::1]@evil"):
        r = secured.get("/health", host=host)
        assert r.status_code == 421, (host, r.status_code)
    assert secured.get("/health", host=f"[::1]:{secured.port}").status_code == 200


def test_an_origin_with_its_default_port_is_the_same_origin():
    """``https://app.example:443`` is the origin ``https://app.example`` names (RFC 6454): served, as is
    the reverse; another port or scheme is not (issue 40)."""
    from bayes_safe.online.serve import Gate

    def scope(origin):
        return {"method": "GET", "path": "/health", "headers": [(b"host", b"127.0.0.1"), (b"origin", origin.encode())]}

    gate = Gate(allowed_origins=("https://app.example", "http://intra.example:80"))
    for ok in ("https://app.example", "https://app.example:443", "HTTPS://App.Example:443/", "http://intra.example"):
        assert gate.refusal(scope(ok)) is None, ok
    for bad in ("https://app.example:8443", "http://app.example", "https://app.example.evil", "http://intra.example:8080"):
        refused = gate.refusal(scope(bad))
        assert refused is not None and refused.status == 403, bad


def test_a_postgresql_log_error_reaches_a_client_without_the_database_address():
    """A PostgreSQL log's errors name its user, host, port and database: the client's 503 names the
    kind of failure only; a SQLite log's (a full disk) is told whole (issue 40)."""
    import sqlite3

    from bayes_safe.online.log import LogUnavailable
    from bayes_safe.online.serve import client_log_error

    url = "postgresql://alice@db.internal:5433/decisions"
    text = client_log_error(LogUnavailable(f"log: {url}: the PostgreSQL server is unavailable (connection to "
                                           'server at "db.internal", port 5433 failed)'))
    assert text.startswith("LogUnavailable: ") and "alice" not in text and "db.internal" not in text and "5433" not in text
    assert client_log_error(sqlite3.OperationalError("database or disk is full")) == \
        "OperationalError: database or disk is full"
