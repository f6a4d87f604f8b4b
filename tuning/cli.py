"""``bayes-safe tune``: run, resume and report tuning studies from the command line.

    bayes-safe tune video-upload --trials 30 --parallel 2 --out DIR [--quick] [--storage URL] [--scheduler ADDRESS]
    bayes-safe tune logged-data --source synthetic --method minimax --trials 20 --out DIR
    bayes-safe tune custom --problem pkg.module:Class [--param KEY=VALUE ...] --trials 20 --out DIR
    bayes-safe tune resume --out DIR [--trials N] [--parallel K] [--storage URL] [--name NAME] [--trust-source]
                           [--problem MODULE:CLASS]
    any of them: [--mlflow [URI]]   log every finished trial to MLflow (default URI: DIR/mlruns)

A study of your own problem stores its ``module:Class``; resume imports it (runs its code) only
when you confirm: ``--trust-source`` or the same ``--problem`` again (``check_resume_trust``).

Exit status: 0 done; 1 the study stopped on an error (too many failed trials); 2 bad input;
75 the Dask scheduler was lost (no trial failed; resume later); 130 / 143 / 129 stopped by
Ctrl-C / SIGTERM / SIGHUP (the trials in flight are re-run on resume; the workers are stopped).
`tune resume` keeps the study's stored parallelism unless --parallel is given.

The study lives in ``DIR/study.sqlite`` unless ``--storage URL`` names another database (an
SQLite file, or ``postgresql://user@host:port/db``: the server is contacted before any work, and
a running study holds an advisory lock there; ``bayes_safe.tuning.storage``); at the end ``DIR``
holds ``report.md``, the figures, ``trials.csv``, ``best.json`` and ``study.json``.
``bayes_safe.cli`` adds these commands with ``add_tune_parser`` and runs them with
``run_tune``. ``--mlflow`` logs every finished trial to MLflow (``bayes_safe.tuning.tracking``):
with no value to a file store in ``DIR/mlruns``, else to the directory, ``file:`` URI,
tracking server (``http://host:port``) or SQL store it names; the URI is checked (the server
contacted) before any work. ``resume`` tracks again where the study was tracked when that is a
file store inside the study's directory; anywhere else it must be named again with ``--mlflow``
(a study received from someone cannot send your trials to a server of theirs). Building the parser imports nothing heavy (no torch, no Ax): the names it offers
are light copies (``PROBLEM_NAMES``, ``ACQUISITION_FUNCTIONS``; tests/test_cli_startup.py checks
them against ``bayes_safe.tuning.ab_test.PROBLEMS`` and ``bayes_safe.tuning.study``), and the
argument types come from ``bayes_safe._cli_args``, which both command lines share.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

from bayes_safe._cli_args import (
    check_output_dir,
    import_path,
    key_value,
    open_fraction,
    output_dir,
    positive_int,
    probability,
)

__all__ = ["ACQUISITION_FUNCTIONS", "DEFAULT_REPLICATES", "FULL", "PROBLEM_NAMES", "QUICK", "add_tune_parser", "check_resume_trust",
           "check_scheduler", "default_ab_test", "run_tune"]

#: the names of ``bayes_safe.tuning.ab_test.PROBLEMS`` (one ``tune`` subcommand each), without importing torch
PROBLEM_NAMES = ("video-upload",)
#: ``bayes_safe.tuning.study.ACQUISITION_FUNCTIONS`` (the first is the default), without importing Ax
ACQUISITION_FUNCTIONS = ("qLogNoisyExpectedImprovement", "qNoisyExpectedImprovement")

#: ``bayes_safe.tuning.ab_test.DEFAULT_REPLICATES``, without importing torch
DEFAULT_REPLICATES = 4
#: Sobol trials of a --quick study (it reaches BoTorch even with --trials 8)
QUICK_SOBOL = 4

#: the A/B test of a full study (per arm: TS-ASC, vanilla TS, baseline on the same users)
FULL = {"n_users": 20_000, "batches": 4, "warmup": 4_000, "model": {}}
#: --quick: a smoke-sized A/B test (seconds per trial)
QUICK = {"n_users": 4_000, "batches": 2, "warmup": 4_000, "model": {"nn_epochs": 4, "nn_min_steps": 200}}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=output_dir, help="output directory (report, figures; the SQLite study by default)")
    p.add_argument("--storage", default=None, help="database URL of the study (default: sqlite in --out), e.g. "
                   "postgresql://user@host:5432/db (psycopg 3: pip install 'bayes-safe[postgres]'; the password from "
                   "PGPASSWORD or ~/.pgpass), or an SQLite file path")
    p.add_argument("--parallel", type=positive_int, default=None, help="trials in flight at once, each in its own process")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run trials on a Dask distributed scheduler (tcp://host:8786) instead of local processes")
    p.add_argument("--no-progress", action="store_true", help="print no line per trial")
    p.add_argument("--verbose", action="store_true", help="show Ax's own log")
    p.add_argument("--no-rerun", action="store_true",
                   help="do not re-run the best point with fresh seeds before the report names it (the report then "
                        "only compares its SEM with the study's typical SEM)")
    p.add_argument("--mlflow", nargs="?", const="", default=None, metavar="URI",
                   help="log every finished trial (parameters, each metric's mean and SEM, feasibility, timings) to "
                        "MLflow: no value: a file store in OUT/mlruns; or a directory, file: URI, "
                        "http(s)://host:port of a tracking server, sqlite:///PATH (needs pip install 'bayes-safe[mlflow]')")


def add_tune_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``tune`` (with ``video-upload`` ... and ``resume``) to a ``bayes-safe`` subparsers object."""
    tune = subparsers.add_parser("tune", help="tune alpha and reward offsets with Ax/BoTorch (trials are A/B tests)")
    sub = tune.add_subparsers(dest="tune_command", required=True)
    for name in PROBLEM_NAMES:
        p = sub.add_parser(name, help=f"start a new tuning study of the {name} problem")
        _common(p)
        _study_options(p)
        p.add_argument("--quick", action="store_true",
                       help=f"small A/B tests for a smoke run ({QUICK['n_users']:,} users, {QUICK['batches']} batches; "
                            f"{QUICK_SOBOL} Sobol trials unless --sobol)")
        p.add_argument("--users", type=positive_int, default=None, help=f"users per arm of each A/B test (default {FULL['n_users']:,})")
        p.add_argument("--batches", type=positive_int, default=None, help="batches per A/B test (the policy refits after each)")
        p.add_argument("--warmup", type=positive_int, default=None, help="size of the exploration log of the warm start")
        p.add_argument("--model-epochs", type=positive_int, default=None, help="feature-network epochs per ProbitGP refit")
        p.add_argument("--no-compare", action="store_true", help="do not also run vanilla TS in each trial (no Figure 3c TS points)")
    p = sub.add_parser("custom", help="start a tuning study of your own problem class (a bayes_safe.envs.Problem, "
                       "--problem module:Class): TS-ASC with one tuned tolerance per declared constraint")
    _common(p)
    _study_options(p)
    p.add_argument("--problem", required=True, type=import_path, metavar="MODULE:CLASS",
                   help="your problem class, imported from the current directory or sys.path (e.g. email_problem:EmailTiming)")
    p.add_argument("--param", action="append", type=key_value, default=None, metavar="KEY=VALUE",
                   help="a constructor argument of the problem class (repeat; VALUE read as JSON when it is, e.g. seed=3)")
    p.add_argument("--users", type=positive_int, default=2_000, help="units per arm of each A/B test (default 2,000)")
    p.add_argument("--batches", type=positive_int, default=4, help="batches per A/B test (the policy refits after each; default 4)")
    p.add_argument("--ridge", type=float, default=1.0, help="ridge penalty of the default Bayesian linear models, "
                   "used when the problem declares no models of its own (default 1)")
    p.add_argument("--max-violations", action="append", type=key_value, default=None, metavar="METRIC=SHARE",
                   help="also constrain the per-unit violation rate of METRIC's constraint: at most SHARE of the units "
                        "(e.g. adverse_event=0.01 adds 'adverse_event_violations <= 1', in %%; repeat; needs a problem "
                        "with expected means)")
    p.add_argument("--no-compare", action="store_true", help="do not also run vanilla TS in each trial")
    p = sub.add_parser("logged-data", help="start a tuning study whose trials are off-policy estimates from logs "
                       "(train on part of the logs, estimate value and violations on the rest)")
    _common(p)
    _study_options(p)
    p.add_argument("--source", default="synthetic",
                   help="'synthetic' (skill-routing logs), 'open-bandit' (the Open Bandit sample; `make data`), or a "
                        ".csv / .parquet file of logs (then name its columns with --column)")
    p.add_argument("--column", action="append", default=None, metavar="ARG=VALUE",
                   help="a column argument of LoggedData.from_dataframe for a file source (repeat), e.g. "
                        "action_column=action; list arguments take comma-separated names")
    p.add_argument("--rows", type=positive_int, default=None, help="rows of the synthetic logs (default 50,000)")
    p.add_argument("--method", choices=("ips", "quadratic", "minimax", "meta"), default="minimax",
                   help="training method whose hyperparameters are tuned (default minimax: eta, gamma)")
    p.add_argument("--benchmark", default="default",
                   help="replication-constraint benchmark name or JSON path (default: critical / obd-critical)")
    p.add_argument("--max-violation", type=probability, default=0.2,
                   help="default outcome constraint violation_macro <= this (default 0.2)")
    p.add_argument("--epochs", type=positive_int, default=8, help="training epochs per trial (default 8)")
    p.add_argument("--holdout", type=open_fraction, default=0.3, help="share of the logs held out for the estimates (default 0.3)")
    p = sub.add_parser("decision-log", help="tune a served TS-ASC from its decision log: each trial is TS-ASC on the "
                       "served posterior with the trial's tolerance of each declared constraint (or alpha, for a TS-ASC "
                       "built with alpha), its reward and guarded metrics estimated off-policy (self-normalised IPS) "
                       "from the log, every declared constraint checked in its own form and direction")
    _common(p)
    _study_options(p)
    p.add_argument("--log", required=True, metavar="LOG",
                   help="the decision log the service wrote: its .sqlite file, or the PostgreSQL URL "
                        "postgresql://user@host:port/db of a service or of replicas (the password from PGPASSWORD "
                        "or ~/.pgpass rather than the URL; never shown)")
    p.add_argument("--state", required=True, type=Path, metavar="STATE_DIR",
                   help="the served Decider's state directory (its TS-ASC posterior): the service's, or a "
                        "replica's; the log must be the one that state wrote (refused otherwise)")
    p.add_argument("--alpha-max", type=open_fraction, default=None,
                   help="a TS-ASC built with alpha: search alpha in [0, ALPHA_MAX] (default 0.5)")
    p.add_argument("--min-ratio", type=probability, default=None,
                   help="a TS-ASC built with alpha: outcome constraint constraint0_ratio >= this (default 0.9); a TS-ASC "
                        "that declares constraints is checked against its declared bounds instead")
    p.add_argument("--draws", type=positive_int, default=200,
                   help="posterior draws per logged decision for the trial policy's probabilities (default 200)")
    p.add_argument("--boot", type=positive_int, default=200, help="bootstrap resamples of the ratios' SEs (default 200)")
    p.add_argument("--max-unsupported", type=probability, default=0.05,
                   help="a TS-ASC that declares constraints: outcome constraint unsupported <= this, the share of a "
                        "trial's choices where the served policy gave no chance, which the log cannot estimate "
                        "(default 0.05; 1 to only report it)")
    r = sub.add_parser("resume", help="continue a stored study (after a crash, or with more --trials) and rewrite its report")
    _common(r)
    r.add_argument("--trials", type=positive_int, default=None, help="completed trials to reach (default: the stored target)")
    r.add_argument("--name", default=None, help="the study's name (default: the only study in the database)")
    r.add_argument("--trust-source", action="store_true",
                   help="read the files the stored study names (its logs, a benchmark JSON, an Open Bandit directory) "
                        "even when they lie outside the study's directory (the directory holding the SQLite study, "
                        "--out by default), and import the problem class a study of your own problem names "
                        "(module:Class: that runs its code); without it resume shows such a path or module and stops")
    r.add_argument("--problem", type=import_path, default=None, metavar="MODULE:CLASS",
                   help="confirm the stored problem class of a study of your own problem by naming it again (it must "
                        "be the same module:Class); instead of --trust-source for the import")
    r.add_argument("--source", default=None, metavar="PATH",
                   help="confirm the stored logs file by naming it again (it must be the same file); "
                        "for logs outside the study's directory, instead of --trust-source")
    return tune


