"""Bulk feedback: a table of outcomes joined on decision ids, applied to a served Decider's state.

    bayes-safe feedback STATE_DIR --from outcomes.csv|outcomes.parquet [--log LOG] [--url URL]

**The table.** One row per outcome (other columns are ignored):

* ``decision_id``: the id ``/decide`` returned;
* ``reward`` (or the reward's metric name, when the policy has ``metric_names``);
* the constraint metrics, one column each: the policy's ``metric_names`` after the reward
  (``TSASC(..., metric_names=["revenue", "satisfaction"])``: a ``satisfaction`` column), else
  ``constraint0``, ``constraint1``, ...; or one ``constraints`` column holding a JSON list per
  row (``[0.9]``). A policy without constraint models needs none.

Rows are numbered from 1, the first row after the header (so row ``n`` of a CSV file is its line
``n + 1``).

**Semantics.** All or nothing per call: every row is checked first (a missing or non-numeric
value, a malformed JSON list, an unknown decision id), and if any is bad nothing is applied and
the error names every bad row: its number, its decision id and what is wrong. Idempotent: a row
whose decision already has feedback (sent before, by HTTP or an earlier table, or earlier in the
same table) is acknowledged and ignored, so re-sending a table changes nothing. Crash-safe: the
new rows are committed to the decision log in one transaction before the state is saved; a crash
between the two leaves them in the log, and the next load (``bayes-safe serve`` or this command)
replays them, exactly once.

**A running service.** The process that serves a state holds ``STATE_DIR.lock``
(``bayes_safe.online.serve.state_lock_path``). Without ``--url`` this command takes the same
lock, so it refuses to touch a state that is being served (two writers of one state and log
would lose updates) and a service cannot start on it meanwhile; with ``--url`` it sends the table
to the running service instead, as one ``POST /feedback`` with the list (all or nothing there
too; the state is read only for the policy's metric names). A service with tokens needs one with
the ``feedback`` role: ``--token-file PATH``, else the environment variable ``BAYES_SAFE_TOKEN``,
else the file ``BAYES_SAFE_TOKEN_FILE`` names (``bayes_safe.online.auth.client_token``). A table
of more rows than the service takes in one request (``--max-feedback-items``,
``--max-body-bytes``) is refused whole, with a message saying so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["apply_outcomes", "outcome_columns", "read_outcomes"]


def outcome_columns(policy) -> tuple[list[str], list[str]]:
    """``(reward column names accepted, constraint column names)`` of ``policy``'s table."""
    from .metrics import metric_names

    names = metric_names(policy)
    has_names = getattr(policy, "metric_names", None) is not None
    reward = ["reward"] + ([names[0]] if has_names and names[0] != "reward" else [])
    return reward, names[1:]


