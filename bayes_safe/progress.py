"""Progress bars for long calls, notebook-aware (tqdm's ``auto``: a widget in Jupyter, text in a
terminal), and off where nobody watches.

``progress`` arguments of the toolkit's long calls (``Study.run``, ``simulate``) take ``True``
(always a bar), ``False`` (never), or ``"auto"``: a bar that appears only once the call has run
for ``AUTO_DELAY`` seconds, in a notebook or on a terminal (not in a pipe or a log file). The
environment variable ``BAYES_SAFE_PROGRESS=0`` turns every bar off (CI, services).

```python
from bayes_safe.progress import progress_bar

with progress_bar(total=100, desc="fits", unit="fit") as bar:
    for _ in range(100):
        bar.update(1)
```
"""

from __future__ import annotations

import os
import sys

__all__ = ["AUTO_DELAY", "ENV", "progress_bar"]

#: seconds an ``"auto"`` bar waits before it appears (short calls stay quiet)
AUTO_DELAY = 2.0
#: ``BAYES_SAFE_PROGRESS=0`` turns every bar off
ENV = "BAYES_SAFE_PROGRESS"


class _Quiet:
    """A bar that shows nothing (``update``, ``set_postfix_str``, ``close``, a context manager)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(total: int | None, desc: str, unit: str = "it", progress: bool | str = "auto", initial: int = 0):
    """A tqdm bar (module docstring) or a quiet stand-in with the same methods."""
    if progress not in (True, False, "auto"):
        raise ValueError(f"progress: expected True, False or 'auto', got {progress!r}")
    if progress is False or os.environ.get(ENV, "").strip() in ("0", "false", "no", "off"):
        return _Quiet()
    notebook = _in_notebook()
    if progress == "auto" and not notebook and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return _Quiet()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, initial=initial, mininterval=0.5,
                delay=AUTO_DELAY if progress == "auto" else 0.0, disable=False, dynamic_ncols=True)