def _study_options(p: argparse.ArgumentParser) -> None:
    """Options every new study takes (search space, objective, Ax, storage name, seed)."""
    p.add_argument("--trials", type=positive_int, default=30, help="completed trials to reach (default 30)")
    p.add_argument("--sobol", type=positive_int, default=None, help="Sobol initialisation trials (default 2 x parameters)")
    p.add_argument("--parameter", action="append", default=None, metavar="NAME=LOW:HIGH|NAME=A,B",
                   help="declare a tuned parameter (repeat; replaces the default search space); e.g. alpha=0:0.03, "
                        "or a choice of values, e.g. forgetting=none,0.99,adaptive; a constraint's confidence "
                        "(confidence_METRIC=0.8:0.99 or =0.9,0.99,none) given alone is added to the default space")
    p.add_argument("--objective", default=None, help="Ax objective over the trial's metrics (default: the problem's)")
    p.add_argument("--constraint", action="append", default=None, metavar="EXPR",
                   help="outcome constraint (repeat; default: the problem's); 'none' for no constraint")
    p.add_argument("--acquisition", choices=ACQUISITION_FUNCTIONS, default=ACQUISITION_FUNCTIONS[0])
    p.add_argument("--name", default=None, help="the study's name in the database (default: the problem's name)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a study already in OUT/study.sqlite (default storage only) instead of failing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicates", type=positive_int, default=None,
                   help=f"independent A/B tests per trial (default {DEFAULT_REPLICATES} for a simulated study, 1 for a study "
                        "of logs, whose replicates re-estimate the same rows and cannot shrink its SEM); the trial's SEM "
                        "is their spread, which covers re-running the learning policy (1: one run's SEM, which "
                        "understates it for a simulated study)")
    p.add_argument("--acq-restarts", type=positive_int, default=None, metavar="N",
                   help="lower the acquisition optimiser's restarts (default: Ax's, 20)")
    p.add_argument("--acq-raw-samples", type=positive_int, default=None, metavar="N",
                   help="lower the acquisition optimiser's raw samples (default: Ax's, 1024)")


