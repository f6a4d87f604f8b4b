"""Tune a served TS-ASC from its decision log: an offline problem for ``bayes_safe.tuning``.

```python
from bayes_safe.online.tuning import LoggedAlpha
from bayes_safe.tuning import ABTest, Study

problem = LoggedAlpha("decisions.sqlite", "state")      # the log and the state the service wrote
study = Study(ABTest(problem, replicates=1), storage="tuned.sqlite", seed=0)
study.run(6, inline=True)
```

Each trial is TS-ASC (Daulton et al. 2019, Algorithm 1) with the trial's parameters on the
posterior of the saved state (its reward and constraint models), evaluated off-policy on the
logged decisions with feedback: its probability of every action at each decision (the
propensities ``policy.action_probabilities`` estimates from posterior draws), then
self-normalised IPS with the logged propensities (``bayes_safe.offline.estimators``). What a
trial tunes and checks is the served policy's own family:

**Declared constraints** (a TS-ASC built with ``constraints=``: ``bayes_safe.envs.Constraint``
declarations, with ``metric_names`` or one per constraint model). The study reads them from the
state and

* tunes one parameter per declared constraint, ``tolerance_<metric>`` (the helpers of
  ``bayes_safe.tuning.own_problem``, as ``tune custom`` does for a simulated problem): the trial
  policy keeps ``policy_constraint(c, t)``, the slack around the declared limit in every form
  (``bayes_safe.envs.tolerance``): the factor or level ``c + t`` (``at_most``) or ``c - t``
  (``at_least``), with the declaration's
  ``confidence``; the default range is ``default_range(c)``, which holds the served setting;
* checks every declared constraint with an outcome constraint in its own form and direction,
  on the trial policy's off-policy estimate of the guarded metric (the metric's logged values
  weighted like the reward: ``estimate_value(..., values=)``):

  - ``absolute(m, at_most=v)`` -> ``m <= v``, ``absolute(m, at_least=v)`` -> ``m >= v``: ``m``
    is the metric's SNIPS mean under the trial policy (an adverse-event rate, say);
  - ``relative(m, at_most=c)`` -> ``m_ratio <= c``, ``relative(m, at_least=c)`` ->
    ``m_ratio >= c``: ``m_ratio`` is that mean over the mean of always playing each decision's
    logged baseline (``estimate_ratio``: the betting interval of a rate's ratio, else a paired bootstrap
    over the same rows); the study-level
    reading of the per-context ``E[c | x, a] >= c E[c | x, b]`` (s.3.1);

  a guardrail on the reward is checked like any other (``efficacy_ratio >= 0.8``: a metric of
  its own, not the objective). A chance constraint's ``confidence`` stays in the trial policy;
  the outcome constraint is on the estimated level, whose standard error Ax's feasibility
  accounts for. The outcome constraint is on the **declared** limit (``Constraint.declared_bound``):
  a served state whose constraint was tuned (``policy_constraint(c, t)``, e.g. ``at_most=0.02 + t``)
  is checked against the business cap it was declared with, and its tolerances are measured from
  that cap (``_served_tolerances`` gives back the served bound);
* gives every 0/1 (or [0, 1]) metric the betting interval of ``bayes_safe.offline.intervals`` (valid at
  rare rates and few matched decisions; the standard error Ax receives is its larger half-width over
  1.96). Replicates of a trial re-estimate the same rows (``replicates_share_rows``): they do not
  shrink the standard error. A log bounds a metric's mean, not the share of units above a cap
  (``report_notes``);
* reports ``reward`` (the objective: the SNIPS value), for every guarded metric ``m`` its level
  ``m`` and ``baseline_m`` (always the logged baseline), ``m_ratio`` for a relative one, the
  level of every other metric the log carries, and ``unsupported``: the share of the trial
  policy's choices (its mean probability) on actions the served policy gave no chance at that
  decision (a logged probability of 0 in the served policy's ``num_draws`` draws). Importance
  weighting cannot see those choices (positivity): the estimates describe the rest, so a
  setting riskier than the served one looks safer than it is. Hence the default outcome
  constraint ``unsupported <= max_unsupported`` (0.05): a trial the log cannot estimate is
  infeasible, not "best". Measured on the dose-finding problem of the tests (TS-ASC with
  ``adverse_event <= 0.05`` and ``efficacy >= 0.8 x baseline``, a Gaussian AE model): on a
  log of 1,200 decisions whose posterior was updated every 50, a trial with the cap loosened
  to 0.35 had 55 % of its choices unsupported and an estimated AE rate of 0.037 against a true
  0.077 (below the cap: it would have been called feasible); on 1,000 decisions served from
  the prior (posterior updated once, at the end) the same trial had 1 % unsupported and an
  estimate of 0.073 (true 0.077), and the three trials of the test stayed under 2 %.

**alpha** (a TS-ASC built with ``alpha``; and a legacy study, below): the trial is TS-ASC at the
trial's ``alpha`` in ``[0, alpha_max]``; ``constraint{j}_ratio`` is its mean of constraint metric
``j`` over that of always playing the logged baseline (TS-ASC's own rule is "at least
``1 - alpha`` of the baseline's"), and the default outcome constraint is
``constraint0_ratio >= min_ratio`` (0.9).

What cannot be estimated is refused before any trial, in one line naming it: a guarded metric
the log's feedback does not carry (or carries with missing values), a policy that is not TS-ASC,
a served TS-ASC whose propensities cannot be computed (its models do not broadcast posterior
draws) or whose declared ``confidence`` it cannot honour, decisions without a logged baseline.

Studies made before the declared constraints were read (their stored settings hold
``alpha_max`` and ``min_ratio``) resume as they ran: the alpha study, with a
``LegacyAlphaWarning`` when the served policy declares constraints the alpha study ignores.

The log and the state must belong together: the log is read (SQLite file or PostgreSQL URL, read-only)
and checked against the state before anything else (``bayes_safe.online.replica.saved_policy``, the checks
``Decider.load`` and ``ReplicaDecider.load`` make), so a state that never wrote the log is refused in
one line naming both. The state may be a one-process service's or a replica's (its snapshot's posterior).

The logged contexts must be the decisions' candidate features (what ``Decider`` logs when it is
given candidates ``[K, d]``), and every decision must have logged a baseline. Decisions may have
different numbers of candidates: the log is read padded to the largest (``DecisionLog.to_logged_data``;
a trial's probability of the padding is 0). A trial's probabilities come from
``Policy.row_probabilities``: many decisions per call for conjugate and NUTS / SVI models of one
stream, one at a time for chain engines (Gibbs, Langevin).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..envs.ab_problem import ABProblem

__all__ = ["LegacyAlphaWarning", "LoggedAlpha", "logged_metrics"]

#: what ``tune`` may be (None: from the served policy)
TUNE_MODES = ("alpha", "constraints")


class LegacyAlphaWarning(UserWarning):
    """An alpha study of a served TS-ASC that declares constraints: the study ignores them."""


def _safe(name: str) -> str:
    """A metric name Ax accepts (letters, digits, underscores)."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(name))


