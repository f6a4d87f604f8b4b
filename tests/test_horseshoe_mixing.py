"""The horseshoe's global scale on the Gibbs engine mixes (issue 39, item 4), and the checks that say when it does not.

* The blocked update of ``(tau, w)`` (``tau`` with ``w`` integrated out, Johndrow, Orenstein &
  Bhattacharya 2020, Sec. 2.1) passes an r-hat / ESS check on small seeded sparse problems where
  the older per-coordinate step ``tau^2 | w ~ IG`` (``tau_scheme="conditional"``) fails it.
* Its posterior is right: posterior means of ``w`` and ``log tau`` against an independent
  importance-sampling reference (prior draws of ``(tau, lam)`` weighted by the Gaussian marginal
  likelihood, ``w`` integrated out in closed form), within a Monte Carlo tolerance.
* With an unknown noise variance the two schemes agree; batched chains equal one-replication runs
  bit for bit (Gaussian, Gaussian with a noise prior, probit, logistic).
* ``bayes-safe diagnose`` and ``summary`` print a warning line for chains that have not mixed and
  none for chains that have.
* Slow: the benchmark's target, ``tau`` r-hat <= 1.01 and bulk ESS >= 400 from 4 chains x 1,000
  draws on the d = 90, 3,000-row logistic problem of ``benchmarks/horseshoe_mixing.py``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.cli import main
from bayes_safe.diagnostics import ConvergenceWarning, save_models, summary, to_inference_data
from bayes_safe.random import ReplicationRNG, replication_seeds

F64 = torch.float64


def horseshoe(d: int):
    def prior():
        tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=F64)))
        lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d, dtype=F64)).to_event(1))
        return pyro.sample("w", dist.Normal(torch.zeros(d, dtype=F64), tau * lam).to_event(1))

    return prior


def horseshoe12():  # top level of an importable module: saved as its import path (diagnose --allow-imports)
    return horseshoe(12)()


def horseshoe3():
    return horseshoe(3)()


def _sparse(d: int, n: int, true, likelihood: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(d, dtype=F64)
    w[: len(true)] = torch.tensor(true, dtype=F64)
    X = torch.randn(n, d, generator=g, dtype=F64)
    if likelihood == "gaussian":
        y = X @ w + torch.randn(n, generator=g, dtype=F64)
    else:
        y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(X @ w)).double()
    return X, y


def _chains(X, y, d, likelihood, scheme, chains, draws, warm_up, seed=1):
    """``(tau [C, S], w [C, S, d])``: ``chains`` chains of the engine's horseshoe (one batch)."""
    kwargs = {"noise_std": 1.0} if likelihood == "gaussian" else {"likelihood": likelihood}
    m = BayesianLinear(horseshoe(d), dim=d, batch_shape=[chains], **kwargs)
    assert m.engine_name == "gibbs" and m.engine.prior.kind == "horseshoe"
    engine = m.engine
    engine.tau_scheme = scheme
    m.update(X.expand(chains, *X.shape), y.expand(chains, *y.shape))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(warm_up):
        engine.sweep(engine.state, gen)
    taus, ws = [], []
    for _ in range(draws):
        engine.sweep(engine.state, gen)
        taus.append(engine.state.aux["tau2"].sqrt())
        ws.append(engine.state.w.clone())
    return torch.stack(taus, 1).numpy(), torch.stack(ws, 1).numpy()


def _rhat_ess(x: np.ndarray) -> tuple[float, float]:
    import arviz as az

    return float(az.rhat(x)), float(az.ess(x, method="bulk"))


@pytest.mark.parametrize("likelihood, d, n, draws, ess_min", [("gaussian", 40, 200, 1500, 300),
                                                               ("logistic", 30, 800, 500, 200)])