def _value(mean_se, metric: str, se: bool = True) -> str:
    """``+1.23 ± 0.45 %`` for a % change, ``0.8123 ± 0.0045`` for a level."""
    m, s = mean_se
    if metric.endswith("_change"):
        return f"{m:+.2f} ± {s:.2f} %" if se else f"{m:+.2f} %"
    if metric.endswith("_violations") or "_violations_" in metric:  # a share of units, in %
        return f"{m:.2f} ± {s:.2f} %" if se else f"{m:.2f} %"
    if se and math.isfinite(s) and s > 0:  # a level: two significant digits of its SEM (0.0400 ± 0.0040)
        from .report import _decimals

        d = _decimals(s, least=0)
        return f"{m:.{d}f} ± {s:.{d}f}"
    return f"{m:.4g} ± {s:.2g}" if se else f"{m:.4g}"


def _progress_printer(study, total: int):
    obj = study.objective_name
    cons = [m for w, _, _ in study.constraints for m in w]
    names = study.parameter_names

    def fmt(metrics, m):
        return f"{m} {_value(metrics[m], m)}" if m in metrics else f"{m} n/a"

    def show(event):
        kind = event["event"]
        if kind == "tracked":
            if not event["logged"]:
                return
            line = (f"[ mlflow ] logged {len(event['logged'])} finished trial(s) the tracking store lacked "
                    f"({', '.join(map(str, event['logged']))})")
        elif kind == "completed":
            params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in event["parameters"].items() if k in names)
            best = event.get("best")
            # raw observed means: the model's answer (its probability of feasibility) comes at the end
            best_text = (f"best observed feasible: trial {best['trial']} ({_value(best['metrics'][obj], obj, se=False)})"
                         if best else "best observed feasible: none yet")
            line = (f"[{event['completed']:>3}/{total}] trial {event['trial']} ({event.get('node') or '?'}) {params} | "
                    + "  ".join(fmt(event["metrics"], m) for m in [obj, *cons])
                    + f" | sim {event['sim_seconds']:.1f} s | {best_text}")
        elif kind == "failed":
            line = f"[ failed ] trial {event['trial']}: {event['reason']}"
        elif kind == "recovered":
            line = (f"[ resume ] interrupted trials: {len(event['completed'])} had saved data (marked completed), "
                    f"{len(event['abandoned'])} abandoned; re-running {len(event['rerun'])} abandoned "
                    f"({', '.join(str(i) for i, _ in event['rerun']) or '-'})")
        else:
            return
        print(line, flush=True)

    return show


