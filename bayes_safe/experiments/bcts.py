"""Behaviour-constrained bandit experiments (Balakrishnan et al. 2018, s.5): teaching, then ``simulate``.

A BCTS experiment has two phases; the first is a policy-side pre-training step
(``BCTS.learn_constraints``), the second runs through the common runner ``simulate`` on the
table's online view (``BCTSProblem.online``, a ``bayes_safe.envs.Problem``):

1. **Folds.** A ``BCTSProblem`` (``bayes_safe.envs.bcts_problem``) is a finite table of
   contexts with each arm's reward and whether the behaviour constraint allows it.
   Replication ``r`` teaches on a fold of ``teaching_size`` contexts (the paper: 200 movies,
   "5 cross validations using a different subset of 200 movies to train mu^e each time") and
   recommends on the other contexts.
2. **Constraint learning.** For each teaching strategy (``"cts"``, ``"random"``) and
   replication, one ``BCTS`` learns ``mu^e`` from ``N`` examples:
   a context drawn uniformly from the teaching fold, the agent's arm, the teacher's verdict
   ``r^e`` (1 = allowed). One pass of ``max(N)`` rounds keeps a copy of the posterior at every
   requested budget ``N`` (the models after the first ``N`` examples), so the paper's tables
   over ``N`` cost one teaching run.
3. **Online recommendation.** Every setting (each ``sigma_online`` x teaching strategy x
   budget x replication, and the Constraint Mask per replication) advances in **one batch**:
   one ``BCTS`` whose ``sigma_online`` is a tensor over the batch and one ``ConstraintMask``.
   Contexts are drawn uniformly (with replacement) from the replication's online fold.

Common random numbers: every setting of replication ``r`` sees the same contexts in the same
order (the paper: "we show the movies in the same order so our results are comparable
across settings of sigma_online") and draws its Thompson samples from the same named streams
(``SharedStreams``), so differences between settings are paired.

Metrics (per online step ``t``, action ``k_t``, context ``c_t``):

* regret ``max_k r_k(c_t) - r_{k_t}(c_t)`` against the best action, allowed or not (the
  paper's ``r_mu*``: "the reward for the best action the agent could have taken"); the
  curves show the cumulative average regret ``R(t) / t``. The regret against the best
  *allowed* action is recorded too (``constrained_regret``).
* behavioural error ``E(T) = #{t <= T : k_t is not allowed for c_t}``: the number of online
  actions that violate the constraint. (The paper writes ``E(T) = sum_t r^e(t)`` with ``r^e``
  read as "violates"; in its teaching phase ``r^e = 1`` means "allowed". We count violations.)
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validation import trusted_inputs
from ..envs.bcts_problem import BCTSProblem
from ..policies.bcts import BCTS, DEFAULT_V, TEACHING_STRATEGIES, ConstraintMask, CTSPosterior
from ..random import ReplicationRNG, replication_seeds, standard_normal
from ..threads import single_thread

__all__ = [
    "PAPER_SIGMAS",
    "BCTSResult",
    "SharedStreams",
    "plot_bcts",
    "plot_errors_by_budget",
    "run_bcts",
]

#: the settings of sigma_online in the paper's Figure 1 and Tables 1-2
PAPER_SIGMAS = (0.0, 0.25, 0.5, 0.75, 1.0)


class SharedStreams(ReplicationRNG):
    """Named random streams of ``R`` replications shared by ``B`` rows.

    Row ``b`` draws exactly the numbers replication ``rows[b]`` draws: common random
    numbers for the settings of one replication, at the cost of ``R`` (not ``B``) streams.

    Args:
        seeds: one seed per replication.
        rows: ``[B]`` replication index of each row.
    """

    def __init__(self, seeds: Sequence[int], rows, block: int = 256):
        super().__init__(seeds, block=block)
        self.rows = torch.as_tensor(rows, dtype=torch.long)
        if self.rows.dim() != 1 or bool(((self.rows < 0) | (self.rows >= len(self.seeds))).any()):
            raise ValueError(f"rows: expected a 1-D index into {len(self.seeds)} replications")

    @property
    def replications(self) -> int:
        return int(self.rows.numel())

    def _draw(self, kind, shape, key, dtype):
        return super()._draw(kind, shape, key, dtype)[self.rows]


class _SharedRows:
    """A frozen per-arm posterior seen by ``B`` rows, several rows per underlying element.

    Row ``b`` uses element ``rows[b]`` of ``model``. Rows that share an element must be given
    the same features (in ``run_bcts`` they belong to one replication, so they see the
    same context), which lets the quadratic forms be computed once per element rather than
    once per row; the random draws stay per row.
    """

    conjugate = True

    def __init__(self, model: CTSPosterior, rows: torch.Tensor):
        self.model = model
        self.rows = rows
        self.num_arms = model.num_arms
        self.batch_shape = torch.Size([rows.numel()])
        first = torch.full((model.batch_shape.numel(),), -1, dtype=torch.long)
        for b in range(rows.numel() - 1, -1, -1):
            first[int(rows[b])] = b
        if bool((first < 0).any()):
            raise ValueError("rows: every element of the model must be used by at least one row")
        self._first = first

    def predict(self, features):
        shared = features.dim() == 3 and features.stride(1) == 0  # an expanded context: keep it shared
        mean, var = self.model.predict(features[self._first, 0] if shared else features[self._first])
        return mean[self.rows], var[self.rows]

    def sample_at(self, features, generator=None, key: str = "weights"):
        mean, var = self.predict(features)
        z = standard_normal((self.rows.numel(), self.num_arms), generator, key=key)
        return mean + var.sqrt() * z

    def update(self, *args, **kwargs):  # pragma: no cover - the online phase never updates it
        raise RuntimeError("the learned constraint posterior is frozen during online recommendation")


@dataclass
class BCTSResult:
    """What ``run_bcts`` returns.

    Attributes:
        settings: one dict per setting: ``label``, ``policy`` (``"bcts"`` or ``"mask"``),
            ``sigma_online``, ``teaching`` (``"cts"``, ``"random"``, or ``None`` for the mask),
            ``num_teaching``.
        steps: ``[P]`` the step counts ``t`` at which curves are recorded (the last is ``T``).
        cumulative_regret, constrained_regret, errors: ``[P, S, R]`` float64: ``R(t)`` against
            the best action, against the best allowed action, and ``E(t)``.
        constraint_accuracy: ``{(teaching, N): [R]}``: share of (online context, arm) pairs
            that the learned posterior mean classifies correctly (allowed iff mean > 1/2).
        seconds: wall time of the teaching and online phases.
        config: the arguments of the run.
        models: the fitted posteriors at the end of the run, ``{name: {role: CTSPosterior}}``,
            each with batch ``[R]`` (replications): ``{label: {"reward": ...}}`` per BCTS setting,
            ``{"constraint: <teaching> teaching, N=<n>": {"constraint": ...}}`` per learned
            constraint posterior, ``{"Constraint Mask": {"reward": ...}}``; for
            ``save_models``.
    """

    settings: list[dict]
    steps: np.ndarray
    cumulative_regret: np.ndarray
    constrained_regret: np.ndarray
    errors: np.ndarray
    constraint_accuracy: dict
    seconds: dict
    config: dict
    models: dict = field(default_factory=dict, repr=False)

    @property
    def horizon(self) -> int:
        return int(self.steps[-1])

    def index(self, label: str | None = None, **match) -> int:
        """Position of the setting with this ``label`` (or matching the given fields)."""
        for i, s in enumerate(self.settings):
            if (label is None or s["label"] == label) and all(s.get(k) == v for k, v in match.items()):
                return i
        raise KeyError(f"no setting matches label={label!r}, {match}")

    def summary(self, step: int | None = None) -> list[dict]:
        """Per setting at ``step`` (default ``T``): mean and standard error over replications of
        ``R(T)/T``, ``E(T)`` and the constrained regret ``/T``."""
        p = -1 if step is None else int(np.searchsorted(self.steps, step))
        t = float(self.steps[p])
        R = self.errors.shape[-1]
        out = []
        for i, s in enumerate(self.settings):
            row = dict(s)
            for name, arr, scale in (("regret", self.cumulative_regret, 1 / t), ("errors", self.errors, 1.0),
                                     ("constrained_regret", self.constrained_regret, 1 / t)):
                x = arr[p, i] * scale
                row[f"{name}_mean"] = float(x.mean())
                row[f"{name}_sem"] = float(x.std(ddof=1) / math.sqrt(R)) if R > 1 else 0.0
            row["step"] = int(t)
            out.append(row)
        return out

    def to_dict(self) -> dict:
        """JSON-ready: settings, curves (means over replications) and the final summary."""
        curves = {
            s["label"]: {
                "average_regret": (self.cumulative_regret[:, i].mean(-1) / self.steps).tolist(),
                "errors": self.errors[:, i].mean(-1).tolist(),
            }
            for i, s in enumerate(self.settings)
        }
        return {
            "config": self.config,
            "steps": self.steps.tolist(),
            "summary": self.summary(),
            "curves": curves,
            "constraint_accuracy": {f"{t}/N={n}": v.tolist() for (t, n), v in self.constraint_accuracy.items()},
            "seconds": self.seconds,
        }


def _label(sigma: float, teaching: str, n: int, many_n: bool) -> str:
    base = f"sigma={sigma:g}, {teaching}"
    return f"{base}, N={n}" if many_n else base


def _record_steps(horizon: int, points: int) -> np.ndarray:
    steps = np.unique(np.linspace(1, horizon, max(2, int(points))).round().astype(np.int64))
    return steps


def _online(policy, online, streams: SharedStreams, problem: BCTSProblem, record: np.ndarray,
            progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The online phase through ``simulate`` on ``online`` (a ``BCTSOnline`` problem).

    Returns the cumulative regret against the best arm, against the best allowed arm (the
    trace's regret) and the behavioural errors (the trace's violations), at the steps
    ``record`` (1-based), each ``[P, B]``.
    """
    from ..simulation import simulate

    T = online.contexts.shape[0]
    trace = simulate(policy, online, T, generator=streams, progress=progress)
    at = torch.as_tensor(record - 1, dtype=torch.long)
    ctx = online.contexts[:, online.rows]  # [T, B]
    regret = (problem.best_reward[ctx] - trace.expected[..., 0]).cumsum(0)[at]
    return regret.numpy(), trace.regret.cumsum(0)[at].numpy(), trace.violation.double().cumsum(0)[at].numpy()


