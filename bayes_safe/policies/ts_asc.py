"""Thompson Sampling with Auxiliary Safety Constraints (TS-ASC).

Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 3.2 and Algorithm 1. Each step:

1. draw one joint model sample ``f~_t`` (reward and every constraint metric);
2. the feasible set ``A_feas = {a : f~^(c)(x, a) >= (1 - alpha) f~^(c)(x, b_t)}`` for every
   constraint metric (several metrics: the paper's footnote 1 / section 5.3, an action must
   satisfy all of them);
3. play ``argmax_{a in A_feas} f~^(r)(x, a)``.

Constraint forms beyond the paper's (``constraints=``, ``bayes_safe.envs.Constraint``
declarations): the feasibility test of step 2 becomes ``Constraint.satisfied(f~_k, f~_b)`` of
the sampled values ``f~_k = f~^(m)(x, a_k)`` and ``f~_b = f~^(m)(x, b_t)`` of the guarded metric:

* ``relative(m, at_least=c)``: ``f~_k >= c f~_b`` (with ``c = 1 - alpha`` the paper's test,
  section 3.1's ``E[c_t | x_t, a_t] >= (1 - alpha) E[c_t | x_t, b_t]`` and section 3.2's
  ``A_feas``);
* ``relative(m, at_most=c)``: ``f~_k <= c f~_b``, for a lower-is-better metric
  (unsubscribes at most ``c`` times the baseline's);
* ``absolute(m, at_least=l)`` / ``absolute(m, at_most=l)``: ``f~_k >= l`` / ``f~_k <= l``.

Which metric a constraint guards. Without ``metric_names`` (as before): one constraint per
constraint model, in order. With ``metric_names`` (the reward's name first, then one per
constraint model) constraints are matched to models by ``Constraint.metric``: any number of
them, a metric may carry several or none, and the reward may be guarded. A guardrail on the
reward is judged on the reward's own draw ``f~^(r)`` of step 3 (the one the argmax uses), so
the guard and the choice see one sampled model, as Algorithm 1 samples one ``f~_t`` (line 4).

The baseline (departures from the papers, which always keep ``b_t`` feasible: Daulton et al.
are silent in Algorithm 1 and seed the feasible set with ``b_t`` in Algorithm 2, CLUCB2-ASC,
line 6; Kazerouni et al. 2017, Algorithm 1, play ``b_t`` whenever the optimistic action is not
safe). Their constraints are relative, and ``b_t`` cannot break a bound relative to its own
value; we keep the exemption for *relative* constraints only (a sampled
``f~^(c)(x, b_t) < 0`` would otherwise fail ``f~_b >= (1 - alpha) f~_b``). Under an *absolute*
constraint the baseline is judged like any action (a standard dose can itself break an
adverse-event cap). The baseline stays a candidate even where ``valid`` excludes it, as
before. When a row allows no action:

* ``fallback="baseline"`` plays ``b_t`` (the papers' rule: CLUCB's conservative play, the
  seed of Algorithm 2's feasible set);
* ``fallback="safest"`` (default: a dosing user expects the safest dose, not a standard dose
  that may itself break the cap) plays the candidate (``valid`` actions and the baseline) most
  likely to meet the constraints. Precisely:

  1. with chance constraints: the candidate with the highest estimated probability of meeting
     every chance constraint, the product of their ``P(constraint met)`` (as if independent;
     the baseline's probability under a relative one is 1). The chance constraints are the
     ones declared with a probability, so they decide; single-draw constraints only break
     ties (frequent with Monte-Carlo estimates, which are multiples of ``1 / S``) as below;
  2. without chance constraints (single-draw mode): the candidate whose sampled values break
     the bounds by the least, the total *shortfall* ``sum_c max(0, -margin_c) / scale_c``
     with ``margin_c`` how far the sampled value is inside the bound (``Constraint.margin``)
     and ``scale_c = |bound|`` (absolute; 1 if the bound is 0) or ``|f~_b|`` (relative, the
     baseline's sampled value; 1 if 0), so metrics in different units add; the baseline's
     shortfall on a relative constraint is 0.

  Remaining ties go to the lowest action index. Neither paper has this case (their baseline
  is always feasible). A trade-off to know: on the dose-finding test problem (AE cap with
  ``confidence=0.95``, single-draw efficacy guard) giving the single-draw shortfall priority
  instead left 12-16 % of late doses above the AE cap against 5.5 % with this rule, which in
  turn broke the efficacy guard in about 30 % of late plays against 3 % (R = 16, T = 200).

The fallback is counted (issue 39): after each ``select`` off the paper path the policy sets
``last_fallback`` (bool, the shape of the actions: the rows that played the fallback) and
``last_fallback_by`` (bool ``[G, ...]``, one row per declared constraint, ``fallback_constraints``):
the fallback rows whose played action this decision's own verdict (the single draw, or the
probability against ``confidence``) did not judge to meet that constraint, the guards that bound.
Each fallback names at least one. ``simulate`` (``Trace.fallback``), the ``Decider`` (``/metrics``)
and the A/B tuner read them. On the paper path (``alpha``, or relative single-draw constraints one
per model in order) the baseline is always allowed, nothing falls back, ``fallback_constraints``
is None and nothing is recorded (no work added to that path).

Chance constraints (``Constraint.confidence = q``; not in the papers, whose test is one draw):
an action is allowed when the posterior probability that it meets the bound is at least ``q``
(relative: ``P(f(a) - c f(b) >= 0)`` jointly, the baseline's own entry exempt).

* Closed form for a conjugate, known-noise Gaussian ``BayesianLinear`` (``model.conjugate``,
  ``noise_prior is None``, Gaussian likelihood), whose ``f(x) = x^T w`` is Gaussian:
  absolute ``Phi((l - mu) / sd)`` (``at_most``) or ``Phi((mu - l) / sd)`` (``at_least``) from
  ``model.predict(x_a)``; relative: ``f(a) - c f(b)`` is linear in ``w``, so
  ``model.predict(x_a - c x_b)`` gives its mean and variance.
* Otherwise from ``S = confidence_draws`` (default 64) joint draws: the fraction of draws that
  meet the bound, with Monte-Carlo standard error ``sqrt(p (1 - p) / S)`` for independent
  draws (0.027 at ``p = 0.95``, ``S = 64``; the test ``p >= q`` is therefore blurred by about
  that much). Conjugate models with ``batch_shape [R]`` (Normal-Inverse-Gamma, whose
  predictive is Student-t; ``PerArmLinear``) draw all ``S`` in one batched call (from the
  replication streams under ``simulate``, so a batched run still equals single runs). Other
  models are asked ``S`` times in turn: for the chain engines (Gibbs, Langevin) these are ``S``
  successive draws of the model's own chain (the chain advances ``S`` steps, its state keeps
  its shape; successive draws are autocorrelated, so the effective ``S`` and hence the
  precision is lower than stated), for NUTS / SVI ``S`` picks among the stored posterior
  draws, for the probit GP and models with ``batch_shape ()`` ``S`` independent draws.

A chance constraint explores only where the posterior is already sure: with a vague prior no
action may be allowed, the fallback then plays the safest one, and data from it alone may never
make the others allowed (on the conjugate toxicity problem of tests/test_guardrail_policy.py,
without its pilot study, the policy kept the lowest dose and broke the efficacy guard in 80-90 %
of late plays; with 10 pilot patients per replication, 3-4 %). Give the models what is known
(a prior, logged data) before relying on ``confidence``.

Calibrated chance constraints (issue 39). A chance constraint promises that about a share ``q``
(or more) of the actions it allows meet the bound in truth. ``simulate`` records what the policy
claimed for every played action (``last_chance_claims``, ``trace.chance_claims``) and
``bayes_safe.diagnostics.chance_calibration`` checks the claim against the truth. Three things
broke the promise on ``bayes_safe.envs.SparseDosing`` (d = 80, 8 trials x 400 patients, the
logistic AE model by Gibbs sampling, ``q = 0.95``; benchmarks/chance_calibration.py), by size:

1. the model: with a ``N(0, 1)`` prior on each of the 76 covariate weights of the logistic AE
   model, 20 % of the (patient, dose) pairs the posterior rated at least 95 % safe at the end of
   a run were unsafe, from 64 chain draws and from 2,000 alike (22 % under a Laplace
   approximation of the same posterior): the posterior itself is over-confident, not its
   Monte-Carlo estimate, and 54 % of late doses were above the cap. With the covariate weights
   shrunk to ``N(0, 0.25^2)`` (the dose terms kept at ``N(0, 1)``;
   ``SparseDosing.models(ae_prior="scaled")``) the allowed pairs were 94.8 % safe and 3.9 % of
   late doses above the cap. No decision rule repairs a wrong posterior: the diagnostic shows
   it, and the model must change (Gelman et al. 2013, *Bayesian Data Analysis*, ch. 6: check
   the model against what it must predict).
2. selection (a winner's curse): the argmax plays, among the allowed actions, the one with the
   best sampled reward, which along a dose-response is the riskiest allowed one, with its claim
   near ``q``: with the shrunk prior the played allowed doses were 90 % safe (92 % late)
   against 94.8 % for all allowed pairs. ``chance_selection="bonferroni"`` judges each of the
   ``K`` candidates at ``1 - (1 - q) / K`` (Bonferroni's inequality: all allowed actions then
   meet the bound together with probability at least ``q``, so the played one does, whatever
   the argmax picks); with 64 draws that asks for all of them, and on top of ``chance_mcse`` it
   raised the late fallback share from 77 % to 88 % without a safer play (91 % safe, 94 %
   late), so it is not in ``CALIBRATED``.
3. Monte-Carlo error of ``S`` autocorrelated chain draws: the probability estimated from 64
   successive Gibbs sweeps varied 1.8 times as much between windows as independent draws'
   would (an effective ``S`` of about 20), so near ``q`` the test passes by chance, and the
   argmax then favours the actions whose estimate came out high. ``chance_mcse="batch"`` judges
   ``p - z_q se`` against ``q``, with ``se`` the batch-means Monte-Carlo standard error of the
   ``S`` draws (Flegal & Jones 2010), which widens with the autocorrelation it sees. With the
   shrunk prior: played allowed doses 93 % safe (94 % late), 1.6 % of late doses above the
   cap, the fallback in 77 % of late rows (seed 0; with seed 1: 94 % late against 89 % for the
   declared rule on the same model, 1.8 % above the cap, the fallback in 76 %). ``confidence_thin=k`` keeps every ``k``-th sweep of
   a chain instead (``k`` times the draws' cost).

Two options for a known structure or a model with a track record, measured with the wide
(over-confident) prior where they do not suffice: ``chance_monotone="increasing"`` (or
``"decreasing"``) says the guarded metrics' true means rise (fall) with the action index, as an
AE risk with the dose level (the monotone dose-toxicity assumption of phase I designs, e.g.
O'Quigley, Pepe & Fisher 1990): each draw is replaced by its least monotone envelope on the
unsafe side (a running maximum of the risk over lower doses), so a model whose draws say a
higher dose is safer than a lower one is not believed (late doses above the cap 54 % -> 12 %,
but played allowed doses only 73 % safe); ``chance_recalibrate=True`` adds to an absolute
constraint's draws the model's mean bias on the played allowed actions so far (observed minus
predicted, with its standard error: a constant discrepancy term, Kennedy & O'Hagan 2001;
``update`` needs ``actions``); with the wide prior the policy then fell back in 98 % of rows and
the fallback, the dose the wrong model deems safest, was itself above the cap in 29 % of late
rows.

``TSASC.CALIBRATED`` (``chance_mcse="batch"``) is the recommended rule; the default remains the
declared one (``p >= q`` of the estimate), so that existing runs reproduce.

Chance draws from a refreshed bank (issue 42; ``chance_refresh=m``; the default ``None`` keeps fresh
draws at every decision, the rule before, so that existing runs reproduce and the claim is the fresh
rule's; ``SERVING_CHANCE_REFRESH`` = 24 is the setting recommended for serving a chain-engine
constraint model). Drawing ``S`` joint draws at every
decision costs ``S`` chain sweeps of a Gibbs or Langevin model (each ``O(n d^2)``): on
``SparseDosing`` at ``d = 15`` (logistic AE model) 30-70 times the single-draw rule's time in a
``Decider`` and 7-11 times in ``simulate``. Instead, for a ``BayesianLinear`` constraint model (any
engine; ``f(x) = link(x^T w)``), the policy keeps a bank of ``S`` joint draws of the weights
(``[S, *batch_shape, d]``: one bank per replication under ``simulate``), drawn as the fresh draws
are (the same streams: at a refresh the bank's ``f`` *are* the fresh draws), and evaluates every
decision's ``S`` draws of ``f`` at its candidates from it (a matrix product). The bank is drawn anew
at the first decision after the model learnt ``min(m, max(n0, 1))`` rows since the refresh (``n0``
its rows then: at ``1, 2, 4, ...`` rows early on, every ``m`` rows later), or when the model was
replaced or has fewer rows (a reset). Per-arm models and the probit GP's views keep fresh draws.

The error this adds: the probabilities are those of the posterior given the first ``n0`` rows, at
most ``m - 1`` rows (and less than half of the rows) behind the model's. That posterior is a proper
one, given less data, so under a correct model its claims hold as stated for actions chosen without
the rows since ``n0``; what breaks that, and costs calibration, is that the actions *are* chosen with
them (the reward's fresh draw and the argmax, the winner's curse of item 2 above), and that the bank's
Monte-Carlo error is frozen for up to ``m`` decisions (an action whose estimate came out high stays
allowed, where fresh draws would re-randomise it). Measured (benchmarks/chance_speed.py and
``_late_calibration`` of tests/test_chance_calibration.py: d = 15, 8 trials x 400 patients,
``TSASC.CALIBRATED``, late played allowed doses truly under the cap): fresh draws 96.6 % / 97.3 %
(seeds 0, 1); ``m = 16`` 94.8 / 96.2 / 98.3 % (seeds 0-2), ``m = 24`` 94.2 / 94.9 / 99.2 %, ``m = 32``
93.6 / 95.8 / 97.8 %; the declared rule loses more (``m = 24``: 92.5 / 93.5 / 98.7 %, fresh 94.6 /
94.6 %). Cost relative to the single-draw rule: each refresh is ``S`` sweeps, about ``S / m`` sweeps
a decision in the long run (the single-draw rule makes one per model). ``m = 24`` is the recommended
serving setting, not the default: the smallest of those measured whose long-run cost stays under
twice the single-draw rule's in ``simulate`` at 400 patients (``m = 16``: 1.6-2.7 times there); it
costs one to two points of the realised share against the fresh rule (above), so a claim that
gates harm keeps the fresh default unless the speed is needed. Use ``m = 1`` (a refresh at every decision that follows a
new row: the fresh draws' law) where calibration must not move at all, a larger ``m`` for speed.

The bank is part of the saved state (``bayes_safe.state``: ``chance_refresh`` and the banks), so a
loaded copy makes the same decisions. A query (``action_probabilities``, a ``DrawBatch`` that is not
played) never draws a bank (the models stay as they were): while it is due the query makes fresh
draws. In a ``Decider`` the refresh is made by the decision that finds it due, so that decision is
slower (about ``S`` sweeps); the others skip the constraint model's draws altogether.

Under a ``bayes_safe.random.DrawBatch`` (``action_probabilities``, the ``Decider``'s
propensities) the chance probabilities are computed once per call and shared by the batched
draws: the action probabilities are those given that estimate (exact for the closed form).

Pending outcomes (issue 45; ``pending="margin"``; the default ``"ignore"`` is the rule before, bit for
bit). A guarded metric that arrives late (a refund weeks after the purchase) leaves the constraint
model behind the reward model: the reward model keeps pushing toward the bound while the outcomes
that would show the harm there are still out. Measured on a pricing problem (a 0/1 refund capped at
2 %, 2,000 decisions late; ``benchmarks/delays.py``), the plain policy broke the cap 6.9 points more
often than the same policy told at once, 6,000 decisions after the window opened.

With ``pending="margin"`` the constraint check keeps a margin for the decisions whose outcome of the
guarded metric is still pending: at each candidate ``a`` the drawn value of the guarded quantity
(``f~(x_a)``, or for a relative guard ``f~(x_a) - c f~(x_b)``, ``v = x_a - c x_b``) is moved toward the
side the guard fears (up under a cap, down under a floor or the paper's ``alpha``) by

    ``pending_z * sqrt(v^T Sigma v - v^T (Sigma^-1 + sum_pending x x^T / sigma^2)^-1 v)``,

the standard deviation by which the pending outcomes, once known, will move the posterior mean of
that quantity (for a conjugate Gaussian model the law of total variance: the posterior variance now
less the variance once they are known, which does not depend on their values). Where the pending
decisions inform the guard (the prices the policy has been playing) the check is cautious in
proportion to what they can still reveal; where they do not, nothing changes; when they arrive the
margin goes. ``pending_z`` (default 0.5) sets the caution. The pending rows are held beside the
model, never in it (``hold_pending`` / ``release_pending``: a sum of ``x x^T / sigma^2`` per constraint
model, set to exactly 0 when nothing is held), so the models learn each outcome once, when it
arrives, as without the option; with nothing held the decisions are the plain rule's, bit for bit.
``simulate(..., delays=...)`` and the ``Decider`` (per-metric feedback, a snapshot and its replay) hold
and release the rows; a direct caller of ``select`` / ``update`` holds them itself or holds nothing.
Needs a conjugate known-noise Gaussian ``BayesianLinear`` constraint model (other engines refuse,
naming the engine). While rows are held the ``Decider``'s one-stream stacked path is not taken, and
with ``chance_refresh`` the bank is evaluated as before (the margin moves its values, not its draws).

Measured (R = 128, the same seeds, the last window of each run; docs/reports/late-outcomes.md):
pricing, refund 2,000 late: the late stream -0.6 +- 0.9 points from the policy told at once (plain:
+6.9 +- 1.3), at 1.04 times its regret per decision (the plain late policy earns more by breaking the
cap: 0.61 times); a dose-finding problem (AE cap, 750 late): -2.7 +- 0.5 (plain: +0.0), first-window
AE share 31 % against 41 %, at 2.1 times the late-stream regret; daulton2019 (a relative guard, 500
late): -4.1 (plain: -3.8), first window 46 % against 63 %, total regret 192 against 8. The rejected
alternative, pessimistic pseudo-observations of the pending outcomes in the model, met the target on
the pricing problem but made the dose-finding late stream 4.4 points worse (a pessimistic row at one
dose is an optimistic one elsewhere in a linear model).
"""

