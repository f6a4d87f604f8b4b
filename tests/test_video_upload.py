"""The video-upload simulator, its metrics, and a tiny configuration of the study."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from bayes_safe.envs import VideoUpload
from bayes_safe.envs.video_upload import (
    CONTEXT_COLUMNS,
    CONTEXT_DIM,
    FEATURE_DIM,
    VideoUploadParameters,
    percent_change,
)
from bayes_safe.threads import single_thread


@pytest.fixture(scope="module")
def batch():
    env = VideoUpload(seed=0)
    return env, env.draw(20_000)


def test_shapes_layout_and_masks(batch):
    env, up = batch
    n = len(up)
    assert up.context.shape == (n, CONTEXT_DIM) == (n, 39)
    assert up.features.shape == (n, 4, FEATURE_DIM) and up.features.dtype == torch.float64
    for name in ("device_model", "os", "connection", "country", "source_resolution"):
        block = up.context[:, CONTEXT_COLUMNS[name]]
        assert torch.equal(block.sum(-1), torch.ones(n, dtype=torch.float64)), name
        assert bool(((block == 0) | (block == 1)).all())
    src = up.groups["source_resolution"]
    assert torch.equal(up.context[:, 35:39].argmax(-1), src)
    assert torch.equal(up.valid, torch.arange(4)[None, :] <= src[:, None])
    # the action encoding: context copied, one-hot of the action, log upload size, log transfer time
    assert torch.equal(up.features[:, :, :39], up.context[:, None, :].expand(-1, 4, -1))
    assert torch.equal(up.features[:, :, 39:43], torch.eye(4, dtype=torch.float64).expand(n, -1, -1))
    file_mb, bitrate, speed = up.context[:, 33].exp(), up.context[:, 34].exp(), up.context[:, 20].exp()
    duration = 8 * file_mb / bitrate
    target = torch.tensor(env.params.target_bitrate, dtype=torch.float64)
    size = torch.minimum(bitrate[:, None], target) * duration[:, None]
    assert torch.allclose(up.features[:, :, 43], size.log())
    assert torch.allclose(up.features[:, :, 44], (size / speed[:, None]).log())


def test_baseline_rule_and_success_structure(batch):
    env, up = batch
    conn, src = up.groups["connection"], up.groups["source_resolution"]
    rule = torch.tensor(env.params.baseline_by_connection)
    assert torch.equal(up.baseline, torch.minimum(rule[conn], src))
    p = up.success_prob
    assert bool((p[~up.valid] == 0).all()) and bool(((p > 0) & (p < 1))[up.valid].all())
    # success falls with quality for every upload
    both = up.valid[:, 1:]
    assert bool((p[:, 1:] < p[:, :-1])[both].all())
    # and varies by sub-population: 1080p hurts low-tier devices far more than high-tier ones on wifi
    wifi_1080 = (conn == 3) & (src == 3)
    tier = up.groups["device_tier"]
    drop = 1 - p[:, 3] / p[:, 2]
    assert float(drop[wifi_1080 & (tier == 0)].mean()) > 3 * float(drop[wifi_1080 & (tier == 2)].mean())


def test_outcomes_use_common_random_numbers_and_the_paper_reward(batch):
    env, up = batch
    n = len(up)
    lowest = torch.zeros(n, dtype=torch.long)
    o_low, o_base = env.outcomes(up, lowest), env.outcomes(up, up.baseline)
    assert torch.equal(o_low.success, up.uniform < up.success_prob[:, 0])
    # same uniform per upload: the more reliable (lower) action never fails where the baseline succeeds
    assert not bool((o_base.success & ~o_low.success).any())
    scale = torch.cumsum(torch.tensor([1.0, 0.02, 0.02, 0.02], dtype=torch.float64), 0)
    assert torch.allclose(o_base.reward, o_base.success.double() * scale[up.baseline])
    assert torch.equal(o_base.preserved_1080p, o_base.success & (up.baseline == 3) & (up.groups["source_resolution"] == 3))


def test_metrics_overall_and_by_group(batch):
    env, up = batch
    out = env.outcomes(up, up.baseline)
    m = env.metrics(up, out)
    o = m["overall"]
    assert o["n"] == len(up)
    assert o["reliability"] == pytest.approx(float(out.success.double().mean()))
    src = up.groups["source_resolution"] == 3
    assert o["q_1080p"] == pytest.approx(float((out.success & (up.baseline == 3))[src].double().mean()))
    assert sum(o[f"share_{q}"] for q in ("360p", "480p", "720p", "1080p")) == pytest.approx(1.0)
    assert set(m["by_connection"]) == {"2G", "3G", "4G", "wifi"}
    assert sum(g["n"] for g in m["by_device_tier"].values()) == len(up)
    assert m["by_source_resolution"]["360p"]["q_1080p"] is None
    # the baseline never uploads 1080p below wifi, so q_1080p is 0 there
    assert m["by_connection"]["4G"]["q_1080p"] == 0.0


def test_seeded_stream_and_explicit_generator():
    a, b = VideoUpload(seed=3), VideoUpload(seed=3)
    x1, y1 = a.draw(100), b.draw(100)
    assert torch.equal(x1.features, y1.features) and torch.equal(x1.uniform, y1.uniform)
    x2 = a.draw(100)
    assert not torch.equal(x1.context, x2.context)  # the stream continues
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(a.draw(50, g1).success_prob, b.draw(50, g2).success_prob)
    assert not torch.equal(VideoUpload(seed=4).draw(100).context, y1.context)


def test_fast_100k_uploads_in_well_under_a_second():
    env = VideoUpload(seed=0)
    best = float("inf")
    with single_thread():
        for _ in range(3):
            start = time.perf_counter()
            up = env.draw(100_000)
            out = env.outcomes(up, up.baseline)
            best = min(best, time.perf_counter() - start)
    assert out.success.shape == (100_000,)
    assert best < 1.0, f"100k uploads took {best:.2f} s"


def test_percent_change_delta_method():
    base = torch.tensor([1.0, 0.0] * 500)
    pol = base.clone()
    pol[1] = 1.0  # one more success out of 1000
    change, se = percent_change(pol, base)
    assert change == pytest.approx(100 * (501 / 500 - 1))
    assert 0 < se < 1
    same, se0 = percent_change(base, base)
    assert same == 0 and se0 == 0
    assert all(math.isnan(v) for v in percent_change(torch.zeros(5), torch.zeros(5)))  # nan when the baseline is 0


def test_bad_inputs(batch):
    env, up = batch
    src = up.groups["source_resolution"]
    i = int((src < 3).nonzero()[0])
    actions = up.baseline.clone()
    actions[i] = 3
    with pytest.raises(ValueError, match="above the source resolution"):
        env.outcomes(up, actions)
    with pytest.raises(ValueError, match="actions: expected indices in 0..3"):
        env.outcomes(up, torch.full((len(up),), 4))
    with pytest.raises(ValueError, match=r"actions: expected shape \[20000\]"):
        env.outcomes(up, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer action indices"):
        env.outcomes(up, torch.zeros(len(up)))
    with pytest.raises(ValueError, match="omega: expected positive offsets"):
        VideoUpload(omega=(1.0, 0.02, 0.0, 0.02))
    with pytest.raises(ValueError, match="omega: expected positive offsets"):
        VideoUpload(omega=(1.0, -0.01, 0.02, 0.02))
    with pytest.raises(ValueError, match="omega: expected 4 offsets"):
        VideoUpload(omega=(1.0, 0.02))
    with pytest.raises(ValueError, match="n: expected a positive int"):
        env.draw(0)
    with pytest.raises(ValueError, match="baseline_by_connection"):
        VideoUpload(params=VideoUploadParameters(baseline_by_connection=(0, 1, 2, 4)))


def test_study_tiny_configuration(tmp_path):
    """The whole study pipeline on a tiny configuration (the real runs: --quick and the full report)."""
    from bayes_safe.studies import get_study

    study = get_study("video-upload")
    tiny = {"warmup": 600, "batches": 2, "batch_size": 500, "alphas": [0.01], "replications": 2,
            "model": {"nn_epochs": 1, "nn_min_steps": 20, "gp_epochs": 1}}
    results = study.run(tmp_path / "out", seed=1, config=tiny)
    out = tmp_path / "out"
    for name in ("results.json", "summary.csv", "report.md", "changes.png", "batches.png", "shares.png"):
        assert (out / name).exists(), name
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["summary"]) == {"baseline", "ts", "ts-asc(alpha=0.01)"}
    overall = saved["summary"]["ts"]["overall"]
    assert overall["n"] == 2000  # two replications of 2 x 500 uploads, pooled
    assert len(saved["summary"]["ts"]["replications"]) == 2
    assert saved["finding"]["ts"]["reliability_change_pct"] == pytest.approx(
        sum(r["reliability_change_pct"] for r in saved["summary"]["ts"]["replications"]) / 2)
    for key in ("reliability_change_pct", "reliability_change_se", "q_1080p_change_pct", "violation_rate"):
        assert key in overall
    assert set(saved["summary"]["ts"]["by_connection"]) == {"2G", "3G", "4G", "wifi"}
    assert len(saved["summary"]["ts"]["by_batch"]) == 2
    assert "reproduced" in saved["finding"]
    assert results["summary"]["baseline"]["overall"]["reliability_change_pct"] == 0.0
    with pytest.raises(ValueError, match="config\\['batches'\\]"):
        study.run(tmp_path / "bad", config={**tiny, "batches": 0})
    assert not (tmp_path / "bad").exists()