def test_the_blocked_tau_update_mixes_where_the_per_coordinate_step_does_not(likelihood, d, n, draws, ess_min):
    """4 chains from the same start: the marginal scheme's tau passes r-hat <= 1.02 and bulk ESS >= ess_min;
    the conditional IG step, same data and seed, fails the same check (its tau and w are coupled).
    Measured: Gaussian (1.012, 517) against (1.016, 159); logistic (1.005, 550) against (1.071, 47)."""
    X, y = _sparse(d, n, (1.5, -1.0, 0.8), likelihood, seed=3 if likelihood == "logistic" else 5)
    results = {}
    for scheme in ("marginal", "conditional"):
        tau, _ = _chains(X, y, d, likelihood, scheme, chains=4, draws=draws, warm_up=100)
        results[scheme] = _rhat_ess(tau)
    rhat, ess = results["marginal"]
    assert rhat <= 1.02 and ess >= ess_min, results
    old_rhat, old_ess = results["conditional"]
    assert old_rhat > 1.02 or old_ess < ess_min, results
    assert ess > 2.5 * old_ess, results


@pytest.mark.parametrize("likelihood", ["gaussian", "gaussian-noise-prior", "probit", "logistic"])
def test_batched_horseshoe_chains_equal_single_runs_with_a_replication_rng(likelihood):
    """The MH steps on tau and the inner rounds keep replication r of a batch bit for bit equal to a
    one-replication run with the same per-replication seed (accept/reject per replication)."""
    R, d, T = 3, 4, 8
    seeds = replication_seeds(7, R)
    g = torch.Generator().manual_seed(2)
    X = torch.randn(R, T, d, generator=g, dtype=F64)
    y = X @ torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=F64) + 0.5 * torch.randn(R, T, generator=g, dtype=F64)
    if not likelihood.startswith("gaussian"):
        y = (y > 0).to(F64)

    def build(batch):
        kwargs = ({"noise_std": 0.5} if likelihood == "gaussian"
                  else {"noise_prior": dist.InverseGamma(2.0, 1.0)} if likelihood == "gaussian-noise-prior"
                  else {"likelihood": likelihood})
        return BayesianLinear(horseshoe(d), dim=d, batch_shape=batch, **kwargs)

    batched, rng = build([R]), ReplicationRNG(seeds)
    out = []
    for t in range(T):
        batched.update(X[:, t], y[:, t])
        out.append(batched.sample(rng, key="reward"))
    assert batched.engine.tau_scheme == "marginal" and batched.engine.last_tau_accept is not None
    for r in range(R):
        single, rng1 = build([1]), ReplicationRNG(seeds[r: r + 1])
        for t in range(T):
            single.update(X[r: r + 1, t], y[r: r + 1, t])
            assert torch.equal(single.sample(rng1, key="reward")[0], out[t][r]), (likelihood, r, t)


def _importance_reference(X, y, d, draws: int = 400_000, seed: int = 0):
    """Posterior means of ``w [d]`` and ``log tau`` and their Monte Carlo standard errors, for the
    Gaussian likelihood (noise sd 1) under the horseshoe: ``(tau, lam)`` drawn from the prior,
    weighted by ``p(y | tau, lam)`` with ``w`` integrated out; ``E[w | tau, lam, y]`` in closed form."""
    g = torch.Generator().manual_seed(seed)
    tau = torch.tan(0.5 * math.pi * torch.rand(draws, generator=g, dtype=F64))  # C+(0, 1)
    lam = torch.tan(0.5 * math.pi * torch.rand(draws, d, generator=g, dtype=F64))
    v = (tau[:, None] * lam) ** 2
    P, b = X.T @ X, X.T @ y
    Q = P + torch.diag_embed(1.0 / v)
    L = torch.linalg.cholesky(Q)
    u = torch.linalg.solve_triangular(L, b.expand(draws, d)[..., None], upper=False)
    logw = (-0.5 * torch.log(v).sum(-1) - torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
            + 0.5 * (u * u).sum((-2, -1)))
    wt = torch.exp(logw - logw.max())
    wt = wt / wt.sum()
    mean_w = torch.linalg.solve_triangular(L.mT, u, upper=True)[..., 0]  # E[w | tau, lam, y]
    f = torch.cat([mean_w, torch.log(tau)[:, None]], 1)  # [draws, d + 1]
    mu = (wt[:, None] * f).sum(0)
    se = ((wt[:, None] ** 2 * (f - mu) ** 2).sum(0)).sqrt()  # delta-method se of the ratio estimate
    ess = float(1.0 / (wt * wt).sum())
    return mu, se, ess


