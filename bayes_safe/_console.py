"""The library's messages on the console: ``logging.getLogger("bayes_safe")`` and its children.

Library modules log (``logging.getLogger(__name__)``) and never configure logging; the two entry
points that own the process do: the command line (``bayes-safe CMD``) and ``serve()``, through
``console_logging``, which prints each record as ``bayes-safe CMD: message`` (INFO on stdout,
WARNING and above on stderr). In Python, configure ``logging`` as for any library.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["console_logging"]


class ConsoleHandler(logging.Handler):
    """A record as the command's line: ``bayes-safe CMD: message``, INFO on stdout, WARNING and
    above on stderr (the streams looked up at each record, so a caller that swaps ``sys.stdout``
    sees them)."""

    def __init__(self, command: str):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(f"bayes-safe {command}: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a failed message never fails the program
            self.handleError(record)


def console_logging(command: str, *, only_if_unconfigured: bool = False) -> None:
    """Print the library's messages as ``bayes-safe {command}: ...`` lines. ``only_if_unconfigured``:
    leave an application's own logging alone (a handler on ``bayes_safe`` or on the root logger)."""
    logger = logging.getLogger("bayes_safe")
    if only_if_unconfigured and ([h for h in logger.handlers if not isinstance(h, ConsoleHandler)]
                                 or logging.getLogger().handlers):
        return
    for handler in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
        logger.removeHandler(handler)
    logger.addHandler(ConsoleHandler(command))
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the command's own lines, not an application's root handlers as well
