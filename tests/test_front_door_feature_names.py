"""The video-upload problem names its features (issue 31): a model built for it keeps the names,
and `bayes-safe diagnose` shows them instead of x0 .. x44."""

from __future__ import annotations

import arviz as az
import torch

from bayes_safe.cli import main
from bayes_safe.diagnostics import load_models
from bayes_safe.envs.video_upload import (
    ACTION_NAMES,
    CONNECTIONS,
    CONTEXT_COLUMNS,
    CONTEXT_DIM,
    CONTEXT_NAMES,
    FEATURE_DIM,
    FEATURE_NAMES,
    VideoUpload,
)
from bayes_safe.factory import ridge_model


def test_names_match_the_columns_draw_fills():
    """Each name is the column that holds what it says (checked on drawn uploads, not by count)."""
    assert len(CONTEXT_NAMES) == CONTEXT_DIM and len(FEATURE_NAMES) == FEATURE_DIM
    assert len(set(FEATURE_NAMES)) == FEATURE_DIM
    assert tuple(VideoUpload.feature_names) == FEATURE_NAMES
    for field, columns in CONTEXT_COLUMNS.items():
        assert all(name.startswith(field.split("_")[0]) for name in CONTEXT_NAMES[columns]), field
    up = VideoUpload(seed=3).draw(500)
    x = up.features
    col = {name: j for j, name in enumerate(FEATURE_NAMES)}
    for i, c in enumerate(CONNECTIONS):
        assert torch.equal(x[:, 0, col[f"connection_{c}"]] == 1, up.groups["connection"] == i), c
    for i, q in enumerate(ACTION_NAMES):
        assert torch.equal(x[:, 0, col[f"source_{q}"]] == 1, up.groups["source_resolution"] == i), q
        assert bool((x[:, i, col[f"action_{q}"]] == 1).all()) and float(x[:, i, col["action_360p"]].sum()) == (i == 0) * 500
    for i, o in enumerate(("android", "ios", "other")):
        assert torch.equal(x[:, 0, col[f"os_{o}"]] == 1, up.groups["os"] == i), o
    # the transfer time is the upload's size over the measured download speed (logs)
    torch.testing.assert_close(x[..., col["log_transfer_s"]],
                               x[..., col["log_upload_mbit"]] - x[..., col["log_download_mbps"]])
    # the file size is the source bitrate times the duration / 8: above the bitrate's log - log 8 for any video of 1 s or more
    assert bool((x[:, 0, col["log_file_size_mb"]] >= x[:, 0, col["log_source_bitrate_mbps"]] - torch.log(torch.tensor(8.0))).all())


def test_a_model_built_for_the_problem_keeps_the_names():
    class Shape:  # what ridge_model reads of a problem (bayes_safe.cli gives it a problem's feature_names)
        noise_std = VideoUpload.noise_std
        dim = FEATURE_DIM
        replications = 2
        feature_names = VideoUpload.feature_names

    model = ridge_model(Shape())
    assert list(model.feature_names) == list(FEATURE_NAMES)


def test_diagnose_shows_the_names(tmp_path, capsys):
    """As a user runs it: simulate the problem from the command line, then diagnose the saved models."""
    out = tmp_path / "run"
    assert main(["simulate", "--problem", "bayes_safe.envs.video_upload:VideoUpload", "--policy", "ts",
                 "--replications", "1", "--horizon", "40", "--out", str(out), "--no-progress"]) == 0
    assert list(load_models(out / "models")["reward"].feature_names or ()) == list(FEATURE_NAMES)
    assert main(["diagnose", str(out), "--draws", "50"]) == 0
    idata = az.from_netcdf(out / "diagnostics" / "reward.nc")
    assert list(idata.posterior.coords["feature"].values) == list(FEATURE_NAMES)
    assert "connection_wifi" in (out / "diagnostics" / "report.html").read_text()
