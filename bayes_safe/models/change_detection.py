"""Adaptive forgetting (issues 30 and 43): forget only when the data say that the world changed.

``BayesianLinear(..., forgetting="adaptive")`` (or ``forgetting=AdaptiveForgetting(threshold=...,
drift=...)``) keeps every observation, as without forgetting, until a change detector run on the
model's own one-step predictive residuals raises an alarm; the batch elements that raise one
restart from the prior (the stabilised rule of Kulhavy & Zarrop 1993 at factor 0: the data are
forgotten, the prior kept) and learn the observation that raised it.

The detector is Page's two-sided cumulative-sum test (CUSUM; Page 1954, "Continuous inspection
schemes", Biometrika 41, section 2: ``S_n = max(0, S_{n-1} + x_n - k)``, an alarm when ``S_n > h``;
run on ``z`` for an upward shift and on ``-z`` for a downward one) on the standardised residual
``z = (y - x^T m) / sqrt(sigma^2 + x^T Sigma x)`` of each observation *before* it is learned
(``m``, ``Sigma``: the posterior mean and covariance then). The restart after an alarm is that of
the change-detection bandits (CUSUM-UCB, Liu, Lee & Shroff 2018, AAAI, "A change-detection based
framework for piecewise-stationary multi-armed bandit problems", Algorithm 1: the arm's
statistics are reset when its CUSUM test fires), applied here to a Bayesian posterior.

Why these residuals: when the model is right (the weights drawn from the prior and fixed, the noise
Gaussian of the stated scale), the next outcome given everything seen so far is Gaussian with the
posterior predictive mean and variance, whatever rule chose ``x`` from the past and from
randomness of its own (a Thompson draw). So the ``z`` are independent ``N(0, 1)``: the test's false
alarm rate does not depend on the policy. After a change of the weights by ``delta``, the
residuals of a well-learned arm shift by ``x^T delta`` in units of the noise, and the statistic
grows by about ``|shift| - k`` per observation.

Defaults: ``drift k = 0.5`` (tuned to a shift of one predictive standard deviation, ``k = delta /
2``) and ``threshold h = 10``. By Siegmund's approximation of the in-control run length of a
one-sided CUSUM, ``(exp(2 k b) - 2 k b - 1) / (2 k^2)`` with ``b = h + 1.166``, a false alarm of
one side comes once in about 1.4e5 observations, so once in about 7e4 for the two-sided test, and
a shift of 2 standard deviations is found in about ``h / (2 - k) = 7`` observations. With the
Normal-Inverse-Gamma model the residual is divided by the Student-t predictive's scale
``sqrt(b_n / a_n (1 + x^T V x))``: heavier-tailed than ``N(0, 1)`` while ``a_n`` is small (the
first few observations), the same afterwards.

0/1 outcomes (issue 43). A click or an adverse event is not Gaussian: a drop of a click rate from
0.3 to 0.2 under a Gaussian model of noise sd 0.35 is a shift of about 0.3 sd, below the Gaussian
test's allowance, and a hit of a 1 % metric is a residual of about 10 sd, which that test reads as
a change. So for 0/1 outcomes (a logistic or probit model, or ``outcomes="binary"`` for a Gaussian
model of a 0/1 metric) the test runs on the likelihood the outcome has: the risk-adjusted Bernoulli
CUSUM (Steiner, Cook, Farewell & Treasure 2000, "Monitoring surgical performance using
risk-adjusted cumulative sum charts", Biostatistics 1, eq. 2), with the model's one-step predictive
probability ``p`` as each observation's own risk: ``S_n = max(0, S_{n-1} + y log r - log(1 - p +
r p))``, the log-likelihood ratio of the odds of success multiplied by ``r`` against the
predictive, run with ``r = odds_ratio`` (a rise) and ``r = 1 / odds_ratio`` (a fall).

The sensitivity is one number read as a rate: ``false_alarm_rate`` sets ``h = log(2 /
false_alarm_rate)``. For a CUSUM of log-likelihood ratios the in-control average run length is at
least ``exp(h)`` (Lorden 1971, "Procedures for reacting to a change in distribution", Ann. Math.
Statist. 42, Theorem 2, through Wald's identity), whatever the sequence of risks; two sides give a
false alarm at most once in ``exp(h) / 2`` observations of a right model. The bound is
conservative: measured on stationary streams (``tests/test_drift_binary.py``) a linear-probability
model of a 1 % metric raised 0 alarms against a bound of 100 in 1e6 observations, a laplace
logistic model of a 20 % click rate 3 against 100. A model still learning its rates looks like
drift (its predictive is off by more than the test's allowance), so an element is tested only after
``warmup`` observations (default ``20 d``; a model warm-started by ``update`` counted its history)
and, for 0/1 outcomes, once it has learned ``warmup_events`` of the rarer outcome (default ``2 d``:
200 rows of a 1 % metric are only 2 events, and a posterior still wide on the logit scale overstates
a rare rate; on stationary 1 % streams at d = 4 this cut a laplace model's false alarms from 405 to
74, and from 26 to 8 under a wider prior, against a bound of 100).

Known limit, measured: the laplace engine's one-pass approximation overstates a rare rate (a 1 %
metric read as 1.3 % after 5,000 rows; 1.06 % from a batch fit of the same rows), which the
downward test reads as a fall. Before the event warm-up that gave 26 to 405 alarms against a bound
of 100 in 1e6 observations, depending on the prior; with it 8 to 74, and 3 against a bound of 4 in
the drift benchmark's rare-metric table. A conjugate model of the rare metric
(``outcomes="binary"``) raised none in either.

Restarts (issue 43). A restart returns to the *base prior*: the model's prior, or the ``base_prior``
it was given (the weak prior a ``power_prior`` warm start was built on, without which a restart
would return to the old world; or ``redraw_prior`` of the warm start, which keeps the size of the
weights and forgets their values; conjugate engines and the laplace engine). ``keep`` in ``[0, 1)`` keeps that share of what was learned (the
stabilised rule at factor ``keep``): 0 restarts cold, a small share restarts from a discounted warm
start. Engines: conjugate and Normal-Inverse-Gamma (the statistics), laplace (its data summary
``(H, g)`` weighed), the Gibbs engine's logistic chain (the element's old rows weighed in every
later sweep) and its Gaussian likelihood (the sufficient statistics and the count the noise step
sees, weighed), Langevin (Gaussian: statistics and count weighed; 0/1: the element's old rows set
to ``x = 0``, whose likelihood ``sigmoid(0)`` or ``Phi(0)`` is a constant, so ``keep = 0`` only;
the restarted chain starts again from the prior's median, and its preconditioner follows the rows
since the restart), NUTS and SVI (each old row's log-likelihood weighed in every later fit; the
next query refits, and later refits come as the restarted element's own rows double). The base
prior is the prior on the sampled engines. The Gibbs engine's probit likelihood refuses adaptive
forgetting by name (its augmentation has no weighted form).

The sampled engines' predictive (issue 43). The test reads each engine's own one-step predictive:
the Gibbs chain's Gaussian conditional at its current state (after a policy's draw), posterior
draws of a copy of the Langevin chains (``predict_steps`` of them, drawn anew once the rows since
reach 2 % of the fewest rows any element learned since its restart), and the held draws of the last
NUTS or SVI fit (refits as the data double). These are estimates, off by most while the posterior
still moves fast, so these engines test an element only after ``20 d`` rows since its (re)start
(``warmup``, as for 0/1 outcomes). Measured on stationary streams written in the tests (a policy's
draw at every step): 0 false alarms in 12,000 Gaussian observations of a Gibbs model and 3,200 of a
Langevin model (a bound of 1.1 and 0.3 by Lorden's inequality), and 0 in 6,000 0/1 observations of
a logistic Langevin model at ``false_alarm_rate = 1e-3`` (a bound of 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_DTYPE = torch.float64


OUTCOMES = ("auto", "gaussian", "binary")
BINARY_FALSE_ALARM_RATE = 1e-5  # the 0/1 test's default bound on false alarms per observation
BINARY_WARMUP_PER_FEATURE = 20  # the 0/1 test's default warm-up: 20 observations per feature


@dataclass(frozen=True)
class AdaptiveForgetting:
    """Forgetting that waits for evidence of a change (see the module docstring).

    One sensitivity setting, read as a false-alarm rate: ``false_alarm_rate`` (per observation,
    both directions together) sets the alarm level ``h = log(2 / false_alarm_rate)`` of the
    log-likelihood-ratio statistic, whose in-control run length is at least ``exp(h)`` per side
    (Lorden 1971), so a right model raises false alarms at most at that rate; and a detectable
    shift: ``drift`` (Gaussian, in predictive sd: the test is tuned to a shift of ``2 drift``) or
    ``odds_ratio`` (0/1 outcomes: tuned to the odds of a success multiplied, or divided, by it).

    Args:
        threshold: ``h > 0`` in the statistic's units (predictive sd for Gaussian outcomes, nats
            for 0/1 outcomes); give it or ``false_alarm_rate``, not both. Default: Gaussian 10
            (the issue-30 setting: a false alarm at most once in ``exp(2 drift h) / 2 = 1.1e4``
            observations by Lorden's bound, once in about 7e4 by Siegmund's approximation);
            0/1 ``log(2 / 1e-5)`` (at most one false alarm in 1e5 observations).
        drift: ``k >= 0``, the Gaussian test's allowance per observation (default 0.5: tuned to
            shifts of one predictive standard deviation; larger ignores smaller shifts).
        false_alarm_rate: in (0, 0.5): the bound on false alarms per observation (sets ``threshold``;
            the Gaussian test then needs ``drift > 0``).
        odds_ratio: ``> 1``, the 0/1 test's shift: an upward test against the odds of success
            times ``odds_ratio`` and a downward one against them divided by it (default 2).
        outcomes: ``"auto"`` (default: 0/1 for a logistic or probit model, Gaussian otherwise),
            ``"gaussian"`` or ``"binary"`` (a Gaussian model of a 0/1 metric: the test reads the
            model's mean ``x^T m`` as the success probability, clipped to ``[1e-4, 1 - 1e-4]``).
        warmup: observations a batch element learns after its construction or a restart before
            it is tested (default: 0 for Gaussian outcomes of an exact model, ``20 d`` for 0/1: a
            predictive still learning its rates looks like drift; ``20 d`` too for the sampled
            engines, Gibbs, Langevin, NUTS and SVI, whose predictive is estimated from draws or held
            between refits, off by most while the posterior still moves fast). A model warm-started by ``update`` has counted
            its history rows already.
        warmup_events: 0/1 outcomes: the fewer of the ones and the zeros an element must have
            learned since its construction or a restart before it is tested (default ``2 d``): the
            rows of a rare metric carry little information (200 rows of a 1 % metric are 2
            events), and a posterior still wide on the logit scale overstates a rare rate.
        keep: in ``[0, 1)``, the weight what was learned keeps at a restart (default 0: the
            base prior alone; ``keep > 0`` restarts from a discounted warm start, the stabilised
            rule at factor ``keep``). Measured (docs/reports/drift.md): a few rows' worth helps, a
            share of the history does not; ``keep = 10 / n`` after ``n`` rows (0.0005 after
            20,000: regret after a change 0.36x no forgetting's, against 0.51x at 0 and over
            0.7x at 0.02).
    """

    threshold: float | None = None
    drift: float = 0.5
    false_alarm_rate: float | None = None
    odds_ratio: float = 2.0
    outcomes: str = "auto"
    warmup: int | None = None
    keep: float = 0.0
    warmup_events: int | None = None

    def __post_init__(self):
        def number(name, value, ok, expected):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
                raise ValueError(f"{name}: expected {expected} (AdaptiveForgetting), got {value!r}")
            object.__setattr__(self, name, float(value))

        if self.threshold is not None:
            number("threshold", self.threshold, lambda v: v > 0, "a finite number > 0")
        number("drift", self.drift, lambda v: v >= 0, "a finite number >= 0")
        if self.false_alarm_rate is not None:
            number("false_alarm_rate", self.false_alarm_rate, lambda v: 0 < v < 0.5,
                   "a number in (0, 0.5): false alarms per observation")
            if self.threshold is not None:
                raise ValueError("threshold, false_alarm_rate: give one of them (the rate sets the threshold), "
                                 f"got threshold={self.threshold!r} and false_alarm_rate={self.false_alarm_rate!r}")
        number("odds_ratio", self.odds_ratio, lambda v: v > 1, "a finite number > 1")
        number("keep", self.keep, lambda v: 0 <= v < 1, "a number in [0, 1)")
        if not isinstance(self.outcomes, str) or self.outcomes not in OUTCOMES:
            raise ValueError(f"outcomes: expected one of {list(OUTCOMES)} (AdaptiveForgetting), got {self.outcomes!r}")
        for name in ("warmup", "warmup_events"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name}: expected an int >= 0 (AdaptiveForgetting), got {value!r}")

    def level(self, binary: bool) -> float:
        """The alarm level ``h`` of the test on 0/1 (``binary``) or Gaussian outcomes, in its units."""
        if self.threshold is not None:
            return self.threshold
        if binary:
            return math.log(2.0 / (self.false_alarm_rate or BINARY_FALSE_ALARM_RATE))
        if self.false_alarm_rate is None:
            return 10.0
        if self.drift <= 0:
            raise ValueError("drift: a false_alarm_rate needs a Gaussian test tuned to a shift (drift > 0), got 0")
        return math.log(2.0 / self.false_alarm_rate) / (2.0 * self.drift)  # the LLR level over the shift 2k

    def rate_bound(self, binary: bool) -> float:
        """Lorden's bound on false alarms per observation of a right model (both sides together)."""
        h = self.level(binary)
        return min(1.0, 2.0 * math.exp(-(h if binary else 2.0 * self.drift * h)))

    def warmup_for(self, binary: bool, dim: int, sampled: bool = False) -> int:
        """The observations an element learns after a (re)start before it is tested (``sampled``: the
        model's predictive is a Monte Carlo or refit estimate, see ``warmup``)."""
        if self.warmup is not None:
            return self.warmup
        return BINARY_WARMUP_PER_FEATURE * int(dim) if binary or sampled else 0

    def is_binary(self, likelihood: str) -> bool:
        """Whether the test reads 0/1 outcomes for a model of this ``likelihood``."""
        return self.outcomes == "binary" or (self.outcomes == "auto" and likelihood != "gaussian")

    def __str__(self) -> str:
        return self.describe(self.outcomes == "binary")

    def describe(self, binary: bool) -> str:
        """The setting as a model of 0/1 (``binary``) or Gaussian outcomes runs it."""
        return f"adaptive ({self.test(binary)})"

    def test(self, binary: bool) -> str:
        """The test and its settings, as ``describe`` names them: ``"0/1 CUSUM, odds ratio 2"``."""
        extra = "".join(f", {k}={v:g}" for k, v in (("false_alarm_rate", self.false_alarm_rate),
                                                    ("keep", self.keep or None)) if v is not None)
        if binary:
            return f"0/1 CUSUM, odds ratio {self.odds_ratio:g}{extra}"
        h = "" if self.threshold is None else f"h={self.threshold:g}, "
        return f"CUSUM {h}k={self.drift:g}{extra}"


def parse_forgetting(forgetting):
    """``forgetting`` as given to ``BayesianLinear`` -> ``(factor or None, AdaptiveForgetting or None)``."""
    if isinstance(forgetting, AdaptiveForgetting):
        return None, forgetting
    if isinstance(forgetting, str) and forgetting == "adaptive":
        return None, AdaptiveForgetting()
    if forgetting is None:
        return None, None
    if isinstance(forgetting, bool) or not isinstance(forgetting, (int, float)) or not 0 < forgetting <= 1:
        raise ValueError(f"forgetting: expected a number in (0, 1] (the weight kept per observation), 'adaptive' "
                         f"(or an AdaptiveForgetting: forget when a change is detected) or None, got {forgetting!r}")
    return (None if forgetting == 1 else float(forgetting)), None


class CusumDetector:
    """Two-sided CUSUM statistics of a batch, ``[*batch]`` each (Page 1954; see the module docstring).

    Gaussian outcomes: ``step(z)`` on standardised residuals. 0/1 outcomes: ``step_binary(p, y)``
    on the predictive success probability and the outcome, the log-likelihood ratio of the odds
    multiplied (``upper``) or divided (``lower``) by ``odds_ratio`` (the risk-adjusted Bernoulli
    CUSUM of Steiner, Cook, Farewell & Treasure 2000, eq. 2).

    Attributes:
        upper, lower: the statistics of an upward and a downward shift (float64, >= 0).
        alarms: how many changes each batch element detected (long).
        since: observations each element learned since its construction or last alarm (long).
    """

    def __init__(self, config: AdaptiveForgetting, batch_shape, *, binary: bool = False, dim: int = 1,
                 device: torch.device | str | None = None, sampled: bool = False):
        self.config = config
        self.binary = bool(binary)
        self.level = config.level(self.binary)
        self.warmup = config.warmup_for(self.binary, dim, sampled)
        # 0/1 outcomes: the fewer of the ones and zeros learned since a (re)start before testing
        self.warmup_events = 0 if not self.binary else (
            config.warmup_events if config.warmup_events is not None else 2 * int(dim))
        # on the model's device (``device``; default the CPU), float64 statistics and long counts
        device = torch.device("cpu") if device is None else device
        self.upper = torch.zeros(tuple(batch_shape), dtype=_DTYPE, device=device)
        self.lower = torch.zeros(tuple(batch_shape), dtype=_DTYPE, device=device)
        self.alarms = torch.zeros(tuple(batch_shape), dtype=torch.long, device=device)
        self.since = torch.zeros(tuple(batch_shape), dtype=torch.long, device=device)
        self.ones = torch.zeros(tuple(batch_shape), dtype=torch.long, device=device)  # 0/1: the ones learned since a (re)start

    def step(self, z: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Add the standardised residuals ``z [*batch]`` (only where ``active`` when given); return
        the alarms (bool ``[*batch]``), whose statistics restart at 0."""
        k = self.config.drift
        return self._advance(z - k, -z - k, active)

    def step_binary(self, p: torch.Tensor, y: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Add 0/1 outcomes ``y [*batch]`` of predictive success probability ``p [*batch]``: the
        log-likelihood ratio ``y log r - log(1 - p + r p)`` for ``r`` the odds ratio (upward) and
        ``1 / r`` (downward). Returns the alarms as ``step`` does."""
        p = p.to(_DTYPE).clamp(1e-12, 1.0 - 1e-12)
        y = y.to(_DTYPE)
        log_r = math.log(self.config.odds_ratio)
        r = self.config.odds_ratio
        up = y * log_r - torch.log1p((r - 1.0) * p)
        down = -y * log_r - torch.log1p((1.0 / r - 1.0) * p)
        return self._advance(up, down, active)

    def tested(self) -> torch.Tensor:
        """The batch elements past their warm-up (bool ``[*batch]``): the next observation is tested
        there. A model skips its predictive when none is (the chain engines' predictive is costly)."""
        tested = self.since >= self.warmup
        if self.warmup_events:
            tested = tested & (torch.minimum(self.ones, self.since - self.ones) >= self.warmup_events)
        return tested

    def _advance(self, up: torch.Tensor, down: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
        tested = self.tested()
        active = tested if active is None else (active & tested)
        upper = torch.where(active, (self.upper + up).clamp_min(0.0), self.upper)
        lower = torch.where(active, (self.lower + down).clamp_min(0.0), self.lower)
        h = self.level
        alarm = (upper > h) | (lower > h)
        zero = torch.zeros((), dtype=_DTYPE, device=upper.device)
        self.upper = torch.where(alarm, zero, upper)
        self.lower = torch.where(alarm, zero, lower)
        self.alarms = self.alarms + alarm.long()
        return alarm

    def learned(self, active: torch.Tensor | None, alarm: torch.Tensor, y: torch.Tensor | None = None) -> None:
        """Count one observation learned by the ``active`` elements (all when None), and its 0/1
        outcome ``y [*batch]`` when given; an element that raised an ``alarm`` starts counting again
        (the observation that raised it is its first)."""
        one = torch.ones((), dtype=torch.long, device=self.since.device)
        step = one if active is None else active.long()
        since = self.since + step
        self.since = torch.where(alarm, one, since)
        if y is not None:
            hit = (y == 1).long()
            self.ones = torch.where(alarm, hit, self.ones + step * hit)
