"""--quick smoke runs of the linear-bandit studies through the command line."""

import json

import pytest

from bayes_safe.cli import main


def test_both_studies_are_listed(capsys):
    assert main(["study", "list"]) == 0
    out = capsys.readouterr().out
    assert "ts-asc-synthetic" in out and "clucb-synthetic" in out


def test_ts_asc_synthetic_quick(tmp_path):
    out = tmp_path / "ts"
    assert main(["study", "run", "ts-asc-synthetic", "--out", str(out), "--quick", "--seed", "1"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "report.md", "steps.csv", "summary.csv", "table_2b.csv", "figure2a.csv",
            "figure1a_regret.png", "figure1b_violations.png", "figure2a_constraint.png"} <= names
    for png in out.glob("*.png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    res = json.loads((out / "results.json").read_text())
    assert res["quick"] is True and res["seed"] == 1
    table = res["table_2b"]
    assert [r["alpha"] for r in table] == [0.1, 0.01, 0.001, 0.0001]
    assert [r["paper_mean"] for r in table] == [1.2181, 1.2980, 1.3065, 1.3077]
    for r in table:  # TS-ASC's learned policy respects the constraint on average
        assert r["ours_mean"] >= 1 - r["alpha"] - 0.05
    summary = res["summary"]
    assert set(summary) == {"0.1", "0.01", "0.001", "0.0001"}
    assert set(summary["0.1"]) == {"TS-ASC", "CLUCB2-ASC-C", "CLUCB2-ASC-I"}
    assert summary["0.1"]["CLUCB2-ASC-I"]["violation_rate_all_steps"]["mean"] == 0.0
    report = (out / "report.md").read_text()
    for text in ("1.2181", "1.3077", "Horizon", "Figure 1a", "Figure 1b", "Figure 2a", "Figure 2b"):
        assert text in report


def test_clucb_synthetic_quick(tmp_path):
    out = tmp_path / "clucb"
    assert main(["study", "run", "clucb-synthetic", "--out", str(out), "--quick"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "report.md", "violations.csv", "curves.csv", "figure1_reward_per_period.png"} <= names
    res = json.loads((out / "results.json").read_text())
    table = res["violations_table"]
    assert [r["alpha"] for r in table] == [0.01, 0.05, 0.1]
    for r in table:
        assert r["clucb_max"] == 0  # CLUCB never violates constraint (3)
    assert table[0]["lucb_mean"] > 0  # LUCB does, at the smallest alpha
    assert table[0]["lucb_mean"] >= table[-1]["lucb_mean"]  # and more often for smaller alpha
    report = (out / "report.md").read_text()
    assert "26,561" in report and "Abbasi-Yadkori" in report


def test_unknown_study_and_bad_out_fail_cleanly(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["study", "run", "nope", "--out", str(tmp_path / "x"), "--quick"])
    assert exc.value.code == 2 and "unknown name 'nope'" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["study", "run", "clucb-synthetic", "--out", str(f), "--quick"])
    assert exc.value.code == 2
