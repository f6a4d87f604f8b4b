"""Probit GP over learned neural-network features (Daulton et al. 2019, section 5.2, appendix 6.1).

The model of a binary outcome ``y`` (an upload succeeds) given a context-action vector ``x``:

* a shared feature network ``x -> 50 -> 4 (-> 1)`` is trained end to end on the Bernoulli
  negative log-likelihood with a probit link, by mini-batch Adam;
* its last linear layer (``4 -> 1``) is discarded; the features ``phi(x)`` (4 units, plus a
  constant 1 for the intercept, ``p = 5``) are the inputs of a GPyTorch variational GP with a
  linear kernel ``k(phi_i, phi_j) = phi_i^T Sigma_p phi_j`` (``Sigma_p`` diagonal: a
  ``LinearKernel`` with one variance per feature, priors on them set by the user) and a
  ``BernoulliLikelihood`` (probit), fitted by maximising the ELBO (stochastic variational
  inference on mini-batches, then a few full-data steps).

Five pitfalls measured on this problem, and how this module handles them:

1. *Batched test inputs.* GPyTorch given test inputs ``[n, K, d]`` broadcasts its inducing
   points to ``[n, M, d]`` and builds ``n`` ``M x M`` matrices (it ran out of 24 GiB). Here no
   batched tensor ever reaches GPyTorch: decisions and predictions use the weight-space
   posterior below, and ``ProbitGP.gp_predictive`` (GPyTorch's own predictive, kept for
   cross-checks) flattens its input first.
2. *Rank.* A linear kernel on ``p``-dim features has rank at most ``p``: ``f(x) = phi(x)^T w``
   with ``w ~ N(0, Sigma_p)``. Any Gaussian ``q(f(Z))`` at inducing points ``Z`` is a Gaussian
   ``q(w)`` in that ``p``-dim weight space, and the SVGP predictive is exactly
   ``f(x) ~ N(phi^T mu_w, phi^T C_w phi)``, jointly over any set of inputs. So by default the
   GP uses ``M = p`` inducing points at the standard basis vectors (``u = f(e_i) = w_i``):
   the variational family is then the full Gaussian family over ``w``, nothing is lost, and
   the cost is ``O(p^3)``, not ``O(M^3)`` with the paper's ``M = 1,000``. After every fit,
   ``(mu_w, C_w)`` is read off GPyTorch's own joint predictive at the basis vectors
   ``e_1..e_p`` (exact: the predictive is linear in ``phi``), whatever ``M`` is; a Thompson
   draw is then one ``w ~ N(mu_w, C_w)`` per context, giving the joint draw over that
   context's ``K`` candidate actions at ``O(K p)`` cost, with no ``M x M`` matrix.
   ``num_inducing = M > p`` is accepted (inducing points: a random subset of the training
   features), and converted the same way.
3. *Convergence of the variational posterior.* GPyTorch's default Cholesky variational
   distribution trained with Adam had not converged after 10 epochs (variance ~100x too
   large). Here ``q(u)`` is a ``NaturalVariationalDistribution`` trained by natural gradient
   descent (``gpytorch.optim.NGD``), the hyperparameters by Adam, on mini-batches; then
   full-data natural-gradient steps (step size 1, halved if the ELBO gets worse) until the
   natural parameters stop moving. For a log-concave likelihood such as the probit these
   converge in a handful of steps.
4. *Precision.* At float32 GPyTorch's predictive jitter (1e-4) was as large as the posterior
   variance at 100k observations; even its float64 default (1e-6) is a visible share of it.
   The GP runs in float64 with a tiny jitter (``1e-10`` by default; inducing points at the
   basis make ``K_ZZ = Sigma_p`` well conditioned), the jitter GPyTorch adds to the
   predictive is subtracted when reading ``C_w``, and all predictions are float64. The
   feature network runs in float32 (its output is cast to float64; the features are a fixed
   deterministic map, so this changes which features are used, not the GP's accuracy).
5. *Refits.* The paper refits the model as data arrive (section 5.3: each parameterisation is
   evaluated in an A/B test while the policy learns; appendix 6.1 gives the model, not the
   training schedule). A warm refit that trained a fixed floor of ``nn_min_steps = 500``
   mini-batch steps on all rows, continuing from the last refit, passed hundreds of epochs
   over the first rows when refitting every 500 rows: after 10 such refits on 5,000 rows
   the error against the true success probability was 2.6-3.4x that of one fit on the same
   rows (``tests/test_probit_gp.py``; 2.7x on the simulated video uploads). Here the network's
   training scales with the data: at most ``nn_epochs`` passes over the stored rows, with
   early stopping on a held-out slice (``nn_holdout`` of the rows, chosen by row index so a
   row keeps its side at every refit, see ``holdout_rows``; ``nn_patience`` epochs without a
   better held-out NLL end the fit and the best epoch is kept). The step floor
   ``nn_min_steps`` applies only to the first (cold) fit, whose network starts from its
   random initialisation. 10 warm refits are then within 1.03-1.23x of one fit's error
   (three problems, two seeds each).

Replications: a ``ProbitGP`` is one posterior (the paper's single stream of uploads). Driven
by ``bayes_safe.simulate`` as ``R > 1`` replications at once (a ``ReplicationRNG`` of ``R``
streams in ``sample_at``, or ``R`` library-made rows in ``update``) it raises a ``ValueError``
naming ``replications`` instead of pooling them into one GP; run one replication per
``simulate`` call, or use the study loop of ``studies/video_upload.py``.

Interface (the same as ``BayesianLinear``, so the policies use it
unchanged): ``update(X [n, D], y [n] in {0, 1})`` stores data and refits every
``refit_every`` observations (warm-started: the network and the variational parameters
continue from the last fit, the network's training bounded as in item 5); ``fit()`` forces a refit; ``predict(X [..., D]) -> (mean, var)``
of the latent function; ``sample()`` one draw of the weights; ``sample_at(features [R, K, D])``
one joint draw of the latent function over the ``K`` candidates of each of ``R`` contexts.

Limitation (NeuralLinear, as in the paper): the posterior is over the GP weights *given* the
learned features; the network's own estimation error is not in it. On the simulated video
uploads (``studies/video_upload.py``) the fitted model's success-probability ratios between
adjacent qualities were off by ~1.5-2% on average (against ``E[p | x]``) while its posterior
standard deviations were a fraction of that, so a Thompson draw is overconfident about small
differences between actions, which is what TS-ASC's constraint with a small alpha relies on.

For decisions on a success probability, wrap the model: ``SuccessProbability`` (draws of
``Phi(f)``, the constraint metric of TS-ASC) and ``ScaledOutcome`` (draws of
``scale[a] * Phi(f)``, e.g. the expected reward ``sum_{a' <= a} omega_{a'} * P(success)`` of
the video-upload problem). Views of one model share one draw per decision (see
``SuccessProbability``), as TS-ASC's Algorithm 1 samples *one* model ``f~`` that gives
both the reward and the constraint.

Example:
    >>> import torch
    >>> X = torch.randn(2000, 6); y = (X[:, 0] + 0.3 * torch.randn(2000) > 0).double()
    >>> m = ProbitGP(input_dim=6, refit_every=None, nn_epochs=2, seed=0)
    >>> m.update(X, y); m.fit()
    >>> mean, var = m.predict(torch.randn(3, 4, 6))
    >>> m.sample_at(torch.randn(3, 4, 6)).shape
    torch.Size([3, 4])
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .. import _validation
from .._extras import require
from .._validation import as_tensor, check_finite, check_positive_int
from ..random import DrawBatch, Generator, ReplicationRNG, standard_normal
from ._gaussian import cholesky as _cholesky

gpytorch = require("gpytorch", "ProbitGP (the probit GP over learned features)")

__all__ = ["FeatureNetwork", "ProbitGP", "ScaledOutcome", "SuccessProbability"]

_F64 = torch.float64
#: fewer held-out rows than this: no early stopping (the network trains on all rows for its budget)
_MIN_HOLDOUT = 30
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


class FeatureNetwork(nn.Module):
    """``x -> hidden[0] -> ... -> hidden[-1] -> 1``: the body gives the features ``phi(x)``.

    Args:
        input_dim: ``D``.
        hidden: widths of the hidden layers (the paper: 50 and 4).
        activation: ``"elu"`` (default), ``"tanh"`` or ``"relu"`` (see ``ProbitGP``).
        generator: seeds the initial weights (PyTorch's default init scheme, drawn from it).
    """

    def __init__(self, input_dim: int, hidden: Sequence[int] = (50, 4), activation: str = "elu",
                 generator: torch.Generator | None = None):
        super().__init__()
        layers: list[nn.Module] = []
        d = input_dim
        for h in hidden:
            layers += [nn.Linear(d, h), _ACTIVATIONS[activation]()]
            d = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, 1)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    bound = 1.0 / math.sqrt(module.in_features)
                    module.weight.uniform_(-bound, bound, generator=generator)
                    module.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The end-to-end latent ``f(x)``, ``[..., D] -> [...]``."""
        return self.head(self.body(x))[..., 0]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``phi(x)``, ``[..., D] -> [..., hidden[-1]]`` (the last linear layer discarded)."""
        return self.body(x)


class _LinearKernelSVGP(gpytorch.models.ApproximateGP):
    """SVGP with a zero mean, a (diagonal-``Sigma_p``) linear kernel, natural variational parameters."""

    def __init__(self, inducing_points: torch.Tensor, ard: bool, variance_prior, jitter: float):
        M, p = inducing_points.shape
        dist = gpytorch.variational.NaturalVariationalDistribution(M, mean_init_std=0.0)
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, dist, learn_inducing_locations=False, jitter_val=jitter
        )
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.LinearKernel(ard_num_dims=p if ard else None, variance_prior=variance_prior)
        # q(u) starts at the (whitened) prior N(0, I), which is what the natural parameters
        # already hold; marking it initialised skips GPyTorch's initialiser, which would draw
        # from the global random generator.
        strategy.variational_params_initialized.fill_(1)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def holdout_rows(n: int, fraction: float) -> torch.Tensor:
    """Which of ``n`` stored rows (in arrival order) the network does not train on: ``[n]`` bool.

    Row ``i`` is held out when ``frac((i + 1) * g) < fraction`` with ``g = (sqrt(5) - 1) / 2``:
    a low-discrepancy rule that depends on the row's index only, so a row keeps its side at
    every refit (a held-out row never becomes a training row later) and the held-out rows
    are spread evenly over time (about ``fraction * n`` of any ``n`` consecutive rows).
    """
    if fraction <= 0 or n == 0:
        return torch.zeros(n, dtype=torch.bool)
    i = torch.arange(1, n + 1, dtype=_F64)
    return torch.frac(i * _GOLDEN) < fraction


def _refuse_replications(R: int) -> ValueError:
    return ValueError(
        f"replications: a simulation drives {R} replications at once, but a ProbitGP holds one posterior "
        f"and would pool their observations into it ({R} rows per step into one GP, so replication 0 would not "
        "be the run of replication 0 alone). Run the replications one at a time: simulate with a problem of "
        "replications=1 and a fresh ProbitGP per replication, seeded with replication_seeds(seed, R)[r] "
        "(see bayes_safe.random), or use the batched study loop of studies/video_upload.py."
    )


def _probit_nll(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean Bernoulli negative log-likelihood with a probit link (stable ``log Phi``)."""
    return -(y * torch.special.log_ndtr(f) + (1 - y) * torch.special.log_ndtr(-f)).mean()


class _ProbitLikelihood(gpytorch.likelihoods.BernoulliLikelihood):
    """GPyTorch's ``BernoulliLikelihood`` (probit link) with its ELBO term ``E_q[log Phi(s f)]``
    (``s = 2 y - 1``) on the same Gauss-Hermite quadrature, each node's ``log Phi`` computed by
    ``torch.special.log_ndtr`` (one native kernel with its own derivative) in place of GPyTorch's
    ``log_normal_cdf`` (a Python autograd function whose backward alone was 1.5 of a video-upload A/B
    trial's 10 s). The same function to rounding, accurate in the far tail; the model gives 0/1 labels only.
    Its state is the parent's (the quadrature's nodes), so states saved before load unchanged."""

    def expected_log_prob(self, observations, function_dist, *params, **kwargs):
        signs = observations.mul(2).sub(1)
        return self.quadrature(lambda f: torch.special.log_ndtr(f.mul(signs)), function_dist)


class ProbitGP:
    """Bernoulli-probit variational GP with a linear kernel over learned NN features.

    Daulton, Singh, Avadhanula, Dimmery & Bakshy (2019), section 5.2 and appendix 6.1; see the
    module docstring for the weight-space posterior and the choices made.

    Args:
        input_dim: width ``D`` of a context-action feature vector.
        hidden: feature-network hidden widths; the last is the feature dimension (paper: (50, 4)).
        activation: hidden activation, ``"elu"`` (default), ``"tanh"`` or ``"relu"``. The paper does
            not say; on 50,000 simulated video uploads the held-out probit NLL was 0.2492 (elu),
            0.2500 (tanh), 0.2539 (relu, no schedule), against 0.2419 for the true probabilities.
        variance_prior: a ``gpytorch.priors.Prior`` on the linear kernel's variances (the
            diagonal of ``Sigma_p``); default ``GammaPrior(2.0, 1.0)`` (mode 1, mean 2). ``None``
            is not "no prior": pass ``variance_prior=False`` for none.
        ard: one variance per feature (diagonal ``Sigma_p``, default) or one shared variance.
        num_inducing: ``None`` (default): ``p`` inducing points at the basis vectors (exact for
            a linear kernel, see the module docstring); an int ``M > p``: a random subset of the
            training features at the first fit (the paper used 1,000; only adds cost).
        refit_every: refit automatically after this many new observations (``None``: only when
            ``fit`` is called).
        nn_epochs, nn_batch_size, nn_lr, nn_weight_decay: feature-network training (AdamW on the
            probit NLL, learning rate annealed from ``nn_lr`` to 0 by a cosine schedule within each
            refit: that lowered the held-out NLL by ~0.002 nats against a constant rate).
            At most ``nn_epochs`` passes over the training rows at every (warm-started) refit;
            the first fit runs at least ``nn_min_steps`` steps (a warm refit has no floor: the
            floor made frequent refits overfit the first rows, see the module docstring, item 5).
        nn_holdout: share of the stored rows held out of the network's training (``holdout_rows``:
            fixed by row index) for early stopping; ``0`` (or fewer than 30 held-out rows): no
            early stopping, the whole budget on all rows. The GP is fitted on all rows.
        nn_patience: epochs without a lower held-out NLL that end a fit; the network of the best
            epoch is kept (``fit_info`` reports ``nn_epochs_run``, ``nn_best_epoch`` and the
            held-out NLL before and after).
        gp_epochs, gp_batch_size, ngd_lr, hyper_lr: stochastic variational inference: natural
            gradient steps on ``q(u)`` and Adam on the hyperparameters, per mini-batch.
        polish_steps, polish_tol: then at most this many full-data natural-gradient steps (step 1,
            halved whenever the ELBO would fall), until a full step would change no natural
            parameter by more than ``polish_tol`` relative to the largest (``fit_info`` reports
            the steps taken and that size).
        jitter: diagonal jitter of ``K_ZZ`` (float64); default ``1e-10`` with the basis inducing
            points (``K_ZZ = Sigma_p``, well conditioned) and ``1e-8`` with ``M > p`` data points
            (``K_ZZ`` then has rank ``p`` and needs it).
        seed: seeds network initialisation, mini-batch order and inducing-point choice.

    Shapes: ``update(X [n, D] or [D], y [n] or [])``; ``predict(X [..., D]) -> ([...], [...])``;
    ``sample() -> [p]``; ``sample_at(features [R, K, D]) -> [R, K]``.
    """

    def __init__(
        self,
        input_dim: int,
        *,
        hidden: Sequence[int] = (50, 4),
        activation: str = "elu",
        variance_prior=None,
        ard: bool = True,
        num_inducing: int | None = None,
        refit_every: int | None = 10_000,
        nn_epochs: int = 10,
        nn_min_steps: int = 500,
        nn_holdout: float = 0.1,
        nn_patience: int = 2,
        nn_batch_size: int = 256,
        nn_lr: float = 3e-3,
        nn_weight_decay: float = 1e-5,
        gp_epochs: int = 2,
        gp_batch_size: int = 4096,
        ngd_lr: float = 0.2,
        hyper_lr: float = 0.05,
        polish_steps: int = 30,
        polish_tol: float = 1e-7,
        jitter: float | None = None,
        seed: int = 0,
    ):
        if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
            raise ValueError(f"input_dim: expected a positive int, got {input_dim!r}")
        hidden = tuple(int(h) for h in hidden)
        if not hidden or any(h < 1 for h in hidden):
            raise ValueError(f"hidden: expected one or more positive layer widths, got {hidden!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        if refit_every is not None and (isinstance(refit_every, bool) or int(refit_every) < 1):
            raise ValueError(f"refit_every: expected a positive int or None, got {refit_every!r}")
        for name, value in (("nn_epochs", nn_epochs), ("nn_batch_size", nn_batch_size), ("gp_batch_size", gp_batch_size)):
            if int(value) < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        for name, value in (("gp_epochs", gp_epochs), ("polish_steps", polish_steps), ("nn_min_steps", nn_min_steps)):
            if int(value) < 0:
                raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
        if isinstance(nn_holdout, bool) or not 0 <= float(nn_holdout) < 0.5:
            raise ValueError(f"nn_holdout: expected a share of the rows in [0, 0.5), got {nn_holdout!r}")
        if isinstance(nn_patience, bool) or int(nn_patience) < 1:
            raise ValueError(f"nn_patience: expected a positive int (epochs without improvement), got {nn_patience!r}")
        if gp_epochs == 0 and polish_steps == 0:
            raise ValueError("gp_epochs, polish_steps: at least one must be positive to fit the GP")
        if not 0 < ngd_lr <= 1:
            raise ValueError(f"ngd_lr: expected a step size in (0, 1], got {ngd_lr!r}")
        self.input_dim = input_dim
        self.hidden = hidden
        self.feature_dim = hidden[-1] + 1  # learned features plus the constant 1
        if variance_prior is None:
            variance_prior = gpytorch.priors.GammaPrior(2.0, 1.0)
        elif variance_prior is False:
            variance_prior = None
        elif not isinstance(variance_prior, gpytorch.priors.Prior):
            raise TypeError(f"variance_prior: expected a gpytorch.priors.Prior (or False for none), got {type(variance_prior).__name__}")
        p = self.feature_dim
        if num_inducing is not None and (isinstance(num_inducing, bool) or int(num_inducing) < p):
            raise ValueError(f"num_inducing: expected None or an int >= the feature dimension {p}, got {num_inducing!r}")
        self.num_inducing = None if num_inducing is None else int(num_inducing)
        self.refit_every = None if refit_every is None else int(refit_every)
        self.nn_epochs, self.nn_min_steps, self.nn_batch_size = int(nn_epochs), int(nn_min_steps), int(nn_batch_size)
        self.nn_holdout, self.nn_patience = float(nn_holdout), int(nn_patience)
        self.nn_lr, self.nn_weight_decay = float(nn_lr), float(nn_weight_decay)
        self.gp_epochs, self.gp_batch_size = int(gp_epochs), int(gp_batch_size)
        self.ngd_lr, self.hyper_lr = float(ngd_lr), float(hyper_lr)
        self.polish_steps, self.polish_tol = int(polish_steps), float(polish_tol)
        if jitter is None:
            jitter = 1e-10 if num_inducing is None else 1e-8
        if not (math.isfinite(float(jitter)) and float(jitter) > 0):
            raise ValueError(f"jitter: expected a positive float, got {jitter!r}")
        self.jitter = float(jitter)
        self.seed = int(seed)
        self._generator = torch.Generator().manual_seed(self.seed)

        self.network = FeatureNetwork(input_dim, hidden, activation, generator=self._generator)
        self._input_loc = torch.zeros(input_dim, dtype=torch.float32)
        self._input_scale = torch.ones(input_dim, dtype=torch.float32)
        self._ard, self._variance_prior = ard, variance_prior
        self.likelihood = _ProbitLikelihood()
        self.gp = self._build_gp(torch.eye(p, dtype=_F64))

        self._X: list[torch.Tensor] = []
        self._y: list[torch.Tensor] = []
        self.num_observations = 0
        self._since_fit = 0
        self.num_fits = 0
        self.fit_info: dict = {}
        # shared-draw / shared-update state of the views (see SuccessProbability)
        self._draw_state: tuple | None = None
        self._update_state: tuple | None = None
        self._read_weight_posterior()

    def _build_gp(self, inducing_points: torch.Tensor) -> _LinearKernelSVGP:
        gp = _LinearKernelSVGP(inducing_points, self._ard, self._variance_prior, self.jitter).to(_F64)
        gp.covar_module.variance = torch.ones_like(gp.covar_module.variance)
        return gp

    # ------------------------------------------------------------------ inputs
    def _check_X(self, X, name: str) -> torch.Tensor:
        X = as_tensor(X, name)
        if X.dim() == 0 or X.shape[-1] != self.input_dim:
            raise ValueError(f"{name}: expected shape [..., {self.input_dim}] (last dimension = input_dim), got {list(X.shape)}")
        return check_finite(X, name)

    def _check_data(self, X, y) -> tuple[torch.Tensor, torch.Tensor]:
        X = self._check_X(X, "X")
        if X.dim() == 1:
            X = X[None]
        if X.dim() != 2:
            raise ValueError(f"X: expected shape [n, {self.input_dim}] or [{self.input_dim}], got {list(X.shape)}")
        y = as_tensor(y, "y")
        if y.dim() == 0:
            y = y.reshape(1)
        if y.shape != X.shape[:1]:
            raise ValueError(f"y: expected shape [{X.shape[0]}] to match X {list(X.shape)}, got {list(y.shape)}")
        check_finite(y, "y")
        bad = (y != 0) & (y != 1)
        if bool(bad.any()):
            raise ValueError(
                f"y: expected binary outcomes 0/1 (Bernoulli likelihood), got {int(bad.sum())} other values, "
                f"e.g. {float(y[bad][0])!r}"
            )
        return X, y

    def features(self, X) -> torch.Tensor:
        """The GP inputs ``[phi(x), 1]``: ``[..., D] -> [..., p]`` float64 (no gradient)."""
        X = self._check_X(X, "features")
        return self._features(X)

    @torch.no_grad()
    def _features(self, X: torch.Tensor) -> torch.Tensor:
        z = (X.to(torch.float32) - self._input_loc) / self._input_scale
        phi = self.network.features(z).to(_F64)
        return torch.cat([phi, torch.ones(*phi.shape[:-1], 1, dtype=_F64)], dim=-1)

    # ------------------------------------------------------------------ data and fits
    def update(self, X, y, actions=None) -> None:
        """Add observations ``X [n, D]`` (or one row ``[D]``) with binary ``y [n]``; refit every ``refit_every``.

        ``actions`` is accepted for interface compatibility and ignored (the action is encoded in ``X``).
        """
        if _validation.trusted() and isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[0] > 1:
            # the library's simulation loops pass one row per replication (Daulton et al. 2019 s.5 has
            # one stream; a batch of replications needs one posterior each): never pool them silently
            raise _refuse_replications(int(X.shape[0]))
        X, y = self._check_data(X, y)
        self._X.append(X.to(_F64))
        self._y.append(y.to(_F64))
        self.num_observations += X.shape[0]
        self._since_fit += X.shape[0]
        if self.refit_every is not None and self._since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> None:
        """(Re)fit the network, then the variational GP, on all observations so far (warm-started)."""
        if self.num_observations == 0:
            raise ValueError("fit: no observations yet; call update(X, y) with at least one observation first")
        X = torch.cat(self._X)
        y = torch.cat(self._y)
        self._X, self._y = [X], [y]
        if self.num_fits == 0:
            x32 = X.to(torch.float32)
            self._input_loc = x32.mean(0)
            scale = x32.std(0) if X.shape[0] > 1 else torch.ones(self.input_dim)
            self._input_scale = torch.where(scale > 1e-6, scale, torch.ones_like(scale))
        info = {"n": int(X.shape[0])}
        info.update(self._train_network(X, y))
        phi = self._features(X)
        if self.num_inducing is not None and self.num_fits == 0:
            M = min(self.num_inducing, phi.shape[0])
            if M < self.feature_dim:
                raise ValueError(f"num_inducing: need at least {self.feature_dim} observations to place inducing points, got {phi.shape[0]}")
            idx = torch.randperm(phi.shape[0], generator=self._generator)[:M]
            old = self.gp.covar_module.variance.detach().clone()
            self.gp = self._build_gp(phi[idx].clone())
            self.gp.covar_module.variance = old
        info.update(self._fit_gp(phi, y))
        self._read_weight_posterior()
        self._since_fit = 0
        self.num_fits += 1
        self.fit_info = info

    def _train_network(self, X: torch.Tensor, y: torch.Tensor) -> dict:
        """Train the feature network on ``(X, y)``; early stopping on the held-out slice.

        See the class docstring (``nn_epochs``, ``nn_min_steps``, ``nn_holdout``, ``nn_patience``)
        for the budget. Returns the training summary that goes into ``fit_info``.
        """
        net = self.network
        n = X.shape[0]
        z = (X.to(torch.float32) - self._input_loc) / self._input_scale
        t = y.to(torch.float32)
        held = holdout_rows(n, self.nn_holdout)
        early = int(held.sum()) >= _MIN_HOLDOUT
        if early:
            z_val, t_val = z[held], t[held]
            z, t = z[~held], t[~held]
        n_train = z.shape[0]
        bs = min(self.nn_batch_size, n_train)
        per_epoch = math.ceil(n_train / bs)
        cold = self.num_fits == 0
        epochs = self.nn_epochs
        if cold:
            # only a network that starts from its random initialisation gets the step floor
            epochs = max(epochs, math.ceil(self.nn_min_steps / per_epoch))
        opt = torch.optim.AdamW(net.parameters(), lr=self.nn_lr, weight_decay=self.nn_weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * per_epoch)

        def held_out_nll() -> float:
            net.eval()
            with torch.no_grad():
                return float(_probit_nll(net(z_val), t_val))

        best_nll = held_out_nll() if early else None
        start_nll = best_nll
        best_state = copy.deepcopy(net.state_dict()) if early else None
        best_epoch, since_best, run = 0, 0, 0
        total, count = 0.0, 0
        for epoch in range(epochs):
            net.train()
            perm = torch.randperm(n_train, generator=self._generator)
            total, count = 0.0, 0
            for i in range(per_epoch):
                idx = perm[i * bs:(i + 1) * bs]
                loss = _probit_nll(net(z[idx]), t[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                schedule.step()
                total += float(loss.detach()) * idx.numel()
                count += idx.numel()
            run = epoch + 1
            if early:
                nll = held_out_nll()
                if nll < best_nll:
                    best_nll, best_epoch, since_best = nll, run, 0
                    best_state = copy.deepcopy(net.state_dict())
                else:
                    since_best += 1
                    if since_best >= self.nn_patience:
                        break
        if early and best_epoch < run:
            net.load_state_dict(best_state)
        net.eval()
        return {"nn_loss": total / max(count, 1), "nn_epochs_run": run, "nn_epochs_max": epochs,
                "nn_best_epoch": best_epoch if early else run, "nn_holdout_rows": int(held.sum()) if early else 0,
                "nn_holdout_nll_start": start_nll, "nn_holdout_nll": best_nll}

    def _natural_parameters(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.gp.variational_parameters()]

    def _fit_gp(self, phi: torch.Tensor, y: torch.Tensor) -> dict:
        gp, lik = self.gp, self.likelihood
        gp.train()
        lik.train()
        n = phi.shape[0]
        # ---- stochastic variational inference: NGD on q(u), Adam on the hyperparameters
        if self.gp_epochs > 0:
            mll = gpytorch.mlls.VariationalELBO(lik, gp, num_data=n)
            ngd = gpytorch.optim.NGD(gp.variational_parameters(), num_data=n, lr=self.ngd_lr)
            hyper = list(gp.hyperparameters())
            adam = torch.optim.Adam(hyper, lr=self.hyper_lr) if hyper else None
            bs = min(self.gp_batch_size, n)
            per_epoch = math.ceil(n / bs)
            for _ in range(self.gp_epochs):
                perm = torch.randperm(n, generator=self._generator)
                for i in range(per_epoch):
                    idx = perm[i * bs:(i + 1) * bs]
                    ngd.zero_grad(set_to_none=True)
                    if adam is not None:
                        adam.zero_grad(set_to_none=True)
                    loss = -mll(gp(phi[idx]), y[idx])
                    loss.backward()
                    ngd.step()
                    if adam is not None:
                        adam.step()
        # ---- full-data natural-gradient steps on q(u), hyperparameters fixed
        steps, change, lr = 0, float("nan"), 1.0
        params = list(gp.variational_parameters())
        prev_loss, prev_state, prev_grads = None, None, None
        for _ in range(self.polish_steps):
            loss, grads = self._full_elbo_grad(phi, y)
            if prev_loss is not None and loss > prev_loss + 1e-10:
                # the step made the ELBO worse: go back and take half the step
                with torch.no_grad():
                    for p, s in zip(params, prev_state):
                        p.copy_(s)
                lr *= 0.5
                loss, grads = prev_loss, prev_grads
            state = self._natural_parameters()
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.add_(g, alpha=-lr * n)
            # distance to the fixed point: the size of a full (step 1) natural-gradient step
            change = max(float((n * g).abs().max() / s.abs().max().clamp_min(1e-300)) for g, s in zip(grads, state))
            prev_loss, prev_state, prev_grads = loss, state, grads
            steps += 1
            if change < self.polish_tol:
                break
        gp.eval()
        lik.eval()
        return {"polish_steps": steps, "polish_change": change, "polish_lr": lr,
                "kernel_variance": gp.covar_module.variance.detach().reshape(-1).tolist()}

    def _full_elbo_grad(self, phi: torch.Tensor, y: torch.Tensor, chunk: int = 50_000):
        """``-ELBO / n`` on all data (chunked) and its gradient w.r.t. the natural parameters."""
        gp, lik = self.gp, self.likelihood
        params = list(gp.variational_parameters())
        for p in params:
            p.grad = None
        n = phi.shape[0]
        loss = 0.0
        for start in range(0, n, chunk):
            f = gp(phi[start:start + chunk])  # (in train mode each call rebuilds q(u)'s graph)
            loss = loss - lik.expected_log_prob(y[start:start + chunk], f).sum() / n
        loss = loss + gp.variational_strategy.kl_divergence() / n  # q(u) of the last call above
        loss.backward()
        total = float(loss.detach())
        grads = [p.grad.detach().clone() for p in params]
        for p in gp.parameters():
            p.grad = None
        return total, grads

    @torch.no_grad()
    def _read_weight_posterior(self) -> None:
        """``q(w) = N(mu_w, C_w)`` from GPyTorch's joint predictive at the basis vectors ``e_1..e_p``."""
        gp = self.gp
        gp.eval()
        p = self.feature_dim
        with gpytorch.settings.fast_pred_var(False):
            dist = gp(torch.eye(p, dtype=_F64))
            mean = dist.mean.detach().clone()
            cov = dist.covariance_matrix.detach().clone()
        cov = cov - self.gp.variational_strategy.jitter_val * torch.eye(p, dtype=_F64)
        cov = 0.5 * (cov + cov.mT)
        self.weight_mean = mean
        self.weight_covariance = cov
        self._weight_factor = _cholesky(cov)

    # ------------------------------------------------------------------ queries
    def predict(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of the latent ``f(x) = phi(x)^T w`` under ``q(w)``; ``[..., D] -> [...]`` float64."""
        phi = self.features(X)
        mean = phi @ self.weight_mean
        v = phi @ self._weight_factor
        return mean, (v * v).sum(-1)

    def predict_proba(self, X) -> torch.Tensor:
        """Posterior mean of the success probability, ``E[Phi(f)] = Phi(mean / sqrt(1 + var))``."""
        mean, var = self.predict(X)
        return torch.special.ndtr(mean / torch.sqrt(1 + var))

    def gp_predictive(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """GPyTorch's own predictive mean and variance at ``X [..., D]`` (for cross-checks).

        The input is flattened to ``[N, p]`` before it reaches GPyTorch (a batched input would
        make GPyTorch build one ``M x M`` matrix per batch element), and GPyTorch's predictive
        jitter is subtracted from the variance.
        """
        phi = self.features(X)
        flat = phi.reshape(-1, self.feature_dim)
        self.gp.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
            dist = self.gp(flat)
            mean, var = dist.mean, dist.variance - self.gp.variational_strategy.jitter_val
        return mean.reshape(phi.shape[:-1]), var.reshape(phi.shape[:-1])

    def sample(self, generator: Generator = None, key: str = "weights", shape: Sequence[int] = ()) -> torch.Tensor:
        """Draws of the weights ``w ~ q(w)``, ``[*shape, p]`` (one draw of the whole latent function each)."""
        z = standard_normal((*shape, self.feature_dim), generator, key=key)
        return self.weight_mean + z @ self._weight_factor.mT

    def sample_at(self, features, generator: Generator = None, key: str = "latent") -> torch.Tensor:
        """One joint draw of the latent function per context: ``[R, K, D] -> [R, K]`` (``[K, D] -> [K]``).

        One weight vector ``w ~ q(w)`` is drawn for each of the ``R`` contexts (independent
        across contexts, as independent Thompson decisions are) and shared by its ``K``
        candidates, so the draw is joint over the candidates of a context.

        Under a ``DrawBatch`` of ``S`` (the ``Decider``'s propensities, ``action_probabilities``):
        ``[S, R, K]``, ``S`` independent draws of ``q(w)`` in one call (``S x p`` normals and one
        ``[S, p] x [p, p]`` product; the features are computed once); the model keeps nothing
        of them (the reward and constraint views share the same ``S`` draws, as one decision's).
        """
        if isinstance(generator, ReplicationRNG) and generator.replications > 1 and not isinstance(generator, DrawBatch):
            # a ReplicationRNG of R > 1 streams is how ``bayes_safe.simulate`` runs R replications
            raise _refuse_replications(generator.replications)
        phi = self.features(features)
        if phi.dim() < 2:
            raise ValueError(f"features: expected shape [R, K, {self.input_dim}] or [K, {self.input_dim}], got {list(features.shape)}")
        w = self.sample(generator, key=key, shape=phi.shape[:-2])
        return (phi * w[..., None, :]).sum(-1)

    # ------------------------------------------------------------------ stored data, saving
    @property
    def weight_names(self) -> list[str]:
        """Names of the ``p`` GP inputs (the weights ``w``): ``phi0 .. phi{p-2}`` (learned features), ``intercept``."""
        return [f"phi{i}" for i in range(self.feature_dim - 1)] + ["intercept"]

    def observations(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored observations ``(X [n, D], y [n])`` (float64, in arrival order; ``n = 0`` before any update)."""
        if not self._X:
            return torch.zeros(0, self.input_dim, dtype=_F64), torch.zeros(0, dtype=_F64)
        return torch.cat(self._X), torch.cat(self._y)

    def compact(self, max_observations: int | None = None) -> ProbitGP:
        """An independent copy for saving: same fitted posterior, at most ``max_observations`` stored rows.

        The copy has the network, the variational GP and ``q(w)`` of this model; it keeps an
        evenly spaced subset (over arrival order) of the stored observations (all of them if
        ``max_observations`` is ``None``) and none of the per-decision draw state the views
        share. ``num_observations`` still counts every observation the posterior was fitted on;
        a refit of the copy would use the kept rows only. For diagnostics (``bayes_safe.diagnostics``
        draws the latent function at the stored points) and small model files.

        Args:
            max_observations: positive int, or ``None`` to keep every stored row.

        Returns:
            a new ``ProbitGP``.
        """
        max_observations = check_positive_int(max_observations, "max_observations", allow_none=True)
        X, y = self.observations()
        keep = torch.arange(X.shape[0])
        if max_observations is not None and X.shape[0] > int(max_observations):
            keep = torch.linspace(0, X.shape[0] - 1, int(max_observations), dtype=_F64).round().long().unique()
        saved = (self._X, self._y, self._draw_state, self._update_state)
        self._X, self._y, self._draw_state, self._update_state = [], [], None, None
        try:
            out = copy.deepcopy(self)
        finally:
            self._X, self._y, self._draw_state, self._update_state = saved
        if X.shape[0]:
            out._X, out._y = [X[keep].clone()], [y[keep].clone()]
        return out

    # ------------------------------------------------------------------ pickling (between processes)
    def __getstate__(self) -> dict:
        """Picklable state, for sending a model to a worker process (files use the code-free
        ``bayes_safe.state`` format instead): GPyTorch's ``LinearKernel`` holds its variance prior
        through local lambdas, which cannot be pickled, so the GP is stored as its inducing
        points and ``state_dict`` and rebuilt by ``__setstate__``."""
        state = dict(self.__dict__)
        gp = state.pop("gp")
        state["_gp_state"] = {
            "inducing_points": gp.variational_strategy.inducing_points.detach().clone(),
            "state_dict": {k: v.detach().clone() for k, v in gp.state_dict().items()},
            "training": gp.training,
        }
        return state

    def __setstate__(self, state: dict) -> None:
        saved = state.pop("_gp_state")
        self.__dict__.update(state)
        gp = self._build_gp(saved["inducing_points"])
        gp.load_state_dict(saved["state_dict"])
        gp.train(saved["training"])
        self.gp = gp

    def __deepcopy__(self, memo: dict) -> ProbitGP:
        """The default deep copy (every attribute copied, the GP module included), bypassing
        the pickling state of ``__getstate__``."""
        out = type(self).__new__(type(self))
        memo[id(self)] = out
        out.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return out

    # ------------------------------------------------------------------ shared draws of views
    def _joint_latent(self, view, features, generator: Generator, key: str) -> torch.Tensor:
        state = self._draw_state
        if state is not None and state[0] is features and id(view) not in state[2]:
            state[2].add(id(view))
            return state[1]
        latent = self.sample_at(features, generator, key=key)
        self._draw_state = (features, latent, {id(view)})
        return latent

    def _joint_update(self, view, X, y, actions) -> None:
        state = self._update_state
        if state is not None and state[0] is X and id(view) not in state[2]:
            y_t = torch.as_tensor(y, dtype=_F64)
            if y_t.shape != state[1].shape or not bool((y_t == state[1]).all()):
                raise ValueError(
                    "y: two views of one ProbitGP were updated with the same features but different "
                    "success outcomes (e.g. a reward that is positive where the constraint metric is 0)"
                )
            state[2].add(id(view))
            return
        self.update(X, y, actions=actions)
        self._update_state = (X, torch.as_tensor(y, dtype=_F64).clone(), {id(view)})

    def __repr__(self) -> str:
        M = self.feature_dim if self.num_inducing is None else self.num_inducing
        return (f"ProbitGP(input_dim={self.input_dim}, hidden={list(self.hidden)}, inducing={M}, "
                f"observations={self.num_observations}, fits={self.num_fits})")


_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(40)


def _probit_moments(mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``Phi(f)`` for ``f ~ N(mean, var)``.

    The mean is exact (``Phi(mean / sqrt(1 + var))``); ``E[Phi(f)^2]`` by 40-point Gauss-Hermite.
    """
    m1 = torch.special.ndtr(mean / torch.sqrt(1 + var))
    nodes = torch.as_tensor(_GH_NODES, dtype=_F64)
    weights = torch.as_tensor(_GH_WEIGHTS, dtype=_F64) / math.sqrt(2 * math.pi)
    f = mean[..., None] + var.sqrt()[..., None] * nodes
    m2 = (torch.special.ndtr(f) ** 2 * weights).sum(-1)
    return m1, (m2 - m1 * m1).clamp_min(0.0)


class SuccessProbability:
    """A view of a ``ProbitGP`` that answers for the success probability ``Phi(f)``.

    ``sample_at`` returns draws of ``Phi(f~(x, a))`` (the constraint metric of TS-ASC in the
    video-upload problem: reliability), ``predict`` its posterior mean and variance, and
    ``update(X, y)`` passes binary outcomes to the model.

    Shared draws: all views of one model give, within one decision, values of the *same*
    draw ``f~``. When a view is asked for ``features`` that are the very tensor another view of
    the same model has just been asked for (and it has not used that draw yet), it reuses the
    draw. This is how TS-ASC's one sampled model ``f~_t`` (Daulton et al. 2019, Algorithm 1,
    line 4) gives both the reward and the constraint: ``TSASC.select`` calls its reward model
    and then its constraint model with the same ``features``. Likewise an update that another
    view of the same model has already recorded for the same ``X`` tensor is not recorded
    twice (it is checked to carry the same success outcomes).
    """

    def __init__(self, model: ProbitGP):
        if not isinstance(model, ProbitGP):
            raise TypeError(f"model: expected a ProbitGP, got {type(model).__name__}")
        self.model = model

    def _transform(self, p: torch.Tensor, features) -> torch.Tensor:
        return p

    def sample_at(self, features, generator: Generator = None, key: str = "success") -> torch.Tensor:
        """Draws of ``Phi(f~)`` at ``features [R, K, D] -> [R, K]`` (shared with the model's other views)."""
        latent = self.model._joint_latent(self, features, generator, key)
        return self._transform(torch.special.ndtr(latent), features)

    def predict(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and variance of ``Phi(f)`` (times the scale for ``ScaledOutcome``,
        whose ``X`` must then be candidates ``[..., K, D]``)."""
        mean, var = self.model.predict(X)
        m1, v1 = _probit_moments(mean, var)
        s = self._transform(torch.ones_like(m1), X)
        return m1 * s, v1 * s * s

    def _success(self, y, actions) -> torch.Tensor:
        return y

    def update(self, X, y, actions=None) -> None:
        """Record binary outcomes ``y [n]`` at ``X [n, D]`` (once per model, see the class docstring)."""
        self.model._joint_update(self, X, self._success(y, actions), actions)

    def fit(self) -> None:
        self.model.fit()

    @property
    def num_observations(self) -> int:
        return self.model.num_observations

    @property
    def binary_outcomes(self) -> bool:
        """Success outcomes are 0 / 1; a ``ScaledOutcome``'s are ``scale[a]`` times them."""
        return type(self) is SuccessProbability

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r})"


class ScaledOutcome(SuccessProbability):
    """A view of a ``ProbitGP`` for an outcome ``scale[a] * 1(success)``: draws of ``scale[a] Phi(f~)``.

    For the video-upload problem ``scale = cumsum(omega)``, the reward of a successful upload at
    each quality (Daulton et al. 2019, section 5.1); since the reward is deterministic given
    success and action (section 5.2), the expected reward is ``scale[a] P(success)`` and only
    success needs a model. Candidate ``k`` of ``features [R, K, D]`` is action ``k``.

    ``update(X, reward, actions)`` turns rewards back into success outcomes (``reward > 0``);
    with ``actions`` given, every reward must be 0 or ``scale[action]``.

    Args:
        model: the success model.
        scale: ``[K]`` positive scale of each action.
    """

    def __init__(self, model: ProbitGP, scale):
        super().__init__(model)
        scale = check_finite(as_tensor(scale, "scale"), "scale")
        if scale.dim() != 1 or scale.numel() < 1:
            raise ValueError(f"scale: expected a 1-d tensor with one value per action, got shape {list(scale.shape)}")
        if bool((scale <= 0).any()):
            raise ValueError(f"scale: expected positive values, got {scale.tolist()}")
        self.scale = scale

    def _transform(self, p, features):
        if p.shape[-1] != self.scale.numel():
            raise ValueError(
                f"features: expected {self.scale.numel()} candidate actions (one per scale entry) in dimension -2, "
                f"got {p.shape[-1]}"
            )
        return p * self.scale

    def _success(self, y, actions):
        r = check_finite(as_tensor(y, "reward"), "reward")
        if bool((r < 0).any()):
            raise ValueError(f"reward: expected non-negative rewards (0 on failure), got min {float(r.min())}")
        success = (r > 0).to(_F64)
        if actions is not None:
            a = torch.as_tensor(actions).long()
            if a.shape != r.shape:
                raise ValueError(f"actions: expected shape {list(r.shape)} to match reward, got {list(a.shape)}")
            if bool(((a < 0) | (a >= self.scale.numel())).any()):
                raise ValueError(f"actions: expected indices in [0, {self.scale.numel()}), got out-of-range values")
            expected = success * self.scale[a]
            if not torch.allclose(r, expected, rtol=1e-9, atol=1e-12):
                raise ValueError("reward: expected 0 (failure) or scale[action] (success) for every observation")
        return success

    def __repr__(self) -> str:
        return f"ScaledOutcome({self.model!r}, scale={self.scale.tolist()})"
