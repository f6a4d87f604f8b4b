"""Wall time of the full BCTS warfarin study (issue 6: under 10 minutes on 2 cores).

The full study: the real IWPC table (the ``data`` extra), sigma_online in {0, 0.25, 0.5,
0.75, 1} plus the Constraint Mask, teaching by CTS and by random exploration, 50,000
teaching examples, 20,000 online steps, 5 folds; every setting runs in one batch
(``bayes_safe.experiments.run_bcts``). ``--quick`` times the study's quick configuration
against a 2-minute target instead.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

TARGET_FULL_SECONDS = 600.0
TARGET_QUICK_SECONDS = 120.0


def run(quick: bool = False) -> list[dict]:
    from bayes_safe.studies import bcts_warfarin

    target = TARGET_QUICK_SECONDS if quick else TARGET_FULL_SECONDS
    with tempfile.TemporaryDirectory(prefix="bench-bcts-") as tmp:
        start = time.perf_counter()
        payload = bcts_warfarin.run(Path(tmp) / "out", quick=quick)
        wall = time.perf_counter() - start
    cfg, sec = payload["config"], payload["seconds"]
    what = (f"BCTS warfarin study{' (quick)' if quick else ''}: {len(cfg['sigmas'])} sigmas + mask x "
            f"{len(cfg['teaching'])} teaching x {cfg['replications']} folds, N={max(cfg['num_teaching']):,}, "
            f"T={cfg['horizon']:,}")
    rows = [{"benchmark": what, "value": wall, "unit": "s", "target": f"<= {target:.0f}", "ratio": target / wall}]
    for phase in ("teaching", "online"):
        rows.append({"benchmark": f"  of which the {phase} phase", "value": sec[phase], "unit": "s", "target": "",
                     "ratio": None})
    return rows
