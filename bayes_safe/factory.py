"""Build policies by name for a linear problem (used by the command line and the studies)."""

from __future__ import annotations

import pyro.distributions as dist
import torch

from .envs.problem import problem_device
from .models import BayesianLinear
from .policies import CLUCB, CLUCB2ASC, LUCB, TSASC, Greedy, LinUCB, Random, ThompsonSampling

__all__ = ["POLICIES", "describe_model", "make_policy", "problem_models", "ridge_model"]

POLICIES = ("ts", "ts-asc", "linucb", "greedy", "random", "lucb", "clucb", "clucb2-asc-c", "clucb2-asc-i")


def ridge_model(env, metric: int = 0, ridge: float | None = None, forgetting=None) -> BayesianLinear:
    """Bayesian linear regression for one metric of ``env``, known noise ``sigma = env.noise_std[metric]``.

    ``ridge=None`` (the default) uses the problem's own prior when it declares one: the
    built-in linear bandits draw their parameters from ``N(0, s^2 I)`` (``env.parameter_std = s``:
    1 for ``daulton2019`` and ``kazerouni2017_neurips``, ``sqrt(10)`` for ``kazerouni2017``),
    so the prior ``N(0, s^2 I)`` is the well-specified one; a problem without
    ``parameter_std`` gets ``ridge = 1``. A number gives the prior ``N(0, sigma^2 / ridge I)``:
    the "Bayesian interpretation" of ridge regression with penalty ``ridge``, whose posterior
    mean is the ridge estimate (Daulton et al. 2019 s.4.1 use ``ridge = 1``, i.e. a prior sd of
    ``sigma = 0.1`` for parameters drawn with sd 1: too narrow; the reproduction studies keep it).

    A problem with ``feature_names`` (``d`` strings) gives them to the model, which keeps them in
    its saved state (``bayes-safe diagnose`` names the weights after them).

    ``forgetting``: as for ``BayesianLinear`` (a factor in (0, 1], ``"adaptive"``, or None), the
    stabilised rule (issue 30).
    """
    sigma = float(env.noise_std[metric])
    if ridge is None:
        std = getattr(env, "parameter_std", None)
        scale = float(std) if std is not None else sigma
    else:
        scale = sigma / float(ridge) ** 0.5
    # float64 parameters: Normal(0.0, 0.1) from Python floats would round the scale to float32
    # on the problem's device (issue 46): the model follows its prior, and simulate runs where the problem lives
    device = problem_device(env)
    device = torch.device("cpu") if device is None else torch.device(device)
    prior = dist.Normal(torch.zeros((), dtype=torch.float64, device=device),
                        torch.tensor(scale, dtype=torch.float64, device=device))
    names = getattr(env, "feature_names", None)  # a problem that names its features: saved with the model
    if names is not None and len(names) != env.dim:
        names = None
    return BayesianLinear(prior.expand([env.dim]).to_event(1), noise_std=sigma, batch_shape=[env.replications],
                          feature_names=names, forgetting=forgetting)


