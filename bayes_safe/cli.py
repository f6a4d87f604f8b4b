"""The ``bayes-safe`` command line.

    bayes-safe simulate --problem daulton2019 --policy ts --replications 100 --horizon 2000 --seed 0 --out DIR
    bayes-safe diagnose DIR
    bayes-safe study list | run NAME --out DIR
    bayes-safe serve STATE_DIR [--host 127.0.0.1] [--port 8080] [--log PATH] [--snapshot-every SECONDS]
        [--read-timeout SECONDS] [--max-bytes-in-flight N] [--limit-concurrency N] [--timeout-keep-alive SECONDS]
    bayes-safe feedback STATE_DIR --from outcomes.csv|outcomes.parquet [--log PATH]
    bayes-safe feedback [STATE_DIR] --from outcomes.csv|outcomes.parquet --url URL [--token-file PATH] [--chunk-rows N]
    bayes-safe tune ...            (bayes_safe.tuning.cli)

Building the parser imports nothing heavy (no torch, no Ax): ``bayes-safe --help`` and
``bayes-safe study list`` take a fraction of a second. The names the parser offers are light
copies of the registries (``PROBLEM_NAMES``, ``POLICY_NAMES``; tests/test_cli_startup.py checks
that they equal ``bayes_safe.envs.PROBLEMS`` and ``bayes_safe.factory.POLICIES``); each
subcommand imports what it runs. Argument types shared with ``tune`` live in
``bayes_safe._cli_args``.

Failures: one the user can fix (bad input, ``--out`` under a file, a corrupt model file, a full
disk) is one line ``bayes-safe CMD: error: ...`` and status 2; any other is one line
``bayes-safe CMD: internal error: ...`` and status 1 (``--debug`` shows the traceback). ``--out``
is checked before any work, and replaced as a whole only when the run succeeds
(``bayes_safe.io.atomic_output_dir(..., replace=True)``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import pathlib
import re
import sys
import time
import traceback

from ._cli_args import (
    AdaptiveSettings,
    OneLineParser,
    existing_dir,
    forgetting_arg,
    import_path,
    key_value,
    metric_lag,
    output_dir,
    positive_float,
    positive_int,
    probability_below_one,
)
from ._console import console_logging
from ._extras import MissingExtraError

__all__ = ["POLICY_NAMES", "PROBLEM_NAMES", "UsageError", "main"]

#: the names of ``bayes_safe.envs.PROBLEMS`` (sorted), without importing torch
PROBLEM_NAMES = ("daulton2019", "daulton2019-abrupt", "daulton2019-rotating", "kazerouni2017",
                 "kazerouni2017-neurips", "kazerouni2017-neurips-abrupt", "kazerouni2017-neurips-rotating")
#: ``bayes_safe.factory.POLICIES``, without importing torch
POLICY_NAMES = ("ts", "ts-asc", "linucb", "greedy", "random", "lucb", "clucb", "clucb2-asc-c", "clucb2-asc-i")


_DEBUG_HELP = "on an unexpected error, show the Python traceback"


def _add_debug(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: absent here, the top-level `bayes-safe --debug CMD` value stands
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def _problem_arg(text: str) -> str:
    """``--problem``: a built-in problem's name, or ``module:Class`` (checked for its form; imported later)."""
    if ":" not in text:
        if text in PROBLEM_NAMES:
            return text
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(PROBLEM_NAMES)}, "
                                         "or your own problem class as module:Class)")
    return import_path(text)


