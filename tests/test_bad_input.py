"""The bad-input suite (issue 14, findings 10 and 11, "Done when").

Every case is one distinct bad input, through the Python API or the ``bayes-safe`` command
line. Each asserts the exception type (API) or the exit status 2 (CLI), that the message
names the argument, and for the command line that stderr holds a single error line and no
traceback and that ``--out`` holds nothing new. ``test_case_count`` prints the counts.

Inputs the next issue will *accept* (a Python int baseline, numpy arrays, float32
features: converted at the boundary) are deliberately not listed here as errors.
"""

from __future__ import annotations

import math
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import simulate
from bayes_safe.cli import main
from bayes_safe.envs import (
    VideoUploadProblem,
    daulton2019,
    kazerouni2017,
    kazerouni2017_neurips,
    load_iwpc,
    load_movielens,
    movie_recommendation,
    synthetic_movielens,
    video_upload,
    warfarin,
)
from bayes_safe.models import BayesianLinear, PerArmLinear
from bayes_safe.offline import LoggedData, bootstrap_ci, estimate_value, evaluate_policy, ips, snips
from bayes_safe.policies import (
    BCTS,
    CLUCB,
    CLUCB2ASC,
    LUCB,
    TSASC,
    CTSPosterior,
    Greedy,
    LinUCB,
    Random,
    ThompsonSampling,
)
from bayes_safe.random import ReplicationRNG, replication_seeds

R, D = 3, 4
F64 = torch.float64


# ---------------------------------------------------------------------- small objects, built on demand
@cache
def _env():
    return daulton2019(replications=R, seed=0)


def _features():
    return _env().arm_features.clone()


def _baseline():
    return _env().baseline_action.clone()


def _K():
    return _env().num_arms


def _prior(d=D, **kw):
    return dist.Normal(torch.zeros(()), torch.ones(()), **kw).expand([d]).to_event(1)


def _model(batch=(R,)):
    return BayesianLinear(_prior(), noise_std=0.1, batch_shape=batch)


POLICIES = {
    "ts": lambda: ThompsonSampling(_model()),
    "ts-asc": lambda: TSASC(_model(), _model(), alpha=0.1),
    "linucb": lambda: LinUCB(_model()),
    "greedy": lambda: Greedy(_model()),
    "random": lambda: Random(),
    "lucb": lambda: LUCB(_model()),
    "clucb": lambda: CLUCB(_model(), _env().baseline_expected[:, 0], alpha=0.1),
    "clucb2-asc": lambda: CLUCB2ASC(_model(), _model(), alpha=0.1),
    "bcts": lambda: BCTS(1.0, num_arms=_K(), dim=D, batch_shape=[R]),
}
#: policies whose models fix the batch size R and the width d
MODEL_POLICIES = [p for p in POLICIES if p != "random"]


def _select(policy, features=None, baseline="default", valid=None):
    def run():
        f = _features() if features is None else features()
        b = _baseline() if baseline == "default" else baseline
        return POLICIES[policy]().select(f, b, valid=valid() if callable(valid) else valid)
    return run


def _nan_features():
    f = _features()
    f[0, 1, 2] = float("nan")
    return f


@cache
def _logged():
    g = torch.Generator().manual_seed(0)
    n, a = 40, 3
    x = torch.randn(n, 2, generator=g)
    actions = torch.arange(n) % a
    pi0 = torch.full((n, a), 1 / a, dtype=F64)
    return LoggedData.from_tensors(x, actions, torch.rand(n, generator=g), torch.full((n,), 1 / a), torch.zeros(n),
                                   logging_probs=pi0)


def _logged_args(**change):
    n, a = 20, 3
    args = {"contexts": torch.randn(n, 2), "actions": torch.arange(n) % a, "rewards": torch.rand(n),
            "propensities": torch.full((n,), 1 / a), "domains": torch.zeros(n)}
    args.update(change)
    return args


def _from_tensors(**change):
    return lambda: LoggedData.from_tensors(**_logged_args(**change))


def _uniform_probs(n=40, a=3):
    return torch.full((n, a), 1 / a, dtype=F64)


def _probs_not_summing():
    p = _uniform_probs()
    p[5] = torch.tensor([0.5, 0.5, 0.5])
    return p


def _probs_negative():
    p = _uniform_probs()
    p[2] = torch.tensor([1.5, -0.5, 0.0])
    return p


def _probs_nan():
    p = _uniform_probs()
    p[0, 0] = float("nan")
    return p


# ---------------------------------------------------------------------- API cases
def _c(case_id, fn, exc, match):
    return pytest.param(fn, exc, match, id=case_id)


API_CASES = []

# --- policies: select (finding 11, every policy)
for _p in POLICIES:
    API_CASES += [
        # one context [K, d] is a batch of one: wrong for models of R > 1 replications; for a policy
        # without models the baseline [R] then no longer fits the single row
        _c(f"{_p}-select-features-2d", _select(_p, features=lambda: _features()[0]), ValueError,
           "baseline" if _p == "random" else "features"),
        _c(f"{_p}-select-features-4d", _select(_p, features=lambda: _features()[None]), ValueError, "features"),
        _c(f"{_p}-select-features-nan", _select(_p, features=_nan_features), ValueError, "features"),
        _c(f"{_p}-select-features-strings", _select(_p, features=lambda: [["a"]]), TypeError, "features"),
        _c(f"{_p}-select-baseline-float", _select(_p, baseline=torch.full((R,), 1.5, dtype=F64)), TypeError, "baseline"),
        _c(f"{_p}-select-baseline-python-float", _select(_p, baseline=1.5), TypeError, "baseline"),
        _c(f"{_p}-select-baseline-shape", _select(_p, baseline=torch.zeros(R + 1, dtype=torch.long)), ValueError, "baseline"),
        _c(f"{_p}-select-baseline-out-of-range", _select(_p, baseline=torch.full((R,), 10_000)), ValueError, "baseline"),
        _c(f"{_p}-select-valid-shape", _select(_p, valid=lambda: torch.ones(R, 2, dtype=torch.bool)), ValueError, "valid"),
        _c(f"{_p}-select-valid-float", _select(_p, valid=lambda: torch.ones(R, _K())), TypeError, "valid"),
    ]
