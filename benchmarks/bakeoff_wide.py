"""Per-decision speed at a few hundred features (issue 32): the bake-off's learners, one stream.

The bake-off's real data sets stop at 65 features (digits). The issue asks for the one-stream
speed "including per-arm models at d of a few hundred": this script times the bake-off's own
learner classes (``benchmarks/bakeoff.py``: the same ``act`` / ``learn`` calls, the same
conversions) on a synthetic stream of ``d`` standardised features and ``K`` actions (a linear
argmax label), interleaved, ``--repeats`` times, and prints medians with the ratio to Vowpal
Wabbit's best bake-off configuration (regcbopt) measured in the same run.

    .venv/bin/python benchmarks/bakeoff_wide.py              # d = 288, K = 4, 800 decisions x 5
    .venv/bin/python benchmarks/bakeoff_wide.py --dim 128 --actions 10
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bakeoff  # the bake-off's learner classes and registry

LEARNERS = ("bayes_safe TS", "bayes_safe TS streaming", "bayes_safe conservative TS streaming",
            "VW regcbopt", "VW epsilon")
REFERENCE = "VW regcbopt"


def stream(dim: int, actions: int, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(actions, dim)) / np.sqrt(dim)
    X = rng.normal(size=(rows, dim))
    X[:, -1] = 1.0  # the bake-off's constant column
    return X, (X @ W.T).argmax(1)


def rate(spec, X, y, warm: int, steps: int, seed: int) -> float:
    """Decisions per second of ``spec``'s learner over rows ``warm .. warm + steps``, timed by the
    bake-off's own loop (``run_stream``: the seconds of its ``act`` + ``learn`` calls)."""
    K = int(y.max()) + 1
    rows = slice(warm, warm + steps)
    stream = bakeoff.Stream("synthetic", 0, X[rows], y[rows], np.zeros(steps, dtype=np.int64), np.ones(steps), K,
                            warm, X[:warm], y[:warm])
    if spec.warm:
        learner = spec.make(X.shape[1], K, seed, warm=(stream.warm_X, stream.warm_y))
    else:
        learner = spec.make(X.shape[1], K, seed)
    _, seconds = bakeoff.run_stream(learner, stream)
    return steps / seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=288)
    parser.add_argument("--actions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dim < 2 or args.actions < 2 or args.steps < 1 or args.repeats < 1:
        parser.error("--dim and --actions: at least 2; --steps and --repeats: at least 1")
    import torch

    torch.set_num_threads(1)
    specs = bakeoff.available(list(LEARNERS))
    X, y = stream(args.dim, args.actions, 40 + args.steps, args.seed)
    load_start = bakeoff.load_average()
    rates: dict[str, list[float]] = {s.name: [] for s in specs}
    for r in range(args.repeats):  # interleaved: every learner in every repeat
        for spec in specs:
            rates[spec.name].append(rate(spec, X, y, 40, args.steps, seed=args.seed + r))
    med = {k: float(np.median(v)) for k, v in rates.items()}
    ref = med.get(REFERENCE)
    print(f"d = {args.dim}, K = {args.actions}, {args.steps} decisions x {args.repeats} repeats (medians); "
          f"load average at start {load_start}, at end {bakeoff.load_average()}")
    print()
    print(f"| learner | decisions/s | vs {REFERENCE} |")
    print("|---|---|---|")
    for name, value in med.items():
        print(f"| {name} | {value:,.0f} | {'' if ref is None else f'{value / ref:.2f}x'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