def default_ab_test(problem: str = "video-upload", quick: bool = False, *, users: int | None = None,
                    batches: int | None = None, warmup: int | None = None, model_epochs: int | None = None,
                    compare: bool = True, seed: int = 0, replicates: int = DEFAULT_REPLICATES):
    """The A/B test ``bayes-safe tune PROBLEM`` runs (``FULL`` or ``QUICK`` sizes, with overrides)."""
    from .ab_test import ABTest, make_problem

    base = dict(QUICK if quick else FULL)
    model = dict(base["model"])
    if model_epochs is not None:
        model["nn_epochs"] = model_epochs
        model["nn_min_steps"] = min(model.get("nn_min_steps", 500), 50 * model_epochs)
    prob = make_problem({"name": problem, "warmup": warmup or base["warmup"], "warmup_seed": seed, "model": model})
    arms = tuple(k for k in prob.policies if k != "ts-asc") if compare else ()
    return ABTest(problem=prob, n_users=users or base["n_users"], batches=batches or base["batches"], compare=arms,
                  replicates=replicates)


def _column_options(items) -> dict:
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--column: expected ARG=VALUE (e.g. action_column=action), got {item!r}")
        key = key.strip()
        out[key] = [v.strip() for v in value.split(",")] if key.endswith("_columns") else value.strip()
    return out


#: LoggedDataProblem's argument names -> the ``tune logged-data`` options that set them
_OPTION_OF = {"source": "--source", "options": "--column", "method": "--method", "benchmark": "--benchmark",
              "holdout": "--holdout", "max_violation": "--max-violation", "epochs": "--epochs"}


#: LoggedAlpha's argument names -> the ``tune decision-log`` options that set them
_DECISION_LOG_OPTION_OF = {"log": "--log", "state": "--state", "alpha_max": "--alpha-max", "min_ratio": "--min-ratio",
                           "num_draws": "--draws", "n_boot": "--boot", "max_unsupported": "--max-unsupported"}


def _as_option(message: str, option_of: dict[str, str] = _OPTION_OF) -> str:
    """``source: ...`` -> ``--source: ...``: a message of the Python API in the command line's words
    (``option_of`` maps argument names to options; default: ``tune logged-data``'s)."""
    head, sep, rest = message.partition(":")
    if sep and head in option_of:
        return option_of[head] + sep + rest
    return message


def check_scheduler(address: str | None, timeout: float = 5.0) -> None:
    """Raise ``ValueError`` (naming ``--scheduler``) unless a TCP connection to the Dask
    scheduler at ``address`` (``tcp://host:port`` or ``tls://...``) opens within ``timeout``
    seconds; called before a study is created or resumed, so an unreachable cluster costs no
    trial and leaves nothing behind."""
    if not address:
        return
    import socket
    from urllib.parse import urlsplit

    text = str(address)
    parts = urlsplit(text if "://" in text else "tcp://" + text)
    if parts.scheme not in ("tcp", "tls"):
        return  # inproc:// ucx:// ...: Dask checks them itself
    try:
        host, port = parts.hostname, parts.port or 8786
    except ValueError:
        raise ValueError(f"--scheduler: expected tcp://HOST:PORT, got {text!r}") from None
    if not host:
        raise ValueError(f"--scheduler: expected tcp://HOST:PORT, got {text!r}")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ValueError(f"--scheduler: cannot reach the Dask scheduler at {text} within {timeout:g} s ({reason})") from None


def _stored_files(config) -> list[tuple[str, str, str | None]]:
    """``(what, path, option that confirms it)`` of the files a stored study's problem reads."""
    problem = config.get("problem") if isinstance(config, dict) else None
    if isinstance(problem, dict) and problem.get("name") == "decision-log":
        return [("decision log", str(problem.get("log")), "--source"), ("state directory", str(problem.get("state")), None)]
    if not isinstance(problem, dict) or problem.get("name") != "logged-data":
        return []
    files = []
    source = problem.get("source")
    options = problem.get("options") if isinstance(problem.get("options"), dict) else {}
    if source not in ("synthetic", "open-bandit", None):
        files.append(("logs", str(source), "--source"))
    if source == "open-bandit" and options.get("directory"):
        files.append(("Open Bandit directory", str(options["directory"]), None))
    bench = problem.get("benchmark")
    if isinstance(bench, str) and Path(bench).suffix:
        files.append(("constraint benchmark", bench, None))
    return files


def _stored_location(raw) -> Path | str:
    """A stored study's file, resolved; a PostgreSQL log's URL as it is (stored without its password:
    ``LoggedAlpha.config``), never made a path (``postgresql:/...``)."""
    text = str(raw)
    if text.lower().startswith(("postgresql://", "postgres://")):
        from bayes_safe.online.log import LogURL

        return str(LogURL(text))
    return Path(text).expanduser().resolve()


def _inside(path: Path | str, directory: Path) -> bool:
    if not isinstance(path, Path):
        return False  # a database server's URL: never inside the study's directory
    try:
        path.relative_to(directory)
        return True
    except ValueError:
        return False


def _stored_import(config) -> str | None:
    """The ``module:Class`` a stored study of a user's own problem imports, or None."""
    problem = config.get("problem") if isinstance(config, dict) else None
    if isinstance(problem, dict) and problem.get("name") == "import":
        return str(problem.get("import"))
    return None