def _index_stream(seed: int, name: str, high: int, size: int) -> np.ndarray:
    gen = np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(name.encode())]))
    return gen.integers(0, high, size=size)


def run_bcts(problem: BCTSProblem, *, sigmas: Sequence[float] = PAPER_SIGMAS,
             teaching: Sequence[str] = TEACHING_STRATEGIES, num_teaching: int | Sequence[int] = 50_000,
             horizon: int = 50_000, replications: int = 5, seed: int = 0, v: float = DEFAULT_V,
             mask: bool = True, record_points: int = 200, progress: bool = False) -> BCTSResult:
    """Run BCTS for every ``sigma_online`` x teaching strategy x budget, and the Constraint Mask.

    Args:
        problem: the table to run on.
        sigmas: values of ``sigma_online`` (each in ``[0, 1]``).
        teaching: teaching strategies, each ``"cts"`` or ``"random"``.
        num_teaching: teaching budget ``N`` (>= 1), or several (tables over ``N``).
        horizon: online steps ``T`` (>= 1).
        replications: cross-validation folds / independent repetitions ``R``.
        seed: seeds the folds, the context orders and the Thompson draws.
        v: CTS sampling scale of every posterior (see ``bayes_safe.policies.bcts``).
        mask: also run the Constraint Mask.
        record_points: how many steps of the curves to keep.
        progress: show tqdm progress bars.

    Returns:
        A ``BCTSResult``.
    """
    sigmas = [float(s) for s in sigmas]
    for s in sigmas:
        if not (math.isfinite(s) and 0.0 <= s <= 1.0):
            raise ValueError(f"sigmas: every sigma_online must be in [0, 1], got {s!r}")
    teaching = list(teaching)
    for t in teaching:
        if t not in TEACHING_STRATEGIES:
            raise ValueError(f"teaching: expected strategies among {TEACHING_STRATEGIES}, got {t!r}")
    budgets = [num_teaching] if isinstance(num_teaching, (int, np.integer)) else list(num_teaching)
    for n in budgets:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or int(n) < 1:
            raise ValueError(f"num_teaching: the teaching budget must be a positive int (or a list of them), got {n!r}")
    budgets = sorted({int(n) for n in budgets})
    if (sigmas and not teaching) or (not sigmas and not mask):
        raise ValueError("sigmas, teaching, mask: nothing to run (give sigmas and teaching strategies, or mask=True)")
    if int(horizon) < 1:
        raise ValueError(f"horizon: expected a positive int, got {horizon!r}")
    if int(replications) < 1:
        raise ValueError(f"replications: expected a positive int, got {replications!r}")
    T, R, K, d = int(horizon), int(replications), problem.num_arms, problem.dim
    G, NN = len(teaching), len(budgets)
    seeds = replication_seeds(seed, R)
    teach_idx, online_idx = problem.folds(R, seed)
    n_teach, n_online = teach_idx.shape[1], online_idx.shape[1]
    N_max = budgets[-1] if sigmas else 0
    X, A = problem.contexts, problem.allowed
    timings = {"teaching": 0.0, "online": 0.0}
    tqdm = None
    if progress:
        from tqdm.auto import tqdm

    with single_thread(), trusted_inputs(), torch.inference_mode():
        # ---------------------------------------------------------------- phase 1: teaching
        snapshots: dict[int, CTSPosterior] = {}
        accuracy: dict = {}
        if sigmas:
            start = time.perf_counter()
            rep_of_row = torch.arange(G * R) % R  # teaching rows ordered (strategy, replication)
            teacher_pos = torch.as_tensor(np.stack([_index_stream(s, "teaching/context", n_teach, N_max) for s in seeds]))
            teacher_ctx = torch.gather(teach_idx, 1, teacher_pos)  # [R, N_max] context indices
            learner = BCTS(1.0, K, d, v=v, teaching=[t for t in teaching for _ in range(R)], batch_shape=[G * R])
            streams = SharedStreams(seeds, rep_of_row)
            bar = tqdm(total=N_max, desc=f"{problem.name}: teaching", mininterval=1.0) if tqdm else None

            def teacher(step, generator):
                i = teacher_ctx[:, step][rep_of_row]
                if bar is not None:
                    bar.update(1)
                return X[i][:, None, :].expand(G * R, K, d), A[i]

            snapshots = learner.learn_constraints(teacher, N_max, streams, checkpoints=budgets)
            if bar is not None:
                bar.close()
            timings["teaching"] = time.perf_counter() - start
            for n in budgets:
                mean = torch.einsum("rnd,rkd->rnk", X[online_idx][rep_of_row], snapshots[n].posterior_mean)
                correct = ((mean > 0.5) == A[online_idx][rep_of_row]).double().mean((1, 2))  # [G R]
                for g, t in enumerate(teaching):
                    accuracy[(t, n)] = correct[g * R:(g + 1) * R].numpy()

        # ---------------------------------------------------------------- phase 2: online
        start = time.perf_counter()
        settings: list[dict] = []
        rows_sigma, rows_rep, rows_model = [], [], []
        for ni, n in enumerate(budgets if sigmas else []):
            for s in sigmas:
                for g, t in enumerate(teaching):
                    settings.append({"label": _label(s, t, n, NN > 1), "policy": "bcts", "sigma_online": s,
                                     "teaching": t, "num_teaching": n})
                    rows_sigma += [s] * R
                    rows_rep += list(range(R))
                    rows_model += [ni * G * R + g * R + r for r in range(R)]
        B = len(rows_rep)
        rep_rows = torch.tensor(rows_rep, dtype=torch.long)
        if mask:
            settings.append({"label": "Constraint Mask", "policy": "mask", "sigma_online": None, "teaching": None,
                             "num_teaching": 0})
        online_pos = torch.as_tensor(np.stack([_index_stream(s, "online/context", n_online, T) for s in seeds]))
        online_ctx = torch.gather(online_idx, 1, online_pos).T.contiguous()  # [T, R]
        record = _record_steps(T, record_points)
        P, nS = len(record), len(settings)
        regret = np.zeros((P, nS, R))
        cregret = np.zeros((P, nS, R))
        errors = np.zeros((P, nS, R))
        policy = None
        if B:
            constraint = CTSPosterior.cat([snapshots[n] for n in budgets])
            policy = BCTS(torch.tensor(rows_sigma, dtype=torch.float64), reward_model=CTSPosterior(K, d, v, batch_shape=[B]),
                          constraint_model=_SharedRows(constraint, torch.tensor(rows_model, dtype=torch.long)))
            curves = _online(policy, problem.online(online_ctx, rep_rows), SharedStreams(seeds, rep_rows),
                             problem, record, progress)
            for k, arr in enumerate((regret, cregret, errors)):
                arr[:, : nS - int(mask)] = curves[k].reshape(P, -1, R)
        masker = ConstraintMask(num_arms=K, dim=d, v=v, batch_shape=[R]) if mask else None
        if mask:
            curves = _online(masker, problem.online(online_ctx, mask=True), SharedStreams(seeds, torch.arange(R)),
                             problem, record, progress)
            for k, arr in enumerate((regret, cregret, errors)):
                arr[:, -1] = curves[k]
        timings["online"] = time.perf_counter() - start
    # the fitted posteriors, split by setting (outside inference mode: ordinary tensors)
    models: dict[str, dict[str, CTSPosterior]] = {}
    if B:
        for i, setting in enumerate(settings[: len(settings) - int(mask)]):
            models[setting["label"]] = {"reward": policy.reward_model.take(torch.arange(i * R, (i + 1) * R))}
        for n in budgets:
            for g, t in enumerate(teaching):
                models[f"constraint: {t} teaching, N={n}"] = {"constraint": snapshots[n].take(torch.arange(g * R, (g + 1) * R))}
    if mask:
        models["Constraint Mask"] = {"reward": masker.reward_model.clone()}
    config = {"problem": problem.name, "sigmas": sigmas, "teaching": teaching, "num_teaching": budgets,
              "horizon": T, "replications": R, "seed": int(seed), "v": float(v), "mask": bool(mask),
              "teaching_size": problem.teaching_size, "num_contexts": problem.num_contexts, "num_arms": K, "dim": d,
              "batch_rows": B + (R if mask else 0)}
    return BCTSResult(settings=settings, steps=record, cumulative_regret=regret, constrained_regret=cregret,
                      errors=errors, constraint_accuracy=accuracy, seconds=timings, config=config, models=models)


