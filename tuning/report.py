"""Figures and ``report.md`` of a tuning study (Daulton et al. 2019, Figure 3).

* ``surfaces.png`` (Figure 3a, 3b): the BoTorch model's mean % change of the objective
  (quality preserved at 1080p) and of the constraint metric (reliability) over the two
  surface parameters (alpha, omega_1080), the other parameters at the best point; the
  completed trials are drawn on top (their other parameters differ: a projection).
* ``tradeoff.png`` (Figure 3c): every completed trial, objective change against constraint
  change, error bars of 1.96 standard errors; TS-ASC and, where the A/B test compared it,
  vanilla TS with the same reward offsets.
* ``progress.png``: each trial's objective and the best feasible one so far.
* ``report.md``, ``trials.csv`` (every trial: status, parameters, every metric's mean and
  standard error, seeds and timings), ``best.json``, and ``study.json`` (Ax's JSON snapshot of
  the whole study: ``ax.api.Client.load_from_json_file`` reads it).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from bayes_safe.io import atomic_output_dir

__all__ = ["recommends", "trial_rows", "write_report"]


def _decimals(se=None, bound=None, least: int = 2, most: int = 10) -> int:
    """Decimals that let a value be read against its SEM and its bound: two significant digits of
    the SEM, one decimal more than the bound has (``0.05`` -> 3), at least ``least``."""
    d = least
    if isinstance(se, (int, float)) and math.isfinite(se) and se > 0:
        d = max(d, 1 - math.floor(math.log10(se)))
    if isinstance(bound, (int, float)) and math.isfinite(bound) and bound != 0:
        text = f"{abs(bound):.10f}".rstrip("0")
        d = max(d, len(text.partition(".")[2]) + 1)
    return min(d, most)


def _fmt(v, se=None, digits=2, signed=True, bound=None) -> str:
    """``+1.23 ± 0.45``; ``digits=None`` chooses the decimals from the SEM and the bound (``_decimals``)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if digits is None:
        digits = _decimals(se, bound)
    s = f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    return s if se is None else f"{s} ± {se:.{digits}f}"


def _fmt_metric(study, metric: str, mean_se) -> str:
    """A metric's ``mean ± SEM`` with enough digits to read it against its outcome constraint's bound:
    a % change signed, a level (``adverse_event 0.0452 ± 0.0031`` against 0.05) unsigned."""
    if not mean_se:
        return "n/a"
    mean, se = (list(mean_se) + [None])[:2]
    bound = next((b for w, _, b in study.constraints if list(w) == [metric]), None)
    return _fmt(mean, se, digits=None, signed=_is_change(metric), bound=bound)


def _param(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def trial_rows(study) -> list[dict]:
    """One dict per trial: index, status, node, parameters, metrics (mean, sem), run metadata."""
    observed = study.observed()
    rows = []
    for idx, trial in sorted(study.experiment.trials.items()):
        md = dict(trial.run_metadata or {})
        rows.append({
            "trial": idx, "status": trial.status.name, "node": md.get("node"), "seed": md.get("seed"),
            "parameters": dict(trial.arm.parameters) if trial.arm is not None else {},
            "metrics": observed.get(idx, {}), "sim_seconds": md.get("sim_seconds"), "gen_seconds": md.get("gen_seconds"),
            "rerun_of": md.get("rerun_of"), "reason": getattr(trial, "failed_reason", None) or md.get("error"),
        })
    return rows


def _csv(study, rows) -> str:
    metrics = sorted({m for r in rows for m in r["metrics"]})
    params = study.parameter_names
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["trial", "status", "node", "seed", *params, *[f"{m}{s}" for m in metrics for s in ("", "_sem")],
                "sim_seconds", "gen_seconds", "rerun_of", "reason"])
    for r in rows:
        cells = [r["trial"], r["status"], r["node"], r["seed"], *[r["parameters"].get(p, "") for p in params]]
        for m in metrics:
            cells += list(r["metrics"].get(m, ("", "")))
        cells += [r["sim_seconds"], r["gen_seconds"], r["rerun_of"], r["reason"]]
        w.writerow(["" if c is None else c for c in cells])
    return buf.getvalue()


def _is_change(metric: str) -> bool:
    """``*_change`` metrics are % changes against the baseline; the others are levels."""
    return metric.endswith("_change")


def _axis_label(metric: str) -> str:
    return f"{metric} (% vs baseline)" if _is_change(metric) else metric


def _reference(study, metric: str) -> float | None:
    """The level that matters for ``metric``: a constraint's bound, 0 for a % change, else None."""
    for weights, _, bound in study.constraints:
        if list(weights) == [metric]:
            return bound
    return 0.0 if _is_change(metric) else None


def _lower_is_better(study, metric: str) -> bool:
    """A metric is lower-is-better when it is a minimised objective or bounded above (``<=``)."""
    if metric == study.objective_name:
        return bool(study.minimize)
    return any(list(weights) == [metric] and op == "<=" for weights, op, _ in study.constraints)


def _paper_finding(problem) -> bool:
    check = getattr(problem, "reports_paper_finding", None)
    return bool(check()) if callable(check) else False


def _intro(problem) -> str:
    intro = getattr(problem, "intro", None)
    return intro() if callable(intro) else (getattr(problem, "report_intro", None) or "")


def _summary_text(study, rows) -> list[str]:
    """What the completed trials did, in the problem's own terms (a neutral report, no paper):
    each declared constraint with its direction, and how many trials met it and improved the
    objective. A metric bounded above (lower is better) counts as met only at or below its bound."""
    problem = study.ab_test.problem
    declared = list(getattr(problem, "declared", ()) or ())
    obj = study.objective_name
    done = [r for r in rows if r["status"] == "COMPLETED" and obj in r["metrics"]]
    lines = ["## Summary", ""]
    if declared:
        lines += [("Constraints as the problem declares them (the policy keeps its own bound, set by the tuned "
                   "tolerance; the study's outcome constraint is the declared bound):"), ""]
        reward = problem.metric_names()[0] if callable(getattr(problem, "metric_names", None)) else None
        lines += [f"- `{c.describe()}` ({'lower' if c.at_most else 'higher'} is better)"
                  + (" -- a guardrail on the reward: the policy enforces it, but it is no outcome constraint (Ax refuses "
                     "one on the objective's own metric)" + ("; its per-unit violation rate is below" if _violation_metrics(study)
                                                             else "") if c.metric == reward else "")
                  for c in declared]
        lines.append("")
    if not done:
        return lines + ["No completed trial yet.", ""]
    sign = -1 if study.minimize else 1
    better = [r for r in done if sign * r["metrics"][obj][0] > 0] if _is_change(obj) else []
    feasible = [r for r in done if study.is_feasible(r["metrics"])]
    for weights, op, bound in study.constraints:
        names = list(weights)
        if len(names) != 1 or names[0] not in done[0]["metrics"]:
            continue
        m = names[0]
        met = [r for r in done if m in r["metrics"] and (r["metrics"][m][0] <= bound if op == "<=" else r["metrics"][m][0] >= bound)]
        worse = [r for r in done if m in r["metrics"] and (
            r["metrics"][m][0] - 1.96 * r["metrics"][m][1] > bound if op == "<=" else r["metrics"][m][0] + 1.96 * r["metrics"][m][1] < bound)]
        lines.append(f"- `{m} {op} {bound:g}`: met by {len(met)} of {len(done)} completed trials (observed means); "
                     f"{len(worse)} violate it significantly (95% interval beyond the bound).")
    if _is_change(obj):
        lines.append(f"- `{obj}`: {'lowered' if study.minimize else 'raised'} in {len(better)} of {len(done)} trials; "
                     f"{sum(1 for r in better if study.is_feasible(r['metrics']))} of them also meet every outcome constraint.")
    lines.append(f"- Observed feasible trials: {len(feasible)} of {len(done)}.")
    lines += _violation_summary(study, done)
    return lines + [""]