def make_policy(name: str, env, *, ridge: float | None = None, alpha: float | None = None, delta: float = 0.001,
                weight_bound: float | None = None, constraints=None, metric_names=None, fallback: str | None = None,
                models=None, forgetting=None):
    """A policy registered as ``name`` (see ``POLICIES``), with ridge models for ``env``'s metrics.

    ``ridge``: None for the problem's own (well-specified) prior, a number for the ridge prior
    ``N(0, sigma^2 / ridge I)`` (see ``ridge_model``).

    ``constraints``: for ts-asc (and clucb2-asc-c/-i, relative ``at_least`` form only), one
    ``bayes_safe.envs.Constraint`` per constraint metric instead of ``alpha`` (see ``TSASC``);
    with ``metric_names`` (ts-asc), any number, matched to the models by metric name (a
    guardrail on the reward included).

    ``metric_names``, ``fallback`` (ts-asc): passed to ``TSASC``; ``fallback=None`` takes
    ``env.fallback`` when the problem declares one (``bayes_safe.envs.Problem.fallback``), else
    ``"safest"``. Policies without constraint models ignore both.

    ``models``: the problem's own posteriors instead of ridge models, one per metric, reward first
    (``problem_models(problem, R)``); for ts, greedy and ts-asc (ts and greedy use the first,
    ts-asc all of them). The UCB family builds its confidence sets from ridge models of known
    noise and refuses them.

    ``forgetting``: the ridge models' forgetting (a factor in (0, 1], ``"adaptive"``, or None; see
    ``BayesianLinear``), for ts, greedy and ts-asc. The UCB family's confidence sets assume a
    fixed parameter (Abbasi-Yadkori et al. 2011) and refuse it; the problem's own models
    (``models=``) set their own.
    """
    if name not in POLICIES:
        raise ValueError(f"policy: unknown name {name!r}; expected one of {list(POLICIES)}")
    if forgetting is not None:
        if name == "random":
            raise ValueError("forgetting: the random policy has no models to forget with")
        if name not in ("ts", "greedy", "ts-asc"):
            raise ValueError(f"forgetting: {name!r} builds confidence sets that assume the parameters never change; "
                             "forgetting runs with 'ts', 'greedy' or 'ts-asc'")
        if models is not None:
            raise ValueError("forgetting: applies to the ridge models built when models= is not given; the problem's "
                             "own models set their own forgetting")
        from .models.change_detection import parse_forgetting

        parse_forgetting(forgetting)  # a clear error before any model is built
    if ridge is not None and not ridge > 0:
        raise ValueError(f"ridge: expected a number > 0 (or None for the problem's own prior), got {ridge}")
    if models is not None:
        if isinstance(models, (str, bytes)) or not isinstance(models, (list, tuple)) or len(models) == 0:
            raise TypeError(f"models: expected a list of models, one per metric (reward first), e.g. "
                            f"problem_models(problem, R), got {type(models).__name__}")
        if ridge is not None:
            raise ValueError("ridge: applies to the ridge models built when models= is not given; the problem's own "
                             "models were given")
        if name not in ("ts", "greedy", "ts-asc", "random"):
            raise ValueError(f"models: {name!r} builds its confidence sets from ridge models of known noise; the "
                             "problem's own models run with 'ts', 'greedy' or 'ts-asc'")
        models = list(models)
    if name == "random":
        return Random()
    reward = models[0] if models is not None else ridge_model(env, 0, ridge, forgetting)
    if name == "ts":
        return ThompsonSampling(reward)
    if name == "greedy":
        return Greedy(reward)
    if name == "linucb":
        # default S: each replication's true ||theta*|| (an oracle bound, as in the papers' experiments)
        bound = weight_bound if weight_bound is not None else env.parameters[:, 0].norm(dim=-1)
        return LinUCB(reward, delta=delta, weight_bound=bound)
    if name in ("lucb", "clucb"):
        # S = ||theta*|| of each replication (the known bound B of Kazerouni et al., Assumption 2),
        # per replication so that batched runs equal single ones
        bound = weight_bound if weight_bound is not None else env.parameters[:, 0].norm(dim=-1)
        if name == "lucb":
            return LUCB(reward, delta=delta, weight_bound=bound)
        alpha = env.alpha if alpha is None else alpha
        if alpha is None:
            raise ValueError(f"alpha: required for clucb on problem {env.name!r} (which has no alpha of its own); pass --alpha")
        return CLUCB(reward, baseline_reward=env.baseline_expected[:, 0], alpha=alpha, delta=delta, weight_bound=bound)
    num_metrics = len(models) if models is not None else env.num_metrics
    if num_metrics < 2:
        what = "the models given" if models is not None else f"{env.name!r}"
        raise ValueError(f"policy: {name!r} needs a problem with a constraint metric; {what} has none")
    if constraints is not None and alpha is not None:
        raise ValueError(f"{name}: give exactly one of alpha= and constraints=, not both")
    if constraints is None:
        alpha = getattr(env, "alpha", None) if alpha is None else alpha
        if alpha is None:
            raise ValueError(f"alpha: required for {name} on a problem without its own alpha")
    declared = constraints
    constraints = models[1:] if models is not None else [ridge_model(env, m, ridge, forgetting)
                                                         for m in range(1, env.num_metrics)]
    if name in ("clucb2-asc-c", "clucb2-asc-i"):
        norms = env.parameters.norm(dim=-1)  # [R, M]
        bound = weight_bound if weight_bound is not None else norms[:, 0]
        cbounds = [weight_bound if weight_bound is not None else norms[:, m] for m in range(1, env.num_metrics)]
        mode = "cumulative" if name.endswith("-c") else "instance"
        return CLUCB2ASC(reward, constraints, alpha=alpha, delta=delta, mode=mode, weight_bound=bound,
                         constraint_weight_bounds=cbounds, constraints=declared)
    if fallback is None:
        fallback = getattr(env, "fallback", None) or "safest"
    options = {"metric_names": metric_names, "fallback": fallback}
    if declared is not None:
        return TSASC(reward, constraints, constraints=declared, **options)
    return TSASC(reward, constraints, alpha=alpha, **options)


