"""The replicas' group commit (``bayes_safe.online.group_commit``) against a real PostgreSQL server:
rows that wait together go in one statement, each request gets its own row's answer, a failed
statement fails every request it carried, and the next write connects again."""

from __future__ import annotations

import asyncio

import pytest

from bayes_safe.online import DecisionLog
from bayes_safe.online.group_commit import GroupCommit
from bayes_safe.online.log import LogUnavailable


def _row(n: int, action: int = 1) -> tuple:
    """``write_decision``'s arguments for decision number ``n`` (two actions, a 3-number context)."""
    return (str(n), action, 0.75, 0.03, 2, [0.5, -1.0, 2.0], [0.25, 0.75], 0)


def test_requests_waiting_together_share_a_statement_and_get_their_own_answers(postgres_server):
    log = DecisionLog(postgres_server.url())
    log.write_decision("100", 0, 0.5, 0.1, 0, [1.0], [0.5, 0.5])
    log.write_feedback_shared([("100", 1.0, [0.0])])

    async def main():
        commit = GroupCommit(log.path)
        try:
            await asyncio.gather(*(commit.decision(_row(n)) for n in range(10)))  # 10 requests at once
            first = commit.statements
            answers = await asyncio.gather(
                commit.feedback("3", 1.5, [0.25]),    # new
                commit.feedback("3", 9.0, [9.0]),     # the same decision again, in the same statement
                commit.feedback("100", 2.0, None),    # had feedback before
                commit.feedback("77", 1.0, [0.0]),    # no such decision
                commit.feedback("4", -0.5, [1.0]),    # new
                commit.decision(_row(10, action=0)),  # a decision in the same statement as feedback
            )
            return first, answers, commit.statements, commit.rows
        finally:
            await commit.close()

    first, answers, statements, rows = asyncio.run(main())
    assert first < 10  # the ten decisions did not take ten round trips
    assert answers == [True, False, False, None, True, None]
    assert statements <= first + 2 and rows == 16
    assert log.actions_of([str(n) for n in range(11)]) == {**{str(n): 1 for n in range(10)}, "10": 0}
    assert log.feedback_for(["3", "4"]) == [("3", 1.5, [0.25]), ("4", -0.5, [1.0])]  # the first row of "3"
    row = log.to_dataframe().set_index("decision_id").loc["7"]
    assert (row.propensity, row.model_version, row.num_actions, row.baseline) == (0.75, 2, 2, 0)
    # seq follows commit order: the new rows after the older one, as a replica's sync reads them
    assert [k for _, k, *_ in log.feedback_since(0)] == ["100", "3", "4"]
    log.close()


def test_a_failed_statement_fails_every_request_it_carried_and_the_next_connects_again(postgres_server):
    log = DecisionLog(postgres_server.url())

    async def main():
        commit = GroupCommit(log.path)
        try:
            await commit.decision(_row(0))  # connected
            postgres_server.stop()
            try:
                down = await asyncio.gather(*(commit.decision(_row(n)) for n in (1, 2, 3)),
                                            commit.feedback("0", 1.0, None), return_exceptions=True)
            finally:
                postgres_server.start()
            await commit.decision(_row(4))  # the server is back: no restart of anything
            return down, await commit.feedback("0", 1.0, None)
        finally:
            await commit.close()

    down, after = asyncio.run(main())
    assert all(isinstance(x, LogUnavailable) and "unavailable" in str(x) for x in down)
    assert after is True
    assert sorted(log.actions_of([str(n) for n in range(5)])) == ["0", "4"]  # nothing of the failed statement
    log.close()


def test_a_row_the_log_refuses_is_a_log_error_and_the_next_statement_is_written(postgres_server):
    from bayes_safe.online.log import LogError

    log = DecisionLog(postgres_server.url())
    log.write_decision("0", 0, 0.5, 0.1, 0, [1.0], [0.5, 0.5])

    async def main():
        commit = GroupCommit(log.path)
        try:
            with pytest.raises(LogError, match="duplicate key"):  # decision 0 is in the log already
                await commit.decision(_row(0))
            await commit.decision(_row(1))  # the next statement is written
        finally:
            await commit.close()

    asyncio.run(main())
    assert log.actions_of(["1"]) == {"1": 1}
    log.close()