def _violation_summary(study, done) -> list[str]:
    """Per-unit violation rates over the completed trials: the tuned arm's range, the compared arms'
    and the baseline's (its own plays: the same units, every trial)."""
    names = _violation_metrics(study)
    if not names or not done:
        return []
    lines = [("- Per-unit violation rates (% of units whose played action breaks the constraint in expectation, "
              "as `simulate` counts them; median over trials, range):")]
    arms = [("tuned arm", ""), *[(f"`{c}`", c.replace("-", "_") + "_") for c in study.ab_test.compare], ("baseline", "baseline_")]
    for v in names:
        parts = []
        for label, prefix in arms:
            vals = sorted(r["metrics"][prefix + v][0] for r in done if prefix + v in r["metrics"])
            if vals:
                parts.append(f"{label} {vals[len(vals) // 2]:.2f} % ({vals[0]:.2f} to {vals[-1]:.2f})")
        if parts:
            lines.append(f"  - `{v}`: " + "; ".join(parts))
    return lines


def _noise_text(study, rows) -> list[str]:
    """What a trial's SEM covers: its replicates, and how much of it is the learning's re-run noise."""
    reps = getattr(study.ab_test, "replicates", 1)
    lines = ["## What a trial's standard error covers", ""]
    if getattr(study.ab_test.problem, "replicates_share_rows", False):  # a study of logs: one set of rows
        text = ("Each trial is an off-policy estimate from **one** log: its standard error is that estimate's "
                "(the interval of `bayes_safe.offline.intervals` for a bounded metric), the noise of the logged "
                "rows. ")
        if reps > 1:
            text += (f"Its {reps} replicates re-estimate the same rows with other Thompson draws; they do not shrink "
                     "the standard error (their spread is added to one estimate's), so `--replicates 1` gives the "
                     "same honesty in less time.")
        else:
            text += ("Replicates would re-estimate the same rows and could not shrink it: one per trial is right "
                     "for a study of logs.")
        return lines + [text, ""]
    if reps <= 1:
        return lines + [("Each trial is **one** A/B test: its SEM measures the unit-level noise of that run only, not the "
                         "variability of re-running the learning policy (other units, other Thompson draws, another "
                         "learned posterior), which is often several times larger. Treat the intervals below as too "
                         "narrow, and the model as trusting noise; use `--replicates 4` (the default)."), ""]
    lines.append(f"Each trial runs **{reps} independent A/B tests** (replicates: other units, other Thompson draws, other "
                 "refits, each paired with its own baseline) and reports their mean; its SEM is the spread of the "
                 "replicates' means, sd / sqrt(replicates), floored at the unit noise of the mean. It covers the "
                 "run-to-run variability of the learning policy, which one run's SEM misses (docs/tuning.md).")
    ratios: dict[str, list[float]] = {}
    for idx, t in sorted(study.experiment.trials.items()):
        for m, v in ((t.run_metadata or {}).get("noise") or {}).items():
            if v.get("within"):
                ratios.setdefault(m, []).append(v["between"] / v["within"])
    if ratios:
        lines += ["", "Replicate spread against one run's unit noise (median over trials; above 1: the learning adds noise):", ""]
        for m, r in ratios.items():
            r = sorted(r)
            lines.append(f"- `{m}`: {r[len(r) // 2]:.2f} x (range {r[0]:.2f} to {r[-1]:.2f}, {len(r)} trials)")
    return lines + [""]


def _power_text(study) -> list[str]:
    power = study.properties.get("power")
    if not study.constraints:
        return []
    lines = ["## Power", "", *_range_pilot_text(study)]
    if not isinstance(power, dict):
        return lines + ["No pilot was run for this study (it was made before the power check existed).", ""]
    point = ", ".join(f"{k} = {_param(v)}" for k, v in power["point"].items())
    lines += [(f"Before the first trial, a pilot trial at the centre of the search space ({point}) measured what one "
              "trial can resolve (minimum detectable change: 80 % power at a 5 % two-sided level, 2.8 trial SEs):"), ""]
    lines += [f"- {row['text'].replace('WARNING:', '**Warning:**')}" for row in power["constraints"]]
    return lines + [""]


def _cv_text(cv: dict) -> list[str]:
    if not cv:
        return []
    lines = ["## Model check", "",
             ("Leave-one-out cross-validation: each completed trial predicted by the model fitted without it "
              "(coverage: held-out trials inside the 95 % interval of prediction and observation; z SD: 1 when "
              "the intervals are honest)."), "",
             "| metric | trials | coverage | z SD | rank correlation | verdict |", "|---|---|---|---|---|---|"]
    for metric, r in cv.items():
        rank = "n/a" if r["rank_correlation"] != r["rank_correlation"] else f"{r['rank_correlation']:.2f}"
        lines.append(f"| {metric} | {len(r['points'])} | {100 * r['coverage']:.0f} % | {r['z_sd']:.2f} | {rank} | {r['verdict']} |")
    bad = [m for m, r in cv.items() if r.get("ok") is False]
    lines += ["", (f"**The model is not reliable for {', '.join(f'`{m}`' for m in bad)}**: its surfaces and its best "
                   "point rest on it; more trials (or more replicates per trial) are needed." if bad else
                   "The model predicts held-out trials; its surfaces and best point can be read with their intervals.")]
    return lines + [""]


def _surface_params(study) -> tuple[str, str] | None:
    from ax.core.parameter import RangeParameter

    ranges = [n for n, p in study.experiment.search_space.parameters.items() if isinstance(p, RangeParameter)]
    wanted = study.properties.get("surface")
    if wanted and all(w in ranges for w in wanted):
        return tuple(wanted)
    return tuple(ranges[:2]) if len(ranges) >= 2 else None


