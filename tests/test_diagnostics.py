import math

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, simulate
from bayes_safe.cli import main
from bayes_safe.diagnostics import (
    PosteriorRecorder, brier_score, diagnose_run, expected_calibration_error, interval_coverage,
    prior_predictive, reliability_diagram, summary, to_inference_data,
)
from bayes_safe.envs import daulton2019
from bayes_safe.factory import make_policy
from bayes_safe.models import PerArmLinear


def _data(n=40, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def test_conjugate_inference_data_matches_the_exact_posterior():
    X, y = _data()
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3)
    m.update(X, y)
    idata = to_inference_data(m, X=X, y=y, num_draws=4000, feature_names=["a", "b", "c"])
    w = idata.posterior["w"]
    assert w.dims == ("chain", "draw", "feature") and list(w.feature.values) == ["a", "b", "c"]
    torch.testing.assert_close(torch.as_tensor(w.mean(("chain", "draw")).values), m.posterior_mean, atol=0.01, rtol=0)
    sd = m.posterior_covariance.diagonal().sqrt()
    torch.testing.assert_close(torch.as_tensor(w.std(("chain", "draw")).values), sd, rtol=0.1, atol=0)
    assert idata.posterior_predictive["y"].shape == (1, 4000, 40)
    assert idata.observed_data["y"].shape == (40,)
    table = summary(idata, var_names=["w"])
    assert {"mean", "sd", "hdi_3%", "hdi_97%"} <= set(table.columns)


def test_nig_and_per_arm_converters():
    X, y = _data()
    nig = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_prior=dist.InverseGamma(2.0, 1.0))
    nig.update(X, y)
    idata = to_inference_data(nig, num_draws=2000)
    s2 = float(idata.posterior["noise_var"].mean())
    expected = float(nig.noise_variance_posterior.mean)
    assert abs(s2 - expected) < 0.1 * expected
    arms = PerArmLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), num_arms=4, noise_std=0.5)
    assert to_inference_data(arms, num_draws=10).posterior["w"].dims == ("chain", "draw", "arm", "feature")


def test_nuts_inference_data_has_chains_sample_stats_and_rhat():
    X, y = _data(n=30)
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3,
                       inference_options={"num_samples": 100, "warmup_steps": 100, "num_chains": 2, "seed": 1})
    m.update(X, y)
    m.fit()
    idata = to_inference_data(m)
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 100
    assert "diverging" in idata.sample_stats
    table = summary(idata, var_names=["w"])
    assert "r_hat" in table.columns and (table["r_hat"] < 1.1).all()
    assert "y" in idata.observed_data  # the data the model stored


def test_prior_predictive_for_a_custom_prior_and_bad_support():
    X, _ = _data(n=10)
    idata = prior_predictive(dist.StudentT(3.0, 0.0, 1.0).expand([3]).to_event(1), X, noise_std=0.5, num_draws=300)
    assert idata.prior["w"].shape == (1, 300, 3) and idata.prior_predictive["y"].shape == (1, 300, 10)
    with pytest.raises(ValueError, match="prior: its support"):
        prior_predictive(dist.Gamma(2.0, 1.0).expand([3]).to_event(1), X, noise_std=0.5)
    with pytest.raises(ValueError, match="does not match the 3 features"):
        prior_predictive(dist.Normal(0.0, 1.0).expand([4]).to_event(1), X, noise_std=0.5)


def test_calibration_metrics():
    p = torch.tensor([0.1, 0.1, 0.9, 0.9])
    y = torch.tensor([0, 0, 1, 1])
    assert brier_score(p, y) == pytest.approx(0.01)
    assert expected_calibration_error(p, y) == pytest.approx(0.1)
    g = torch.Generator().manual_seed(0)
    p = torch.rand(20000, generator=g, dtype=torch.float64)
    y = (torch.rand(20000, generator=g, dtype=torch.float64) < p).double()
    assert expected_calibration_error(p, y) < 0.02  # calibrated by construction
    assert expected_calibration_error(p, 1 - y) > 0.3
    fig = reliability_diagram(p, y)
    assert fig.axes
    with pytest.raises(ValueError, match="y: expected binary"):
        brier_score(p[:3], torch.tensor([0.0, 0.5, 1.0]))


def test_credible_intervals_cover_the_truth_at_their_level():
    """Truth drawn from the prior, data from the truth: exact posteriors are calibrated."""
    R, d, n = 2000, 3, 10
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(R, d, generator=g, dtype=torch.float64)
    X = torch.randn(R, n, d, generator=g, dtype=torch.float64)
    y = (X @ truth[..., None])[..., 0] + 0.5 * torch.randn(R, n, generator=g, dtype=torch.float64)
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([d]).to_event(1), noise_std=0.5, batch_shape=[R])
    m.update(X, y)
    draws = torch.stack([m.sample(g) for _ in range(400)])
    cov = interval_coverage(draws, truth, level=0.9)
    assert cov.shape == (d,)
    se = math.sqrt(0.9 * 0.1 / R)
    assert ((cov - 0.9).abs() < 4 * se + 0.01).all()


def test_posterior_recorder_follows_a_run():
    env = daulton2019(replications=3, seed=0)
    rec = PosteriorRecorder(every=10)
    simulate(make_policy("ts-asc", env), env, 30, seed=0, callback=rec)
    df = rec.to_dataframe()
    assert set(df["model"]) == {"reward", "constraint0"} and sorted(set(df["step"])) == [0, 10, 20]
    late = df[(df.step == 20) & (df.model == "reward")]["sd"].mean()
    early = df[(df.step == 0) & (df.model == "reward")]["sd"].mean()
    assert late < early


def test_diagnose_command_writes_report_and_netcdf(tmp_path, capsys):
    run = tmp_path / "run"
    main(["simulate", "--problem", "daulton2019", "--policy", "ts", "--replications", "2", "--horizon", "20",
          "--out", str(run), "--no-progress"])
    assert main(["diagnose", str(run), "--draws", "100"]) == 0
    out = run / "diagnostics"
    assert (out / "reward.nc").exists()
    html = (out / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "data:image/png;base64," in html


def test_diagnose_errors_name_what_is_missing(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no saved models"):
        diagnose_run(tmp_path)
    with pytest.raises(SystemExit):
        main(["diagnose", str(tmp_path)])
    assert "no saved models" in capsys.readouterr().err
    with pytest.raises(TypeError, match="model: no InferenceData converter"):
        to_inference_data(object())
