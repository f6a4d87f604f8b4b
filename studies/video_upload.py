"""Video-upload transcoding: vanilla TS and TS-ASC with a probit GP, against the baseline.

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 5, on the simulator
``bayes_safe.envs.video_upload`` (the paper's data is not public). The paper's finding to
check (section 5.4, Figure 3c): vanilla Thompson sampling lowers reliability, TS-ASC with a
small alpha does not, while both raise the quality preserved at 1080p.

Design (choices where the paper is silent):

* **One stream, common random numbers.** Every policy sees the same uploads in the same order,
  and an upload's success is decided by the same uniform ``u_i`` under every policy
  (``success = u_i < p(x_i, a)``); the baseline production policy is evaluated on the same
  uploads. Percent changes are therefore paired comparisons.
* **Warm start from logs.** Before the stream, ``warmup`` uploads are logged under a uniformly
  random valid action (an exploration log of the kind production systems keep), and one
  ``ProbitGP`` is fitted on them; each policy starts from a copy of it.
  The log is not part of the evaluation.
* **Batches with refits.** The stream arrives in ``batches`` batches of ``batch_size``
  uploads. Within a batch each policy decides every upload with its current model (one
  Thompson draw per upload); after the batch it records the outcomes, and its ProbitGP refits
  (warm-started), as a production policy refitting daily would.
* **Models.** Reward and constraint come from one success model: TS-ASC's reward view is
  ``ScaledOutcome(model, cumsum(omega))`` and its constraint view ``SuccessProbability(model)``;
  they share one posterior draw per decision (Algorithm 1 samples one model ``f~``). Vanilla TS
  uses the reward view alone.
* **Metrics** (section 5.3): reliability (success rate), quality preserved at 1080p (among
  uploads with a 1080p source, the share uploaded successfully at 1080p), the share at each
  quality, and the instance-level violation rate (true ``p(x, a) < (1 - alpha) p(x, b)``),
  overall and per sub-population (connection class, source resolution, device tier, country
  tier), as the percent change against the baseline with a paired delta-method standard error
  (``percent_change``). The SEs are those an A/B test would
  report: they treat the learned policies as given and do not include the variability of a
  rerun of the learning itself.

Outputs: ``results.json``, ``summary.csv``, ``report.md``, the figures and ``models/``: each
replication's fitted models at the end of the stream (``rep<r>__<policy>__<role>.pt``; TS-ASC's
reward and constraint views share one ProbitGP and are saved together as
``rep<r>__ts-asc_alpha=<a>__reward+constraint0.pt``), each GP with at most
``SAVED_OBSERVATIONS`` of its stored uploads (evenly spaced) so that ``bayes-safe diagnose OUT``
can draw the latent function and check calibration there without the full data.

Comparing with an earlier run: when the output directory already holds a run of the same
configuration and seed (also through ``bayes-safe study run``, whose scratch directory is
mapped back to ``--out``), its reliability changes are kept in ``results.json`` under
``previous`` and the report gets a section "What the refit fix changed" (both conventions: the
relative % change and the absolute change in percentage points; Figure 3c's contrast of
TS-ASC(alpha=0) against vanilla TS). ``rerender(out, previous=FILE)`` attaches an earlier
``results.json`` to a finished run. ``results.json`` records the ProbitGP training in
``model_training`` (``MODEL_TRAINING``; a file without it predates the refit fix of issue 16).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import time
from pathlib import Path

import torch

from bayes_safe.diagnostics import save_models
from bayes_safe.envs.video_upload import (
    ACTION_NAMES,
    CONNECTIONS,
    COUNTRY_TIERS,
    DEVICE_TIERS,
    FEATURE_DIM,
    Uploads,
    VideoUpload,
    percent_change,
)
from bayes_safe.io import atomic_output_dir
from bayes_safe.models import ProbitGP, ScaledOutcome, SuccessProbability
from bayes_safe.policies import TSASC, ThompsonSampling
from bayes_safe.threads import single_thread

NAME = "video-upload"
DESCRIPTION = "Daulton et al. (2019) s.5: TS vs TS-ASC with a probit GP on simulated video uploads"

#: the default configuration of the full run
FULL = {
    "omega": [1.0, 0.02, 0.02, 0.02],
    "alphas": [0.0, 0.005, 0.01, 0.03],
    "warmup": 10_000,
    "batches": 10,
    "batch_size": 10_000,
    "replications": 3,
    "model": {},
}
#: --quick: the same design, smaller (under 2 minutes on a loaded 2-core machine)
QUICK = {
    "omega": [1.0, 0.02, 0.02, 0.02],
    "alphas": [0.0, 0.01],
    "warmup": 4_000,
    "batches": 3,
    "batch_size": 4_000,
    "replications": 1,
    "model": {"nn_epochs": 4, "nn_min_steps": 200},
}

#: stored uploads kept with each saved ProbitGP (the posterior itself is saved whole)
SAVED_OBSERVATIONS = 5_000

GROUPS = {
    "connection": CONNECTIONS,
    "source_resolution": ACTION_NAMES,
    "device_tier": DEVICE_TIERS,
    "country_tier": COUNTRY_TIERS,
}


def _validate_config(cfg: dict) -> dict:
    cfg = {**FULL, **cfg}
    for key in ("warmup", "batches", "batch_size", "replications"):
        if int(cfg[key]) < 1:
            raise ValueError(f"config[{key!r}]: expected a positive int, got {cfg[key]!r}")
    for a in cfg["alphas"]:
        if not 0 <= float(a) < 1:
            raise ValueError(f"config['alphas']: expected values in [0, 1), got {a!r}")
    return cfg


def _policies(model: ProbitGP, env: VideoUpload, alphas) -> dict:
    ts_model = copy.deepcopy(model)
    out = {"ts": ThompsonSampling(ScaledOutcome(ts_model, env.reward_scale))}
    for alpha in alphas:
        m = copy.deepcopy(model)
        out[f"ts-asc(alpha={alpha:g})"] = TSASC(ScaledOutcome(m, env.reward_scale), SuccessProbability(m), alpha=alpha)
    return out


def simulate_stream(cfg: dict, seed: int = 0, progress=None) -> dict:
    """Run the design of the module docstring; returns per-upload records of every arm.

    Returns ``{"uploads": Uploads (all evaluation uploads), "batch": [N] batch index,
    "arms": {name: {"actions", "success", "success_prob"}}, "fit_seconds": {...}, "alphas": ...}``.
    """
    cfg = _validate_config(cfg)
    env = VideoUpload(omega=cfg["omega"], seed=seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    model_kwargs = {"refit_every": int(cfg["batch_size"]), "seed": seed, **cfg["model"]}
    with single_thread():
        logged = env.draw(int(cfg["warmup"]))
        a0 = torch.rand(len(logged), 4, generator=gen, dtype=torch.float64).masked_fill(~logged.valid, -1).argmax(-1)
        o0 = env.outcomes(logged, a0)
        base_model = ProbitGP(FEATURE_DIM, **model_kwargs)
        base_model.update(logged.features[torch.arange(len(logged)), a0], o0.success.double())
        if base_model.num_fits == 0:
            base_model.fit()
        policies = _policies(base_model, env, cfg["alphas"])
        gens = {name: torch.Generator().manual_seed(seed * 1_000 + 17 * (i + 1)) for i, name in enumerate(policies)}
        arms = {name: {"actions": [], "success": [], "success_prob": []} for name in ["baseline", *policies]}
        fit_seconds = {name: 0.0 for name in policies}
        uploads, batch_index = [], []
        for b in range(int(cfg["batches"])):
            up = env.draw(int(cfg["batch_size"]))
            rows = torch.arange(len(up))
            uploads.append(up)
            batch_index.append(torch.full((len(up),), b))
            base = env.outcomes(up, up.baseline)
            for key, val in (("actions", base.actions), ("success", base.success), ("success_prob", base.success_prob)):
                arms["baseline"][key].append(val)
            for name, policy in policies.items():
                a = policy.select(up.features, up.baseline, generator=gens[name], valid=up.valid)
                o = env.outcomes(up, a)
                arms[name]["actions"].append(o.actions)
                arms[name]["success"].append(o.success)
                arms[name]["success_prob"].append(o.success_prob)
                constraints = o.success.double()[:, None] if isinstance(policy, TSASC) else None
                start = time.perf_counter()
                policy.update(up.features[rows, a], o.reward, constraints, actions=a)
                fit_seconds[name] += time.perf_counter() - start
            if progress is not None:
                progress(b, {name: arms[name]["success"][-1].double().mean().item() for name in arms})
    allup = _concat_uploads(uploads)
    arms = {name: {k: torch.cat(v) for k, v in rec.items()} for name, rec in arms.items()}
    alphas = {name: float(p.alpha[0]) for name, p in policies.items() if isinstance(p, TSASC)}
    return {"uploads": allup, "batch": torch.cat(batch_index), "arms": arms, "fit_seconds": fit_seconds,
            "alphas": alphas, "reference": _reference_arms(env, allup, alphas), "env": env, "config": cfg,
            "policies": policies}


def _reference_arms(env: VideoUpload, up: Uploads, alphas: dict) -> dict:
    """The same decision rules with no learning: they know ``E[p(x, a) | x]`` (no Thompson noise).

    ``ts`` plays ``argmax_a scale[a] E[p | x]``; ``ts-asc(alpha)`` the same among actions with
    ``E[p(x, a) | x] >= (1 - alpha) E[p(x, b) | x]``. They separate what the constraint costs
    or buys from what the learned model's errors do.
    """
    ep = env.success_prob_given_context(up)
    rows = torch.arange(len(up))
    score = (ep * env.reward_scale).masked_fill(~up.valid, float("-inf"))
    out = {}
    rules = {"ts": None, **alphas}
    for name, alpha in rules.items():
        if alpha is None:
            a = score.argmax(-1)
        else:
            ok = (ep >= (1 - alpha) * ep[rows, up.baseline][:, None]) & up.valid
            ok[rows, up.baseline] = True
            a = score.masked_fill(~ok, float("-inf")).argmax(-1)
        o = env.outcomes(up, a)
        out[name] = {"actions": o.actions, "success": o.success, "success_prob": o.success_prob}
    return out


def _pool(sims: list[dict]) -> dict:
    """One record of several replications: their uploads and every arm's outcomes, concatenated."""
    if len(sims) == 1:
        return sims[0]
    cat = lambda recs: {k: torch.cat([r[k] for r in recs]) for k in recs[0]}
    return {
        "uploads": _concat_uploads([s["uploads"] for s in sims]),
        "batch": torch.cat([s["batch"] for s in sims]),
        "arms": {name: cat([s["arms"][name] for s in sims]) for name in sims[0]["arms"]},
        "reference": {name: cat([s["reference"][name] for s in sims]) for name in sims[0]["reference"]},
        "alphas": sims[0]["alphas"],
    }


