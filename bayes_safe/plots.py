"""Figures of runs and studies (matplotlib, Agg backend, written atomically)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .io import atomic_write
from .metrics import cumulative_regret, mean_and_sem
from .trace import Trace

__all__ = ["plot_regret", "plot_simulation", "save_figure"]


def save_figure(fig, path) -> None:
    """Save ``fig`` to ``path`` through a temporary file (never a half-written PNG)."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight"))
    plt.close(fig)


def _band(ax, x, mean, sem, label, clip=None):
    ax.plot(x, mean, label=label)
    low, high = mean - 2 * sem, mean + 2 * sem
    if clip is not None:  # a rate: the band stays in [0, 1]
        low, high = low.clip(*clip), high.clip(*clip)
    ax.fill_between(x, low, high, alpha=0.25)


def _finish(fig, axes, title: str | None, path):
    """Grid and legend on every panel that has lines, the title, and the file (when ``path`` is given)."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    # constrained layout: the figure title above the panels' own titles, never over them
    fig.set_layout_engine("constrained")
    if title:
        fig.suptitle(title)
    if path is not None:
        save_figure(fig, path)
    return fig


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
    return _finish(fig, (ax1, ax2), title, path)


def plot_simulation(traces: dict[str, Trace], path=None, title: str | None = None):
    """The figure of ``bayes-safe simulate``: cumulative regret beside the violation rate.

    Left: cumulative regret; right: the fraction of replications whose played action broke
    a constraint in expectation, per step (the instance-level violation of Daulton et al.
    2019, s.3.1; the baseline's plays included, ``Trace.constraint_violation``), with one
    dashed line per declared constraint when a single run with several is drawn. Both: mean
    over replications and a band of 2 standard errors. When a
    trace has no regret (its problem gives no expected outcomes), the panels say so in text
    instead of drawing zeros.
    """
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    missing = []
    for label, trace in traces.items():
        if not trace.regret_available:
            missing.append(label)
            continue
        x = range(trace.horizon)
        m, s = mean_and_sem(cumulative_regret(trace))
        _band(ax1, x, m.numpy(), s.numpy(), label)
        m, s = mean_and_sem(trace.violation.double())
        _band(ax2, x, m.numpy(), s.numpy(), label if len(traces) > 1 else "any constraint", clip=(0.0, 1.0))
        per = trace.constraint_violation
        if len(traces) == 1 and per is not None and per.shape[-1] > 1:  # one run: each constraint too
            for j, name in enumerate(trace.constraint_labels()):
                ax2.plot(x, per[..., j].double().mean(1).numpy(), linestyle="--", linewidth=1, label=name)
    ax1.set(xlabel="step", ylabel="cumulative regret", title="Cumulative regret (mean, 2 SE)")
    ax2.set(xlabel="step", ylabel="violation rate", title="Constraint violations per step (mean, 2 SE)")
    if missing:
        note = (f"regret unavailable for {', '.join(missing)}:\nthe problem gives no expected outcomes\n"
                "(define Problem.expected)")
        for ax, what in ((ax1, "regret"), (ax2, "violations")):
            ax.text(0.5, 0.5, note.replace("regret unavailable", f"{what} unavailable"), transform=ax.transAxes,
                    ha="center", va="center", fontsize=10, color="0.3")
    return _finish(fig, (ax1, ax2), title, path)