def _port(text: str) -> int:
    """``--port``: a TCP port in [0, 65535] (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="bayes-safe", description="Safe decision-making with Bayesian posteriors.")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run a policy on a simulated problem and write its trace")
    sim.add_argument("--problem", required=True, type=_problem_arg, metavar="NAME|MODULE:CLASS",
                     help=f"a problem name ({', '.join(PROBLEM_NAMES)}) or your own problem class "
                          "(a bayes_safe.envs.Problem) as module:Class, imported from the current directory")
    sim.add_argument("--param", action="append", type=key_value, default=None, metavar="KEY=VALUE",
                     help="a constructor argument of a --problem module:Class (repeat; VALUE read as JSON when it is)")
    sim.add_argument("--policy", required=True, choices=POLICY_NAMES, help="policy name")
    sim.add_argument("--replications", type=positive_int, default=100)
    sim.add_argument("--horizon", type=positive_int, default=2000)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--alpha", type=probability_below_one, default=None,
                     help="constraint level in [0, 1) (problems with constraints)")
    sim.add_argument("--ridge", type=positive_float, default=None,
                     help="ridge penalty of the Bayesian linear models: prior N(0, noise^2 / RIDGE I) "
                          "(default: a built-in problem's own prior, the one its parameters are drawn from; "
                          "1 for a --problem module:Class; a class that declares its own models with "
                          "models(replications) runs those, and --ridge is then an error)")
    sim.add_argument("--forgetting", type=forgetting_arg, default=None, metavar="FACTOR|adaptive[:KEY=VALUE,...]",
                     help="forgetting of the ridge models (ts, greedy, ts-asc): a factor in (0, 1] per update "
                          "(stabilised rule), or 'adaptive' (restart from the prior when a change is detected), "
                          "with the change test's settings as adaptive:KEY=VALUE,... (outcomes=gaussian|binary|auto, "
                          "false_alarm_rate, odds_ratio, threshold, drift, keep, warmup, warmup_events; e.g. "
                          "adaptive:outcomes=binary,false_alarm_rate=1e-4 for 0/1 outcomes); default none. A "
                          "problem that declares its own models sets theirs")
    sim.add_argument("--delay", action="append", type=metric_lag, default=None, metavar="METRIC=STEPS",
                     help="learn a metric's outcomes STEPS steps after their decision (repeat per metric; 'reward' "
                          "names the reward): what a late harm signal costs (simulate(..., delays=...))")
    sim.add_argument("--device", default=None, metavar="DEVICE",
                     help="where a built-in problem, its models and the run live: 'cpu' (default), 'cuda', 'cuda:1' "
                          "(issue 46; off the CPU the run's random streams are computed on the device)")
    sim.add_argument("--instances", choices=["generator", "counter"], default=None,
                     help="how a built-in linear problem draws its replications' instances: 'generator' (default: "
                          "each replication's own generator, the numbers of earlier releases) or 'counter' (all at "
                          "once on --device: a million replications in about a second on a GPU)")
    sim.add_argument("--out", required=True, type=output_dir, help="output directory")
    sim.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_debug(sim)

    diag = sub.add_parser("diagnose", help="posterior diagnostics of a run's saved models")
    diag.add_argument("run_dir", type=existing_dir, help="a directory written by `simulate` or a study")
    diag.add_argument("--draws", type=positive_int, default=500, help="exact draws per conjugate model")
    diag.add_argument("--allow-imports", action="store_true",
                      help="import the custom prior functions the saved models name (module:function); "
                           "only for runs whose code you trust")
    _add_debug(diag)

    study = sub.add_parser("study", help="reproductions of the papers' experiments")
    study_sub = study.add_subparsers(dest="study_command", required=True)
    study_sub.add_parser("list", help="list the available studies")
    show = study_sub.add_parser("show", help="where a served state came from (its study, trial and parameters), "
                                             "or a tuning study's recommendation")
    show.add_argument("path", type=existing_dir, metavar="PATH",
                      help="a state directory (written by bayes-safe deploy or Decider.save) or a tuning study's --out")

    dep = sub.add_parser("deploy", help="build a tuning study's recommended policy into a state for bayes-safe serve "
                                        "(needs pip install 'bayes-safe[tune]')")
    dep.add_argument("study_dir", type=pathlib.Path, metavar="STUDY_DIR", help="the study's --out (study.sqlite, best.json)")
    dep.add_argument("state_dir", type=pathlib.Path, metavar="STATE_DIR", help="the state directory to write (a new one)")
    dep.add_argument("--trial", type=int, default=None,
                     help="deploy this completed trial instead of the recommendation (needed when the study "
                          "recommends keeping the baseline)")
    dep.add_argument("--storage", default=None, help="the study's database when it is not STUDY_DIR/study.sqlite")
    dep.add_argument("--name", default=None, help="the study's name when the database holds several")
    dep.add_argument("--trust-source", action="store_true",
                     help="import the problem class a study of your own problem names (module:Class)")
    dep.add_argument("--log", default=None, help="a decision log for the new state (a file or postgresql://...)")
    dep.add_argument("--seed", type=int, default=0, help="the Decider's seed (default 0)")
    dep.add_argument("--num-draws", type=int, default=200, help="the Decider's draws per propensity (default 200)")
    dep.add_argument("--overwrite", action="store_true", help="replace STATE_DIR if it exists")
    _add_debug(dep)
    run = study_sub.add_parser("run", help="run a study")
    run.add_argument("name", help="study name (see `bayes-safe study list`)")
    run.add_argument("--out", required=True, type=output_dir, help="output directory")
    run.add_argument("--quick", action="store_true", help="a small version for smoke tests (< 2 minutes)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", default=None, metavar="DEVICE",
                     help="run the study's simulations on this device ('cuda', 'cuda:1'; studies that support it: "
                          "ts-asc-synthetic); default the CPU")
    _add_debug(run)

    srv = sub.add_parser("serve", help="serve a saved Decider over HTTP (needs pip install 'bayes-safe[serve]')")
    srv.add_argument("state_dir", type=existing_dir, metavar="STATE_DIR",
                     help="a directory written by Decider.save; snapshots replace it")
    srv.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=_port, default=8080, help="the TCP port (default 8080; 0: a free one, printed)")
    srv.add_argument("--log", default=None, metavar="PATH",
                     help="the decision log: a SQLite file (default STATE_DIR.log.sqlite beside STATE_DIR) or a "
                          "PostgreSQL URL postgresql://user@host:port/db (the postgres extra)")
    srv.add_argument("--snapshot-every", type=positive_float, default=60.0, metavar="SECONDS",
                     help="save the Decider to STATE_DIR this often when it changed (default 60), and on shutdown")
    srv.add_argument("--token-file", default=None, metavar="PATH",
                     help="bearer tokens and their roles, one 'TOKEN ROLE[,ROLE...]' a line (roles decide, feedback, "
                          "read, all; default: the file $BAYES_SAFE_TOKEN_FILE names; without tokens only a loopback "
                          "--host is served; docs/security.md)")
    srv.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                     help="a Host name clients may use besides localhost, 127.0.0.1, [::1] and --host (a reverse "
                          "proxy's name); repeatable")
    srv.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                     help="a web page origin (https://app.example.com) whose requests are served; repeatable "
                          "(default none: any request with an Origin header is refused)")
    srv.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, metavar="N",
                     help="refuse request bodies over N bytes (413; default 1048576)")
    srv.add_argument("--max-candidates", type=positive_int, default=1000, metavar="N",
                     help="refuse a /decide with more than N candidate actions (413; default 1000)")
    srv.add_argument("--max-feedback-items", type=positive_int, default=10_000, metavar="N",
                     help="refuse a /feedback list of more than N items (413; default 10000)")
    srv.add_argument("--allow-imports", action="store_true",
                     help="import the prior functions the saved models name (module:function, e.g. a Langevin "
                          "model's callable Pyro prior); this runs that module's code: only for states you trust")
    srv.add_argument("--replica", action="store_true",
                     help="one of several processes serving STATE_DIR from one PostgreSQL --log: decisions and "
                          "feedback at any replica, every replica learning every logged feedback (docs/replicas.md)")
    srv.add_argument("--sync-every", type=positive_float, default=1.0, metavar="SECONDS",
                     help="(--replica) learn the feedback other replicas logged this often (default 1)")
    # the defaults of bayes_safe.online.serve (READ_TIMEOUT, ...), written here so the parser imports nothing
    srv.add_argument("--read-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                     help="answer 408 and close a request whose body is not complete within SECONDS (default 10)")
    srv.add_argument("--max-bytes-in-flight", type=positive_int, default=64 << 20, metavar="N",
                     help="answer 503 to a body that would push the bytes of all bodies being read past N "
                          "(default 67108864)")
    srv.add_argument("--limit-concurrency", type=positive_int, default=1000, metavar="N",
                     help="answer 503 beyond N open connections and tasks (default 1000)")
    srv.add_argument("--timeout-keep-alive", type=positive_float, default=5.0, metavar="SECONDS",
                     help="close a connection idle SECONDS between requests (default 5)")
    _add_debug(srv)

    fb = sub.add_parser("feedback", help="apply a table of outcomes (CSV or Parquet, joined on decision ids) to a "
                                         "served Decider's state and log, all or nothing, idempotent")
    fb.add_argument("state_dir", type=existing_dir, metavar="STATE_DIR", nargs="?", default=None,
                    help="a directory written by Decider.save (required without --url; with --url optional and never "
                         "loaded: only its policy.json is read, for the names of the table's metric columns)")
    fb.add_argument("--from", dest="source", required=True, metavar="FILE",
                    help="the outcomes: a .csv or .parquet table with columns decision_id, reward and one per "
                         "constraint metric (the policy's metric_names after the reward, else constraint0, ...; "
                         "or one 'constraints' column of JSON lists); other columns are ignored")
    fb.add_argument("--log", default=None, metavar="PATH",
                    help="the decision log: a SQLite file (default STATE_DIR.log.sqlite beside STATE_DIR) or a "
                         "PostgreSQL URL postgresql://user@host:port/db")
    fb.add_argument("--url", default=None, metavar="URL",
                    help="send the table to the running `bayes-safe serve` (or a replica) at URL instead, in POST "
                         "/feedback chunks each applied all or nothing, without loading any state; without it, a "
                         "state being served is refused")
    fb.add_argument("--chunk-rows", type=positive_int, default=None, metavar="N",
                    help="with --url: rows per request (default 1000; the service takes at most --max-feedback-items "
                         "and --max-body-bytes per request)")
    fb.add_argument("--token-file", default=None, metavar="PATH",
                    help="with --url: the token to send (a file holding it, or the service's token file: its first "
                         "token with the feedback role); default $BAYES_SAFE_TOKEN, else the file $BAYES_SAFE_TOKEN_FILE "
                         "names")
    _add_debug(fb)

    try:
        from bayes_safe.tuning.cli import add_tune_parser
    except MissingExtraError as exc:  # a core install: `tune` says which extra to install
        # no options of its own (prefix "+"): whatever follows, `--help` included, ends in that message
        tune = sub.add_parser("tune", add_help=False, prefix_chars="+",
                              help="tune alpha and reward offsets with Ax/BoTorch (needs pip install 'bayes-safe[tune]')")
        tune.add_argument("arguments", nargs="*")
        tune.set_defaults(missing_extra=str(exc))
    else:
        add_tune_parser(sub)
    return parser


class UsageError(Exception):
    """A command-line failure for the user to fix: ``bayes-safe CMD: error: MESSAGE``, status 2."""


#: errno values of writes that fail for a reason outside the program (full disk, quota, file-size limit, read-only)
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _os_errno(exc: BaseException) -> int | None:
    """The errno behind ``exc`` (an ``OSError``, one it was raised from, or a Rust writer's
    ``(os error N)`` such as safetensors'), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno
        match = _RUST_OS_ERROR.search(str(exc))
        if match:
            return int(match.group(1))
        exc = exc.__cause__ or exc.__context__
    return None


def _reason(exc: BaseException) -> str:
    """What went wrong, for one line: an ``OSError``'s text without ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    number = _os_errno(exc)
    if number is not None and not isinstance(exc, OSError):
        return os.strerror(number)
    return str(exc)


@contextlib.contextmanager
def _writing(out, option: str = "--out", errnos=None):
    """Turn a failed write into ``option: cannot write OUT: REASON`` (``errnos``: only these; None: any)."""
    try:
        yield
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as exc:
        number = _os_errno(exc)
        if number is None or (errnos is not None and number not in errnos):
            raise
        own = isinstance(exc, OSError) and exc.strerror and exc.strerror != os.strerror(number)
        if own:  # a message of bayes_safe.io's checks: it names the path and what is short
            raise UsageError(f"{option}: {exc.strerror}") from exc
        raise UsageError(f"{option}: cannot write {out}: {os.strerror(number)}") from exc


def _trace_bytes(horizon: int, replications: int, metrics: int, constraints: int = 1) -> int:
    """About the size of a trace's NetCDF file: per step and replication, 5 int64/float64
    values, 3 per metric, a violation byte and one per constraint."""
    return horizon * replications * (5 * 8 + 3 * 8 * metrics + 1 + constraints) + 20_000


def _model_descriptions(policy, metric_names: list[str]) -> dict[str, str]:
    """``{metric: "BayesianLinear (conjugate NIG)", ...}``: the model the policy runs for each metric it
    learns (``bayes_safe.factory.describe_model``); roles that name no metric keep their role."""
    from .factory import describe_model

    learned = list(getattr(policy, "metric_names", None) or metric_names)
    out = {}
    for role, model in dict(policy.models()).items():
        key = role
        if role == "reward":
            key = learned[0]
        elif role.startswith("constraint") and role[len("constraint"):].isdigit():
            j = 1 + int(role[len("constraint"):])
            key = learned[j] if j < len(learned) else role
        out[key] = describe_model(model)
    return out


def _models_line(source: str, models: dict[str, str], env) -> str:
    """What the run's models were and where they came from, for the printed output."""
    listed = ", ".join(f"{metric} {text}" for metric, text in models.items())
    if source == "problem":
        return f"models: the problem's own ({type(env).__name__}.models): {listed}"
    if source == "ridge":
        return f"models: the ridge default, Bayesian linear with known noise (the problem declares no models): {listed}"
    return "models: none (the policy learns nothing)"


def _violation_lines(info: dict) -> list[str]:
    """One printed line per declared constraint: its violation rate and the baseline's part in it."""
    lines = []
    for entry in info.get("constraints", ()):
        rate = entry.get("violation_rate")
        if rate is None:
            lines.append(f"violations of {entry['constraint']}: unavailable (the problem gives no means)")
            continue
        share = entry.get("baseline_share")
        own = entry.get("baseline_violation_rate_when_played")
        text = f"violations of {entry['constraint']}: {100 * rate:.1f} % of plays"
        if entry.get("violations_fallback"):  # how many of them the fallback played (issue 39)
            text += f" ({entry['violations_fallback']} of {entry['violations']} fallback plays)"
        if entry.get("form") == "relative":  # the baseline's plays cannot break a bound relative to themselves
            lines.append(text)
            continue
        if share is not None:
            text += f", {100 * share:.1f} % of them plays of the baseline"
        if own is not None:
            text += f" (the baseline broke it in {100 * own:.1f} % of its plays)"
        lines.append(text)
    return lines


def _fallback_lines(info: dict) -> list[str]:
    """The fallback's share of the plays (summary's ``fallback``): overall and in the last quarter,
    then per guard the share of plays it bound; nothing when the policy cannot fall back."""
    fb = info.get("fallback")
    if not fb:
        return []
    lines = [(f"fallback played in {100 * fb['fallback_rate']:.1f} % of plays ({fb['fallbacks']}; last quarter "
              f"{100 * fb['fallback_rate_late']:.1f} %): no action was allowed")]
    for g in fb["guards"]:
        lines.append(f"  bound by {g['constraint']}: {100 * g['fallback_rate']:.1f} % of plays "
                     f"(last quarter {100 * g['fallback_rate_late']:.1f} %)")
    return lines


def _chance_summary(trace) -> dict:
    """summary.json's ``chance_calibration`` (``bayes_safe.diagnostics.chance_calibration``, reliability
    tables included) and the printed lines (``adverse_event <= 0.05 with P >= 0.95: claimed >= 0.95 safe
    (mean 0.98), realised 0.90 [0.88, 0.92] ...``); empty without chance constraints or without means."""
    if getattr(trace, "chance_claims", None) is None or not trace.chance_claims.get("truth_available", True):
        return {}
    from .diagnostics.chance import chance_calibration, format_chance_calibration

    rows = chance_calibration(trace)
    return {"chance_calibration": rows, "chance_calibration_lines": format_chance_calibration(rows)}


def _simulate(args) -> int:
    from . import plots
    from .diagnostics import save_models
    from .envs import make_problem
    from .factory import make_policy
    from .io import atomic_output_dir, atomic_write_json, check_free_space
    from .metrics import mean_and_sem, summary
    from .simulation import simulate

    device = _device_arg(args.device)
    if isinstance(args.forgetting, AdaptiveSettings):  # adaptive:KEY=VALUE,...: the change test's own checks
        from .models.change_detection import AdaptiveForgetting

        try:
            args.forgetting = AdaptiveForgetting(**args.forgetting)
        except ValueError as err:
            raise UsageError(f"--forgetting: {err}") from None
    if ":" in args.problem:  # the user's own problem class
        for flag in ("device", "instances"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag}: only for a built-in problem; your problem class makes its own tensors "
                                 f"(give it a constructor argument with --param)")
        env, policy, source = _own_problem(args)
        num_metrics = len(env.metric_names)
        metric_names = [str(n) for n in env.metric_names]
    else:
        if args.param:
            raise UsageError("--param: only for a --problem given as module:Class")
        kwargs = {"replications": args.replications, "seed": args.seed}
        if args.alpha is not None and args.problem.startswith("daulton2019"):
            kwargs["alpha"] = args.alpha
        for flag, value in (("device", device), ("instances", args.instances)):
            if value is not None:
                if args.problem not in _DEVICE_PROBLEMS:
                    raise UsageError(f"--{flag}: problem {args.problem!r} is built on the CPU only; --{flag} is for "
                                     f"the linear problems ({', '.join(_DEVICE_PROBLEMS)})")
                kwargs[flag] = value
        # the sizes from a one-replication copy: the real problem allocates [R, ...] tensors as it is built
        probe = make_problem(args.problem, **{**kwargs, "replications": 1})
        _check_memory(args, probe.num_arms, probe.dim, probe.num_metrics, len(getattr(probe, "constraints", ()) or ()))
        env = make_problem(args.problem, **kwargs)
        try:
            policy = make_policy(args.policy, env, ridge=args.ridge, alpha=args.alpha, forgetting=args.forgetting)
        except ValueError as err:
            if not str(err).startswith("forgetting:"):
                raise
            raise UsageError(f"--{err}") from None
        num_metrics = env.num_metrics
        metric_names = [str(n) for n in env.metric_names]
        source = "ridge" if policy.models() else "none"
    delays = None
    if args.delay:
        from .simulation import _check_delays

        delays = dict(args.delay)
        if len(delays) != len(args.delay):
            raise UsageError(f"--delay: a metric given twice ({[k for k, _ in args.delay]}); give each once")
        try:  # before any work: an unknown name or a policy that cannot take it is named now
            _check_delays(delays, metric_names, str(getattr(env, "name", None) or args.problem), args.horizon)
        except (TypeError, ValueError) as err:
            raise UsageError("--delay" + str(err).removeprefix("delays")) from None
    models = _model_descriptions(policy, metric_names)
    trace_bytes = _trace_bytes(args.horizon, args.replications, num_metrics, len(getattr(env, "constraints", ()) or ()))
    _clear_leftovers(args.out)  # a killed run's scratch directories, before this run's work
    steps_bytes = args.horizon * 120
    with _writing(args.out):  # before the run: a full disk fails now, not after it
        check_free_space(args.out, trace_bytes + steps_bytes + 1_000_000, what="run",
                         largest=max(trace_bytes, steps_bytes))
    start = time.perf_counter()
    try:
        trace = simulate(policy, env, args.horizon, seed=args.seed + 1, progress=not args.no_progress, delays=delays)
    except ValueError as err:
        if delays is None or not str(err).startswith("delays"):
            raise
        raise UsageError("--delay" + str(err).removeprefix("delays")) from None
    with _writing(args.out), atomic_output_dir(args.out, replace=True) as tmp:
        trace.to_netcdf(tmp / "trace.nc")
        regret_mean, regret_sem = mean_and_sem(trace.regret)
        import pandas as pd

        steps = {
            "step": range(trace.horizon), "regret_mean": regret_mean.numpy(), "regret_sem": regret_sem.numpy(),
            "cumulative_regret_mean": trace.regret.cumsum(0).mean(1).numpy(),
            "violation_rate": trace.violation.double().mean(1).numpy(),
        }
        if trace.constraint_violation is not None and trace.constraint_violation.shape[-1] > 1:
            for j, label in enumerate(trace.constraint_labels()):  # one column per constraint
                steps[f"violation_rate[{label}]"] = trace.constraint_violation[..., j].double().mean(1).numpy()
        if trace.fallback is not None:  # the share of replications that played the fallback, per step
            steps["fallback_rate"] = trace.fallback.double().mean(1).numpy()
        pd.DataFrame(steps).to_csv(tmp / "steps.csv", index=False)
        info = summary(trace)
        info.update({"problem": args.problem, "policy": args.policy, "seed": args.seed,
                     "models_source": source, "models": models, "wall_seconds": time.perf_counter() - start})
        info.update(_chance_summary(trace))  # issue 39: chance constraints' calibration, when there are any
        if delays is not None:  # issue 45: the lags, and the outcomes still pending at the end per metric
            info.update(delays=delays, pending_at_end=trace.attrs.get("pending_at_end"))
        atomic_write_json(tmp / "summary.json", info)
        plots.plot_simulation({args.policy: trace}, tmp / "regret.png", title=f"{args.policy} on {args.problem}")
        save_models(policy, tmp / "models")
    print(json.dumps({k: info[k] for k in ("final_cumulative_regret_mean", "violation_rate", "decisions_per_second")}, indent=2))
    for line in _violation_lines(info):
        print(line)
    for line in _fallback_lines(info):
        print(line)
    for line in info.get("chance_calibration_lines", ()):
        print(line)
    print(_models_line(source, models, env))
    print(f"wrote {args.out}/trace.nc, steps.csv, summary.json, regret.png, models/")
    return 0


