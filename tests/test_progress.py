"""Progress bars (issue 31): notebook-aware, shown for long calls, quiet where nobody watches."""

from __future__ import annotations

import pytest

from bayes_safe.progress import ENV, progress_bar


def test_a_bar_on_request_counts_on_stderr(capsys):
    with progress_bar(3, "study demo", unit="trial", progress=True) as bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "study demo" in err and "3/3" in err and "trial" in err


def test_auto_is_quiet_off_a_terminal_and_the_environment_turns_every_bar_off(capsys, monkeypatch):
    with progress_bar(3, "quiet", progress="auto") as bar:  # pytest's stderr is not a terminal
        bar.update(3)
    monkeypatch.setenv(ENV, "0")
    with progress_bar(3, "off", progress=True) as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""


def test_a_bad_progress_value_is_named():
    with pytest.raises(ValueError, match="progress: expected True, False or 'auto'"):
        progress_bar(3, "x", progress="yes")


def test_simulate_shows_a_bar_on_request_and_none_by_default_off_a_terminal(capsys):
    import pyro.distributions as dist
    import torch

    from bayes_safe import BayesianLinear, ThompsonSampling, simulate
    from bayes_safe.envs import kazerouni2017_neurips

    def run(**kwargs):
        model = BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=1.0,
                               batch_shape=[2])
        return simulate(ThompsonSampling(model), kazerouni2017_neurips(replications=2), horizon=30, seed=0, **kwargs)

    quiet = run()
    assert capsys.readouterr().err == ""
    shown = run(progress=True)
    err = capsys.readouterr().err
    assert "simulate kazerouni2017-neurips" in err and "30/30" in err
    assert torch.equal(quiet.regret, shown.regret)  # a bar changes nothing of the run
    with pytest.raises(ValueError, match="progress: expected True, False or 'auto'"):
        run(progress="yes")