_BETWEEN = ("reliability_change_pct", "expected_reliability_change_pct", "q_1080p_change_pct")


def _add_replications(summary: dict, per_replication: list[dict]) -> None:
    """Per-replication overall results, and their mean and SE across replications, into ``summary``."""
    for name, entry in summary.items():
        reps = [s[name]["overall"] for s in per_replication]
        entry["replications"] = reps
        between = {}
        for key in _BETWEEN:
            vals = torch.tensor([r.get(key, float("nan")) for r in reps], dtype=torch.float64)
            between[key] = float(vals.mean())
            between[f"{key}_se"] = float(vals.std() / math.sqrt(len(reps)))
        entry["between_replications"] = between


def _concat_uploads(parts: list[Uploads]) -> Uploads:
    return Uploads(
        torch.cat([u.context for u in parts]), torch.cat([u.features for u in parts]),
        torch.cat([u.valid for u in parts]), torch.cat([u.baseline for u in parts]),
        torch.cat([u.success_prob for u in parts]), torch.cat([u.uniform for u in parts]),
        {k: torch.cat([u.groups[k] for u in parts]) for k in parts[0].groups},
    )


def _compare(arm: dict, base: dict, up: Uploads, mask: torch.Tensor, alpha: float) -> dict:
    """Levels and percent changes of one arm against the baseline on the uploads in ``mask``."""
    n = int(mask.sum())
    res = {"n": n}
    if n < 2:
        return res
    s, sb = arm["success"][mask].double(), base["success"][mask].double()
    p, pb = arm["success_prob"][mask], base["success_prob"][mask]
    res["reliability"] = float(s.mean())
    res["reliability_baseline"] = float(sb.mean())
    res["reliability_change_pct"], res["reliability_change_se"] = percent_change(s, sb)
    res["expected_reliability_change_pct"], res["expected_reliability_change_se"] = percent_change(p, pb)
    src = mask & (up.groups["source_resolution"] == 3)
    if int(src.sum()) >= 2:
        q = (arm["success"][src] & (arm["actions"][src] == 3)).double()
        qb = (base["success"][src] & (base["actions"][src] == 3)).double()
        res["q_1080p"], res["q_1080p_baseline"] = float(q.mean()), float(qb.mean())
        res["q_1080p_change_pct"], res["q_1080p_change_se"] = percent_change(q, qb)
    for j, name in enumerate(ACTION_NAMES):
        res[f"share_{name}"] = float((arm["actions"][mask] == j).double().mean())
    res["violation_rate"] = float((p < (1 - alpha) * pb).double().mean())
    return res


