"""No request can stall the event loop (issue 40, item 2).

The audit: the JSON depth pre-scan took the strings out with a backtracking regex, quadratic in
an unterminated string of escaped quotes (``'[' * 33 + '"' + '\\"' * n``: 10.5 s at 32 KB, on the
event loop, ``/health`` waiting meanwhile); and nothing bounded a body that stalls (no read
timeout, no cap on the bytes held by bodies being read).

The checks run against a real server (``bayes-safe serve`` on 127.0.0.1, port 0, as the other
serve tests) while a second client polls ``/health``; timings are generous for the shared 2-core
machine the tests run on (the figures measured are in docs/security.md).
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import ROOT, _state

from bayes_safe.online.serve import MAX_DEPTH, BadRequest, _check_depth

MIB = 1 << 20


def _adversarial(size: int = MIB) -> bytes:
    """The audit's body: 33 opening brackets, then an unterminated string of escaped quotes."""
    head = b"[" * (MAX_DEPTH + 1) + b'"'
    return head + b'\\"' * ((size - len(head)) // 2)


# ---------------------------------------------------------------------------------- the depth scan
def _depth_reference(text: bytes) -> tuple[int, list[int]]:
    """The deepest nesting of ``text`` and the positions of its brackets outside strings: one pass,
    byte by byte, a string state with its escapes."""
    depth = deepest = 0
    in_string = escaped = False
    brackets = []
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:  # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            brackets.append(i)
        elif c in b"]}":
            depth -= 1
            brackets.append(i)
    return deepest, brackets


def _too_deep(text: bytes, limit: int = MAX_DEPTH) -> bool:
    try:
        _check_depth(text, limit)
    except BadRequest as exc:
        assert str(exc) == f"body: JSON nested deeper than {limit} levels"
        return True
    return False


def test_the_depth_scan_is_linear_on_the_audit_body():
    """1 MiB of the audit's body is refused in well under 0.5 s (the old scan: hours). Timed in a
    child process, so that a quadratic scan fails the test instead of holding it."""
    code = ("import time, sys; from bayes_safe.online.serve import _check_depth, BadRequest, MAX_DEPTH\n"
            "head = b'[' * (MAX_DEPTH + 1) + b'\"'; body = head + b'\\\\\"' * ((SIZE - len(head)) // 2)\n"
            "best = 1e9\n"
            "for _ in range(3):\n"
            "    t = time.perf_counter()\n"
            "    try:\n"
            "        _check_depth(body)\n"
            "    except BadRequest as exc:\n"
            "        refused = str(exc)\n"
            "    best = min(best, time.perf_counter() - t)\n"
            "print(len(body), best, refused)\n").replace("SIZE", str(MIB))
    try:
        out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                             timeout=30, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    except subprocess.TimeoutExpired:
        pytest.fail("the depth scan of 1 MiB took more than 30 s")
    assert out.returncode == 0, out.stderr
    size, seconds, refused = out.stdout.split(" ", 2)
    assert int(size) >= MIB - 2 and refused.strip() == f"body: JSON nested deeper than {MAX_DEPTH} levels"
    assert float(seconds) < 0.5, out.stdout


@pytest.mark.parametrize("size", [4096, 16 * 1024, 64 * 1024])
def test_the_depth_scan_costs_linear_time_whatever_the_strings_hold(size):
    """Bodies of other nasty shapes (runs of backslashes, unterminated strings, brackets in strings,
    many strings) cost no more per byte than plain numbers."""
    shapes = [_adversarial(size),
              b"[" * 40 + b'"' + b"\\" * size,                       # a run of backslashes, unterminated
              b"[" * 40 + b'"\\\\"' * (size // 4),                   # escaped backslashes closing strings
              b"[" * 40 + b'"' + b"[{" * (size // 2),                 # brackets in an unterminated string
              b"[" * 40 + b'"a",' * (size // 4),                      # many short strings
              b"[1," * (size // 3)]                                   # brackets and numbers only
    for body in shapes:
        t = time.perf_counter()
        _too_deep(body)
        assert time.perf_counter() - t < 0.5 * max(size / MIB, 0.05), (body[:60], time.perf_counter() - t)


def _nested(rng: random.Random, depth: int):
    """A JSON value nested ``depth`` levels at its deepest, with strings full of the scan's traps."""
    alphabet = ['"', "\\", "[", "]", "{", "}", "a", " ", "\n", "\u00e9", "\\\\", '\\"']
    if depth == 0:
        return rng.choice([1.5, -2, None, True, "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))])
    inner = [_nested(rng, rng.randrange(depth)) for _ in range(rng.randrange(3))] + [_nested(rng, depth - 1)]
    rng.shuffle(inner)
    if rng.random() < 0.5:
        return inner
    return {"".join(rng.choice(alphabet) for _ in range(rng.randrange(5))) + str(i): v for i, v in enumerate(inner)}


def test_the_depth_scan_agrees_with_a_byte_by_byte_scan():
    """On JSON whose strings hold quotes, backslashes and brackets (escaped by json.dumps), the scan
    refuses exactly the texts nested deeper than the limit, at every limit around the depth; and so
    on the same texts cut after a bracket and ended as the audit's body is (an unterminated string
    of 4,096 escaped quotes), each checked in under 50 ms (the old scan: about 0.5 s each)."""
    rng = random.Random(40)
    for trial in range(300):
        depth = rng.randrange(1, 12)
        text = json.dumps(_nested(rng, depth), ensure_ascii=rng.random() < 0.5).encode()
        deepest, brackets = _depth_reference(text)
        assert deepest == depth
        for limit in (deepest - 1, deepest, deepest + 1):
            if limit >= 0:
                assert _too_deep(text, limit) == (deepest > limit), (trial, limit, text)
        if trial % 10 == 0:
            cut = text[:rng.choice(brackets) + 1] + b'"' + b'\\"' * 4096
            deepest = _depth_reference(cut)[0]
            for limit in (deepest - 1, deepest):
                t = time.perf_counter()
                assert _too_deep(cut, limit) == (deepest > limit), (trial, limit, cut[:200])
                assert time.perf_counter() - t < 0.05


# ---------------------------------------------------------------------------------- a real server
class _Poller:
    """A second client that asks for ``/health`` over and over on its own connection, keeping the
    time each answer took."""

    def __init__(self, url: str):
        self.url, self.times, self.errors = url, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    r = client.get("/health")
                    assert r.status_code == 200, r.text
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(repr(exc))
                self.times.append(time.perf_counter() - t)
                time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)


def _post_raw(address: tuple, body: bytes, timeout: float = 30.0) -> tuple[int, dict, float]:
    """POST ``body`` to /decide on a new connection: ``(status, answer, seconds)``."""
    head = (b"POST /decide HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    t = time.perf_counter()
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(head + body)
        data = _read_answer(sock)
    seconds = time.perf_counter() - t
    headers, _, content = data.partition(b"\r\n\r\n")
    return int(headers.split()[1]), json.loads(content), seconds


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        match = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
        if sep and match and len(body) >= int(match.group(1)):
            return data


class _Server:
    """``serve(STATE, port=0, **options)`` in a child process (options the command line may not
    have: ``read_timeout``, ``max_bytes_in_flight``); the address from its first line."""

    def __init__(self, tmp: Path, **options):
        state = _state(tmp / "state")
        options = {"port": 0, "snapshot_every": 3600, "log": str(tmp / "log.sqlite")} | options
        code = (f"import sys; from bayes_safe.online.serve import serve; "
                f"sys.exit(serve({str(state)!r}, **{options!r}))")
        self.stderr = tmp / "serve.err"
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True,
                                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        line = self.proc.stdout.readline()
        match = re.search(r"listening on http://(\S+):(\d+)", line)
        if not match:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {line!r} {self.stderr.read_text()}")
        self.address = (match.group(1), int(match.group(2)))
        self.url = f"http://{match.group(1)}:{match.group(2)}"

    def rss(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)
        return self.stderr.read_text()


READ_TIMEOUT = 1.0
CAP = 2560 * 1024
CONNECTIONS = 40
KEEP_ALIVE = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for every test here: a short read timeout, a cap of 2.5 MiB on the bytes of the
    bodies being read, 40 connections, connections idle 1 s after an answer closed."""
    s = _Server(tmp_path_factory.mktemp("stall"), read_timeout=READ_TIMEOUT, max_bytes_in_flight=CAP,
                limit_concurrency=CONNECTIONS, timeout_keep_alive=KEEP_ALIVE)
    yield s
    s.stop()


def test_the_audit_body_does_not_stall_health(server):
    """The audit's body at 1 MiB, sent to a real server while a second client polls /health: the
    body is refused (422, too deep) within 0.5 s, and no /health answer waits 0.2 s."""
    with httpx.Client(base_url=server.url, timeout=30) as client:  # warm: the first requests import things
        assert client.get("/health").status_code == 200
    with _Poller(server.url) as poller:
        time.sleep(0.2)
        answers = []
        for _ in range(3):
            try:
                answers.append(_post_raw(server.address, _adversarial(MIB), timeout=10))
            except TimeoutError:
                pytest.fail("the server did not answer the audit's body within 10 s")
        time.sleep(0.2)
    for status, answer, seconds in answers:
        assert status == 422 and answer["detail"] == f"body: JSON nested deeper than {MAX_DEPTH} levels", answer
        assert seconds < 0.5, [a[2] for a in answers]
    assert not poller.errors, poller.errors[:3]
    assert len(poller.times) > 10 and max(poller.times) < 0.2, sorted(poller.times)[-5:]


def _large_bodies() -> list[tuple[str, bytes, int]]:
    """Valid JSON near the body limit whose parsing, checking and running cost tens of ms or more."""
    items = [{"decision_id": f"{i:032x}", "reward": 0.5, "constraints": [1.0]} for i in range(10_000)]
    candidates = [[random.Random(i).gauss(0, 1) for _ in range(3)] for i in range(1000)]
    return [("/feedback", json.dumps(items).encode(), 422),                    # 10,000 unknown ids, all named
            ("/decide", json.dumps({"features": candidates, "baseline": 0}).encode(), 200),
            ("/decide", b'{"features": [[' + b"1.0," * 250_000 + b'1.0]], "baseline": 0}', 422)]


def test_large_bodies_are_parsed_and_run_off_the_event_loop(server):
    """A MiB of JSON (a list of 10,000 feedback items, a thousand candidates, a row of 250,000
    numbers) is parsed, checked and run on a thread: /health keeps answering meanwhile."""
    bodies = _large_bodies()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body, status in bodies:  # warm
            assert client.post(path, content=body, headers={"content-type": "application/json"}).status_code == status
        with _Poller(server.url) as poller:
            seconds = []
            for _ in range(3):
                for path, body, status in bodies:
                    t = time.perf_counter()
                    r = client.post(path, content=body, headers={"content-type": "application/json"})
                    seconds.append(time.perf_counter() - t)
                    assert r.status_code == status, r.text[:200]
    assert not poller.errors, poller.errors[:3]
    print(f"large bodies: {[round(s * 1e3) for s in seconds]} ms; /health: {len(poller.times)} answers, "
          f"median {sorted(poller.times)[len(poller.times) // 2] * 1e3:.1f} ms, max {max(poller.times) * 1e3:.1f} ms")
    assert len(poller.times) > 10 and max(poller.times) < 0.2, sorted(poller.times)[-5:]


# ---------------------------------------------------------------------------------- stalled bodies
def _stall(address: tuple, head: bytes, part: bytes) -> socket.socket:
    """A connection that sent ``head`` and ``part`` of a body and then nothing more."""
    sock = socket.create_connection(address, timeout=30)
    sock.sendall(head + part)
    return sock


def _answer_of(sock: socket.socket) -> tuple[int, dict, bytes, float]:
    """The status, JSON body and headers of the answer on ``sock``, and the seconds until the server
    closed the connection after it (``recv`` returned nothing)."""
    data = _read_answer(sock)
    t = time.perf_counter()
    rest = sock.recv(65536)
    closed = time.perf_counter() - t
    assert rest == b"", rest[:100]
    head, _, content = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(content), head.lower(), closed


def _head(length: int | None = None) -> bytes:
    framing = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return (b"POST /decide HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + framing
            + b"\r\n\r\n")


@pytest.mark.parametrize("head, part", [(_head(100_000), b'{"features": [[1.0, 0.0'),    # a body that stops
                                        (_head(100_000), b""),                              # headers, no body
                                        (_head(), b"FFFFFFFFFFFF\r\n" + b"[" * 100)],       # a chunk never done
                         ids=["partial", "nothing", "huge-chunk"])
def test_a_stalled_body_is_a_408_and_closed_after_the_read_timeout(server, head, part):
    t = time.perf_counter()
    with _stall(server.address, head, part) as sock:
        status, answer, headers, closed = _answer_of(sock)
    seconds = time.perf_counter() - t
    assert status == 408 and answer["detail"].startswith(f"body: not received within {READ_TIMEOUT:g} s"), answer
    assert b"connection: close" in headers and closed < 1.0
    assert READ_TIMEOUT - 0.05 < seconds < READ_TIMEOUT + 2.0, seconds
    with httpx.Client(base_url=server.url, timeout=30) as client:  # the service goes on
        assert client.get("/health").status_code == 200


def test_stalled_clients_hold_no_more_than_the_cap(server):
    """Thirty clients each send 100 KiB of a 200 KiB body and stall, with a cap of 2.5 MiB: the bodies
    being read never hold more than the cap: the clients whose bytes would pass it are refused
    (503, Retry-After, closed) at once, the others get their 408 at the read timeout; then the
    cap is free again (a full body goes through)."""
    t = time.perf_counter()
    socks = [_stall(server.address, _head(200 * 1024), b" " * (100 * 1024)) for _ in range(30)]

    def answer(sock):
        try:
            status, answer, headers, _ = _answer_of(sock)
        except ConnectionResetError:  # refused while part of its bytes were still unread: the reset may win
            return "reset", None, None, time.perf_counter() - t
        return status, answer, headers, time.perf_counter() - t

    try:
        with ThreadPoolExecutor(len(socks)) as pool:  # each answer timed as it comes
            answers = list(pool.map(answer, socks))
    finally:
        for sock in socks:
            sock.close()
    refused = [a for a in answers if a[0] == 503]
    reset = [a for a in answers if a[0] == "reset"]
    timed_out = [a for a in answers if a[0] == 408]
    assert len(refused) + len(reset) + len(timed_out) == 30 and refused, [a[:2] for a in answers]
    assert all(seconds < READ_TIMEOUT for *_, seconds in reset), reset
    # 100 KiB each: at most 25 fit in 2560 KiB (fewer when chunks of two bodies interleave near the cap)
    assert 20 <= len(timed_out) <= 25 and len(timed_out) * 100 * 1024 <= CAP, [a[0] for a in answers]
    for status, answer, headers, seconds in refused:
        assert answer["detail"].startswith("busy: the bodies being read hold") and b"retry-after: 1" in headers
        assert f"the limit is {CAP}" in answer["detail"]
        assert seconds < READ_TIMEOUT, seconds  # refused at once, not at the timeout
    for status, answer, headers, seconds in timed_out:
        assert answer["detail"].startswith(f"body: not received within {READ_TIMEOUT:g} s")
        assert READ_TIMEOUT - 0.05 < seconds < READ_TIMEOUT + 2.0
    body = json.dumps({"features": [[0.1, 0.2, 0.3]] * 3, "baseline": 0}).encode()
    body += b" " * (200 * 1024 - len(body))
    status, answer, _ = _post_raw(server.address, body)
    assert status == 200 and "decision_id" in answer, answer


def test_uvicorn_closes_idle_connections_and_caps_them(server):
    """``timeout_keep_alive``: a connection idle after its answer is closed (1 s here; uvicorn's
    default is 5 s); ``limit_concurrency``: past that many connections a request is a 503."""
    with socket.create_connection(server.address, timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")
        t = time.perf_counter()
        assert sock.recv(65536) == b""
        assert KEEP_ALIVE - 0.05 < time.perf_counter() - t < KEEP_ALIVE + 2.0
    def status() -> int:
        with socket.create_connection(server.address, timeout=30) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return int(_read_answer(sock).split()[1])

    idle = []
    try:
        assert status() == 200
        # CONNECTIONS idle connections at once (the header deadline closes them after READ_TIMEOUT)
        idle = [socket.create_connection(server.address, timeout=30) for _ in range(CONNECTIONS)]
        assert status() == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    with httpx.Client(base_url=server.url, timeout=30) as client:  # the connections gone, the service answers
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["nothing", "trickle"])
def test_headers_not_complete_within_the_read_timeout_close_the_connection(server, sent):
    """uvicorn's keep-alive timer restarts at every byte: a client that sent nothing, or trickles its
    headers one byte every 0.2 s, held a connection for ever. The header deadline closes it
    READ_TIMEOUT after it opened; a kept-alive connection's next request has its own deadline."""
    t = time.perf_counter()
    with socket.create_connection(server.address, timeout=30) as sock:
        sock.sendall(sent)
        closed = False
        while time.perf_counter() - t < READ_TIMEOUT + 5:
            try:
                if sent:
                    sock.sendall(b"X")  # one more byte of a header line that never ends
                ready = sock.recv(65536) if not sent else None
                if ready == b"":
                    closed = True
                    break
                if sent:
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
    seconds = time.perf_counter() - t
    assert closed and READ_TIMEOUT - 0.05 < seconds < READ_TIMEOUT + 2.5, seconds
    with socket.create_connection(server.address, timeout=30) as sock:  # complete requests are unaffected:
        for _ in range(2):  # two on one kept-alive connection, the second after half the deadline
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _read_answer(sock).startswith(b"HTTP/1.1 200")
            time.sleep(READ_TIMEOUT / 2)


def test_the_new_limits_are_checked_when_the_service_starts():
    from bayes_safe.online.serve import Gate

    for bad in (0, -1.0, float("inf"), float("nan"), True, "10"):
        with pytest.raises(ValueError, match="read_timeout: expected a number of seconds > 0"):
            Gate(read_timeout=bad)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes_in_flight: expected a positive integer"):
            Gate(max_bytes_in_flight=bad)
    gate = Gate(read_timeout=2, max_bytes_in_flight=1000)
    assert (gate.read_timeout, gate.max_bytes_in_flight, gate.bytes_in_flight) == (2.0, 1000, 0)


def test_the_command_lines_defaults_are_the_services():
    """``bayes-safe serve``'s parser writes the service's defaults as literals (it imports nothing heavy):
    they must stay the constants ``serve()`` uses."""
    from bayes_safe import cli
    from bayes_safe.online import serve as service

    args = cli._build_parser().parse_args(["serve", "."])
    assert args.read_timeout == service.READ_TIMEOUT
    assert args.max_bytes_in_flight == service.MAX_BYTES_IN_FLIGHT
    assert args.limit_concurrency == service.LIMIT_CONCURRENCY
    assert args.timeout_keep_alive == service.TIMEOUT_KEEP_ALIVE