for _p in MODEL_POLICIES:
    API_CASES += [
        _c(f"{_p}-select-features-width", _select(_p, features=lambda: torch.randn(R, 5, D + 1, dtype=F64),
                                                  baseline=torch.zeros(R, dtype=torch.long)), ValueError, "features"),
        _c(f"{_p}-select-batch-size", _select(_p, features=lambda: _features()[:2], baseline=torch.zeros(2, dtype=torch.long)), ValueError, "features"),
    ]
for _p in ("ts", "greedy", "random", "linucb", "lucb", "clucb"):
    API_CASES.append(_c(f"{_p}-select-valid-empty-row",
                        _select(_p, valid=lambda: torch.zeros(R, _K(), dtype=torch.bool)), ValueError, "valid"))
for _p in ("ts-asc", "clucb", "clucb2-asc"):
    API_CASES.append(_c(f"{_p}-select-baseline-missing", _select(_p, baseline=None), ValueError, "baseline"))

# --- policies: update
_rows = lambda d=D: torch.randn(R, d, dtype=F64)
_rew = lambda n=R: torch.randn(n, dtype=F64)
API_CASES += [
    _c("ts-update-width", lambda: POLICIES["ts"]().update(_rows(D + 2), _rew()), ValueError, "features_chosen"),
    _c("ts-update-reward-shape", lambda: POLICIES["ts"]().update(_rows(), _rew(R + 1)), ValueError, "reward"),
    _c("ts-update-reward-nan", lambda: POLICIES["ts"]().update(_rows(), torch.full((R,), math.nan, dtype=F64)),
       ValueError, "reward"),
    _c("ts-update-batch", lambda: POLICIES["ts"]().update(torch.randn(R + 2, D, dtype=F64), _rew(R + 2)), ValueError,
       "features_chosen"),
    _c("greedy-update-3d", lambda: POLICIES["greedy"]().update(torch.randn(R, 2, D, dtype=F64), _rew()), ValueError,
       "features_chosen"),
    _c("linucb-update-inf", lambda: POLICIES["linucb"]().update(torch.full((R, D), math.inf, dtype=F64), _rew()),
       ValueError, "features_chosen"),
    _c("ts-asc-update-no-constraints", lambda: POLICIES["ts-asc"]().update(_rows(), _rew(), None), ValueError,
       "constraints"),
    _c("ts-asc-update-constraints-shape", lambda: POLICIES["ts-asc"]().update(_rows(), _rew(), torch.zeros(R, 2, dtype=F64)),
       ValueError, "constraints"),
    _c("ts-asc-update-constraints-nan", lambda: POLICIES["ts-asc"]().update(
        _rows(), _rew(), torch.full((R, 1), math.nan, dtype=F64)), ValueError, "constraints"),
    _c("clucb2-asc-update-no-constraints", lambda: POLICIES["clucb2-asc"]().update(_rows(), _rew(), None), ValueError,
       "constraints"),
    _c("bcts-update-width", lambda: POLICIES["bcts"]().update(_rows(D + 1), _rew(), actions=torch.zeros(R, dtype=torch.long)),
       ValueError, "contexts"),
    _c("bcts-update-no-actions", lambda: POLICIES["bcts"]().update(_rows(), _rew()), ValueError, "actions"),
]

# --- policies: constructors
API_CASES += [
    _c("ts-model-none", lambda: ThompsonSampling(None), TypeError, "model"),
    _c("greedy-model-string", lambda: Greedy("model"), TypeError, "model"),
    _c("ts-asc-alpha-one", lambda: TSASC(_model(), _model(), alpha=1.0), ValueError, "alpha"),
    _c("ts-asc-alpha-string", lambda: TSASC(_model(), _model(), alpha="0.1"), TypeError, "alpha"),
    _c("ts-asc-alpha-count", lambda: TSASC(_model(), _model(), alpha=[0.1, 0.2]), ValueError, "alpha"),
    _c("ts-asc-no-constraint-models", lambda: TSASC(_model(), [], alpha=0.1), ValueError, "constraint_models"),
    _c("ts-asc-constraint-model-none", lambda: TSASC(_model(), [None], alpha=0.1), TypeError, "constraint_models"),
    _c("linucb-delta", lambda: LinUCB(_model(), delta=1.5), ValueError, "delta"),
    _c("linucb-weight-bound", lambda: LinUCB(_model(), weight_bound=-1.0), ValueError, "weight_bound"),
    _c("lucb-radius-scale", lambda: LUCB(_model(), radius_scale=0.0), ValueError, "radius_scale"),
    _c("lucb-unbatched-model", lambda: LUCB(_model(batch=())), ValueError, "model"),
    _c("clucb-baseline-reward-shape", lambda: CLUCB(_model(), torch.zeros(R + 1)), ValueError, "baseline_reward"),
    _c("clucb-baseline-reward-nan", lambda: CLUCB(_model(), torch.full((R,), math.nan)), ValueError, "baseline_reward"),
    _c("clucb-alpha", lambda: CLUCB(_model(), torch.zeros(R), alpha=-0.1), ValueError, "alpha"),
    _c("clucb-weight-bound-shape", lambda: CLUCB(_model(), torch.zeros(R), weight_bound=torch.ones(R + 1)), ValueError,
       "weight_bound"),
    _c("clucb2-asc-mode", lambda: CLUCB2ASC(_model(), _model(), mode="both"), ValueError, "mode"),
    _c("clucb2-asc-lower-bound", lambda: CLUCB2ASC(_model(), _model(), baseline_lower_bound=-1.0), ValueError,
       "baseline_lower_bound"),
    _c("clucb2-asc-constraint-dim", lambda: CLUCB2ASC(_model(), BayesianLinear(_prior(D + 1), noise_std=0.1, batch_shape=[R])),
       ValueError, "constraint_models"),
    _c("bcts-sigma-online", lambda: BCTS(2.0, num_arms=3, dim=2), ValueError, "sigma_online"),
    _c("bcts-teaching", lambda: BCTS(0.5, num_arms=3, dim=2, teaching="teacher"), ValueError, "teaching"),
    _c("bcts-sizes-missing", lambda: BCTS(0.5), ValueError, "num_arms"),
    _c("cts-num-arms", lambda: CTSPosterior(0, 2), ValueError, "num_arms"),
    _c("cts-v", lambda: CTSPosterior(3, 2, v=0.0), ValueError, "v"),
]

