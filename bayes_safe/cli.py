"""The ``bayes-safe`` command line.

    bayes-safe simulate --problem daulton2019 --policy ts --replications 100 --horizon 2000 --seed 0 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _build_parser() -> argparse.ArgumentParser:
    from .envs import PROBLEMS
    from .factory import POLICIES

    parser = argparse.ArgumentParser(prog="bayes-safe", description="Safe decision-making with Bayesian posteriors.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run a policy on a simulated problem and write its trace")
    sim.add_argument("--problem", required=True, choices=sorted(PROBLEMS), help="problem name")
    sim.add_argument("--policy", required=True, choices=list(POLICIES), help="policy name")
    sim.add_argument("--replications", type=_positive_int, default=100)
    sim.add_argument("--horizon", type=_positive_int, default=2000)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--alpha", type=float, default=None, help="constraint level (problems with constraints)")
    sim.add_argument("--ridge", type=float, default=1.0, help="ridge penalty of the Bayesian linear models")
    sim.add_argument("--out", required=True, type=Path, help="output directory")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    diag = sub.add_parser("diagnose", help="posterior diagnostics of a run's saved models")
    diag.add_argument("run_dir", type=Path, help="a directory written by `simulate` or a study")
    diag.add_argument("--draws", type=_positive_int, default=500, help="exact draws per conjugate model")

    study = sub.add_parser("study", help="reproductions of the papers' experiments")
    study_sub = study.add_subparsers(dest="study_command", required=True)
    study_sub.add_parser("list", help="list the available studies")
    run = study_sub.add_parser("run", help="run a study")
    run.add_argument("name", help="study name (see `bayes-safe study list`)")
    run.add_argument("--out", required=True, type=Path, help="output directory")
    run.add_argument("--quick", action="store_true", help="a small version for smoke tests (< 2 minutes)")
    run.add_argument("--seed", type=int, default=0)
    from bayes_safe.tuning.cli import add_tune_parser

    add_tune_parser(sub)
    return parser


def _simulate(args) -> int:
    from . import plots
    from .diagnostics import save_models
    from .envs import make_problem
    from .factory import make_policy
    from .io import atomic_output_dir, atomic_write_json
    from .metrics import mean_and_sem, summary
    from .simulate import simulate

    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out: {args.out} exists and is not a directory")
    kwargs = {"replications": args.replications, "seed": args.seed}
    if args.alpha is not None:
        if not 0 <= args.alpha < 1:
            raise ValueError(f"--alpha: expected a value in [0, 1), got {args.alpha}")
        if args.problem == "daulton2019":
            kwargs["alpha"] = args.alpha
    env = make_problem(args.problem, **kwargs)
    policy = make_policy(args.policy, env, ridge=args.ridge, alpha=args.alpha)
    start = time.perf_counter()
    trace = simulate(policy, env, args.horizon, seed=args.seed + 1, progress=not args.no_progress)
    with atomic_output_dir(args.out) as tmp:
        trace.to_netcdf(tmp / "trace.nc")
        regret_mean, regret_sem = mean_and_sem(trace.regret)
        import pandas as pd

        pd.DataFrame({
            "step": range(trace.horizon), "regret_mean": regret_mean.numpy(), "regret_sem": regret_sem.numpy(),
            "cumulative_regret_mean": trace.regret.cumsum(0).mean(1).numpy(),
            "violation_rate": trace.violation.double().mean(1).numpy(),
        }).to_csv(tmp / "steps.csv", index=False)
        info = summary(trace)
        info.update({"problem": args.problem, "policy": args.policy, "seed": args.seed,
                     "wall_seconds": time.perf_counter() - start})
        atomic_write_json(tmp / "summary.json", info)
        plots.plot_regret({args.policy: trace}, tmp / "regret.png", title=f"{args.policy} on {args.problem}")
        save_models(policy, tmp / "models")
    print(json.dumps({k: info[k] for k in ("final_cumulative_regret_mean", "violation_rate", "decisions_per_second")}, indent=2))
    print(f"wrote {args.out}/trace.nc, steps.csv, summary.json, regret.png, models/")
    return 0


def _study(args) -> int:
    from bayes_safe.studies import available_studies, get_study

    if args.study_command == "list":
        for name, (_, description) in sorted(available_studies().items()):
            print(f"{name:28s} {description}")
        return 0
    module = get_study(args.name)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out: {args.out} exists and is not a directory")
    results = module.run(args.out, quick=args.quick, seed=args.seed)
    print(f"study {args.name}: wrote {args.out} ({len(results)} result entries)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "study":
            return _study(args)
        if args.command == "tune":
            from bayes_safe.tuning.cli import run_tune

            return run_tune(args)
        if args.command == "diagnose":
            from .diagnostics import diagnose_run

            report = diagnose_run(args.run_dir, num_draws=args.draws)
            print(f"wrote {report} and one NetCDF per model")
            return 0
    except (ValueError, TypeError, FileNotFoundError) as exc:
        parser.exit(2, f"bayes-safe {args.command}: error: {exc}\n")
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