from __future__ import annotations

import functools
import numbers
import typing
from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_in_range
from ..models.linear import _JointPosterior
from ..random import DrawBatch, Generator, ReplicationRNG, check_generator
from . import _fast
from .base import (
    Policy,
    _model_dims,
    check_model,
    check_select_inputs,
    check_update_inputs,
    masked_argmax,
    model_device,
)

__all__ = ["CHANCE_MCSE", "CHANCE_REFRESH_DEFAULT", "CHANCE_SELECTION", "FALLBACKS", "PENDING", "SERVING_CHANCE_REFRESH",
           "TSASC"]

#: what TS-ASC plays in a row where no action is allowed (see the module docstring)
FALLBACKS = ("safest", "baseline")
#: ``chance_mcse``: None (the estimate itself) or ``"batch"`` (its batch-means lower bound)
CHANCE_MCSE = (None, "batch")
#: ``chance_selection``: None (the declared level) or ``"bonferroni"`` (corrected over the ``K`` candidates)
CHANCE_SELECTION = (None, "bonferroni")
#: ``chance_monotone``: None, or how the chance-guarded metrics' means change with the action index
CHANCE_MONOTONE = (None, "increasing", "decreasing")
#: ``chance_refresh``'s default: None, fresh chance draws at every decision (module docstring, "Chance draws
#: from a refreshed bank")
CHANCE_REFRESH_DEFAULT = None
#: the ``chance_refresh`` recommended for serving a chain-engine (Gibbs, Langevin) constraint model: the bank
#: is drawn anew once the model learnt this many rows (at most twice the single-draw rule's cost; one to two
#: points of calibration, module docstring)
SERVING_CHANCE_REFRESH = 24
#: ``pending``: what the constraint models the decisions see make of outcomes not known yet (module docstring,
#: "Pending outcomes"): ``"ignore"`` (the default, the rule before) or ``"margin"`` (a margin for what they can move)
PENDING = ("ignore", "margin")