# --- models
_nan_prior = lambda: dist.Normal(torch.tensor(math.nan), torch.tensor(1.0), validate_args=False).expand([D]).to_event(1)
_neg_scale_prior = lambda: dist.Normal(torch.tensor(0.0), torch.tensor(-1.0), validate_args=False).expand([D]).to_event(1)
API_CASES += [
    _c("bl-noise-zero", lambda: BayesianLinear(_prior(), noise_std=0.0), ValueError, "noise_std"),
    _c("bl-noise-negative", lambda: BayesianLinear(_prior(), noise_std=-1.0), ValueError, "noise_std"),
    _c("bl-noise-nan", lambda: BayesianLinear(_prior(), noise_std=math.nan), ValueError, "noise_std"),
    _c("bl-noise-inf", lambda: BayesianLinear(_prior(), noise_std=math.inf), ValueError, "noise_std"),
    _c("bl-noise-1e-200", lambda: BayesianLinear(_prior(), noise_std=1e-200), ValueError, "noise_std"),
    _c("bl-noise-1e200", lambda: BayesianLinear(_prior(), noise_std=1e200), ValueError, "noise_std"),
    _c("bl-noise-string", lambda: BayesianLinear(_prior(), noise_std="0.1"), TypeError, "noise_std"),
    _c("bl-noise-bool", lambda: BayesianLinear(_prior(), noise_std=True), TypeError, "noise_std"),
    _c("bl-noise-both", lambda: BayesianLinear(_prior(), noise_std=0.1, noise_prior=dist.InverseGamma(2.0, 1.0)),
       ValueError, "noise_std"),
    _c("bl-noise-neither", lambda: BayesianLinear(_prior()), ValueError, "noise_std"),
    _c("bl-noise-prior-type", lambda: BayesianLinear(_prior(), noise_prior=dist.Gamma(2.0, 1.0)), TypeError, "noise_prior"),
    _c("bl-noise-prior-nan", lambda: BayesianLinear(_prior(), noise_prior=dist.InverseGamma(
        torch.tensor(math.nan), torch.tensor(1.0), validate_args=False)), ValueError, "noise_prior"),
    _c("bl-prior-number", lambda: BayesianLinear(3, noise_std=0.1), TypeError, "prior"),
    _c("bl-prior-scalar-event", lambda: BayesianLinear(dist.Normal(0.0, 1.0), noise_std=0.1), ValueError, "prior"),
    _c("bl-prior-gamma", lambda: BayesianLinear(dist.Gamma(1.0, 1.0).expand([D]).to_event(1), noise_std=0.1), ValueError,
       "prior"),
    _c("bl-prior-nan", lambda: BayesianLinear(_nan_prior(), noise_std=0.1), ValueError, "prior"),
    _c("bl-prior-negative-scale", lambda: BayesianLinear(_neg_scale_prior(), noise_std=0.1), ValueError, "prior"),
    _c("bl-prior-batch", lambda: BayesianLinear(dist.Normal(torch.zeros(2, D), 1.0).to_event(1), noise_std=0.1,
                                                batch_shape=[3]), ValueError, "prior"),
    _c("bl-batch-zero", lambda: BayesianLinear(_prior(), noise_std=0.1, batch_shape=[0]), ValueError, "batch_shape"),
    _c("bl-batch-float", lambda: BayesianLinear(_prior(), noise_std=0.1, batch_shape=[2.5]), ValueError, "batch_shape"),
    _c("bl-batch-int", lambda: BayesianLinear(_prior(), noise_std=0.1, batch_shape=5), TypeError, "batch_shape"),
    _c("bl-inference", lambda: BayesianLinear(_prior(), noise_std=0.1, inference="mcmc"), ValueError, "inference"),
    _c("bl-dim-mismatch", lambda: BayesianLinear(_prior(), noise_std=0.1, dim=D + 1), ValueError, "dim"),
    _c("bl-callable-no-dim", lambda: BayesianLinear(lambda: None, noise_std=0.1), ValueError, "dim"),
    _c("bl-refit-every", lambda: BayesianLinear(_prior(), noise_std=0.1, refit_every=0), ValueError, "refit_every"),
    _c("bl-update-width", lambda: _model().update(torch.randn(R, D + 1), torch.randn(R)), ValueError, "X"),
    _c("bl-update-y-shape", lambda: _model().update(torch.randn(R, D), torch.randn(R + 1)), ValueError, "y"),
    _c("bl-update-x-nan", lambda: _model().update(torch.full((R, D), math.nan), torch.randn(R)), ValueError, "X"),
    _c("bl-update-y-inf", lambda: _model().update(torch.randn(R, D), torch.full((R,), math.inf)), ValueError, "y"),
    _c("bl-update-x-strings", lambda: _model().update([["a"] * D] * R, torch.randn(R)), TypeError, "X"),
    _c("bl-update-batch", lambda: _model().update(torch.randn(R + 1, D), torch.randn(R + 1)), ValueError, "X"),
    _c("bl-predict-width", lambda: _model().predict(torch.randn(R, 5, D + 1)), ValueError, "X"),
    _c("bl-predict-nan", lambda: _model().predict(torch.full((R, 5, D), math.nan)), ValueError, "X"),
    _c("bl-predict-batch", lambda: _model().predict(torch.randn(R + 1, 5, D)), ValueError, "X"),
    _c("bl-sample-at-width", lambda: _model().sample_at(torch.randn(R, 5, D + 1, dtype=F64)), ValueError, "features"),
    _c("perarm-num-arms-zero", lambda: PerArmLinear(_prior(), 0, noise_std=0.1), ValueError, "num_arms"),
    _c("perarm-num-arms-float", lambda: PerArmLinear(_prior(), 2.5, noise_std=0.1), ValueError, "num_arms"),
    _c("perarm-prior-nan", lambda: PerArmLinear(_nan_prior(), 3, noise_std=0.1), ValueError, "prior"),
    _c("perarm-noise-1e-200", lambda: PerArmLinear(_prior(), 3, noise_std=1e-200), ValueError, "noise_std"),
    _c("perarm-update-actions-none", lambda: PerArmLinear(_prior(), 3, noise_std=0.1, batch_shape=[R]).update(
        torch.randn(R, D), torch.randn(R), None), ValueError, "actions"),
    _c("perarm-update-actions-range", lambda: PerArmLinear(_prior(), 3, noise_std=0.1, batch_shape=[R]).update(
        torch.randn(R, D), torch.randn(R), torch.full((R,), 3)), ValueError, "actions"),
    _c("perarm-update-actions-float", lambda: PerArmLinear(_prior(), 3, noise_std=0.1, batch_shape=[R]).update(
        torch.randn(R, D), torch.randn(R), torch.full((R,), 1.5)), TypeError, "actions"),
    _c("perarm-update-width", lambda: PerArmLinear(_prior(), 3, noise_std=0.1, batch_shape=[R]).update(
        torch.randn(R, D + 1), torch.randn(R), torch.zeros(R, dtype=torch.long)), ValueError, "contexts"),
    _c("perarm-predict-arms", lambda: PerArmLinear(_prior(), 3, noise_std=0.1, batch_shape=[R]).predict(
        torch.randn(R, 4, D)), ValueError, "features"),
]

