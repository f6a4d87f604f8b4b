import math

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, simulate
from bayes_safe.cli import main
from bayes_safe.diagnostics import (
    PosteriorRecorder,
    brier_score,
    diagnose_run,
    expected_calibration_error,
    interval_coverage,
    prior_predictive,
    reliability_diagram,
    summary,
    to_inference_data,
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
    assert idata.posterior_predictive["y"].shape == (4, 4000, 40)  # 4 chains by default
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


# ------------------------------------------------------------------------------- probit GP, CTS, saving
@pytest.fixture(scope="module")
def probit():
    """A small fitted ProbitGP on a 1-d probit problem: (model, X, y)."""
    from bayes_safe.models import ProbitGP

    g = torch.Generator().manual_seed(5)
    X = torch.randn(800, 4, generator=g, dtype=torch.float64)
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.5 * torch.randn(800, generator=g, dtype=torch.float64) > 0).double()
    gp = ProbitGP(4, hidden=(8, 3), refit_every=None, nn_epochs=2, nn_min_steps=40, gp_epochs=1, seed=0)
    gp.update(X, y)
    gp.fit()
    return gp, X, y


def test_probit_gp_inference_data_draws_the_latent_function(probit):
    from bayes_safe.models import ScaledOutcome, SuccessProbability

    gp, X, y = probit
    idata = to_inference_data(gp, num_draws=3000, max_points=200, seed=1)
    post = idata.posterior
    assert post["f"].dims == ("chain", "draw", "point") and post["f"].shape == (4, 3000, 200)
    assert post["w"].dims == ("chain", "draw", "feature")
    assert list(post.feature.values) == ["phi0", "phi1", "phi2", "intercept"]
    points = torch.tensor(post.point.values)
    assert points[0] == 0 and points[-1] == 799 and bool((points.diff() > 0).all())  # evenly spaced, in order
    # the draws are those of q(w): mean and variance of f match the model's predictive
    mean, var = gp.predict(X[points])
    f = torch.as_tensor(post["f"].values[0])
    torch.testing.assert_close(f.mean(0), mean, atol=4 * float(var.sqrt().max()) / 3000**0.5, rtol=0)
    torch.testing.assert_close(f.var(0), var, rtol=0.15, atol=1e-12)
    torch.testing.assert_close(torch.as_tensor(post["p"].values[0]), torch.special.ndtr(f))
    assert torch.equal(torch.as_tensor(idata.observed_data["y"].values), y[points])
    y_rep = idata.posterior_predictive["y"].values
    assert y_rep.shape == (4, 3000, 200) and set(np.unique(y_rep)) <= {0.0, 1.0}
    # the views convert to the same posterior; the scaled view records its scale
    view = to_inference_data(ScaledOutcome(gp, [1.0, 2.0]), num_draws=3000, max_points=200, seed=1)
    assert np.array_equal(view.posterior["f"].values, post["f"].values) and view.attrs["scale"] == [1.0, 2.0]
    assert to_inference_data(SuccessProbability(gp), num_draws=5).posterior.sizes["point"] == 500
    # explicit points and outcomes; bad ones name the argument
    given = to_inference_data(gp, X=X[:7], y=y[:7], num_draws=10, feature_names=["a", "b", "c", "one"])
    assert given.posterior["f"].shape == (4, 10, 7) and list(given.posterior.feature.values)[-1] == "one"
    with pytest.raises(ValueError, match=r"X: expected points of shape \[n, 4\]"):
        to_inference_data(gp, X=X[:7, :3])
    with pytest.raises(ValueError, match="y: expected binary outcomes"):
        to_inference_data(gp, X=X[:3], y=torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="feature_names: expected 4 names"):
        to_inference_data(gp, num_draws=5, feature_names=["a"])
    with pytest.raises(ValueError, match="max_points: expected a positive int"):
        to_inference_data(gp, max_points=0)


def test_probit_gp_without_data_gives_its_weights_only():
    from bayes_safe.models import ProbitGP

    idata = to_inference_data(ProbitGP(3, hidden=(4, 2), seed=0), num_draws=50)
    assert set(idata.posterior.data_vars) == {"w"} and "observed_data" not in idata.groups()


