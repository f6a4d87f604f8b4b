"""Daulton et al. (2019) section 4: TS-ASC against CLUCB2-ASC-C and CLUCB2-ASC-I.

The ``daulton2019`` problem (100 arms in R^4, reward and constraint metrics, sigma = 0.1, the
baseline the 20th best arm by constraint among the 30 best by reward, instances redrawn until
the constraint costs reward), alpha in {0.1, 0.01, 0.001, 0.0001}, 1,000 realisations.
Outputs: Figure 1a (per-step regret), Figure 1b (moving average of instance-level
violations), Figure 2a (expected constraint of each policy in one realisation at alpha = 0.01)
and the Figure 2b table (TS-ASC's normalised expected constraint over the last 100 steps);
``models/`` holds the fitted models of the main runs (``alpha=<alpha>__<policy>__<role>.pt``,
batch = realisations; ``bayes-safe diagnose OUT`` reads them).

Choices where the paper is silent (each is restated in the report):

* **Horizon T = 10,000** (the paper gives none). TS-ASC settles within ~1,000 steps (its
  per-step regret and violation rate are flat after that), so its last-100-step numbers
  (Figure 2b) are those of the learned policy. CLUCB2-ASC-C leaves the baseline only once its
  budget ``alpha * n * r_b`` covers the pessimistic cost of an unexplored arm (about 4 in this
  problem): ~30 steps at alpha = 0.1, ~300 at 0.01, ~3,000 at 0.001 and ~30,000 at 0.0001.
  T = 10,000 shows the first three; 30,000+ steps (Kazerouni's NeurIPS horizon is 40,000) would
  not fit the 15-minute budget of the full study at 1,000 realisations, so at alpha = 0.0001
  CLUCB2-ASC-C is still mostly on the baseline at the end (said in the report).
* **Models.** "Independent ridge regression with lambda = 1 (the Bayesian interpretation for
  TS)". CLUCB2-ASC: ridge estimate and Abbasi-Yadkori ellipsoid with ``V = lambda I + X^T X``,
  lambda = 1, delta = 0.001, S = each realisation's true ``||theta||`` per metric (an oracle
  bound, as Kazerouni's known B), ``r_l = 0`` (a valid lower bound: every expected metric is
  positive). TS-ASC: conjugate Gaussian posterior with prior ``N(0, I / lambda)``, lambda = 1,
  and the known sigma = 0.1: the prior the parameters are actually drawn from. The other
  reading, prior ``N(0, sigma^2 / lambda I)`` (the posterior whose mean is the ridge estimate
  with penalty lambda; ``bayes_safe.factory.ridge_model``), has prior standard deviation
  0.1 for weights drawn with standard deviation 1: TS-ASC then under-explores and stays on
  suboptimal or infeasible arms (per-step regret ~0.3 at step 3,000 instead of ~0). A
  sensitivity run reports TS-ASC under both readings and under "ridge TS" (posterior
  covariance ``V^-1``, i.e. unit noise).
* **Regret** is measured against the best *feasible* arm (see ``bayes_safe.envs.linear``).
* **Figure 2b gap.** Under the literal generator the best feasible arm's normalised constraint
  averages ~2.4 (sd ~1.4 across realisations), not 1.2-1.3 (the paper's SEM 0.0097 implies
  sd ~0.31). A baseline ranked ~6th (not 20th) by constraint among the top 30 reproduces
  both the mean and the SEM; the study runs TS-ASC on that variant too (``variant``) so the
  report can show the table both ways.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro.distributions as dist
import torch

from bayes_safe.diagnostics import save_models
from bayes_safe.envs import daulton2019
from bayes_safe.factory import make_policy, ridge_model
from bayes_safe.io import atomic_output_dir, atomic_write_json
from bayes_safe.metrics import (
    cumulative_constraint_satisfied,
    mean_and_sem,
    normalized_constraint,
    violation_rate,
)
from bayes_safe.models import BayesianLinear
from bayes_safe.plots import save_figure
from bayes_safe.policies import TSASC
from bayes_safe.simulation import simulate

from ._common import (
    Timer,
    band,
    fmt,
    md_table,
    per_step_mean_sem,
    thin,
    wall_time_section,
    write_csv,
)

NAME = "ts-asc-synthetic"
DESCRIPTION = "Daulton et al. (2019) s.4: TS-ASC vs CLUCB2-ASC-C/-I on the synthetic problem (Figures 1a, 1b, 2a, 2b)"

#: Figure 2b of the paper: alpha -> (mean, SEM) over 1,000 realisations
PAPER_TABLE_2B = {0.1: (1.2181, 0.0097), 0.01: (1.2980, 0.0097), 0.001: (1.3065, 0.0096), 0.0001: (1.3077, 0.0096)}

FULL = {
    "alphas": [0.1, 0.01, 0.001, 0.0001],
    "replications": 1000,
    "horizon": 10_000,
    "window": 100,
    "ridge": 1.0,
    "delta": 0.001,
    "figure2a_alpha": 0.01,
    "figure2a_replication": 0,
    "sensitivity": {"alpha": 0.01, "replications": 200, "horizon": 3000},
    "variant": {"baseline_rank": 6, "replications": 1000, "horizon": 2000},
}
QUICK = {
    "alphas": [0.1, 0.01, 0.001, 0.0001],
    "replications": 16,
    "horizon": 300,
    "window": 50,
    "ridge": 1.0,
    "delta": 0.001,
    "figure2a_alpha": 0.01,
    "figure2a_replication": 0,
    "sensitivity": {"alpha": 0.01, "replications": 8, "horizon": 200},
    "variant": {"baseline_rank": 6, "replications": 16, "horizon": 200},
}

POLICIES = ("TS-ASC", "CLUCB2-ASC-C", "CLUCB2-ASC-I")


def _ts_model(env, metric: int, ridge: float, noise_std: float | None = None) -> BayesianLinear:
    """Conjugate Gaussian model with prior ``N(0, I / ridge)`` and known noise (TS-ASC's models), on the
    problem's device (the prior's parameters are the float32 numbers of ``Normal(0.0, ridge**-0.5)``)."""
    sigma = float(env.noise_std[metric]) if noise_std is None else noise_std
    device = env.arm_features.device
    prior = dist.Normal(torch.tensor(0.0, device=device), torch.tensor(ridge**-0.5, device=device))
    prior = prior.expand([env.dim]).to_event(1)
    return BayesianLinear(prior, noise_std=sigma, batch_shape=[env.replications])


def make_study_policy(name: str, env, alpha: float, ridge: float = 1.0, delta: float = 0.001, prior: str = "weights"):
    """The study's policies. ``prior`` (TS-ASC only): ``"weights"`` (``N(0, I / ridge)``, the
    main runs), ``"ridge"`` (``N(0, sigma^2 / ridge I)``) or ``"ridge-ts"`` (``N(0, I / ridge)``
    with unit noise: posterior covariance ``V^-1``)."""
    if name == "TS-ASC":
        if prior == "weights":
            models = [_ts_model(env, m, ridge) for m in range(env.num_metrics)]
        elif prior == "ridge":
            models = [ridge_model(env, m, ridge) for m in range(env.num_metrics)]
        elif prior == "ridge-ts":
            models = [_ts_model(env, m, ridge, noise_std=1.0) for m in range(env.num_metrics)]
        else:
            raise ValueError(f"prior: expected 'weights', 'ridge' or 'ridge-ts', got {prior!r}")
        return TSASC(models[0], models[1:], alpha=alpha)
    if name == "CLUCB2-ASC-C":
        return make_policy("clucb2-asc-c", env, ridge=ridge, alpha=alpha, delta=delta)
    if name == "CLUCB2-ASC-I":
        return make_policy("clucb2-asc-i", env, ridge=ridge, alpha=alpha, delta=delta)
    raise ValueError(f"policy: expected one of {POLICIES}, got {name!r}")


def _oracle(env) -> tuple[float, float]:
    """Mean and SEM over realisations of the best feasible arm's normalised expected constraint."""
    rows = torch.arange(env.replications, device=env.arm_features.device)
    ratio = env.expected[rows, env.optimal_action, 1] / env.baseline_expected[:, 1]
    m, s = mean_and_sem(ratio)
    return float(m), float(s)