def logged_metrics(policy, frame) -> dict[str, np.ndarray]:
    """The metrics a decision log's feedback carries, by the served policy's names.

    ``{name: values [N]}`` for the decisions with feedback (``frame``:
    ``DecisionLog.to_dataframe(with_feedback_only=True)``): the reward under the reward's name
    (``policy.metric_names[0]``, else ``"reward"``), then constraint model ``j``'s values (the
    feedback's ``constraints[j]``) under ``metric_names[j + 1]``, else the metric of the ``j``-th
    declared constraint, else ``constraint{j}``. A value the feedback lacks is NaN. Pass them
    to ``bayes_safe.offline.estimate_metrics`` with ``DecisionLog.target_probabilities`` to
    estimate every logged metric of another policy.
    """
    names = _model_metric_names(policy)
    out = {names[0]: frame["reward"].to_numpy(np.float64)}
    lists = frame["constraints"].tolist()
    for j, name in enumerate(names[1:]):
        out[name] = np.array([float(c[j]) if c is not None and len(c) > j and c[j] is not None else np.nan
                              for c in lists], dtype=np.float64)
    return out


def _model_metric_names(policy) -> list[str]:
    """The metric each model of ``policy`` learns: the reward's first (module docstring of ``logged_metrics``)."""
    C = len(policy.constraint_models)
    named = getattr(policy, "metric_names", None)
    if named is not None:
        return [str(n) for n in named]
    declared = getattr(policy, "constraints", None)
    if declared is not None and len(declared) == C:
        return ["reward", *(str(c.metric) for c in declared)]
    return ["reward", *(f"constraint{j}" for j in range(C))]


