"""ArviZ as a user would drive it: numpy data in, ``to_inference_data``, then ``az.loo``,
``az.compare`` and ``az.rhat`` out, on a problem written here."""

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.diagnostics import to_inference_data

# the problem: 80 rows of 4 features, two real effects; continuous outcomes and 0/1 clicks
rng = np.random.default_rng(7)
N, D, NOISE = 80, 4, 0.5
X = rng.normal(size=(N, D))
TRUE_W = np.array([1.0, -0.5, 0.0, 0.0])
y = X @ TRUE_W + NOISE * rng.normal(size=N)
clicks = (X @ TRUE_W + rng.normal(size=N) > 0).astype(float)


def horseshoe():
    tau = pyro.sample("tau", dist.HalfCauchy(1.0))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(D)).to_event(1))
    return pyro.sample("w", dist.Normal(0.0, tau * lam).to_event(1))


def shared_scale():  # not a scale mixture the Gibbs engine knows: the Langevin engine samples it
    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(torch.zeros(D), s).to_event(1))


def _exact_loo(X, y, prior_var, noise_var):
    """The exact leave-one-out log predictive density of the conjugate Gaussian model, row by row."""
    total = 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        precision = np.eye(X.shape[1]) / prior_var + X[keep].T @ X[keep] / noise_var
        cov = np.linalg.inv(precision)
        mean = cov @ X[keep].T @ y[keep] / noise_var
        var = noise_var + X[i] @ cov @ X[i]
        total += -0.5 * (np.log(2 * np.pi * var) + (y[i] - X[i] @ mean) ** 2 / var)
    return total


def test_loo_and_compare_two_priors_fitted_by_two_engines():
    gaussian = BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_std=NOISE)  # conjugate
    laplace = BayesianLinear(dist.Laplace(0.0, 0.3).expand([D]).to_event(1), noise_std=NOISE)  # Gibbs
    assert (gaussian.engine_name, laplace.engine_name) == ("conjugate", "gibbs")
    gaussian.update(X, y)
    laplace.update(X, y)

    idata_gaussian = to_inference_data(gaussian, X=X, y=y, num_draws=500)
    idata_laplace = to_inference_data(laplace, X=X, y=y, num_draws=250)
    for idata in (idata_gaussian, idata_laplace):
        assert idata.log_likelihood["y"].dims == ("chain", "draw", "obs")
        assert idata.posterior.sizes["chain"] == 4

    loo = az.loo(idata_gaussian)
    assert loo.n_data_points == N
    # PSIS-LOO of the exact draws agrees with the exact leave-one-out computation
    assert float(loo.elpd_loo) == pytest.approx(_exact_loo(X, y, 1.0, NOISE**2), abs=0.5)
    assert np.isfinite(float(az.loo(idata_laplace).elpd_loo))

    table = az.compare({"gaussian": idata_gaussian, "laplace": idata_laplace})
    assert set(table.index) == {"gaussian", "laplace"} and sorted(table["rank"]) == [0, 1]
    assert np.isfinite(table["elpd_loo"]).all()

    for idata in (idata_gaussian, idata_laplace):
        rhat = az.rhat(idata)
        assert np.isfinite(rhat["w"].values).all() and float(rhat["w"].max()) < 1.1
    assert "prior_var" in idata_laplace.posterior  # the Laplace mixing variances are latent sites too


def test_a_logistic_model_uses_its_stored_clicks_and_its_chains_agree():
    model = BayesianLinear(dist.Laplace(0.0, 1.0).expand([D]).to_event(1), likelihood="logistic")
    model.update(X, clicks)
    before = model.sample(torch.Generator().manual_seed(0))
    idata = to_inference_data(model, num_draws=200)  # no X, y: the rows the model stored
    np.testing.assert_array_equal(idata.observed_data["y"].values, clicks)
    assert idata.log_likelihood["y"].shape == (4, 200, N)
    assert (idata.log_likelihood["y"].values <= 0).all()  # log-probabilities of 0/1 outcomes
    assert np.isfinite(float(az.loo(idata).elpd_loo))
    rhat = az.rhat(idata)
    assert all(np.isfinite(rhat[v].values).all() for v in rhat.data_vars)
    assert float(rhat["w"].max()) < 1.1
    assert before.shape == (D,)  # the model itself is untouched and still usable


def test_the_horseshoe_shows_its_scales():
    model = BayesianLinear(horseshoe, dim=D, noise_std=NOISE)
    assert model.engine_name == "gibbs"
    model.update(X, y)
    idata = to_inference_data(model, X=X, y=y, num_draws=200, feature_names=["a", "b", "c", "d"])
    post = idata.posterior
    assert post["tau"].dims == ("chain", "draw") and (post["tau"].values > 0).all()
    assert post["lam"].dims == ("chain", "draw", "feature") and (post["lam"].values > 0).all()
    # the null features are shrunk: their local scales sit well below the real effects'
    lam = post["lam"].median(("chain", "draw")).values
    assert lam[0] > lam[2] and lam[0] > lam[3]
    assert np.isfinite(az.rhat(idata)["tau"].values)
    assert np.isfinite(float(az.loo(idata).elpd_loo))


# ---------------------------------------------------------------------------- every engine
def _conjugate():
    return BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_std=NOISE), y, True


def _nig():
    return BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), noise_prior=dist.InverseGamma(3.0, 1.0)), y, True


