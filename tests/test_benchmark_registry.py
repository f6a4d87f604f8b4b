"""benchmarks/run.py's registry: the benchmarks of ``--issue``'s groups are modules of benchmarks/ with
``run(quick)``, registered in ``BENCHMARKS``; a group prints its targets in one run (issue 42)."""

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def registry():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("run")
    finally:
        sys.path.remove(str(BENCH))


def test_the_issue_benchmarks_have_run_quick(registry):
    names = set().union(*registry.ISSUES.values(), {"log_propensities"})
    for name in sorted(names):
        assert (BENCH / f"{name}.py").exists(), name
        module = importlib.import_module(name)
        assert "quick" in inspect.signature(module.run).parameters, name


def test_every_registered_benchmark_runs_in_run_py(registry):
    """``python benchmarks/run.py`` with no --only imports every registered module and calls its
    ``run(quick=...)``: each must exist and have one."""
    for name in registry.BENCHMARKS:
        assert (BENCH / f"{name}.py").exists(), name
        # by path: ``tuning`` is also the project's package of that name, imported by other tests
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert callable(getattr(module, "run", None)), f"{name} has no run(quick)"
        assert "quick" in inspect.signature(module.run).parameters, name


def test_issue_42_group_holds_every_target_benchmark(registry):
    assert set(registry.ISSUES["42"]) >= {"sparse_logistic", "chance_speed", "conservative_speed", "single_stream"}
    assert set(registry.ISSUES["42"]) <= set(registry.BENCHMARKS)


def test_small_values_keep_their_digits(registry):
    assert registry._fmt(0.0035) == "0.0035"
    assert registry._fmt(2.5) == "2.50"
    assert registry._fmt(12345.0) == "12,345"


def test_a_group_without_rows_prints_its_header(registry, capsys):
    """``run.py --issue 46`` on a machine without CUDA: the module says so and returns no row; the table is
    its header alone, not a traceback."""
    registry.print_table([])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split(" | ")[0].strip() == "benchmark" and len(out) == 2
