"""``bayes-safe serve`` as a real subprocess on 127.0.0.1, for the tests that talk to it over HTTP.

    from serving import ServeProcess

    server = ServeProcess(state_dir, "--log", url, stderr=tmp_path / "serve.err")
    server.client.post("/decide", json={...})      # an httpx.Client on the server's address
    code, err = server.kill()                      # SIGKILL (or another signal), then its stderr
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


class ServeProcess:
    """``python -m bayes_safe.cli serve STATE --port 0 --snapshot-every 3600 ARGS...``; the address
    read from its first line. Its stderr goes to a file (``stderr``; a pipe nobody reads would
    fill and block the server), ``tests/`` is on its import path (problem modules of the tests)."""

    def __init__(self, state: Path, *args: str, stderr: Path, snapshot_every: float = 3600):
        self.stderr = Path(stderr)
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bayes_safe.cli", "serve", str(state), "--port", "0",
                 "--snapshot-every", str(snapshot_every), *map(str, args)],
                stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])))
        self.first_line = self.proc.stdout.readline()
        match = re.search(r"listening on (http://\S+)", self.first_line)
        if not match:
            self.proc.kill()
            self.proc.communicate(timeout=60)
            raise AssertionError(f"the server did not start: {self.first_line!r} {self.stderr.read_text()}")
        self.url = match.group(1)
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def kill(self, sig=signal.SIGKILL) -> tuple[int, str]:
        """Send ``sig`` (SIGKILL: no shutdown snapshot) and wait: ``(exit status, stderr)``."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.communicate(timeout=60)
        return self.proc.returncode, self.stderr.read_text()


def metric_samples(text: str) -> dict:
    """A ``/metrics`` page as ``{(sample name, sorted label items): value}`` (Prometheus's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}