def summarize(sim: dict, arms: dict | None = None, by_batch: bool = True) -> dict:
    """Percent changes against the baseline, overall, per batch and per sub-population.

    ``arms`` defaults to the simulated arms (``sim["reference"]`` gives the reference rules).
    The violation rate of an arm without an alpha (vanilla TS, the baseline) is measured at the
    smallest positive TS-ASC alpha (0.01 if there is none).
    """
    up, base = sim["uploads"], sim["arms"]["baseline"]
    arms = sim["arms"] if arms is None else arms
    positive = [a for a in sim["alphas"].values() if a > 0]
    reference_alpha = min(positive) if positive else 0.01
    everyone = torch.ones(len(up), dtype=torch.bool)
    out = {}
    for name, arm in arms.items():
        alpha = sim["alphas"].get(name, reference_alpha)
        entry = {"alpha": sim["alphas"].get(name), "overall": _compare(arm, base, up, everyone, alpha)}
        if by_batch:
            entry["by_batch"] = [_compare(arm, base, up, sim["batch"] == b, alpha) for b in range(int(sim["batch"].max()) + 1)]
        for group, labels in GROUPS.items():
            g = up.groups[group]
            entry[f"by_{group}"] = {lab: _compare(arm, base, up, g == i, alpha) for i, lab in enumerate(labels)}
        out[name] = entry
    return out