# --- problems (envs)
API_CASES += [
    _c("kazerouni-num-arms-zero", lambda: kazerouni2017(num_arms=0), ValueError, "num_arms"),
    _c("kazerouni-num-arms-two", lambda: kazerouni2017(num_arms=2), ValueError, "num_arms"),
    _c("kazerouni-dim-zero", lambda: kazerouni2017(dim=0), ValueError, "dim"),
    _c("kazerouni-replications-zero", lambda: kazerouni2017(replications=0), ValueError, "replications"),
    _c("kazerouni-replications-float", lambda: kazerouni2017(replications=2.5), ValueError, "replications"),
    _c("kazerouni-noise-1e-200", lambda: kazerouni2017(noise_std=1e-200), ValueError, "noise_std"),
    _c("kazerouni-noise-negative", lambda: kazerouni2017(noise_std=-2.0), ValueError, "noise_std"),
    _c("kazerouni-seed-count", lambda: kazerouni2017(replications=3, seed=[1, 2]), ValueError, "seed"),
    _c("neurips-num-arms-zero", lambda: kazerouni2017_neurips(num_arms=0), ValueError, "num_arms"),
    _c("neurips-dim-float", lambda: kazerouni2017_neurips(dim=2.5), ValueError, "dim"),
    _c("neurips-baseline-rank-zero", lambda: kazerouni2017_neurips(baseline_rank=0), ValueError, "baseline_rank"),
    _c("neurips-baseline-rank-large", lambda: kazerouni2017_neurips(num_arms=5, baseline_rank=6), ValueError,
       "baseline_rank"),
    _c("daulton-alpha-one", lambda: daulton2019(alpha=1.0), ValueError, "alpha"),
    _c("daulton-alpha-string", lambda: daulton2019(alpha="0.1"), TypeError, "alpha"),
    _c("daulton-top-reward-zero", lambda: daulton2019(top_reward=0), ValueError, "top_reward"),
    _c("daulton-baseline-rank-float", lambda: daulton2019(baseline_rank=2.5), ValueError, "baseline_rank"),
    _c("daulton-num-arms-none", lambda: daulton2019(num_arms=None), ValueError, "num_arms"),
    _c("daulton-dim-zero", lambda: daulton2019(dim=0), ValueError, "dim"),
    _c("video-upload-omega-count", lambda: video_upload(omega=[1.0, 2.0]), ValueError, "omega"),
    _c("video-upload-omega-negative", lambda: video_upload(omega=[1.0, -0.1, 0.1, 0.1]), ValueError, "omega"),
    _c("video-upload-seed", lambda: video_upload(seed="0"), TypeError, "seed"),
    _c("video-upload-draw-zero", lambda: video_upload().draw(0), ValueError, "n"),
    _c("video-problem-warmup", lambda: VideoUploadProblem(warmup=5), ValueError, "warmup"),
    _c("video-problem-model", lambda: VideoUploadProblem(model=3), TypeError, "model"),
    _c("video-problem-defaults", lambda: VideoUploadProblem(defaults={"alhpa": 0.1}), ValueError, "defaults"),
    _c("synthetic-movielens-users", lambda: synthetic_movielens(num_users=0), ValueError, "num_users"),
    _c("synthetic-movielens-density", lambda: synthetic_movielens(density=2.0), ValueError, "density"),
    _c("load-movielens-missing", lambda: load_movielens("/nonexistent/ml-100k"), FileNotFoundError, "nonexistent"),
    _c("movie-recommendation-missing", lambda: movie_recommendation("/nonexistent/ml-100k"), FileNotFoundError,
       "nonexistent"),
    _c("load-iwpc-missing", lambda: load_iwpc("/nonexistent/iwpc.csv"), FileNotFoundError, "nonexistent"),
    _c("warfarin-missing", lambda: warfarin(data="/nonexistent/iwpc.csv"), FileNotFoundError, "nonexistent"),
]

