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