# ---------------------------------------------------------------------------------------- reporting
def plot_bcts(result: BCTSResult, path=None, *, num_teaching: int | None = None, title: str | None = None):
    """The paper's Figure 1 for one teaching budget: ``R(t)/t`` (top) and ``E(t)`` (bottom),
    one column per teaching strategy, every ``sigma_online`` and the Constraint Mask (mean
    over replications, band = 2 standard errors). ``E(t)`` is on a symmetric-log axis so the
    few errors of small ``sigma_online`` and the many of ``sigma_online = 1`` both show."""
    from ..plots import plt

    budgets = result.config["num_teaching"]
    n = budgets[-1] if num_teaching is None else int(num_teaching)
    if result.config["sigmas"] and n not in budgets:
        raise ValueError(f"num_teaching: expected one of the run's budgets {budgets}, got {num_teaching!r}")
    teaching = result.config["teaching"] or [None]
    fig, axes = plt.subplots(2, len(teaching), figsize=(5.5 * len(teaching), 7.5), squeeze=False)
    t = result.steps.astype(np.float64)
    R = result.errors.shape[-1]
    colours = plt.get_cmap("viridis")
    for col, strategy in enumerate(teaching):
        ax_r, ax_e = axes[0, col], axes[1, col]
        for i, s in enumerate(result.settings):
            if s["policy"] == "bcts" and (s["teaching"] != strategy or s["num_teaching"] != n):
                continue
            if s["policy"] == "mask":
                label, style = "Constraint Mask", {"color": "black", "linestyle": "--"}
            else:
                sig = s["sigma_online"]
                label, style = f"sigma_online = {sig:g}", {"color": colours(0.9 * sig)}
            for ax, arr in ((ax_r, result.cumulative_regret[:, i] / t[:, None]), (ax_e, result.errors[:, i])):
                m = arr.mean(-1)
                ax.plot(t, m, label=label, **style)
                if R > 1:
                    se = arr.std(-1, ddof=1) / np.sqrt(R)
                    ax.fill_between(t, m - 2 * se, m + 2 * se, alpha=0.2, color=style["color"])
        name = {"cts": "CTS", "random": "random"}.get(strategy, "")
        ax_r.set(xlabel="online step t", ylabel="cumulative average regret R(t)/t",
                 title=f"R(t)/t, {name} teaching, N = {n:,}")
        ax_e.set(xlabel="online step t", ylabel="behavioural errors E(t)", title=f"E(t), {name} teaching, N = {n:,}")
        _finish_axes(ax_e, (ax_r, ax_e), {"fontsize": 8})
    return _finish_figure(fig, title, path)


