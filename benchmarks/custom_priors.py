"""Decisions per second of Thompson sampling with a custom (non-Gaussian) prior: the Gibbs engine.

Problem (all rows but ``svi``): 100 fixed arms in R^d (the ``kazerouni2017-neurips`` preset, d = 4 and 16), one
decision = select (posterior draw: ``sweeps`` Gibbs sweeps from the last state; scores of all
arms; argmax) + observe + update, inside ``bayes_safe.simulate`` with one intra-op thread.
The reference is the conjugate Gaussian path (``Normal(0, 1)`` prior) on the same problem,
measured in the same run, so the ratio does not depend on the machine's speed or load.

* ``laplace``: ``Laplace(0, 1).expand([d]).to_event(1)`` prior, Gaussian likelihood (Park &
  Casella's Bayesian lasso, one sweep per decision). Targets: >= 0.35x the conjugate
  decisions/s at R = 1 and >= 0.4x at R = 1,000.
* ``logistic``: the same with ``likelihood="logistic"`` (Polya-Gamma latents, ``O(n d^2)`` per
  sweep); held to the probit target.
* ``langevin``: a callable hierarchical prior (a log-normal scale shared by the weights) that no
  closed-form engine knows, Gaussian likelihood, one MALA step per decision. Target: >= 0.1x the
  conjugate path at R = 1. At R = 1 the engine records its step once per model (``compile``, about
  0.2 s; ``prior_graph.compile_prior``), so these rows run 4,000 decisions (a start-up of 0.2 s
  would otherwise weigh as much as the decisions of a short run) and report that start-up, the
  first decision's wall time, in their own column.
* ``probit``: the same arms with 0/1 outcomes ``1(u < Phi(x^T theta))``, ``Normal(0, 1)``
  prior and ``likelihood="probit"`` (Albert & Chib latents; the cost of a sweep grows with
  the number of observations ``n``: ``O(n d)`` for the latents). Target: >= 0.2x the
  conjugate path (a Gaussian model of the same 0/1 outcomes) over the same horizon.

* ``svi``: one SVI fit (``BayesianLinear(..., inference="svi")``, default options: 8 ELBO
  particles, at most 2,000 steps, 200 guide draws) on n = 200 rows, d = 4, with the callable
  ``hierarchical_prior`` (written for one draw: ``Normal(0, scale).expand([d])`` does not
  broadcast over SVI's particles, so they are mapped by ``torch.func.vmap``) against a
  distribution prior of the same size (``Laplace(0, 1).expand([d]).to_event(1)``). Target: the
  callable's fit at most 2x the distribution's. The row also times the callable's fit with its
  particles run one after another, as before the mapping (``sequential_s``).

Every figure is the median of ``repeats`` runs (different seeds); the rows also carry the
machine's 1-minute load average at the end of the benchmark.
"""

from __future__ import annotations

import os
import statistics
import time

import pyro.distributions as dist
import torch

from bayes_safe import BayesianLinear, Problem, Units, simulate
from bayes_safe.envs import kazerouni2017_neurips
from bayes_safe.policies import ThompsonSampling
from bayes_safe.random import standard_uniform

TARGET_R1 = 0.35
TARGET_R1000 = 0.4
TARGET_PROBIT = 0.2
TARGET_LANGEVIN = 0.1
TARGET_SVI_CALLABLE = 2.0


def hierarchical_prior(d: int):
    """A callable Pyro prior no closed-form engine knows: a log-normal scale shared by the weights."""
    import pyro

    def prior():
        scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
        return pyro.sample("w", dist.Normal(0.0, scale).expand([d]).to_event(1))

    return prior


