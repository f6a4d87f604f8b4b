"""Benchmark of the tuning loop (issue 5): a whole Ax/BoTorch study whose trials are A/B tests.

Full: a 30-trial study of the video-upload problem with A/B tests of 20,000 uploads per arm
(TS-ASC, vanilla TS and the baseline on the same uploads, 4 batches with ProbitGP refits), two
trials in flight in local worker processes, SQLite storage; target: under 20 minutes on the
project's 2-core machine. ``--quick``: 12 trials of the ``--quick`` A/B test (4,000 uploads).

Ax's own time per trial (generating candidates: Sobol, then fitting the GP and optimising
qLogNoisyExpectedImprovement; completing trials and saving them to SQLite) is reported
separately from the simulation time per trial (measured inside the worker process).

Run: ``.venv/bin/python benchmarks/tuning.py [--quick]``; ``run(quick)`` returns the rows for
``benchmarks/run.py``.

``--calibration [video-upload|logged-data]`` (issue 18): does a trial's SEM cover the noise of
re-running it? 8 parameterizations drawn from the default search space, each re-run 10 times as
a trial of 4 replicates (and, from the same single runs, 40 times as a trial of one replicate);
prints the standard deviation of the replicate-pair z-scores (1 when calibrated) of the
objective and the constraint metrics. ``--reruns`` / ``--params`` / ``--replicates`` shrink it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bayes_safe.tuning import Study
from bayes_safe.tuning.cli import default_ab_test

TARGET_SECONDS = 20 * 60


def run(quick: bool = False) -> list[dict]:
    trials, parallel = (12, 2) if quick else (30, 2)
    label = f"tune video-upload, {trials} trials, {'quick' if quick else '20,000'} users/arm, {parallel} in flight"
    with tempfile.TemporaryDirectory() as tmp:
        study = Study(default_ab_test(quick=quick), storage=Path(tmp) / "study.sqlite", seed=0)
        start = time.perf_counter()
        summary = study.run(trials=trials, parallel=parallel)
        wall = time.perf_counter() - start
        gen = [t.run_metadata.get("gen_seconds", 0.0) for t in study.experiment.trials.values()]
        nodes = [t.run_metadata.get("node") for t in study.experiment.trials.values()]
    bo = [g for g, n in zip(gen, nodes) if n == "BoTorch"]
    n = max(1, summary["trials_completed"])
    rows = [
        {"benchmark": f"{label}: study wall time", "value": wall, "unit": "s",
         "target": "" if quick else f"<= {TARGET_SECONDS}", "ratio": None if quick else TARGET_SECONDS / wall},
        {"benchmark": f"{label}: Ax time per trial (generation + completion/storage)",
         "value": summary["ax_seconds_per_trial"], "unit": "s", "target": "", "ratio": None},
        {"benchmark": f"{label}: Ax generation per BoTorch trial (GP fit + qLogNEI)",
         "value": sum(bo) / len(bo) if bo else None, "unit": "s", "target": "", "ratio": None},
        {"benchmark": f"{label}: Ax completion + SQLite save per trial",
         "value": summary["ax_complete_seconds"] / n, "unit": "s", "target": "", "ratio": None},
        {"benchmark": f"{label}: simulation per trial (in the worker)",
         "value": summary["sim_seconds_per_trial"], "unit": "s", "target": "", "ratio": None},
    ]
    return rows


def calibration(problem: str = "video-upload", params: int = 8, reruns: int = 10, replicates=(1, 2, 4),
                quick: bool = False, workers: int = 2) -> dict:
    """The SEM calibration of ``bayes_safe.tuning.calibration.noise_calibration`` on a named problem."""
    from bayes_safe.tuning import ABTest, LoggedDataProblem
    from bayes_safe.tuning.calibration import noise_calibration, random_parameterizations

    if problem == "logged-data":
        ab = ABTest(LoggedDataProblem(source="synthetic", method="minimax"))
    else:
        ab = default_ab_test(problem, quick=quick)
    prob = ab.problem
    metrics = [prob.objective.lstrip("-")] + [c.split()[0] for c in prob.outcome_constraints]
    points = random_parameterizations(prob.parameters, params, seed=0)
    return noise_calibration(ab, points, reruns=reruns, replicates=replicates, metrics=metrics, seed=1, workers=workers)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--calibration", choices=("video-upload", "logged-data"), default=None)
    parser.add_argument("--params", type=int, default=8)
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--replicates", default="1,2,4")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.calibration:
        reps = tuple(int(r) for r in args.replicates.split(","))
        res = calibration(args.calibration, args.params, args.reruns, reps, args.quick, args.workers)
        print(f"{args.calibration}{' (quick)' if args.quick else ''}: {args.params} parameterizations, "
              f"{res['runs']} single A/B tests, {res['seconds_per_run']:.1f} s each")
        for R, entry in res["by_replicates"].items():
            cells = ", ".join(f"{m} {v['sd']:.2f} (n={v['n']})" for m, v in entry.items() if m != "all")
            print(f"  {R} replicate(s) per trial: SD of pair z-scores {entry['all']['sd']:.2f} overall; {cells}")
        return 0
    for row in run(quick=args.quick):
        ratio = "" if row["ratio"] is None else f"  (ratio {row['ratio']:.2f})"
        value = "n/a" if row["value"] is None else f"{row['value']:.2f}"
        print(f"{row['benchmark']}: {value} {row['unit']} {row['target']}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
