"""Run every benchmark and print one table (medians of repeated runs, ratios to targets).

    python benchmarks/run.py            # all benchmarks
    python benchmarks/run.py --quick    # fewer repeats and smaller sizes
    python benchmarks/run.py --only linear_ts

A benchmark is a module in this folder with ``run(quick: bool) -> list[dict]``; each row has
``benchmark``, ``value``, ``unit``, ``target`` (text), ``ratio`` (value over target, > 1 is
better for rates; for times the module reports target over value) and optionally ``vs_numpy``;
any other key of a row (e.g. ``min``, ``max`` of ``cli_startup``) becomes a column after ``unit``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["cli_startup", "linear_ts", "probit_gp", "linear_studies", "acol", "bcts", "offline", "tuning", "serve", "custom_priors",
              "scaling", "single_stream", "rare_harm", "horseshoe_mixing"]
HEADERS = ("benchmark", "value", "unit", "target", "ratio", "vs_numpy")


def _fmt(v) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=None, help=f"subset of {BENCHMARKS}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    names = args.only or [b for b in BENCHMARKS if (HERE / f"{b}.py").exists()]
    rows = []
    for name in names:
        module = importlib.import_module(name)
        rows.extend(module.run(quick=args.quick))
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in HEADERS]
    print_table(rows, headers=(*HEADERS[:3], *extra, *HEADERS[3:]))
    return 0


def print_table(rows: list[dict], headers=HEADERS) -> None:
    """Print benchmark rows as an aligned text table."""
    table = [[_fmt(r.get(h)) for h in headers] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    sys.exit(main())