# --- simulate (findings 10, 11)
_ts = lambda: ThompsonSampling(_model())
API_CASES += [
    _c("simulate-env-none", lambda: simulate(_ts(), None, 3), TypeError, "env"),
    _c("simulate-env-string", lambda: simulate(_ts(), "daulton2019", 3), TypeError, "env"),
    _c("simulate-policy-none", lambda: simulate(None, _env(), 3), TypeError, "policy"),
    _c("simulate-policy-model", lambda: simulate(_model(), _env(), 3), TypeError, "policy"),
    _c("simulate-horizon-float", lambda: simulate(_ts(), _env(), 2.5), ValueError, "horizon"),
    _c("simulate-horizon-bool", lambda: simulate(_ts(), _env(), True), ValueError, "horizon"),
    _c("simulate-horizon-zero", lambda: simulate(_ts(), _env(), 0), ValueError, "horizon"),
    _c("simulate-horizon-string", lambda: simulate(_ts(), _env(), "3"), ValueError, "horizon"),
    _c("simulate-callback", lambda: simulate(_ts(), _env(), 2, callback=3), TypeError, "callback"),
    _c("simulate-seed-count", lambda: simulate(_ts(), _env(), 2, seed=[1]), ValueError, "seed"),
    _c("simulate-constraints-mismatch", lambda: simulate(TSASC(_model(), [_model(), _model()]), _env(), 2), ValueError,
       "policy"),
    _c("replication-seeds-replications", lambda: replication_seeds(0, 0), ValueError, "replications"),
    _c("replication-seeds-count", lambda: replication_seeds([1, 2], 3), ValueError, "seed"),
    _c("replication-rng-block", lambda: ReplicationRNG([1, 2], block=0), ValueError, "block"),
    _c("replication-seeds-string", lambda: replication_seeds("a", 2), TypeError, "seed"),
    _c("simulate-seed-string", lambda: simulate(_ts(), _env(), 2, seed="a"), TypeError, "seed"),
    _c("simulate-seed-floats", lambda: simulate(_ts(), _env(), 2, seed=[0.5] * R), TypeError, "seed"),
]

# --- offline
API_CASES += [
    _c("logged-contexts-3d", _from_tensors(contexts=torch.randn(20, 2, 2)), ValueError, "contexts"),
    _c("logged-contexts-empty", lambda: LoggedData.from_tensors(torch.zeros(0, 2), [], [], [], []), ValueError, "contexts"),
    _c("logged-actions-length", _from_tensors(actions=torch.zeros(5)), ValueError, "actions"),
    _c("logged-rewards-length", _from_tensors(rewards=torch.zeros(5)), ValueError, "rewards"),
    _c("logged-propensity-zero", _from_tensors(propensities=torch.zeros(20)), ValueError, "propensity"),
    _c("logged-reward-nan", _from_tensors(rewards=torch.full((20,), math.nan)), ValueError, "reward"),
    _c("logged-action-negative", _from_tensors(actions=-torch.ones(20)), ValueError, "action"),
    _c("logged-domain-negative", _from_tensors(domains=-torch.ones(20)), ValueError, "domain"),
    _c("logged-n-actions-zero", _from_tensors(n_actions=0), ValueError, "n_actions"),
    _c("logged-logging-probs-shape", _from_tensors(logging_probs=torch.full((5, 3), 1 / 3)), ValueError, "logging_probs"),
    _c("logged-domain-names-duplicate", _from_tensors(domain_names=["a", "a"]), ValueError, "domain_names"),
    _c("logged-csv-missing", lambda: LoggedData.from_csv("/nonexistent/logs.csv"), FileNotFoundError, "path"),
    _c("evaluate-policy-rows-not-summing", lambda: evaluate_policy(_probs_not_summing(), _logged(), estimators=("ips",),
                                                                   n_boot=10), ValueError, "probs"),
    _c("evaluate-policy-negative", lambda: evaluate_policy(_probs_negative(), _logged(), estimators=("ips",), n_boot=10),
       ValueError, "probs"),
    _c("evaluate-policy-nan", lambda: evaluate_policy(_probs_nan(), _logged(), n_boot=10), ValueError, "probs"),
    _c("evaluate-policy-shape", lambda: evaluate_policy(_uniform_probs(40, 4), _logged(), n_boot=10), ValueError, "probs"),
    _c("evaluate-policy-estimators", lambda: evaluate_policy(_uniform_probs(), _logged(), estimators=("ipz",)),
       ValueError, "estimators"),
    _c("evaluate-policy-data", lambda: evaluate_policy(_uniform_probs(), "logs.csv"), TypeError, "data"),
    _c("evaluate-policy-constraints", lambda: evaluate_policy(_uniform_probs(), _logged(), "critical", estimators=("ips",),
                                                              n_boot=10), TypeError, "constraints"),
    _c("ips-rows-not-summing", lambda: ips(_probs_not_summing(), _logged()), ValueError, "probs"),
    _c("snips-list", lambda: snips([[1.0, 0.0, 0.0]] * 40, _logged()), ValueError, "probs"),
    _c("estimate-value-name", lambda: estimate_value(_uniform_probs(), _logged(), "ipw"), ValueError, "estimator"),
    _c("estimate-value-q-missing", lambda: estimate_value(_uniform_probs(), _logged(), "dr"), ValueError, "q"),
    _c("estimate-value-q-shape", lambda: estimate_value(_uniform_probs(), _logged(), "dm", torch.zeros(40, 2)), ValueError,
       "q"),
    _c("estimate-value-level", lambda: estimate_value(_uniform_probs(), _logged(), "ips", level=1.5), ValueError, "level"),
    _c("bootstrap-n-boot", lambda: bootstrap_ci(torch.ones(5), n_boot=1), ValueError, "n_boot"),
    _c("bootstrap-empty", lambda: bootstrap_ci(torch.ones(0)), ValueError, "num"),
]


