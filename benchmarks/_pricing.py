"""A pricing problem with a fast reward and a slow harm (issue 45): 21 price levels from -50 % to
+50 % of the list price, one shopper covariate; a 0/1 conversion (the reward, known within hours)
and a 0/1 refund capped at 2 % (known weeks later). Deep discounts convert more and are refunded
more (impulse buys): the refund rate crosses the cap near -10 %. Used by ``benchmarks/delays.py``'s
target row (the same class as ``docs/tutorials/late-outcomes.md``'s, a user's problem there)."""

from __future__ import annotations

import torch

from bayes_safe import Constraint, Problem, Units


class Pricing(Problem):
    """Features per price ``[1, p, p^2, u p]`` (``p`` the relative price, ``u`` the shopper's
    covariate); conversion ``sigmoid(-0.4 - 3 p + u p)``, refund ``sigmoid(-4.2 - 3 p)``."""

    name = "pricing"
    metric_names = ("conversion", "refund")
    constraints = (Constraint.absolute("refund", at_most=0.02),)
    noise_std = (0.5, 0.15)
    replications = 16

    def __init__(self, levels: int = 21):
        self.prices = torch.linspace(-0.5, 0.5, levels, dtype=torch.float64)

    def draw(self, n, generator):
        u = torch.randn(n, 1, generator=generator, dtype=torch.float64)
        p = self.prices.expand(n, -1)
        features = torch.stack([torch.ones_like(p), p, p * p, u * p], -1)  # [n, K, 4]
        baseline = torch.full((n,), len(self.prices) // 2, dtype=torch.long)  # the list price
        return Units(features, baseline=baseline, context=torch.rand(n, 2, generator=generator, dtype=torch.float64))

    def expected(self, units, actions):
        x = units.features[torch.arange(len(units)), actions]
        conversion = torch.sigmoid(-0.4 - 3.0 * x[:, 1] + x[:, 3])
        refund = torch.sigmoid(-4.2 - 3.0 * x[:, 1])
        return torch.stack([conversion, refund], -1)

    def outcomes(self, units, actions):
        return (units.context < self.expected(units, actions)).double()
