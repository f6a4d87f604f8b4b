"""Bulk feedback: a table of outcomes joined on decision ids, applied to a served Decider's state.

    bayes-safe feedback STATE_DIR --from outcomes.csv|outcomes.parquet [--log LOG]
    bayes-safe feedback [STATE_DIR] --from outcomes.csv|outcomes.parquet --url URL [--token-file PATH] [--chunk-rows N]

**The table.** One row per outcome (other columns are ignored):

* ``decision_id``: the id ``/decide`` returned;
* ``reward`` (or the reward's metric name, when the policy has ``metric_names``);
* the constraint metrics, one column each: the policy's ``metric_names`` after the reward
  (``TSASC(..., metric_names=["revenue", "satisfaction"])``: a ``satisfaction`` column), else
  ``constraint0``, ``constraint1``, ...; or one ``constraints`` column holding a JSON list per
  row (``[0.9]``). A policy without constraint models needs none.

An empty cell (``null`` in a JSON list) is a metric not known yet (issue 45): a conversion today
in one table, its refund in a later one; each metric is learned once, when it first arrives
(``Decider.feedback``; TS-ASC). A row needs at least one known metric.

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
would lose updates) and a service cannot start on it meanwhile.

**``--url``: posting, not loading.** ``bayes-safe feedback [STATE_DIR] --from TABLE --url URL``
sends the table to the running service (one process or a replica: any replica takes any
decision's feedback) and never loads a state: no posterior is built and no lock is taken, so it
takes well under a second and works beside a service or a replica. ``STATE_DIR`` is optional: when
given, only its ``policy.json`` is read, for the names of the table's metric columns
(``metric_names``); without it the table has ``reward`` and ``constraint0``, ``constraint1``, ...
columns (or one ``constraints`` column of JSON lists), and the service checks their number. The
table's shape is checked here first (the columns, every value a finite number: a bad row refuses
the table, nothing sent); then it is sent as ``POST /feedback`` lists of at most ``--chunk-rows``
rows (default ``CHUNK_ROWS``, 1000, and under 1 MiB each), each chunk applied all or nothing by
the service (an unknown decision id refuses its chunk, naming the row). The command prints the
rows accepted, duplicated (already had feedback: ignored) and the requests sent. A chunk that
fails (a refused row, a 4xx / 5xx, an unreachable service) ends the command with status 2 and one
line naming the chunk (its rows of the table) and how many rows landed before it; those stay
applied, so sending the table again once fixed is safe (they come back as duplicates). A
service with tokens needs one with the ``feedback`` role: ``--token-file PATH``, else the
environment variable ``BAYES_SAFE_TOKEN``, else the file ``BAYES_SAFE_TOKEN_FILE`` names
(``bayes_safe.online.auth.client_token``). A chunk larger than the service takes in one request
(``--max-feedback-items``, ``--max-body-bytes``) is a 413: lower ``--chunk-rows``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["apply_outcomes", "outcome_columns", "read_outcomes"]

#: ``--url``: the rows of one request (a chunk, applied all or nothing by the service), at most; and the
#: bytes of its body, at most (the service's defaults: 10,000 items, 1 MiB)
CHUNK_ROWS = 1000
CHUNK_BYTES = 900_000


def outcome_columns(policy) -> tuple[list[str], list[str]]:
    """``(reward column names accepted, constraint column names)`` of ``policy``'s table."""
    from .metrics import metric_names

    names = metric_names(policy)
    has_names = getattr(policy, "metric_names", None) is not None
    reward = ["reward"] + ([names[0]] if has_names and names[0] != "reward" else [])
    return reward, names[1:]


def _known(value, what: str) -> float | None:
    """A metric's cell: None when empty (a metric not known yet: outcomes metric by metric, issue 45),
    else ``_number``."""
    if value is None or (isinstance(value, str) and not value.strip()) or (
            isinstance(value, float) and math.isnan(value)):
        return None
    return _number(value, what)


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
    """The rows of an outcomes table as ``(row number, decision_id, reward, constraints)`` and every bad
    row as ``(row number, decision_id, message)``; a table without the needed columns is a ``ValueError``."""
    return _read_table(path, *outcome_columns(policy))


