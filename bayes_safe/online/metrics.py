"""Live guardrail metrics of a served Decider, read from its decision log (``GET /metrics``).

``GuardrailMonitor`` reads the feedback the log gained since its last read (``DecisionLog.
feedback_rows_after``: O(new rows) per read, the whole log once at the first) and keeps running
sums, per metric the policy learns (the reward, then one per constraint model; named by the
policy's ``metric_names``, else ``reward``, ``constraint0``, ...):

* **served**: the mean of the logged metric over every decision with feedback: what the served
  policy has achieved, with a 95 % interval. A metric whose values all lie in [0, 1] (a 0/1 harm,
  a click) gets the Clopper-Pearson interval of its sum over its rows (exact for a 0/1 metric:
  never outside [0, 1], never of zero width, at least nominal coverage at a rate of 1 % over a few
  hundred rows, where ``mean +- 1.96 sd / sqrt(n)`` gives ``[0, 0]`` or a negative bound); any
  other metric the normal ``mean +- 1.96 sd / sqrt(n)``;
* **baseline**: the always-baseline policy's mean, estimated off-policy from the same rows by
  self-normalised IPS: a row counts with weight ``1 / propensity`` when the logged action was
  the decision's baseline (``probabilities[baseline] == propensity`` then), 0 otherwise;
  rows without a logged baseline are left out. A metric in [0, 1] gets the betting interval of
  self-normalised IPS that ``bayes_safe.offline.estimate_metrics`` gives
  (``bayes_safe.offline.intervals.snips_interval``, the largest logged weight as its range): valid
  at rare rates and few matched rows, inside [0, 1], of non-zero width; the monitor keeps the
  matched rows' weights and values for it (16 bytes a row) and computes it again only when rows
  came. Any other metric gets the delta-method interval,
  ``+- 1.96 sqrt(sum w^2 (c - est)^2) / sum w``.
* per declared constraint (``TSASC(constraints=...)``, or ``alpha``: the relative constraint
  ``E[c] >= (1 - alpha) E[c | baseline]`` of each constraint model), the **limit** the served
  mean must stay above (``at_least``) or below (``at_most``): the **declared** business limit
  (``Constraint.declared_bound``; ``x`` the baseline estimate for a relative constraint), and the
  **policy bound** the policy enforces (``Constraint.bound``: the declared limit, or a tuned one
  such as ``at_most=0.02 + t`` from ``policy_constraint(c, t)``). Both are exported, equal when the
  constraint is untuned: ``bayes_safe_guardrail_limit`` (alert on it) and
  ``bayes_safe_guardrail_policy_bound``.

An operator alerts on a guardrail with e.g. ``bayes_safe_guardrail_served_high <
bayes_safe_guardrail_limit`` (an ``at_least`` constraint whose served interval lies wholly
below its limit). The estimates run over the whole log (every decision since the log began),
so they move slowly once the log is long; a new process (a restart) reads the log again from
its start. ``feedback delay`` (seconds from a decision to its feedback) is a histogram of the
same rows. Outcomes that arrive metric by metric (issue 45) count where they are known: a
metric not known yet is left out of its estimate (never counted as 0), and
``bayes_safe_outcomes_pending{metric}`` says how many logged decisions still wait for it. Models that detect changes (adaptive forgetting, issue 43) export their alarms,
``bayes_safe_drift_alarms_total{metric}``, and the observations learned since the last one,
``bayes_safe_drift_observations_since_change{metric, arm}``. The Prometheus objects (a per-app
``CollectorRegistry``, so apps and tests never share one) are built by ``registry(service)``.
"""

from __future__ import annotations

import json
import math
import threading
from array import array

__all__ = ["DELAY_BUCKETS", "GuardrailMonitor", "clopper_pearson", "registry"]

#: feedback delay histogram buckets, seconds (1 s to a week)
DELAY_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0, 7 * 86400.0)
_Z = 1.959963984540054  # the normal 97.5 % quantile: 95 % intervals


