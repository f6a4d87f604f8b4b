"""Problems: what a policy faces. ``make_problem(name, ...)`` builds a fixed-arm linear problem by name
(the stationary presets and their drifting versions, ``drifting.py``).

Your own problem subclasses ``Problem`` (``problem.py``: ``draw`` units, ``outcomes`` of any
actions with common random numbers, ``Constraint`` declarations with their direction and
form); ``simulate``, the tuning layer and ``bayes-safe simulate|tune --problem module:Class``
consume it.

Contextual problems with their own protocols (video upload, movie recommendation, warfarin
dosing, ``SparseDosing``: sparse dose finding with many covariates) are exported here too but
are not in ``PROBLEMS``: each documents how it is run.
Two problem interfaces live here as well: ``BCTSProblem`` (the finite table a BCTS
experiment runs on, ``bayes_safe.experiments.run_bcts``) and ``ABProblem`` (what an A/B test
of ``bayes_safe.tuning`` needs from a problem; ``VideoUploadProblem`` is the paper's).
"""

from __future__ import annotations

from .ab_problem import ABProblem
from .bcts_problem import BCTSProblem
from .drifting import (
    DriftingLinearBandit,
    abrupt_change,
    daulton2019_abrupt,
    daulton2019_rotating,
    kazerouni2017_neurips_abrupt,
    kazerouni2017_neurips_rotating,
    rotation,
)
from .linear import LinearBandit, Step, daulton2019, kazerouni2017, kazerouni2017_neurips
from .movies import load_movielens, movie_recommendation, synthetic_movielens
from .problem import Constraint, Problem, Units, check_problem
from .sparse_dosing import SparseDosing
from .video_upload import VideoUpload, VideoUploadProblem, video_upload
from .warfarin import load_iwpc, warfarin

PROBLEMS = {
    "kazerouni2017": kazerouni2017,
    "kazerouni2017-neurips": kazerouni2017_neurips,
    "daulton2019": daulton2019,
    # drifting presets (bayes_safe.envs.drifting): an abrupt change at a step, a slow rotation
    "kazerouni2017-neurips-abrupt": kazerouni2017_neurips_abrupt,
    "kazerouni2017-neurips-rotating": kazerouni2017_neurips_rotating,
    "daulton2019-abrupt": daulton2019_abrupt,
    "daulton2019-rotating": daulton2019_rotating,
}


def make_problem(name: str, **kwargs):
    """Build the problem registered as ``name`` (see ``PROBLEMS``) with keyword options."""
    if name not in PROBLEMS:
        raise ValueError(f"problem: unknown name {name!r}; expected one of {sorted(PROBLEMS)}")
    return PROBLEMS[name](**kwargs)


__all__ = [
    "PROBLEMS",
    "ABProblem",
    "BCTSProblem",
    "Constraint",
    "DriftingLinearBandit",
    "LinearBandit",
    "Problem",
    "SparseDosing",
    "Step",
    "Units",
    "VideoUpload",
    "VideoUploadProblem",
    "abrupt_change",
    "check_problem",
    "daulton2019",
    "daulton2019_abrupt",
    "daulton2019_rotating",
    "kazerouni2017",
    "kazerouni2017_neurips",
    "kazerouni2017_neurips_abrupt",
    "kazerouni2017_neurips_rotating",
    "load_iwpc",
    "load_movielens",
    "make_problem",
    "movie_recommendation",
    "rotation",
    "synthetic_movielens",
    "video_upload",
    "warfarin",
]
