"""Start-up time of the ``bayes-safe`` command line: whole processes, from exec to exit.

Timed: ``bayes-safe --help``, ``bayes-safe study list`` and ``bayes-safe tune --help``; target:
each under 1 s (building the parser imports no torch, Ax or gpytorch). Measured in the same run
as references: ``python -c pass`` (the interpreter alone) and ``python -c "import torch"`` (what
the command line no longer pays before doing anything).

Each command runs ``--runs`` times (default 10, ``--quick`` 3) after one untimed warm-up run;
the runs are interleaved (round after round of every command, the order rotated each round) so
that a change of machine load hits every command alike. Reported per command: median, min and
max wall seconds, the median over the ``python -c pass`` median (``vs_python``), and for the
command line the target and its ratio (target over median, > 1 meets it). The load average
at the start and at the end is a row of its own.

Run: ``.venv/bin/python benchmarks/cli_startup.py [--quick] [--runs N]``; ``run(quick)``
returns the rows for ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET_SECONDS = 1.0
HEADERS = ("benchmark", "value", "unit", "min", "max", "vs_python", "target", "ratio")


def _commands() -> dict[str, list[str]]:
    python = sys.executable
    script = str(Path(python).with_name("bayes-safe"))
    if not Path(script).exists():  # not a venv with the console script: the module does the same
        script_cmd = [python, "-m", "bayes_safe.cli"]
    else:
        script_cmd = [script]
    return {
        "python -c pass (reference)": [python, "-c", "pass"],
        "python -c 'import torch' (avoided)": [python, "-c", "import torch"],
        "bayes-safe --help": [*script_cmd, "--help"],
        "bayes-safe study list": [*script_cmd, "study", "list"],
        "bayes-safe tune --help": [*script_cmd, "tune", "--help"],
    }


def _time(cmd: list[str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=HERE.parent)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {out.returncode}: {out.stderr.strip()}")
    return seconds


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def run(quick: bool = False, runs: int | None = None) -> list[dict]:
    runs = runs or (3 if quick else 10)
    commands = _commands()
    load_start = _load()
    for cmd in commands.values():  # warm-up: page cache, .pyc files
        _time(cmd)
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(_time(commands[name]))
    reference = statistics.median(times[names[0]])
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        is_cli = name.startswith("bayes-safe")
        rows.append({
            "benchmark": f"cli startup: {name}, median of {runs}", "value": median, "unit": "s",
            "min": min(values), "max": max(values), "vs_python": median / reference,
            "target": f"< {TARGET_SECONDS:g} s" if is_cli else "", "ratio": TARGET_SECONDS / median if is_cli else None,
        })
    rows.append({"benchmark": f"cli startup: load average 1/5/15 min, start -> end ({os.cpu_count()} cores)",
                 "value": f"{load_start} -> {_load()}", "unit": ""})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 runs of each command instead of 10")
    parser.add_argument("--runs", type=int, default=None, help="timed runs of each command")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from run import print_table

    print_table(run(quick=args.quick, runs=args.runs), headers=HEADERS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