# --- tuning (the A/B test and its search space; Ax is imported lazily)
def _tuning():
    from bayes_safe import tuning

    return tuning


def _range(*args, **kwargs):
    return lambda: _tuning().Range(*args, **kwargs)


def _parse(text):
    return lambda: _tuning().Range.parse(text)


def _abtest(**kwargs):
    return lambda: _tuning().ABTest(**kwargs)


def _evaluate(parameters, seed=0):
    return lambda: _tuning().ABTest(n_users=20, batches=2).evaluate(parameters, seed)


API_CASES += [
    _c("range-parse-no-bounds", _parse("alpha"), ValueError, "--parameter"),
    _c("range-parse-not-numbers", _parse("alpha=a:b"), ValueError, "--parameter"),
    _c("range-parse-reversed", _parse("alpha=0.1:0"), ValueError, "alpha"),
    _c("range-parse-flag", _parse("alpha=0:0.1:cubic"), ValueError, "--parameter"),
    _c("range-parse-name", _parse("1alpha=0:0.1"), ValueError, "parameter name"),
    _c("range-empty", _range("alpha", 0.1, 0.1), ValueError, "alpha"),
    _c("range-log-nonpositive", _range("alpha", 0.0, 0.1, log=True), ValueError, "alpha"),
    _c("range-nan", _range("alpha", math.nan, 0.1), ValueError, "alpha"),
    _c("abtest-n-users", _abtest(n_users=0), ValueError, "n_users"),
    _c("abtest-batches", _abtest(batches=2.5), ValueError, "batches"),
    _c("abtest-users-per-batch", _abtest(n_users=3, batches=2), ValueError, "n_users"),
    _c("abtest-policy", _abtest(policy="ucb"), ValueError, "policy"),
    _c("abtest-compare-duplicate", _abtest(compare=("ts-asc",)), ValueError, "compare"),
    _c("abtest-problem", _abtest(problem="video-upload"), TypeError, "problem"),
    _c("abtest-factory", _abtest(policy_factory=3), TypeError, "policy_factory"),
    _c("abtest-misspelled-parameter", _evaluate({"alhpa": 0.05}), ValueError, "alhpa"),
    _c("abtest-parameter-string", _evaluate({"alpha": "0.05"}), ValueError, "alpha"),
    _c("abtest-parameter-nan", _evaluate({"alpha": math.nan}), ValueError, "alpha"),
    _c("abtest-alpha-one", _evaluate({"alpha": 1.0}), ValueError, "alpha"),
    _c("abtest-omega-negative", _evaluate({"omega_1080": -0.1}), ValueError, "omega_1080"),
    _c("abtest-parameters-list", _evaluate([("alpha", 0.1)]), TypeError, "parameters"),
    _c("abtest-seed", _evaluate({"alpha": 0.05}, seed="0"), TypeError, "seed"),
    _c("problem-check-misspelled", lambda: VideoUploadProblem().check_parameters([_tuning().Range("alhpa", 0.0, 0.1)]),
       ValueError, "alhpa"),
    _c("problem-check-alpha-range", lambda: VideoUploadProblem().check_parameters([_tuning().Range("alpha", 0.0, 1.5)]),
       ValueError, "alpha"),
    _c("problem-check-omega-integer", lambda: VideoUploadProblem().check_parameters(
        [_tuning().Range("omega_720", 1, 3, integer=True)]), ValueError, "omega_720"),
]


# --- the Decider's boundary (issue 28): ids, limits, masks (the HTTP service maps these to 422 / 404)
def _decider(**kwargs):
    from bayes_safe.online import Decider

    prior = dist.Normal(torch.zeros(D, dtype=F64), 1.0).to_event(1)
    return Decider(TSASC(BayesianLinear(prior, noise_std=1.0), [BayesianLinear(prior, likelihood="probit")], alpha=0.2),
                   **{"num_draws": 8} | kwargs)


def _decided(reward=1.0, constraints=(0.0,), decision_id=None):
    def run():
        decider = _decider()
        d = decider.decide(np.eye(D), baseline=0)
        decider.feedback(d.decision_id if decision_id is None else decision_id, reward, list(constraints))
    return run


