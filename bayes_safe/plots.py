"""Figures of runs and studies (matplotlib, Agg backend, written atomically)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .io import atomic_write
from .metrics import cumulative_regret, mean_and_sem
from .trace import Trace

__all__ = ["plot_regret", "save_figure"]


def save_figure(fig, path) -> None:
    """Save ``fig`` to ``path`` through a temporary file (never a half-written PNG)."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight"))
    plt.close(fig)


def _band(ax, x, mean, sem, label):
    ax.plot(x, mean, label=label)
    ax.fill_between(x, mean - 2 * sem, mean + 2 * sem, alpha=0.25)


def plot_regret(traces: dict[str, Trace], path=None, title: str | None = None):
    """Per-step and cumulative regret, mean and 2 standard errors over replications."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, trace in traces.items():
        x = range(trace.horizon)
        m, s = mean_and_sem(trace.regret)
        _band(ax1, x, m.numpy(), s.numpy(), label)
        m, s = mean_and_sem(cumulative_regret(trace))
        _band(ax2, x, m.numpy(), s.numpy(), label)
    ax1.set(xlabel="step", ylabel="per-step regret", title="Per-step regret (mean, 2 SE)")
    ax2.set(xlabel="step", ylabel="cumulative regret", title="Cumulative regret (mean, 2 SE)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    if path is not None:
        save_figure(fig, path)
    return fig