def _surfaces(study, model, center: dict, out: Path, grid: int) -> str | None:
    import numpy as np

    from bayes_safe.plots import plt, save_figure

    pair = _surface_params(study)
    if pair is None:
        return None
    px, py = pair
    sp = study.experiment.search_space.parameters
    xs = np.linspace(sp[px].lower, sp[px].upper, grid)
    ys = np.linspace(sp[py].lower, sp[py].upper, grid)
    points = [{**center, px: float(x), py: float(y)} for y in ys for x in xs]
    preds = study.predict(points, model=model)
    metrics = [study.objective_name] + [m for weights, _, _ in study.constraints for m in weights]
    metrics = list(dict.fromkeys(m for m in metrics if m in preds[0]))[:2]
    observed = study.observed()
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, len(metrics), figsize=(6.8 * len(metrics), 5), squeeze=False)
    fig.subplots_adjust(wspace=0.4)
    bounds = {next(iter(w)): b for w, _, b in study.constraints if len(w) == 1}
    for ax, metric, label in zip(axes[0], metrics, "ab"):
        z = np.array([p[metric][0] for p in preds]).reshape(grid, grid)
        lo, hi = float(z.min()), float(z.max())
        centre = 0.0 if _is_change(metric) else _reference(study, metric)
        if centre is not None:
            # a diverging map centred on no change (0 %), or a level's bound: white is "no change",
            # blue better, red worse (a lower-is-better metric reverses them), whatever the range
            half = max(abs(hi - centre), abs(lo - centre), 1e-9)
            norm = TwoSlopeNorm(vcenter=centre, vmin=centre - half, vmax=centre + half)
            cmap = "RdBu_r" if _lower_is_better(study, metric) else "RdBu"
            cs = ax.contourf(xs, ys, z, levels=np.linspace(centre - half, centre + half, 22), cmap=cmap, norm=norm)
        else:
            cs = ax.contourf(xs, ys, z, levels=21, cmap="viridis")
        fig.colorbar(cs, ax=ax, label=f"{metric} ({'% vs baseline, ' if _is_change(metric) else ''}model mean)")
        handles = []
        if _is_change(metric) and lo < 0 < hi:
            ax.contour(xs, ys, z, levels=[0.0], colors="0.35", linewidths=1.0, linestyles=":")
            handles.append(Line2D([], [], color="0.35", ls=":", label="no change (0 %)"))
        if metric in bounds and lo < bounds[metric] < hi:
            ax.contour(xs, ys, z, levels=[bounds[metric]], colors="k", linewidths=2.0)
            handles.append(Line2D([], [], color="k", lw=2, label=f"constraint bound ({bounds[metric]:g})"))
        elif metric in bounds:
            op = next(o for w, o, _ in study.constraints if list(w) == [metric])
            side = "meets" if (lo >= bounds[metric] if op == ">=" else hi <= bounds[metric]) else "misses"
            handles.append(Line2D([], [], color="k", lw=2, label=f"bound {bounds[metric]:g} not crossed here "
                                  f"(the whole slice {side} it)"))
        tx = [study.experiment.trials[i].arm.parameters[px] for i in observed]
        ty = [study.experiment.trials[i].arm.parameters[py] for i in observed]
        handles.append(ax.scatter(tx, ty, s=22, c="k", marker="o", edgecolors="white", linewidths=0.8,
                                  label="completed trials (projected)"))
        # a white-filled star with a thick black edge shows on any colour
        handles.append(ax.scatter([center[px]], [center[py]], s=260, marker="*", facecolors="white", edgecolors="k",
                                  linewidths=1.6, zorder=5, label="best point"))
        ax.set(xlabel=px, ylabel=py, title=f"({label}) {metric}")
        ax.legend(handles=handles, fontsize=7, loc="lower left", framealpha=0.85)
    others = {k: v for k, v in center.items() if k not in pair}
    fig.suptitle("Modelled response surfaces (BoTorch GP mean); other parameters at the best point: "
                 + ", ".join(f"{k}={_param(v)}" for k, v in others.items()), fontsize=9)
    save_figure(fig, out / "surfaces.png")
    return "surfaces.png"