API_CASES += [
    _c("decider-num-draws-huge", lambda: _decider(num_draws=10**12), ValueError, "num_draws"),
    _c("decider-feature-limit-zero", lambda: _decider(feature_limit=0.0), ValueError, "feature_limit"),
    _c("decider-outcome-limit-nan", lambda: _decider(outcome_limit=math.nan), ValueError, "outcome_limit"),
    _c("decider-feature-over-limit", lambda: _decider().decide(np.eye(D) * 1e200, baseline=0), ValueError,
       "features: expected \\|value\\| <= 1e\\+06"),
    _c("decider-feature-huge-int", lambda: _decider().decide([[10**400] * D] * 2, baseline=0), ValueError, "features"),
    _c("decider-valid-all-false", lambda: _decider().decide(np.eye(D), baseline=0, valid=[False] * D), ValueError,
       "valid: every action is masked out"),
    _c("decider-reward-over-limit", _decided(reward=1e300), ValueError, "reward: expected \\|value\\| <= 1e\\+06"),
    _c("decider-reward-huge-int", _decided(reward=10**400), ValueError, "reward: expected a finite number"),
    _c("decider-binary-constraint", _decided(constraints=(0.5,)), ValueError, "constraints\\[0\\]: expected 0 or 1"),
    _c("decider-id-plain-number", _decided(decision_id="0"), ValueError, "decision_id: unknown decision"),
    _c("decider-id-leading-zero", _decided(decision_id="00-" + "0" * 32), ValueError, "decision_id: unknown decision"),
    _c("decider-id-forged-tag", _decided(decision_id="0-" + "a" * 32), ValueError, "decision_id: unknown decision"),
    _c("decider-id-not-a-string", _decided(decision_id=["0"]), ValueError, "decision_id: unknown decision"),
    # issue 40's audit: the last unclear answers (pandas' and torch's own errors), and the outlier guard
    _c("decider-outlier-sd-zero", lambda: _decider(outlier_sd=0), ValueError, "outlier_sd"),
    _c("decider-frame-repeated-column", lambda: _decider(feature_names=[f"x{i}" for i in range(D)]).decide(
        __import__("pandas").DataFrame(np.eye(D), columns=["x0"] * D), baseline=0), ValueError,
       r"features: .*\['x0'\] more than once"),
    _c("logged-frame-repeated-column", lambda: LoggedData.from_dataframe(
        __import__("pandas").DataFrame([[0.1, 0, 1.0, 0.5, "a", 0.2]],
                                       columns=["x", "action", "reward", "propensity", "domain", "x"]),
        context_columns=["x"]), ValueError, r"df: column\(s\) \['x'\] appear more than once"),
    _c("model-sample-generator-int", lambda: _model().sample(generator=1), TypeError, "generator: expected a torch"),
    _c("model-sample-at-generator-int", lambda: _model().sample_at(_features(), generator=1), TypeError,
       "generator: expected a torch"),
    _c("model-sample-negative-shape", lambda: _model().sample((-1,)), ValueError, "sample_shape: expected a tuple"),
    _c("ts-select-generator-int", lambda: _ts().select(_features(), generator=1), TypeError, "generator: expected"),
    _c("probabilities-seed-string", lambda: _ts().action_probabilities(_features(), seed="a"), TypeError,
       "seed: expected an int"),
]


def test_fit_before_any_observation_says_there_is_nothing_to_fit():
    """The audit's silent case: a Laplace (Gibbs) model's ``fit()`` before any ``update``."""
    model = BayesianLinear(dist.Laplace(torch.zeros(D, dtype=F64), 1.0).to_event(1), noise_std=1.0)
    with pytest.warns(UserWarning, match="no observations yet"):
        assert model.fit() is False
    model.update(torch.ones(2, D, dtype=F64), torch.ones(2, dtype=F64))
    assert model.fit() is True


