"""Run every benchmark and print one table (medians of repeated runs, ratios to targets).

    python benchmarks/run.py            # all benchmarks
    python benchmarks/run.py --quick    # fewer repeats and smaller sizes
    python benchmarks/run.py --only linear_ts
    python benchmarks/run.py --issue 42 --quick   # every target of issue 42 in one run (a few minutes)

A benchmark is a module in this folder with ``run(quick: bool) -> list[dict]``; each row has
``benchmark``, ``value``, ``unit``, ``target`` (text), ``ratio`` (value over target, > 1 is
better for rates; for times the module reports target over value) and optionally ``vs_numpy``;
any other key of a row (e.g. ``min``, ``max`` of ``cli_startup``) becomes a column after ``unit``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["cli_startup", "linear_ts", "probit_gp", "linear_studies", "acol", "bcts", "offline", "tuning", "serve", "custom_priors",
              "scaling", "single_stream", "rare_harm", "horseshoe_mixing", "sparse_logistic", "chance_speed",
              "conservative_speed", "log_propensities", "engine_costs", "delays", "gpu"]
#: the benchmarks that print an issue's targets (``--issue N``; the same as ``--only`` with these names)
ISSUES = {"42": ["sparse_logistic", "chance_speed", "conservative_speed", "single_stream", "engine_costs"],
          "45": ["delays"], "46": ["gpu"]}
HEADERS = ("benchmark", "value", "unit", "target", "ratio", "vs_numpy")


def _fmt(v) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.1:
            return f"{v:.2g}"  # an error or a small time: two significant digits, not 0.00
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help=f"subset of {BENCHMARKS}")
    parser.add_argument("--issue", choices=sorted(ISSUES), default=None,
                        help="the benchmarks of an issue's targets: " + "; ".join(f"{k}: {' '.join(v)}"
                                                                              for k, v in ISSUES.items()))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    names = args.only or (ISSUES[args.issue] if args.issue else None) or [b for b in BENCHMARKS
                                                                          if (HERE / f"{b}.py").exists()]
    rows = []
    for name in names:
        module = importlib.import_module(name)
        rows.extend(module.run(quick=args.quick))
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in HEADERS]
    print_table(rows, headers=(*HEADERS[:3], *extra, *HEADERS[3:]))
    import torch  # (here: the benchmarks import it anyway; --help does not need it)

    print(f"load average (1, 5, 15 min) at the end: {' / '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{os.cpu_count()} cores; torch {torch.__version__}")
    return 0


def print_table(rows: list[dict], headers=HEADERS) -> None:
    """Print benchmark rows as an aligned text table."""
    table = [[_fmt(r.get(h)) for h in headers] for r in rows]
    widths = [max([len(h), *(len(row[i]) for row in table)]) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    sys.exit(main())
