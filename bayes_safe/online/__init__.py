"""The production loop: decide one unit with its propensity, learn from delayed feedback, log, persist.

``Decider`` wraps any policy (``R = 1``); ``DecisionLog`` records decisions and feedback in
SQLite and reads back as ``bayes_safe.offline.LoggedData`` or obp's ``bandit_feedback``.
``bayes_safe.online.serve`` (``bayes-safe serve STATE_DIR``) puts a saved Decider behind HTTP
(FastAPI, the ``serve`` extra); it is imported on first use, so importing this package stays cheap.
``Decider.load(state, log=...)`` checks that a log belongs to a snapshot and replays it
(``Decider.check_log``, ``Decider.replay``). ``bayes_safe.online.tuning.LoggedAlpha`` tunes a
served TS-ASC's alpha from its decision log with ``bayes_safe.tuning.Study``.
"""

from .decider import Decider, Decision, FeedbackRowsError
from .log import DecisionLog
from .replica import ReplicaDecider

__all__ = ["Decider", "Decision", "DecisionLog", "FeedbackRowsError", "ReplicaDecider"]


def __getattr__(name: str):
    if name == "serve":  # the HTTP service module, loaded on first use (its FastAPI import is lazier still)
        import importlib

        return importlib.import_module(".serve", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
