"""Wall time of the full linear-bandit studies (the issue's speed targets).

    python benchmarks/linear_studies.py            # both full studies: ~10 + ~5 minutes on an idle 2-core machine
    python benchmarks/linear_studies.py --quick    # their --quick versions (smoke; target 2 minutes each)

* ``ts-asc-synthetic``: 1,000 realisations, three policies, four alphas, T = 10,000
  (plus the study's sensitivity and baseline-rank runs); target 15 minutes.
* ``clucb-synthetic``: 20 realisations, LUCB and CLUCB at three alphas, T = 70,000; target 10 minutes.

Each study runs once (they are minutes long) in a fresh temporary directory. Besides the wall
time the table reports the process CPU time: on a shared machine the wall time includes
waiting for a core, the CPU time does not. ``run(quick)`` returns the rows for
``benchmarks/run.py``; ``ratio`` is target / wall time (> 1: within target).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

#: study name -> target wall seconds of the full run
TARGETS = {"ts-asc-synthetic": 15 * 60, "clucb-synthetic": 10 * 60}
QUICK_TARGET = 120


def time_study(name: str, quick: bool, seed: int = 0) -> dict:
    """Run study ``name`` once into a temporary directory; wall and CPU seconds."""
    from bayes_safe.studies import get_study

    module = get_study(name)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        module.run(Path(tmp) / "out", quick=quick, seed=seed)
        return {"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0}


def run(quick: bool = False) -> list[dict]:
    rows = []
    for name, full_target in TARGETS.items():
        target = QUICK_TARGET if quick else full_target
        t = time_study(name, quick)
        label = f"study {name}{' --quick' if quick else ' (full)'}"
        rows.append({"benchmark": f"{label}: wall", "value": t["wall"], "unit": "s", "target": f"<= {target:,} s",
                     "ratio": target / t["wall"]})
        rows.append({"benchmark": f"{label}: CPU", "value": t["cpu"], "unit": "s", "target": "", "ratio": None})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="time the --quick versions")
    args = parser.parse_args(argv)
    from run import print_table

    print_table(run(quick=args.quick), headers=("benchmark", "value", "unit", "target", "ratio"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