def _finding(summary: dict) -> dict:
    """Does vanilla TS lower reliability, and does TS-ASC with the smallest alpha not?

    With several replications the test uses the mean of the replications' percent changes and
    its standard error across replications (which includes the variability of the learning
    itself); with one, the paired delta-method SE of that run. "Lowers" means
    ``change + 2 SE < 0``.
    """
    res = {"ts_asc": {}}
    for name, entry in summary.items():
        if name == "baseline":
            continue
        o, between = entry["overall"], entry.get("between_replications")
        if between is not None:
            c, se = between["reliability_change_pct"], between["reliability_change_pct_se"]
            qc = between["q_1080p_change_pct"]
            per_rep = [r["reliability_change_pct"] for r in entry["replications"]]
            lowered_in = sum(r["reliability_change_pct"] + 2 * r["reliability_change_se"] < 0 for r in entry["replications"])
        else:
            c, se, qc = o["reliability_change_pct"], o["reliability_change_se"], o.get("q_1080p_change_pct")
            per_rep, lowered_in = [c], int(c + 2 * se < 0)
        row = {"reliability_change_pct": c, "reliability_change_se": se, "lowers_reliability": c + 2 * se < 0,
               "q_1080p_change_pct": qc, "reliability_change_pct_by_replication": per_rep,
               "replications_significantly_lower": lowered_in}
        if name == "ts":
            res["ts"] = row
        else:
            res["ts_asc"][name] = row
    res["ts_lowers_reliability"] = res["ts"]["lowers_reliability"]
    # sub-populations whose reliability an arm lowers significantly (the instance-level
    # constraint is meant to prevent exactly this; an aggregate one would not)
    res["groups_with_lower_reliability"] = {}
    for name, entry in summary.items():
        if name == "baseline":
            continue
        hurt = []
        for group in GROUPS:
            for lab, r in entry[f"by_{group}"].items():
                c, se = r.get("reliability_change_pct"), r.get("reliability_change_se")
                if c is not None and se is not None and not math.isnan(c) and c + 2 * se < 0:
                    hurt.append(f"{group}={lab} ({c:+.2f} ± {se:.2f} %)")
        res["groups_with_lower_reliability"][name] = hurt
    smallest = min(res["ts_asc"], key=lambda k: summary[k]["alpha"]) if res["ts_asc"] else None
    res["smallest_alpha_arm"] = smallest
    res["reproduced"] = bool(res["ts_lowers_reliability"] and smallest is not None
                             and not res["ts_asc"][smallest]["lowers_reliability"])
    return res


