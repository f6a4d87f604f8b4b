"""``PosteriorRecorder``: a ``simulate`` callback that records each model's posterior over time."""

from __future__ import annotations

import numpy as np
import torch

from ._common import _np, _probit_types

__all__ = ["PosteriorRecorder"]


def _moments(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and standard deviation of a model's parameters (the weights).

    Shapes: ``BayesianLinear`` ``[*batch, d]``; ``PerArmLinear`` and ``CTSPosterior``
    ``[*batch, K, d]``; ``ProbitGP`` and its views ``[p]`` (the GP's weights).
    """
    probit = _probit_types()
    if probit:
        gp = model.model if isinstance(model, probit[1]) else model
        if isinstance(gp, probit[0]):
            return gp.weight_mean.clone(), gp.weight_covariance.diagonal().sqrt()
    inner = getattr(model, "arms", model)  # PerArmLinear keeps one batched BayesianLinear
    if getattr(inner, "conjugate", False) and not (getattr(inner, "noise_prior", None) is not None
                                                   and bool((inner._noise_posterior()[0] <= 1).any())):
        return model.posterior_mean.clone(), model.posterior_covariance.diagonal(dim1=-2, dim2=-1).sqrt()
    draws = getattr(inner, "_draws", None)
    if draws is not None:  # a non-conjugate fit: moments of its stored draws
        return draws.mean(0), draws.std(0)
    mean = model.posterior_mean
    return mean.clone(), torch.full_like(mean, float("nan"))


class PosteriorRecorder:
    """A ``simulate`` callback recording each model's posterior mean and sd every ``every`` steps.

    Works for every model ``to_inference_data`` converts: linear models record their
    weights ``[R, d]`` (per-arm models ``[R, K, d]``), the probit GP the weights of its linear
    kernel over learned features ``[p]``. Non-conjugate fits record the moments of their
    stored draws.

    Example:
        >>> rec = PosteriorRecorder(every=50)
        >>> trace = simulate(policy, env, 500, seed=0, callback=rec)   # doctest: +SKIP
        >>> rec.to_dataframe()                                         # doctest: +SKIP
    """

    def __init__(self, every: int = 10):
        if isinstance(every, bool) or int(every) < 1:
            raise ValueError(f"every: expected a positive int, got {every!r}")
        self.every = int(every)
        self.steps: list[int] = []
        self.means: dict[str, list[torch.Tensor]] = {}
        self.sds: dict[str, list[torch.Tensor]] = {}

    def __call__(self, t: int, info: dict) -> None:
        if t % self.every:
            return
        self.steps.append(t)
        for role, model in info["policy"].models().items():
            mean, sd = _moments(model)
            self.means.setdefault(role, []).append(mean.clone())
            self.sds.setdefault(role, []).append(sd.clone())

    def to_dataframe(self):
        """Long format: step, model role, replication, (arm,) feature, posterior mean and sd.

        ``replication`` is the first batch index (0 for an unbatched model), ``arm`` is there
        when some model is per-arm, ``feature`` the index of the weight.
        """
        import pandas as pd

        frames = []
        for role in self.means:
            m = torch.stack(self.means[role])  # [n_steps, *batch, (K,) d]
            s = torch.stack(self.sds[role])
            n, *rest = m.shape
            idx = np.array(np.meshgrid(*[np.arange(k) for k in (n, *rest)], indexing="ij")).reshape(len(m.shape), -1)
            frame = {
                "step": np.asarray(self.steps)[idx[0]], "model": role,
                "replication": idx[1] if len(rest) > 1 else 0, "feature": idx[-1],
                "mean": _np(m).reshape(-1), "sd": _np(s).reshape(-1),
            }
            if len(rest) > 2:
                frame["arm"] = idx[-2]
            frames.append(pd.DataFrame(frame))
        return pd.concat(frames, ignore_index=True)
