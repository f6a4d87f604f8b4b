"""The deployment files of docs/deploy/ (issue 29's guide, docs/replicas.md) as a user takes them:
the state script runs and writes a state the service loads, and every command of the compose
file is one this checkout's ``bayes-safe`` accepts, with nginx's port and body limit matching.
(Docker itself is not on the CI machine; tests/test_replicas_serve.py runs the same processes.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from bayes_safe.cli import _build_parser
from bayes_safe.online import Decider

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"


def test_make_state_writes_a_state_the_replicas_load(tmp_path):
    done = subprocess.run([sys.executable, str(DEPLOY / "make_state.py")], cwd=tmp_path, capture_output=True, check=False,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    decider = Decider.load(tmp_path / "state" / "decider")
    assert decider.feature_names == ["tenure", "opens", "hour", "segment"]


def test_the_compose_commands_are_ones_bayes_safe_accepts(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    replica = compose["services"]["replica"]
    command = replica["command"]
    assert command[:2] == ["bayes-safe", "serve"]
    state = tmp_path / "decider"
    state.mkdir()
    args = _build_parser().parse_args([str(state) if a == "/state/decider" else a for a in command[1:]])
    assert args.replica and args.log.startswith("postgresql://") and "@db:" in args.log
    assert ":" not in args.log.split("@")[0].removeprefix("postgresql://")  # no password in the URL: PGPASSFILE
    assert args.host == "0.0.0.0" and args.token_file  # off loopback only with tokens
    assert replica["environment"]["PGPASSFILE"].startswith("/run/secrets/")
    assert replica["deploy"]["replicas"] >= 2
    nginx = (DEPLOY / "nginx.conf").read_text()
    assert f"server replica:{args.port}" in nginx
    limit = int(re.search(r"client_max_body_size (\d+)m;", nginx).group(1)) << 20
    assert limit == args.max_body_bytes
    assert "torch==2.13.0" in (DEPLOY / "Dockerfile").read_text()