# ---------------------------------------------------------------------- outputs
def _clean(obj):
    """JSON-safe copy: NaN and infinities become ``None``, tensors and numbers plain Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _clean(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def _fmt(value, se=None, digits=2) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if se is None:
        return f"{value:.{digits}f}"
    return f"{value:+.{digits}f} ± {se:.{digits}f}"


def _figures(summary: dict, out: Path) -> list[str]:
    from bayes_safe.plots import plt, save_figure

    names = [n for n in summary if n != "baseline"]
    files = []
    # 1. overall and per-group percent changes
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    panels = [("overall", None), ("by_connection", CONNECTIONS), ("by_device_tier", DEVICE_TIERS)]
    for row, metric in enumerate(("reliability", "q_1080p")):
        for col, (key, labels) in enumerate(panels):
            ax = axes[row, col]
            if metric == "q_1080p" and key == "by_connection":
                # the baseline uploads 1080p only on wifi, so a % change is undefined elsewhere: show levels
                arms = list(summary)
                width = 0.8 / len(arms)
                for i, name in enumerate(arms):
                    vals = [summary[name][key][c].get("q_1080p") for c in labels]
                    xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(labels))]
                    ax.bar(xs, [float("nan") if v is None else v for v in vals], width=width, label=name,
                           color="0.3" if name == "baseline" else None)
                ax.set_xticks(range(len(labels)), list(labels))
                ax.set_title("q 1080p level by connection (baseline in grey)")
                ax.grid(alpha=0.3, axis="y")
                continue
            cats = ["all"] if labels is None else list(labels)
            width = 0.8 / len(names)
            for i, name in enumerate(names):
                vals, errs = [], []
                for c in cats:
                    r = summary[name]["overall"] if labels is None else summary[name][key][c]
                    v, e = r.get(f"{metric}_change_pct"), r.get(f"{metric}_change_se")
                    vals.append(float("nan") if v is None else v)
                    errs.append(0.0 if e is None or math.isnan(e) else 2 * e)
                xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cats))]
                ax.bar(xs, vals, width=width, yerr=errs, capsize=3, label=name)
                if labels is None and "replications" in summary[name]:
                    reps = [r.get(f"{metric}_change_pct") for r in summary[name]["replications"]]
                    ax.plot([xs[0]] * len(reps), reps, "k.", ms=5, label="one replication" if i == 0 else None)
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xticks(range(len(cats)), cats)
            ax.set_title(f"{metric.replace('_', ' ')}: % change vs baseline" + ("" if labels is None else f" ({key[3:]})"))
            ax.grid(alpha=0.3, axis="y")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Percent change against the baseline policy, uploads of all replications pooled "
                 "(bars: 2 paired SEs; dots: single replications)")
    save_figure(fig, out / "changes.png")
    files.append("changes.png")
    # 2. per batch
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    for name in names:
        batches = summary[name]["by_batch"]
        xs = range(1, len(batches) + 1)
        for ax, metric in ((ax1, "reliability"), (ax2, "q_1080p")):
            m = [b.get(f"{metric}_change_pct", float("nan")) for b in batches]
            s = [2 * b.get(f"{metric}_change_se", 0.0) for b in batches]
            ax.errorbar(xs, m, yerr=s, marker="o", capsize=3, label=name)
    for ax, metric in ((ax1, "reliability"), (ax2, "quality preserved at 1080p")):
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xlabel="batch (the model refits after each)", ylabel="% change vs baseline", title=metric)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    save_figure(fig, out / "batches.png")
    files.append("batches.png")
    # 3. quality shares
    fig, ax = plt.subplots(figsize=(8, 4))
    arms = list(summary)
    bottom = [0.0] * len(arms)
    for q in ACTION_NAMES:
        vals = [summary[a]["overall"][f"share_{q}"] for a in arms]
        ax.bar(arms, vals, bottom=bottom, label=q)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="share of uploads", title="Upload quality chosen")
    ax.legend()
    save_figure(fig, out / "shares.png")
    files.append("shares.png")
    return files


def _csv(summary: dict) -> str:
    buf = io.StringIO()
    cols = ["n", "reliability", "reliability_change_pct", "reliability_change_se", "expected_reliability_change_pct",
            "expected_reliability_change_se", "q_1080p", "q_1080p_change_pct", "q_1080p_change_se",
            *[f"share_{q}" for q in ACTION_NAMES], "violation_rate"]
    w = csv.writer(buf)
    w.writerow(["arm", "group", "value", *cols])
    for name, entry in summary.items():
        rows = [("overall", "all", entry["overall"])]
        for group in GROUPS:
            rows += [(group, lab, r) for lab, r in entry[f"by_{group}"].items()]
        rows += [("batch", str(i + 1), r) for i, r in enumerate(entry.get("by_batch", []))]
        for group, lab, r in rows:
            w.writerow([name, group, lab, *[r.get(c, "") for c in cols]])
    return buf.getvalue()


#: how the feature network of every ProbitGP is trained at each (warm-started) refit; stored in
#: ``results.json`` so that a later run can say which training produced which numbers
MODEL_TRAINING = ("refits scale with the data (issue 16 item 7): at most nn_epochs passes over the stored rows, "
                  "early stopping on a fixed held-out slice (nn_holdout of the rows, nn_patience epochs without "
                  "improvement, best epoch kept); the nn_min_steps floor only on the first (cold) fit")
#: what a ``results.json`` without ``model_training`` was produced with
PREVIOUS_TRAINING = ("the run made before the refit fix: every warm refit trained at least nn_min_steps = 500 "
                     "mini-batch steps on all stored rows (hundreds of epochs over the first rows), no held-out slice")


def _reliability_digest(results: dict) -> dict:
    """Per arm, the reliability change in both conventions the report uses.

    ``pct``: the study's convention, ``100 (r - r_b) / r_b``, the relative % change of the success
    rate against the baseline's on the same uploads (the mean over replications ± its SE across
    replications when there are several, else the pooled change ± its paired SE); ``pp``: the
    absolute difference ``100 (r - r_b)`` in percentage points, of the pooled uploads.
    """
    out = {}
    f, s = results["finding"], results["summary"]
    for name, row in [("ts", f["ts"]), *f["ts_asc"].items()]:
        o = s[name]["overall"]
        reps = s[name].get("replications") or [o]
        out[name] = {
            "pct": row["reliability_change_pct"], "pct_se": row["reliability_change_se"],
            "pct_by_replication": row["reliability_change_pct_by_replication"],
            "pp": 100 * (o["reliability"] - o["reliability_baseline"]),
            "pp_by_replication": [100 * (r["reliability"] - r["reliability_baseline"]) for r in reps],
            "q_1080p_change_pct": row["q_1080p_change_pct"], "violation_rate": o.get("violation_rate"),
        }
    return out


def _destination(out: Path) -> Path:
    """``out``, or the directory ``out`` will replace when it is the scratch directory that
    ``bayes_safe.io.atomic_output_dir`` yields (``<parent>/.NAME.tmp-PID-TOKEN/NAME``; the command
    line hands the study one)."""
    out = Path(out)
    if out.parent.name.startswith(f".{out.name}.tmp-"):
        return out.parent.parent / out.name
    return out


def _previous_run(results_file: Path, cfg: dict, seed: int) -> dict | None:
    """The reliability digest of an earlier run's ``results.json`` (same configuration and seed), or None."""
    try:
        prev = json.loads(Path(results_file).read_text())
    except (OSError, ValueError):
        return None
    if prev.get("study") != NAME or prev.get("seed") != seed or prev.get("config") != _clean(cfg):
        return None
    try:
        digest = _reliability_digest(prev)
    except (KeyError, TypeError):
        return None
    if "previous" in prev and prev.get("model_training") == MODEL_TRAINING:
        return prev["previous"]  # a rerun of the same code: keep comparing with the run before the change
    return {"model_training": prev.get("model_training", PREVIOUS_TRAINING), "seconds": prev.get("seconds"),
            "reliability": digest}