def _clear_leftovers(out) -> None:
    """Remove the scratch directories a killed run left beside ``out`` (``bayes_safe.io.clear_stale_scratch``:
    those of dead processes only), so leftovers never accumulate even when no run reaches its write."""
    from .io import clear_stale_scratch

    with contextlib.suppress(OSError):
        clear_stale_scratch(out)


def _gigabytes(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


#: the built-in problems that take device= and instances= (the linear bandits and their drifting forms)
_DEVICE_PROBLEMS = ("kazerouni2017", "kazerouni2017-neurips", "daulton2019", "kazerouni2017-neurips-abrupt",
                    "kazerouni2017-neurips-rotating", "daulton2019-abrupt", "daulton2019-rotating")


def _device_arg(value):
    """``--device`` as a ``torch.device`` (None when not given), refused before any work when it is not a
    device name or names a CUDA device this machine does not have."""
    if value is None:
        return None
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise UsageError(f"--device: expected a torch device name ('cpu', 'cuda', 'cuda:1'), got {value!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"--device: {value!r} asked for, but this machine has no CUDA device (torch "
                             f"{torch.__version__} sees none); leave --device out to run on the CPU")
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device: {value!r} asked for, but this machine has {count} CUDA device(s) "
                             f"(cuda:0..cuda:{count - 1})")
    elif device.type != "cpu":
        raise UsageError(f"--device: expected 'cpu' or a CUDA device ('cuda', 'cuda:1'), got {value!r}")
    return device


def _check_memory(args, num_arms: int, dim: int, num_metrics: int, num_constraints: int) -> None:
    """Refuse (``UsageError``, before anything is allocated) a simulation whose tensors cannot fit in
    the memory available (``bayes_safe.simulation.estimate_simulation_bytes``: the trace's
    ``[T, R, ...]`` tensors, the trace's file built in memory, the run's per-replication state)."""
    from .simulation import available_memory_bytes, estimate_simulation_bytes

    need = estimate_simulation_bytes(args.horizon, args.replications, num_arms, dim, num_metrics, num_constraints)
    free = available_memory_bytes()
    if free is None or need["total"] <= free:
        return
    option = "--replications" if args.replications >= args.horizon else "--horizon"
    raise UsageError(
        f"{option}: a simulation of {args.replications:,} replications (--replications) x {args.horizon:,} steps "
        f"(--horizon) needs about {_gigabytes(need['total'])} of memory (the trace {_gigabytes(need['trace'])}, its "
        f"file built in memory {_gigabytes(need['output'])}, the run {_gigabytes(need['run'])}), and "
        f"{_gigabytes(free)} is available; lower --replications or --horizon (the trace grows with their product)")


#: the policies ``simulate --problem module:Class`` builds (the others need a built-in problem's true parameters)
_OWN_POLICIES = ("ts", "ts-asc", "greedy", "random")


class _ProblemShape:
    """What ``bayes_safe.factory.make_policy`` reads of a problem, for a user's ``Problem``: its
    metrics, feature width (one probe draw), replications and the noise of its models."""

    alpha = None

    def __init__(self, problem):
        import torch

        self.name = str(getattr(problem, "name", type(problem).__name__))
        names = list(problem.metric_names)
        self.num_metrics = len(names)
        self.replications = int(problem.replications)
        noise = getattr(problem, "noise_std", None)
        self.noise_std = [1.0] * len(names) if noise is None else [float(v) for v in noise]
        if len(self.noise_std) != len(names) or not all(v > 0 for v in self.noise_std):
            raise ValueError(f"--problem: {self.name}.noise_std: expected {len(names)} numbers > 0 (one per metric), "
                             f"got {noise!r}")
        from .simulation import _draw_takes_step

        units = problem.draw(1, torch.Generator().manual_seed(0), **({"step": 0} if _draw_takes_step(problem) else {}))
        features = getattr(units, "features", None)
        shape = tuple(getattr(features, "shape", ()))
        if len(shape) != 3:
            raise ValueError(f"--problem: {self.name}.draw(1, generator) returned features of shape {list(shape)}; "
                             "expected [n, K, d]")
        self.dim = int(shape[-1])
        # the problem's feature names go to the ridge models (saved with them: diagnose uses them)
        self.feature_names = getattr(problem, "feature_names", None)


def _own_problem(args):
    """``simulate --problem module:Class [--param KEY=VALUE]``: the problem (with ``--replications``),
    the policy and where its models came from (``"problem"``, ``"ridge"`` or ``"none"``).

    The models are the problem's own when it declares them (``Problem.models(replications)``, read
    by ``bayes_safe.factory.problem_models``: one per metric, reward first); otherwise Bayesian ridge
    models per metric (known noise ``problem.noise_std``, default 1.0; prior ``N(0, noise^2 / RIDGE
    I)``, ``--ridge`` default 1). ``--ridge`` with a problem that declares its models is a usage
    error (the ridge prior would not be the one that runs). ts and greedy learn the reward's model;
    ts-asc learns the reward's and one per guarded metric after the reward, and guards every
    declared ``Constraint`` (the reward's too, on the reward's own draw) with the problem's
    ``fallback`` (``TSASC(..., constraints=, metric_names=, fallback=)``)."""
    from ._problem_import import load_problem
    from .factory import ridge_model
    from .policies import TSASC, Greedy, Random, ThompsonSampling

    problem = load_problem(args.problem, dict(args.param or ()))
    name = type(problem).__name__
    if args.policy not in _OWN_POLICIES:
        raise UsageError(f"--policy: expected one of {', '.join(_OWN_POLICIES)} for a --problem module:Class, "
                         f"got {args.policy!r}")
    if args.alpha is not None:
        raise UsageError("--alpha: a --problem module:Class declares its own constraints (Constraint in the class)")
    try:
        problem.replications = args.replications
    except AttributeError:
        raise UsageError(f"--replications: {name}.replications cannot be set") from None
    _check_own_memory(problem, args)  # before the models of --replications replications exist
    own = _declared_models(problem, args.replications)
    if own is not None and args.ridge is not None:
        raise UsageError(f"--ridge: {name} declares its own models ({name}.models); --ridge sets the prior of the "
                         "ridge default, which runs only for a problem that declares none. Leave --ridge out")
    if own is not None and args.forgetting is not None:
        raise UsageError(f"--forgetting: {name} declares its own models ({name}.models), which set their own "
                         "forgetting (BayesianLinear(..., forgetting=...)); leave --forgetting out")
    names = [str(n) for n in problem.metric_names]
    declared = tuple(getattr(problem, "constraints", ()) or ())
    if args.policy == "random":
        if args.forgetting is not None:
            raise UsageError("--forgetting: the random policy has no models to forget with")
        return problem, Random(), "none"
    shape = _ProblemShape(problem) if own is None else None
    source = "problem" if own is not None else "ridge"
    ridge = 1.0 if args.ridge is None else args.ridge

    def model(metric: int):
        return own[metric] if own is not None else ridge_model(shape, metric, ridge, args.forgetting)

    if args.policy == "ts":
        return problem, ThompsonSampling(model(0)), source
    if args.policy == "greedy":
        return problem, Greedy(model(0)), source
    # ts-asc: the reward's model and one per guarded metric after the reward, in the problem's order
    guarded = [m for m in range(1, len(names)) if any(c.metric == names[m] for c in declared)]
    if not guarded:
        raise UsageError(f"--policy: ts-asc needs a Constraint on a metric after the reward; {name} declares "
                         f"{'only a guardrail on the reward' if declared else 'no constraint'} (use ts)")
    policy = TSASC(model(0), [model(m) for m in guarded], constraints=declared,
                   metric_names=[names[0], *(names[m] for m in guarded)],
                   fallback=getattr(problem, "fallback", "safest"))
    return problem, policy, source


def _check_own_memory(problem, args) -> None:
    """``_check_memory`` for a user's problem: its arms and feature width from one probe unit (a
    probe that fails is left to the checks that follow, which name the problem)."""
    import torch

    try:
        from .simulation import _draw_takes_step

        units = problem.draw(1, torch.Generator().manual_seed(0), **({"step": 0} if _draw_takes_step(problem) else {}))
        shape = tuple(units.features.shape)
    except Exception:  # noqa: BLE001 - reported by _ProblemShape / simulate with the problem's name
        return
    if len(shape) != 3:
        return
    _check_memory(args, int(shape[1]), int(shape[2]), len(problem.metric_names),
                  len(getattr(problem, "constraints", ()) or ()))


def _declared_models(problem, replications: int):
    """``bayes_safe.factory.problem_models(problem, replications)``, its failures one line naming ``--problem``."""
    from .factory import problem_models

    name = type(problem).__name__
    try:
        return problem_models(problem, replications)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--problem: {exc}") from exc
    except Exception as exc:  # the user's hook raised: one line, not a traceback
        raise UsageError(f"--problem: {name}.models({replications}) raised {type(exc).__name__}: {exc}") from exc


def _study(args) -> int:
    from bayes_safe.studies import available_studies, get_study

    if args.study_command == "list":
        for name, (_, description) in sorted(available_studies().items()):
            print(f"{name:28s} {description}")
        return 0
    if args.study_command == "show":
        return _study_show(args.path)
    from .io import atomic_output_dir

    module = get_study(args.name)
    options = {}
    device = _device_arg(getattr(args, "device", None))
    if device is not None:  # checked before any work: a study that cannot take it is named now
        import inspect

        if "device" in inspect.signature(module.run).parameters:
            options["device"] = device
        elif device.type != "cpu":
            raise UsageError(f"--device: study {args.name!r} runs on the CPU only; ts-asc-synthetic takes --device")
    # the study writes into a scratch directory that then replaces --out as a whole
    with _writing(args.out, errnos=_DISK_ERRNOS), atomic_output_dir(args.out, replace=True) as tmp:
        results = module.run(tmp, quick=args.quick, seed=args.seed, **options)
    print(f"study {args.name}: wrote {args.out} ({len(results)} result entries)")
    return 0


def _study_show(path) -> int:
    """``bayes-safe study show PATH``: a state's provenance, or a tuning study's recommendation."""
    import json

    if (path / "decider.json").is_file():
        from .online.decider import provenance_lines

        try:
            meta = json.loads((path / "decider.json").read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"PATH: {path / 'decider.json'} is not readable JSON ({exc})") from None
        for line in provenance_lines(meta.get("provenance") if isinstance(meta, dict) else None):
            print(line)
        return 0
    if (path / "best.json").is_file():
        try:
            best = json.loads((path / "best.json").read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"PATH: {path / 'best.json'} is not readable JSON ({exc})") from None
        print(f"study in {path}: {best.get('recommendation', 'no recommendation')}")
        if best.get("parameters"):
            print("  parameters: " + ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in best["parameters"].items()))
            print(f"  deploy it: bayes-safe deploy {path} STATE_DIR")
        for b in best.get("policy_bounds") or []:
            if isinstance(b, dict) and b.get("text"):
                print(f"  {b['text']}")
        return 0
    raise UsageError(f"PATH: {path} holds neither a state (decider.json) nor a tuning study's report (best.json)")


