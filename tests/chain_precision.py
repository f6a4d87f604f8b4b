"""How precise a chain's estimate is, for the accuracy checks that compare long runs.

    from chain_precision import mcse_of_mean

A check of "means within 0.1 posterior sd" asserts first that the Monte Carlo standard error of the
difference is small against 0.1 sd, so that its verdict is about the sampler, not about the seed."""

from __future__ import annotations

import arviz as az
import torch


def mcse_of_mean(draws: torch.Tensor) -> torch.Tensor:
    """``[d]`` Monte Carlo standard error of each coordinate's mean from ``draws [chains, draws, d]``
    (ArviZ's bulk ESS over the chains)."""
    ess = torch.as_tensor(az.ess(az.convert_to_dataset({"w": draws.detach().cpu().numpy()}))["w"].values,
                          dtype=draws.dtype)
    return draws.reshape(-1, draws.shape[-1]).std(0) / ess.sqrt()
