"""A real ``bayes-safe tune`` process for the crash, signal and own-problem tests: start it with
its output collected by a thread, and wait until it reports a number of completed trials."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_tune(args: list[str], *, cwd: Path = ROOT, env: dict | None = None) -> tuple[subprocess.Popen, list[str]]:
    """``python -m bayes_safe.cli tune *args`` in its own session; returns the process (``proc.reader``:
    the thread collecting its output) and its live output lines."""
    proc = subprocess.Popen([sys.executable, "-m", "bayes_safe.cli", "tune", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=cwd, env=env)
    lines: list[str] = []
    proc.reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    proc.reader.start()  # join it after the process ended to have every line
    return proc, lines


def wait_for_trials(proc: subprocess.Popen, lines: list[str], count: int, timeout: float = 150) -> None:
    """Block until ``count`` trials are reported completed; fail if the process ends or time runs out."""
    deadline = time.monotonic() + timeout
    while sum("] trial " in line for line in lines) < count:
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, f"{count} trial(s) did not complete in time:\n" + "".join(lines)
        time.sleep(0.05)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The one stderr line of a command-line refusal (exit status 2, no traceback), holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def check_reruns(study, interrupted, status: dict, observed: dict) -> None:
    """After ``tune resume``: each trial a kill interrupted is either completed or abandoned (never
    modelled) and run again exactly once, as a new trial with the same parameters."""
    for i in interrupted:
        assert status[i] in ("ABANDONED", "COMPLETED")
        if status[i] == "ABANDONED":
            assert i not in observed
            rerun = [t for t in study.experiment.trials.values() if t.run_metadata.get("rerun_of") == i]
            assert len(rerun) == 1 and rerun[0].status.name == "COMPLETED"
            assert dict(rerun[0].arm.parameters) == dict(study.experiment.trials[i].arm.parameters)