def metric_names(policy) -> list[str]:
    """The names of the metrics ``policy`` learns: the reward's, then one per constraint model."""
    C = int(getattr(policy, "num_constraints", 0))
    names = getattr(policy, "metric_names", None)
    if names is not None and len(names) == C + 1:
        return [str(n) for n in names]
    return ["reward", *(f"constraint{j}" for j in range(C))]


def guardrails(policy) -> list[dict]:
    """The policy's constraints as ``{"metric", "index", "bound", "declared", "relative", "direction"}``
    (``index``: 0 the reward, ``j + 1`` constraint model ``j``; ``bound`` the policy's, ``declared`` the
    declared business limit, equal unless the constraint's tolerance was tuned), declared ones or those
    of ``alpha``."""
    names = metric_names(policy)
    declared = getattr(policy, "constraints", None)
    out = []
    if declared:
        for j, c in enumerate(declared):
            index = names.index(c.metric) if getattr(policy, "metric_names", None) and c.metric in names else j + 1
            declared_bound = getattr(c, "declared_bound", c.bound)
            out.append({"metric": names[index], "index": index, "bound": float(c.bound),
                        "declared": float(declared_bound), "relative": bool(c.versus_baseline),
                        "direction": "at_most" if c.at_most else "at_least"})
        return out
    alpha = getattr(policy, "alpha", None)
    if alpha is None or not int(getattr(policy, "num_constraints", 0)):
        return out
    alphas = [float(a) for a in (alpha.tolist() if hasattr(alpha, "tolist") else alpha)]
    alphas = alphas if isinstance(alphas, list) else [alphas]
    for j in range(int(policy.num_constraints)):
        a = alphas[j] if j < len(alphas) else alphas[0]
        out.append({"metric": names[j + 1], "index": j + 1, "bound": 1.0 - a, "declared": 1.0 - a, "relative": True,
                    "direction": "at_least"})
    return out


