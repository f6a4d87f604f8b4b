"""Feature names kept with a model (issue 31): given as a user has them (a DataFrame's columns, a
numpy array of strings), saved and loaded with the model's state, used by ``to_inference_data``
and ``bayes-safe diagnose``; states saved without them still load (features ``x0, x1, ...``)."""

import json

import numpy as np
import pandas as pd
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, PerArmLinear
from bayes_safe.cli import main
from bayes_safe.diagnostics import load_models, save_models, to_inference_data
from bayes_safe.state import StateError

rng = np.random.default_rng(3)
FRAME = pd.DataFrame(rng.normal(size=(40, 3)), columns=["age", "dose", "weight"])
OUTCOME = FRAME.to_numpy() @ np.array([0.5, -1.0, 0.0]) + 0.3 * rng.normal(size=40)
PRIOR = dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1)


def test_names_travel_with_the_saved_state_into_diagnostics(tmp_path):
    model = BayesianLinear(PRIOR, noise_std=0.3, feature_names=FRAME.columns)
    model.update(FRAME, OUTCOME)
    assert model.feature_names == ["age", "dose", "weight"]
    save_models({"reward": model}, tmp_path / "models")
    loaded = load_models(tmp_path / "models")["reward"]
    assert loaded.feature_names == ["age", "dose", "weight"]
    idata = to_inference_data(loaded, num_draws=20, num_chains=2)
    assert list(idata.posterior["w"].coords["feature"].values) == ["age", "dose", "weight"]
    # names given to the converter win over the saved ones
    idata = to_inference_data(loaded, num_draws=20, num_chains=2, feature_names=["a", "b", "c"])
    assert list(idata.posterior["feature"].values) == ["a", "b", "c"]


def test_every_engine_and_per_arm_models_keep_their_names(tmp_path):
    names = np.array(["age", "dose", "weight"])  # numpy strings
    laplace = dist.Laplace(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1)
    models = {
        "gibbs": BayesianLinear(laplace, noise_std=0.3, feature_names=names),
        "svi": BayesianLinear(laplace, noise_std=0.3, inference="svi", feature_names=names,
                              inference_options={"num_samples": 10, "svi_steps": 20}),
        "arms": PerArmLinear(PRIOR, num_arms=2, noise_std=0.3, feature_names=names),
    }
    save_models(models, tmp_path)
    loaded = load_models(tmp_path)
    assert {k: m.feature_names for k, m in loaded.items()} == {k: ["age", "dose", "weight"] for k in models}
    assert all(type(n) is str for n in loaded["gibbs"].feature_names)


def test_a_state_saved_without_names_loads_and_shows_x0(tmp_path):
    model = BayesianLinear(PRIOR, noise_std=0.3)
    model.update(FRAME, OUTCOME)
    (path,) = save_models({"reward": model}, tmp_path)
    header = json.loads(path.read_text())
    assert "feature_names" not in header["object"]["roles"]["reward"]  # the format of states written before names existed
    loaded = load_models(tmp_path)["reward"]
    assert loaded.feature_names is None
    assert list(to_inference_data(loaded, num_draws=10).posterior["feature"].values) == ["x0", "x1", "x2"]


def test_a_corrupt_name_list_in_a_file_is_a_state_error(tmp_path):
    model = BayesianLinear(PRIOR, noise_std=0.3, feature_names=["a", "b", "c"])
    (path,) = save_models({"reward": model}, tmp_path)
    header = json.loads(path.read_text())
    assert header["object"]["roles"]["reward"]["feature_names"] == ["a", "b", "c"]
    header["object"]["roles"]["reward"]["feature_names"] = ["a", "b"]
    path.write_text(json.dumps(header))
    with pytest.raises(StateError, match="feature_names: expected 3 names"):
        load_models(tmp_path)


@pytest.mark.parametrize("names, message", [
    ("age", "feature_names: expected a sequence of strings"),
    ({"age", "dose", "weight"}, "feature_names: expected a sequence of strings"),
    (["age", 2, "weight"], "feature_names: entry 1 is 2; expected a non-empty string"),
    (["age", "", "weight"], "feature_names: entry 1 is ''"),
    (["age", "dose"], "feature_names: expected 3 names"),
    (["age", "age", "dose"], r"feature_names: expected distinct names, \['age'\] repeated"),
    (7, "feature_names: expected a sequence of strings"),
])
def test_bad_names_are_named_before_any_work(names, message):
    with pytest.raises(ValueError, match=message):
        BayesianLinear(PRIOR, noise_std=0.3, feature_names=names)
    with pytest.raises(ValueError, match=message):
        PerArmLinear(PRIOR, num_arms=2, noise_std=0.3, feature_names=names)
    # a callable prior's NUTS engine is never built when the names are wrong
    with pytest.raises(ValueError, match=message):
        BayesianLinear(lambda: None, dim=3, noise_std=0.3, inference="nuts", feature_names=names)


def test_diagnose_names_the_features_saved_with_the_model(tmp_path, capsys):
    model = BayesianLinear(PRIOR, noise_std=0.3, feature_names=FRAME.columns)
    model.update(FRAME, OUTCOME)
    save_models({"reward": model}, tmp_path / "run" / "models")
    assert main(["diagnose", str(tmp_path / "run"), "--draws", "50"]) == 0
    html = (tmp_path / "run" / "diagnostics" / "report.html").read_text()
    assert "w[dose]" in html and "w[x1]" not in html