def _read_table(path, reward_names: list[str], constraint_names: list[str] | None):
    """``read_outcomes`` with the columns named: ``constraint_names`` None when the policy is not known
    (``--url`` without a state): then the constraints are the table's ``constraint0``, ``constraint1``,
    ... columns, else its ``constraints`` column of JSON lists, else none (the service checks their number)."""
    path = Path(path)
    frame = _frame(path)
    columns = [str(c).strip() for c in frame.columns]
    frame.columns = columns
    if constraint_names is None:
        constraint_names = []
        while f"constraint{len(constraint_names)}" in columns:
            constraint_names.append(f"constraint{len(constraint_names)}")
        any_length = not constraint_names and "constraints" in columns
    else:
        any_length = False
    if "decision_id" not in columns:
        raise ValueError(f"--from: {path.name} has no decision_id column (columns: {columns})")
    reward_col = next((c for c in reward_names if c in columns), None)
    if reward_col is None:
        raise ValueError(f"--from: {path.name} has no {' or '.join(reward_names)} column (columns: {columns})")
    C = len(constraint_names)
    mode, generic = None, [f"constraint{j}" for j in range(C)]
    if any_length:
        mode, cols = "json", ["constraints"]
    elif C:
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
    metric = {c: frame[c].tolist() for c in (cols if mode else ())}
    for i in range(len(frame)):
        raw_id = ids[i]
        if isinstance(raw_id, float) and raw_id.is_integer():  # a Parquet id column of floats
            raw_id = int(raw_id)
        decision_id = "" if raw_id is None or (isinstance(raw_id, float) and math.isnan(raw_id)) else str(raw_id).strip()
        try:
            if not decision_id:
                raise ValueError("decision_id: missing")
            reward = _known(rewards[i], reward_col)
            constraints = None
            if mode == "columns":
                constraints = [_known(metric[c][i], c) for c in cols]
            elif mode == "json":
                text = metric["constraints"][i]
                try:
                    values = json.loads(text) if isinstance(text, str) else list(text)
                except (ValueError, TypeError):
                    raise ValueError(f"constraints: expected a JSON list of {'' if any_length else f'{C} '}numbers, "
                                     f"got {str(text)[:40]!r}") from None
                if any_length and not isinstance(values, list):
                    raise ValueError(f"constraints: expected a JSON list of numbers, got {str(text)[:40]!r}")
                if not any_length and (not isinstance(values, list) or len(values) != C):
                    raise ValueError(f"constraints: expected a JSON list of {C} numbers, got {str(text)[:40]!r}")
                constraints = [None if v is None else _number(v, f"constraints[{j}]") for j, v in enumerate(values)]
            if reward is None and (constraints is None or all(v is None for v in constraints)):
                raise ValueError(f"{reward_col}: missing (a row needs at least one known metric; an empty cell is a "
                                 "metric not known yet)")
        except ValueError as exc:
            problems.append((i + 1, decision_id, str(exc)))
            continue
        rows.append((i + 1, decision_id, reward, constraints))
    return rows, problems


def _refusal(path: Path, problems) -> ValueError:
    shown = "; ".join(f"row {n}" + (f" (decision_id {k!r})" if k else "") + f": {m}" for n, k, m in sorted(problems))
    return ValueError(f"--from: {path.name}: {len(problems)} bad row(s), nothing applied: {shown}")


def apply_outcomes(state_dir, source, *, log=None, url: str | None = None, token_file=None,
                   chunk_rows: int = CHUNK_ROWS) -> dict:
    """Apply the outcomes table ``source`` to the Decider state ``state_dir`` and its log (module
    docstring), or send it to the service at ``url`` (with the token of ``token_file``, or of the
    environment: module docstring) in chunks of at most ``chunk_rows`` rows; with ``url``,
    ``state_dir`` may be None and is never loaded (it only names the table's columns). Returns
    ``{"rows", "applied", "duplicates", "model_version", "pending"}`` (the last two None with ``url``,
    which adds ``"chunks"``, the requests sent)."""
    source = Path(source)
    if not source.is_file():  # before the state and its log are opened
        raise FileNotFoundError(f"--from: no such file {str(source)!r}")
    if source.suffix.lower() not in (".csv", ".txt", ".parquet"):
        raise ValueError(f"--from: expected a .csv or .parquet file, got {source.name!r}")
    if url is not None:
        return _post(state_dir, source, url, token_file, chunk_rows)
    if state_dir is None:
        raise ValueError("STATE_DIR: required without --url (the state the table's outcomes are applied to)")
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


def _state_columns(state_dir) -> tuple[list[str], list[str] | None]:
    """``outcome_columns`` of the policy saved in ``state_dir``, read from its ``policy.json`` alone (no
    model is built, torch is not needed: a replica's state or one being served reads as well); without a
    state, or one this cannot read, ``(["reward"], None)``: the table's own ``constraint0, ...`` or
    ``constraints`` columns (``_read_table``)."""
    if state_dir is None:
        return ["reward"], None
    try:
        node = json.loads((Path(state_dir) / "policy.json").read_text())["object"]
        C = sum(1 for role in node["models"] if str(role).startswith("constraint"))
        named = node.get("metric_names")
    except (OSError, ValueError, KeyError, TypeError):
        return ["reward"], None
    names = [str(n) for n in named] if isinstance(named, list) and len(named) == C + 1 else None
    if names is None:
        return ["reward"], [f"constraint{j}" for j in range(C)]
    return ["reward"] + ([names[0]] if names[0] != "reward" else []), names[1:]


