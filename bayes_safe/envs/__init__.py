"""Problems: what a policy faces. ``make_problem(name, ...)`` builds a fixed-arm linear problem by name.

Contextual problems with their own protocols (video upload, movie recommendation, warfarin
dosing) are exported here too but are not in ``PROBLEMS``: each documents how it is run.
"""

from __future__ import annotations

from .linear import LinearBandit, Step, daulton2019, kazerouni2017, kazerouni2017_neurips
from .video_upload import VideoUpload, video_upload

PROBLEMS = {
    "kazerouni2017": kazerouni2017,
    "kazerouni2017-neurips": kazerouni2017_neurips,
    "daulton2019": daulton2019,
}


def make_problem(name: str, **kwargs):
    """Build the problem registered as ``name`` (see ``PROBLEMS``) with keyword options."""
    if name not in PROBLEMS:
        raise ValueError(f"problem: unknown name {name!r}; expected one of {sorted(PROBLEMS)}")
    return PROBLEMS[name](**kwargs)


__all__ = [
    "PROBLEMS", "LinearBandit", "Step", "VideoUpload", "daulton2019", "kazerouni2017", "kazerouni2017_neurips",
    "make_problem", "video_upload",
]

from .movies import load_movielens, movie_recommendation, synthetic_movielens
from .warfarin import load_iwpc, warfarin

__all__ += ["load_iwpc", "load_movielens", "movie_recommendation", "synthetic_movielens", "warfarin"]
