"""Group commit: a replica's log writes gathered into one statement per round trip, on the event loop.

A replica of ``bayes-safe serve`` writes every decision and every feedback to its PostgreSQL log
and acknowledges it only once committed (``replica``'s module docstring). One round trip per
request, made from a thread of the pool, left a replica at 0.44x one process on SQLite
(``benchmarks/replicas.py``): the server's CPU went to the thread hops and the driver, one of
each per row. ``GroupCommit`` writes from the event loop on one asynchronous connection
(psycopg's ``AsyncConnection``): a request awaits its row; the rows that arrive while a write is
on its way go together in the next one, as one statement (the decisions as one ``INSERT``, the
feedback as one ``INSERT ... RETURNING`` under the replicas' advisory lock, both in one
statement when both are waiting). Under light traffic a write carries one row and costs what it
did; under load a round trip carries many. Nothing changes for the client: a row is
acknowledged when the statement that carries it has committed, and a failed statement fails
every request it carried (``LogUnavailable`` when the server is unreachable: the service answers
503 and the next write connects again).

Feedback keeps the log's order guarantee (``DecisionLog.write_feedback_shared``): the
statement takes the advisory lock its writers share before inserting, so ``seq`` follows
commit order across replicas. Within one statement the first of two rows for the same decision
is the one written (the second is acknowledged and ignored, as a re-sent row is); a decision
is never in the same statement as its feedback (the client has the decision's id only once it
committed).
"""

from __future__ import annotations

import asyncio
import contextlib

from .log import (
    _DECISION_COLUMNS,
    _PG_FEEDBACK_KEY,
    LogError,
    LogURL,
    decision_row,
    feedback_row,
    pg_error,
    pg_stale,
)

__all__ = ["GroupCommit"]

_DECISION_TYPES = ("text", "float8", "int8", "float8", "float8", "int8", "int8", "text", "text", "int8")


def _values(n: int, types: tuple[str, ...], ordinal: bool = False) -> str:
    """``VALUES`` of ``n`` rows of placeholders cast to ``types`` (and each row's position when
    ``ordinal``). One statement text per row count, so the server plans each count once (psycopg
    prepares a statement it has run 5 times): cheaper than one text for every count with
    ``unnest`` of arrays (0.31 against 0.16 ms a one-row decision on 127.0.0.1)."""
    row = ", ".join(f"%s::{t}" for t in types)
    return "VALUES " + ", ".join(f"({row}{f', {i}' if ordinal else ''})" for i in range(n))


def _decisions_sql(n: int) -> str:
    return f"INSERT INTO decisions ({', '.join(_DECISION_COLUMNS)}) {_values(n, _DECISION_TYPES)}"


def _feedback_sql(n: int) -> str:
    """Feedback rows of known decisions, in the given order, under the replicas' advisory lock."""
    return ("WITH turn AS (SELECT pg_advisory_xact_lock(%s)) "
            "INSERT INTO feedback (decision_id, time, reward, constraints) "
            "SELECT v.decision_id, v.time, v.reward, v.constraints "
            f"FROM ({_values(n, ('text', 'float8', 'float8', 'text'), ordinal=True)}) "
            "AS v (decision_id, time, reward, constraints, i) JOIN decisions d USING (decision_id) CROSS JOIN turn "
            "WHERE NOT EXISTS (SELECT 1 FROM outcomes o WHERE o.decision_id = v.decision_id) "
            "ORDER BY v.i ON CONFLICT DO NOTHING RETURNING decision_id")


def _both_sql(decisions: int, feedback: int) -> str:
    """Both in one statement: the decisions' INSERT a data-modifying ``WITH`` (run to completion
    whatever the main query reads)."""
    return f"WITH dec AS ({_decisions_sql(decisions)}), " + _feedback_sql(feedback).removeprefix("WITH ")