def _tradeoff(study, rows, out: Path) -> tuple[str | None, dict]:
    from bayes_safe.plots import plt, save_figure

    obj = study.objective_name
    cons = [m for weights, _, _ in study.constraints for m in weights]
    if not cons:
        return None, {}
    con = cons[0]
    arms = {study.ab_test.problem.tuned_label(study.ab_test): ("", "tab:blue", "o")}
    compare = list(getattr(study.ab_test, "compare", ()))
    for kind in compare:
        arms["vanilla TS" if kind == "ts" else kind] = (kind.replace("-", "_") + "_", "tab:orange", "s")
    done = [r for r in rows if r["status"] == "COMPLETED"]
    fig, ax = plt.subplots(figsize=(7, 5.5))
    stats = {}
    for label, (prefix, color, marker) in arms.items():
        pts = [(r["metrics"][prefix + con], r["metrics"][prefix + obj]) for r in done
               if prefix + con in r["metrics"] and prefix + obj in r["metrics"]]
        if not pts:
            continue
        x = [p[0][0] for p in pts]
        y = [p[1][0] for p in pts]
        ax.errorbar(x, y, xerr=[1.96 * p[0][1] for p in pts], yerr=[1.96 * p[1][1] for p in pts], fmt=marker,
                    color=color, ecolor=color, alpha=0.75, capsize=2, ms=5, label=f"{label} ({len(pts)})")
        stats[label] = {
            "n": len(pts),
            "constraint_below_0": sum(1 for p in pts if p[0][0] < 0),
            "constraint_significantly_below_0": sum(1 for p in pts if p[0][0] + 1.96 * p[0][1] < 0),
            "constraint_significantly_above_0": sum(1 for p in pts if p[0][0] - 1.96 * p[0][1] > 0),
            "both_above_0": sum(1 for p in pts if p[0][0] > 0 and p[1][0] > 0),
            "both_significantly_above_0": sum(1 for p in pts if p[0][0] - 1.96 * p[0][1] > 0 and p[1][0] - 1.96 * p[1][1] > 0),
        }
    trade = {"constraint": con, "objective": obj, "arms": stats}
    if "ts" in compare:
        diffs = [r["metrics"][con][0] - r["metrics"]["ts_" + con][0] for r in done
                 if con in r["metrics"] and "ts_" + con in r["metrics"]]
        if diffs:
            trade["paired"] = {"n": len(diffs), "asc_above": sum(d > 0 for d in diffs), "mean_difference": sum(diffs) / len(diffs)}
    for line, metric in ((ax.axhline, obj), (ax.axvline, con)):
        ref = _reference(study, metric)
        if ref is not None:
            line(ref, color="k", lw=0.8)
    ax.set(xlabel=_axis_label(con), ylabel=_axis_label(obj),
           title="Metric trade-offs of every parameterization (bars: 95% intervals)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, out / "tradeoff.png")
    return "tradeoff.png", trade


def _progress(study, rows, out: Path) -> str | None:
    from bayes_safe.plots import plt, save_figure

    obj = study.objective_name
    done = [r for r in rows if r["status"] == "COMPLETED" and obj in r["metrics"]]
    if not done:
        return None
    sign = -1 if study.minimize else 1
    fig, ax = plt.subplots(figsize=(7, 4))
    best, bx, by = None, [], []
    for r in done:
        feasible = study.is_feasible(r["metrics"])
        m, s = r["metrics"][obj]
        ax.errorbar([r["trial"]], [m], yerr=[1.96 * s], fmt="o" if feasible else "x",
                    color="tab:green" if feasible else "tab:red", alpha=0.7, capsize=2)
        if feasible and (best is None or sign * m > sign * best):
            best = m
        if best is not None:
            bx.append(r["trial"])
            by.append(best)
    if bx:
        ax.step(bx, by, where="post", color="k", label="best observed feasible")
        ax.legend()
    ax.set(xlabel="trial", ylabel=_axis_label(obj),
           title="Trials (o: observed feasible, x: infeasible; bars 95%)")
    ax.grid(alpha=0.3)
    save_figure(fig, out / "progress.png")
    return "progress.png"


def _finding_text(trade: dict) -> list[str]:
    arms = trade.get("arms", {})
    ts, asc = arms.get("vanilla TS"), arms.get("TS-ASC")
    if not trade or asc is None:
        return []
    con, obj = trade["constraint"], trade["objective"]
    lines = ["## The paper's finding", "",
             ("Daulton et al. (2019), section 5.4 / Figure 3c: *all policies using vanilla TS decrease reliability, "
              "whereas there are many parameterizations that lead to TS-ASC policies with increases in both quality "
              "and reliability.* Counted on point estimates (a trial is one noisy A/B test; 'significantly': its "
              "95% interval excludes 0):"), ""]
    verdicts = []
    if ts is not None:
        every = ts["constraint_below_0"] == ts["n"]
        verdicts.append(every)
        lines.append(f"- Vanilla TS: {ts['constraint_below_0']} of {ts['n']} parameterizations lower {con} "
                     f"({ts['constraint_significantly_below_0']} significantly); {ts['constraint_significantly_above_0']} "
                     f"raise it significantly. **Every vanilla-TS parameterization lowers reliability: "
                     f"{'yes' if every else 'no'}.**")
    many = asc["both_above_0"] >= max(2, math.ceil(0.1 * asc["n"]))
    verdicts.append(many)
    lines.append(f"- TS-ASC: {asc['both_above_0']} of {asc['n']} parameterizations raise both {obj} and {con} "
                 f"({asc['both_significantly_above_0']} both significantly); {asc['constraint_below_0']} lower {con} "
                 f"({asc['constraint_significantly_below_0']} significantly). **Many (at least 10%) raise both: "
                 f"{'yes' if many else 'no'}.**")
    if ts is not None and "paired" in trade:
        p = trade["paired"]
        lines.append(f"- Same reward offsets, same users: TS-ASC's {con} is above vanilla TS's in {p['asc_above']} of "
                     f"{p['n']} trials (mean difference {p['mean_difference']:+.3f} percentage points of % change).")
    verdict = "yes" if all(verdicts) else ("partly" if any(verdicts) else "no")
    return lines + ["", f"**Finding reproduced: {verdict}.**", ""]


def _violation_metrics(study) -> list[str]:
    """The tuned arm's per-unit violation rates the A/B test reports (``*_violations``, % of units)."""
    names = getattr(study.ab_test.problem, "violation_metric_names", None)
    return list(names()) if callable(names) and not getattr(study.ab_test.problem, "offline", False) else []


def _rerun_text(study, best, rerun, sem_check, why: str | None = None) -> list[str]:
    """The winner's-curse check of the best point: its re-run with fresh seeds (or why there is
    none), and whether the chosen trial's SEM is far below the study's typical SEM."""
    obj = study.objective_name
    lines = []
    if rerun:
        o = best["observed"].get(obj)
        r = (rerun.get("metrics") or {}).get(obj)
        text = (f"**Re-run with fresh seeds** (the winner's-curse check): before naming it, trial {best['trial']}'s "
                f"parameterization ran again as {rerun['replicates']} new A/B tests (seed {rerun['seed']}, "
                f"{rerun.get('seconds', 0):.1f} s), free of the selection that made it the best among "
                f"{len(study.observed())} noisy trials.")
        if o and r:
            diff = r[0] - o[0]
            se = math.hypot(o[1], r[1])
            z = diff / se if se > 0 else float("nan")
            unit = " %" if _is_change(obj) else ""
            text += (f" `{obj}`: the trial {_fmt_metric(study, obj, o)}{unit}, the re-run {_fmt_metric(study, obj, r)}{unit} "
                     f"(difference {diff:+.{_decimals(se)}f}{unit}, "
                     f"{z:+.1f} combined SEs).")
            sign = -1 if study.minimize else 1
            if math.isfinite(z) and sign * z < -2:
                text += (" **The re-run is significantly worse: the trial's estimate was lucky (winner's curse); "
                         "read the re-run as this parameterization's value.**")
            else:
                text += " The re-run agrees with the trial within two combined SEs."
        if study.constraints and rerun.get("feasible") is not None:
            text += (" The re-run's means meet every outcome constraint." if rerun["feasible"] else
                     " **The re-run's means do not meet every outcome constraint.**")
        lines += [text, ""]
    else:
        lines += [(f"The best point was not re-run with fresh seeds ({why or 'not asked'}): its estimate is the "
                   "trial's own, chosen as the best among noisy trials, and biased in its favour (winner's curse)."), ""]
    if sem_check:
        if sem_check["small"]:
            lines += [(f"**Warning: the chosen trial's SEM of `{sem_check['metric']}` ({sem_check['sem']:.3g}) is "
                       f"{sem_check['ratio']:.2f} x the median SEM of the study's {sem_check['trials']} trials "
                       f"({sem_check['median_sem']:.3g}), below a third**: more likely its replicates agreed by chance "
                       "than this parameterization is less noisy; its interval is too narrow and the model trusts it too "
                       "much." + (" The re-run above is the fairer estimate." if rerun else "")), ""]
        else:
            lines += [(f"The chosen trial's SEM of `{sem_check['metric']}` is {sem_check['ratio']:.2f} x the median of "
                       f"the study's {sem_check['trials']} trials (not below a third)."), ""]
    return lines


def _json_safe(value):
    """``value`` with non-finite floats as None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def recommends(best) -> bool:
    """Whether ``Study.best``'s answer recommends a trial (it has ``parameters``); False when no trial
    is confidently feasible (then it says what to keep and ranks the trials that miss)."""
    return isinstance(best, dict) and "parameters" in best


def _best_json(result, study=None) -> dict | None:
    """``best.json``: the report's recommendation, and what Ax's ``Client.get_best_parameterization()``
    answers on the stored study (``ax``), with whether they agree.

    With a confidently feasible trial: its ``parameters`` (what to deploy), ``policy_bounds`` (the
    declared limit and the tuned policy bound of each constraint), the re-run and the SEM check.
    Without one there is no ``parameters`` entry: ``recommendation`` (``"keep the baseline"``, or the
    served setting for a study of a decision log) and ``closest_infeasible`` (every trial ranked by
    how far it misses, safest first; ``Study.best``)."""
    best = result["best"]
    ax_best = result.get("ax_best")
    if best is None and not ax_best:
        return None
    out = dict(best) if best is not None else {"trial": None}
    if study is not None:
        out["outcome_constraints"] = list(study.properties.get("outcome_constraints") or [])
        out["unreachable"] = result.get("unreachable") or []
    if recommends(best):
        out["rerun"] = result.get("rerun")
        out["sem_check"] = result.get("sem_check")
    if ax_best is not None:
        out["ax"] = ax_best
        if recommends(best):
            out["agrees_with_ax"] = ax_best.get("trial") == best["trial"]
        else:  # no recommendation: Ax agrees when it names no trial either
            out["agrees_with_ax"] = best is not None and ax_best.get("trial") is None
    return out


#: trial metrics the report shows whenever a trial reports them: the tuned arm's fallback rates
#: (``fallback_rate``, ``fallback_rate_<metric>``) and chance-constraint calibration (``chance_*``,
#: ``calibration_*``: the confidence claimed and the share realised safe)
DIAGNOSTIC_PREFIXES = ("fallback_rate", "chance_", "calibration_")


def _diagnostic_metrics(study, rows) -> list[str]:
    """The tuned arm's diagnostic metrics (``DIAGNOSTIC_PREFIXES``) any of ``rows`` reports, in a
    stable order; empty when none does (the report then shows nothing of them)."""
    names = {m for r in rows for m in (r.get("metrics") or {}) if m.startswith(DIAGNOSTIC_PREFIXES)}
    return sorted(names, key=lambda m: (next(i for i, p in enumerate(DIAGNOSTIC_PREFIXES) if m.startswith(p)), m))


def _calibration_text(study, rows) -> list[str]:
    """Chance-constraint calibration over the completed trials, when they report it: a metric
    naming ``claimed`` with a partner naming ``realised`` (or ``realized``) in its place reads
    ``claimed >= 0.95 safe, realised 0.90`` (medians over trials); every other ``chance_*`` /
    ``calibration_*`` metric its median and range. Nothing when no trial reports one."""
    done = [r for r in rows if r["status"] == "COMPLETED"]
    names = [m for m in _diagnostic_metrics(study, done) if not m.startswith("fallback_rate")]
    if not names:
        return []

    def median(m):
        vals = sorted(r["metrics"][m][0] for r in done if m in r["metrics"])
        return (vals[len(vals) // 2], vals[0], vals[-1], len(vals)) if vals else None

    lines = ["## Chance-constraint calibration", "",
             "What the policy's chance constraints claimed and what was realised (medians over the completed trials):", ""]
    used = set()
    for m in names:
        if "claimed" not in m:
            continue
        partner = next((p for p in names for word in ("realised", "realized") if p == m.replace("claimed", word)), None)
        c, r = median(m), median(partner) if partner else None
        if c and r:
            label = m.replace("_claimed", "").replace("claimed_", "").replace("claimed", "")
            lines.append(f"- `{label}`: claimed >= {c[0]:.3g} safe, realised {r[0]:.3g} "
                         f"(range {r[1]:.3g} to {r[2]:.3g}, {r[3]} trials)")
            used |= {m, partner}
    for m in names:
        v = median(m) if m not in used else None
        if v:
            lines.append(f"- `{m}`: {v[0]:.3g} (range {v[1]:.3g} to {v[2]:.3g}, {v[3]} trials)")
    return lines + [""]


def _policy_bounds_text(bounds, label: str) -> str:
    """``hide <= 0.02 (declared); the recommended setting's policy bound 0.0232`` for every constraint."""
    if not bounds:
        return ""
    parts = []
    for b in bounds:
        unit = " x baseline" if b.get("relative") else ""
        conf = "" if b.get("confidence") is None else f", required with P >= {b['confidence']:.3g}"
        parts.append(f"`{b['declared']}` (declared); {label} {b['policy_bound']:.4g}{unit}{conf}")
    return ("Declared limits and policy bounds (every trial is judged by the declared limit; the policy enforces "
            "its tuned bound): " + "; ".join(parts) + ".")


def _prob(logp) -> str:
    """A probability given by its log: ``68 %``, ``3.1e-27``, or ``10^-5861`` below the smallest double."""
    if logp is None or not math.isfinite(logp):
        return "n/a"
    if logp >= math.log(0.01):
        return f"{100 * math.exp(logp):.0f} %"
    return f"{math.exp(logp):.2g}" if logp >= -700 else f"10^{_log10(logp)}"


def _log10(logp) -> str:
    if logp is None or not math.isfinite(logp):
        return "n/a"
    v = logp / math.log(10)
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.0f}"


