"""Helpers shared by the linear-bandit studies (ts-asc-synthetic, clucb-synthetic)."""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import torch

from bayes_safe.metrics import mean_and_sem

__all__ = ["Timer", "band", "fmt", "md_table", "per_step_mean_sem", "thin", "write_csv"]


class Timer:
    """Wall-clock seconds of named phases (``with timer("name"): ...``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self._cpu_start = time.process_time()

    def __call__(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0

        return _Phase()

    @property
    def total(self) -> float:
        """Wall seconds since the timer was made."""
        return time.perf_counter() - self._start

    @property
    def cpu(self) -> float:
        """CPU seconds of this process since the timer was made (excludes waiting for a core)."""
        return time.process_time() - self._cpu_start


def per_step_mean_sem(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and SEM over replications of a ``[T, R]`` tensor: two ``[T]`` tensors (float64)."""
    return mean_and_sem(x.to(torch.float64), dim=1)


def thin(n: int, points: int = 2000) -> torch.Tensor:
    """About ``points`` step indices of ``range(n)`` for plotting, half evenly spaced and half
    log-spaced (so that curves drawn on a log time axis keep their early steps); sorted, unique,
    always including the first and the last."""
    if n <= points:
        return torch.arange(n)
    even = torch.linspace(0, n - 1, points // 2)
    logs = torch.logspace(0, torch.log10(torch.tensor(float(n))).item(), points // 2) - 1
    return torch.unique(torch.cat([even, logs]).round().long().clamp(0, n - 1))


def band(ax, x, mean, sem, label, color=None, z: float = 2.0, **kwargs):
    """A mean line with a +-``z`` SEM band."""
    x = torch.as_tensor(x).numpy()
    mean = torch.as_tensor(mean).numpy()
    sem = torch.as_tensor(sem).numpy()
    (line,) = ax.plot(x, mean, label=label, color=color, **kwargs)
    ax.fill_between(x, mean - z * sem, mean + z * sem, alpha=0.25, color=line.get_color(), linewidth=0)
    return line


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows of dicts (same keys) as a CSV file."""
    if not rows:
        path.write_text("")
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def fmt(x, digits: int = 4) -> str:
    """A number for a Markdown table (``-`` for None / NaN)."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.{digits}f}"


def wall_time_section(seconds: dict[str, float]) -> list[str]:
    """Report lines: the wall time of each phase and the share of a core the process had."""
    order = lambda kv: (kv[0].startswith("total"), kv[0] == "figures", not kv[0].startswith("build"), kv[0])
    share = 100 * seconds["total_cpu"] / max(seconds["total"], 1e-9)
    return [
        "## Wall time",
        "",
        md_table(["phase", "seconds"], [[k, f"{v:.1f}"] for k, v in sorted(seconds.items(), key=order)]),
        "",
        f"The process had {share:.0f}% of a core on average (the 2-core machine was shared with other jobs); on an "
        "otherwise idle machine the wall time is close to the CPU time (`total_cpu`), since every simulation runs "
        "on one thread.",
    ]


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
