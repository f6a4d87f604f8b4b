"""Every study saves its fitted models, and ``bayes-safe diagnose OUT`` turns them into a report.

Each study runs in its quick mode (made smaller here where the quick mode itself takes long),
then ``diagnose`` must write ``OUT/diagnostics/report.html`` (figures embedded) and one NetCDF
InferenceData per saved posterior. Studies without posteriors must say so: ACOL's learners
keep frequentist confidence intervals (``models/NO_MODELS.txt`` gives the reason), and the
off-policy study saves policy networks and ridge reward models, which ``diagnose`` names in
its error.
"""

import json

import arviz as az
import pytest
import torch

from bayes_safe.cli import main
from bayes_safe.diagnostics import NO_MODELS_FILE, diagnose_run, load_models, load_policy
from bayes_safe.studies import get_study


def _diagnosed(out) -> tuple[str, dict]:
    """Run ``bayes-safe diagnose OUT``; return the report's HTML and the NetCDF files by name."""
    assert main(["diagnose", str(out), "--draws", "60"]) == 0
    diag = out / "diagnostics"
    html = (diag / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "data:image/png;base64," in html
    ncs = {p.stem: p for p in diag.glob("*.nc")}
    return html, ncs


@pytest.mark.long
def test_ts_asc_synthetic_saves_every_main_run(tmp_path, monkeypatch):
    study = get_study("ts-asc-synthetic")
    monkeypatch.setattr(study, "QUICK", {
        **study.QUICK, "alphas": [0.1, 0.01], "replications": 3, "horizon": 60, "window": 20,
        "sensitivity": {"alpha": 0.01, "replications": 2, "horizon": 30},
        "variant": {"baseline_rank": 6, "replications": 2, "horizon": 30}})
    out = tmp_path / "out"
    study.run(out, quick=True, seed=0)
    models = load_models(out / "models")
    expected = {f"alpha={a}__{p}__{r}" for a in ("0.1", "0.01") for p in study.POLICIES for r in ("reward", "constraint0")}
    assert set(models) == expected
    assert models["alpha=0.01__TS-ASC__reward"].batch_shape == (3,)
    _html, ncs = _diagnosed(out)
    assert set(ncs) == expected
    idata = az.from_netcdf(ncs["alpha=0.01__TS-ASC__constraint0"])
    assert idata.posterior["w"].dims == ("chain", "draw", "batch0", "feature") and idata.posterior.sizes["batch0"] == 3


def test_clucb_synthetic_saves_its_ridge_models(tmp_path, monkeypatch):
    study = get_study("clucb-synthetic")
    monkeypatch.setattr(study, "QUICK", {**study.QUICK, "alphas": [0.05], "replications": 2, "horizon": 200})
    out = tmp_path / "out"
    study.run(out, quick=True)
    _html, ncs = _diagnosed(out)
    assert set(ncs) == {"LUCB__reward", "CLUCB_alpha=0.05__reward", "LUCB_radius_x3.5__reward"}


@pytest.mark.long
def test_video_upload_saves_each_replications_probit_gps(tmp_path):
    study = get_study("video-upload")
    tiny = {"warmup": 600, "batches": 2, "batch_size": 400, "alphas": [0.01], "replications": 2,
            "model": {"nn_epochs": 1, "nn_min_steps": 20, "gp_epochs": 1}}
    out = tmp_path / "out"
    study.run(out, seed=0, config=tiny)
    files = sorted(p.name for p in (out / "models").glob("*.json"))
    assert files == [f"rep{r}__{p}.json" for r in (0, 1) for p in ("ts-asc_alpha=0.01__policy", "ts-asc_alpha=0.01__reward+constraint0",
                                                                  "ts__policy", "ts__reward")]
    assert not list((out / "models").glob("*.pt"))  # the portable format only: no pickles
    policy = load_policy(out / "models", ("rep0", "ts-asc_alpha=0.01"))
    assert torch.equal(policy.alpha, torch.tensor([0.01], dtype=torch.float64))  # the policy's alpha is saved with it
    models = load_models(out / "models")
    shared = models["rep1__ts-asc_alpha=0.01__reward"].model
    assert shared is models["rep1__ts-asc_alpha=0.01__constraint0"].model
    assert shared.num_observations == 600 + 2 * 400 and shared.observations()[0].shape[0] == 1400
    html, ncs = _diagnosed(out)
    assert set(ncs) == {"rep0__ts-asc_alpha=0.01__reward+constraint0", "rep0__ts__reward",
                        "rep1__ts-asc_alpha=0.01__reward+constraint0", "rep1__ts__reward"}
    assert "reliability diagram of rep1__ts__reward" in html and "Brier score" in html
    idata = az.from_netcdf(ncs["rep0__ts__reward"])
    assert idata.posterior["p"].dims == ("chain", "draw", "point") and idata.posterior.sizes["point"] == 500
    assert set(idata.observed_data["y"].values.tolist()) <= {0.0, 1.0}


@pytest.mark.long
def test_bcts_studies_save_reward_constraint_and_mask_posteriors(tmp_path):
    from bayes_safe.envs import load_iwpc

    tiny = {"sigmas": [0.0, 1.0], "teaching": ["cts"], "num_teaching": [200], "curve_num_teaching": 200,
            "horizon": 150, "replications": 2, "num_users": 8, "num_movies": 100, "teaching_size": 30,
            "synthetic": {"num_users": 30, "num_movies": 150}}
    out = tmp_path / "ml"
    get_study("bcts-movielens").run(out, quick=True, config=tiny)
    models = load_models(out / "models")
    assert set(models) == {"sigma=0_cts__reward", "sigma=1_cts__reward", "constraint_cts_teaching_N=200__constraint",
                           "Constraint_Mask__reward"}
    constraint = models["constraint_cts_teaching_N=200__constraint"]
    assert constraint.batch_shape == (2,) and int(constraint.num_observations.sum()) == 2 * 200
    _html, ncs = _diagnosed(out)
    assert set(ncs) == set(models)
    idata = az.from_netcdf(ncs["sigma=1_cts__reward"])
    assert idata.posterior["w"].dims == ("chain", "draw", "batch0", "arm", "feature")
    assert list(idata.posterior.arm.values) == list(range(8)) and idata.posterior.sizes["feature"] == 10
    assert int(idata.constant_data["num_observations"].sum()) == 2 * 150

    out = tmp_path / "wf"
    get_study("bcts-warfarin").run(out, quick=True, config={"sigmas": [0.25], "teaching": ["random"],
                                                              "num_teaching": [100], "horizon": 100, "data": load_iwpc()})
    _html, ncs = _diagnosed(out)
    assert set(ncs) == {"sigma=0.25_random__reward", "constraint_random_teaching_N=100__constraint",
                        "Constraint_Mask__reward"}


@pytest.mark.long
@pytest.mark.parametrize("name", ["acol-driving", "acol-synthetic"])
def test_acol_studies_say_they_have_no_posterior(name, tmp_path, monkeypatch, capsys):
    study = get_study(name)
    if name == "acol-synthetic":  # its quick mode takes ~20 s; the models question needs one point
        monkeypatch.setattr(study, "QUICK", {**study.QUICK, "seeds": 2, "eps": [0.1], "irr_d": [], "sphere_n": [],
                                             "sphere_d": [], "tuned_budget": 500, "fig3_budget": 500})
    out = tmp_path / "out"
    study.run(out, quick=True)
    assert [p.name for p in (out / "models").iterdir()] == [NO_MODELS_FILE]
    with pytest.raises(FileNotFoundError, match="no saved models: ACOL, G-ACOL and their baselines .* fit no posterior"):
        diagnose_run(out)
    with pytest.raises(SystemExit):
        main(["diagnose", str(out)])
    assert "frequentist confidence intervals" in capsys.readouterr().err
    assert not (out / "diagnostics").exists()


@pytest.mark.long
def test_controlled_exploration_saves_policies_that_are_not_posteriors(tmp_path, capsys):
    out = tmp_path / "out"
    results = get_study("controlled-exploration").run(out, quick=True, seed=0)
    models = load_models(out / "models")
    methods = ("quadratic", "minimax", "meta", "hinge")
    expected = {f"{d}__seed0__ips__policy" for d in ("synthetic", "open_bandit")}
    expected |= {f"{d}__seed0__reward_model" for d in ("synthetic", "open_bandit")}
    expected |= {f"{d}__{b}__{m}__seed0__policy" for d in ("synthetic", "open_bandit")
                 for b in results["config"]["benchmarks"] for m in methods}
    assert set(models) == expected
    policy = models["synthetic__critical__meta__seed0__policy"]
    assert isinstance(policy, torch.nn.Module) and policy(torch.zeros(2, policy[0].in_features)).shape[0] == 2
    with pytest.raises(SystemExit):
        main(["diagnose", str(out)])
    err = capsys.readouterr().err
    assert "none of the 28 saved models is a posterior" in err and "Sequential x 26" in err
    assert "LogisticRewardModel x 2" in err and json.loads((out / "results.json").read_text())["quick"] is True