def _deploy(args) -> int:
    from bayes_safe.tuning.deploy import (  # a core install: MissingExtraError names the extra
        DeployError,
        deploy,
    )

    from .online.decider import provenance_lines

    try:
        provenance = deploy(args.study_dir, args.state_dir, trial=args.trial, storage=args.storage, name=args.name,
                            trust_source=args.trust_source, log=args.log, seed=args.seed, num_draws=args.num_draws,
                            overwrite=args.overwrite)
    except DeployError as exc:
        raise UsageError(str(exc)) from None
    for line in provenance_lines(provenance):
        print(line)
    print(f"wrote {args.state_dir}; serve it: bayes-safe serve {args.state_dir} --log decisions.sqlite")
    return 0


def _run(args) -> int:
    if getattr(args, "out", None) is not None:
        from .io import check_output_path

        check_output_path(args.out, "--out")  # before any work: --out under a file, or not writable
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "study":
        return _study(args)
    if args.command == "deploy":
        return _deploy(args)
    if args.command == "tune":
        if getattr(args, "missing_extra", None):
            raise MissingExtraError(args.missing_extra)
        from bayes_safe.tuning.cli import run_tune

        return run_tune(args)
    if args.command == "diagnose":
        from .diagnostics import diagnose_run

        lines: list[str] = []
        with _writing(args.run_dir / "diagnostics", option="run_dir", errnos=_DISK_ERRNOS):
            report = diagnose_run(args.run_dir, num_draws=args.draws, allow_imports=args.allow_imports,
                                  on_warning=lines.append)
        for line in lines:  # r-hat > 1.01 or ESS < 100: one line per variable (the report has them too)
            print(line)
        if not lines:
            print("mixing: no chain's variable has r-hat > 1.01 or bulk/tail ESS < 100 (independent draws: conjugate, "
                  "SVI and probit GP, have no chain to check)")
        print(f"wrote {report} and one NetCDF per model")
        return 0
    if args.command == "serve":
        from .online.serve import serve

        return serve(args.state_dir, host=args.host, port=args.port, log=args.log, snapshot_every=args.snapshot_every,
                     token_file=args.token_file, allowed_hosts=args.allowed_host, allowed_origins=args.allowed_origin,
                     max_body_bytes=args.max_body_bytes, max_candidates=args.max_candidates,
                     max_feedback_items=args.max_feedback_items, allow_imports=args.allow_imports,
                     replica=args.replica, sync_every=args.sync_every, read_timeout=args.read_timeout,
                     max_bytes_in_flight=args.max_bytes_in_flight, limit_concurrency=args.limit_concurrency,
                     timeout_keep_alive=args.timeout_keep_alive)
    if args.command == "feedback":
        return _feedback(args)
    raise AssertionError(f"unknown command {args.command!r}")  # pragma: no cover - argparse requires one