def check_resume_trust(props: dict, url: str, *, trust: bool = False, source: str | None = None,
                       problem: str | None = None, verb: str = "resume") -> list[str]:
    """Check the files and the code a stored study names before resuming it; return lines that show them.

    The rule for files: a file the study reads (its logs, a benchmark JSON, an Open Bandit
    directory) is read without asking only when it lies inside the study's directory (the
    directory holding the SQLite study: ``--out`` by default). Any other path, and every path of
    a study in a server database, must be confirmed: ``--trust-source``, or the logs file named
    again with ``--source`` (the same file). A received study cannot point resume at a file
    elsewhere on the machine without the user seeing the path.

    The rule for code: the problem class a study of the user's own problem stores as
    ``module:Class`` is imported (its module's code run) only when confirmed, wherever the
    module lies: ``--trust-source``, or the same class named again with ``--problem``. Nothing
    is imported here: the module is located without running it
    (``bayes_safe._problem_import.check_import_consent``), so the refusal names the file that
    would run, and says when it lies in the current directory (never imported from there unasked).

    Raises:
        ValueError: one line naming ``--source`` / ``--trust-source`` / ``--problem`` and the stored
            path or module.
    """
    from bayes_safe._problem_import import check_import_consent

    from . import storage

    lines = []
    stored_class = _stored_import(props.get("ab_test"))
    if problem is not None and stored_class is None:
        raise ValueError(f"--problem: this study imports no problem class of yours ({problem} given); drop --problem")
    if stored_class is not None:
        consent = True if trust else problem
        what = "--problem" if problem is not None and not trust else "--trust-source"
        line = check_import_consent(stored_class, consent, what=what,
                                    how=f"{verb} with --trust-source (or name it again: --problem {stored_class})")
        lines.append(f"import: {line}" + (f" (confirmed by {'--trust-source' if trust else '--problem'})"
                                          if consent else ""))

    db = storage.sqlite_path(url)
    home = db.parent.resolve() if db is not None else None
    files = _stored_files(props.get("ab_test"))
    if source is not None:
        logs = [f for f in files if f[2] == "--source"]
        if not logs:
            raise ValueError("--source: this study does not read a logs file (its source is not a file); drop --source")
        given, stored = _stored_location(source), _stored_location(logs[0][1])
        if given != stored:
            raise ValueError(f"--source: the study reads its logs from {stored}, not {given}; resume cannot change a "
                             "study's logs (give the stored path again, or start a new study)")
    for what, raw, option in files:
        path = _stored_location(raw)
        if home is not None and _inside(path, home):
            lines.append(f"{what}: {path} (inside the study's directory)")
        elif trust or (option == "--source" and source is not None):
            lines.append(f"{what}: {path} (outside the study's directory; confirmed by "
                         f"{'--trust-source' if trust else '--source'})")
        else:
            where = f"outside the study's directory {home}" if home is not None else "named by a server database"
            confirm = f"--source {path} or --trust-source" if option == "--source" else "--trust-source"
            raise ValueError(f"--trust-source: the stored study reads its {what} from {path}, {where}; check that "
                             f"path, then {verb} with {confirm}")
    return lines


def _custom_ab_test(args):
    """``tune custom``: the user's ``module:Class`` built with ``--param`` (bad input: one ``ValueError``)."""
    from bayes_safe._problem_import import load_problem

    from .ab_test import ABTest
    from .own_problem import SimulatedProblem

    params = dict(args.param or ())
    problem = load_problem(args.problem, params)
    limits = dict(args.max_violations or ())
    try:
        wrapped = SimulatedProblem(problem, ridge=args.ridge, import_path=args.problem, params=params,
                                   max_violations=limits or None)
    except (ValueError, TypeError) as exc:
        option = "--max-violations" if str(exc).startswith("max_violations") else "--problem"
        raise ValueError(f"{option}: {exc}") from None
    return ABTest(wrapped, n_users=args.users, batches=args.batches, compare=() if args.no_compare else None,
                  replicates=_replicates(args, DEFAULT_REPLICATES))


def _replicates(args, default: int) -> int:
    """``--replicates``, else ``default``: 4 for a simulated study, 1 for a study of logs (its replicates
    re-estimate the same rows: ``combine_replicates(shared_rows=True)``)."""
    return default if getattr(args, "replicates", None) is None else args.replicates


def _build_ab_test(args):
    if args.tune_command == "custom":
        return _custom_ab_test(args)
    if args.tune_command == "decision-log":
        import warnings

        from bayes_safe.online.tuning import LegacyAlphaWarning, LoggedAlpha

        from .ab_test import ABTest

        try:
            with warnings.catch_warnings():
                # a new study: --alpha-max / --min-ratio on a policy that declares constraints is an error, not
                # the legacy alpha study a stored one resumes as
                warnings.simplefilter("error", LegacyAlphaWarning)
                problem = LoggedAlpha(args.log, args.state, alpha_max=args.alpha_max, min_ratio=args.min_ratio,
                                      num_draws=args.draws, n_boot=args.boot, max_unsupported=args.max_unsupported)
        except (ValueError, TypeError, FileNotFoundError, LegacyAlphaWarning) as exc:
            raise ValueError(_as_option(" ".join(str(exc).split()), _DECISION_LOG_OPTION_OF)) from None
        return ABTest(problem, replicates=_replicates(args, 1))
    if args.tune_command == "logged-data":
        from .ab_test import ABTest
        from .logged import LoggedDataProblem

        options = _column_options(args.column)
        if args.column and args.source in ("synthetic", "open-bandit"):
            raise ValueError(f"--column: only for a file source, not --source {args.source}")
        if args.rows is not None:
            if args.source != "synthetic":
                raise ValueError("--rows: only for --source synthetic")
            options["n"] = args.rows
        if args.source == "synthetic":
            options.setdefault("seed", args.seed)
        try:
            problem = LoggedDataProblem(source=args.source, options=options, method=args.method, benchmark=args.benchmark,
                                        max_violation=args.max_violation, epochs=args.epochs, holdout=args.holdout)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise ValueError(_as_option(str(exc))) from None
        return ABTest(problem, replicates=_replicates(args, 1))
    return default_ab_test(args.tune_command, args.quick, users=args.users, batches=args.batches, warmup=args.warmup,
                           model_epochs=args.model_epochs, compare=not args.no_compare, seed=args.seed,
                           replicates=_replicates(args, DEFAULT_REPLICATES))