def _gibbs_laplace():
    return BayesianLinear(dist.Laplace(0.0, 1.0).expand([D]).to_event(1), noise_std=NOISE), y, True


def _gibbs_student():
    prior = dist.StudentT(3.0, 0.0, 1.0).expand([D]).to_event(1)
    return BayesianLinear(prior, noise_prior=dist.InverseGamma(3.0, 1.0)), y, True


def _gibbs_horseshoe():
    return BayesianLinear(horseshoe, dim=D, noise_std=NOISE), y, True


def _probit():
    return BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), likelihood="probit"), clicks, False


def _logistic():
    return BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), likelihood="logistic"), clicks, False


def _langevin():
    return BayesianLinear(shared_scale, dim=D, noise_std=NOISE), y, True


def _nuts():
    options = {"num_samples": 100, "warmup_steps": 100, "num_chains": 2, "parallel_chains": False, "seed": 0}
    return BayesianLinear(dist.Laplace(0.0, 1.0).expand([D]).to_event(1), noise_std=NOISE, inference="nuts",
                          inference_options=options), y, False


def _svi():
    options = {"svi_steps": 300, "num_samples": 400, "seed": 0}
    return BayesianLinear(dist.Laplace(0.0, 1.0).expand([D]).to_event(1), noise_std=NOISE, inference="svi",
                          inference_options=options), y, False


ENGINES = {
    "conjugate": _conjugate, "nig": _nig, "gibbs-laplace": _gibbs_laplace, "gibbs-student": _gibbs_student,
    "gibbs-horseshoe": _gibbs_horseshoe, "probit": _probit, "logistic": _logistic, "langevin": _langevin,
    "nuts": _nuts, "svi": _svi,
}
SLOW = {"langevin", "nuts"}  # more than ~3 s each on a loaded 2-core machine


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ENGINES])
def test_every_linear_engine_gives_a_log_likelihood_and_finite_rhat(name):
    model, outcomes, needs_data = ENGINES[name]()
    model.update(X, outcomes)
    if model.engine_name in ("nuts", "svi"):
        model.fit()
    data = {"X": X, "y": outcomes} if needs_data else {}  # conjugate / Gaussian chains keep no rows
    idata = to_inference_data(model, num_draws=100, **data)
    assert "log_likelihood" in idata.groups() and idata.log_likelihood["y"].shape[-1] == N
    assert idata.posterior.sizes["chain"] >= 2
    rhat = az.rhat(idata)
    for var in rhat.data_vars:
        assert np.isfinite(rhat[var].values).all(), var
    assert np.isfinite(float(az.loo(idata).elpd_loo))
    if needs_data:  # without the data: no log_likelihood, and the InferenceData says why
        bare = to_inference_data(model, num_draws=5)
        assert "log_likelihood" not in bare.groups() and "sufficient statistics" in bare.attrs["log_likelihood"]


def test_per_arm_models_score_each_arm_on_its_own_rows():
    from bayes_safe.models import PerArmLinear

    arms = PerArmLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), num_arms=2, noise_std=NOISE)
    played = np.arange(N) % 2
    for row, outcome, arm in zip(X, y, played):
        arms.update(row, outcome, arm)
    X_arms = np.stack([X[played == k] for k in range(2)])  # [arm, n, d]: each arm's own rows
    y_arms = np.stack([y[played == k] for k in range(2)])
    idata = to_inference_data(arms, X=X_arms, y=y_arms, num_draws=200)
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "arm", "obs")
    assert az.loo(idata).n_data_points == N
    assert np.isfinite(az.rhat(idata)["w"].values).all()


def test_the_probit_gp_view_scores_its_stored_outcomes():
    from bayes_safe.models import ProbitGP, SuccessProbability

    X_gp = rng.normal(size=(400, 3))
    y_gp = (X_gp[:, 0] - X_gp[:, 1] + 0.5 * rng.normal(size=400) > 0).astype(float)
    gp = ProbitGP(3, hidden=(8, 3), refit_every=None, nn_epochs=2, nn_min_steps=40, gp_epochs=1, seed=0)
    gp.update(torch.as_tensor(X_gp), torch.as_tensor(y_gp))
    gp.fit()
    idata = to_inference_data(SuccessProbability(gp), num_draws=200, max_points=200)
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "point")
    assert np.isfinite(az.rhat(idata)["w"].values).all()
    assert np.isfinite(float(az.loo(idata).elpd_loo))


def test_diagnose_shows_the_calibration_of_a_saved_0_1_model(tmp_path):
    import html as html_lib

    from bayes_safe.cli import main
    from bayes_safe.diagnostics import save_models

    model = BayesianLinear(dist.Normal(0.0, 1.0).expand([D]).to_event(1), likelihood="probit")
    model.update(X, clicks)
    save_models({"reward": model}, tmp_path / "run" / "models")
    assert main(["diagnose", str(tmp_path / "run"), "--draws", "50"]) == 0
    report = html_lib.unescape((tmp_path / "run" / "diagnostics" / "report.html").read_text())
    assert "reliability diagram of reward" in report and "Brier score" in report
    assert f"the {N} stored 0/1 outcomes" in report and "PSIS-LOO elpd" in report
    idata = az.from_netcdf(tmp_path / "run" / "diagnostics" / "reward.nc")
    assert idata.log_likelihood["y"].shape == (4, 50, N)