class TSASC(Policy):
    """TS-ASC (Daulton et al. 2019, Algorithm 1).

    Args:
        reward_model: posterior over the reward metric (``sample_at``, ``update``).
        constraint_models: one posterior per constraint metric (a single model is accepted).
        alpha: the tolerated relative decrease of each constraint metric, in ``[0, 1)``; a
            scalar or one value per constraint metric (Daulton et al. 2019, section 3.1:
            ``E[c | x, a] >= (1 - alpha) E[c | x, b]``).
        constraints: instead of ``alpha``, ``bayes_safe.envs.Constraint`` declarations
            (direction, form and ``confidence`` of each guardrail, see the module docstring):
            without ``metric_names`` one per constraint model, in order; with it, any number,
            matched to the models by metric name (the reward's too).
            ``Constraint.from_alpha(m, a)`` gives exactly the ``alpha=a`` policy. Give at most
            one of ``alpha`` and ``constraints``. With constraints, ``alpha`` holds
            ``1 - bound`` when they are exactly the paper's form (one relative ``at_least``
            single-draw constraint per constraint model, in order), else None.
        metric_names: None, or the names of the metrics the models learn: the reward's first,
            then one per constraint model (``problem.metric_names``).
        fallback: ``"safest"`` (default) or ``"baseline"``: what is played in a row where no
            action is allowed (module docstring).
        confidence_draws: ``S``, the joint draws behind a chance constraint's probability
            where there is no closed form (an int >= 2, default 64).
        chance_mcse: None (default) or ``"batch"``: judge a drawn probability by its batch-means
            lower bound (module docstring, "Calibrated chance constraints").
        chance_selection: None (default) or ``"bonferroni"``: the level corrected over the ``K``
            candidates.
        confidence_thin: keep every ``k``-th draw of a chain engine's (default 1).
        chance_monotone: None (default), ``"increasing"`` or ``"decreasing"``: how the guarded
            metrics' true means change with the action index (absolute chance constraints).
        chance_recalibrate: add the model's bias on the played allowed actions to absolute chance
            constraints' draws (default False).
        chance_refresh: None (fresh chance draws at every decision) or ``m``, an int >= 1: the chance
            draws of a ``BayesianLinear`` model come from a cached bank of ``S`` weight draws drawn
            anew once the model learnt ``m`` rows (or doubled its rows) since (default None;
            ``SERVING_CHANCE_REFRESH`` = 24 for serving; module docstring, "Chance draws from a
            refreshed bank").
        pending: ``"ignore"`` (default) or ``"margin"``: the constraint checks keep a margin for the
            outcomes still pending of the guarded metrics (module docstring, "Pending outcomes";
            conjugate known-noise Gaussian constraint models only; ``simulate`` with ``delays`` and
            the ``Decider`` hold the pending rows).
        pending_z: the margin, in standard deviations of what the pending outcomes can still move
            the guarded quantity (a number >= 0, default 0.5).

    Attributes:
        constraints: the declared tuple (None with ``alpha``).
        metric_names: None or a tuple of names.
        fallback: as given.
        confidence_draws: as given.

    Shapes: as ``Policy``; ``constraints [R, C]`` in ``update``.
    """

    #: the recommended options for honest chance constraints (module docstring, "Calibrated chance
    #: constraints"): ``TSASC(..., **TSASC.CALIBRATED)``
    CALIBRATED: typing.ClassVar[dict] = {"chance_mcse": "batch"}

    #: the rows of one call are separate decisions (``Policy.row_probabilities``)
    batched_rows = True

    def __init__(self, reward_model, constraint_models, alpha: float | Sequence[float] | None = None,
                 constraints: Sequence | None = None, *, metric_names: Sequence[str] | None = None,
                 fallback: str = "safest", confidence_draws: int = 64, chance_mcse: str | None = None,
                 chance_selection: str | None = None, confidence_thin: int = 1, chance_monotone: str | None = None,
                 chance_recalibrate: bool = False, chance_refresh: int | None = CHANCE_REFRESH_DEFAULT,
                 pending: str = "ignore", pending_z: float = 0.5):
        if not isinstance(constraint_models, (list, tuple)):
            constraint_models = [constraint_models]
        if len(constraint_models) == 0:
            raise ValueError("constraint_models: expected at least one constraint model")
        self.reward_model = check_model(reward_model, "reward_model", "sample_at")
        self.constraint_models = [check_model(m, f"constraint_models[{j}]", "sample_at")
                                  for j, m in enumerate(constraint_models)]
        C = self.num_constraints = len(self.constraint_models)
        if not isinstance(fallback, str) or fallback not in FALLBACKS:
            raise ValueError(f"fallback: expected 'safest' or 'baseline' (what to play when no action is allowed), "
                             f"got {fallback!r}")
        self.fallback = fallback
        #: the fallback record of the last ``select`` (``_record_fallback``); None on the paper path
        self.last_fallback = self.last_fallback_by = None
        #: the chance record of the last guarded decision: ``(probabilities [Gc, *lead, R, K], allowed
        #: [*lead, R, K])``, one row per ``chance_guards`` entry (``simulate``'s calibration record); None
        #: without chance constraints
        self.last_chance_claims = None
        if (isinstance(confidence_draws, bool) or not isinstance(confidence_draws, numbers.Integral)
                or int(confidence_draws) < 2):
            raise ValueError(f"confidence_draws: expected an int >= 2 (joint draws per chance-constraint "
                             f"probability), got {confidence_draws!r}")
        self.confidence_draws = int(confidence_draws)
        if chance_mcse not in CHANCE_MCSE:
            raise ValueError(f"chance_mcse: expected None or 'batch' (judge a chance constraint's probability by its "
                             f"Monte-Carlo lower bound), got {chance_mcse!r}")
        if chance_selection not in CHANCE_SELECTION:
            raise ValueError(f"chance_selection: expected None or 'bonferroni' (the level corrected over the "
                             f"candidate actions), got {chance_selection!r}")
        if (isinstance(confidence_thin, bool) or not isinstance(confidence_thin, numbers.Integral)
                or int(confidence_thin) < 1):
            raise ValueError(f"confidence_thin: expected an int >= 1 (chain sweeps per kept chance draw), "
                             f"got {confidence_thin!r}")
        if chance_monotone not in CHANCE_MONOTONE:
            raise ValueError(f"chance_monotone: expected None, 'increasing' or 'decreasing' (how the chance-guarded "
                             f"metrics' means change with the action index), got {chance_monotone!r}")
        self.chance_mcse, self.chance_selection = chance_mcse, chance_selection
        self.chance_monotone = chance_monotone
        if not isinstance(chance_recalibrate, bool):
            raise TypeError(f"chance_recalibrate: expected True or False, got {chance_recalibrate!r}")
        self.chance_recalibrate = chance_recalibrate
        #: the recalibration record per absolute chance constraint (``chance_recalibrate``): ``{guard
        #: index: [n, sum r, sum r^2]}`` (each ``[R]``) of the residuals ``r`` of played allowed actions, and the
        #: last decision's predicted means ``{guard: [R, K]}``
        self._recal: dict = {}
        self._recal_pred: dict = {}
        self.confidence_thin = int(confidence_thin)
        if chance_refresh is not None and (isinstance(chance_refresh, bool) or not isinstance(
                chance_refresh, numbers.Integral) or int(chance_refresh) < 1):
            raise ValueError(f"chance_refresh: expected None (fresh chance draws at every decision) or an int >= 1 "
                             f"(refresh the bank of chance draws once the model learnt that many rows), "
                             f"got {chance_refresh!r}")
        self.chance_refresh = None if chance_refresh is None else int(chance_refresh)
        #: the cached banks of chance draws (``chance_refresh``): ``{model index: (model, weights [S, *batch, d],
        #: rows the model had learnt at the refresh)}``; not saved (rebuilt at the first decision after a load)
        self._bank: dict = {}
        #: how many times a bank of chance draws was drawn (``chance_refresh``; diagnostics and tests)
        self.chance_refreshes = 0
        self._set_pending(pending, pending_z)
        self.metric_names = _check_metric_names(metric_names, C)
        self.constraints: tuple | None = None
        #: per guard: (model index: 0 the reward, j + 1 constraint model j; its Constraint, None for alpha)
        self._guards: tuple = tuple((j + 1, None) for j in range(C))
        # alpha, or relative single-draw constraints one per model in order: Algorithm 1 as published,
        # select's original code (no per-call work added to it)
        self._paper = True
        if constraints is not None:
            if alpha is not None:
                raise ValueError("TSASC: give exactly one of alpha= and constraints=, not both")
            if self.metric_names is None:
                self.constraints = _check_constraints(constraints, C)
                self._guards = tuple((j + 1, c) for j, c in enumerate(self.constraints))
            else:
                self.constraints = _check_named_constraints(constraints, self.metric_names)
                self._guards = tuple((self.metric_names.index(c.metric), c) for c in self.constraints)
            in_order = [m for m, _ in self._guards] == list(range(1, C + 1))
            relative = all(c.versus_baseline and not _chance(c) for c in self.constraints)
            self._paper = in_order and relative
            paper_form = self._paper and all(not c.at_most for c in self.constraints)
            self.alpha = (torch.tensor([1.0 - c.bound for c in self.constraints], dtype=torch.float64,
                                       device=model_device(self.reward_model)) if paper_form else None)
            self._plan()
            return
        if alpha is None:
            alpha = 0.01
        if isinstance(alpha, torch.Tensor):
            alpha = alpha.tolist()  # a 0-d tensor becomes a float, a 1-d one a list
        if isinstance(alpha, numbers.Real):
            alphas = [alpha] * self.num_constraints
        elif isinstance(alpha, (list, tuple)) or type(alpha).__name__ == "ndarray":
            alphas = list(alpha)
        else:
            raise TypeError(f"alpha: expected a number in [0, 1) or one per constraint model, got {type(alpha).__name__}")
        if len(alphas) != self.num_constraints:
            raise ValueError(f"alpha: expected a scalar or {self.num_constraints} values (one per constraint model), got {len(alphas)}")
        self.alpha = torch.tensor([check_in_range(a, "alpha", 0.0, 1.0) for a in alphas], dtype=torch.float64,
                                  device=model_device(self.reward_model))
        self._plan()

    def _plan(self) -> None:
        """Which draws a guarded decision needs, in the order they are made (the reward's first)."""
        models = (self.reward_model, *self.constraint_models)
        closed = [_closed_form(m) for m in models]
        single = {m for m, c in self._guards if m > 0 and not _chance(c)}
        drawn = {m for m, c in self._guards if _chance(c) and not closed[m]}
        self._closed = closed
        self._draw_order = tuple((m, kind) for m in range(len(models))
                                 for kind, wanted in (("single", m in single), ("chance", m in drawn)) if wanted)

    @property
    def chance_guards(self) -> tuple:
        """The chance constraints (``Constraint.confidence`` set), in declaration order, as
        ``(metric column of the models: 0 the reward, j + 1 constraint model j, Constraint)``: the
        rows of ``last_chance_claims`` (empty without chance constraints)."""
        return tuple((m, c) for m, c in self._guards if _chance(c))

    # ------------------------------------------------------------------ pending outcomes (issue 45)
    def _set_pending(self, pending, pending_z) -> None:
        """``pending`` and ``pending_z`` checked (module docstring, "Pending outcomes")."""
        if not isinstance(pending, str) or pending not in PENDING:
            raise ValueError(f"pending: expected 'ignore' or 'margin' (what the constraint checks make of outcomes not "
                             f"known yet), got {pending!r}")
        if isinstance(pending_z, bool) or not isinstance(pending_z, numbers.Real) or not 0 <= float(pending_z) < 1e6:
            raise ValueError(f"pending_z: expected a finite number >= 0 (the margin, in sd of what the pending "
                             f"outcomes can still move), got {pending_z!r}")
        if pending != "ignore":
            for j, model in enumerate(self.constraint_models):
                why = _pending_refusal(model)
                if why is not None:
                    raise ValueError(f"pending={pending!r}: constraint_models[{j}] {why}; the margin of pending "
                                     "outcomes needs a conjugate known-noise Gaussian BayesianLinear (engine "
                                     "'conjugate', noise_std given, no noise_prior), whose posterior variance once "
                                     "they are known is exact; use pending='ignore' with this model")
        self.pending, self.pending_z = pending, float(pending_z)
        #: per constraint model: None or ``[sum of x x^T / sigma^2 [*batch, d, d], rows held [*batch]]``
        self._pseudo: list = [None] * self.num_constraints
        self._held = False  # whether any pending row is held (the constraint checks then keep the margin)

    @property
    def pending_held(self) -> list[torch.Tensor]:
        """Per constraint model, how many decisions' outcomes are held as pending now (``[*batch]`` long)."""
        out = []
        for j, m in enumerate(self.constraint_models):
            held = self._pseudo[j]
            out.append(held[1].clone() if held is not None else torch.zeros(
                tuple(getattr(m, "batch_shape", ()) or ()), dtype=torch.long, device=model_device(m)))
        return out

    def _pending_rows(self, constraints, features_chosen, index):
        """``[(j, model, held sums, x [n, d], flat batch indices [n])]`` for the constraint models ``constraints``."""
        C = self.num_constraints
        cols = list(range(C)) if constraints is None else [int(j) for j in constraints]
        if any(not 0 <= j < C for j in cols) or len(set(cols)) != len(cols):
            raise ValueError(f"constraints: expected distinct constraint model indices in [0, {C}), got {constraints}")
        out = []
        for j in cols:
            model = self.constraint_models[j]
            held = self._pseudo[j]
            if held is None:
                held = self._pseudo[j] = [torch.zeros_like(model.precision), torch.zeros(
                    tuple(model.eta.shape[:-1]), dtype=torch.long, device=model.eta.device)]
            d = model.eta.shape[-1]
            x = _tensor_on(features_chosen, torch.float64, model.eta.device).reshape(-1, d)
            if index is None:
                n = held[1].numel()
                if x.shape[0] != n:
                    raise ValueError(f"features_chosen: expected one row per batch element ({n}), got {x.shape[0]}")
                rows = torch.arange(n, device=x.device)
            else:
                rows = _tensor_on(index, torch.long, x.device).reshape(-1)
                if rows.shape[0] != x.shape[0]:
                    raise ValueError(f"index: expected one batch index per row ({x.shape[0]}), got {rows.shape[0]}")
            out.append((j, model, held, x, rows))
        return out

    def hold_pending(self, features_chosen, constraints=None, index=None) -> None:
        """Hold as pending the outcomes of the constraint models ``constraints`` (indices; None: all) of the
        decisions played at ``features_chosen`` (``[*batch, d]``, one row per batch element; or ``[n, d]`` with
        ``index [n]``, the rows' flat batch indices): with ``pending="margin"`` the constraint checks keep a
        margin for them until ``release_pending`` (module docstring, "Pending outcomes"). The models learn
        nothing here. Nothing happens with ``pending="ignore"``."""
        if self.pending == "ignore":
            return
        for _, model, held, x, rows in self._pending_rows(constraints, features_chosen, index):
            d = x.shape[-1]
            held[0].view(-1, d, d).index_add_(0, rows, x[:, :, None] * x[:, None, :], alpha=float(model._scale))
            held[1].view(-1).index_add_(0, rows, torch.ones_like(rows))
        self._held = True

    def release_pending(self, features_chosen, constraints=None, index=None) -> None:
        """Release what ``hold_pending`` held (the same ``features_chosen``, ``constraints`` and ``index``): the
        outcomes arrived (the models learn them with ``update``, once, as always) or never will. The sums of a
        batch element that holds nothing any more are set to exactly 0."""
        if self.pending == "ignore":
            return
        for j, model, held, x, rows in self._pending_rows(constraints, features_chosen, index):
            d = x.shape[-1]
            count = held[1].view(-1)
            taken = torch.zeros_like(count).index_add_(0, rows, torch.ones_like(rows))
            if bool((taken > count).any()):
                raise ValueError(f"release_pending: constraint model {j} holds fewer pending rows than released for "
                                 "some batch elements (each held row is released once)")
            held[0].view(-1, d, d).index_add_(0, rows, x[:, :, None] * x[:, None, :], alpha=-float(model._scale))
            count.sub_(taken)
            empty = count == 0
            if bool(empty.any()):
                held[0].view(-1, d, d)[empty] = 0.0
        self._held = any(h is not None and bool(h[1].any()) for h in self._pseudo)

    def clear_pending(self) -> None:
        """Drop every held pending row (a new run; a ``Decider`` rebuilding its pending set)."""
        self._pseudo = [None] * self.num_constraints
        self._held = False

    def _pending_shift(self, m: int, c, features, baseline) -> torch.Tensor | None:
        """``pending="margin"``: the shift ``[R, K]`` of model ``m``'s values at the candidates toward the side
        guard ``c`` fears (``c`` None: the paper's alpha, a floor relative to the baseline), ``pending_z`` times
        the sd by which the outcomes still pending can move the posterior mean of the guarded quantity
        (``x_a^T w``, or ``(x_a - c x_b)^T w`` for a relative guard): ``sqrt(v_now - v_known)``, the posterior
        variance now less the variance once they are known (module docstring); None when nothing is held."""
        if m == 0 or not self._held:
            return None
        held = self._pseudo[m - 1]
        if held is None or not bool(held[1].any()):
            return None
        model = self.constraint_models[m - 1]
        v = features
        if c is None or c.versus_baseline:
            bound = (1.0 - float(self.alpha[m - 1])) if c is None else float(c.bound)
            rows = torch.arange(features.shape[0], device=features.device)
            v = features - bound * features[rows, baseline][:, None, :]
        from ..models._gaussian import cholesky

        after = cholesky(model.precision + held[0])  # (its jitter if needed; no read of device memory off the CPU)
        now = torch.linalg.solve_triangular(model.factor, v.mT, upper=False)
        later = torch.linalg.solve_triangular(after, v.mT, upper=False)
        sd = ((now * now).sum(-2) - (later * later).sum(-2)).clamp_min(0.0).sqrt()
        return sd * (self.pending_z if c is not None and c.at_most else -self.pending_z)

    # ------------------------------------------------------------------ the feasible set
    def feasible(self, features, baseline, generator: Generator = None) -> torch.Tensor:
        """The allowed set ``[R, K]`` (bool) before ``valid`` and the fallback: the sampled feasible
        set of Algorithm 1 line 6 (baseline exempt from relative constraints, judged by absolute
        ones; chance constraints by their probability). Its draws are made in ``select``'s order."""
        # an out-of-range baseline would raise IndexError, and a negative one would silently
        # index from the end: checked (outside the library's own loops)
        features, baseline, _ = self._check(features, baseline, None)
        if self._paper:
            return self._feasible(features, baseline, generator)
        return self._judge(features, baseline, generator)[1]

    def _alpha_factors(self, cached: bool = False):
        """``1 - alpha_j`` as Python floats, read from the tensor once per value of alpha (an assignment or
        an in-place change makes a new key): no read of a device's memory per decision (issue 46).
        ``cached``: the cache entry ``(key, factors, alpha)`` itself."""
        key = (id(self.alpha), self.alpha._version)
        entry = self.__dict__.get("_factors")
        if entry is None or entry[0] != key:
            entry = self._factors = (key, [1 - a for a in self.alpha.tolist()], self.alpha)
        return entry if cached else entry[1]

    def _feasible(self, features, baseline, generator: Generator = None) -> torch.Tensor:
        # the paper's rule; shapes broadcast over leading sample dimensions (``[S, R, K]`` under a DrawBatch)
        R = features.shape[0]
        ok = None
        # 1 - alpha_j as Python floats: the same float64 numbers as the 0-d tensors, without two ops per constraint
        factors = None if self.constraints is not None else self._alpha_factors()
        margin = self._held
        if R == 1 and factors is not None and not margin:
            # one stream: the baseline's column as a view and one fill instead of two gathers by index
            # (the same comparisons)
            b = int(baseline)  # [1]: its one index
            for j, model in enumerate(self.constraint_models):
                fc = model.sample_at(features, generator, key=f"constraint{j}")
                now = fc >= factors[j] * fc.narrow(-1, b, 1)
                ok = now if ok is None else ok & now
            ok.select(-1, b).fill_(True)
            return ok
        rows = torch.arange(R, device=features.device)
        for j, model in enumerate(self.constraint_models):
            fc = model.sample_at(features, generator, key=f"constraint{j}")
            base = fc[..., rows, baseline]
            if margin:  # pending="margin": the candidates' side moved by what the pending outcomes can still move
                shift = self._pending_shift(j + 1, None if factors is not None else self.constraints[j], features,
                                            baseline)
                if shift is not None:
                    fc = fc + shift
            if factors is not None:
                now = fc >= (factors[j] * base)[..., None]  # a new bool tensor [*lead, R, K]: the first needs no ``&``
                ok = now if ok is None else ok & now
            else:
                ok = (torch.ones(features.shape[:2], dtype=torch.bool, device=features.device) if ok is None else ok) \
                    & self.constraints[j].satisfied(fc, base)
        ok[..., rows, baseline] = ok.new_ones(())  # a device scalar: a Python one is copied from the host
        return ok

    def _check(self, features, baseline, valid):
        return check_select_inputs(features, baseline, valid, require_baseline="TS-ASC", empty_rows_ok=True,
                                   models=(self.reward_model, *self.constraint_models))

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        if generator is not None and not isinstance(generator, (torch.Generator, ReplicationRNG)):
            check_generator(generator)
        # the common case (float64 tensors of the models' shapes) in a few comparisons, else the general check
        checked = _fast.select_inputs(features, baseline, valid, self._plan_of_models()[3],
                                      require_baseline=True, empty_rows_ok=True)
        features, baseline, valid = checked if checked is not None else self._check(features, baseline, valid)
        if not self._paper:
            return self._select_guarded(features, baseline, generator, valid)
        if type(generator) is DrawBatch and features.shape[0] == 1 and self.constraints is None and not self._held:
            actions = self._select_stacked(features, baseline, generator, valid)
            if actions is not None:
                return actions
        fr = self.reward_model.sample_at(features, generator, key="reward")
        ok = self._feasible(features, baseline, generator)
        if valid is not None:
            ok = ok & valid
            ok[..., torch.arange(features.shape[0], device=features.device), baseline] = ok.new_ones(())
        # masked_argmax's numbers and first maximal index, in two ops instead of four on small tables
        scores = torch.where(ok, fr, float("-inf"))
        return scores.argmax(-1) if scores.numel() <= 1024 else scores.max(-1).indices

    def _select_stacked(self, features, baseline, batch: DrawBatch, valid) -> torch.Tensor | None:
        """``select`` of one stream (features ``[1, K, d]``) under a ``DrawBatch`` of ``S`` (the Decider's
        propensity draws, ``action_probabilities``) when every model is a conjugate known-noise one of
        one stream (``_stack_key``, the same for all): the draws of all models in one batch
        (``BayesianLinear._stacked_draws_at``: ``[1 + C, S, K]``), then Algorithm 1's test and
        argmax as ``select``'s, on ``[S, K]`` (in numpy on torch's memory: the same numbers); actions
        ``[S, 1]``. None when the models do not allow it. R = 1, d = 4, K = 5, S = 200, one
        constraint: 13 tensor operations (both factorisations included) and 6 numpy ones, against
        26 tensor operations one model at a time; the same normals, so the same decisions as the
        models drawn one at a time (tests/test_single_stream_speed_paths.py)."""
        actions = self._stacked_actions(features, baseline, batch, valid, self._stackable())
        return None if actions is None else torch.from_numpy(actions[:, None])

    def _draw_actions(self, features, baseline, batch: DrawBatch, valid) -> np.ndarray | None:
        """The Decider's propensity draws: ``select(features, baseline, generator=batch, valid=valid)``
        as the numpy array of its actions ``[S]`` (the same numbers) when ``select`` would take
        ``_select_stacked``, else None (the Decider then calls ``select``). For inputs the Decider
        checked and coerced (float64 candidates ``[1, K, d]``, a long baseline ``[1]`` in range, a bool
        ``valid [1, K]`` with an allowed action): ``select``'s own checks would return them unchanged
        (``_fast.select_inputs``), so only what they compare with the models, ``d``, is compared here,
        and a missing baseline (which select refuses, naming it) is left to select. ``baseline``: the
        index as a long tensor ``[1]`` or a Python int (the Decider's)."""
        # (pending="margin" with rows held: select's general path keeps the margin)
        if baseline is None or not self._paper or self.constraints is not None or self._held:
            return None
        plan = self._plan_of_models()
        if features.shape[2] != plan[3][2]:
            return None
        return self._stacked_actions(features, baseline, batch, valid, plan[2])

    def _stacked_actions(self, features, baseline, batch: DrawBatch, valid, models) -> np.ndarray | None:
        """``_select_stacked``'s actions as a numpy array ``[S]``, or None; ``models``: ``_stackable()``."""
        if models is None or not features.is_cpu:  # numpy on torch's memory: the CPU's path
            return None
        # [1 + C, K, S] (the product's own layout) and the solve, as numpy arrays on torch's memory
        draws, solve, means = type(self.reward_model)._stacked_draws_at(models, features, batch, with_solve=True,
                                                                        joint=self._joint_of(models), as_numpy=True)
        # the decision's L^-1 X^T [M, d, K], whitened means [M, d, 1] (numpy arrays of the tensors) and the
        # factors they came from: the Decider's outlier guard reads the played column while those factors
        # stand (``Decider._decision``)
        self._last_solve = (solve, means, tuple([m._factor for m in models]), models)
        b = baseline if type(baseline) is int else int(baseline)
        # 1 - alpha_j as Python floats, read once per value of alpha (an assignment or an in-place change
        # of the tensor makes a new key)
        cached = self._alpha_factors(cached=True)
        # Algorithm 1's test and argmax in numpy on the [K, S] tables (a candidate's S draws a row): the
        # same comparisons, products and first maximal index as torch's on [S, K], at about half the
        # call cost on tables this small (S = 200, K = 5, one constraint: with the product, 12.8 us against 14.9)
        factors = cached[1]
        if len(factors) == 1:  # one constraint (the common case): its table, without the loop's views
            fc = draws[1]
            ok = fc >= factors[0] * fc[b]
        else:
            ok = None
            for fc, f in zip(draws[1:], factors):
                now = fc >= f * fc[b]
                ok = now if ok is None else np.logical_and(ok, now, out=ok)
        if valid is not None:
            ok &= valid.numpy().T  # [K, S] & [K, 1]
        ok[b] = True  # the baseline stays a candidate
        return np.where(ok, draws[0], -np.inf).argmax(0)  # [S]: the first maximal candidate of each draw

    def _joint_of(self, models: tuple):
        """The stackable ``models``' joint posterior (``models.linear._JointPosterior``: their
        precisions and etas views of one buffer each), kept between calls; None when they cannot be
        held jointly."""
        kept = self.__dict__.get("_joint")
        if kept is not None and kept.holds(models):  # (``of``'s first test, without its call: every decision asks)
            return kept
        self._joint = _JointPosterior.of(models, kept)
        return self._joint

    def _stackable(self) -> tuple | None:
        """``(reward_model, *constraint_models)`` when they all have the same ``_stack_key`` (conjugate,
        known-noise, Gaussian, one stream: ``_select_stacked`` and the shared one-row update apply),
        else None."""
        return self._plan_of_models()[2]

    def _plan_of_models(self) -> tuple:
        """``(reward_model, constraint_models, stackable models or None, (R, K, d) the models expect
        (``_fast.dims``), whether every model expects the reward model's (R, K, d))``, worked out once
        per set of models (a model's kind and shapes are fixed when it is made)."""
        plan = self.__dict__.get("_stack_plan")
        if plan is None or plan[0] is not self.reward_model or plan[1] != self.constraint_models:
            models = (self.reward_model, *self.constraint_models)
            key = getattr(self.reward_model, "_stack_key", None)
            ok = key is not None and all(getattr(m, "_stack_key", None) == key for m in self.constraint_models)
            expected = _model_dims(self.reward_model)
            plan = self._stack_plan = (self.reward_model, list(self.constraint_models), models if ok else None,
                                       _fast.dims(models), all(_model_dims(m) == expected for m in self.constraint_models))
        return plan

    # ------------------------------------------------------------------ guards beyond the paper
    def _values(self, features, generator):
        """The draws of one decision, in a fixed order: ``fr``, then per model its single draw and/or
        its ``S`` chance draws (``{m: [*lead, R, K]}``, ``{m: [S, R, K]}``)."""
        models = (self.reward_model, *self.constraint_models)
        fr = self.reward_model.sample_at(features, generator, key="reward")
        single, draws = {0: fr}, {}
        for m, kind in self._draw_order:
            if kind == "single":
                single[m] = models[m].sample_at(features, generator, key=f"constraint{m - 1}")
            else:
                draws[m] = self._chance_draws(m, models[m], features, generator)
        return fr, single, draws

    def _chance_draws(self, m: int, model, features, generator) -> torch.Tensor:
        """The ``S`` joint draws ``[S, *lead, R, K]`` behind model ``m``'s chance probabilities: fresh
        (``_joint_draws``), or with ``chance_refresh`` the cached bank of weight draws evaluated at
        ``features`` (module docstring, "Chance draws from a refreshed bank"), the bank drawn anew
        when due (``_bank_due``). A query (a ``DrawBatch`` that is not played: ``action_probabilities``)
        never refreshes the bank, so it leaves the models as they were: while the bank is due it
        makes fresh draws, as without the option."""
        key = "reward/chance" if m == 0 else f"constraint{m - 1}/chance"
        S, thin = self.confidence_draws, self.confidence_thin
        if self.chance_refresh is None or not _bankable(model):
            return _joint_draws(model, features, generator, key, S, thin)
        bank = self._bank.get(m)
        rows = _rows_learnt(model)
        if self._bank_due(bank, model, rows):
            if isinstance(generator, DrawBatch) and not generator.played:
                return _joint_draws(model, features, generator, key, S, thin)
            weights = _weight_draws(model, generator, key, S, thin, features.shape[0])
            bank = self._bank[m] = (model, weights, rows)
            self.chance_refreshes += 1
        return _at_weights(model, bank[1], features)

    def _bank_due(self, bank, model, rows: int) -> bool:
        """Whether a bank ``(model, weights, rows at the refresh)`` must be drawn anew: none yet, another
        model, fewer rows than at the refresh (a reset or a load), or the model learnt at least
        ``min(chance_refresh, max(rows at the refresh, 1))`` rows since (so the bank is at most
        ``chance_refresh - 1`` rows behind, and has seen more than half of the model's rows)."""
        if bank is None or bank[0] is not model or rows < bank[2]:
            return True
        return rows - bank[2] >= min(self.chance_refresh, max(bank[2], 1))

    def _probability(self, m: int, c, features, baseline, draws: dict, moments: dict) -> torch.Tensor:
        """``P(c met)`` ``[R, K]`` of each action under model ``m``'s posterior (closed form or draws);
        a relative constraint's baseline entry is 1 (exempt)."""
        rows = torch.arange(features.shape[0], device=features.device)
        if self._closed[m]:
            model = (self.reward_model, *self.constraint_models)[m]
            if c.versus_baseline:  # f(a) - c f(b) = (x_a - c x_b)^T w
                mean, var = model.predict(features - c.bound * features[rows, baseline][:, None, :])
                margin = -mean if c.at_most else mean
            else:
                if m not in moments:
                    moments[m] = model.predict(features)
                mean, var = moments[m]
                shift = self._recal_shift(c, mean)
                if shift is not None:  # the model's bias on played actions and its standard error
                    mean, var = mean + shift[0][:, None], var + (shift[1] ** 2)[:, None]
                margin = c.bound - mean if c.at_most else mean - c.bound
            shift = self._pending_shift(m, c, features, baseline) if self._held else None
            if shift is not None:  # pending="margin": less room by what the pending outcomes can still move
                margin = margin - shift.abs()
            sd = var.clamp_min(0.0).sqrt()
            p = torch.where(sd > 0, torch.special.ndtr(margin / sd.clamp_min(1e-300)), (margin >= 0).to(margin.dtype))
        else:
            values = draws[m]
            shift = None if c.versus_baseline else self._recal_shift(c, values.mean(0))
            if shift is not None:  # a quantile grid of N(bias, se^2), one point per draw
                S = values.shape[0]
                grid = _normal_grid(S).to(device=values.device, dtype=values.dtype)
                values = values + (shift[0] + grid[:, None] * shift[1]).reshape(S, *shift[0].shape, 1)
            base = values[..., rows, baseline]
            shift = self._pending_shift(m, c, features, baseline) if self._held else None
            if shift is not None:  # pending="margin": the candidates' side moved (the baseline's draws kept)
                values = values + shift
            if self.chance_monotone is not None and not c.versus_baseline:
                values = _envelope(values, c.at_most, self._forward(c), maximum=c.at_most)
                base = values[..., rows, baseline]
            p = c.satisfied(values, base).to(values.dtype).mean(0)
        if self.chance_monotone is not None and not c.versus_baseline and self._closed[m]:
            p = _envelope(p, c.at_most, self._forward(c), maximum=False)
        if c.versus_baseline:
            p[..., rows, baseline] = 1.0  # p is a new tensor in every branch above
        return p

    def _recal_shift(self, c, predicted: torch.Tensor):
        """``(bias [R], se [R])`` of an absolute chance constraint's metric on the played allowed actions
        so far (``chance_recalibrate``; module docstring), after keeping ``predicted [R, K]`` (the
        model's mean at each action) for ``update``; None when not recalibrating."""
        if not self.chance_recalibrate or c.versus_baseline or predicted.dim() != 2:
            return None
        key = _guard_index(self._guards, c)
        self._recal_pred[key] = predicted
        state = self._recal.get(key)
        if state is None or state[0].shape[0] != predicted.shape[0]:
            R = predicted.shape[0]
            state = self._recal[key] = [torch.zeros(R, dtype=torch.float64, device=predicted.device) for _ in range(3)]
        n, s1, s2 = state
        return s1 / (n + 1.0), s2.sqrt() / (n + 1.0)

    def _recalibration_update(self, reward, constraints, actions) -> None:
        """Add the played allowed actions' residuals (observed minus predicted mean) to the
        recalibration record (``chance_recalibrate``); rows that fell back are left out."""
        claims = self.last_chance_claims
        if actions is None or claims is None or claims[1].dim() != 2 or not self._recal_pred:
            return
        device = claims[1].device
        actions = _tensor_on(actions, None, device).long().reshape(-1)
        R = actions.shape[0]
        rows = torch.arange(R, device=device)
        ok = claims[1][rows, actions].to(torch.float64)
        reward = _tensor_on(reward, torch.float64, device).reshape(R)
        if constraints is not None:
            constraints = _tensor_on(constraints, torch.float64, device).reshape(R, -1)
        for key, (m, _) in enumerate(self._guards):
            if key not in self._recal_pred or key not in self._recal:
                continue
            y = reward if m == 0 else constraints[:, m - 1]
            r = (y - self._recal_pred[key][rows, actions]) * ok
            n, s1, s2 = self._recal[key]
            n += ok
            s1 += r
            s2 += r * r

    def _forward(self, c) -> bool:
        """Whether meeting ``c`` at action ``k`` implies meeting it at every lower index (the
        envelope runs from index 0 up): an ``at_most`` bound on an increasing metric, an ``at_least``
        bound on a decreasing one."""
        return c.at_most == (self.chance_monotone == "increasing")

    def _chance_allowed(self, m: int, c, p: torch.Tensor, features, baseline, draws: dict) -> torch.Tensor:
        """``[*lead, R, K]``: the chance constraint ``c`` (model ``m``) allows the action (module
        docstring, "Calibrated chance constraints"): ``p >= q`` as declared; with ``chance_selection=
        "bonferroni"`` against ``1 - (1 - q) / K``; with ``chance_mcse="batch"`` ``p`` lowered by
        ``z_q`` Monte-Carlo standard errors (batch means) where ``p`` comes from draws."""
        q = float(c.confidence)
        if self.chance_selection == "bonferroni":
            q = 1.0 - (1.0 - q) / features.shape[1]
        if self.chance_mcse is None or self._closed[m]:
            return p >= q
        values = draws[m]
        rows = torch.arange(features.shape[0], device=features.device)
        met = c.satisfied(values, values[..., rows, baseline]).to(values.dtype)  # [S, *lead, R, K]
        se = _batch_means_se(met)
        if c.versus_baseline:
            se[..., rows, baseline] = se.new_zeros(())
        return p - _normal_quantile(q) * se >= q

    def _judge(self, features, baseline, generator):
        """One guarded decision's draws and verdicts: ``(fr, allowed [*lead, R, K], parts)`` with
        ``parts = (singles, probability)`` for the fallback."""
        rows = torch.arange(features.shape[0], device=features.device)
        fr, single, draws = self._values(features, generator)
        moments: dict = {}
        allowed = None
        singles, prob = [], None
        verdicts = []
        claims = []  # the chance guards' probabilities, for last_chance_claims
        for m, c in self._guards:
            if _chance(c):
                p = self._probability(m, c, features, baseline, draws, moments)
                ok = self._chance_allowed(m, c, p, features, baseline, draws)
                claims.append(p)
                prob = p if prob is None else prob * p
            else:
                values = single[m]
                base = values[..., rows, baseline]
                shift = self._pending_shift(m, c, features, baseline) if self._held else None
                if shift is not None:  # pending="margin": the candidates' side (the baseline's draw kept)
                    values = values + shift
                ok = c.satisfied(values, base)
                if c.versus_baseline:
                    ok[..., rows, baseline] = ok.new_ones(())  # a device scalar: a Python one is copied from the host
                singles.append((c, values, base))
            verdicts.append(ok)
            allowed = ok if allowed is None else allowed & ok
        if allowed is None:
            allowed = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        self._verdicts = verdicts  # per guard, for the fallback record (_record_fallback)
        if claims:  # the calibration record (chance_guards): references only, no copies
            self.last_chance_claims = (torch.stack(claims) if len(claims) > 1 else claims[0][None], allowed)
        return fr, allowed, (singles, prob)

    def _select_guarded(self, features, baseline, generator, valid) -> torch.Tensor:
        rows = torch.arange(features.shape[0], device=features.device)
        fr, allowed, (singles, prob) = self._judge(features, baseline, generator)
        if valid is not None:
            base_ok = allowed[..., rows, baseline]
            allowed = allowed & valid
            allowed[..., rows, baseline] = base_ok  # the baseline stays a candidate, judged by the constraints
        actions = masked_argmax(fr, allowed)
        empty = ~allowed.any(-1)
        if not bool(empty.any()):
            return self._record_fallback(empty, actions, False)
        if self.fallback == "baseline":
            other = baseline
        else:
            candidates = None
            if valid is not None:
                candidates = valid.clone()
                candidates[rows, baseline] = candidates.new_ones(())
            other = _safest(singles, prob, candidates, baseline, rows)
        return self._record_fallback(empty, torch.where(empty, other, actions), True)

    # ------------------------------------------------------------------ the fallback record
    @property
    def fallback_constraints(self) -> tuple | None:
        """The guards a fallback is reported against (the rows of ``last_fallback_by``): the
        declared ``constraints``; None where this policy never falls back (the paper path: alpha or
        relative single-draw constraints, one per model in order, keep the baseline allowed)."""
        return None if self._paper else self.constraints

    def _record_fallback(self, empty: torch.Tensor, actions: torch.Tensor, fell: bool) -> torch.Tensor:
        """Set ``last_fallback`` (``[*lead, R]`` bool: the row allowed no action and the fallback was
        played) and ``last_fallback_by`` (``[G, *lead, R]``: per declared guard, the fallback rows whose
        played action this decision's own verdict (its draw, or its probability against
        ``confidence``) did not judge to meet that guard: the guards that bound). Every fallback row
        names at least one guard (the played action would otherwise have been allowed). No row fell
        back: views of ``empty`` (all False), no work. Returns ``actions``."""
        shape = actions.shape
        empty = empty.expand(shape)
        verdicts = self._verdicts
        if not fell:
            self.last_fallback, self.last_fallback_by = empty, empty.expand(len(verdicts), *shape)
            return actions
        K = verdicts[0].shape[-1]
        # every verdict [*lead, R, K] broadcast to the actions' shape, stacked: one gather of the played column
        table = torch.stack([ok.expand(*shape, K) for ok in verdicts])  # [G, *shape, K]
        met = table.gather(-1, actions[None, ..., None].expand(len(verdicts), *shape, 1))[..., 0]
        self.last_fallback = empty
        self.last_fallback_by = empty & ~met
        return actions

    def constraint_probabilities(self, features, baseline, generator: Generator = None) -> torch.Tensor:
        """``P(constraint met)`` of every action under the posterior, per declared constraint:
        ``[G, R, K]`` (``G = len(policy.constraints)``), evaluated as a chance constraint is (closed
        form for conjugate known-noise Gaussian models, else ``confidence_draws`` joint draws),
        whether or not the constraint has a ``confidence``; a relative constraint's baseline entry
        is 1 (exempt)."""
        if self.constraints is None:
            raise ValueError("constraint_probabilities: this TSASC was built with alpha=; declare constraints= "
                             "(e.g. Constraint.from_alpha(metric, alpha)) to ask for their probabilities")
        features, baseline, _ = self._check(features, baseline, None)
        models = (self.reward_model, *self.constraint_models)
        draws: dict = {}
        moments: dict = {}
        out = []
        for m, c in self._guards:
            if not self._closed[m] and m not in draws:
                draws[m] = self._chance_draws(m, models[m], features, generator)
            out.append(self._probability(m, c, features, baseline, draws, moments))
        if not out:
            return torch.zeros((0, *features.shape[:2]), dtype=torch.float64, device=features.device)
        return torch.stack(out)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        if self.chance_recalibrate:
            self._recalibration_update(reward, constraints, actions)
        plan = self._plan_of_models()
        checked = _fast.update_inputs(features_chosen, reward, constraints, _model_dims(self.reward_model),
                                      self.num_constraints)
        # the constraint models learn the same rows: checked once when they expect the reward model's shapes
        if checked is not None and plan[4]:
            features_chosen, reward, constraints = checked
            if features_chosen.shape[0] == 1 and plan[2] is not None:
                self._update_stacked(features_chosen, reward, constraints)
                return
            _fast.update_model(self.reward_model, features_chosen, reward, actions)
            for j, model in enumerate(self.constraint_models):
                _fast.update_model(model, features_chosen, constraints[:, j], actions)
            return
        features_chosen, reward, constraints = check_update_inputs(
            features_chosen, reward, constraints, num_constraints=self.num_constraints, models=(self.reward_model,))
        self.reward_model.update(features_chosen, reward, actions=actions)
        for j, model in enumerate(self.constraint_models):
            model.update(features_chosen, constraints[:, j], actions=actions)

    def _update_stacked(self, x, reward, constraints) -> None:
        """``update``'s one-row path of one stream of conjugate known-noise models (``_stackable``), for
        checked float64 ``x [1, d]``, ``reward [1]`` and ``constraints [1, C]``: the row's views made
        once for all of them (``BayesianLinear._update_checked``), each constraint's outcome a column
        view [1, 1] (one row: x^T [d, 1] and x [1, d] broadcast as the unsqueezed views do, the
        outcomes [1])."""
        rows = (x.mT, x)
        self.reward_model._update_checked(x, reward, (*rows, reward))
        if len(self.constraint_models) == 1:  # constraints [1, 1]: the column itself
            self.constraint_models[0]._update_checked(x, None, (*rows, constraints))
        else:
            for j, model in enumerate(self.constraint_models):
                model._update_checked(x, None, (*rows, constraints.narrow(1, j, 1)))  # its column [1, 1]

    def _learn_values(self, row: np.ndarray, d: int) -> bool:
        """The Decider's feedback as one float64 array ``row [1, d + 1 + C]`` (the played features, the
        reward, the constraint values; checked and finite): ``update`` of it through ``_update_stacked``
        when ``update`` would take that path, True; else False (nothing learned: the Decider calls
        ``update``). For rows the Decider checked and made, ``update``'s own checks
        (``_fast.update_inputs``) would return them unchanged, so only what they compare with the
        models, ``d``, is compared here. While the models hold their joint
        posterior (``_joint_of``, kept by the decisions) they learn the row together
        (``_JointPosterior.learn``: two operations, the numbers of the models' own updates)."""
        plan = self._plan_of_models()
        if self.chance_recalibrate or plan[2] is None or not plan[4] or d != plan[3][2] or row.shape[1] != d + len(plan[2]):
            return False
        x = torch.from_numpy(row[:, :d])
        joint = self.__dict__.get("_joint")
        if joint is not None and joint.holds(plan[2]):
            joint.learn(x, row[:, :d], row[0, d:])
        else:
            self._update_stacked(x, torch.from_numpy(row[:, d]), torch.from_numpy(row[:, d + 1:]))
        return True

    def _settings(self) -> dict[str, object]:
        if self.constraints is not None:
            out: dict[str, object] = {"constraints": [str(c) for c in self.constraints]}
        else:
            out = super()._settings()
        if getattr(self, "metric_names", None):
            out["metric_names"] = list(self.metric_names)
        if getattr(self, "fallback", "safest") != "safest":
            out["fallback"] = self.fallback
        return out

    def models(self):
        out = {"reward": self.reward_model}
        out.update({f"constraint{j}": m for j, m in enumerate(self.constraint_models)})
        return out