def _change_section(results: dict) -> list[str]:
    """What the model-training change did to the reliability changes (Figure 3c's contrast)."""
    prev = results.get("previous")
    if not prev:
        return []
    now, before = _reliability_digest(results), prev["reliability"]
    lines = [
        "## What the refit fix changed",
        "",
        (f"Against an earlier run of the same configuration and seed (its numbers are kept in this run's "
         f"`results.json` under `previous`); the ProbitGP's training is the change meant (other code may have "
         f"changed between the two runs too). Before: {prev['model_training']}. "
         f"Now: {results.get('model_training', MODEL_TRAINING)}."),
        "",
        ("Two conventions, both against the baseline policy on the same uploads: **%** is the study's convention, "
         "the relative change of the success rate `100 (r - r_b) / r_b` (mean over replications ± its SE across "
         "replications, as in the finding above); **pp** is the absolute difference `100 (r - r_b)` in percentage "
         "points of the pooled uploads (the baseline's reliability is about 0.90, so pp ≈ 0.9 × %). "
         "Per-replication values in brackets."),
        "",
        "| arm | Δ reliability % before | Δ reliability % now | Δ reliability pp before | Δ reliability pp now | Δ q_1080p % before → now | violation rate before → now |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in now.items():
        b = before.get(name)
        if b is None:
            continue
        fmt_reps = lambda v: ", ".join(f"{x:+.2f}" for x in v)
        lines.append(
            f"| {name} | {_fmt(b['pct'], b['pct_se'])} ({fmt_reps(b['pct_by_replication'])}) | "
            f"{_fmt(r['pct'], r['pct_se'])} ({fmt_reps(r['pct_by_replication'])}) | "
            f"{b['pp']:+.2f} ({fmt_reps(b['pp_by_replication'])}) | {r['pp']:+.2f} ({fmt_reps(r['pp_by_replication'])}) | "
            f"{_fmt(b['q_1080p_change_pct'], digits=1)} → {_fmt(r['q_1080p_change_pct'], digits=1)} | "
            f"{_fmt(b.get('violation_rate'), digits=3)} → {_fmt(r.get('violation_rate'), digits=3)} |")
    lines.append("")
    zero = next((n for n in now if n.startswith("ts-asc") and results["summary"][n]["alpha"] == 0), None)
    if zero is not None and zero in before and "ts" in before:
        gap = lambda d: d[zero]["pct"] - d["ts"]["pct"]
        gap_pp = lambda d: d[zero]["pp"] - d["ts"]["pp"]
        lines += [
            (f"Figure 3c's contrast, {zero} minus vanilla TS: before {gap(before):+.2f} % ({gap_pp(before):+.2f} pp), "
             f"now {gap(now):+.2f} % ({gap_pp(now):+.2f} pp). {zero}'s own change: before "
             f"{_fmt(before[zero]['pct'], before[zero]['pct_se'])} %, now {_fmt(now[zero]['pct'], now[zero]['pct_se'])} %; "
             f"vanilla TS: before {_fmt(before['ts']['pct'], before['ts']['pct_se'])} %, now "
             f"{_fmt(now['ts']['pct'], now['ts']['pct_se'])} %."),
            "",
        ]
    if prev.get("seconds") is not None and results.get("seconds") is not None:
        lines += [f"Run time: before {prev['seconds']:.0f} s, now {results['seconds']:.0f} s.", ""]
    return lines


def _report(results: dict) -> str:
    s, f, cfg = results["summary"], results["finding"], results["config"]
    reps = int(cfg["replications"])
    names = [n for n in s if n != "baseline"]
    lines = [
        "# Video-upload transcoding: TS vs TS-ASC (Daulton et al. 2019, section 5)",
        "",
        (f"Simulator `bayes_safe.envs.video_upload` (docs/video_upload.md), seed {results['seed']}; "
         f"omega = {cfg['omega']}; warm-up log of {cfg['warmup']:,} uploads under random valid actions; "
         f"then {cfg['batches']} batches of {cfg['batch_size']:,} uploads ({cfg['batches'] * cfg['batch_size']:,} "
         f"evaluated per replication, {reps} replication(s)), each policy's ProbitGP refitting after every batch. "
         "All arms see the same uploads with common random numbers. Below the finding, tables pool the uploads of "
         "all replications: % change against the baseline policy ± one standard error (paired delta method, the "
         "SE an A/B test would report; it treats the learned policies as given)."),
        "",
        "## Finding",
        "",
        ("The paper (section 5.4): vanilla TS lowers reliability, TS-ASC with a small alpha does not. "
         + (f"Here, over {reps} replications (independent upload streams, models and draws; seeds "
            f"{results['seed']}..{results['seed'] + reps - 1}): the mean of the replications' % changes ± its "
            "standard error across replications, which includes the variability of the learning; in brackets each "
            "replication's change and in how many of them it was significantly lower (paired SE, 2 SE)."
            if reps > 1 else "Here (one replication): % change ± the paired delta-method SE.")),
        "",
        "| arm | Δ reliability % | lowers reliability (2 SE) | per replication | Δ q_1080p % |",
        "|---|---|---|---|---|",
    ]
    for name, r in [("ts", f["ts"]), *f["ts_asc"].items()]:
        per = ", ".join(f"{v:+.2f}" for v in r["reliability_change_pct_by_replication"])
        lines.append(f"| {name} | {_fmt(r['reliability_change_pct'], r['reliability_change_se'])} | "
                     f"{'yes' if r['lowers_reliability'] else 'no'} | {per} "
                     f"({r['replications_significantly_lower']} of {len(r['reliability_change_pct_by_replication'])} lower) | "
                     f"{_fmt(r['q_1080p_change_pct'], digits=1)} |")
    lines += ["", f"**Finding reproduced: {'yes' if f['reproduced'] else 'no'}** (by the test above, for the smallest alpha).", ""]
    lines += _change_section(results)
    ref = results.get("reference", {})
    gaps = []
    for name in f["ts_asc"]:
        learned, known = s[name]["overall"], ref.get(name, {}).get("overall")
        if known:
            gaps.append(f"{name}: {learned['reliability_change_pct']:+.2f} % learned vs {known['reliability_change_pct']:+.2f} % "
                        f"knowing E[p | x] (violation rate {learned['violation_rate']:.3f} vs {known['violation_rate']:.3f})")
    if gaps:
        lines += [("Learning's share (pooled uploads): " + "; ".join(gaps) + ". The gap is what the sampled model's "
                   "errors in the small success differences between qualities cost (the paper's Remark in section 3.2: "
                   "the constraint is only as accurate as the sampled model)."), ""]
    lines += [
              ("Sub-populations (connection, source resolution, device tier, country tier) whose reliability "
               "an arm lowers significantly (2 SE):"), ""]
    for name, hurt in f["groups_with_lower_reliability"].items():
        lines.append(f"- {name}: " + ("none" if not hurt else "; ".join(hurt)))
    lines += ["", "## Overall", "",
              "| arm | reliability | Δ reliability % | Δ expected reliability % | q_1080p | Δ q_1080p % | violation rate | shares 360/480/720/1080p |",
              "|---|---|---|---|---|---|---|---|"]
    for name in s:
        o = s[name]["overall"]
        shares = "/".join(f"{o[f'share_{q}']:.2f}" for q in ACTION_NAMES)
        if name == "baseline":
            lines.append(f"| baseline | {o['reliability']:.4f} | | | {o.get('q_1080p', float('nan')):.4f} | | | {shares} |")
            continue
        lines.append(
            f"| {name} | {o['reliability']:.4f} | {_fmt(o['reliability_change_pct'], o['reliability_change_se'])} | "
            f"{_fmt(o['expected_reliability_change_pct'], o['expected_reliability_change_se'])} | {o.get('q_1080p', float('nan')):.4f} | "
            f"{_fmt(o.get('q_1080p_change_pct'), o.get('q_1080p_change_se'), 1)} | {o['violation_rate']:.3f} | {shares} |"
        )
    lines += ["", ("The violation rate is the share of uploads whose action has a true success probability below "
                   "(1 - alpha) times the baseline action's (alpha of the arm; for vanilla TS the smallest positive "
                   "TS-ASC alpha)."), "",
              "## Reference: the same rules without learning", "",
              ("The same decision rules applied to the same uploads knowing `E[p(x, a) | x]` (the success probability "
               "averaged over what the context hides; no model, no Thompson noise). The gap between an arm and its "
               "reference is what the learned model's errors and exploration do."), "",
              "| rule | Δ reliability % | Δ expected reliability % | Δ q_1080p % | violation rate |", "|---|---|---|---|---|"]
    for name, entry in results["reference"].items():
        if name == "baseline":
            continue
        o = entry["overall"]
        lines.append(f"| {name} (knows E[p \\| x]) | {_fmt(o['reliability_change_pct'], o['reliability_change_se'])} | "
                     f"{_fmt(o['expected_reliability_change_pct'], o['expected_reliability_change_se'])} | "
                     f"{_fmt(o.get('q_1080p_change_pct'), o.get('q_1080p_change_se'), 1)} | {o['violation_rate']:.3f} |")
    lines.append("")
    for group, labels in GROUPS.items():
        lines += [f"## By {group.replace('_', ' ')}", "",
                  "| arm | " + " | ".join(f"{lab}: Δ reliability % / Δ q_1080p %" for lab in labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for name in names:
            cells = []
            for lab in labels:
                r = s[name][f"by_{group}"][lab]
                cells.append(f"{_fmt(r.get('reliability_change_pct'), r.get('reliability_change_se'))} / "
                             f"{_fmt(r.get('q_1080p_change_pct'), r.get('q_1080p_change_se'), 1)}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        base_cells = [f"{s['baseline'][f'by_{group}'][lab].get('reliability', float('nan')):.3f}" for lab in labels]
        lines += ["", "Baseline reliability: " + ", ".join(f"{lab} {c}" for lab, c in zip(labels, base_cells)), ""]
    lines += ["## Figures", "", "[![changes](changes.png)](changes.png)", "", "[![batches](batches.png)](batches.png)", "", "[![shares](shares.png)](shares.png)", "",
              "## Run", "", f"Seconds: total {results['seconds']:.0f}; model updates and refits per arm: "
              + ", ".join(f"{k} {v:.0f}" for k, v in results["fit_seconds"].items()) + ".", ""]
    return "\n".join(lines)


def rerender(out, previous=None) -> None:
    """Rewrite ``report.md`` and the figures of a finished run from its ``results.json`` (no simulation).

    Args:
        out: the run's directory.
        previous: optional ``results.json`` of an earlier run with the same configuration and
            seed (e.g. one kept from before a model change); its reliability changes are
            stored in ``results.json`` under ``previous`` and the report compares with them
            ("What the refit fix changed"). A file of another configuration raises ValueError.
    """
    out = Path(out)
    results = json.loads((out / "results.json").read_text())
    if previous is not None:
        digest = _previous_run(Path(previous), results["config"], results["seed"])
        if digest is None:
            raise ValueError(f"previous: {previous} is not a results.json of this study with configuration "
                             f"{results['config']} and seed {results['seed']}")
        results["previous"] = digest
    with atomic_output_dir(out) as tmp:
        _figures(results["summary"], tmp)
        (tmp / "report.md").write_text(_report(results))
        if previous is not None:
            (tmp / "results.json").write_text(json.dumps(_clean(results), indent=2) + "\n")


def run(out, quick: bool = False, seed: int = 0, config: dict | None = None) -> dict:
    """Run the study and write ``results.json``, ``summary.csv``, ``report.md``, figures and ``models/`` into ``out``.

    Args:
        out: output directory (written atomically).
        quick: the small configuration ``QUICK`` instead of ``FULL``.
        seed: seeds the upload stream, the warm-up log, the models and the Thompson draws.
        config: overrides of the configuration (keys of ``FULL``), e.g. for tests.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    cfg = _validate_config({**(QUICK if quick else FULL), **(config or {})})
    start = time.perf_counter()
    previous = _previous_run(_destination(Path(out)) / "results.json", cfg, seed)
    sims = [simulate_stream(cfg, seed=seed + r) for r in range(int(cfg["replications"]))]
    pooled = _pool(sims)
    summary = summarize(pooled)
    reference = summarize(pooled, pooled["reference"], by_batch=False)
    if len(sims) > 1:
        _add_replications(summary, [summarize(sim, by_batch=False) for sim in sims])
    fit_seconds = {k: sum(sim["fit_seconds"][k] for sim in sims) for k in sims[0]["fit_seconds"]}
    results = {
        "study": NAME, "seed": seed, "quick": bool(quick), "config": cfg, "summary": summary, "reference": reference,
        "finding": _finding(summary), "fit_seconds": fit_seconds,
        "seconds": time.perf_counter() - start, "model_training": MODEL_TRAINING, "previous": previous,
    }
    results["finding"]["paper"] = "vanilla TS decreases reliability; TS-ASC with alpha close to 0 does not (section 5.4, Figure 3)"
    with atomic_output_dir(out, replace=True) as tmp:
        (tmp / "results.json").write_text(json.dumps(_clean(results), indent=2) + "\n")
        (tmp / "summary.csv").write_text(_csv({**summary, **{f"reference {k}": v for k, v in reference.items() if k != "baseline"}}))
        results["figures"] = _figures(summary, tmp)
        (tmp / "report.md").write_text(_report(results))
        for r, sim in enumerate(sims):
            for name, policy in sim["policies"].items():
                save_models(policy, tmp / "models", prefix=(f"rep{r}", name), max_observations=SAVED_OBSERVATIONS)
    return results
