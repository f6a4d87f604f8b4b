"""The ``bayes-safe`` command line.

    bayes-safe simulate --problem daulton2019 --policy ts --replications 100 --horizon 2000 --seed 0 --out DIR
    bayes-safe diagnose DIR
    bayes-safe study list | run NAME --out DIR
    bayes-safe tune ...            (bayes_safe.tuning.cli)

Building the parser imports nothing heavy (no torch, no Ax): ``bayes-safe --help`` and
``bayes-safe study list`` take a fraction of a second. The names the parser offers are light
copies of the registries (``PROBLEM_NAMES``, ``POLICY_NAMES``; tests/test_cli_startup.py checks
that they equal ``bayes_safe.envs.PROBLEMS`` and ``bayes_safe.factory.POLICIES``); each
subcommand imports what it runs. Argument types shared with ``tune`` live in
``bayes_safe._cli_args``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ._cli_args import existing_dir, output_dir, positive_int, probability_below_one
from ._extras import MissingExtraError

__all__ = ["POLICY_NAMES", "PROBLEM_NAMES", "main"]

#: the names of ``bayes_safe.envs.PROBLEMS`` (sorted), without importing torch
PROBLEM_NAMES = ("daulton2019", "kazerouni2017", "kazerouni2017-neurips")
#: ``bayes_safe.factory.POLICIES``, without importing torch
POLICY_NAMES = ("ts", "ts-asc", "linucb", "greedy", "random", "lucb", "clucb", "clucb2-asc-c", "clucb2-asc-i")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bayes-safe", description="Safe decision-making with Bayesian posteriors.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run a policy on a simulated problem and write its trace")
    sim.add_argument("--problem", required=True, choices=PROBLEM_NAMES, help="problem name")
    sim.add_argument("--policy", required=True, choices=POLICY_NAMES, help="policy name")
    sim.add_argument("--replications", type=positive_int, default=100)
    sim.add_argument("--horizon", type=positive_int, default=2000)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--alpha", type=probability_below_one, default=None,
                     help="constraint level in [0, 1) (problems with constraints)")
    sim.add_argument("--ridge", type=float, default=1.0, help="ridge penalty of the Bayesian linear models")
    sim.add_argument("--out", required=True, type=output_dir, help="output directory")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    diag = sub.add_parser("diagnose", help="posterior diagnostics of a run's saved models")
    diag.add_argument("run_dir", type=existing_dir, help="a directory written by `simulate` or a study")
    diag.add_argument("--draws", type=positive_int, default=500, help="exact draws per conjugate model")
    diag.add_argument("--allow-imports", action="store_true",
                      help="import the custom prior functions the saved models name (module:function); "
                           "only for runs whose code you trust")

    study = sub.add_parser("study", help="reproductions of the papers' experiments")
    study_sub = study.add_subparsers(dest="study_command", required=True)
    study_sub.add_parser("list", help="list the available studies")
    run = study_sub.add_parser("run", help="run a study")
    run.add_argument("name", help="study name (see `bayes-safe study list`)")
    run.add_argument("--out", required=True, type=output_dir, help="output directory")
    run.add_argument("--quick", action="store_true", help="a small version for smoke tests (< 2 minutes)")
    run.add_argument("--seed", type=int, default=0)

    try:
        from bayes_safe.tuning.cli import add_tune_parser
    except MissingExtraError as exc:  # a core install: `tune` says which extra to install
        # no options of its own (prefix "+"): whatever follows, `--help` included, ends in that message
        tune = sub.add_parser("tune", add_help=False, prefix_chars="+",
                              help="tune alpha and reward offsets with Ax/BoTorch (needs pip install 'bayes-safe[tune]')")
        tune.add_argument("arguments", nargs="*")
        tune.set_defaults(missing_extra=str(exc))
    else:
        add_tune_parser(sub)
    return parser


def _simulate(args) -> int:
    from . import plots
    from .diagnostics import save_models
    from .envs import make_problem
    from .factory import make_policy
    from .io import atomic_output_dir, atomic_write_json
    from .metrics import mean_and_sem, summary
    from .simulation import simulate

    kwargs = {"replications": args.replications, "seed": args.seed}
    if args.alpha is not None and args.problem == "daulton2019":
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
            if getattr(args, "missing_extra", None):
                raise MissingExtraError(args.missing_extra)
            from bayes_safe.tuning.cli import run_tune

            return run_tune(args)
        if args.command == "diagnose":
            from .diagnostics import diagnose_run

            report = diagnose_run(args.run_dir, num_draws=args.draws, allow_imports=args.allow_imports)
            print(f"wrote {report} and one NetCDF per model")
            return 0
    except (ValueError, TypeError, FileNotFoundError, MissingExtraError) as exc:
        parser.exit(2, f"bayes-safe {args.command}: error: {exc}\n")
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