class LoggedAlpha(ABProblem):
    """A served TS-ASC tuned from its decision log (module docstring).

    Args:
        log: the ``DecisionLog`` the service wrote: its file (``.sqlite``) or its PostgreSQL URL
            (``postgresql://user@host:port/db``: one service's, or the log replicas share). A URL is
            shown and stored (``config``) without its password: a resumed study connects with
            ``PGPASSWORD`` or ``~/.pgpass``.
        state: the state directory whose TS-ASC posterior the trials use: saved by the service
            (``Decider.save``) or by one of the replicas (``ReplicaDecider``); read only. The log must
            be that state's (``bayes_safe.online.replica.saved_policy``: its ``decider_id``, its
            decisions, the feedback a replica's posterior learned): a ``StateError`` naming both otherwise.
        alpha_max: the alpha study's search space ``alpha in [0, alpha_max]`` (default 0.5).
        min_ratio: the alpha study's outcome constraint ``constraint0_ratio >= min_ratio``
            (default 0.9).
        num_draws: Monte-Carlo draws per decision for the trial policy's probabilities.
        n_boot: bootstrap resamples for the estimates' standard errors.
        max_unsupported: declared constraints only: the outcome constraint ``unsupported <=
            max_unsupported`` (a share in [0, 1], default 0.05; None: no such constraint, the
            share is still reported).
        tune: ``"constraints"`` (the declared constraints' tolerances, under the declared
            bounds), ``"alpha"`` (TS-ASC's alpha, replacing any declared constraints), or None
            (default): ``"constraints"`` when the served TS-ASC declares constraints, else
            ``"alpha"``. With None, a served policy that declares constraints and an
            ``alpha_max`` or ``min_ratio`` is a stored study from before: the alpha study, with a
            ``LegacyAlphaWarning``.
    """

    name = "decision-log-alpha"
    offline = True
    #: replicates of a trial re-estimate the same logged rows (only the Thompson draws differ): ``ABTest``
    #: combines them without dividing the standard error by their number (``combine_replicates``)
    replicates_share_rows = True
    objective = "reward"
    surface = None
    trial_noun = "trials"
    observed_label = "estimate"
    trial_work = "off-policy estimation"
    report_intro = ("Bayesian optimisation of a served TS-ASC's alpha from its decision log: each trial "
                    "estimates, by self-normalised IPS, the value and the constraint ratios of TS-ASC at the "
                    "trial's alpha on the posterior the service learned.")

    def __init__(self, log, state, *, alpha_max: float | None = None, min_ratio: float | None = None,
                 num_draws: int = 200, n_boot: int = 200, max_unsupported: float | None = 0.05,
                 tune: str | None = None):
        from ..state import StateError
        from .log import DecisionLog, is_log_url, log_location
        from .replica import saved_policy

        try:
            self.log_path = log_location(log)  # a PostgreSQL URL: a LogURL, which prints without its password
        except ValueError as exc:
            raise ValueError(f"log: {str(exc).removeprefix('path: ')}") from None
        if not is_log_url(self.log_path) and not self.log_path.is_file():
            raise FileNotFoundError(f"log: no such decision log {str(self.log_path)!r}")
        self.state_path = Path(state)
        for key, value in (("num_draws", num_draws), ("n_boot", n_boot)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: expected a positive int, got {value!r}")
        if tune is not None and tune not in TUNE_MODES:
            raise ValueError(f"tune: expected None, 'alpha' or 'constraints', got {tune!r}")
        if alpha_max is not None and not 0 < float(alpha_max) <= 1:
            raise ValueError(f"alpha_max: expected a number in (0, 1], got {alpha_max!r}")
        if max_unsupported is not None and (isinstance(max_unsupported, bool) or not 0 <= float(max_unsupported) <= 1):
            raise ValueError(f"max_unsupported: expected None or a share in [0, 1], got {max_unsupported!r}")
        self.num_draws, self.n_boot = num_draws, n_boot
        self.max_unsupported = None if max_unsupported is None else float(max_unsupported)
        # everything is read and checked here, before any trial: the log first (read-only), then the state's
        # policy, after checking that this log was written by that state (one-process or replica: saved_policy)
        try:
            self.log = DecisionLog(self.log_path, read_only=True)
        except ValueError as exc:
            raise ValueError(f"log: {str(exc).removeprefix('path: ')}") from None
        try:
            policy = saved_policy(self.state_path, log=self.log)
        except StateError as exc:
            self.log.close()
            text = str(exc)
            raise StateError(f"log: {text}" if text.startswith(str(self.log_path)) else text) from None
        except BaseException:
            self.log.close()
            raise
        if not all(hasattr(policy, a) for a in ("reward_model", "constraint_models", "alpha")):
            raise ValueError(f"state: {self.state_path} holds a {type(policy).__name__}, not TS-ASC")
        self.policy = policy
        declared = getattr(policy, "constraints", None)
        mode = self._mode(tune, declared, alpha_max, min_ratio)
        self.tune = mode
        self._explicit_alpha = tune == "alpha"
        try:
            self.data = self.log.to_logged_data()
            frame = self.log.to_dataframe(with_feedback_only=True)
        except ValueError as exc:
            raise ValueError(f"log: {exc}") from None
        if frame["baseline"].isna().any():
            raise StateError(f"log: {self.log_path} has decisions without a logged baseline; TS-ASC needs one")
        self.baselines = frame["baseline"].to_numpy(np.int64)
        if mode == "alpha":
            self._init_alpha(frame, 0.5 if alpha_max is None else alpha_max, 0.9 if min_ratio is None else min_ratio)
        else:
            self._init_constraints(frame, declared)

    # ------------------------------------------------------------------ setup
    def _mode(self, tune, declared, alpha_max, min_ratio) -> str:
        given = [k for k, v in (("alpha_max", alpha_max), ("min_ratio", min_ratio)) if v is not None]
        if tune == "alpha":
            return "alpha"
        if tune == "constraints":
            if declared is None:
                raise ValueError(f"tune: the TS-ASC in {self.state_path} has alpha and no declared constraints; "
                                 "its family is tuned by alpha (tune='alpha' or None)")
            if given:
                raise ValueError(f"{given[0]}: applies to the alpha study only; the declared constraints' bounds are "
                                 "the outcome constraints of tune='constraints'")
            return "constraints"
        if declared is None:
            return "alpha"
        if given:
            text = "; ".join(c.describe() for c in declared)
            warnings.warn(f"{given[0]}: applies to a TS-ASC built with alpha; the TS-ASC in {self.state_path} declares "
                          f"constraints ({text}), and this alpha study replaces them by alpha and checks only "
                          "constraint0_ratio >= min_ratio; leave alpha_max and min_ratio out to tune and check the "
                          "declared constraints", LegacyAlphaWarning, stacklevel=3)
            return "alpha"
        return "constraints"

    def _init_alpha(self, frame, alpha_max, min_ratio) -> None:
        from ..state import StateError

        self.min_ratio = float(min_ratio)
        self.parameters = ({"name": "alpha", "low": 0.0, "high": float(alpha_max)},)
        C = len(self.policy.constraint_models)
        if frame["constraints"].map(lambda c: c is None or len(c) != C).any():
            raise StateError(f"log: {self.log_path} has feedback without the {C} constraint value(s) of the policy")
        self.constraints = np.array(frame["constraints"].tolist(), dtype=np.float64).reshape(len(frame), C)
        # (None, a constraint still pending (issue 45), reads as NaN: its estimate uses the rows where it is known)
        self.pending = {f"constraint{j}": int(np.isnan(self.constraints[:, j]).sum()) for j in range(C)}
        self.outcome_constraints = (f"constraint0_ratio >= {self.min_ratio}",) if C else ()
        try:  # the rows of self.data, parsed once (not at every trial); contexts that are not candidates fail a trial
            self._candidates = self._parse_candidates(frame)
        except ValueError as exc:
            self._candidates, self._candidates_error = None, str(exc)

    def _init_constraints(self, frame, declared) -> None:
        from ..envs.tolerance import _numbered, default_range, tolerance_name

        policy = self.policy
        self.declared = tuple(declared)
        names = _model_metric_names(policy)
        values = logged_metrics(policy, frame)
        reward_name = names[0]
        for c in self.declared:
            if c.metric not in names:
                raise ValueError(f"state: the served TS-ASC's constraint `{c.describe()}` is on {c.metric!r}, a metric "
                                 f"the log does not carry (it logs {', '.join(names)}); it cannot be estimated off-policy")
            col = values[c.metric]
            missing = ~np.isfinite(col)
            if missing.all():  # (some missing: outcomes still pending, issue 45; estimated from the known rows)
                ids = frame["decision_id"].to_numpy()[missing][:5].tolist()
                where = "the reward" if c.metric == reward_name else f"constraints[{names.index(c.metric) - 1}]"
                raise ValueError(f"log: {self.log_path} has no value of {c.metric!r} ({where} of the feedback) for "
                                 f"any of its {len(col)} decisions (e.g. {ids}: pending); the constraint "
                                 f"`{c.describe()}` cannot be estimated off-policy from it yet")
        self.tolerance_names = _numbered([tolerance_name(c) for c in self.declared])
        # tolerances are around the declared limit (a served policy whose tolerance was tuned keeps it in
        # Constraint.declared); the default range holds the served setting
        served = self._served_tolerances()
        ranges = []
        for c, n in zip(self.declared, self.tolerance_names):
            r = default_range(c.as_declared())
            t = served[n]
            ranges.append({**r, "name": n, "low": min(r["low"], round(t, 10)), "high": max(r["high"], round(t, 10))})
        self.parameters = tuple(ranges)
        # the metrics: every logged metric's level; a guarded one also its baseline level and, if relative, its ratio
        # a metric logged for some rows: estimated from the rows where it is known (an outcome still pending,
        # issue 45, is missing, never 0); ``pending`` counts those rows per metric
        self.values = {m: v for m, v in values.items() if np.isfinite(v).any()}
        self.pending = {m: int((~np.isfinite(v)).sum()) for m, v in self.values.items()}
        self.level_names = {m: self._level_name(m) for m in self.values}
        guarded = list(dict.fromkeys(c.metric for c in self.declared))
        self.ratio_metrics = list(dict.fromkeys(c.metric for c in self.declared if c.versus_baseline))
        outcome = []
        for c in self.declared:
            op = "<=" if c.at_most else ">="
            metric = f"{_safe(c.metric)}_ratio" if c.versus_baseline else self.level_names[c.metric]
            # the declared business limit, not a tuned policy bound the served state may hold
            outcome.append(f"{metric} {op} {c.declared_bound:.10g}")
        if self.max_unsupported is not None:
            outcome.append(f"unsupported <= {self.max_unsupported:.10g}")
        self.outcome_constraints = tuple(outcome)
        self._metric_names = ("reward", *[self.level_names[m] for m in self.values if m != reward_name or m in guarded],
                              *[f"baseline_{self.level_names[m]}" for m in guarded],
                              *[f"{_safe(m)}_ratio" for m in self.ratio_metrics], "unsupported")
        if len(set(self._metric_names)) != len(self._metric_names):
            raise ValueError(f"state: the served TS-ASC's metric names {names} give the study clashing metric names "
                             f"{list(self._metric_names)}; rename the metrics")
        self.report_intro = (
            "Bayesian optimisation of a served TS-ASC's constraint tolerances from its decision log: each trial is "
            "TS-ASC with the declared constraints at the trial's tolerances on the posterior the service learned, and "
            "its reward and guarded metrics are estimated off-policy from the log (self-normalised IPS), each "
            "declared constraint checked in its own form and direction.")
        self.tuned_text = "TS-ASC constraint tolerances"
        self.name = "decision-log-constraints"  # the study's default name (the alpha study keeps "decision-log-alpha")
        self._candidates = self._parse_candidates(frame)
        self._probe()

    @staticmethod
    def _level_name(metric: str) -> str:
        """The study's name of a metric's level (``reward_level`` when it would clash with the objective)."""
        name = _safe(metric)
        return "reward_level" if name == "reward" else name

    def _parse_candidates(self, frame) -> tuple:
        """``(features [N, K_max, d], num_actions [N])``: the logged candidates, padded with zero rows past
        each decision's ``num_actions`` (``DecisionLog.to_logged_data``)."""
        import torch

        from .log import _padded_candidates

        features = torch.from_numpy(_padded_candidates(frame, self.log_path, np.float64))
        return features, torch.tensor(frame["num_actions"].to_numpy(np.int64))

    def _target(self, parameters: Mapping):
        """The trial's TS-ASC: the declared constraints at the trial's tolerances, on copies of the served models."""
        from ..envs.tolerance import policy_constraint
        from ..policies import TSASC

        p = self.policy
        cons = [policy_constraint(c, parameters[n]) if n in parameters else c
                for c, n in zip(self.declared, self.tolerance_names)]
        # copies: a chain model advances when sampled, and a trial is a pure function of (parameters, seed)
        return TSASC(copy.deepcopy(p.reward_model), copy.deepcopy(list(p.constraint_models)), constraints=cons,
                     metric_names=getattr(p, "metric_names", None), fallback=getattr(p, "fallback", "safest"),
                     confidence_draws=getattr(p, "confidence_draws", 64))

    def _served_tolerances(self) -> dict[str, float]:
        """The tolerances that give back the served policy's bounds (``policy_constraint(c, t)`` keeps ``c.bound``
        with ``c.declared_bound`` as the declared limit): the bound's distance from the declared limit, in
        every form (``bayes_safe.envs.tolerance``; 0 for an untuned constraint)."""
        return {n: c.bound - c.declared_bound if c.at_most else c.declared_bound - c.bound
                for c, n in zip(self.declared, self.tolerance_names)}

    def _probe(self) -> None:
        """One decision's probabilities under the served setting: a policy whose propensities or
        confidence cannot be computed is refused here, in one line, before any trial."""
        try:
            target = self._target(self._served_tolerances())
            # two decisions: a chain model may draw once and fail on its next batch (issue 27)
            self._probabilities(target, num_draws=min(self.num_draws, 8), seed=0, rows=2)
        except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
            text = " ".join(str(exc).split())
            what = ("cannot honour its declared confidence" if "confidence" in text else
                    "cannot give the propensities of its decisions")
            raise ValueError(f"state: the served TS-ASC in {self.state_path} {what} ({type(exc).__name__}: {text}); "
                             "the log cannot be used to tune it") from None

    def _probabilities(self, target, *, num_draws: int, seed: int, rows: int | None = None):
        """``[N, K]`` the trial policy's probability of every action at each logged decision with feedback
        (``K`` the largest number of candidates; 0 past a decision's own): ``target.row_probabilities``,
        many rows per call where the models allow it, else one decision at a time."""
        import torch

        if self._candidates is None:  # the alpha study of a log whose contexts are not candidates
            raise ValueError(self._candidates_error)
        features, sizes = self._candidates
        baselines = torch.tensor(self.baselines)
        probs, _ = target.row_probabilities(features[:rows], baselines[:rows], num_actions=sizes[:rows],
                                            num_draws=num_draws, seed=int(seed))
        return probs

    # ------------------------------------------------------------------ metadata
    def config(self) -> dict:
        """How ``bayes_safe.tuning.make_problem`` rebuilds this problem (``tune resume``): the two
        paths, absolute, and the settings."""
        base = {"name": "decision-log", "log": str(self.log_path.resolve()), "state": str(self.state_path.resolve())}
        if self.tune == "constraints":
            return {**base, "tune": "constraints", "num_draws": self.num_draws, "n_boot": self.n_boot,
                    "max_unsupported": self.max_unsupported}
        out = {**base, "alpha_max": float(self.parameters[0]["high"]), "min_ratio": self.min_ratio,
               "num_draws": self.num_draws, "n_boot": self.n_boot}
        if self._explicit_alpha:
            out["tune"] = "alpha"
        return out

    def metric_names(self) -> tuple[str, ...]:
        if self.tune == "constraints":
            return self._metric_names
        return ("reward", *(f"constraint{j}_ratio" for j in range(self.constraints.shape[1])))

    def known_parameters(self) -> tuple[str, ...]:
        return tuple(self.tolerance_names) if self.tune == "constraints" else ("alpha",)

    def check_parameters(self, ranges: Sequence) -> None:
        super().check_parameters(ranges)
        if self.tune != "constraints":
            return
        by_name = dict(zip(self.tolerance_names, self.declared))
        for r in ranges:
            c = by_name.get(r.name)
            if c is None or not c.versus_baseline:
                continue
            if not c.at_most and r.high >= c.bound:
                raise ValueError(f"parameter {r.name!r}: the factor {c.bound:g} - t of `{c.describe()}` must stay > 0; "
                                 f"expected an upper bound < {c.bound:g}, got {r.high}")
            if c.at_most and r.low <= -c.bound:
                raise ValueError(f"parameter {r.name!r}: the factor {c.bound:g} + t of `{c.describe()}` must stay > 0; "
                                 f"expected a lower bound > {-c.bound:g}, got {r.low}")

    def tuned_label(self, ab_test) -> str:
        return self.tuned_text if self.tune == "constraints" else "TS-ASC alpha"

    def describe(self, ab_test) -> str:
        text = (f"decision log `{self.log_path}` ({len(self.data)} decisions with feedback), the posterior of "
                f"`{self.state_path}`; {self.num_draws} draws per decision for the trial policy's probabilities")
        if self.tune == "constraints":
            checks = ", ".join(f"`{c.describe()}` as `{o}`" for c, o in zip(self.declared, self.outcome_constraints))
            text += f"; declared constraints checked off-policy: {checks}"
            if self.max_unsupported is not None:
                text += (f"; a trial with more than {self.max_unsupported:.0%} of its choices where the served policy "
                         "gave no chance (`unsupported`) is infeasible: the log cannot estimate it")
        return text

    def report_notes(self) -> str:
        """Markdown for the study's report: what a log study can and cannot tell (issue 39), and what its
        standard errors are. For ``bayes_safe.tuning.report`` to include under the study's description."""
        limits = (
            "**What the decision log can and cannot tell.** Each trial's metrics are off-policy estimates from "
            f"the {len(self.data)} logged decisions with feedback: the log bounds a metric's **mean** under the "
            "trial policy (an adverse-event *rate*), not the **share of units above a cap** (how many patients get a "
            "dose above the limit, how many users see more than a given number of hidden items). A setting the log "
            "calls feasible can still give many units a value above a cap: check that share in simulation before "
            "serving it (`bayes-safe tune custom --problem module:Class` with the problem's `max_violations`, or "
            "`bayes_safe.simulate` and `Constraint.violated`).")
        errors = (
            "**Standard errors.** A rate's interval is the betting confidence interval of "
            "`bayes_safe.offline.intervals` (valid at rare rates and few matched decisions; never outside [0, 1]); "
            "the standard error given to Ax is its larger half-width over 1.96. Replicates of a trial re-estimate "
            "the same logged rows (only the Thompson draws differ), so they do not shrink the standard error: one "
            "replicate per trial (`--replicates 1`) is enough, more only cost time.")
        lines = [limits, "", errors]
        if self.tune == "constraints" and any(c.tuned for c in self.declared):
            tuned = "; ".join(c.describe() for c in self.declared if c.tuned)
            lines += ["", (f"**Declared limits.** The served policy keeps tuned bounds ({tuned}); the study's outcome "
                           "constraints are the declared limits and its tolerances are measured from them.")]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ the trial
    def estimate(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        """``{metric: (mean, sem)}`` of the trial's TS-ASC (module docstring)."""
        if self.tune == "constraints":
            from ..threads import single_thread

            with single_thread():  # many tiny tensor operations: one thread (a loaded machine: 9x faster)
                return self._estimate_constraints(parameters, seed)
        import torch

        from ..offline.estimators import estimate_value
        from ..policies import TSASC

        alpha = float(parameters["alpha"])
        target = TSASC(self.policy.reward_model, self.policy.constraint_models, alpha=alpha)
        # the rows read when the problem was made (the rows of self.data, parsed once, not at every trial)
        probs = self._probabilities(target, num_draws=self.num_draws, seed=int(seed)).to(torch.float64)
        boot = max(2, self.n_boot)
        # the intervals of bayes_safe.offline.estimators: betting for a bounded metric, the bootstrap otherwise
        value = estimate_value(probs, self.data, "snips", n_boot=boot, seed=int(seed))
        out = {"reward": (value.value, value.se)}
        for j in range(self.constraints.shape[1]):
            try:
                e = _ratio_estimate(*_known_rows(probs, self.baselines, self.data, self.constraints[:, j]), boot,
                                    int(seed))
            except ValueError:
                continue  # the baseline's mean of the metric is 0 on these rows: no ratio
            out[f"constraint{j}_ratio"] = (e.value, e.se)
        return out

    def _estimate_constraints(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        import torch

        from ..offline.estimators import estimate_value

        target = self._target({k: float(v) for k, v in parameters.items()})
        probs = self._probabilities(target, num_draws=self.num_draws, seed=int(seed))
        baseline = torch.nn.functional.one_hot(torch.tensor(self.baselines), self.data.n_actions).to(torch.float64)
        reward_name = _model_metric_names(self.policy)[0]
        boot = max(2, self.n_boot)
        out: dict[str, tuple[float, float]] = {}
        value = estimate_value(probs, self.data, "snips", values=self.values[reward_name], n_boot=boot, seed=seed)
        out["reward"] = (value.value, value.se)
        guarded = {c.metric for c in self.declared}
        for m, v in self.values.items():
            name = self.level_names[m]
            p, _, data, known = _known_rows(probs, None, self.data, v)
            if name in self._metric_names:
                e = value if m == reward_name else estimate_value(p, data, "snips", values=known, n_boot=boot,
                                                                  seed=seed)
                out[name] = (e.value, e.se)
            if m in guarded:
                b = estimate_value(_known_rows(baseline, None, self.data, v)[0], data, "snips", values=known,
                                   n_boot=boot, seed=seed)
                out[f"baseline_{name}"] = (b.value, b.se)
        for m in self.ratio_metrics:
            try:
                e = _ratio_estimate(*_known_rows(probs, self.baselines, self.data, self.values[m]), boot, int(seed))
            except ValueError:
                continue  # the baseline's mean of m is 0 on these rows: no ratio (the trial reports the levels)
            out[f"{_safe(m)}_ratio"] = (e.value, e.se)
        # positivity: the trial's probability on actions the served policy gave no chance (logged probability 0)
        blind = (probs * (self.data.logging_probs.to(torch.float64) <= 0)).sum(1)
        out["unsupported"] = (float(blind.mean()), float(blind.std() / len(blind) ** 0.5) if len(blind) > 1 else 0.0)
        return out

    def __getstate__(self):  # a trial in a worker process opens the log again
        state = self.__dict__.copy()
        state["log"] = None
        return state

    def __setstate__(self, state):
        from .log import DecisionLog

        self.__dict__.update(state)
        self.log = DecisionLog(self.log_path, read_only=True)


def _known_rows(probs, baselines, data, values):
    """``(probs, baselines, data, values)`` of the rows whose metric is known: an outcome still pending (NaN;
    issue 45) is missing, not 0. Inverse propensity weighting on a subset of logged rows chosen by when their
    outcome arrives (not by the action) estimates the target policy on those rows' contexts."""
    keep = np.isfinite(np.asarray(values, dtype=np.float64))
    if keep.all():
        return probs, baselines, data, values
    idx = np.flatnonzero(keep)
    return (probs[idx], None if baselines is None else baselines[idx], data.subset(idx),
            np.asarray(values, dtype=np.float64)[idx])


def _ratio_estimate(probs, baselines, data, values, n_boot: int, seed: int):
    """``estimate_ratio`` (SNIPS, against always the logged baseline) for a trial: its betting interval when
    the metric is a rate, unless the baseline's mean cannot be told from 0 on these rows (an infinite upper
    bound, which Ax cannot take as a standard error): then the paired bootstrap's."""
    import math

    from ..offline.estimators import estimate_ratio

    e = estimate_ratio(probs, baselines, data, values, "snips", n_boot=n_boot, seed=seed)
    if not math.isfinite(e.se):
        e = estimate_ratio(probs, baselines, data, values, "snips", n_boot=n_boot, seed=seed, interval="bootstrap")
    return e