class GroupCommit:
    """The log writes of one replica process, batched per round trip (module docstring).

    Args:
        url: the PostgreSQL log (``DecisionLog.path`` of the replica's log: its tables exist).

    ``await decision(row)`` and ``await feedback(key, reward, constraints)`` from coroutines of
    one event loop; ``close()`` when the loop is done. ``statements`` and ``rows`` count what was
    written (``rows / statements``: the rows a round trip carried on average).
    """

    def __init__(self, url: LogURL, writers: int = 2):
        import psycopg

        self.psycopg = psycopg
        self.url = url
        self._waiting: list[tuple[str, tuple, asyncio.Future]] = []
        self._writers: list[asyncio.Task | None] = [None] * writers
        self._conns: list = [None] * writers
        self.statements = self.rows = 0

    async def decision(self, row: tuple) -> None:
        """Commit a decision: ``row`` the arguments of ``DecisionLog.write_decision`` (its
        ``decision_id`` first). Raises ``LogUnavailable`` / ``LogError`` when not written."""
        await self._submit("decision", decision_row(*row))

    async def feedback(self, decision_id: str, reward: float, constraints) -> bool | None:
        """Commit a feedback row: True if written, False if the decision already had feedback, None
        if the log holds no such decision (``DecisionLog.write_feedback_shared``'s answers)."""
        return await self._submit("feedback", feedback_row(decision_id, reward, constraints))

    def _submit(self, kind: str, row: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((kind, row, future))
        for i, writer in enumerate(self._writers):
            if writer is None or writer.done():  # a writer free: it takes what waits now
                self._writers[i] = loop.create_task(self._write_all(i))
                break
        return future

    async def _write_all(self, w: int) -> None:
        """Writer ``w``: write what waits, one statement at a time, until nothing does."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                answers = await self._write(batch, w)
            except BaseException as exc:  # every request the statement carried fails with it
                error = exc if isinstance(exc, Exception) else LogError(f"log: {self.url}: the write was cancelled")
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, _, future), answer in zip(batch, answers):
                if not future.done():  # (a request cancelled while it waited)
                    future.set_result(answer)

    async def _write(self, batch: list[tuple[str, tuple, asyncio.Future]], w: int) -> list:
        """One statement for ``batch``; the answers in its order."""
        decisions = [row for kind, row, _ in batch if kind == "decision"]
        first: dict[str, int] = {}  # each decision's first feedback row in the batch: the one written
        feedback = []
        for i, (kind, row, _) in enumerate(batch):
            if kind == "feedback" and row[0] not in first:
                first[row[0]] = i
                feedback.append(row)
        params = [x for row in decisions for x in row]
        if feedback:
            params += [_PG_FEEDBACK_KEY, *(x for row in feedback for x in row)]
        sql = (_both_sql(len(decisions), len(feedback)) if decisions and feedback
               else _decisions_sql(len(decisions)) if decisions else _feedback_sql(len(feedback)))
        try:
            conn = await self._connection(w)
            async with conn.cursor() as cur:
                await cur.execute(sql, params)
                written = {r[0] for r in await cur.fetchall()} if feedback else set()
                missing = [row[0] for row in feedback if row[0] not in written]
                there = set()
                if missing:  # not written: a duplicate (the decision is there) or an unknown decision
                    await cur.execute("SELECT decision_id FROM decisions WHERE decision_id = ANY(%s)", [missing])
                    there = {r[0] for r in await cur.fetchall()}
        except self.psycopg.Error as exc:
            if isinstance(exc, (self.psycopg.OperationalError, self.psycopg.InterfaceError)):
                await self._drop(w)
            raise pg_error(self.url, exc) from None
        self.statements += 1
        self.rows += len(batch)
        answers = []
        for i, (kind, row, _) in enumerate(batch):
            if kind == "decision":
                answers.append(None)
            elif row[0] in written:
                answers.append(first[row[0]] == i)
            else:
                answers.append(False if row[0] in there else None)
        return answers

    async def _connection(self, w: int):
        conn = self._conns[w]
        if conn is None or pg_stale(conn):  # (idle since the last write: its server may have gone away)
            await self._drop(w)
            options = {} if "connect_timeout" in self.url._url else {"connect_timeout": 10}
            self._conns[w] = conn = await self.psycopg.AsyncConnection.connect(self.url._url, autocommit=True, **options)
        return conn

    async def _drop(self, w: int) -> None:
        conn, self._conns[w] = self._conns[w], None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close: it is gone either way
                await conn.close()

    async def close(self) -> None:
        """Finish the writes under way, then close the connections."""
        running = [t for t in self._writers if t is not None and not t.done()]
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        for w in range(len(self._conns)):
            await self._drop(w)