class BinaryArms(Problem):
    """The preset's arms with 0/1 rewards ``1(u < Phi(x^T theta))``, ``u`` drawn in ``draw``."""

    name = "binary-arms"
    metric_names = ("reward",)
    noise_std = (0.5,)
    replication_streams = True
    _trusted_outputs = True  # float64 tensors of the right shapes (as the library's own problems): not re-checked

    def __init__(self, replications: int, dim: int, seed: int):
        env = kazerouni2017_neurips(replications=replications, seed=seed, dim=dim)
        self.replications = replications
        self.arms = env.arm_features
        self.p = torch.special.ndtr((env.arm_features @ env.parameters[:, 0, :, None])[..., 0])  # [R, K]
        self.table = self.p[..., None]  # the same tensor every step: simulate judges it once
        self.rows = torch.arange(replications)

    def draw(self, n, generator):
        u = standard_uniform((n,), generator, key="env/u")
        return Units(self.arms, torch.zeros(n, dtype=torch.long), context=u)

    def outcomes(self, units, actions):
        return (units.context < self.p[self.rows, actions]).to(torch.float64)[:, None]

    def expected_all(self, units):
        return self.table


def _model_and_env(kind: str, R: int, d: int, seed: int):
    if kind in ("laplace", "conjugate"):
        env = kazerouni2017_neurips(replications=R, seed=seed, dim=d)
        prior = (dist.Laplace if kind == "laplace" else dist.Normal)(0.0, 1.0).expand([d]).to_event(1)
        model = BayesianLinear(prior, noise_std=1.0, batch_shape=[R])
    elif kind == "langevin":
        env = kazerouni2017_neurips(replications=R, seed=seed, dim=d)
        model = BayesianLinear(hierarchical_prior(d), dim=d, noise_std=1.0, batch_shape=[R])
        assert model.engine_name == "langevin"
    else:
        env = BinaryArms(R, d, seed)
        prior = dist.Normal(0.0, 1.0).expand([d]).to_event(1)
        if kind in ("probit", "logistic"):
            model = BayesianLinear(prior, likelihood=kind, batch_shape=[R])
        else:  # "conjugate-binary": a Gaussian model of the same 0/1 outcomes
            model = BayesianLinear(prior, noise_std=0.5, batch_shape=[R])
    return model, env


def _rate(kind: str, R: int, d: int, steps: int, seed: int) -> float:
    model, env = _model_and_env(kind, R, d, seed)
    trace = simulate(ThompsonSampling(model), env, steps, seed=seed + 1)
    return trace.attrs["decisions_per_second"]


def _startup(kind: str, R: int, d: int, seed: int) -> float:
    """Wall seconds of a model's first decision (for Langevin at R = 1: the recording of its step)."""
    model, env = _model_and_env(kind, R, d, seed)
    start = time.perf_counter()
    simulate(ThompsonSampling(model), env, 1, seed=seed + 1)
    return time.perf_counter() - start


def _pair(kind: str, ref: str, R: int, d: int, steps: int, repeats: int) -> tuple[float, float]:
    """Medians of interleaved runs (so that a load change hits both sides alike)."""
    ours, base = [], []
    for i in range(repeats):
        ours.append(_rate(kind, R, d, steps, seed=i))
        base.append(_rate(ref, R, d, steps, seed=i))
    return statistics.median(ours), statistics.median(base)