def test_the_marginal_scheme_samples_the_right_posterior():
    """Gaussian likelihood, weak data (d = 5, n = 25): posterior means of w and log tau from 64 chains
    of the new scheme against an importance-sampling reference, within 4 combined standard errors
    (the chains' from the spread of their 64 independent chain means)."""
    d, n = 5, 25
    X, y = _sparse(d, n, (1.2, -0.7), "gaussian", seed=11)
    ref, ref_se, ref_ess = _importance_reference(X, y, d)
    assert ref_ess > 5000, ref_ess
    tau, w = _chains(X, y, d, "gaussian", "marginal", chains=64, draws=1500, warm_up=200, seed=4)
    f = np.concatenate([w, np.log(tau)[..., None]], -1)  # [C, S, d + 1]
    chain_means = f.mean(1)
    est = chain_means.mean(0)
    se = chain_means.std(0, ddof=1) / math.sqrt(chain_means.shape[0])
    tol = 4.0 * np.sqrt(se**2 + ref_se.numpy() ** 2) + 1e-3
    assert (np.abs(est - ref.numpy()) < tol).all(), (est, ref.numpy(), tol)


def test_with_an_unknown_noise_the_two_schemes_agree():
    """Gaussian likelihood with an InverseGamma(2, 1) noise prior (the blocked tau step runs given the
    drawn noise variance): posterior means of w, log tau and the noise variance from 64 chains of the
    marginal scheme against 64 longer chains of the per-coordinate scheme (Makalic & Schmidt 2016,
    checked against NUTS in test_gibbs.py), within 4 combined standard errors of the chain means."""
    d, n, C = 5, 25, 64
    X, y = _sparse(d, n, (1.2, -0.7), "gaussian", seed=11)
    est = {}
    for scheme, draws in (("marginal", 800), ("conditional", 2000)):
        m = BayesianLinear(horseshoe(d), dim=d, noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=[C])
        engine = m.engine
        engine.tau_scheme = scheme
        m.update(X.expand(C, n, d), y.expand(C, n))
        gen = torch.Generator().manual_seed(8)
        for _ in range(200):
            engine.sweep(engine.state, gen)
        rows = []
        for _ in range(draws):
            engine.sweep(engine.state, gen)
            st = engine.state
            rows.append(torch.cat([st.w, 0.5 * st.aux["tau2"].log()[:, None], st.s2[:, None]], 1))
        chain_means = torch.stack(rows, 1).mean(1).numpy()  # [C, d + 2]
        est[scheme] = (chain_means.mean(0), chain_means.std(0, ddof=1) / math.sqrt(C))
    (a, sa), (b, sb) = est["marginal"], est["conditional"]
    tol = 4.0 * np.sqrt(sa**2 + sb**2) + 1e-3
    assert (np.abs(a - b) < tol).all(), (a, b, tol)


def _run_dir(tmp_path, name, model):
    run = tmp_path / name
    save_models({"reward": model}, run / "models")
    return run


def _unmixed_and_mixed(tmp_path):
    d, n = 12, 150
    X, y = _sparse(d, n, (1.5, -1.0), "logistic", seed=3)
    unmixed = BayesianLinear(horseshoe12, dim=d, likelihood="logistic")
    unmixed.update(X, y)
    X2, y2 = _sparse(3, 200, (1.0, -1.0, 0.5), "gaussian", seed=2)
    mixed = BayesianLinear(horseshoe3, dim=3, noise_std=1.0)
    mixed.update(X2, y2)
    return unmixed, mixed