# ---------------------------------------------------------------------- helpers
def _chance(c) -> bool:
    return c is not None and getattr(c, "confidence", None) is not None


def _pending_refusal(model) -> str | None:
    """Why ``model`` cannot keep a margin for pending outcomes (``pending="margin"``), or None: a conjugate
    known-noise Gaussian ``BayesianLinear`` (duck-typed) can."""
    name = type(model).__name__
    engine = getattr(model, "engine_name", None)
    if hasattr(model, "arms"):
        return f"is a {name} (a model per arm)"
    if engine != "conjugate":
        return f"is a {name} with engine {engine!r}"
    if getattr(model, "noise_prior", None) is not None:
        return f"is a {name} with a noise_prior (Normal-Inverse-Gamma)"
    if getattr(model, "likelihood", "gaussian") != "gaussian":
        return f"is a {name} with likelihood {getattr(model, 'likelihood', None)!r}"
    if not all(isinstance(getattr(model, a, None), torch.Tensor) for a in ("precision", "eta")):
        return f"is a {name} without a conjugate precision"
    return None


def _closed_form(model) -> bool:
    """Whether ``f(x) = x^T w`` is Gaussian under ``model``'s posterior: a conjugate, known-noise
    Gaussian ``BayesianLinear`` (duck-typed: policies do not import model classes)."""
    return (getattr(model, "conjugate", False) is True and getattr(model, "noise_prior", None) is None
            and getattr(model, "likelihood", "gaussian") == "gaussian" and callable(getattr(model, "predict", None)))