def clopper_pearson(successes: float, trials: float, level: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson interval of a rate from ``successes`` of ``trials`` (both may be non-integer: an
    effective sample size): ``Beta`` quantiles, ``(0, upper)`` at 0 successes, ``(lower, 1)`` at all."""
    from scipy.special import betaincinv

    x, n = float(successes), float(trials)
    if not n > 0:
        return math.nan, math.nan
    x = min(max(x, 0.0), n)
    a = (1 - float(level)) / 2
    low = 0.0 if x <= 0 else float(betaincinv(x, n - x + 1, a))
    high = 1.0 if x >= n else float(betaincinv(x + 1, n - x, 1 - a))
    return low, high


class _Sums:
    """Running sums of one metric: on-policy (served) and self-normalised IPS (baseline)."""

    __slots__ = ("bv", "bw", "cached", "hi", "lo", "n", "nb", "s", "ss", "w", "w2", "w2c", "w2cc", "wc")

    def __init__(self):
        self.n = self.s = self.ss = 0.0
        self.w = self.wc = self.w2 = self.w2c = self.w2cc = 0.0
        self.nb = 0  # rows behind the baseline estimate (the baseline played)
        self.lo, self.hi = math.inf, -math.inf  # the values' range: a metric in [0, 1] gets exact intervals
        self.bw, self.bv = array("d"), array("d")  # the matched rows' weights and values (the betting interval)
        self.cached = None  # (rows, (est, low, high)) of the last betting interval

    @property
    def unit(self) -> bool:
        """Whether every value seen lies in [0, 1] (a 0/1 metric, a share)."""
        return self.n > 0 and self.lo >= 0.0 and self.hi <= 1.0

    def add(self, value: float, baseline_weight: float | None) -> None:
        self.n += 1
        self.lo, self.hi = min(self.lo, value), max(self.hi, value)
        self.s += value
        self.ss += value * value
        if baseline_weight:
            w = baseline_weight
            self.nb += 1
            self.w += w
            self.wc += w * value
            self.w2 += w * w
            self.w2c += w * w * value
            self.w2cc += w * w * value * value
            self.bw.append(w)
            self.bv.append(value)

    def served(self) -> tuple[float, float, float]:
        if not self.n:
            return math.nan, math.nan, math.nan
        mean = self.s / self.n
        if self.unit:
            return (mean, *clopper_pearson(self.s, self.n))
        var = max(self.ss / self.n - mean * mean, 0.0) * self.n / max(self.n - 1, 1)
        half = _Z * math.sqrt(var / self.n)
        return mean, mean - half, mean + half

    def baseline(self) -> tuple[float, float, float]:
        if not self.w:
            return math.nan, math.nan, math.nan
        est = self.wc / self.w
        if self.unit:
            if self.cached is None or self.cached[0] != self.nb:
                import torch

                from ..offline.intervals import snips_interval

                w = torch.frombuffer(self.bw, dtype=torch.float64)
                v = torch.frombuffer(self.bv, dtype=torch.float64)
                _, low, high = snips_interval(w, v, w_max=float(w.max()))
                self.cached = (self.nb, (float(low), float(high)))
            return (est, *self.cached[1])
        num = max(self.w2cc - 2 * est * self.w2c + est * est * self.w2, 0.0)
        half = _Z * math.sqrt(num) / self.w
        return est, est - half, est + half


class GuardrailMonitor:
    """Running per-metric estimates and feedback delays from a ``DecisionLog`` (module docstring).

    Args:
        log: the served Decider's ``DecisionLog``.
        policy: the served policy (its metric names and constraints).
        on_delay: called with each feedback delay in seconds as rows are read (the histogram).
    """

    def __init__(self, log, policy, on_delay=None):
        self.log = log
        self.names = metric_names(policy)
        self.guardrails = guardrails(policy)
        self.on_delay = on_delay
        self.rowid = 0
        self.outcome_rowid = 0  # the late outcomes' watermark (``DecisionLog.outcome_rows_after``)
        self.rows = 0
        self.decisions = 0  # decisions logged at the last update: a metric's pending count is this less its rows
        self.sums = [_Sums() for _ in self.names]
        self._lock = threading.Lock()

    def update(self) -> int:
        """Read the feedback logged since the last update; returns how many rows."""
        with self._lock:
            read = 0
            self.decisions = len(self.log)
            while True:  # constraint outcomes reported apart from their reward (issue 45)
                late = self.log.outcome_rows_after(self.outcome_rowid)
                if not late:
                    break
                for rowid, metric, value, d_time, action, propensity, baseline in late:
                    self.outcome_rowid = rowid
                    if d_time is None or not 0 <= metric < len(self.sums) - 1:
                        continue
                    w = 1.0 / propensity if baseline is not None and action == baseline and propensity > 0 else None
                    self.sums[1 + metric].add(float(value), w)
            while True:
                rows = self.log.feedback_rows_after(self.rowid)
                if not rows:
                    return read
                for rowid, f_time, reward, constraints, d_time, action, propensity, baseline in rows:
                    self.rowid = rowid
                    if d_time is None:  # feedback whose decision the log lacks: nothing to join
                        continue
                    self.rows += 1
                    read += 1
                    if self.on_delay is not None:
                        self.on_delay(max(f_time - d_time, 0.0))
                    w = 1.0 / propensity if baseline is not None and action == baseline and propensity > 0 else None
                    self.sums[0].add(float(reward), w)
                    if constraints is not None and len(self.sums) > 1:
                        try:
                            values = json.loads(constraints)
                        except ValueError:
                            continue
                        for s, v in zip(self.sums[1:], values):
                            if v is not None:  # (null: not known when the reward came; a later row has it)
                                s.add(float(v), w)

    def estimates(self) -> list[dict]:
        """Per metric: ``{"metric", "served": (mean, low, high), "baseline": (...), "rows", "baseline_rows"}``."""
        with self._lock:
            return [{"metric": name, "served": s.served(), "baseline": s.baseline(), "rows": int(s.n),
                     "baseline_rows": int(s.nb), "pending": max(self.decisions - int(s.n), 0)}
                    for name, s in zip(self.names, self.sums)]

    def limits(self) -> list[dict]:
        """Per guardrail: its ``metric``, ``direction``, ``limit`` (the declared business limit in the metric's
        units) and ``policy_bound`` (the bound the policy enforces; equal to ``limit`` unless tuned); NaN for a
        relative one while the baseline has no estimate."""
        est = {e["metric"]: e for e in self.estimates()}
        out = []
        for g in self.guardrails:
            base = est[g["metric"]]["baseline"][0]
            scale = base if g["relative"] else 1.0
            out.append(g | {"limit": g["declared"] * scale, "policy_bound": g["bound"] * scale})
        return out


def registry(service):
    """A Prometheus ``CollectorRegistry`` of ``service`` (a ``bayes_safe.online.serve.Service``), the
    function to call before each scrape (reads the new log rows) and the one that closes its log reader. Counters and gauges are read
    from the Decider at scrape time; nothing is added to a decision's path."""
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    reg = CollectorRegistry()
    delay = Histogram("bayes_safe_feedback_delay_seconds", "Seconds from a decision to its feedback (from the log)",
                      buckets=DELAY_BUCKETS, registry=reg)
    from .log import DecisionLog

    # a connection of its own, read-only: in WAL mode its reads never wait for the service's writes
    # nor hold them up (the first read of a long log takes a while)
    reader = DecisionLog(service.log.path, read_only=True)
    monitor = GuardrailMonitor(reader, service.decider.policy, on_delay=delay.observe)

    class _Collector:
        def collect(self):
            d = service.decider
            replica = getattr(service, "replica", False)
            if replica:  # counters of this replica (a dashboard sums them over the replicas)
                yield CounterMetricFamily("bayes_safe_decisions", "Decisions made by this replica since it started",
                                          value=d.decided)
                yield CounterMetricFamily("bayes_safe_feedback_received",
                                          "Feedback accepted by this replica since it started", value=d.received)
                yield GaugeMetricFamily("bayes_safe_log_seq", "The log's feedback row this replica's posterior has "
                                        "learned up to", value=d.log_seq)
                yield CounterMetricFamily("bayes_safe_replica_repairs",
                                          "Times this replica found its posterior did not hold exactly the log's rows "
                                          "up to its watermark and rebuilt it (docs/replicas.md)",
                                          value=getattr(d, "repairs", 0))
            else:
                pending, queued = len(d.pending), len(d.queued)
                yield CounterMetricFamily("bayes_safe_decisions", "Decisions made by this Decider (its id counter)",
                                          value=d.next_id)
                yield CounterMetricFamily("bayes_safe_feedback_received",
                                          "Decisions whose feedback was received (decisions - pending)",
                                          value=d.next_id - pending)
            yield CounterMetricFamily("bayes_safe_feedback_duplicates",
                                      "Feedback acknowledged and ignored (the decision had feedback), since the start",
                                      value=service.duplicates)
            yield CounterMetricFamily("bayes_safe_feedback_refused",
                                      "Feedback requests refused (unknown decision id, bad values), since the start",
                                      value=service.bad_feedback)
            if not replica:  # (a replica's log holds what waits: no replica knows it alone)
                yield GaugeMetricFamily("bayes_safe_feedback_pending", "Decisions still waiting for feedback",
                                        value=pending)
                yield GaugeMetricFamily("bayes_safe_feedback_queued",
                                        "Feedback received, not yet applied to the posterior", value=queued)
            yield GaugeMetricFamily("bayes_safe_model_version", "Feedback rows (a replica) or batches the posterior "
                                    "has learned from", value=d.model_version)
            yield GaugeMetricFamily("bayes_safe_last_snapshot_timestamp_seconds",
                                    "Unix time of the last snapshot of the state (0: none yet)",
                                    value=service.last_snapshot or 0.0)
            if getattr(d, "fallback_guards", None) is not None:  # a policy that can fall back (issue 39)
                yield CounterMetricFamily("bayes_safe_fallback_decisions",
                                          "Decisions that played the policy's fallback (no action was allowed), counted "
                                          "by this process since it started", value=d.fallbacks)
                bound = CounterMetricFamily("bayes_safe_fallback_decisions_by_constraint",
                                            "Fallback decisions a declared constraint bound (the played action not "
                                            "judged to meet it), by this process since it started",
                                            labels=["constraint", "metric", "guard"])
                for g, (c, n) in enumerate(zip(d.policy.fallback_constraints, d.fallbacks_by)):
                    bound.add_metric([str(g), str(getattr(c, "metric", "")), d.fallback_guards[g]], n)
                yield bound
            outliers = getattr(d, "outliers", None)
            if outliers is not None and d.outlier_sd is not None:  # the outlier guard (issue 40)
                refused = CounterMetricFamily("bayes_safe_feedback_outliers",
                                              "Outcomes the outlier guard refused (more than outlier_sd posterior "
                                              "predictive sd from the model's prediction), by this process since it "
                                              "started", labels=["metric"])
                for m, n in enumerate(outliers):
                    refused.add_metric(["reward" if m == 0 else f"constraint{m - 1}"], n)
                yield refused
            drift = getattr(d, "drift_alarms", None)
            if drift:  # models with adaptive forgetting (issue 43)
                alarms = CounterMetricFamily("bayes_safe_drift_alarms",
                                             "Changes the metric's model detected (adaptive forgetting: each alarm "
                                             "restarted its posterior from its base prior), since the model was made "
                                             "(saved with it; the same on every replica at the same log row)",
                                             labels=["metric"])
                for name, n in drift.items():
                    alarms.add_metric([name], n)
                yield alarms
                since = GaugeMetricFamily("bayes_safe_drift_observations_since_change",
                                          "Observations the metric's model (one per arm: arm) learned since its last "
                                          "detected change (or since it was made)", labels=["metric", "arm"])
                for name, counts in d.drift_observations.items():
                    for arm, n in enumerate(counts):
                        since.add_metric([name, str(arm) if len(counts) > 1 else ""], n)
                yield since
            families = {}
            for key, doc in (("served", "the served policy's mean of the logged metric"),
                             ("baseline", "the always-baseline policy's mean, self-normalised IPS from the log")):
                for part, what in (("", ""), ("_low", ", 95 % interval low"), ("_high", ", 95 % interval high")):
                    name = f"bayes_safe_guardrail_{key}{part}"
                    families[name] = GaugeMetricFamily(name, doc[0].upper() + doc[1:] + what, labels=["metric"])
            rows = GaugeMetricFamily("bayes_safe_guardrail_rows", "Log rows behind each estimate",
                                     labels=["metric", "policy"])
            for e in monitor.estimates():
                for key in ("served", "baseline"):
                    for part, value in zip(("", "_low", "_high"), e[key]):
                        families[f"bayes_safe_guardrail_{key}{part}"].add_metric([e["metric"]], value)
                rows.add_metric([e["metric"], "served"], e["rows"])
                rows.add_metric([e["metric"], "baseline"], e["baseline_rows"])
            yield from families.values()
            yield rows
            pending = GaugeMetricFamily("bayes_safe_outcomes_pending", "Decisions logged whose outcome of this metric "
                                        "is not known yet (left out of the estimates above, never counted as 0)",
                                        labels=["metric"])
            for e in monitor.estimates():
                pending.add_metric([e["metric"]], e["pending"])
            yield pending
            labels = ["constraint", "metric", "direction", "form"]
            limits = GaugeMetricFamily("bayes_safe_guardrail_limit",
                                       "The declared business limit a constraint holds the served mean to (relative: "
                                       "the declared factor x the baseline estimate; absolute: the declared level); "
                                       "a tuned tolerance does not move it", labels=labels)
            bounds = GaugeMetricFamily("bayes_safe_guardrail_policy_bound",
                                       "The bound the served policy enforces for a constraint (its tuned bound; the "
                                       "declared limit when untuned), in the metric's units", labels=labels)
            for j, g in enumerate(monitor.limits()):
                key = [str(j), g["metric"], g["direction"], "relative" if g["relative"] else "absolute"]
                limits.add_metric(key, g["limit"])
                bounds.add_metric(key, g["policy_bound"])
            yield limits
            yield bounds

    reg.register(_Collector())
    return reg, monitor.update, reader.close