def test_cts_posterior_exact_draws_and_arm_dimension():
    from bayes_safe.policies.bcts import CTSPosterior

    g = torch.Generator().manual_seed(2)
    cts = CTSPosterior(num_arms=3, dim=2, v=0.5, batch_shape=[4])
    for _ in range(60):
        c = torch.randn(4, 2, generator=g, dtype=torch.float64)
        a = torch.randint(0, 3, (4,), generator=g)
        cts.update(c, c[:, 0] - c[:, 1] + 0.2 * torch.randn(4, generator=g, dtype=torch.float64), a)
    idata = to_inference_data(cts, num_draws=20000, max_batch=3, feature_names=["c0", "c1"], seed=3)
    w = idata.posterior["w"]
    assert w.dims == ("chain", "draw", "batch0", "arm", "feature") and w.shape == (4, 20000, 3, 3, 2)
    draws = torch.as_tensor(w.values[0])
    torch.testing.assert_close(draws.mean(0), cts.posterior_mean[:3], atol=0.01, rtol=0)
    centred = draws - draws.mean(0)
    cov = torch.einsum("sbki,sbkj->bkij", centred, centred) / (draws.shape[0] - 1)
    torch.testing.assert_close(cov, cts.posterior_covariance[:3], atol=2e-3, rtol=0.05)
    counts = idata.constant_data["num_observations"]
    assert counts.dims == ("batch0", "arm") and np.array_equal(counts.values, cts.num_observations[:3].numpy())
    with pytest.raises(ValueError, match="X, y: not accepted for a CTSPosterior"):
        to_inference_data(cts, X=torch.zeros(2, 2), y=torch.zeros(2))


def test_batched_linear_models_keep_max_batch():
    X, y = _data()
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3, batch_shape=[6])
    m.update(X.expand(6, 40, 3), y.expand(6, 40))
    idata = to_inference_data(m, num_draws=30, max_batch=2)
    assert idata.posterior["w"].shape == (4, 30, 2, 3)
    with pytest.raises(ValueError, match="max_batch: expected a positive int or None"):
        to_inference_data(m, max_batch=0)
    with pytest.raises(ValueError, match="X, y: give both"):
        to_inference_data(m, X=X)


def test_probit_gp_saves_portably_and_compacts(probit, tmp_path):
    from bayes_safe.state import load_state, save_state

    gp, X, _y = probit
    back = load_state(save_state(gp, tmp_path / "gp"))  # JSON + safetensors: GPyTorch state_dicts, no pickle
    for a, b in zip(gp.predict(X[:20]), back.predict(X[:20])):
        assert torch.equal(a, b)
    assert torch.equal(back.gp_predictive(X[:5])[1], gp.gp_predictive(X[:5])[1])
    small = gp.compact(100)
    Xs, _ys = small.observations()
    assert Xs.shape == (100, 4) and torch.equal(Xs[0], X[0]) and torch.equal(Xs[-1], X[-1])
    assert small.num_observations == 800 and gp.observations()[0].shape == (800, 4)  # the original keeps its data
    assert torch.equal(small.predict(X[:5])[0], gp.predict(X[:5])[0]) and small.network is not gp.network
    with pytest.raises(ValueError, match="max_observations: expected a positive int or None"):
        gp.compact(0)


def test_views_of_one_posterior_are_saved_once_and_load_shared(probit, tmp_path):
    from bayes_safe.diagnostics import load_models, save_models
    from bayes_safe.models import ScaledOutcome, SuccessProbability
    from bayes_safe.policies import TSASC

    gp, _X, _y = probit
    policy = TSASC(ScaledOutcome(gp, [1.0, 1.5]), SuccessProbability(gp), alpha=0.05)
    paths = save_models(policy, tmp_path / "models", prefix=("rep0", "ts-asc(alpha=0.05)"), max_observations=300)
    assert [p.name for p in paths] == ["rep0__ts-asc_alpha=0.05__reward+constraint0.json",
                                       "rep0__ts-asc_alpha=0.05__policy.json"]
    assert all(p.with_suffix(".safetensors").is_file() for p in paths)
    models = load_models(tmp_path / "models")
    assert set(models) == {"rep0__ts-asc_alpha=0.05__reward", "rep0__ts-asc_alpha=0.05__constraint0"}
    reward, constraint = models["rep0__ts-asc_alpha=0.05__reward"], models["rep0__ts-asc_alpha=0.05__constraint0"]
    assert reward.model is constraint.model and reward.model.observations()[0].shape == (300, 4)
    assert torch.equal(reward.scale, torch.tensor([1.0, 1.5], dtype=torch.float64))
    assert gp.observations()[0].shape == (800, 4) and policy.reward_model.model is gp  # the policy is untouched
    with pytest.raises(TypeError, match="source: expected a policy"):
        save_models([gp], tmp_path / "x")
    with pytest.raises(ValueError, match="prefix: expected a name"):
        save_models(policy, tmp_path / "x", prefix="()")


