"""The production loop: decide one unit with its propensity, learn from delayed feedback, log, persist.

``Decider`` wraps any policy (``R = 1``); ``DecisionLog`` records decisions and feedback in
SQLite and reads back as ``bayes_safe.offline.LoggedData`` or obp's ``bandit_feedback``.
"""

from .decider import Decider, Decision
from .log import DecisionLog

__all__ = ["Decider", "Decision", "DecisionLog"]