def _reduce(trace, env, window: int) -> dict:
    """Everything the figures and tables need from one run; the ``[T, R]`` trace can then go."""
    T = trace.horizon
    last = slice(max(0, T - 100), T)
    regret_m, regret_s = per_step_mean_sem(trace.regret)
    vio_m, vio_s = per_step_mean_sem(100 * violation_rate(trace, window))
    norm = normalized_constraint(trace)
    norm_m, norm_s = per_step_mean_sem(norm)
    nc_last = norm[last].mean(0)
    cum_ok = cumulative_constraint_satisfied(trace, metric=1)
    on_base = (trace.actions == trace.baseline).double()
    gap = trace.optimal_reward[0] - trace.baseline_expected[0, :, 0]  # baseline policy's per-step regret [R]
    cum_regret = trace.regret.sum(0)

    def ms(x):
        m, s = mean_and_sem(x)
        return {"mean": float(m), "sem": float(s)}

    summary = {
        "per_step_regret_last100": ms(trace.regret[last].mean(0)),
        "cumulative_regret": ms(cum_regret),
        "baseline_policy_per_step_regret": ms(gap),
        "violation_rate_last100": ms(trace.violation[last].double().mean(0)),
        "violation_rate_all_steps": ms(trace.violation.double().mean(0)),
        "share_of_steps_on_baseline": ms(on_base.mean(0)),
        "share_of_steps_on_baseline_last100": ms(on_base[last].mean(0)),
        "normalized_constraint_last100": ms(nc_last),
        "cumulative_constraint_eq3_all_steps_share": float(cum_ok.all(0).double().mean()),
        "cumulative_constraint_eq3_violated_steps": ms((~cum_ok).double().sum(0)),
        "elapsed_seconds": float(trace.attrs["elapsed_seconds"]),
    }
    curves = {
        "regret_mean": regret_m, "regret_sem": regret_s,
        "violation_pct_ma_mean": vio_m, "violation_pct_ma_sem": vio_s,
        "normalized_constraint_mean": norm_m, "normalized_constraint_sem": norm_s,
    }
    return {"summary": summary, "curves": curves}


