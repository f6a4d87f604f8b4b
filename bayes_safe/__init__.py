"""bayes_safe: safe decision-making with Bayesian posteriors.

Quick start:

```python

    import pyro.distributions as dist
    from bayes_safe import BayesianLinear, TSASC, daulton2019, simulate

    env = daulton2019(replications=100, seed=0, alpha=0.01)
    prior = lambda: dist.Normal(0.0, 1.0).expand([env.dim]).to_event(1)   # the weights' own scale
    policy = TSASC(BayesianLinear(prior(), noise_std=0.1, batch_shape=[100]),
                   [BayesianLinear(prior(), noise_std=0.1, batch_shape=[100])], alpha=0.01)
    trace = simulate(policy, env, horizon=500, seed=1)
```

The names below are imported on first use (PEP 562), so ``import bayes_safe`` and the
command line's parser do not load torch; ``from bayes_safe import simulate`` loads what
``simulate`` needs. The batched runner lives in ``bayes_safe.simulation`` (not
``bayes_safe.simulate``: a submodule of that name would replace the function as the
package's attribute as soon as it is imported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the eager imports, for type checkers and IDEs
    from .envs import (
        Constraint,
        Problem,
        Step,
        Units,
        daulton2019,
        kazerouni2017,
        kazerouni2017_neurips,
        make_problem,
    )
    from .models import BayesianLinear, PerArmLinear
    from .policies import TSASC, Greedy, LinUCB, Random, ThompsonSampling
    from .random import ReplicationRNG, replication_seeds
    from .simulation import simulate
    from .trace import Trace

__version__ = "0.1.0"

#: public name -> the submodule (relative to this package) that defines it
_SOURCES = {
    "TSASC": ".policies",
    "BayesianLinear": ".models",
    "Greedy": ".policies",
    "LinUCB": ".policies",
    "PerArmLinear": ".models",
    "Random": ".policies",
    "ReplicationRNG": ".random",
    "ThompsonSampling": ".policies",
    "Trace": ".trace",
    "Constraint": ".envs",
    "Problem": ".envs",
    "Step": ".envs",
    "Units": ".envs",
    "daulton2019": ".envs",
    "kazerouni2017": ".envs",
    "kazerouni2017_neurips": ".envs",
    "make_problem": ".envs",
    "replication_seeds": ".random",
    "simulate": ".simulation",
}

__all__ = [
    "TSASC",
    "BayesianLinear",
    "Constraint",
    "Greedy",
    "LinUCB",
    "PerArmLinear",
    "Problem",
    "Random",
    "ReplicationRNG",
    "Step",
    "ThompsonSampling",
    "Trace",
    "Units",
    "daulton2019",
    "kazerouni2017",
    "kazerouni2017_neurips",
    "make_problem",
    "replication_seeds",
    "simulate",
]


def __getattr__(name: str):
    """Import a public name from its submodule on first access, then keep it as an attribute."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