def _svi_fit_seconds(kind: str, seed: int, d: int = 4, n: int = 200) -> float:
    """Wall seconds of one SVI ``fit()`` on ``n`` rows: ``kind`` is ``"distribution"``, ``"callable"``
    (particles mapped by vmap) or ``"sequential"`` (the callable with its particles one by one)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = X @ torch.linspace(-1.0, 1.0, d, dtype=torch.float64) + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    if kind == "distribution":
        model = BayesianLinear(dist.Laplace(0.0, 1.0).expand([d]).to_event(1), noise_std=0.5, inference="svi",
                               inference_options={"seed": seed, "progress": False})
    else:
        model = BayesianLinear(hierarchical_prior(d), dim=d, noise_std=0.5, inference="svi",
                               inference_options={"seed": seed, "progress": False})
        if kind == "sequential":
            model.engine._mappable = False  # the path every such prior took before: one Pyro trace per particle
    model.update(X, y)
    start = time.perf_counter()
    model.fit()
    return time.perf_counter() - start


def svi_callable(repeats: int = 3) -> dict:
    """The ``svi`` row: medians of interleaved fits, and the callable's ratio to the distribution's."""
    times: dict[str, list[float]] = {"distribution": [], "callable": [], "sequential": []}
    for i in range(repeats):
        for kind, seconds in times.items():
            seconds.append(_svi_fit_seconds(kind, seed=i))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["callable"] / med["distribution"]
    return {"benchmark": "SVI fit, n=200 d=4: callable hierarchical prior vs Laplace distribution prior",
            "value": ratio, "unit": "x the distribution prior's seconds", "target": f"<= {TARGET_SVI_CALLABLE}",
            "ratio": TARGET_SVI_CALLABLE / ratio, "callable_s": med["callable"], "distribution_s": med["distribution"],
            "sequential_s": med["sequential"]}


def run(quick: bool = False, repeats: int = 5) -> list[dict]:
    repeats = 3 if quick else repeats
    torch.set_num_threads(1)
    cases = [  # (kind, reference, R, d, steps, target)
        ("laplace", "conjugate", 1, 4, 300 if quick else 2000, TARGET_R1),
        ("laplace", "conjugate", 1, 16, 300 if quick else 2000, TARGET_R1),
        ("laplace", "conjugate", 1000, 4, 20 if quick else 100, TARGET_R1000),
        ("laplace", "conjugate", 1000, 16, 20 if quick else 100, TARGET_R1000),
        ("probit", "conjugate-binary", 1, 4, 300 if quick else 1000, TARGET_PROBIT),
        ("probit", "conjugate-binary", 1000, 4, 20 if quick else 100, TARGET_PROBIT),
        ("logistic", "conjugate-binary", 1, 4, 300 if quick else 1000, TARGET_PROBIT),
        ("logistic", "conjugate-binary", 1000, 4, 20 if quick else 100, TARGET_PROBIT),
        ("langevin", "conjugate", 1, 4, 1000 if quick else 4000, TARGET_LANGEVIN),
        ("langevin", "conjugate", 1, 16, 1000 if quick else 4000, TARGET_LANGEVIN),
        ("langevin", "conjugate", 1000, 4, 20 if quick else 100, TARGET_LANGEVIN),
    ]
    rows = []
    for kind, ref, R, d, steps, target in cases:
        ours, base = _pair(kind, ref, R, d, steps, repeats)
        ratio = ours / base
        label = f"TS custom prior, 100 arms d={d}, R={R}, {steps} steps"
        prior = {"laplace": "Laplace prior, Gibbs", "probit": "probit likelihood, Gibbs",
                 "logistic": "logistic likelihood, Gibbs (Polya-Gamma)",
                 "langevin": "hierarchical callable prior, Langevin"}[kind]
        row = {"benchmark": f"{label}: {prior} vs conjugate", "value": ratio, "unit": "x conjugate decisions/s",
               "target": f">= {target}", "ratio": ratio / target, "gibbs": ours, "conjugate": base}
        if kind == "langevin" and R == 1:
            row["startup_s"] = statistics.median(_startup(kind, R, d, seed=i) for i in range(repeats))
        rows.append(row)
    rows.append(svi_callable(repeats=3 if quick else repeats))
    load = os.getloadavg()[0]
    for row in rows:
        row["load_average"] = load
    return rows


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["svi"]:  # the SVI row alone: both times and the ratio
        torch.set_num_threads(1)
        row = svi_callable()
        print(f"SVI fit: callable prior {row['callable_s']:.2f} s, distribution prior {row['distribution_s']:.2f} s, "
              f"ratio {row['value']:.2f}x (target <= {TARGET_SVI_CALLABLE}); callable with sequential particles "
              f"(before) {row['sequential_s']:.2f} s")
    else:
        for row in run(quick=True):
            print(row)