def test_diagnose_prints_a_warning_line_for_chains_that_have_not_mixed(tmp_path, capsys):
    """As a user runs it: `bayes-safe diagnose RUN --draws 25 --allow-imports` (the prior is a function) on a saved horseshoe logistic model (4
    chains x 25 draws cannot reach an ESS of 100) prints one warning line per failing variable, tau
    named with its r-hat and ESS; 4 x 800 draws of a well-identified horseshoe model (d = 3, 200 rows) print none."""
    unmixed, mixed = _unmixed_and_mixed(tmp_path)
    assert main(["diagnose", str(_run_dir(tmp_path, "unmixed", unmixed)), "--draws", "25", "--allow-imports"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("warning: ")]
    tau = [line for line in lines if line.startswith("warning: reward: tau ")]
    assert len(tau) == 1 and "ESS" in tau[0] and "< 100" in tau[0] and "have not mixed" in tau[0], out
    weights = [line for line in lines if line.startswith("warning: reward: w: ")]
    assert len(weights) == 1 and " of 12 values " in weights[0] and "worst: w[" in weights[0], out
    html = (tmp_path / "unmixed" / "diagnostics" / "report.html").read_text()
    assert "The chains have not mixed" in html and "reward: tau" in html

    assert main(["diagnose", str(_run_dir(tmp_path, "mixed", mixed)), "--draws", "800", "--allow-imports"]) == 0
    out = capsys.readouterr().out
    assert not any(line.startswith("warning") for line in out.splitlines()), out
    assert "no chain's variable has r-hat > 1.01" in out, out


def test_summary_warns_for_an_unmixed_chain_and_not_for_a_mixed_one(tmp_path):
    unmixed, mixed = _unmixed_and_mixed(tmp_path)
    idata = to_inference_data(unmixed, num_draws=25, seed=0)
    with pytest.warns(ConvergenceWarning) as record:
        table = summary(idata)
    messages = [str(r.message) for r in record]
    assert messages == table.attrs["convergence_warnings"]
    tau = [m for m in messages if m.startswith("warning: tau ")]
    assert len(tau) == 1 and "ESS" in tau[0] and "< 100" in tau[0], messages
    idata = to_inference_data(mixed, num_draws=800, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        table = summary(idata)
    assert table.attrs["convergence_warnings"] == []


@pytest.mark.long
def test_the_benchmark_problem_meets_the_mixing_target():
    """benchmarks/horseshoe_mixing.py's problem: d = 90, 3,000 rows, 5 nonzero weights, logistic;
    4 chains x 1,000 draws after 200 warm-up sweeps: tau r-hat <= 1.01 and bulk ESS >= 400."""
    d, n = 90, 3000
    g = torch.Generator().manual_seed(0)
    w = torch.zeros(d, dtype=F64)
    w[:5] = torch.tensor((1.5, -1.2, 1.0, -0.8, 0.6), dtype=F64)
    X = torch.randn(n, d, generator=g, dtype=F64)
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(X @ w)).double()
    tau, weights = _chains(X, y, d, "logistic", "marginal", chains=4, draws=1000, warm_up=200)
    rhat, ess = _rhat_ess(tau)
    assert rhat <= 1.01 and ess >= 400, (rhat, ess)
    import arviz as az

    w_rhat = np.array([float(az.rhat(weights[..., j])) for j in range(d)])
    assert (w_rhat > 1.01).mean() < 0.05, np.sort(w_rhat)[-5:]


def test_independent_draws_are_not_flagged_as_unmixed():
    """Exact conjugate draws have no chain: with many values, a few r-hats above 1.01 are noise, not a
    chain that has not mixed (the check is for Gibbs, Langevin and NUTS)."""
    import pyro.distributions as dist

    from bayes_safe import BayesianLinear
    from bayes_safe.diagnostics import to_inference_data
    from bayes_safe.diagnostics.convergence import convergence_warnings, independent_draws

    model = BayesianLinear(dist.Normal(0.0, 1.0).expand([200]).to_event(1), noise_std=1.0)
    idata = to_inference_data(model, num_draws=30, seed=0)
    assert independent_draws(idata)
    assert convergence_warnings(idata) == []