def _batched_draws(model) -> bool:
    """Whether ``model`` draws ``S`` joint samples in one call without changing its state: a conjugate
    ``BayesianLinear`` or ``PerArmLinear`` (its ``arms``) with ``batch_shape [R]``."""
    inner = getattr(model, "arms", model)
    shape = tuple(getattr(model, "batch_shape", ()) or ())
    return getattr(inner, "engine_name", None) == "conjugate" and len(shape) == 1


class _StreamDraws(ReplicationRNG):
    """``S`` draws per replication from the streams of a ``ReplicationRNG``: a model asking for
    ``[R, *shape]`` numbers gets ``[S, R, *shape]``, replication ``r``'s from its own stream (so a
    batched run equals single runs, as ``simulate`` promises)."""

    def __init__(self, parent: ReplicationRNG, num_draws: int):  # the parent's streams serve
        self.parent, self.num_draws = parent, int(num_draws)
        self.seeds, self.block, self._streams, self.device = parent.seeds, parent.block, {}, parent.device

    def _draw(self, kind, shape, key, dtype):
        return self.parent._draw(kind, (self.num_draws, *(int(s) for s in shape)), key, dtype).movedim(1, 0)


def _tensor_on(value, dtype, device) -> torch.Tensor:
    """``value`` (a tensor, array, list or number) as a tensor of ``dtype`` (None: its own) on ``device``."""
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(np.asarray(value), device=device)
    return value.to(device=device, dtype=dtype if dtype is not None else value.dtype)