#: the file store of ``--mlflow`` with no value, inside ``--out``
MLFLOW_DIRNAME = "mlruns"


def _tracking_uri(args, stored: dict | None) -> tuple[str | None, str | None]:
    """The MLflow URI this run logs to (``None``: no tracking) and, for resume, a note on a
    stored URI not used. Syntax only: nothing is contacted here."""
    from .tracking import resolve_mlflow_uri

    if args.mlflow is not None:
        return resolve_mlflow_uri(args.mlflow, args.out / MLFLOW_DIRNAME, option="--mlflow"), None
    previous = (stored or {}).get("mlflow")
    if not previous:
        return None, None
    uri = str(previous)
    home = (args.out / MLFLOW_DIRNAME).resolve().as_uri()
    if uri == home or uri.startswith(home + "/"):
        return uri, None  # a file store inside the study's directory: tracked again without asking
    return None, (f"note: the study was tracked to MLflow at {uri}; this run logs nowhere unless you name it again "
                  f"(--mlflow {uri}): a stored address outside the study's directory is never used unasked")


def _open_tracker(uri: str | None):
    """``MlflowTracker`` of ``uri`` after checking it (one ``ValueError`` naming --mlflow), or ``None``."""
    if uri is None:
        return None
    from .tracking import MlflowTracker, check_mlflow_uri

    tracker = MlflowTracker(uri, check=False)  # a missing mlflow: MissingExtraError naming the extra
    check_mlflow_uri(uri, option="--mlflow")
    return tracker


def _printer_with_tracking(progress):
    """Tracking failures are shown even with --no-progress (on stderr)."""

    def show(event):
        if event["event"] == "tracking_failed":
            which = f"trial {event['trial']}" if event.get("trial") is not None else "the tracking store"
            print(f"[ mlflow ] warning: {which} not logged: {event['reason']} (the next run of the study logs it)",
                  file=sys.stderr, flush=True)
        elif progress is not None:
            progress(event)

    return show


def stored_study_name(stored: dict, name: str | None) -> str:
    """The study to open among ``stored`` (``storage.stored_studies``): ``name``, or the only one; a
    ``ValueError`` naming ``--name`` otherwise (``tune resume``, ``deploy``)."""
    if name is None:
        if len(stored) != 1:
            raise ValueError(f"--name: the database holds several studies ({', '.join(sorted(stored))}); name one")
        return next(iter(stored))
    if name not in stored:
        raise ValueError(f"--name: no study named {name!r} in the database (found: {', '.join(sorted(stored))})")
    return name