def _finish_axes(errors_ax, axes, legend: dict) -> None:
    """Error counts on a symlog axis from 0 (they span 0 to tens of thousands); grids, legends."""
    errors_ax.set_yscale("symlog", linthresh=10)
    errors_ax.set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(**legend)


def _finish_figure(fig, title: str | None, path):
    from ..plots import save_figure

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_errors_by_budget(result: BCTSResult, path=None, *, title: str | None = None):
    """``E(T)`` (left) and ``R(T)/T`` (right) against the teaching budget ``N``, per strategy and sigma."""
    from ..plots import plt

    rows = [r for r in result.summary() if r["policy"] == "bcts"]
    fig, (ax_e, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.get_cmap("viridis")
    for strategy, marker, ls in (("cts", "o", "-"), ("random", "s", ":")):
        for sig in result.config["sigmas"]:
            pts = sorted((r["num_teaching"], r["errors_mean"], r["regret_mean"]) for r in rows
                         if r["teaching"] == strategy and r["sigma_online"] == sig)
            if not pts:
                continue
            n, e, reg = zip(*pts)
            kw = {"marker": marker, "linestyle": ls, "color": colours(0.9 * sig), "label": f"sigma={sig:g}, {strategy}"}
            ax_e.plot(n, e, **kw)
            ax_r.plot(n, reg, **kw)
    mask = [r for r in result.summary() if r["policy"] == "mask"]
    if mask:
        ax_r.axhline(mask[0]["regret_mean"], color="black", linestyle="--", label="Constraint Mask")
    ax_e.set(xscale="log", xlabel="teaching examples N", ylabel="E(T)", title=f"Behavioural errors at T = {result.horizon:,}")
    ax_r.set(xscale="log", xlabel="teaching examples N", ylabel="R(T)/T", title=f"Average regret at T = {result.horizon:,}")
    _finish_axes(ax_e, (ax_e, ax_r), {"fontsize": 7, "ncol": 2})
    return _finish_figure(fig, title, path)
