"""Coverage of off-policy intervals for a rare harm (issue 39): the betting intervals against the bootstrap.

Logs: ``bayes_safe.offline.synthetic.rare_harm_logs`` (public and seeded: a deterministic target whose
actions the logging policy plays 4-6.25 % of the time, 5 % on average; a 0/1 harm at a true rate of 0.5, 1
or 2 % under the target, twice that under the other actions; 500 to 20,000 rows, so 25 to 1,000 matched
rows and an effective sample size of tens at the small sizes). For every setting, 200 logs (``--logs``),
and per estimator (IPS, SNIPS, DR with a cross-fitted per-action mean model) and interval method:

* ``betting``: ``bayes_safe.offline.intervals`` (the default of ``estimate_metrics`` for a 0/1 metric),
  ``w_max`` the largest weight of each log's rows (``estimators.max_weight``' default);
* ``bootstrap``: the percentile bootstrap over rows, what ``estimate_metrics`` gave before (``--boot``
  resamples);

the coverage of the true rate by the nominal 95 % interval, the mean width, the share of zero-width
intervals and the share reaching outside [0, 1]. The reward (0/1, 30 % under the target) is in the
table too, once per number of rows (it does not depend on the harm rate): a metric with plenty of
matched events, where the bootstrap is honest.

Target (issue 39): >= 93 % coverage at nominal 95 % for every estimator at every rare-rate setting.

Run: ``python benchmarks/rare_harm.py`` (every setting; the bootstrap reference at 20,000 rows takes most of
the time: ``--rows 20000 --boot 200`` shortens it), ``--quick`` (500 and 2,000 rows, rate 1 %: 91 s on 2 cores
at a load average of 8-9), ``--rows``, ``--rates`` to pick settings. Measured 2026-11-28 on the 2-core machine
shared with other jobs (load 8-10): every betting interval of the harm covered in 99.5-100 % of logs, none of
zero width or outside [0, 1]; the bootstrap 13-82 % at 500 and 2,000 rows (500 rows at 0.5 %: 13 %; 2,000
rows at 1 %: 61 %, 39 % of intervals [0, 0]; DR's below 0 in 70-97 %). Widths of the harm's betting intervals:
0.20-0.23 at 500 rows, 0.058-0.086 at 2,000, 0.013-0.032 at 20,000 (1.6-1.9 times the bootstrap's there,
where the bootstrap, 200 resamples, covers 91.5-96.5 %: the price of a guarantee at every size). The
500/2,000-row settings ran with 1,000 resamples (all of them in 12 minutes), the 20,000-row ones with
``--rows 20000 --boot 200`` (695 s).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bayes_safe.offline.intervals import dr_interval, ips_interval, snips_interval
from bayes_safe.offline.synthetic import rare_harm_logs
from bayes_safe.threads import single_thread

TARGET = 0.93


def observed_w_max(w: torch.Tensor, p_target: torch.Tensor) -> torch.Tensor:
    """``[L]`` the largest weight of each log's rows (``max_weight``'s default), ``1 / min p`` with no match."""
    top = w.amax(-1)
    return torch.where(top > 0, top, 1.0 / p_target.amin(-1))


def dr_terms(w: torch.Tensor, r: torch.Tensor, matched: torch.Tensor):
    """``[L, n]`` DR terms with a two-fold cross-fitted model ``q(a)`` = the harm's mean per kind of action
    (the target's / another) on the other fold (one pseudo-row at the fold's overall rate), and ``(q_t
    [L, 2], fold [n])`` to bound them."""
    n = r.shape[-1]
    fold = torch.arange(n) % 2
    q_t = torch.zeros(r.shape[0], 2, dtype=torch.float64)
    for f in (0, 1):
        other = fold != f
        rate = r[:, other].mean(-1)
        m = matched[:, other].to(torch.float64)
        q_t[:, f] = ((r[:, other] * m).sum(-1) + rate) / (m.sum(-1) + 1)
    q = q_t[:, fold]                       # [L, n] the model's value of the target's action (= dm for a deterministic target)
    return q + w * (r - q), q_t


def bootstrap(num: torch.Tensor, den: torch.Tensor | None, n_boot: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L]`` percentile bootstrap 95 % bounds of ``sum num / sum den`` per log (rows resampled)."""
    L, n = num.shape
    den = torch.ones_like(num) if den is None else den
    g = torch.Generator().manual_seed(seed)
    lows, highs = [], []
    chunk = max(1, 2_000_000 // n)
    for i in range(L):
        stats = []
        done = 0
        while done < n_boot:
            b = min(chunk, n_boot - done)
            idx = torch.randint(n, (b, n), generator=g)
            stats.append(num[i][idx].sum(1) / den[i][idx].sum(1))
            done += b
        s = torch.cat(stats)
        s = s[torch.isfinite(s)]
        if s.numel() == 0:
            lows.append(float("nan"))
            highs.append(float("nan"))
            continue
        q = torch.quantile(s, torch.tensor([0.025, 0.975], dtype=torch.float64))
        lows.append(float(q[0]))
        highs.append(float(q[1]))
    return torch.tensor(lows, dtype=torch.float64), torch.tensor(highs, dtype=torch.float64)


def summarise(low, high, truth) -> dict:
    ok = torch.isfinite(low) & torch.isfinite(high)
    return {"coverage": float((ok & (low <= truth) & (truth <= high)).double().mean()),
            "width": float(torch.where(ok, high - low, torch.zeros_like(low)).mean()),
            "zero": float((~ok | (high - low <= 0)).double().mean()),
            "outside": float((ok & ((low < 0) | (high > 1))).double().mean())}


def run_setting(n_rows: int, rate: float, n_logs: int, n_boot: int, seed: int, reward: bool = True) -> list[dict]:
    """The table rows of one setting (``reward``: the reward's rows too; they do not depend on the harm rate)."""
    logs = rare_harm_logs(n_logs, n_rows, rate, seed=seed)
    w = logs.weights
    matched = w > 0
    w_max = observed_w_max(w, logs.p_target)
    rows = []
    metrics = [("harm", logs.harm, logs.rate)] + ([("reward", logs.reward, logs.reward_rate)] if reward else [])
    for metric, r, truth in metrics:
        terms, q_t = dr_terms(w, r, matched)
        t_lo = torch.minimum((q_t * (1 - w_max[:, None])).amin(-1), terms.amin(-1))
        t_hi = torch.maximum((q_t + w_max[:, None] * (1 - q_t)).amax(-1), terms.amax(-1))
        for est in ("ips", "snips", "dr"):
            start = time.perf_counter()
            if est == "ips":
                _, lo, hi = ips_interval(w, r, w_max=w_max, seed=seed)
            elif est == "snips":
                _, lo, hi = snips_interval(w, r, w_max=w_max, seed=seed)
            else:
                _, lo, hi = dr_interval(terms, term_range=(t_lo, t_hi), seed=seed)
            rows.append({"rows": n_rows, "rate": truth, "metric": metric, "estimator": est, "method": "betting",
                         "seconds": time.perf_counter() - start, **summarise(lo, hi, truth)})
            start = time.perf_counter()
            with single_thread():
                num, den = {"ips": (w * r, None), "snips": (w * r, w), "dr": (terms, None)}[est]
                lo, hi = bootstrap(num, den, n_boot, seed)
            rows.append({"rows": n_rows, "rate": truth, "metric": metric, "estimator": est, "method": "bootstrap",
                         "seconds": time.perf_counter() - start, **summarise(lo, hi, truth)})
    rows.append({"matched": float(matched.sum(-1).double().mean()),
                 "ess": float(((w.sum(-1) ** 2) / (w * w).sum(-1).clamp_min(1e-300)).mean()), "rows": n_rows,
                 "rate": logs.rate})
    return rows


def run(quick: bool = False) -> list[dict]:
    """``benchmarks/run.py`` rows (``--only rare_harm``): the lowest coverage of the betting intervals of the
    harm over the settings, per estimator, against the 93 % target."""
    sizes = (500, 2000) if quick else (500, 2000, 20000)
    rates = (0.01,) if quick else (0.005, 0.01, 0.02)
    worst: dict[str, float] = {}
    for n in sizes:
        for rate in rates:
            for r in run_setting(n, rate, 200, 200 if quick else 1000, 0, reward=False)[:-1]:
                if r["method"] == "betting":
                    worst[r["estimator"]] = min(worst.get(r["estimator"], 1.0), r["coverage"])
    return [{"benchmark": f"rare_harm {est} betting coverage (worst setting)", "value": 100 * cov, "unit": "%",
             "target": f">= {100 * TARGET:.0f} %", "ratio": cov / TARGET} for est, cov in worst.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="500 and 2,000 rows at 1 %% only")
    ap.add_argument("--logs", type=int, default=200, help="simulated logs per setting (default 200)")
    ap.add_argument("--boot", type=int, default=None, help="bootstrap resamples (default 1000; --quick 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, nargs="*", default=None, help="logged rows per log (default 500 2000 20000)")
    ap.add_argument("--rates", type=float, nargs="*", default=None, help="true harm rates (default 0.005 0.01 0.02)")
    args = ap.parse_args(argv)
    sizes = tuple(args.rows or ((500, 2000) if args.quick else (500, 2000, 20000)))
    rates = tuple(args.rates or ((0.01,) if args.quick else (0.005, 0.01, 0.02)))
    n_boot = args.boot or (400 if args.quick else 1000)
    print(f"rare-harm intervals: {args.logs} logs per setting, nominal 95 %, bootstrap {n_boot} resamples; "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    failures = []
    start = time.perf_counter()
    for n in sizes:
        for k, rate in enumerate(rates):
            rows = run_setting(n, rate, args.logs, n_boot, args.seed, reward=k == 0)
            info = rows.pop()
            print(f"\n{n:,} rows, harm rate {100 * info['rate']:.1f} %: {info['matched']:.1f} matched rows on "
                  f"average, effective sample size {info['ess']:.1f}", flush=True)
            print(f"  {'metric':7s} {'estimator':9s} {'interval':9s} {'coverage':>8s} {'width':>8s} {'zero':>6s} "
                  f"{'outside':>7s} {'seconds':>7s}")
            for r in rows:
                print(f"  {r['metric']:7s} {r['estimator']:9s} {r['method']:9s} {100 * r['coverage']:7.1f}% "
                      f"{r['width']:8.4f} {100 * r['zero']:5.1f}% {100 * r['outside']:6.1f}% {r['seconds']:7.2f}",
                      flush=True)
                if r["method"] == "betting" and (r["coverage"] < TARGET or r["zero"] > 0 or r["outside"] > 0):
                    failures.append(r)
    print(f"\ndone in {time.perf_counter() - start:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
    if failures:
        print(f"BELOW TARGET (betting: coverage >= {TARGET:.0%}, no zero width, inside [0, 1]): "
              + "; ".join(f"{r['rows']} rows {r['metric']} {r['estimator']}" for r in failures))
        return 1
    print(f"every betting interval: coverage >= {TARGET:.0%}, no zero width, inside [0, 1]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