def _miss_text(m: dict) -> str:
    if m.get("shortfall") is None:
        return "n/a"
    digits = _decimals(m.get("se"), m.get("bound"))
    if m["shortfall"] <= 0:
        return f"inside by {-m['shortfall']:.{digits}f}"
    return f"misses by {m['shortfall']:.{digits}f} ({m['shortfall_se']:.3g} SE)"


def _no_recommendation_text(study, best) -> list[str]:
    """The best-point section when no trial is confidently feasible: keep what runs now, and the
    trials ranked by how far they miss, safest first."""
    ranked = best["closest_infeasible"]
    top = ranked[0]
    cons = [m["constraint"] for m in top["misses"]]
    keep = best["recommendation"]
    lines = [(f"**No trial is confidently feasible: {keep}.** No completed trial is predicted to meet every outcome "
              f"constraint ({', '.join(f'`{c}`' for c in cons)}, at the declared limits) with probability "
              f"{best['confidence']:g}; the highest is trial {top['trial']}'s, {_prob(top['log_p_feasible'])}. "
              "There is no setting to deploy from this study: `best.json` has no `parameters`; it says "
              f"`\"recommendation\": \"{keep}\"` and ranks the trials under `closest_infeasible`."), ""]
    if best.get("served_setting"):
        lines += ["The served setting: " + ", ".join(f"{k} = {_param(v)}" for k, v in best["served_setting"].items()) + ".", ""]
    lines += [("The trials, safest first (ranked by the model's log10 probability of meeting every constraint, computed "
               "in log space so that far misses still rank; then by the trial's own), with how far each trial's "
               "observed mean misses each declared limit:"), "",
              "| rank | trial | parameters | log10 P (model) | log10 P (observed) | " + " | ".join(f"`{c}`" for c in cons) + " |",
              "|---|---|---|---|---|" + "---|" * len(cons)]
    for k, r in enumerate(ranked[:10]):
        params = ", ".join(f"{n} = {_param(v)}" for n, v in r["parameters_tried"].items())
        lines.append(f"| {k + 1} | {r['trial']} | {params} | {_log10(r['log_p_feasible'])} | "
                     f"{_log10(r['log_p_feasible_observed'])} | " + " | ".join(_miss_text(m) for m in r["misses"]) + " |")
    if len(ranked) > 10:
        lines.append(f"| ... | {len(ranked) - 10} more in `best.json` | | | |" + " |" * len(cons))
    lines += ["", ("Ranked by the observed margins alone (how far each trial's own means lie beyond the limits, each "
                   "relative to its limit, SEs ignored): trials ")
              + ", ".join(str(t) for t in best["ranked_by_observed"]) + ".", ""]
    bounds = _policy_bounds_text(top.get("policy_bounds"), f"trial {top['trial']}'s policy bound")
    if bounds:
        lines += [bounds, ""]
    return lines


