"""The command line starts without the heavy stack, and its light name lists match the registries.

Building the ``bayes-safe`` parser (``--help``, ``study list``, ``tune --help`` ...) must not import
torch, Ax or gpytorch: each subcommand imports what it runs. The timings are measured by
``benchmarks/cli_startup.py``; these tests check the imports, which do not depend on the machine.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import bayes_safe
import bayes_safe.tuning.cli as tune_cli
from bayes_safe import cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ax", "botorch", "gpytorch", "pyro", "numpy", "pandas")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300, cwd=ROOT)


def _heavy_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    out = _python(f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------- light copies of the registries
def test_parser_names_equal_the_registries():
    from bayes_safe.envs import PROBLEMS
    from bayes_safe.factory import POLICIES
    from bayes_safe.tuning.ab_test import PROBLEMS as TUNING_PROBLEMS
    from bayes_safe.tuning.study import ACQUISITION_FUNCTIONS

    assert cli.PROBLEM_NAMES == tuple(sorted(PROBLEMS))
    assert cli.POLICY_NAMES == tuple(POLICIES)
    assert tune_cli.PROBLEM_NAMES == tuple(TUNING_PROBLEMS)
    assert tune_cli.ACQUISITION_FUNCTIONS == tuple(ACQUISITION_FUNCTIONS)  # same order: the first is the default


# ------------------------------------------------------------------------------------ imports at startup
def test_building_the_parser_imports_nothing_heavy():
    assert _heavy_after("from bayes_safe.cli import _build_parser\n_build_parser()") == []


def test_import_bayes_safe_is_light():
    assert _heavy_after("import bayes_safe, bayes_safe.cli, bayes_safe.tuning.cli") == []


@pytest.mark.parametrize("argv", [
    ["--help"], ["simulate", "--help"], ["diagnose", "--help"], ["study", "--help"], ["tune", "--help"],
    ["tune", "video-upload", "--help"], ["tune", "logged-data", "--help"], ["tune", "resume", "--help"],
])
def test_help_exits_0_without_heavy_imports(argv):
    code = f"from bayes_safe.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code"
    assert _heavy_after(code) == []


def test_study_list_prints_the_studies_without_heavy_imports():
    script = Path(sys.executable).with_name("bayes-safe")
    out = subprocess.run([str(script), "study", "list"], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines()]
    assert {"ts-asc-synthetic", "clucb-synthetic", "video-upload"} <= set(names)
    assert names == sorted(names)
    assert _heavy_after("from bayes_safe.cli import main\nassert main(['study', 'list']) == 0") == []


# ------------------------------------------------------------------------------- the lazy package
def test_every_public_name_resolves_and_is_listed():
    assert set(bayes_safe._SOURCES) == set(bayes_safe.__all__)
    for name in bayes_safe.__all__:
        assert getattr(bayes_safe, name) is not None
    assert set(bayes_safe.__all__) <= set(dir(bayes_safe))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bayes_safe.nope  # noqa: B018


@pytest.mark.parametrize("first", ["import bayes_safe.simulation", "from bayes_safe.simulation import simulate",
                                   "import bayes_safe.cli", "import bayes_safe"])
def test_simulate_is_the_function_after_importing_its_module(first):
    """``bayes_safe.simulate`` is the function, whichever import came first (the module is ``simulation``)."""
    out = _python(f"{first}\nimport inspect\nfrom bayes_safe import simulate\nimport bayes_safe, bayes_safe.simulation\n"
                  "assert inspect.isfunction(simulate), simulate\n"
                  "assert simulate is bayes_safe.simulate is bayes_safe.simulation.simulate\nprint('ok')")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    from bayes_safe import simulate

    assert inspect.isfunction(simulate) and simulate.__module__ == "bayes_safe.simulation"


# ------------------------------------------------------------------------------- who imports whom
def _imports(path: Path) -> set[str]:
    """``module`` and ``module.name`` of every import in a file (relative imports resolved in bayes_safe)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = ("bayes_safe." if node.level else "") + (node.module or "")
            found |= {module} | {f"{module}.{a.name}" for a in node.names}
    return found


def test_the_two_command_lines_share_argument_types_not_private_helpers():
    top, tune = _imports(ROOT / "bayes_safe" / "cli.py"), _imports(ROOT / "tuning" / "cli.py")
    assert not any(m.startswith("bayes_safe.cli") for m in tune)  # the tune CLI sits below the top-level one
    assert {m for m in top if m.startswith("bayes_safe.tuning.cli.")} <= {"bayes_safe.tuning.cli.add_tune_parser",
                                                                         "bayes_safe.tuning.cli.run_tune"}
    assert "bayes_safe._cli_args" in top and "bayes_safe._cli_args" in tune
    shared = _imports(ROOT / "bayes_safe" / "_cli_args.py")
    assert {m.split(".")[0] for m in shared} <= {"__future__", "argparse", "math", "pathlib"}


def test_without_the_tune_extra_the_rest_works_and_tune_names_the_extra(monkeypatch, capsys, tmp_path):
    import types

    from bayes_safe._extras import MissingExtraError

    missing = types.ModuleType("bayes_safe.tuning.cli")

    def _missing(name):
        raise MissingExtraError("bayes_safe.tuning needs the optional package 'ax', which is not installed: "
                                "pip install 'bayes-safe[tune]'", name="ax")

    missing.__getattr__ = _missing
    monkeypatch.setitem(sys.modules, "bayes_safe.tuning.cli", missing)
    assert cli.main(["study", "list"]) == 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0 and "bayes-safe[tune]" in capsys.readouterr().out
    for argv in (["tune", "resume", "--out", str(tmp_path / "x")], ["tune", "--help"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "pip install 'bayes-safe[tune]'" in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
