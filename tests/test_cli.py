import json

import pytest

from bayes_safe.cli import main


def test_simulate_writes_trace_summary_and_plot(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["simulate", "--problem", "daulton2019", "--policy", "ts-asc", "--replications", "5",
                 "--horizon", "30", "--seed", "0", "--out", str(out), "--no-progress"])
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"trace.nc", "steps.csv", "summary.json", "regret.png", "models"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["replications"] == 5 and summary["horizon"] == 30
    assert (out / "regret.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--problem", "nope", "--policy", "ts"], "invalid choice: 'nope'"),
        (["--problem", "daulton2019", "--policy", "nope"], "invalid choice: 'nope'"),
        (["--problem", "daulton2019", "--policy", "ts", "--replications", "0"], "expected a positive integer"),
        (["--problem", "daulton2019", "--policy", "ts", "--alpha", "2"], "--alpha: expected a value in [0, 1)"),
        (["--problem", "kazerouni2017", "--policy", "ts-asc"], "needs a problem with a constraint metric"),
    ],
)
def test_simulate_rejects_bad_input_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(["simulate", *args, "--horizon", "5", "--out", str(out), "--no-progress"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["simulate", "--problem", "daulton2019", "--policy", "ts", "--horizon", "0"],
         "argument --horizon: expected a positive integer, got '0'"),
        (["simulate", "--problem", "daulton2019", "--policy", "ts", "--alpha", "nan"],
         "argument --alpha: expected a value in [0, 1), got 'nan'"),
        (["simulate", "--problem", "daulton2019", "--policy", "ts", "--out", "FILE"], "exists and is not a directory"),
        (["study", "run", "ts-asc-synthetic", "--out", "FILE"], "exists and is not a directory"),
        (["diagnose", "MISSING"], "does not exist"),
        (["diagnose", "FILE"], "is not a directory"),
        (["tune", "video-upload", "--trials", "0"], "argument --trials: expected a positive integer, got '0'"),
        (["tune", "video-upload", "--parallel", "-1"], "argument --parallel: expected a positive integer"),
        (["tune", "video-upload", "--acquisition", "EI"], "invalid choice: 'EI'"),
        (["tune", "video-upload", "--out", "FILE"], "exists and is not a directory"),
        (["tune", "logged-data", "--holdout", "1"], "argument --holdout: expected a share in (0, 1), got '1'"),
        (["tune", "logged-data", "--max-violation", "2"], "argument --max-violation: expected a rate in [0, 1]"),
        (["tune", "resume", "--trials", "x"], "argument --trials: expected a positive integer, got 'x'"),
        (["tune", "nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_arguments_are_one_error_line_with_status_2(tmp_path, capsys, argv, message):
    """Argument types shared by both command lines (bayes_safe._cli_args): one line, exit 2, nothing written."""
    (tmp_path / "FILE").write_text("")
    argv = [str(tmp_path / a) if a in ("FILE", "MISSING") else a for a in argv]
    if "--out" not in argv and argv[0] in ("simulate", "tune", "study"):
        argv += ["--out", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_a_later_simulate_leaves_no_file_of_the_earlier_run(tmp_path):
    out = tmp_path / "run"
    (out / "models").mkdir(parents=True)
    (out / "models" / "old-policy.json").write_text("{}")
    (out / "from-the-old-run.txt").write_text("old")
    assert main(["simulate", "--problem", "daulton2019", "--policy", "ts", "--replications", "2",
                 "--horizon", "5", "--out", str(out), "--no-progress"]) == 0
    assert {p.name for p in out.iterdir()} == {"trace.nc", "steps.csv", "summary.json", "regret.png", "models"}
    assert not (out / "models" / "old-policy.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


class _FakeStudy:
    """A study module: writes through its own atomic_output_dir, as the real ones do."""

    def __init__(self, files, fail=False):
        self.files, self.fail = files, fail

    def run(self, out, quick=False, seed=0):
        from bayes_safe.io import atomic_output_dir

        with atomic_output_dir(out) as tmp:
            for name in self.files:
                (tmp / name).write_text(name)
        if self.fail:
            raise ValueError("config: expected something else")
        return {"n": len(self.files)}


def test_study_run_replaces_out_as_a_whole_and_a_failure_leaves_it(tmp_path, monkeypatch, capsys):
    from bayes_safe import studies

    out = tmp_path / "study"
    monkeypatch.setattr(studies, "get_study", lambda name: _FakeStudy(["results.json", "report.md"]))
    assert main(["study", "run", "fake", "--out", str(out)]) == 0
    monkeypatch.setattr(studies, "get_study", lambda name: _FakeStudy(["results.json"]))
    assert main(["study", "run", "fake", "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["results.json"]  # report.md of the first run is gone
    monkeypatch.setattr(studies, "get_study", lambda name: _FakeStudy(["other.json"], fail=True))
    with pytest.raises(SystemExit) as exc:
        main(["study", "run", "fake", "--out", str(out)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "bayes-safe study run: error: config: expected something else"
    assert [p.name for p in out.iterdir()] == ["results.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]
