"""Thompson sampling: play the action that is best under one posterior draw."""

from __future__ import annotations

import numpy as np
import torch

from .._validation import check_exploration
from ..random import Generator, ReplicationRNG, check_generator
from . import _fast
from .base import (
    Policy,
    _model_dims,
    check_model,
    check_select_inputs,
    check_update_inputs,
    masked_argmax,
)

__all__ = ["ThompsonSampling"]


def resolve_exploration(model, exploration) -> str:
    """The draw rule a policy uses: ``exploration`` if given, else the model's own ``thompson_exploration``
    (``calibrated_per_arm`` sets ``"rows"`` on the model it builds), else ``"posterior"``."""
    if exploration is None:
        exploration = getattr(model, "thompson_exploration", "posterior")
        return check_exploration(exploration, "model.thompson_exploration")
    return check_exploration(exploration)


def noise_variance(model, name: str = "exploration") -> float:
    """The known noise variance of a linear model (``PerArmLinear``: its arms'), for ``exploration="rows"``."""
    core = getattr(model, "arms", model)
    noise = getattr(core, "noise_std", None)
    if noise is None or isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 < noise < float("inf"):
        raise ValueError(f"{name}: 'rows' measures an arm's effective rows against the model's known noise sd; "
                         f"this model has noise_std {noise!r} (pass exploration='posterior')")
    return float(noise) ** 2


def rows_shrink(var, noise_var: float):
    """The factor ``sqrt(min(1, var / noise_var))`` that ``exploration="rows"`` multiplies a draw's deviation
    from the mean by (``var``: the score's posterior variance, a tensor or numpy array)."""
    if isinstance(var, torch.Tensor):
        return (var.clamp_min(0) / noise_var).clamp_max(1.0).sqrt()
    return np.sqrt(np.minimum(np.maximum(var, 0.0) / noise_var, 1.0))


