"""Tune a served TS-ASC's ``alpha`` from its decision log: an offline problem for ``bayes_safe.tuning``.

```python
from bayes_safe.online.tuning import LoggedAlpha
from bayes_safe.tuning import ABTest, Study

problem = LoggedAlpha("decisions.sqlite", "state")      # the log and the state the service wrote
study = Study(ABTest(problem, replicates=1), storage="alpha.sqlite", seed=0)
study.run(6, inline=True)
```

Each trial is TS-ASC with the trial's ``alpha`` on the posterior of the saved state (its reward
and constraint models), evaluated off-policy on the logged decisions with feedback: its
probability of every action at each decision (``DecisionLog.target_probabilities``), then
self-normalised IPS with the logged propensities. Metrics, each with its standard error:

* ``reward``: the value of the trial's policy (the objective);
* ``constraint{j}_ratio``: its mean of constraint metric ``j`` over that of always playing the
  logged baseline, both estimated on the same rows (the standard error by a bootstrap over the
  rows, seeded by the trial's seed); TS-ASC's own rule is "at least ``1 - alpha`` of the
  baseline's", so the default outcome constraint is ``constraint0_ratio >= 0.9``.

The logged contexts must be the decisions' candidate features (what ``Decider`` logs when it is
given candidates ``[K, d]``), and every decision must have logged a baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..envs.ab_problem import ABProblem

__all__ = ["LoggedAlpha"]


class LoggedAlpha(ABProblem):
    """TS-ASC's ``alpha`` estimated from a decision log (module docstring).

    Args:
        log: the ``DecisionLog`` file (``.sqlite``) the service wrote.
        state: the state directory (``Decider.save``) whose TS-ASC posterior the trials use.
        alpha_max: the upper end of the default search space ``alpha in [0, alpha_max]``.
        min_ratio: the default outcome constraint ``constraint0_ratio >= min_ratio``.
        num_draws: Monte-Carlo draws per decision for the trial policy's probabilities.
        n_boot: bootstrap resamples for the constraint ratios' standard errors.
    """

    name = "decision-log-alpha"
    offline = True
    objective = "reward"
    surface = None
    trial_noun = "trials"
    observed_label = "estimate"
    trial_work = "off-policy estimation"
    report_intro = ("Bayesian optimisation of a served TS-ASC's alpha from its decision log: each trial "
                    "estimates, by self-normalised IPS, the value and the constraint ratios of TS-ASC at the "
                    "trial's alpha on the posterior the service learned.")

    def __init__(self, log, state, *, alpha_max: float = 0.5, min_ratio: float = 0.9, num_draws: int = 200,
                 n_boot: int = 200):
        from ..state import StateError
        from .decider import Decider
        from .log import DecisionLog

        self.log_path = Path(log)
        if not self.log_path.is_file():
            raise FileNotFoundError(f"log: no such decision log {str(self.log_path)!r}")
        self.state_path = Path(state)
        for key, value in (("num_draws", num_draws), ("n_boot", n_boot)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}: expected a positive int, got {value!r}")
        if not 0 < float(alpha_max) <= 1:
            raise ValueError(f"alpha_max: expected a number in (0, 1], got {alpha_max!r}")
        self.num_draws, self.n_boot, self.min_ratio = num_draws, n_boot, float(min_ratio)
        self.parameters = ({"name": "alpha", "low": 0.0, "high": float(alpha_max)},)
        # everything is read and checked here, before any trial
        policy = Decider.load(self.state_path).policy
        if not all(hasattr(policy, a) for a in ("reward_model", "constraint_models", "alpha")):
            raise ValueError(f"state: {self.state_path} holds a {type(policy).__name__}, not TS-ASC")
        self.policy = policy
        self.log = DecisionLog(self.log_path, read_only=True)
        try:
            self.data = self.log.to_logged_data()
            frame = self.log.to_dataframe(with_feedback_only=True)
        except ValueError as exc:
            raise ValueError(f"log: {exc}") from None
        if frame["baseline"].isna().any():
            raise StateError(f"log: {self.log_path} has decisions without a logged baseline; TS-ASC needs one")
        C = len(policy.constraint_models)
        if frame["constraints"].map(lambda c: c is None or len(c) != C).any():
            raise StateError(f"log: {self.log_path} has feedback without the {C} constraint value(s) of the policy")
        self.constraints = np.array(frame["constraints"].tolist(), dtype=np.float64).reshape(len(frame), C)
        self.baselines = frame["baseline"].to_numpy(np.int64)
        self.outcome_constraints = (f"constraint0_ratio >= {self.min_ratio}",) if C else ()

    def config(self) -> dict:
        """How ``bayes_safe.tuning.make_problem`` rebuilds this problem (``tune resume``): the two
        paths, absolute, and the settings."""
        return {"name": "decision-log", "log": str(self.log_path.resolve()), "state": str(self.state_path.resolve()),
                "alpha_max": float(self.parameters[0]["high"]), "min_ratio": self.min_ratio,
                "num_draws": self.num_draws, "n_boot": self.n_boot}

    def metric_names(self) -> tuple[str, ...]:
        return ("reward", *(f"constraint{j}_ratio" for j in range(self.constraints.shape[1])))

    def known_parameters(self) -> tuple[str, ...]:
        return ("alpha",)

    def tuned_label(self, ab_test) -> str:
        return "TS-ASC alpha"

    def describe(self, ab_test) -> str:
        return (f"decision log `{self.log_path}` ({len(self.data)} decisions with feedback), the posterior of "
                f"`{self.state_path}`; {self.num_draws} draws per decision for the trial policy's probabilities")

    def estimate(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        """``{metric: (mean, sem)}`` of TS-ASC at ``parameters["alpha"]`` (module docstring)."""
        from ..policies import TSASC

        alpha = float(parameters["alpha"])
        target = TSASC(self.policy.reward_model, self.policy.constraint_models, alpha=alpha)
        probs = self.log.target_probabilities(target, num_draws=self.num_draws, seed=int(seed)).numpy()
        n = len(probs)
        rows = np.arange(n)
        actions = self.data.actions.numpy()
        logged = self.data.propensities.numpy().astype(np.float64)
        w = probs[rows, actions] / logged                              # the trial policy's weights
        wb = (actions == self.baselines).astype(np.float64) / logged   # always the baseline's
        r = self.data.rewards.numpy().astype(np.float64)
        value = float(np.sum(w * r) / np.sum(w))
        out = {"reward": (value, float(np.sqrt(np.sum(w ** 2 * (r - value) ** 2)) / np.sum(w)))}
        boot = np.random.default_rng(int(seed)).integers(0, n, size=(self.n_boot, n))
        for j in range(self.constraints.shape[1]):
            c = self.constraints[:, j]
            draws = _ratio(w, wb, c, boot)
            draws = draws[np.isfinite(draws)]
            out[f"constraint{j}_ratio"] = (float(_ratio(w, wb, c, rows)),
                                           float(np.std(draws)) if len(draws) > 1 else float("nan"))
        return out

    def __getstate__(self):  # a trial in a worker process opens the log again
        state = self.__dict__.copy()
        state["log"] = None
        return state

    def __setstate__(self, state):
        from .log import DecisionLog

        self.__dict__.update(state)
        self.log = DecisionLog(self.log_path, read_only=True)


def _ratio(w, wb, c, idx):
    """SNIPS mean of ``c`` under weights ``w`` over that under ``wb``, on the rows ``idx`` (``[..., n]``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        top = np.sum(w[idx] * c[idx], -1) / np.sum(w[idx], -1)
        return top / (np.sum(wb[idx] * c[idx], -1) / np.sum(wb[idx], -1))