def _unreachable_text(study, unreachable) -> list[str]:
    """The outcome constraints no trial came within one SE of, and what to change."""
    if not unreachable:
        return []
    problem = study.ab_test.problem
    pilot = {row["violation"]: row for row in (study.properties.get("range_pilot") or {}).get("constraints", [])}
    violations = list(getattr(problem, "violation_names", ()) or ())
    tolerances = getattr(problem, "tolerance_names", None)
    confidences = getattr(problem, "confidence_names", None)
    names = dict(zip(violations, tolerances())) if callable(tolerances) else {}
    confs = dict(zip(violations, confidences())) if callable(confidences) else {}
    lines = ["### Limits that look unreachable in this search space", ""]
    for u in unreachable:
        metric = u["constraint"].split()[0]
        params = ", ".join(f"{n} = {_param(v)}" for n, v in u["parameters"].items())
        text = (f"- `{u['constraint']}`: the trial nearest to it in SEs ({u['trial']}: {params}) still misses it by "
                f"{u['shortfall']:.3g}")
        if u.get("se"):
            text += f" ({u['shortfall'] / u['se']:.3g} SE)"
        if metric in pilot:
            row = pilot[metric]
            rate = row.get("rate_at_strict_end")
            text += (f"; the range pilot searched `{row['parameter']}` in [{_param(row['range'][0])}, {_param(row['range'][1])}]"
                     + (f" and measured {rate[0]:.3g} ± {rate[1]:.2g} % of units at its strict end" if rate else "")
                     + ("" if row.get("reached") else " (the limit was not reached there either)"))
        if metric in names:
            text += (f". A setting beyond the range may meet it: widen `{names[metric]}` toward stricter (lower) values "
                     f"(`--parameter {names[metric]}=LOW:HIGH`)"
                     + (f", or tune the constraint's confidence (`--parameter {confs[metric]}=0.8:0.99`)" if metric in confs else "")
                     + "; if even the strictest setting misses it, the limit is below what the policy (and what it "
                       "falls back to) can do")
        lines.append(text + ".")
    return lines + [""]


def _range_pilot_text(study) -> list[str]:
    """How the pilot sized the default tolerance ranges (``SimulatedProblem.pilot_ranges``), if it did."""
    record = study.properties.get("range_pilot")
    if not isinstance(record, dict) or not record.get("constraints"):
        return []
    lines = [("The default search range of each tolerance with a per-unit violation limit was sized by a pilot before "
              f"the study ({len(record.get('probes', []))} A/B test(s) of {record.get('units_per_arm') or '?'} units per "
              "arm, one replicate each): the range's strict (low) end is extended by the range's width until the "
              "pilot's violation rate there meets the limit, never past the strictest bound (an absolute cap of 0, a "
              "relative cap of 0.05 x baseline, a floor twice the declared one); the loose end stays the default's."), ""]
    for row in record["constraints"]:
        rate = row.get("rate_at_strict_end")
        moved = row["range"] != row["default"]
        lines.append(f"- `{row['parameter']}`: default [{_param(row['default'][0])}, {_param(row['default'][1])}]"
                     + (f", searched in [{_param(row['range'][0])}, {_param(row['range'][1])}]" if moved else ", kept")
                     + (f"; `{row['violation']}` at the strict end {rate[0]:.3g} ± {rate[1]:.2g} % of units against the "
                        f"limit {row['limit']:g} %" if rate else "")
                     + (": reached." if row.get("reached") else
                        ": **not reached** even at the strict end." if row.get("reached") is False else "."))
    return lines + [""]


def _cv_figure(study, cv: dict, out: Path) -> str:
    from bayes_safe.plots import plt, save_figure

    fig, axes = plt.subplots(1, len(cv), figsize=(5.6 * len(cv), 4.8), squeeze=False)
    for ax, (metric, res) in zip(axes[0], cv.items()):
        pts = res["points"]
        x = [p["predicted"][0] for p in pts]
        y = [p["observed"][0] for p in pts]
        ax.errorbar(x, y, xerr=[1.96 * p["predicted"][1] for p in pts], yerr=[1.96 * p["observed"][1] for p in pts],
                    fmt="o", ms=4, capsize=2, alpha=0.8, color="tab:blue")
        lo, hi = min(x + y), max(x + y)
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, label="observed = predicted")
        for w, op, b in study.constraints:
            if list(w) == [metric]:
                ax.axhline(b, color="tab:red", lw=1, ls="--", label=f"bound {op} {b:g}")
                ax.axvline(b, color="tab:red", lw=1, ls="--")
        unit = " (%)" if _is_change(metric) else ""
        ax.set(xlabel=f"predicted without the trial{unit}", ylabel=f"observed{unit}",
               title=f"{metric}\n{res['verdict'].split(':')[0]}, coverage {100 * res['coverage']:.0f} %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Leave-one-out cross-validation of the model (bars: 95 % intervals)", fontsize=9)
    save_figure(fig, out / "cv.png")
    return "cv.png"