def problem_models(problem, replications: int | None) -> list | None:
    """The posterior models a problem declares through its ``models(replications)`` hook
    (``bayes_safe.envs.Problem``): one per metric, reward first, checked; None when it declares none
    (then callers build ridge models and say so).

    Args:
        problem: a ``Problem`` (or any object with the protocol's ``metric_names``).
        replications: ``R`` for models with ``batch_shape=[R]`` (``simulate``), or None for
            one posterior shared by the units (``batch_shape=()``: the A/B tuner's arms).
    Returns:
        A list of ``len(problem.metric_names)`` new models, or None.
    """
    hook = getattr(problem, "models", None)
    if not callable(hook):
        return None
    name = type(problem).__name__
    models = hook(replications)
    if models is None:
        return None
    if isinstance(models, (str, bytes)) or not hasattr(models, "__len__"):
        raise TypeError(f"problem.models: {name}.models({replications!r}) must return a list of models (one per "
                        f"metric), got {type(models).__name__}")
    models = list(models)
    names = list(problem.metric_names)
    if len(models) != len(names):
        raise ValueError(f"problem.models: {name}.models({replications!r}) returned {len(models)} models; expected "
                         f"{len(names)}, one per metric ({', '.join(names)}), reward first")
    want = () if replications is None else (int(replications),)
    for metric, model in zip(names, models):
        for method in ("update", "sample_at"):
            if not callable(getattr(model, method, None)):
                raise TypeError(f"problem.models: the model of {metric!r} ({type(model).__name__}) has no {method}(); "
                                "expected a posterior model such as bayes_safe.BayesianLinear")
        shape = getattr(model, "batch_shape", None)
        if shape is not None and tuple(shape) != want:
            raise ValueError(f"problem.models: the model of {metric!r} has batch_shape {list(shape)}; "
                             f"{name}.models({replications!r}) must build batch_shape={list(want)}")
    return models


def describe_model(model) -> str:
    """One line naming a model and its engine, for reports: ``"BayesianLinear (gibbs, logistic)"``."""
    parts = []
    engine = getattr(model, "engine_name", None)
    if engine is not None:
        if engine == "conjugate":
            engine = "conjugate NIG" if getattr(model, "noise_prior", None) is not None else "conjugate, known noise"
        parts.append(str(engine))
    likelihood = getattr(model, "likelihood", None)
    if likelihood not in (None, "gaussian"):
        parts.append(str(likelihood))
    forgetting = getattr(model, "forgetting", None)
    if forgetting is not None:
        if forgetting == "adaptive":
            adaptive, detector = getattr(model, "adaptive", None), getattr(model, "_detector", None)
            parts.append("adaptive forgetting" if adaptive is None or detector is None
                         else f"adaptive forgetting: {adaptive.test(detector.binary)}")
        else:
            parts.append(f"forgetting {forgetting:g}")
    return type(model).__name__ + (f" ({', '.join(parts)})" if parts else "")