def _number(value, what: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{what}: missing")
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a number, got {value!r}")  # noqa: TRY004 - a bad cell: the row's problem
    if isinstance(value, str) and "_" in value:  # Python's float() reads "1_000" as 1000; a table does not mean that
        raise ValueError(f"{what}: expected a number, got {value[:40]!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a number, got {str(value)[:40]!r}") from None
    if math.isnan(out) and not isinstance(value, str):
        raise ValueError(f"{what}: missing")
    if not math.isfinite(out):
        raise ValueError(f"{what}: expected a finite number, got {str(value)[:40]!r}")
    return out


def _frame(path: Path):
    import pandas as pd

    from .._extras import require

    if not path.is_file():
        raise FileNotFoundError(f"--from: no such file {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        require("pyarrow", "bayes-safe feedback --from FILE.parquet (or convert the table to CSV)")
        try:
            return pd.read_parquet(path, engine="pyarrow")
        except Exception as exc:  # noqa: BLE001 - any reader failure is the file's: one line
            raise ValueError(f"--from: {path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    if suffix not in (".csv", ".txt"):
        raise ValueError(f"--from: expected a .csv or .parquet file, got {path.name!r}")
    with open(path, "rb") as f:
        if b"\x00" in f.read(8192):
            raise ValueError(f"--from: {path} is not a CSV file (binary content)")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ValueError(f"--from: {path} is not a readable CSV file ({exc})") from None


def read_outcomes(path, policy) -> tuple[list[tuple[str, float, list[float] | None]], list[tuple[int, str, str]]]:
    """The rows of an outcomes table as ``(decision_id, reward, constraints)`` and every bad row as
    ``(row number, decision_id, message)``; a table without the needed columns is a ``ValueError``."""
    path = Path(path)
    frame = _frame(path)
    columns = [str(c).strip() for c in frame.columns]
    frame.columns = columns
    reward_names, constraint_names = outcome_columns(policy)
    if "decision_id" not in columns:
        raise ValueError(f"--from: {path.name} has no decision_id column (columns: {columns})")
    reward_col = next((c for c in reward_names if c in columns), None)
    if reward_col is None:
        raise ValueError(f"--from: {path.name} has no {' or '.join(reward_names)} column (columns: {columns})")
    C = len(constraint_names)
    mode, generic = None, [f"constraint{j}" for j in range(C)]
    if C:
        if all(c in columns for c in constraint_names):
            mode, cols = "columns", constraint_names
        elif all(c in columns for c in generic):
            mode, cols = "columns", generic
        elif "constraints" in columns:
            mode, cols = "json", ["constraints"]
        else:
            raise ValueError(f"--from: {path.name} needs the policy's {C} constraint metric(s): columns "
                             f"{constraint_names}" + (f" (or {generic})" if generic != constraint_names else "")
                             + f", or one 'constraints' column of JSON lists (columns: {columns})")
    rows, problems = [], []
    ids = frame["decision_id"].tolist()
    rewards = frame[reward_col].tolist()
    metric = {c: frame[c].tolist() for c in (cols if C else ())}
    for i in range(len(frame)):
        raw_id = ids[i]
        if isinstance(raw_id, float) and raw_id.is_integer():  # a Parquet id column of floats
            raw_id = int(raw_id)
        decision_id = "" if raw_id is None or (isinstance(raw_id, float) and math.isnan(raw_id)) else str(raw_id).strip()
        try:
            if not decision_id:
                raise ValueError("decision_id: missing")
            reward = _number(rewards[i], reward_col)
            constraints = None
            if mode == "columns":
                constraints = [_number(metric[c][i], c) for c in cols]
            elif mode == "json":
                text = metric["constraints"][i]
                try:
                    values = json.loads(text) if isinstance(text, str) else list(text)
                except (ValueError, TypeError):
                    raise ValueError(f"constraints: expected a JSON list of {C} numbers, got {str(text)[:40]!r}") from None
                if not isinstance(values, list) or len(values) != C:
                    raise ValueError(f"constraints: expected a JSON list of {C} numbers, got {str(text)[:40]!r}")
                constraints = [_number(v, f"constraints[{j}]") for j, v in enumerate(values)]
        except ValueError as exc:
            problems.append((i + 1, decision_id, str(exc)))
            continue
        rows.append((i + 1, decision_id, reward, constraints))
    return rows, problems


def _refusal(path: Path, problems) -> ValueError:
    shown = "; ".join(f"row {n}" + (f" (decision_id {k!r})" if k else "") + f": {m}" for n, k, m in sorted(problems))
    return ValueError(f"--from: {path.name}: {len(problems)} bad row(s), nothing applied: {shown}")


def apply_outcomes(state_dir, source, *, log=None, url: str | None = None, token_file=None) -> dict:
    """Apply the outcomes table ``source`` to the Decider state ``state_dir`` and its log (module
    docstring), or send it to the service at ``url`` (with the token of ``token_file``, or of the
    environment: module docstring). Returns ``{"rows", "applied", "duplicates", "model_version",
    "pending"}`` (the last two None with ``url``)."""
    source = Path(source)
    if not source.is_file():  # before the state and its log are opened
        raise FileNotFoundError(f"--from: no such file {str(source)!r}")
    if source.suffix.lower() not in (".csv", ".txt", ".parquet"):
        raise ValueError(f"--from: expected a .csv or .parquet file, got {source.name!r}")
    if url is not None:
        return _post(state_dir, source, url, token_file)
    from .decider import FeedbackRowsError
    from .serve import Service

    service = Service(state_dir, log=log)  # holds STATE_DIR.lock: refused while a service runs on it
    try:
        decider = service.decider
        rows, problems = read_outcomes(source, decider.policy)
        values = [(k, r, c) for _, k, r, c in rows]
        try:  # the Decider's checks (unknown ids ...) of the rows that read well: every bad row named at once
            accepted = decider.feedback_many(values, check_only=bool(problems))
        except FeedbackRowsError as exc:
            problems += [(rows[i][0], k, m) for i, k, m in exc.problems]
        if problems:
            raise _refusal(source, problems)
        applied = sum(accepted)
        service.snapshot()  # only if something changed (this table, or what the log held beyond the snapshot)
        return {"rows": len(rows), "applied": applied, "duplicates": len(rows) - applied,
                "model_version": decider.model_version, "pending": len(decider.pending),
                "recovered": service.recovered, "log": str(service.log.path)}
    finally:
        service.close()


def _post(state_dir, source: Path, url: str, token_file=None) -> dict:
    from .._extras import require
    from .auth import client_token
    from .decider import Decider

    httpx = require("httpx", "bayes-safe feedback --url")
    token = client_token(token_file, "feedback")  # before any work: a bad token file is named at once
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})
    policy = Decider.load(state_dir).policy  # read only: the column names
    rows, problems = read_outcomes(source, policy)
    if problems:
        raise _refusal(source, problems)
    if not rows:
        return {"rows": 0, "applied": 0, "duplicates": 0, "model_version": None, "pending": None, "recovered": None,
                "log": None}
    body = [{"decision_id": k, "reward": r, **({"constraints": c} if c is not None else {})} for _, k, r, c in rows]
    try:
        response = httpx.post(url.rstrip("/") + "/feedback", content=json.dumps(body).encode(), headers=headers,
                              timeout=600)
    except httpx.HTTPError as exc:
        size = f"; the table's {len(rows)} rows may be more than the service takes in one request " \
            "(--max-body-bytes, default 1 MiB): split it" if len(body) > 1000 else ""
        raise ValueError(f"--url: cannot reach {url} ({type(exc).__name__}: {exc}){size}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = {"detail": response.text[:200]}
    if response.status_code != 200:
        errors = answer.get("errors") if isinstance(answer, dict) else None
        if errors:
            raise _refusal(source, [(rows[e["index"]][0], e.get("decision_id") or "", e["detail"]) for e in errors])
        detail = answer.get("detail") if isinstance(answer, dict) else answer
        if response.status_code == 401:
            raise ValueError(f"--token-file: the service at {url} refused the token ({detail}); give a token with the "
                             "feedback role (--token-file PATH, or BAYES_SAFE_TOKEN)")
        if response.status_code == 403:
            raise ValueError(f"--token-file: the service at {url} refused the request ({detail})")
        if response.status_code == 413:
            raise ValueError(f"--from: {source.name}: {len(rows)} rows are more than the service takes in one request "
                             f"({detail}); split the table (re-sending rows is harmless) or raise the service's limit")
        raise ValueError(f"--url: the service refused the table ({response.status_code}): {detail}")
    return {"rows": len(rows), "applied": int(answer["applied"]), "duplicates": int(answer["duplicates"]),
            "model_version": None, "pending": None, "recovered": None, "log": None}
