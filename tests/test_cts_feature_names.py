"""BCTS's ``CTSPosterior`` keeps the names of its context features (issue 31): checked when given,
saved with the model, and used by ``to_inference_data`` (and so by ``bayes-safe diagnose``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayes_safe.diagnostics import to_inference_data
from bayes_safe.policies.bcts import CTSPosterior
from bayes_safe.state import StateError, load_state, save_state

NAMES = ["age", "dose_mg", "weight_kg"]


def test_names_are_saved_and_name_the_weights(tmp_path):
    m = CTSPosterior(2, 3, batch_shape=[1], feature_names=np.array(NAMES))   # a numpy array of strings
    rng = np.random.default_rng(0)
    for _ in range(30):
        m.update(torch.from_numpy(rng.normal(size=(1, 3))), torch.tensor([1.0], dtype=torch.float64),
                 torch.tensor([int(rng.integers(2))]))
    save_state(m, tmp_path / "cts")
    back = load_state(tmp_path / "cts")
    assert back.feature_names == NAMES
    idata = to_inference_data(back, num_draws=50)
    assert list(idata.posterior.coords["feature"].values) == NAMES
    assert "CTSPosterior(" in repr(back)


def test_bad_names_are_refused_before_any_work():
    with pytest.raises(ValueError, match="feature_names: expected 3"):
        CTSPosterior(2, 3, feature_names=["a", "b"])


def test_a_state_with_a_bad_name_list_names_the_file(tmp_path):
    save_state(CTSPosterior(2, 3, feature_names=NAMES), tmp_path / "cts")
    path = tmp_path / "cts.json"                                            # the state's header
    assert '"dose_mg"' in path.read_text()
    path.write_text(path.read_text().replace('"dose_mg"', '"age"'))       # duplicate names
    with pytest.raises(StateError, match="feature_names"):
        load_state(tmp_path / "cts")