def write_report(study, out, *, grid: int = 30, title: str | None = None, export: bool = True,
                 note: str | None = None, rerun: bool | int = True) -> dict:
    """Write the figures, ``report.md``, ``trials.csv``, ``best.json`` and (``export``) ``study.json`` into ``out``.

    ``grid``: points per axis of the response surfaces; ``title`` of the report; ``note``: a
    paragraph added under the title (e.g. where the run came from); ``rerun``: before the report
    names the best point, re-run it with fresh seeds (``Study.rerun``; ``True``: the study's
    replicates per trial, at least 2; a number: that many replicates; ``False``: no re-run, the
    report then only compares the chosen trial's SEM with the study's typical SEM).

    Returns ``{"best": ..., "rerun": ..., "sem_check": ..., "figures": [...], "tradeoff": ...}``.
    """
    out = Path(out)
    rows = trial_rows(study)
    result: dict = {"figures": [], "best": None, "tradeoff": {}, "notes": [], "cv": {}, "ax_best": None,
                    "rerun": None, "sem_check": None}
    model = None
    n_done = sum(1 for r in rows if r["status"] == "COMPLETED")
    with atomic_output_dir(out) as tmp:
        if n_done >= 2:
            try:
                model = study.fit_model()
                result["best"] = study.best(model=model)
            except Exception as exc:  # noqa: BLE001 - a report is still useful without the model
                result["notes"].append(f"The BoTorch model could not be fitted ({type(exc).__name__}: {exc}); "
                                       "no response surfaces or model predictions.")
            if model is not None:
                try:
                    result["cv"] = study.cross_validate(model)
                except Exception as exc:  # noqa: BLE001
                    result["notes"].append(f"Cross-validation failed: {type(exc).__name__}: {exc}")
            result["ax_best"] = study.ax_best()
            if recommends(result["best"]):
                result["sem_check"] = study.sem_ratio(result["best"]["trial"])
                result["rerun_note"] = None if rerun else "not asked: `rerun=False`, `--no-rerun`"
                if not rerun:  # a re-run stored by an earlier report of the same best trial is still shown
                    stored = (study.properties.get("reruns") or {}).get(str(result["best"]["trial"]))
                    result["rerun"] = stored if isinstance(stored, dict) else None
                else:
                    try:
                        result["rerun"] = study.rerun(result["best"]["trial"],
                                                      None if rerun is True else int(rerun))
                    except Exception as exc:  # noqa: BLE001 - the report still names the trial, and says so
                        result["rerun_note"] = "the re-run failed; see the notes"
                        result["notes"].append(f"The re-run of the best point failed ({type(exc).__name__}: {exc}); "
                                               "its estimate is the trial's own.")
        else:
            result["notes"].append("Fewer than two completed trials: no model, no response surfaces.")
        result["unreachable"] = study.unreachable_constraints() if study.constraints else []
        center = None
        if recommends(result["best"]):
            center = result["best"]["parameters"]
        elif result["best"] is not None and result["best"].get("closest_infeasible"):
            center = result["best"]["closest_infeasible"][0]["parameters_tried"]
        else:
            best_obs = study.best_observed()
            if best_obs is not None:
                center = dict(study.experiment.trials[best_obs[0]].arm.parameters)
            elif n_done:
                sign = -1 if study.minimize else 1
                done = [r for r in rows if r["status"] == "COMPLETED" and study.objective_name in r["metrics"]]
                if done:
                    center = max(done, key=lambda r: sign * r["metrics"][study.objective_name][0])["parameters"]
        if model is not None and center is not None:
            try:
                name = _surfaces(study, model, center, tmp, grid)
                if name:
                    result["figures"].append(name)
            except Exception as exc:  # noqa: BLE001
                result["notes"].append(f"Response surfaces failed: {type(exc).__name__}: {exc}")
        name, result["tradeoff"] = _tradeoff(study, rows, tmp)
        if name:
            result["figures"].append(name)
        name = _progress(study, rows, tmp)
        if name:
            result["figures"].append(name)
        if result["cv"]:
            try:
                result["figures"].append(_cv_figure(study, result["cv"], tmp))
            except Exception as exc:  # noqa: BLE001
                result["notes"].append(f"Cross-validation figure failed: {type(exc).__name__}: {exc}")
        (tmp / "trials.csv").write_text(_csv(study, rows))
        (tmp / "best.json").write_text(json.dumps(_json_safe(_best_json(result, study)), indent=2, default=float) + "\n")
        if export:
            study.export_json(tmp / "study.json")
        (tmp / "report.md").write_text(_markdown(study, rows, result, title, export, note))
    return result