class ThompsonSampling(Policy):
    """Vanilla Thompson sampling (Thompson 1933; Agrawal & Goyal 2013 for linear models).

    Each step draws one joint sample ``f~`` of the reward function at all candidates and
    plays ``argmax_a f~(x, a)``. Works with any model that has ``sample_at`` and ``update``.

    **Exploration** (``exploration``, issue 44). ``"posterior"``: the draw above, from the model's
    posterior (at the temperature it was built with). ``"rows"``: the draw of candidate ``k``'s score is
    shrunk toward its mean, ``m_k + sqrt(min(1, v_k / sigma^2)) (f~_k - m_k)``, so it is a draw from the
    posterior at temperature ``T / max(1, n_k)`` where ``n_k = sigma^2 / v_k`` is the candidate's
    *effective rows* (``v_k`` the posterior variance of its score at ``x``, ``sigma`` the model's noise sd:
    the posterior there is as precise as the mean of ``n_k`` observations at ``x``). Below one effective
    row the draw is the posterior's; above, its sd falls as ``1 / n`` rather than ``1 / sqrt(n)``, so
    arms pinned by many rows (a warm start) are played greedily except near ties, and arms the data
    have not pinned are explored as before. The context of classification-style data explores by
    itself (Bietti, Agarwal & Langford, JMLR 2021: minimal exploration is a key design goal there);
    measured in issue 44's bake-off (``docs/reports/bakeoff.md``). For a per-arm model scored at one row
    per arm the scores are independent normals, so ``StreamingPerArmTS(exploration="rows")`` draws the
    same law; for a shared-weights model the draws keep the posterior's correlation, each scaled.
    It needs a known noise sd. ``None`` (default): the model's ``thompson_exploration`` attribute
    (``calibrated_per_arm`` sets ``"rows"``; its ``exploration="posterior"`` keeps the old draws), else
    ``"posterior"``.

    Args:
        model: posterior over the reward function, batch shape ``[R]`` (or ``[R, K]`` per-arm).
        exploration: None (default: the model's choice), ``"posterior"`` or ``"rows"`` (above).

    Example:
        >>> import pyro.distributions as dist
        >>> from bayes_safe.models import BayesianLinear
        >>> from bayes_safe.envs import daulton2019
        >>> env = daulton2019(replications=8, seed=0)
        >>> prior = dist.Normal(0.0, 1.0).expand([4]).to_event(1)
        >>> ts = ThompsonSampling(BayesianLinear(prior, noise_std=0.1, batch_shape=[8]))
        >>> ts.select(env.step(0).features).shape
        torch.Size([8])
    """

    #: the rows of one call are separate decisions (``Policy.row_probabilities``)
    batched_rows = True
    #: class defaults: an instance pickled before issue 44's ``exploration`` draws from the posterior
    exploration = "posterior"
    _noise_var = None

    def __init__(self, model, exploration: str | None = None):
        self.model = check_model(model, "model", "sample_at")
        self.exploration = resolve_exploration(model, exploration)
        self._noise_var = noise_variance(model) if self.exploration == "rows" else None
        if self._noise_var is not None:
            check_model(model, "model", "predict")

    def _settings(self) -> dict[str, object]:
        return {} if self.exploration == "posterior" else {"exploration": self.exploration}

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        if generator is not None and not isinstance(generator, (torch.Generator, ReplicationRNG)):
            check_generator(generator)
        # the common case (float64 tensors of the model's shapes) in a few comparisons, else the general check
        checked = _fast.select_inputs(features, baseline, valid, _model_dims(self.model))
        if checked is None:
            checked = check_select_inputs(features, baseline, valid, models=(self.model,))
        features, baseline, valid = checked
        if self._noise_var is not None:
            scores = self._rows_scores(features, generator)
            if valid is None and scores.numel() <= 1024:
                return scores.argmax(-1)  # as below: the first maximal index
            return masked_argmax(scores, valid)
        if valid is None:
            # a conjugate model's own decision in buffers (``BayesianLinear._thompson_argmax``: the numbers
            # of sample_at and the argmax below), when it has one for these inputs
            fast = getattr(self.model, "_thompson_argmax", None)
            actions = None if fast is None else fast(features, generator)
            if actions is not None:
                return actions
        scores = self.model.sample_at(features, generator, key="reward")
        if valid is None and scores.numel() <= 1024:
            # the same first maximal index as masked_argmax's max, at half the call cost on small tables
            return scores.argmax(-1)
        return masked_argmax(scores, valid)

    def _rows_scores(self, features, generator) -> torch.Tensor:
        """``exploration="rows"``: every candidate's draw shrunk toward its mean (class docstring)."""
        model = self.model
        fast = getattr(model, "_draw_one", None)
        if (fast is not None and (features.dim() == 2 or (features.dim() == 3 and features.shape[0] == 1))
                and (generator is None or (type(generator) is torch.Generator and generator.device.type == "cpu"))
                and model._marginal_fast()):
            # one stream of a PerArmLinear keeping its moments: sample_at's draw with its means and variances
            draw, mu, var = fast(features, generator)
            scores = mu + rows_shrink(var, self._noise_var) * (draw - mu)
            return torch.from_numpy(scores).reshape(features.shape[:-1])
        draw = model.sample_at(features, generator, key="reward")
        mean, var = model.predict(features)
        return mean + rows_shrink(var, self._noise_var) * (draw - mean)

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        model = self.model
        checked = _fast.update_inputs(features_chosen, reward, None, _model_dims(model))
        if checked is not None:
            fast = getattr(model, "_update_checked", None)  # _fast.update_model, inline
            if fast is not None:
                fast(checked[0], checked[1])
            else:
                model.update(checked[0], checked[1], actions=actions)
            return
        features_chosen, reward, _ = check_update_inputs(features_chosen, reward, models=(model,))
        model.update(features_chosen, reward, actions=actions)

    def models(self):
        return {"reward": self.model}