@pytest.mark.parametrize("fn, exc, match", API_CASES)
def test_api_bad_input(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_simulate_trusted_loop_still_runs():
    """The checks skip value scans for the library's own data, and real runs are unaffected."""
    env = daulton2019(replications=2, seed=1)
    policy = TSASC(_model((2,)), _model((2,)), alpha=0.1)
    trace = simulate(policy, env, 5, seed=0)
    assert tuple(trace.actions.shape) == (5, 2)


def test_accepted_boundary_conversions():
    """Not errors (converted at the boundary; the next issue widens this): a Python int
    baseline, numpy features, float32 features."""
    f = _features()
    for policy in ("ts", "ts-asc", "clucb2-asc"):
        assert POLICIES[policy]().select(f, int(_baseline()[0])).shape == (R,)
        assert POLICIES[policy]().select(np.asarray(f), _baseline()).shape == (R,)
        assert POLICIES[policy]().select(f.float(), _baseline()).shape == (R,)


# ---------------------------------------------------------------------- CLI cases
SIM = ["simulate", "--problem", "daulton2019", "--policy", "ts", "--horizon", "3", "--replications", "2", "--no-progress"]
VU = ["tune", "video-upload", "--no-progress"]
LD = ["tune", "logged-data", "--no-progress"]


def _without(argv, option):
    i = argv.index(option)
    return argv[:i] + argv[i + 2:]


def _set(argv, option, value):
    argv = list(argv)
    if option in argv:
        argv[argv.index(option) + 1] = value
        return argv
    return [*argv, option, value]


CLI_CASES = [
    # simulate
    ([*SIM, "--replication", "3"], "--replication"),  # options are never abbreviated
    (_set(SIM, "--horizon", "0"), "--horizon"),
    (_set(SIM, "--horizon", "2.5"), "--horizon"),
    (_set(SIM, "--horizon", "-3"), "--horizon"),
    (_set(SIM, "--horizon", "ten"), "--horizon"),
    (_set(SIM, "--replications", "0"), "--replications"),
    (_set(SIM, "--replications", "1e3"), "--replications"),
    (_set(SIM, "--alpha", "1"), "--alpha"),
    (_set(SIM, "--alpha", "-0.1"), "--alpha"),
    (_set(SIM, "--alpha", "nan"), "--alpha"),
    (_set(SIM, "--alpha", "x"), "--alpha"),
    (_set(SIM, "--problem", "kazerouni"), "--problem"),
    (_set(SIM, "--policy", "thompson"), "--policy"),
    (_set(SIM, "--seed", "x"), "--seed"),
    (_set(SIM, "--seed", "1.5"), "--seed"),
    (_set(SIM, "--ridge", "x"), "--ridge"),
    (_without(SIM, "--problem"), "--problem"),
    (_without(SIM, "--policy"), "--policy"),
    (SIM + ["--out", "FILE"], "--out"),
    (SIM + ["--out", "FILE/run"], "--out"),
    (SIM + ["--replicas", "3"], "--replicas"),
    (["simulate", "--problem", "kazerouni2017", "--policy", "ts-asc", "--horizon", "3", "--no-progress"], "policy"),
    # diagnose
    (["diagnose", "MISSING"], "MISSING"),
    (["diagnose", "FILE"], "FILE"),
    (["diagnose", "EMPTY", "--draws", "0"], "--draws"),
    (["diagnose", "EMPTY", "--draws", "x"], "--draws"),
    (["diagnose"], "run_dir"),
    # study
    (["study", "run", "no-such-study"], "no-such-study"),
    (["study", "run", "ts-asc-synthetic", "--seed", "x"], "--seed"),
    (["study", "run", "ts-asc-synthetic", "--out", "FILE"], "--out"),
    (["study", "run"], "name"),
    (["study"], "study_command"),
    (["study", "runn"], "runn"),
    # tune video-upload
    (VU + ["--trials", "0"], "--trials"),
    (VU + ["--trials", "x"], "--trials"),
    (VU + ["--parallel", "0"], "--parallel"),
    (VU + ["--sobol", "x"], "--sobol"),
    (VU + ["--users", "0"], "--users"),
    (VU + ["--batches", "x"], "--batches"),
    (VU + ["--acquisition", "EI"], "--acquisition"),
    (VU + ["--out", "FILE"], "--out"),
    (VU + ["--parameter", "alpha"], "--parameter"),
    (VU + ["--parameter", "alpha=a:b"], "--parameter"),
    (VU + ["--parameter", "alpha=0:0.1:cubic"], "--parameter"),
    (VU + ["--parameter", "alpha=0.1:0"], "alpha"),
    (VU + ["--parameter", "alhpa=0:0.1"], "alhpa"),
    (VU + ["--parameter", "alpha=0:1.5"], "alpha"),
    (VU + ["--parameter", "omega_720=0:1"], "omega_720"),
    (VU + ["--source", "synthetic"], "--source"),
    # tune logged-data
    (LD + ["--holdout", "1"], "--holdout"),
    (LD + ["--holdout", "0"], "--holdout"),
    (LD + ["--max-violation", "2"], "--max-violation"),
    (LD + ["--method", "sgd"], "--method"),
    (LD + ["--rows", "0"], "--rows"),
    (LD + ["--epochs", "x"], "--epochs"),
    (LD + ["--trials", "-1"], "--trials"),
    (LD + ["--users", "100"], "--users"),
    # tune resume
    (["tune", "resume", "--trials", "x"], "--trials"),
    (["tune", "resume", "--parallel", "0"], "--parallel"),
    (["tune", "resume", "--out", "FILE"], "--out"),
    (["tune", "nope"], "nope"),
    (["tune"], "tune"),
    # serve and feedback (issue 28): limits, tokens, addresses; refused before a state is read
    (["serve", "EMPTY", "--max-body-bytes", "0"], "--max-body-bytes"),
    (["serve", "EMPTY", "--max-candidates", "x"], "--max-candidates"),
    (["serve", "EMPTY", "--max-feedback-items", "-1"], "--max-feedback-items"),
    (["serve", "EMPTY", "--token-file", "MISSING"], "--token-file"),
    (["serve", "EMPTY", "--token-file", "FILE"], "--token-file"),
    (["serve", "EMPTY", "--host", "0.0.0.0"], "--host"),
    (["serve", "EMPTY", "--allowed-origin", "app.example.com"], "--allowed-origin"),
    (["serve", "EMPTY", "--allowed-host", "0.0.0.0"], "--allowed-host"),
    (["feedback", "EMPTY", "--from", "FILE", "--token-file", "FILE"], "--token-file"),
    # simulate: a run that cannot fit in memory, refused before allocating
    (_set(SIM, "--replications", "1000000000"), "--replications"),
]


def _cli_argv(argv, tmp_path):
    subs = {"FILE": tmp_path / "FILE", "MISSING": tmp_path / "MISSING", "EMPTY": tmp_path / "EMPTY",
            "FILE/run": tmp_path / "FILE" / "run"}
    argv = [str(subs[a]) if a in subs else a for a in argv]
    if argv[0] in ("simulate", "tune", "study") and "--out" not in argv and len(argv) > 2:
        argv += ["--out", str(tmp_path / "run")]
    return argv


def _setup(tmp_path):
    (tmp_path / "FILE").write_text("")
    (tmp_path / "EMPTY").mkdir()
    return sorted(p.name for p in tmp_path.iterdir())


def _check_cli_error(code, err, match, tmp_path, before):
    assert code == 2, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert match.replace("MISSING", "").replace("FILE", "") in errors[0], err
    assert len(err.strip().splitlines()) == 1, err  # no usage block either: one line
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "--out holds something new"
    assert list((tmp_path / "EMPTY").iterdir()) == []


@pytest.mark.parametrize("argv, match", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_bad_input(argv, match, tmp_path, capsys):
    before = _setup(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(_cli_argv(argv, tmp_path))
    _check_cli_error(exc.value.code, capsys.readouterr().err, match, tmp_path, before)


@pytest.mark.parametrize("argv, match", [CLI_CASES[1], CLI_CASES[21], CLI_CASES[22], CLI_CASES[45]],
                         ids=["horizon", "constraint-policy", "diagnose-missing", "misspelled-parameter"])
def test_cli_bad_input_real_process(argv, match, tmp_path):
    """A few cases through a real ``bayes-safe`` process."""
    before = _setup(tmp_path)
    exe = Path(sys.executable).with_name("bayes-safe")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bayes_safe.cli"]
    proc = subprocess.run([*cmd, *_cli_argv(argv, tmp_path)], check=False, capture_output=True, text=True, timeout=300)
    _check_cli_error(proc.returncode, proc.stderr, match, tmp_path, before)


def test_case_count(capsys):
    api, cli = len(API_CASES), len(CLI_CASES)
    with capsys.disabled():
        print(f"\nbad-input suite: {api} API cases + {cli} CLI cases = {api + cli} distinct bad inputs")
    assert api + cli >= 150
    assert len({p.id for p in API_CASES}) == api
    assert len({tuple(a) for a, _ in CLI_CASES}) == cli

