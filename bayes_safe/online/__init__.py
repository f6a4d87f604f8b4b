"""The production loop: decide one unit with its propensity, learn from delayed feedback, log, persist.

``Decider`` wraps any policy (``R = 1``); ``DecisionLog`` records decisions and feedback in
SQLite and reads back as ``bayes_safe.offline.LoggedData`` or obp's ``bandit_feedback``.
``bayes_safe.online.serve`` (``bayes-safe serve STATE_DIR``) puts a saved Decider behind HTTP
(FastAPI, the ``serve`` extra); it is imported on first use, so importing this package stays cheap.
``Decider.load(state, log=...)`` checks that a log belongs to a snapshot and replays it
(``Decider.check_log``, ``Decider.replay``). ``bayes_safe.online.tuning.LoggedAlpha`` tunes a
served TS-ASC's alpha from its decision log with ``bayes_safe.tuning.Study``.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decider import Decider, Decision, FeedbackRowsError
    from .log import DecisionLog
    from .replica import ReplicaDecider

__all__ = ["Decider", "Decision", "DecisionLog", "FeedbackRowsError", "ReplicaDecider"]

#: the names this package exports, by the module that defines them: imported on first use, so that a
#: module of the package that needs no torch (``auth``, the client of ``bayes-safe feedback --url``)
#: imports none
_LAZY = {"Decider": ".decider", "Decision": ".decider", "FeedbackRowsError": ".decider", "DecisionLog": ".log",
         "ReplicaDecider": ".replica"}


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name == "serve":  # the HTTP service module, loaded on first use (its FastAPI import is lazier still)
        return importlib.import_module(".serve", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
