"""Tuning against logs: trials whose metrics are off-policy estimates instead of simulations.

A simulated A/B test (``VideoUploadProblem``) needs a simulator of the
production system. Teams that have only logs of their production policy can still tune: a
trial trains a policy with the parameterization on part of the logs and estimates its value
and its constraint violations on the held-out part (Kachuee & Lee 2022, section 4.3 metrics;
``bayes_safe.offline.evaluation.evaluate_offline``). ``LoggedDataProblem`` plugs that
into ``ABTest`` and ``Study`` unchanged: the Ax loop, storage,
parallel trials, crash recovery and the report work as for simulated A/B tests.

Example (tune Algorithm 1's ``eta, gamma`` on the synthetic skill-routing logs)::

    from bayes_safe.tuning import ABTest, LoggedDataProblem, Study
    problem = LoggedDataProblem(source="synthetic", method="minimax", benchmark="critical")
    study = Study(ABTest(problem), storage="runs/logged.sqlite")
    study.run(trials=12)

Choices (the paper tunes by grid search and keeps the best macro violation rate, s.4.3):

* the default search space is the paper's grid turned into ranges: quadratic ``weight`` in
  ``[0.1, 1000]`` (log), minimax ``eta`` in ``[0.01, 1]`` (log) and ``gamma`` in
  ``[0.995, 1]``, meta-gradient ``lam`` in ``[0.01, 1]``, IPS the Adam rate ``lr`` in
  ``[1e-4, 1e-2]`` (log);
* the default objective maximises the held-out SNIPS value ``reward`` subject to
  ``violation_macro <= max_violation`` (0.2 by default: a bound that depends on the data and
  the constraint benchmark; set your own);
* other outcomes the logs record are estimated too (``metric_columns`` of a file; a decision
  log's constraint values): each trial reports the trained policy's off-policy mean ``m`` and the
  logging policy's ``baseline_m``, which an outcome constraint can bound
  (``--constraint "adverse_event <= 0.05"``);
* a trial is a pure function of ``(parameters, seed)``: the seed draws the split (stratified by
  domain), the policy's initialisation, the shuffles and the bootstrap.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bayes_safe._validation import check_positive_int
from bayes_safe.envs.ab_problem import ABProblem

from .ranges import Range

__all__ = ["METHOD_PARAMETERS", "LoggedDataProblem", "check_file_source"]

#: the default search space of each training method (module docstring)
METHOD_PARAMETERS: dict[str, tuple[Range, ...]] = {
    "ips": (Range("lr", 1e-4, 1e-2, log=True),),
    "quadratic": (Range("weight", 0.1, 1000.0, log=True),),
    "minimax": (Range("eta", 0.01, 1.0, log=True), Range("gamma", 0.995, 1.0)),
    "meta": (Range("lam", 0.01, 1.0),),
}
#: parameters each method's factory reads (``lr`` is the policy's Adam rate, for every method)
_READS = {"ips": {"lr"}, "quadratic": {"weight", "lr"}, "minimax": {"eta", "gamma", "tau", "xi", "lr"},
          "meta": {"eta", "lam", "lr"}}
_SOURCES = ("synthetic", "open-bandit")
_DEFAULT_BENCHMARK = {"synthetic": "critical", "open-bandit": "obd-critical"}
_DATA_CACHE: dict = {}


def _load(source: str, options: Mapping):
    """The logged data of ``source`` (cached per process: every trial of a study reads the same logs)."""
    return _load_all(source, options)[0]


def _load_metrics(source: str, options: Mapping) -> dict:
    """``{name: values [N]}`` of the other outcomes ``source`` logs, in its rows' order: a file's
    ``metric_columns``; a decision log's constraint values (``constraint{j}``, when every decision
    with feedback has them); none for the built-in sources."""
    return _load_all(source, options)[1]


def _load_all(source: str, options: Mapping):
    from bayes_safe.offline import LoggedData, load_open_bandit, skill_routing_logs

    key = (source, repr(sorted(options.items())))
    entry = _DATA_CACHE.get(key)
    if entry is None:
        opts = dict(options)
        metric_columns = list(opts.pop("metric_columns", None) or ())
        metrics: dict = {}
        if source == "synthetic":
            data = skill_routing_logs(n=int(opts.pop("n", 50_000)), seed=int(opts.pop("seed", 0)), **opts)
        elif source == "open-bandit":
            data = load_open_bandit(**opts)
        elif is_decision_log(source):
            import numpy as np

            from bayes_safe.online import DecisionLog

            log = DecisionLog(source, read_only=True)
            try:
                data = log.to_logged_data()
                values = log.to_dataframe(with_feedback_only=True)["constraints"].tolist()
            finally:
                log.close()
            widths = {None if v is None else len(v) for v in values}
            if len(widths) == 1 and None not in widths:
                table = np.array(values, dtype=np.float64).reshape(len(values), -1)
                if np.isfinite(table).all():
                    metrics = {f"constraint{j}": table[:, j] for j in range(table.shape[1])}
        else:
            import pandas as pd

            parquet = str(source).lower().endswith(".parquet")
            data = (LoggedData.from_parquet if parquet else LoggedData.from_csv)(source, **opts)
            if metric_columns:
                frame = pd.read_parquet(source, columns=metric_columns) if parquet else pd.read_csv(
                    source, usecols=metric_columns)
                metrics = {str(c): frame[c].to_numpy(dtype=float, na_value=float("nan")) for c in metric_columns}
        if len(_DATA_CACHE) >= 2:
            _DATA_CACHE.pop(next(iter(_DATA_CACHE)))
        entry = _DATA_CACHE[key] = (data, metrics)
    return entry


def _one_line(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).replace(":\n  - ", ": ").replace("\n  - ", "; ").split()) or type(exc).__name__


#: suffixes of a decision log (``bayes_safe.online.DecisionLog``, SQLite)
_LOG_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def is_decision_log(source) -> bool:
    """Whether ``source`` names a decision log written by ``bayes_safe.online`` (an SQLite file)."""
    return str(source).lower().endswith(_LOG_SUFFIXES)


def _check_decision_log(path: str, options: Mapping, benchmark) -> None:
    if options:
        raise ValueError(f"options: a decision log ({path}) has its own columns; drop the column arguments "
                         f"({sorted(options)})")
    if benchmark is not None:
        raise ValueError(f"benchmark: a decision log ({path}) has one domain ('all'); replication-constraint "
                         "benchmarks need domains: use --benchmark none")
    try:
        _load(path, {})
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"source: {path}: {_one_line(exc)}") from None


def check_file_source(source, options: Mapping, benchmark=None) -> None:
    """Check a file of logs before any trial: the column arguments, the header, the named
    columns (read in full and validated as ``LoggedData.from_dataframe`` does), and the
    constraint benchmark against the file's domains.

    Raises:
        ValueError: one line naming ``options`` (a column argument), ``source`` (the file: empty,
            not a CSV / Parquet file, a missing column, invalid rows) or ``benchmark``.
    """
    import inspect

    import pandas as pd

    from bayes_safe.offline import LoggedData, ReplicationConstraints

    path = str(source)
    if is_decision_log(path):
        _check_decision_log(path, options, benchmark)
        return
    accepted = [k for k in inspect.signature(LoggedData.from_dataframe).parameters if k not in ("cls", "df")]
    accepted.append("metric_columns")  # other logged outcomes, estimated off-policy (evaluate_offline's metrics)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"options: unknown column argument(s) {unknown} for a file source; expected some of {accepted}")
    if "context_columns" not in options:
        raise ValueError(f"options: a file source needs context_columns=NAME,... (the numeric context columns of {path})")
    named: list[str] = []
    for key, value in options.items():
        if key.endswith("_columns"):
            if isinstance(value, str):
                raise ValueError(f"options: {key} expects a list of column names, got the string {value!r}")
            named.extend(str(v) for v in value)
        elif key.endswith("_column"):
            named.append(str(value))
    for key, default in (("action_column", "action"), ("reward_column", "reward"),
                         ("propensity_column", "propensity"), ("domain_column", "domain")):
        if key not in options:
            named.append(default)
    named = list(dict.fromkeys(named))
    parquet = path.lower().endswith(".parquet")
    if not parquet:
        try:
            with open(path, "rb") as f:
                head = f.read(8192)
        except OSError as exc:
            raise ValueError(f"source: cannot read {path} ({exc.strerror})") from None
        if b"\x00" in head:
            raise ValueError(f"source: {path} is not a CSV file (binary content)")
    if parquet:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"source: reading {path} needs a Parquet engine: install pyarrow, or convert "
                             "the file to CSV") from None
    try:
        header = list(pq.read_schema(path).names) if parquet else [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except pd.errors.EmptyDataError:
        raise ValueError(f"source: {path} is empty (expected a CSV file of logs with a header row)") from None
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"source: {path} is not a readable {'Parquet' if parquet else 'CSV'} file ({_one_line(exc)})") from None
    missing = [c for c in named if c not in header]
    if missing:
        shown = header[:20] + (["..."] if len(header) > 20 else [])
        missing = missing[:10] + (["..."] if len(missing) > 10 else [])
        raise ValueError(f"source: {path} has no column(s) {missing} named by the column arguments "
                         f"(--column); its header: {shown}")
    try:
        df = pd.read_parquet(path, columns=named) if parquet else pd.read_csv(path, usecols=named)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"source: {path} cannot be read ({_one_line(exc)})") from None
    if len(df) == 0:
        raise ValueError(f"source: {path} has a header but no rows of logs")
    columns = {k: v for k, v in options.items() if k != "metric_columns"}
    try:
        data = LoggedData.from_dataframe(df, **columns)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"source: {path}: {_one_line(exc)}") from None
    from bayes_safe.offline import offline_metric_names
    from bayes_safe.offline.estimators import metric_values

    taken = set(offline_metric_names(benchmark))
    for col in options.get("metric_columns") or ():
        if str(col) in taken:
            raise ValueError(f"options: metric_columns names {col!r}, a metric the trials report themselves; rename the "
                             "column")
        try:
            metric_values(pd.to_numeric(df[col], errors="coerce").reset_index(drop=True), data, f"metric column {col!r}")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"source: {path}: {_one_line(exc)}") from None
    if benchmark is not None:
        if data.logging_probs is None:
            raise ValueError(f"source: {path}: the constraint benchmark {benchmark!r} needs the full logging "
                             "distribution; name its columns with logging_prob_columns=... (or use method 'ips' "
                             "without a benchmark)")
        try:
            ReplicationConstraints.from_benchmark(benchmark, data.domain_names)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"benchmark: {_one_line(exc)}") from None


@dataclass
class LoggedDataProblem(ABProblem):
    """Trials estimated off-policy from logged data (module docstring).

    Args:
        source: ``"synthetic"`` (the skill-routing generator of
            ``bayes_safe.offline.synthetic``), ``"open-bandit"`` (the Open Bandit sample,
            ``make data`` fetches it), the path of a ``.csv`` / ``.parquet`` file of logs, or a
            decision log (``.sqlite``) written by ``bayes_safe.online.Decider`` (its decisions with
            feedback, one domain; no column arguments).
        options: keyword arguments of the source: ``n``, ``seed`` for ``"synthetic"``;
            ``behavior``, ``campaigns`` for ``"open-bandit"``; the column names of
            ``from_dataframe`` for a file, and ``metric_columns``: other logged outcomes (e.g.
            an adverse event) whose off-policy means the trials report as ``m`` and ``baseline_m``
            (a decision log reports its feedback's constraint values as ``constraint{j}``).
        logged_data: logs already in memory (a ``LoggedData``),
            instead of ``source``. Such a study cannot be resumed from the command line
            (pass the same A/B test to ``Study.load <tuning.Study.load>``).
        method: the training method tuned: ``"ips"``, ``"quadratic"``, ``"minimax"``, ``"meta"``.
        benchmark: replication-constraint benchmark (a name of
            ``available_benchmarks`` or a JSON path); default
            ``"critical"`` (synthetic) / ``"obd-critical"`` (Open Bandit); ``None`` for a file
            source means no constraints (then only value metrics exist).
        max_violation: the default outcome constraint ``violation_macro <= max_violation``.
        holdout: share of the logs held out for the estimates.
        epochs, hidden, batch_size: training of the two-layer MLP policy.
        n_boot: bootstrap resamples of the value's standard error.
        defaults: values of the method's hyperparameters a study does not tune.
    """

    source: str = "synthetic"
    options: dict = field(default_factory=dict)
    logged_data: object = None
    method: str = "minimax"
    benchmark: str | None = "default"
    max_violation: float = 0.2
    holdout: float = 0.3
    epochs: int = 8
    hidden: int = 64
    batch_size: int = 1024
    n_boot: int = 200
    defaults: dict = field(default_factory=dict)

    name = "logged-data"
    offline = True
    #: replicates of a trial re-split and re-estimate the same logged rows: ``ABTest`` combines them without
    #: dividing the standard error by their number (``combine_replicates``, issue 39)
    replicates_share_rows = True
    objective = "reward"
    surface = None
    trial_noun = "trials"
    observed_label = "estimate"
    trial_work = "training and estimation"
    report_intro = (
        "Bayesian optimisation of a constrained off-policy training method's hyperparameters (Kachuee & Lee "
        "2022, s.4.3, with the tuning loop of Daulton et al. 2019, s.5.3): each trial trains a policy on part "
        "of the logs and estimates its metrics off-policy on the held-out part (`reward`: SNIPS value; "
        "`violation_macro` / `violation_micro`: shares of held-out contexts outside their domain's "
        "replication range), each with its standard error.")

    def __post_init__(self):
        from bayes_safe.offline import LoggedData
        from bayes_safe.offline.training import METHODS

        if self.method not in METHODS:
            raise ValueError(f"method: expected one of {sorted(METHODS)}, got {self.method!r}")
        if self.logged_data is not None:
            if not isinstance(self.logged_data, LoggedData):
                raise TypeError(f"logged_data: expected a LoggedData, got {type(self.logged_data).__name__}")
        elif not isinstance(self.source, (str, os.PathLike)):
            raise TypeError(f"source: expected 'synthetic', 'open-bandit' or a file path, got {self.source!r}")
        elif str(self.source) not in _SOURCES:
            path = Path(self.source)
            if path.suffix.lower() not in (".csv", ".parquet", *_LOG_SUFFIXES):
                raise ValueError(f"source: expected 'synthetic', 'open-bandit' or a .csv / .parquet file (or a decision "
                                 f"log .sqlite of bayes_safe.online.DecisionLog), got {str(self.source)!r}")
            if not path.is_file():
                raise FileNotFoundError(f"source: no such file {str(path)!r}")
            # stored resolved: a study resumed from another directory reads the same file
            self.source = str(path.expanduser().resolve())
        if not isinstance(self.options, dict):
            raise TypeError(f"options: expected a dict of keyword arguments of the source, got {type(self.options).__name__}")
        if self.benchmark == "default":
            self.benchmark = _DEFAULT_BENCHMARK.get(str(self.source)) if self.logged_data is None else None
        if self.method != "ips" and self.benchmark is None:
            raise ValueError(f"benchmark: method {self.method!r} trains under replication constraints; name a "
                             "constraint benchmark (e.g. 'critical') or use method='ips'")
        if self.benchmark is not None:
            from bayes_safe.offline import load_benchmark

            load_benchmark(self.benchmark)  # an unknown name fails here, before any trial
        if not 0 < float(self.holdout) < 1:
            raise ValueError(f"holdout: expected a share in (0, 1), got {self.holdout!r}")
        if not 0 <= float(self.max_violation) <= 1:
            raise ValueError(f"max_violation: expected a rate in [0, 1], got {self.max_violation!r}")
        for key in ("epochs", "hidden", "batch_size", "n_boot"):
            setattr(self, key, check_positive_int(getattr(self, key), key))
        unknown = set(self.defaults) - _READS[self.method]
        if unknown:
            raise ValueError(f"defaults: method {self.method!r} does not read {sorted(unknown)}; "
                             f"expected some of {sorted(_READS[self.method])}")
        if self.logged_data is None and str(self.source) not in _SOURCES:
            check_file_source(self.source, self.options, self.benchmark)
        elif self.benchmark is not None and (self.logged_data is not None or str(self.source) == "synthetic"):
            self._check_benchmark_domains()

    def _check_benchmark_domains(self) -> None:
        """The benchmark's rules name domains of these logs (in-memory or synthetic ones; a file's are
        checked by ``check_file_source``): a benchmark of other logs is refused before any study
        exists, not at its first trial. The synthetic logs are generated here once (cached per process)."""
        from bayes_safe.offline import ReplicationConstraints

        data = self.data()
        try:
            ReplicationConstraints.from_benchmark(self.benchmark, data.domain_names)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"benchmark: {_one_line(exc)}") from None

    # -- metadata
    @property
    def parameters(self) -> tuple[Range, ...]:
        return METHOD_PARAMETERS[self.method]

    @property
    def outcome_constraints(self) -> tuple[str, ...]:
        return (f"violation_macro <= {self.max_violation}",) if self.benchmark is not None else ()

    def metric_names(self) -> tuple[str, ...]:
        from bayes_safe.offline import offline_metric_names

        return tuple(offline_metric_names(self.benchmark, list(self._metrics())))

    def _metrics(self) -> dict:
        """The other logged outcomes of the source (``_load_metrics``)."""
        return {} if self.logged_data is not None else _load_metrics(str(self.source), self.options)

    def known_parameters(self) -> tuple[str, ...]:
        """The hyperparameters the training method reads (a misspelled trial parameter is an error)."""
        return tuple(sorted(_READS[self.method]))

    def check_parameters(self, ranges: Sequence[Range]) -> None:
        reads = _READS[self.method]
        for r in ranges:
            if r.name not in reads:
                raise ValueError(f"parameter {r.name!r}: method {self.method!r} reads only {', '.join(sorted(reads))}")
            if r.low < 0 or (r.name in ("lr", "tau", "xi") and r.low <= 0):
                raise ValueError(f"parameter {r.name!r}: bounds [{r.low}, {r.high}] must be positive")
            if r.name in ("gamma", "lam") and r.high > 1:
                raise ValueError(f"parameter {r.name!r}: bounds [{r.low}, {r.high}] must lie in [0, 1]")

    def config(self) -> dict | None:
        if self.logged_data is not None:
            return None
        return {"name": self.name, "source": str(self.source), "options": dict(self.options), "method": self.method,
                "benchmark": self.benchmark, "max_violation": self.max_violation, "holdout": self.holdout,
                "epochs": self.epochs, "hidden": self.hidden, "batch_size": self.batch_size, "n_boot": self.n_boot,
                "defaults": dict(self.defaults)}

    def tuned_label(self, ab_test) -> str:
        return f"{self.method} training"

    def report_notes(self) -> str:
        """Markdown for the study's report: what a log study can and cannot tell, and its standard errors."""
        return ("**What the logs can and cannot tell.** Each trial's metrics are off-policy estimates on the held-out "
                "logs: they bound a metric's **mean** under the trained policy, not the **share of units above a "
                "cap** (how many contexts get a value beyond a limit); check that share in simulation before "
                "serving a setting (`bayes-safe tune custom` with the problem's `max_violations`).\n\n"
                "**Standard errors.** A 0/1 metric's interval is the betting interval of "
                "`bayes_safe.offline.intervals`. Replicates of a trial re-split the same logged rows, so they do not "
                "shrink the standard error (one replicate per trial is enough).\n")

    def describe(self, ab_test) -> str:
        logs = self.source if self.logged_data is None else "in memory"
        return (f"logs `{logs}` {self.options or ''}; method `{self.method}`, constraint benchmark `{self.benchmark}`; "
                f"{self.holdout:.0%} of the logs held out; a two-layer MLP ({self.hidden} hidden units) trained "
                f"{self.epochs} epochs at batch {self.batch_size}")

    # -- the trial
    def data(self):
        """The logs (loaded once per process)."""
        return self.logged_data if self.logged_data is not None else _load(str(self.source), self.options)

    def estimate(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        """Train with ``parameters`` (over ``defaults``) and estimate ``{metric: (mean, sem)}`` off-policy."""
        from bayes_safe.offline import (
            ReplicationConstraints,
            evaluate_offline,
            trained_policy_factory,
        )

        data = self.data()
        cons = None
        if self.benchmark is not None:
            cons = ReplicationConstraints.from_benchmark(self.benchmark, data.domain_names)
        factory = trained_policy_factory(self.method, constraints=cons, hidden=self.hidden, epochs=self.epochs,
                                         batch_size=self.batch_size)
        params = {**self.defaults, **{k: float(v) for k, v in parameters.items()}}
        return evaluate_offline(data, factory, params, seed=int(seed), constraints=cons, holdout=float(self.holdout),
                                n_boot=self.n_boot, metrics=self._metrics() or None)