def _markdown(study, rows, result, title, export=True, note=None) -> str:
    props = study.properties
    ab = study.ab_test
    obj = study.objective_name
    cons_text = [c.expression for c in study.experiment.optimization_config.outcome_constraints]
    counts = study.counts()
    problem = ab.problem
    space = ", ".join(f"{n} in [{_param(p.lower)}, {_param(p.upper)}]" if hasattr(p, "lower") else f"{n} in {p.values}"
                      for n, p in study.experiment.search_space.parameters.items())
    notes = problem.report_notes() if callable(getattr(problem, "report_notes", None)) else ""
    lines = [
        f"# {title or 'Tuning study ' + repr(study.name)}", "", _intro(problem), "", *([note, ""] if note else []),
        *([notes, ""] if notes else []), "## Set-up", "",
        f"- Problem: `{problem.name}`; {problem.trial_noun}: {problem.describe(ab)}.",
        f"- Search space: {space}.",
        f"- Objective: {'minimise' if study.minimize else 'maximise'} `{obj}`.",
        f"- Outcome constraints: {', '.join(f'`{c}`' for c in cons_text) or 'none'}.",
        (f"- Generation strategy: {props.get('sobol_trials')} Sobol trials, then BoTorch with "
         f"`{props.get('acquisition')}` (trial SEMs as known noise; acquisition optimiser "
         + (f"budget lowered to {props['optimizer']}" if props.get("optimizer") else "with Ax's default budget")
         + f"); seed {props.get('seed')}."),
        "- Trials: " + ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) + ".", "",
    ]
    # the paper's comparison belongs to the paper's problem only; any other problem gets its own summary
    lines += _noise_text(study, rows)
    lines += _power_text(study)
    lines += _finding_text(result["tradeoff"]) if _paper_finding(problem) else _summary_text(study, rows)
    lines += _calibration_text(study, rows)
    lines += _cv_text(result.get("cv") or {})
    lines += ["## Best parameterization", ""]
    best = result["best"]
    if best is None:
        lines += ["No model-based best point (see the notes below)." if result["notes"] else "No completed trial yet.", ""]
        bo = study.best_observed()
        if bo is not None:
            lines += [(f"Best observed feasible trial: {bo[0]} (`{obj}` {_fmt_metric(study, obj, bo[1][obj])}"
                       f"{' %' if _is_change(obj) else ''})."), ""]
    elif not recommends(best):
        lines += _no_recommendation_text(study, best)
    else:
        params = ", ".join(f"{k} = {_param(v)}" for k, v in best["parameters"].items())
        rule = f"Chosen by the model's posterior: {best['rule']}."
        prob = best.get("p_feasible")
        how = ("" if not study.constraints else
               f"The model gives it a **{100 * prob:.0f} % probability of meeting every outcome constraint**"
               + ("." if best.get("confident") else
                  f", below the {100 * best.get('confidence', 0.9):.0f} % asked for: **no completed trial is confidently feasible**."))
        edge = (f"It sits on a bound of the search space ({'; '.join(best['on_bounds'])}): the optimum may lie beyond "
                "it; consider widening the range." if best.get("on_bounds") else
                "It sits inside the search space (no parameter at a bound).")
        rerun = result.get("rerun")
        rerun_metrics = (rerun or {}).get("metrics") or {}
        rerun_head = (f" re-run ({rerun['replicates']} fresh replicates) |" if rerun else "")
        bounds = _policy_bounds_text(best.get("policy_bounds"), "the recommended setting's policy bound")
        lines += [f"Trial {best['trial']}: {params}.", "", rule, "", *([how, ""] if how else []), edge, "",
                  *([bounds, ""] if bounds else []),
                  *_rerun_text(study, best, rerun, result.get("sem_check"), result.get("rerun_note")),
                  f"| metric | predicted (model mean ± sd) | observed ({problem.observed_label} ± SE) |{rerun_head}",
                  "|---|---|---|" + ("---|" if rerun else "")]

        def row(m, p):
            o = best["observed"].get(m)
            cells = [m, _fmt_metric(study, m, p) if p else ("n/a" if p is None and m in modelled else ""),
                     _fmt_metric(study, m, o) if o else "n/a"]
            if rerun:
                cells.append(_fmt_metric(study, m, rerun_metrics.get(m)) if m in rerun_metrics else "n/a")
            return "| " + " | ".join(cells) + " |"

        modelled = [obj] + [c for w, _, _ in study.constraints for c in w]
        for m in modelled:
            lines.append(row(m, best["predicted"].get(m)))
        violations = _violation_metrics(study)
        extra = [m for m in sorted(best["observed"]) if m.endswith("_change") and m not in best["predicted"]
                 and not any(m.startswith(c.replace('-', '_') + '_') for c in ab.compare)]
        extra += [m for v in violations for m in (v, f"baseline_{v}") if m in best["observed"] and m not in modelled]
        extra += [m for m in _diagnostic_metrics(study, [{"metrics": best["observed"]}]) if m not in modelled]
        for m in extra:
            lines.append(row(m, False))
        lines.append("")
    lines += _unreachable_text(study, result.get("unreachable") or [])
    ax_best = result.get("ax_best")
    if ax_best and ax_best.get("no_feasible") and best is not None and not recommends(best):
        lines += [("Ax's `Client.get_best_parameterization()` on the stored study finds no trial that meets every "
                   "outcome constraint either."), ""]
    if ax_best and "trial" in ax_best:
        if best is not None and ax_best["trial"] == best["trial"]:
            lines += [f"Ax's `Client.get_best_parameterization()` on the stored study answers the same trial ({ax_best['trial']}).", ""]
        else:
            lines += [(f"Ax's `Client.get_best_parameterization()` on the stored study answers trial {ax_best['trial']} "
                      "(its own rule: the model's best point when the model fits the objective, else the best raw "
                      "observation; it does not weigh the probability of feasibility). `best.json` records both."), ""]
    if result["figures"]:
        lines += ["## Figures", ""]
        paper = _paper_finding(problem)
        captions = {
            "surfaces.png": ("Figure 3a/3b: m" if paper else "M") + "odelled objective and constraint metric over the two surface parameters, "
                            "other parameters at the best point: a diverging map centred on no change (white), "
                            "the thick black line the constraint's bound, the white star the best point.",
            "tradeoff.png": ("Figure 3c: e" if paper else "E") + "very parameterization's objective against its constraint metric.",
            "progress.png": "Each trial's objective; the line is the best observed feasible value so far.",
            "cv.png": ("Leave-one-out cross-validation: each completed trial's observation against the model's "
                       "prediction without it; points on the diagonal, within their bars, mean the model predicts "
                       "trials it has not seen."),
        }
        for f in result["figures"]:
            # linked to the full-size image: the page scales the figure to the text column
            lines += [f"[![{f}]({f})]({f})", "", captions.get(f, ""), ""]
    cons = [c for w, _, _ in study.constraints for c in w]
    has_ts = "ts" in ab.compare
    def pct(m):
        return f"{m} %" if _is_change(m) else m

    rates = [v for v in _violation_metrics(study) if v not in cons]
    diagnostics = [m for m in _diagnostic_metrics(study, rows) if m not in cons]
    header = ["trial", "node", "status", *study.parameter_names, pct(obj), *[pct(c) for c in cons],
              *[f"{v} (% of units)" for v in rates], *diagnostics]
    if has_ts:
        header += [f"vanilla TS {obj} %", "vanilla TS " + "/".join(cons) + " %"]
    header.append("sim s")
    lines += ["## Trials", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        m = r["metrics"]
        cells = [str(r["trial"]), str(r["node"] or ""), r["status"].lower() + (f" (re-run of {r['rerun_of']})" if r["rerun_of"] is not None else ""),
                 *[_param(r["parameters"].get(p, "")) for p in study.parameter_names],
                 _fmt_metric(study, obj, m[obj]) if obj in m else ""]
        cells += [_fmt_metric(study, c, m[c]) if c in m else "" for c in cons]
        cells += [_fmt_metric(study, v, m[v]) if v in m else "" for v in rates]
        cells += [_fmt_metric(study, v, m[v]) if v in m else "" for v in diagnostics]
        if has_ts:
            cells.append(_fmt_metric(study, obj, m["ts_" + obj]) if "ts_" + obj in m else "")
            cells.append(" / ".join(_fmt_metric(study, c, m["ts_" + c]) for c in cons if "ts_" + c in m))
        cells.append(f"{r['sim_seconds']:.1f}" if isinstance(r["sim_seconds"], (int, float)) else "")
        lines.append("| " + " | ".join(cells) + " |")
    failed = [r for r in rows if r["status"] == "FAILED"]
    if failed:
        lines += ["", "Failed trials: " + "; ".join(f"{r['trial']}: {r['reason']}" for r in failed) + "."]
    lines += ["", "## Time", ""]
    sessions = props.get("sessions", [])
    for i, s in enumerate(sessions):
        lines.append(f"- Run {i + 1} ({s.get('runner')}): wall {s['wall_seconds']:.0f} s for {s['trials_completed']} trials; "
                     f"Ax {s['ax_seconds_per_trial']:.2f} s per trial (generation {s['ax_gen_seconds']:.1f} s, "
                     f"completion and storage {s['ax_complete_seconds']:.1f} s in all); "
                     f"{problem.trial_work} {s['sim_seconds_per_trial']:.1f} s per trial in the workers.")
    if not sessions:
        lines.append("- No completed run recorded.")
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    files = ["`trials.csv` (every trial, every metric)", "`best.json`"]
    if export:
        files.append("`study.json` (Ax JSON snapshot; `ax.api.Client.load_from_json_file`)")
    lines += ["", "Files: " + ", ".join(files) + ".", ""]
    return "\n".join(lines)