def _envelope(values: torch.Tensor, at_most: bool, forward: bool, maximum: bool) -> torch.Tensor:
    """The running maximum (``maximum``) or minimum of ``values [..., K]`` over the action index, from
    index 0 up (``forward``) or from ``K - 1`` down (``chance_monotone``): per draw, the least
    monotone function above (below) the drawn one, so a bound met by the envelope is met by every
    monotone function of the draw's side; for probabilities (closed form) the running minimum of
    ``P(met)``, since under monotonicity meeting it at ``k`` implies meeting it at the lower indices."""
    del at_most
    x = values if forward else values.flip(-1)
    x = x.cummax(-1).values if maximum else x.cummin(-1).values
    return x if forward else x.flip(-1)


@functools.lru_cache(maxsize=8)
def _normal_grid(S: int) -> torch.Tensor:
    """``S`` standard normal quantiles ``Phi^-1((s + 1/2) / S)`` in a fixed shuffled order (so that
    a trend over a chain's successive draws does not meet a trend in the grid)."""
    from statistics import NormalDist

    nd = NormalDist()
    # made on the CPU (a constant, cached) and put on the draws' device where it is used
    grid = torch.tensor([nd.inv_cdf((s + 0.5) / S) for s in range(S)], dtype=torch.float64, device="cpu")
    return grid[torch.randperm(S, generator=torch.Generator(device="cpu").manual_seed(S), device="cpu")]


