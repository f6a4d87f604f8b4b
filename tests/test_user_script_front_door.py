"""Issue 31's "done when": one script written as a user would write it, from numpy data to ArviZ's
model comparison, through the public API only (numpy inputs, named features, ``sample((100,))``,
``az.loo``, ``az.compare`` of two models, ``az.rhat`` finite for a Gibbs model), and the same
kind of script type-checked by mypy (slow: mypy reads torch's annotations)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import arviz as az
import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear
from bayes_safe.diagnostics import to_inference_data


def test_a_users_script_from_numpy_to_az_compare():
    # the user's data: 120 rows of 4 named features, two of them real effects
    rng = np.random.default_rng(2024)
    names = ["price", "discount", "season", "noise_col"]
    X = rng.normal(size=(120, 4))
    y = X @ np.array([0.8, -0.4, 0.0, 0.0]) + 0.5 * rng.normal(size=120)

    gaussian = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                              feature_names=names)
    laplace = BayesianLinear(dist.Laplace(torch.zeros(4, dtype=torch.float64), 0.5).to_event(1), noise_std=0.5,
                             feature_names=names)
    assert (gaussian.engine_name, laplace.engine_name) == ("conjugate", "gibbs")
    for model in (gaussian, laplace):
        model.update(X, y)

    # torch and Pyro's idiom: a sample shape first
    draws = gaussian.sample((100,))
    assert tuple(draws.shape) == (100, 4)
    assert abs(float(draws[:, 0].mean()) - 0.8) < 0.2

    idata = {"gaussian": to_inference_data(gaussian, X=X, y=y, num_draws=250),
             "laplace": to_inference_data(laplace, X=X, y=y, num_draws=250)}
    for data in idata.values():
        assert list(data.posterior["feature"].values) == names
        assert data.posterior.sizes["chain"] >= 2

    loo = az.loo(idata["gaussian"])
    assert np.isfinite(loo.elpd_loo)
    table = az.compare(idata)
    assert set(table.index) == {"gaussian", "laplace"} and np.isfinite(table["elpd_loo"]).all()
    rhat = az.rhat(idata["laplace"])  # the Gibbs engine's independent chains
    assert np.isfinite(rhat["w"].values).all() and float(rhat["w"].max()) < 1.1


SNIPPET = textwrap.dedent('''
    import numpy as np
    import pyro.distributions as dist
    import torch

    from bayes_safe import BayesianLinear

    X = np.random.default_rng(0).normal(size=(30, 2))
    y = X @ np.array([1.0, -1.0])
    model = BayesianLinear(dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                           feature_names=["a", "b"])
    model.update(X, y)
    draws: torch.Tensor = model.sample((100,))
    names: list[str] | None = model.feature_names
    fitted: bool = model.fit()
''')


@pytest.mark.long  # mypy reads torch's annotations: about 30 s
def test_mypy_accepts_the_users_typed_script_and_flags_a_wrong_type(tmp_path):
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--ignore-missing-imports",
               "--follow-imports=silent", "--no-error-summary"]
    env = dict(os.environ, MYPYPATH="")
    (tmp_path / "script.py").write_text(SNIPPET)
    (tmp_path / "wrong.py").write_text(SNIPPET + "count: str = model.dim\n")
    good = subprocess.run([*command, str(tmp_path / "script.py")], capture_output=True, text=True, env=env,
                          check=False, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run([*command, str(tmp_path / "wrong.py")], capture_output=True, text=True, env=env,
                         check=False, timeout=600)
    assert bad.returncode == 1 and f"wrong.py:{len(SNIPPET.splitlines()) + 1}: error" in bad.stdout, bad.stdout
