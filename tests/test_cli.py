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