def test_diagnose_run_covers_every_model_type(probit, tmp_path):
    from bayes_safe.diagnostics import save_models
    from bayes_safe.models import ScaledOutcome, SuccessProbability
    from bayes_safe.policies import TSASC
    from bayes_safe.policies.bcts import CTSPosterior

    gp, _X, _y = probit
    run = tmp_path / "run"
    save_models(TSASC(ScaledOutcome(gp, [1.0, 1.5]), SuccessProbability(gp), alpha=0.05), run / "models", prefix="gp")
    save_models({"reward": CTSPosterior(3, 2, batch_shape=[2])}, run / "models", prefix="bcts")
    Xl, yl = _data(n=30)
    svi = BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3, inference="svi",
                         inference_options={"svi_steps": 200, "num_samples": 100, "seed": 0})
    svi.update(Xl, yl)
    svi.fit()
    save_models({"reward": svi}, run / "models", prefix="svi")
    save_models({"policy": torch.nn.Linear(2, 2)}, run / "models", prefix="net")
    report = diagnose_run(run, num_draws=100)
    names = sorted(p.name for p in report.parent.iterdir())
    assert names == ["bcts__reward.nc", "gp__reward+constraint0.nc", "report.html", "svi__reward.nc"]
    html = report.read_text()
    assert "reliability diagram of gp__reward+constraint0" in html and "Brier score" in html
    assert "expected calibration error" in html and "success probability of gp__reward+constraint0" in html
    assert "posterior predictive check of svi__reward" in html
    assert "net__policy: Linear" in html  # a saved model that is not a posterior is listed as skipped
    assert html.count("data:image/png;base64,") >= 6
    import arviz as az

    idata = az.from_netcdf(report.parent / "gp__reward+constraint0.nc")
    assert {"f", "p", "w"} <= set(idata.posterior.data_vars) and "observed_data" in idata.groups()


def test_diagnose_errors_name_the_missing_posterior(tmp_path, capsys):
    from bayes_safe.diagnostics import save_models, save_no_models

    save_models({"policy": torch.nn.Linear(2, 2), "reward_model": torch.nn.Linear(2, 1)}, tmp_path / "a" / "models")
    with pytest.raises(TypeError, match=r"none of the 2 saved models is a posterior .*found Linear x 2"):
        diagnose_run(tmp_path / "a")
    save_no_models(tmp_path / "b" / "models", "this study fits no posterior: it counts queries")
    with pytest.raises(FileNotFoundError, match="no saved models: this study fits no posterior"):
        diagnose_run(tmp_path / "b")
    with pytest.raises(SystemExit):
        main(["diagnose", str(tmp_path / "b")])
    assert "this study fits no posterior" in capsys.readouterr().err
    assert not (tmp_path / "a" / "diagnostics").exists()  # nothing half-written


def test_posterior_recorder_reads_probit_and_per_arm_models(probit):
    from bayes_safe.models import ScaledOutcome, SuccessProbability
    from bayes_safe.policies import BCTS, TSASC

    gp = probit[0]
    rec = PosteriorRecorder(every=1)
    rec(0, {"policy": TSASC(ScaledOutcome(gp, [1.0, 1.5]), SuccessProbability(gp), alpha=0.05)})
    torch.testing.assert_close(rec.sds["reward"][0], gp.weight_covariance.diagonal().sqrt())
    rec = PosteriorRecorder(every=1)
    rec(0, {"policy": BCTS(0.5, num_arms=3, dim=2, batch_shape=[2])})
    df = rec.to_dataframe()
    assert len(df) == 2 * 2 * 3 * 2 and set(df["arm"]) == {0, 1, 2} and set(df["replication"]) == {0, 1}
    assert np.allclose(df["sd"], 0.5)  # the CTS prior N(0, v^2 I)