def _guard_index(guards: tuple, c) -> int:
    """The position of constraint ``c`` (this very object) among ``guards`` (a copy of the policy
    copies both, so the position survives ``copy.deepcopy``)."""
    return next(g for g, (_, other) in enumerate(guards) if other is c)


def _normal_quantile(q: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def _batch_means_se(met: torch.Tensor, batches: int = 8) -> torch.Tensor:
    """The Monte-Carlo standard error of ``met.mean(0)`` by non-overlapping batch means (Flegal &
    Jones 2010, "Batch means and spectral variance estimators in MCMC", Ann. Statist. 38(2)):
    ``S`` draws in ``b = min(8, S // 2)`` batches of ``S // b`` (the first ``b (S // b)`` draws),
    ``se = sd(batch means) / sqrt(b)``. Autocorrelated chain draws get the wider error they have;
    for independent draws it estimates ``sqrt(p (1 - p) / S)``."""
    S = met.shape[0]
    b = max(2, min(batches, S // 2))
    size = S // b
    means = met[: b * size].reshape(b, size, *met.shape[1:]).mean(1)
    return means.std(0) / b ** 0.5


def _batch_of(generator: Generator, S: int, R: int):
    """The ``S`` batched draws of a conjugate ``[R]`` model under ``generator``: a ``DrawBatch`` on the same
    stream (a log's rows keep their own draws), a ``ReplicationRNG``'s streams, or a plain generator's."""
    if isinstance(generator, DrawBatch):
        return DrawBatch(S, R, generator.generator, independent_rows=generator.independent_rows)
    if isinstance(generator, ReplicationRNG):
        return _StreamDraws(generator, S)
    return DrawBatch(S, R, generator if generator is not None else torch.default_generator)


def _joint_draws(model, features: torch.Tensor, generator: Generator, key: str, S: int, thin: int = 1) -> torch.Tensor:
    """``S`` joint posterior draws of ``model`` at ``features [R, K, d]`` -> ``[S, R, K]`` (module docstring);
    a chain engine drawn one at a time keeps every ``thin``-th draw (``confidence_thin``)."""
    R = features.shape[0]
    if _batched_draws(model):
        return model.sample_at(features, _batch_of(generator, S, R), key=key)
    if isinstance(generator, DrawBatch):
        # propensities / action_probabilities: S draws from copies of a chain, which does not move
        # (played=False; the engines' draw docstrings), nor does any other engine's state; a log's rows
        # (independent_rows) keep their own draws
        return model.sample_at(features, DrawBatch(S, R, generator.generator,
                                                   independent_rows=generator.independent_rows), key=key)
    # one draw at a time: a chain advances S steps and keeps its shape
    if thin > 1 and getattr(model, "engine_name", None) in ("gibbs", "langevin"):
        kept = []
        for _ in range(S):
            for _ in range(thin - 1):
                model.sample_at(features, generator, key=key)
            kept.append(model.sample_at(features, generator, key=key))
        return torch.stack(kept)
    lean = model._chain_draws_at(features, S, generator, key) if hasattr(model, "_chain_draws_at") else None
    if lean is not None:
        return lean
    return torch.stack([model.sample_at(features, generator, key=key) for _ in range(S)])


def _bankable(model) -> bool:
    """Whether ``model``'s chance draws can come from a bank of weight draws (``chance_refresh``): a
    ``BayesianLinear`` (duck-typed: ``sample`` of the weights, ``f(x) = link(x^T w)``), not a per-arm
    model or the probit GP's views (their draws stay fresh)."""
    return (callable(getattr(model, "sample", None)) and isinstance(getattr(model, "dim", None), int)
            and getattr(model, "likelihood", None) in ("gaussian", "probit", "logistic")
            and getattr(model, "engine_name", None) is not None and not hasattr(model, "arms")
            and hasattr(model, "num_observations"))


def _rows_learnt(model) -> int:
    """The most rows any batch element of ``model`` has learnt."""
    n = model.num_observations
    return int(n.max()) if isinstance(n, torch.Tensor) and n.numel() else int(n) if not isinstance(n, torch.Tensor) else 0


def _weight_draws(model, generator: Generator, key: str, S: int, thin: int, R: int) -> torch.Tensor:
    """``S`` joint draws of ``model``'s weights ``[S, *batch, d]`` made as ``_joint_draws`` makes its
    draws of ``f`` (the same streams and the same numbers: ``_at_weights`` of them is what ``_joint_draws``
    returns): one batched call for the conjugate ``[R]`` models, else ``S`` ordinary draws in turn (a chain
    advances ``S`` steps, keeping every ``thin``-th). Under a played ``DrawBatch`` (the ``Decider``) the
    draws are ordinary ones from its generator."""
    if _batched_draws(model):
        return model.sample(_batch_of(generator, S, R), key=key)
    if isinstance(generator, DrawBatch):
        generator = generator.generator
    step = thin if getattr(model, "engine_name", None) in ("gibbs", "langevin") else 1
    draw = model.sample
    if getattr(model, "engine_name", None) == "gibbs" and not getattr(model, "conjugate", True):
        check_generator(generator)  # once: a Gibbs model's sample(generator) is its engine's draw
        draw = model.engine.draw
    kept = []
    for _ in range(S):
        for _ in range(step - 1):
            draw(generator, key=key)
        kept.append(draw(generator, key=key))
    return torch.stack(kept)


def _at_weights(model, weights: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``f(x) = link(x^T w)`` of ``S`` weight draws ``[S, *batch, d]`` at ``features [*batch, K, d]`` (or
    ``[R, K, d]`` for a model without a batch axis) -> ``[S, R, K]``, as ``BayesianLinear.sample_at``."""
    extra = features.dim() - 2 - len(tuple(getattr(model, "batch_shape", ()) or ()))
    if extra > 0:
        weights = weights.reshape(weights.shape[0], *(1,) * extra, *weights.shape[1:])
    f = (weights[..., None, :] @ features.mT)[..., 0, :]
    if model.likelihood == "gaussian":
        return f
    from ..models.gibbs import lanewise
    from ..models.linear import _LINKS

    return lanewise(_LINKS[model.likelihood], f)


def _shortfall(c, values: torch.Tensor, base: torch.Tensor, rows, baseline) -> torch.Tensor:
    """``max(0, -margin) / scale`` of one single-draw constraint ``[*lead, R, K]`` (module docstring)."""
    limit = (c.bound * base)[..., None] if c.versus_baseline else c.bound
    margin = limit - values if c.at_most else values - limit
    short = (-margin).clamp_min(0.0)
    if c.versus_baseline:
        scale = base.abs()[..., None]
        short = short / torch.where(scale > 0, scale, torch.ones_like(scale))
        short[..., rows, baseline] = short.new_zeros(())
    elif c.bound != 0:
        short = short / abs(c.bound)
    return short


def _safest(singles, prob, candidates, baseline, rows) -> torch.Tensor:
    """The ``"safest"`` fallback action of every row (module docstring): the highest product of the
    chance constraints' probabilities, ties (and the single-draw mode) broken by the least total
    shortfall on the single-draw constraints, then by the lowest index."""
    short = sum(_shortfall(c, values, base, rows, baseline) for c, values, base in singles) if singles else None
    if prob is None:
        return masked_argmax(-short, candidates)
    if short is None:
        return masked_argmax(prob, candidates)
    p = prob if candidates is None else prob.masked_fill(~candidates, -1.0)
    best = p >= p.max(-1, keepdim=True).values
    return masked_argmax(-short, best)


def _is_constraint(c) -> bool:
    """A ``bayes_safe.envs.Constraint`` (duck-typed: policies do not import ``envs``)."""
    return all(hasattr(c, a) for a in ("metric", "bound", "at_most", "versus_baseline")) and callable(
        getattr(c, "satisfied", None))


def _as_constraint_list(constraints) -> list:
    if _is_constraint(constraints):
        constraints = [constraints]
    if not isinstance(constraints, (list, tuple)):
        raise TypeError(f"constraints: expected a sequence of bayes_safe.envs.Constraint, got {type(constraints).__name__}")
    for j, c in enumerate(constraints):
        if not _is_constraint(c):
            raise TypeError(f"constraints[{j}]: expected a bayes_safe.envs.Constraint (e.g. "
                            f"Constraint.relative('unsubscribe', at_most=1.02)), got {type(c).__name__}")
    return list(constraints)


def _check_constraints(constraints, count: int) -> tuple:
    """One ``Constraint`` per constraint model, as a tuple; clear errors otherwise."""
    constraints = _as_constraint_list(constraints)
    if len(constraints) != count:
        raise ValueError(f"constraints: expected one per constraint model ({count}), got {len(constraints)}; to "
                         "guard the reward, leave a metric unguarded or put several guardrails on one metric, "
                         "pass metric_names=(reward name, one name per constraint model) and the constraints are "
                         "matched by metric name")
    return tuple(constraints)


def _check_named_constraints(constraints, names: tuple) -> tuple:
    """Constraints matched to the models by metric name: every metric must be one of ``names``."""
    constraints = _as_constraint_list(constraints)
    for j, c in enumerate(constraints):
        if c.metric not in names:
            raise ValueError(f"constraints[{j}]: guards {c.metric!r}, which is not one of metric_names {list(names)} "
                             "(the reward first, then one per constraint model)")
    return tuple(constraints)


def _check_metric_names(names, count: int) -> tuple | None:
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise TypeError(f"metric_names: expected a sequence of {count + 1} names (the reward first, then one per "
                        f"constraint model), got {type(names).__name__}")
    names = tuple(names)
    if len(names) != count + 1:
        raise ValueError(f"metric_names: expected {count + 1} names (the reward first, then one per constraint "
                         f"model: {count}), got {len(names)}: {list(names)}")
    if not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"metric_names: expected non-empty strings, got {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"metric_names: expected distinct names, got {list(names)}")
    return names