def _shown_url(url: str) -> str:
    """``url`` without a password in its user part (``https://user:secret@host`` -> ``https://user@host``)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that does not parse)"
    if "@" not in parts.netloc:
        return url
    user, host = parts.netloc.rsplit("@", 1)
    return urlunsplit((parts.scheme, f"{user.split(':', 1)[0]}@{host}", parts.path, parts.query, parts.fragment))


def _chunks(body: list[bytes], rows: int, size: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` of the items ``body`` (their JSON) in requests of at most ``rows`` items and ``size`` bytes."""
    out, start, used = [], 0, 2
    for i, item in enumerate(body):
        if i > start and (i - start >= rows or used + len(item) + 1 > size):
            out.append((start, i))
            start, used = i, 2
        used += len(item) + 1
    if start < len(body):
        out.append((start, len(body)))
    return out


def _post(state_dir, source: Path, url: str, token_file=None, chunk_rows: int = CHUNK_ROWS) -> dict:
    """``--url``: the table checked here (its columns, its numbers), then POSTed to ``url/feedback`` in
    chunks of at most ``chunk_rows`` rows, each applied all or nothing by the service; ``state_dir`` (may be
    None) only names the columns (``_state_columns``). A failed chunk is a ``ValueError`` naming it and
    what the chunks before it did (they stay applied)."""
    from .._extras import require
    from .auth import client_token

    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"--chunk-rows: expected a positive int, got {chunk_rows!r}")
    shown = _shown_url(url)
    if not shown.lower().startswith(("http://", "https://")):
        raise ValueError(f"--url: expected the service's http:// or https:// address, got {shown!r}")
    httpx = require("httpx", "bayes-safe feedback --url")
    token = client_token(token_file, "feedback")  # before any work: a bad token file is named at once
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})
    rows, problems = _read_table(source, *_state_columns(state_dir))
    if problems:
        raise _refusal(source, problems)
    out = {"rows": len(rows), "applied": 0, "duplicates": 0, "chunks": 0, "model_version": None, "pending": None,
           "recovered": None, "log": None}
    if not rows:
        return out
    body = [json.dumps({"decision_id": k, "reward": r, **({"constraints": c} if c is not None else {})}).encode()
            for _, k, r, c in rows]
    chunks = _chunks(body, chunk_rows, CHUNK_BYTES)
    endpoint = url.rstrip("/") + "/feedback"
    with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client:
        for n, (a, b) in enumerate(chunks, start=1):
            first, last = rows[a][0], rows[b - 1][0]
            where = f"chunk {n} of {len(chunks)} (rows {first}-{last} of {source.name})"

            def before(landed_now: str = "", n=n) -> str:
                if n == 1:
                    return f"; no row landed before it{landed_now}"
                return (f"; {out['applied'] + out['duplicates']} rows landed before it (chunks 1-{n - 1}: "
                        f"{out['applied']} applied, {out['duplicates']} already had feedback){landed_now}")

            again = "; send the table again once fixed (rows that landed are acknowledged as duplicates)"
            try:
                response = client.post(endpoint, content=b"[" + b",".join(body[a:b]) + b"]", headers=headers)
            except httpx.HTTPError as exc:
                sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol))
                what = ("no answer" + (", so it may or may not have landed" if sent else ""))
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise ValueError(f"--url: cannot reach {shown} ({type(exc).__name__}: {reason}); {where}: {what}"
                                 + before() + again) from None
            try:
                answer = response.json()
            except ValueError:
                answer = {"detail": " ".join(response.text[:200].split())}
            if response.status_code == 200 and isinstance(answer, dict) and "applied" in answer:
                out["applied"] += int(answer["applied"])
                out["duplicates"] += int(answer["duplicates"])
                out["chunks"] = n
                continue
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            errors = answer.get("errors") if isinstance(answer, dict) else None
            code = response.status_code
            if errors:
                bad = "; ".join(f"row {rows[a + int(e['index'])][0]}" + (f" (decision_id {e['decision_id']!r})"
                                                                          if e.get("decision_id") else "")
                                + f": {e.get('detail')}" for e in errors if isinstance(e, dict) and "index" in e)
                raise ValueError(f"--from: {source.name}: the service at {shown} refused {where} ({code}): "
                                 f"{len(errors)} bad row(s), nothing of the chunk applied: {bad}" + before() + again)
            if code == 401:
                raise ValueError(f"--token-file: the service at {shown} refused the token ({detail}); give a token "
                                 f"with the feedback role (--token-file PATH, or BAYES_SAFE_TOKEN); {where} not "
                                 "applied" + before())
            if code == 403:
                raise ValueError(f"--token-file: the service at {shown} refused the request ({detail}); {where} not "
                                 "applied" + before())
            if code == 413:
                raise ValueError(f"--chunk-rows: the service at {shown} refused {where} as too large ({detail}); "
                                 "send smaller chunks (--chunk-rows) or raise the service's limit" + before() + again)
            raise ValueError(f"--url: the service at {shown} answered {code} to {where} ({detail}); nothing of the "
                             "chunk applied" + before() + again)
    return out