def _feedback(args) -> int:
    from .online.bulk import apply_outcomes

    if args.url is not None and args.log is not None:
        raise UsageError("--log: with --url the running service writes its own log; give one of them")
    if args.url is None and args.token_file is not None:
        raise UsageError("--token-file: only with --url (the token is sent to the service)")
    if args.url is None and args.chunk_rows is not None:
        raise UsageError("--chunk-rows: only with --url (the rows of each request to the service)")
    if args.url is None and args.state_dir is None:
        raise UsageError("STATE_DIR: required without --url (the state the outcomes are applied to); with --url URL "
                         "the table is sent to the running service")
    out = apply_outcomes(args.state_dir, args.source, log=args.log, url=args.url, token_file=args.token_file,
                         chunk_rows=args.chunk_rows or 1000)
    line = (f"{args.source}: {out['rows']} rows, {out['applied']} applied, {out['duplicates']} already had feedback "
            "(ignored)")
    if args.url is not None:
        from .online.bulk import _shown_url

        print(f"{line}; sent to {_shown_url(args.url)} in {out['chunks']} request(s)")
    else:
        recovered = out["recovered"]
        if recovered and (recovered["decisions"] or recovered["feedback"]):
            line += (f"; first replayed {recovered['decisions']} decisions and {recovered['feedback']} feedback "
                     "from the log")
        print(f"{line}; model_version {out['model_version']}, pending {out['pending']} ({args.state_dir}, log "
              f"{out['log']})")
    return 0


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _user_message(exc: BaseException) -> str | None:
    """The one-line message of a failure the user can fix (status 2), or None for an internal error."""
    if isinstance(exc, UsageError):
        return str(exc)
    if isinstance(exc, (ValueError, TypeError, MissingExtraError)):  # bad input; StateError is a ValueError
        return str(exc)
    if isinstance(exc, OSError) and (isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                                                      PermissionError, FileExistsError))
                                     or exc.errno in _DISK_ERRNOS):
        return _reason(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``bayes-safe`` with ``argv``; return the exit status.

    A failure the user can fix (bad input, a file that is not what was expected, a full disk)
    is one line ``bayes-safe CMD: error: ...`` and status 2 (via ``SystemExit``, as argparse's
    own errors); any other exception is one line ``bayes-safe CMD: internal error: ...`` and
    status 1, with its traceback under ``--debug``. Either way the output directory is left as
    it was.
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    command = " ".join(c for c in (args.command, getattr(args, "study_command", None)) if c)
    console_logging(command)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"bayes-safe {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns any failure into one line
        if args.debug:
            traceback.print_exc()
        message = _user_message(exc)
        if message is not None:
            parser.exit(2, f"bayes-safe {command}: error: {_one_line(message)}\n")
        print(f"bayes-safe {command}: internal error: {type(exc).__name__}: {_one_line(exc)}"
              + ("" if args.debug else " (run with --debug to see the traceback)"), file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