def _figure1(results, alphas, key, sem_key, ylabel, title, path, baseline=None):
    fig, axes = plt.subplots(1, len(alphas), figsize=(4.2 * len(alphas), 3.6), sharey=False, squeeze=False)
    for ax, alpha in zip(axes[0], alphas):
        for name in POLICIES:
            c = results[alpha][name]["curves"]
            idx = thin(len(c[key]))
            band(ax, idx + 1, c[key][idx], c[sem_key][idx], name)
        if baseline is not None:
            ax.axhline(baseline[alpha], color="k", ls="--", lw=1, label="baseline policy")
        ax.set(title=f"alpha = {alpha:g}", xlabel="time step (log scale)", xscale="log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def _figure2a(series, alpha, path, seed):
    gen = torch.Generator().manual_seed(seed)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name in POLICIES:
        c = series[name]
        t = torch.arange(1, len(c) + 1)
        jitter = 0.02 * torch.randn(len(c), generator=gen, dtype=torch.float64)
        ax.scatter(t.numpy(), (c + jitter).numpy(), s=2, alpha=0.35, label=name)
    ax.axhline(series["threshold"], color="red", lw=1.5, label="threshold (1 - alpha) E[c | b]")
    ax.set(xlabel="time step", ylabel="E[c | a_t] (+ N(0, 0.02^2) jitter)", xscale="log",
           title=f"Expected constraint of each policy, one realisation, alpha = {alpha:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, markerscale=4)
    save_figure(fig, path)


def run(out, quick: bool = False, seed: int = 0, device: str | torch.device | None = None) -> dict:
    """Run the study and write results.json, CSVs, figures, report.md and models/ into ``out``.

    ``device``: where the problems, the models and the runs live (default the CPU; ``"cuda"``: the same
    problems, drawn per replication as on the CPU and moved, simulated on the GPU with its own random
    streams, so the figures agree with a CPU run in law, not number for number; issue 46)."""
    cfg = QUICK if quick else FULL
    device = torch.device("cpu") if device is None else torch.device(device)
    out = Path(out)
    timer = Timer()
    alphas, R, T, W = cfg["alphas"], cfg["replications"], cfg["horizon"], cfg["window"]
    results: dict = {}
    oracle: dict = {}
    fig2a: dict = {}
    fig2a_stats: dict = {}
    gaps: dict = {}
    fitted: dict = {}  # (alpha, policy) -> {role: model} at the end of the main runs
    for alpha in alphas:
        with timer("build problems"):
            env = daulton2019(replications=R, seed=seed, alpha=alpha, device=device)
        oracle[alpha] = _oracle(env)
        gaps[alpha] = float((env.optimal_reward - env.baseline_expected[:, 0]).mean())
        results[alpha] = {}
        for name in POLICIES:
            policy = make_study_policy(name, env, alpha, cfg["ridge"], cfg["delta"])
            with timer(f"simulate {name}"):
                trace = simulate(policy, env, T, seed=seed + 1)
            results[alpha][name] = _reduce(trace, env, W)
            fitted[(alpha, name)] = policy.models()
            if alpha == cfg["figure2a_alpha"]:
                r = cfg["figure2a_replication"]
                c = trace.expected[:, r, 1].clone()
                threshold = float((1 - alpha) * env.baseline_expected[r, 1])
                tail = slice(T - max(1, T // 10), T)  # the last 10% of the steps
                fig2a[name] = c
                fig2a["threshold"] = threshold
                fig2a_stats[name] = {
                    "last_10pct_below_threshold": float((c[tail] < threshold).double().mean()),
                    "last_10pct_distinct_actions": int(trace.actions[tail, r].unique().numel()),
                    "last_10pct_share_on_baseline": float((trace.actions[tail, r] == trace.baseline[tail, r]).double().mean()),
                }
            del trace, policy

    # TS-ASC's prior: sensitivity at one alpha
    sens_cfg = cfg["sensitivity"]
    sensitivity = {}
    env = daulton2019(replications=sens_cfg["replications"], seed=seed, alpha=sens_cfg["alpha"], device=device)
    for prior in ("weights", "ridge", "ridge-ts"):
        policy = make_study_policy("TS-ASC", env, sens_cfg["alpha"], cfg["ridge"], prior=prior)
        with timer("simulate sensitivity"):
            trace = simulate(policy, env, sens_cfg["horizon"], seed=seed + 1)
        sensitivity[prior] = _reduce(trace, env, W)["summary"]
        del trace

    # the baseline-rank variant that reproduces the paper's Figure 2b scale
    var_cfg = cfg["variant"]
    variant = {}
    for alpha in alphas:
        env = daulton2019(replications=var_cfg["replications"], seed=seed, alpha=alpha,
                          baseline_rank=var_cfg["baseline_rank"], device=device)
        policy = make_study_policy("TS-ASC", env, alpha, cfg["ridge"])
        with timer("simulate variant"):
            trace = simulate(policy, env, var_cfg["horizon"], seed=seed + 1)
        s = _reduce(trace, env, W)["summary"]
        m, e = _oracle(env)
        variant[alpha] = {"ts_asc": s["normalized_constraint_last100"], "oracle": {"mean": m, "sem": e},
                          "violation_rate_last100": s["violation_rate_last100"]}
        del trace

    table_2b = []
    for alpha in alphas:
        nc = results[alpha]["TS-ASC"]["summary"]["normalized_constraint_last100"]
        paper = PAPER_TABLE_2B.get(alpha, (None, None))
        table_2b.append({
            "alpha": alpha, "paper_mean": paper[0], "paper_sem": paper[1], "ours_mean": nc["mean"], "ours_sem": nc["sem"],
            "oracle_best_feasible_mean": oracle[alpha][0], "oracle_best_feasible_sem": oracle[alpha][1],
            "variant_ours_mean": variant[alpha]["ts_asc"]["mean"], "variant_ours_sem": variant[alpha]["ts_asc"]["sem"],
            "variant_oracle_mean": variant[alpha]["oracle"]["mean"], "variant_oracle_sem": variant[alpha]["oracle"]["sem"],
        })

    with atomic_output_dir(out, replace=True) as tmp:
        rows = []
        for alpha in alphas:
            for name in POLICIES:
                cols = {k: [round(x, 6) for x in v.tolist()] for k, v in results[alpha][name]["curves"].items()}
                rows += [{"alpha": alpha, "policy": name, "step": t + 1, **{k: v[t] for k, v in cols.items()}} for t in range(T)]
        write_csv(tmp / "steps.csv", rows)
        write_csv(tmp / "summary.csv", [
            {"alpha": alpha, "policy": name, **{
                (f"{k}_{kk}" if isinstance(v, dict) else k): (vv if isinstance(v, dict) else v)
                for k, v in results[alpha][name]["summary"].items()
                for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}}
            for alpha in alphas for name in POLICIES])
        write_csv(tmp / "table_2b.csv", table_2b)
        if fig2a:
            cols = {name: fig2a[name].tolist() for name in POLICIES}
            write_csv(tmp / "figure2a.csv", [{"step": t + 1, **{n: c[t] for n, c in cols.items()}, "threshold": fig2a["threshold"]}
                                             for t in range(T)])
        with timer("figures"):
            _figure1(results, alphas, "regret_mean", "regret_sem", "per-step regret",
                     "Figure 1a: per-step regret (mean, 2 SE)", tmp / "figure1a_regret.png", baseline=gaps)
            _figure1(results, alphas, "violation_pct_ma_mean", "violation_pct_ma_sem",
                     f"% instance-level violations ({W}-step moving average)",
                     "Figure 1b: moving average of instance-level violations (mean, 2 SE)", tmp / "figure1b_violations.png")
            if fig2a:
                _figure2a(fig2a, cfg["figure2a_alpha"], tmp / "figure2a_constraint.png", seed)
        info = {
            "study": NAME, "quick": quick, "seed": seed, "config": cfg, "device": str(device),
            "paper_table_2b": {str(a): {"mean": m, "sem": s} for a, (m, s) in PAPER_TABLE_2B.items()},
            "table_2b": table_2b,
            "figure2a": {"alpha": cfg["figure2a_alpha"], "replication": cfg["figure2a_replication"],
                         "threshold": fig2a.get("threshold"), **fig2a_stats},
            "summary": {str(a): {n: results[a][n]["summary"] for n in POLICIES} for a in alphas},
            "baseline_policy_per_step_regret": {str(a): gaps[a] for a in alphas},
            "oracle_best_feasible_normalized_constraint": {str(a): {"mean": oracle[a][0], "sem": oracle[a][1]} for a in alphas},
            "sensitivity_ts_asc_prior": sensitivity,
            "variant_baseline_rank": {"baseline_rank": var_cfg["baseline_rank"], **{str(a): v for a, v in variant.items()}},
            "seconds": {**timer.seconds, "total": timer.total, "total_cpu": timer.cpu},
        }
        atomic_write_json(tmp / "results.json", info)
        (tmp / "report.md").write_text(_report(info, cfg))
        for (alpha, name), models in fitted.items():
            save_models(models, tmp / "models", prefix=(f"alpha={alpha:g}", name))
    return info


def _fig2a_verdict(f: dict) -> str:
    ts, c = f.get("TS-ASC"), f.get("CLUCB2-ASC-C")
    if not ts or not c:
        return ""
    ts_ok = ts["last_10pct_below_threshold"] < 0.05
    c_mix = c["last_10pct_distinct_actions"] > 1 and 0 < c["last_10pct_below_threshold"] < 1
    return (("TS-ASC stays above the threshold" if ts_ok else "TS-ASC is below the threshold at times")
            + (" and CLUCB2-ASC-C mixes feasible and infeasible actions, as in the paper." if c_mix
               else "; CLUCB2-ASC-C does not show the paper's mixture in this realisation."))


def _report(info: dict, cfg: dict) -> str:
    alphas = cfg["alphas"]
    S = info["summary"]
    T, R = cfg["horizon"], cfg["replications"]
    lines = [
        f"# {NAME}: Daulton et al. (2019), section 4",
        "",
        f"{'QUICK smoke run (numbers not meaningful)' if info['quick'] else 'Full run'}: {R:,} realisations of the "
        f"`daulton2019` problem per alpha, horizon T = {T:,}, seed {info['seed']}; wall time "
        f"{info['seconds']['total'] / 60:.1f} min ({info['seconds']['total_cpu'] / 60:.1f} min of CPU)"
        f"{'' if info.get('device', 'cpu') == 'cpu' else ', run on ' + info['device']}. Regret is measured against the "
        "best *feasible* arm.",
        "",
        "## Choices where the paper is silent",
        "",
        f"* **Horizon T = {T:,}.** TS-ASC settles within ~1,000 steps, so its last-100-step numbers are those of its "
        "learned policy. CLUCB2-ASC-C leaves the baseline once its budget `alpha * n * r_b` covers the pessimistic cost "
        "of an unexplored arm (about 4 here): ~30 steps at alpha = 0.1, ~300 at 0.01, ~3,000 at 0.001, ~30,000 at 0.0001. "
        "A horizon of 30,000+ (Kazerouni's NeurIPS experiment used 40,000) does not fit the 15-minute budget with 1,000 "
        "realisations, three policies and four alphas, so at alpha = 0.0001 CLUCB2-ASC-C ends close to the baseline.",
        "* **Models.** CLUCB2-ASC-C/I: ridge estimate and Abbasi-Yadkori ellipsoid, `V = lambda I + X^T X`, lambda = 1, "
        "delta = 0.001, S = each realisation's true norm of the metric's parameter, r_l = 0. TS-ASC: conjugate Gaussian "
        "posterior with prior N(0, I / lambda), lambda = 1, known sigma = 0.1 (the distribution the parameters are drawn "
        "from). The other reading of \"Bayesian ridge, lambda = 1\", prior N(0, sigma^2/lambda I) = N(0, 0.01 I), "
        "makes TS-ASC under-explore; see the sensitivity table.",
        "* **CLUCB2 constraint direction.** Daulton's text prints the CLUCB2 constraint as "
        "`sum r_a <= (1 - alpha) sum r_b`, reversed; Algorithm 2 (line 10, `L_t >= (1 - alpha) R_t`) and Kazerouni's "
        "eq. (3) have `>=`, which is what we implement. CLUCB2-ASC-I checks "
        "`min_C <theta, x_a> >= (1 - alpha) max_C <theta, x_b>` (the two extremes separately, as in Algorithm 2).",
        "",
        "## Figure 1a: per-step regret",
        "",
        "[![Figure 1a](figure1a_regret.png)](figure1a_regret.png)",
        "",
    ]
    head = ["alpha", "policy", "per-step regret, last 100 (mean +- SEM)", "baseline policy", "steps on baseline",
            "violations, last 100", "violations, all steps", "eq. (3) on c holds at every step"]
    rows = []
    for a in alphas:
        for n in POLICIES:
            s = S[str(a)][n]
            rows.append([f"{a:g}", n, f"{fmt(s['per_step_regret_last100']['mean'], 3)} +- {fmt(s['per_step_regret_last100']['sem'], 3)}",
                         fmt(info["baseline_policy_per_step_regret"][str(a)], 3),
                         f"{100 * s['share_of_steps_on_baseline']['mean']:.1f}%",
                         f"{100 * s['violation_rate_last100']['mean']:.1f}%", f"{100 * s['violation_rate_all_steps']['mean']:.1f}%",
                         f"{100 * s['cumulative_constraint_eq3_all_steps_share']:.1f}% of realisations"])
    lines += [md_table(head, rows), ""]

    def sv(a, n, k):
        return S[str(a)][n][k]["mean"]

    big = max(alphas)
    ts_reg = [sv(a, "TS-ASC", "per_step_regret_last100") for a in alphas]
    c_reg = [sv(a, "CLUCB2-ASC-C", "per_step_regret_last100") for a in alphas]
    base = [info["baseline_policy_per_step_regret"][str(a)] for a in alphas]
    c_neg = [a for a, r in zip(alphas, c_reg) if r < 0]
    c_stuck = [a for a in alphas if sv(a, "CLUCB2-ASC-C", "share_of_steps_on_baseline_last100") > 0.5]
    c_vio_big = sv(big, "CLUCB2-ASC-C", "violation_rate_last100")
    c_stuck_share = ", ".join(f"{100 * sv(a, 'CLUCB2-ASC-C', 'share_of_steps_on_baseline_last100'):.0f}%" for a in c_stuck)

    def span(xs, digits):
        lo, hi = min(xs), max(xs)
        return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f} to {hi:.{digits}f}"
    lines += [
        "Paper: \"for all values of alpha, TS-ASC and CLUCB2-ASC-C achieve far lower regret compared to the baseline "
        "policy, whereas CLUCB2-ASC-I is extremely conservative and does not deviate far from the baseline policy.\"",
        "",
        f"* Ours, TS-ASC: final per-step regret {span(ts_reg, 3)} against the baseline policy's {span(base, 2)}"
        + (": far lower at every alpha, as in the paper." if max(ts_reg) < 0.1 * min(base) else ".")
        + (" (Slightly negative: TS-ASC now and then plays an infeasible arm whose reward beats the best feasible one.)"
           if min(ts_reg) < 0 else ""),
        "* Ours, CLUCB2-ASC-C: final per-step regret " + ", ".join(f"{r:.3f} (alpha = {a:g})" for a, r in zip(alphas, c_reg))
        + "."
        + (f" Negative at alpha = {', '.join(f'{a:g}' for a in c_neg)}: it buys reward with instance-level violations "
           "(Figure 1b)." if c_neg else "")
        + (f" At alpha = {', '.join(f'{a:g}' for a in c_stuck)} it is still on the baseline most of the time at the end "
           f"of the T = {T:,} steps "
           f"({c_stuck_share}); "
           "that is our horizon, not the algorithm: its exploration budget accrues at alpha * r_b per baseline step (see "
           "Choices). The paper's \"for all values of alpha\" implies a longer horizon than ours, or a tighter confidence "
           "set." if c_stuck else " It leaves the baseline at every alpha, as in the paper."),
        "* Ours, CLUCB2-ASC-I: on the baseline in "
        + ", ".join(f"{100 * sv(a, 'CLUCB2-ASC-I', 'share_of_steps_on_baseline'):.0f}%" for a in alphas)
        + " of steps (alpha = " + ", ".join(f"{a:g}" for a in alphas) + "): extremely conservative, as in the paper. "
        "Without any budget, an arm is certified only when its pessimistic constraint beats the baseline's optimistic one, "
        "and the directions the baseline does not explore keep a width of about `sqrt(lambda) S` forever.",
        "",
        "## Figure 1b: moving average of instance-level violations",
        "",
        "[![Figure 1b](figure1b_violations.png)](figure1b_violations.png)",
        "",
        "Paper: TS-ASC \"ultimately learns a policy that satisfies the instance-level constraint with high probability\", "
        "with \"only slightly more common constraint violation early\"; CLUCB2-ASC-C violates \"more than 40% of the time "
        "for larger values of alpha\"; CLUCB2-ASC-I always satisfies it.",
        "",
        "* Ours, TS-ASC: last-100-step violation rate "
        + ", ".join(f"{100 * sv(a, 'TS-ASC', 'violation_rate_last100'):.1f}%" for a in alphas)
        + " (alpha = " + ", ".join(f"{a:g}" for a in alphas) + "). Low but not zero, as the paper's section 4.5 says "
        "(\"TS-ASC occasionally violates the instance-level constraint for all evaluated values of alpha\"): once TS-ASC "
        "settles on an arm, the baseline's constraint is only learnt through the directions it plays, so a sampled "
        "baseline value can stay too low in a few realisations.",
        "* Ours, CLUCB2-ASC-C: " + ", ".join(f"{100 * sv(a, 'CLUCB2-ASC-C', 'violation_rate_last100'):.1f}%" for a in alphas)
        + f" over the last 100 steps: {'above 40% at alpha = ' + f'{big:g}' + ', as in the paper' if c_vio_big > 0.4 else 'below the paper' + chr(39) + 's 40% at alpha = ' + f'{big:g}'}"
        "; lower at the smallest alphas, where the small budget admits fewer infeasible plays by T. Its cumulative constraint (eq. 3 on the constraint metric) holds at every "
        "step in " + ", ".join(f"{100 * S[str(a)]['CLUCB2-ASC-C']['cumulative_constraint_eq3_all_steps_share']:.1f}%" for a in alphas)
        + " of realisations: the violations are instance-level only.",
        "* Ours, CLUCB2-ASC-I: " + ", ".join(f"{100 * sv(a, 'CLUCB2-ASC-I', 'violation_rate_all_steps'):.2f}%" for a in alphas)
        + " of steps violate (all steps): essentially never, as in the paper.",
        "",
        "## Figure 2a: expected constraint in one realisation",
        "",
        f"Realisation {cfg['figure2a_replication']} at alpha = {cfg['figure2a_alpha']:g}, with N(0, 0.02^2) jitter as in "
        "the paper (log time axis).",
        "",
        "[![Figure 2a](figure2a_constraint.png)](figure2a_constraint.png)",
        "",
        "Paper: TS-ASC quickly converges to a single action above the threshold; CLUCB2-ASC-C ends with a mixture of "
        "feasible and infeasible actions.",
        "",
        "Ours, over the last 10% of the steps of this realisation: "
        + "; ".join(f"{n}: {f['last_10pct_distinct_actions']} distinct action(s), "
                    f"{100 * f['last_10pct_below_threshold']:.0f}% of steps below the threshold, "
                    f"{100 * f['last_10pct_share_on_baseline']:.0f}% on the baseline"
                    for n, f in ((n, info['figure2a'][n]) for n in POLICIES if n in info['figure2a']))
        + ". " + _fig2a_verdict(info["figure2a"]) + " (The series are in `figure2a.csv`.)",
        "",
        "## Figure 2b: normalised expected constraint of TS-ASC, last 100 steps",
        "",
    ]
    head = ["alpha", "paper mean (SEM)", "ours: TS-ASC mean (SEM)", "best feasible arm (oracle)",
            f"variant (baseline rank {cfg['variant']['baseline_rank']}): TS-ASC", "variant: oracle"]
    rows = [[f"{r['alpha']:g}", f"{fmt(r['paper_mean'])} ({fmt(r['paper_sem'])})", f"{fmt(r['ours_mean'])} ({fmt(r['ours_sem'])})",
             f"{fmt(r['oracle_best_feasible_mean'])} ({fmt(r['oracle_best_feasible_sem'])})",
             f"{fmt(r['variant_ours_mean'])} ({fmt(r['variant_ours_sem'])})",
             f"{fmt(r['variant_oracle_mean'])} ({fmt(r['variant_oracle_sem'])})"] for r in info["table_2b"]]
    ours = [r["ours_mean"] for r in info["table_2b"]]
    paper = [r["paper_mean"] for r in info["table_2b"] if r["paper_mean"] is not None] or [float("nan")]
    oracle = [r["oracle_best_feasible_mean"] for r in info["table_2b"]]
    oracle_sd = max(r["oracle_best_feasible_sem"] for r in info["table_2b"]) * R**0.5
    variant = [r["variant_ours_mean"] for r in info["table_2b"]]
    variant_sem = [r["variant_ours_sem"] for r in info["table_2b"]]
    max_z = max((abs(r["variant_ours_mean"] - r["paper_mean"]) / (r["variant_ours_sem"] ** 2 + r["paper_sem"] ** 2) ** 0.5
                 for r in info["table_2b"] if r["paper_mean"] is not None), default=float("nan"))
    sems = [r["ours_sem"] for r in info["table_2b"]]
    rising = all(x <= y + e for x, y, e in zip(ours, ours[1:], sems[1:]))  # non-decreasing within one SEM
    flat = abs(ours[-1] - ours[-2]) < 2 * max(info["table_2b"][-1]["ours_sem"], 1e-12)
    above = all(r["ours_mean"] >= 1 - r["alpha"] for r in info["table_2b"])
    lines += [
        md_table(head, rows),
        "",
        f"* **Trend: {'reproduced' if rising and flat and above else 'partly reproduced'}.** Ours "
        f"{'rises (or stays flat)' if rising else 'does not rise monotonically'} as alpha falls ({' -> '.join(f'{x:.3f}' for x in ours)}), "
        f"{'is above' if above else 'is not always above'} 1 - alpha, and "
        f"{'is flat' if flat else 'is not flat'} between the two smallest alphas (their feasible sets are almost always "
        "the same arms).",
        f"* **Level: not reproduced ({min(ours):.2f} to {max(ours):.2f} against {min(paper):.2f} to {max(paper):.2f}), "
        "and the reason is the problem, not TS-ASC.** Under a literal reading of the generator (baseline = the 20th best "
        "arm by expected constraint among the 30 best by reward), the best feasible arm's normalised constraint averages "
        f"{min(oracle):.2f} to {max(oracle):.2f}, with a standard deviation of {oracle_sd:.2f} across realisations (a heavy "
        "right tail: the baseline's constraint value is low). The paper's SEM, 0.0097 over 1,000 realisations, implies a "
        f"standard deviation of {0.0097 * 1000 ** 0.5:.2f}: a much tighter distribution. With the baseline ranked "
        f"{cfg['variant']['baseline_rank']}th by constraint among the top 30 instead (the \"variant\" columns, TS-ASC "
        f"run {cfg['variant']['horizon']:,} steps on that problem), TS-ASC gives {' / '.join(f'{x:.3f}' for x in variant)}, "
        f"within {max_z:.1f} combined standard errors of the paper's numbers at every alpha, with SEMs "
        f"({min(variant_sem):.4f} to {max(variant_sem):.4f}) matching the paper's 0.0096-0.0097. So the paper's generator "
        "most likely picked a baseline with a higher constraint value than the literal reading does (a different sort "
        "order or index); we keep the literal reading for the main runs.",
        "* TS-ASC sits slightly below the oracle in the main runs because in a few realisations it settles on a "
        "feasible arm other than the best (or plays an infeasible one now and then).",
        "",
        "## Sensitivity: TS-ASC's prior (\"ridge, lambda = 1, Bayesian interpretation\")",
        "",
    ]
    sc = cfg["sensitivity"]
    sens = info["sensitivity_ts_asc_prior"]
    labels = {"weights": "N(0, I/lambda), sigma = 0.1 (main runs)", "ridge": "N(0, sigma^2/lambda I) = N(0, 0.01 I), sigma = 0.1",
              "ridge-ts": "ridge TS: N(theta_ridge, V^-1) (unit noise)"}
    rows = [[labels[k], f"{fmt(v['per_step_regret_last100']['mean'], 3)} +- {fmt(v['per_step_regret_last100']['sem'], 3)}",
             f"{100 * v['violation_rate_last100']['mean']:.1f}%", fmt(v["normalized_constraint_last100"]["mean"], 3)]
            for k, v in sorted(info["sensitivity_ts_asc_prior"].items(), key=lambda kv: list(labels).index(kv[0]))]
    lines += [
        f"alpha = {sc['alpha']:g}, {sc['replications']} realisations, T = {sc['horizon']:,}.",
        "",
        md_table(["TS-ASC prior", "per-step regret, last 100", "violations, last 100", "normalised constraint, last 100"], rows),
        "",
        "With the N(0, 0.01 I) prior the posterior in unexplored directions is pinned near 0 with standard deviation 0.1, "
        "while the true weights have standard deviation 1: TS-ASC under-explores"
        + (f" and keeps a per-step regret of {sens['ridge']['per_step_regret_last100']['mean']:.2f} at step "
           f"{sc['horizon']:,}, unlike the paper's Figure 1a; the prior the parameters are drawn from does not. Ridge TS "
           "(a 10x wider posterior) explores more and violates more."
           if sens["ridge"]["per_step_regret_last100"]["mean"] > sens["weights"]["per_step_regret_last100"]["mean"] + 0.05
           else "; in this run the difference in regret is small."),
        "",
        *wall_time_section(info["seconds"]),
        "",
        "Outputs: `results.json` (every number above), `summary.csv`, `table_2b.csv`, `steps.csv` (per-step means and "
        "SEMs of every curve), `figure2a.csv`, and the PNG figures. (The copy under `docs/reports/` keeps the report, "
        "`results.json`, the small CSV tables and the figures; `steps.csv` and `figure2a.csv` are in the run's output "
        "directory.)",
        "",
    ]
    return "\n".join(lines)
