"""The package is typed (issue 31): ``py.typed`` ships, and mypy checks a user's snippet against
bayes_safe's annotations (a wrong type is an error on the user's line; the right ones pass)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SNIPPET = textwrap.dedent('''
    import numpy as np
    import pyro.distributions as dist
    import torch

    from bayes_safe import BayesianLinear, ThompsonSampling, simulate
    from bayes_safe.envs import kazerouni2017_neurips
    from bayes_safe.online import Decider

    prior = dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1)
    policy = ThompsonSampling(BayesianLinear(prior, noise_std=1.0))
    trace = simulate(ThompsonSampling(BayesianLinear(prior, noise_std=1.0, batch_shape=[2])),
                     kazerouni2017_neurips(replications=2), horizon=10, seed=0)
    assert trace.regret is not None
    regret: torch.Tensor = trace.regret
    decision = Decider(policy, num_draws=20).decide(np.zeros((5, 4)), baseline=0)
    action: int = decision.action
    propensity: float = decision.propensity
''')


def test_py_typed_ships_with_the_package():
    import bayes_safe

    assert (Path(bayes_safe.__file__).parent / "py.typed").exists()
    assert '"bayes_safe" = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.long  # mypy reads torch's annotations: about 30 s
def test_mypy_checks_a_users_snippet_against_the_annotations(tmp_path):
    (tmp_path / "good.py").write_text(SNIPPET)
    (tmp_path / "bad.py").write_text(SNIPPET + "wrong: str = decision.action\n")
    env = dict(os.environ, MYPYPATH="")
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--ignore-missing-imports",
               "--follow-imports=silent", "--no-error-summary"]
    good = subprocess.run([*command, str(tmp_path / "good.py")], capture_output=True, text=True, env=env,
                          check=False, timeout=600)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run([*command, str(tmp_path / "bad.py")], capture_output=True, text=True, env=env, check=False,
                         timeout=600)
    lines = bad.stdout.strip().splitlines()
    # the one error: the user's own line, where an int (Decision.action) meets str
    assert bad.returncode == 1 and len(lines) == 1, bad.stdout + bad.stderr
    assert f"bad.py:{len(SNIPPET.splitlines()) + 1}: error" in lines[0] and '"int"' in lines[0], lines[0]