def run_tune(args) -> int:
    """Run ``bayes-safe tune ...`` from parsed arguments. Bad input raises ``ValueError``."""
    from . import storage
    from .ranges import parse_parameter
    from .report import write_report
    from .study import InfrastructureError, Study

    check_output_dir(args.out)
    if args.storage is not None:
        # a server that does not answer: one line naming --storage and host:port, before any work
        storage.check_server(storage.resolve_url(args.storage, args.out), what="--storage")
    start = time.perf_counter()
    if args.tune_command == "resume":
        url = storage.resolve_url(args.storage, args.out)
        # read-only first: a missing database, a foreign SQLite file, an untrusted stored path
        # all stop here, before Ax creates a table or the study writes anything
        stored = storage.stored_studies(url, what="--storage" if args.storage is not None else "--out")
        name = stored_study_name(stored, args.name)
        if isinstance(stored[name], dict) and stored[name].get("ab_test", {}) is None:
            raise ValueError(f"--out: study {name!r} was made in Python with a problem (or policy factory) that cannot "
                             "be rebuilt by name, e.g. a class defined in a script or notebook; define the class in a "
                             "module and start the study again, or resume it in Python: Study.load(..., ab_test=...)")
        shown = check_resume_trust(stored[name], url, trust=args.trust_source, source=args.source, problem=args.problem)
        check_scheduler(args.scheduler)
        mlflow_uri, mlflow_note = _tracking_uri(args, stored[name] if isinstance(stored[name], dict) else None)
        tracker = _open_tracker(mlflow_uri)
        for line in shown:
            print(line, flush=True)
        if mlflow_note:
            print(mlflow_note, flush=True)
        # check_resume_trust passed: a stored problem class is confirmed (or there is none)
        study = Study.load(url, name=name, verbose=args.verbose, tracker=tracker, trust_source=True)
        own = getattr(study.ab_test.problem, "import_path", None)
        if own:  # a user's problem class, re-imported from the stored module:Class: show what was imported
            module = sys.modules.get(own.partition(":")[0])
            print(f"problem class: {own} from {getattr(module, '__file__', None) or '?'} "
                  f"(parameters {study.ab_test.problem.params or {}})", flush=True)
        if callable(getattr(study.ab_test.problem, "models_text", None)):
            print(study.ab_test.problem.models_text().replace("`", ""), flush=True)
        trials = args.trials or study.properties.get("target_trials") or study.counts().get("COMPLETED", 0)
        if not trials:  # a study stored before its target was (killed in its first moments by an older version)
            raise ValueError("--trials: the study has no stored target and no completed trial; give the number of "
                             "completed trials to reach, e.g. --trials 20")
        # the study's own parallelism (stored as each run starts, so it survives a crash) unless --parallel
        parallel = (args.parallel or study.properties.get("parallel")
                    or (study.properties.get("sessions") or [{}])[-1].get("parallel", 1))
        print(f"resuming study {study.name!r} ({storage.display_url(url)}): " + ", ".join(
            f"{v} {k.lower()}" for k, v in sorted(study.counts().items())) + f"; target {trials} completed trials", flush=True)
    else:
        optimizer = {k: v for k, v in (("num_restarts", args.acq_restarts), ("raw_samples", args.acq_raw_samples))
                     if v is not None} or None
        if optimizer and optimizer.get("num_restarts", 20) > optimizer.get("raw_samples", 1024):
            raise ValueError(f"--acq-restarts: expected at most --acq-raw-samples ({optimizer.get('raw_samples', 1024)}), "
                             f"got {optimizer['num_restarts']}")
        ab_test = _build_ab_test(args)
        check_scheduler(args.scheduler)
        mlflow_uri, _ = _tracking_uri(args, None)
        tracker = _open_tracker(mlflow_uri)
        params = None
        if args.parameter:
            params = [parse_parameter(text) for text in args.parameter]
        constraints = args.constraint
        if constraints is not None and [c.strip().lower() for c in constraints] == ["none"]:
            constraints = []
        url = storage.resolve_url(args.storage, args.out)
        if args.overwrite:
            if args.storage is not None:
                raise ValueError("--overwrite: only for the default SQLite study in --out (delete a server study yourself)")
            if (args.out / storage.DEFAULT_FILENAME).exists():
                with storage.study_lock(url):  # never under a running study
                    for suffix in ("", "-journal", "-wal", "-shm"):
                        (args.out / (storage.DEFAULT_FILENAME + suffix)).unlink(missing_ok=True)
                    _remove_default_mlruns(args.out)
        created = not args.out.exists()
        if args.storage is None:
            args.out.mkdir(parents=True, exist_ok=True)
        sobol = args.sobol
        if sobol is None and getattr(args, "quick", False):
            sobol = QUICK_SOBOL
        try:
            study = Study(ab_test, name=args.name, storage=url, parameters=params, objective=args.objective,
                          outcome_constraints=constraints, sobol_trials=sobol, seed=args.seed,
                          acquisition=args.acquisition, optimizer=optimizer, verbose=args.verbose, tracker=tracker)
        except BaseException:
            if created and args.out.is_dir() and not any(args.out.iterdir()):
                args.out.rmdir()  # bad input leaves nothing behind
            raise
        trials, parallel = args.trials, args.parallel or 1
        # stored before the power pilot: a run killed during the pilot resumes with its own target and parallelism
        study.properties["target_trials"] = trials
        study.properties["parallel"] = parallel
        study._save_properties()
        method = getattr(ab_test.problem, "method", None)
        what = (f"trials estimated from the logs ({method + ' training' if method else 'off-policy'})"
                if ab_test.problem.offline else
                f"A/B tests of {ab_test.n_users:,} users per arm in {ab_test.batches} batches"
                + (", vanilla TS compared" if ab_test.compare else ""))
        what += f"; {ab_test.replicates} replicate{'s' if ab_test.replicates > 1 else ''} per trial"
        print(f"study {study.name!r} in {storage.display_url(url)}: {trials} trials, {parallel} in flight, {what}",
              flush=True)
        if callable(getattr(ab_test.problem, "models_text", None)):
            print(ab_test.problem.models_text().replace("`", ""), flush=True)
        for row in (study.properties.get("range_pilot") or {}).get("constraints", []):
            rate = row.get("rate_at_strict_end")
            print(f"range pilot: {row['parameter']} searched in [{row['range'][0]:.4g}, {row['range'][1]:.4g}] (default "
                  f"[{row['default'][0]:.4g}, {row['default'][1]:.4g}]); "
                  + (f"{row['violation']} {rate[0]:.3g} % at the strict end against the limit {row['limit']:g} %"
                     if rate else f"{row['violation']} not measured")
                  + ("" if row.get("reached") else ": the limit is NOT reached even there"), flush=True)
        n_sobol = study.properties.get("sobol_trials")
        if n_sobol is not None and n_sobol >= trials:
            print(f"note: all {trials} trials are Sobol (--sobol {n_sobol}); the study never reaches BoTorch "
                  "(lower --sobol or raise --trials)", flush=True)

    from bayes_safe.io import clear_stale_scratch

    with contextlib.suppress(OSError):  # a killed run's report scratch beside --out: gone before this run works
        clear_stale_scratch(args.out)
    if tracker is not None:
        study.properties["mlflow"] = tracker.uri  # saved as the run starts; resume tracks there again
        print(f"mlflow: every finished trial is logged to {tracker.uri} (experiment {study.name!r}, runs tagged "
              f"bayes_safe.study_uid={study.uid})", flush=True)
    if args.tune_command == "resume":
        for row in (study.properties.get("power") or {}).get("constraints", []):
            if row.get("warn"):
                print("power: " + row["text"], flush=True)
    progress = _printer_with_tracking(None if args.no_progress else _progress_printer(study, trials))
    try:
        if args.tune_command != "resume" and study.constraints:
            print("power (a pilot trial at the centre of the search space, before the study):", flush=True)
            for row in study.check_power()["constraints"]:
                print("  " + row["text"], flush=True)
        summary = study.run(trials=trials, parallel=parallel, scheduler=args.scheduler, progress=progress)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: Study.run raises StudyInterrupted (exit 128 + signal)
        resume = f"bayes-safe tune resume --out {args.out}" + (f" --storage {storage.display_url(args.storage)}"
                                                                if args.storage else "")
        print(f"\n{exc or 'interrupted'}; continue with: {resume}", file=sys.stderr)
        status = getattr(exc, "exit_status", 130)
        if status != 130:
            # SIGTERM / SIGHUP ask the process to end: the study is saved and its workers are gone, so skip
            # the interpreter's teardown (2-4 s of freeing torch and Ax modules, measured on 2 busy cores)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status
    except InfrastructureError as exc:  # the Dask scheduler was lost: no trial failed, exit 75 (EX_TEMPFAIL)
        resume = f"bayes-safe tune resume --out {args.out}" + (f" --storage {storage.display_url(args.storage)}"
                                                                if args.storage else "")
        print(f"bayes-safe tune: error: {exc}; continue with: {resume} [--scheduler ADDRESS]", file=sys.stderr)
        return 75
    except RuntimeError as exc:
        print(f"bayes-safe tune: error: {exc}", file=sys.stderr)
        return 1
    result = write_report(study, args.out, rerun=not args.no_rerun)
    best = result["best"]
    print(f"done in {time.perf_counter() - start:.0f} s: {summary['trials_completed']} trials this run; Ax "
          f"{summary['ax_seconds_per_trial']:.2f} s per trial, simulation {summary['sim_seconds_per_trial']:.1f} s per trial")
    if best is not None and "parameters" not in best:
        # no trial is confidently feasible: no recommendation, the closest trials ranked (Study.best)
        top = best["closest_infeasible"][0]
        misses = "; ".join(f"{m['constraint']}: " + ("n/a" if m["shortfall"] is None else
                                                     f"observed {m['observed']:.4g}, misses by {m['shortfall']:.3g}"
                                                     if m["shortfall"] > 0 else f"observed {m['observed']:.4g}, inside")
                           for m in top["misses"])
        print(f"no trial confidently feasible (P >= {best['confidence']:g}): recommendation: {best['recommendation']}"
              + (" (" + " ".join(f"{k}={v:.4g}" for k, v in best["served_setting"].items()) + ")"
                 if best.get("served_setting") else "")
              + f" | closest (safest first, ranked in best.json under closest_infeasible): trial {top['trial']} "
              f"({misses}; log10 P(feasible) {top['log_p_feasible'] / math.log(10):.4g})")
        for u in result.get("unreachable") or []:
            print(f"limit looks unreachable in the search space: {u['constraint']}: the trial nearest to it ({u['trial']}) "
                  f"misses it by {u['shortfall']:.3g}" + (f" ({u['shortfall'] / u['se']:.3g} SE)" if u["se"] else "")
                  + " (see report.md)")
    elif best is not None:
        obj = study.objective_name
        label = "best feasible"
        chance = (f" | P(feasible) {100 * best['p_feasible']:.0f} %" if study.constraints else "")
        edge = f" | on a bound: {'; '.join(best['on_bounds'])}" if best.get("on_bounds") else ""
        print(f"{label} (model): trial {best['trial']} " + " ".join(f"{k}={v:.4g}" for k, v in best["parameters"].items())
              + f" | {obj} predicted {_value(best['predicted'][obj], obj, se=False)}, observed "
              f"{_value(best['observed'][obj], obj)}{chance}{edge}")
        for b in best.get("policy_bounds") or []:
            print(f"  {b['declared']} (declared); the recommended setting's policy bound {b['policy_bound']:.4g}"
                  + (" x baseline" if b["relative"] else "") + ("" if b["confidence"] is None else
                                                                f" with P >= {b['confidence']:g}"))
        rerun = result.get("rerun")
        if rerun and obj in rerun["metrics"]:
            print(f"re-run of trial {best['trial']} with fresh seeds ({rerun['replicates']} replicates): {obj} "
                  f"{_value(rerun['metrics'][obj], obj)} (the trial: {_value(best['observed'][obj], obj)})"
                  + ("" if rerun.get("feasible") is None else
                     f" | meets every outcome constraint: {'yes' if rerun['feasible'] else 'no'}"))
        check = result.get("sem_check")
        if check and check.get("small"):
            print(f"warning: the chosen trial's SEM of {check['metric']} is {check['ratio']:.2f} x the study's median "
                  "(below a third): its estimate is less certain than its SEM says (see report.md)")
    else:
        print("best point: none (no model; see report.md)")
    for metric, res in (result.get("cv") or {}).items():
        if res.get("ok") is False:
            print(f"model check: {metric}: {res['verdict']}")
    print(f"wrote {args.out}/report.md, " + ", ".join(result["figures"] + ["trials.csv", "best.json", "study.json"]))
    if tracker is not None:
        missing = sorted(study.tracking["failed"])
        print(f"mlflow: {len(study.tracking['logged'])} trial(s) logged this run to {tracker.uri}"
              + (f"; NOT logged: trials {', '.join(map(str, missing))} (resume with --mlflow to log them)" if missing else ""))
        tracker.close()
    return 0


def _remove_default_mlruns(out: Path) -> None:
    """``--overwrite``: the replaced study's MLflow file store in ``OUT/mlruns`` goes with it."""
    import shutil

    from .tracking import is_mlflow_file_store

    path = out / MLFLOW_DIRNAME
    if path.is_dir() and not path.is_symlink() and is_mlflow_file_store(path):
        shutil.rmtree(path)
