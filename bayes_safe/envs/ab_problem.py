"""What an A/B-testable problem is: the interface ``bayes_safe.tuning.ABTest`` runs trials on.

A problem gives a seeded stream of units (uploads, requests, patients), their outcomes under
any actions with common random numbers, a factory of the policies compared in a trial, the
feedback a policy learns from and the per-unit metrics a trial reports. ``ABProblem`` is the
base class to subclass; ``bayes_safe.envs.video_upload.VideoUploadProblem`` is the paper's
problem (Daulton et al. 2019, section 5) and ``bayes_safe.tuning.LoggedDataProblem`` an
offline one estimated from logs.

The problem lives with the environments; the engine that runs the A/B test
(``bayes_safe.tuning.ABTest``), the search space (``bayes_safe.tuning.Range``) and the
registry of problems the command line can build (``bayes_safe.tuning.ab_test.PROBLEMS``) live
in the tuning package above it. A problem names its search space with plain data (``Range``
objects or dicts of their fields), so this module imports nothing from tuning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import ClassVar

__all__ = ["ABProblem"]


class ABProblem:
    """How the trials of a tuning study run on a simulator: the arms, the feedback, the metrics.

    Most users never subclass it: ``ABTest(problem)`` takes a ``bayes_safe.envs.Problem``
    directly (``bayes_safe.tuning.SimulatedProblem`` supplies TS-ASC and TS arms, the feedback
    and the metrics from its declarations). Subclass it when a study needs its own arms or
    metrics, as the video-upload reproduction does (``VideoUploadProblem``). Required:

    * ``make_env(parameters, seed)`` -> the simulator of one trial, a ``bayes_safe.envs.Problem``:
      ``draw(n, generator)`` gives units with ``features [n, K, d]``, ``baseline [n]`` and
      ``valid [n, K]`` (or ``None``), ``outcomes(units, actions [n])`` their outcomes under
      common random numbers (``ABTest`` draws the units of every batch from one generator
      seeded by the trial's seed, and pairs every arm with the baseline on the same units);
    * ``make_policy(kind, parameters, env, *, seed, refit_every)`` -> a
      ``Policy`` (``select`` / ``update``); ``kind`` is the
      arm's name (``"ts-asc"``, ``"ts"``, ...) and ``refit_every`` the batch size;
    * ``feedback(env, units, outcomes)`` -> ``(reward [n], constraints [n, C] or None)``, what
      a policy learns from;
    * ``unit_metrics(env, units, outcomes)`` -> ``{name: (values [n], mask [n] or None)}``,
      per-unit values whose means are compared with the baseline's (``mask`` restricts a
      metric to some units, e.g. uploads with a 1080p source).

    Offline problems (``offline = True``, e.g. ``bayes_safe.tuning.logged.LoggedDataProblem``) replace
    the simulation: ``estimate(parameters, seed)`` returns the trial's ``{metric: (mean, sem)}``
    directly and ``metric_names()`` lists every metric by its full name.

    Optional: ``level_metrics(env, units, outcomes, baseline_outcomes, parameters)`` ->
    ``{name: values [n]}`` reported as means (not as changes); ``config()`` (a JSON-safe dict
    that rebuilds the problem through ``make_problem``, so a stored study can be resumed
    from the command line); the study defaults ``parameters``, ``objective``,
    ``outcome_constraints`` and ``surface`` (the two parameters of the response-surface plots);
    the report's wording: ``intro()`` / ``report_intro``, ``describe(ab_test)``, ``tuned_label``
    and ``reports_paper_finding()`` (the comparison with Daulton et al.'s Figure 3c, only for
    the video-upload reproduction). ``bayes_safe.tuning.SimulatedProblem`` is this interface
    for a user's ``bayes_safe.envs.Problem``.
    """

    name: str = "custom"
    policies: tuple[str, ...] = ()
    #: arms compared with the tuned one by default (``ABTest(compare=None)``)
    compare: tuple[str, ...] = ()
    #: True: trials are estimated by ``estimate`` (no simulation)
    offline: bool = False
    #: the default search space: ``bayes_safe.tuning.Range`` entries, or dicts of their fields
    #: (``name``, ``low``, ``high``, ``log``, ``integer``): anything ``Study(parameters=...)`` takes
    parameters: tuple = ()
    objective: str | None = None
    outcome_constraints: tuple[str, ...] = ()
    surface: tuple[str, str] | None = None

    def metric_names(self) -> tuple[str, ...]:
        """Names of the per-unit metrics ``unit_metrics`` returns (without the ``_change`` suffix)."""
        raise NotImplementedError

    def level_metric_names(self) -> tuple[str, ...]:
        return ()

    def known_parameters(self) -> tuple[str, ...] | None:
        """The names of the parameters ``make_env`` / ``make_policy`` / ``estimate`` read
        (``None``: not declared, any name is accepted). Declare them: a misspelled name
        (``alhpa``) is then an error instead of a trial run with the default value."""
        return None

    def _check_names(self, names, what: str) -> None:
        known = self.known_parameters()
        if known is None:
            return
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"{what}: unknown parameter name(s) {unknown} for problem {self.name!r}; "
                             f"it reads {', '.join(known)}")

    def check_parameters(self, ranges: Sequence) -> None:
        """Raise ``ValueError`` for parameters this problem does not read or cannot take.

        ``ranges``: the study's search space as ``bayes_safe.tuning.Range`` objects (read
        through their ``name``, ``low``, ``high``, ``log`` and ``integer`` attributes). The
        default rejects names not in ``known_parameters()`` (when declared)."""
        self._check_names([r.name for r in ranges], "parameters")

    def check_parameter_values(self, parameters: Mapping) -> None:
        """Raise for a trial's ``parameters`` (``{name: value}``) this problem cannot run:
        names it does not read (``known_parameters``), values that are not finite real
        numbers. ``ABTest.evaluate`` calls it before any work."""
        if not isinstance(parameters, Mapping):
            raise TypeError(f"parameters: expected a mapping of parameter name to value, got {type(parameters).__name__}")
        bad_keys = [k for k in parameters if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"parameters: expected string names, got {bad_keys[:5]}")
        self._check_names(list(parameters), "parameters")
        for name, value in parameters.items():
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
                raise ValueError(f"parameters: {name!r} expected a finite number, got {value!r}")

    def make_env(self, parameters: Mapping, seed: int):
        raise NotImplementedError

    def make_policy(self, kind: str, parameters: Mapping, env, *, seed: int, refit_every: int):
        raise NotImplementedError

    def feedback(self, env, units, outcomes):
        raise NotImplementedError

    def unit_metrics(self, env, units, outcomes) -> dict:
        raise NotImplementedError

    def level_metrics(self, env, units, outcomes, baseline_outcomes, parameters) -> dict:
        return {}

    def config(self) -> dict | None:
        return None

    def estimate(self, parameters: Mapping, seed: int) -> dict[str, tuple[float, float]]:
        """An offline problem's trial: ``{metric: (mean, sem)}`` for ``parameters``."""
        raise NotImplementedError(f"problem {self.name!r}: estimate() is for offline problems (offline = True)")

    # -- how the report (bayes_safe.tuning.report) words a study of this problem
    #: what one trial is, in the set-up line; its observed metrics; the work a trial does
    trial_noun: str = "A/B test"
    observed_label: str = "A/B test mean"
    trial_work: str = "simulation"
    #: the report's opening paragraph; None: ``intro()`` words it (the paper's set-up for the
    #: video-upload reproduction, a neutral description otherwise)
    report_intro: str | None = None

    _PAPER_INTRO = (
        "Bayesian optimisation of TS-ASC's alpha and reward offsets (Daulton et al. 2019, section 5.3): each trial "
        "is a simulated A/B test of one parameterization against the baseline policy on common random numbers; "
        "metrics are % changes against the baseline with paired delta-method standard errors.")

    #: set by the paper's own problem (``VideoUploadProblem``) only: ``reports_paper_finding``
    _paper_problem: ClassVar[bool] = False

    def reports_paper_finding(self) -> bool:
        """Whether the report compares the study with Daulton et al. (2019)'s finding (Figure 3c):
        only for the paper's own problem (``VideoUploadProblem``), never for a custom one."""
        return type(self)._paper_problem

    def intro(self) -> str:
        """The report's opening paragraph, in this problem's words."""
        if self.report_intro:
            return self.report_intro
        if self.reports_paper_finding():
            return self._PAPER_INTRO
        return (f"Bayesian optimisation of a policy's parameters on the problem `{self.name}`: each trial is "
                "a simulated A/B test of one parameterization against the baseline policy on common random numbers; "
                "metrics are % changes against the baseline with paired delta-method standard errors.")

    def tuned_label(self, ab_test) -> str:
        """The tuned arm's name in the figures."""
        return "TS-ASC" if ab_test.policy == "ts-asc" else ab_test.policy

    def describe(self, ab_test) -> str:
        """How a trial runs, for the report's set-up line."""
        text = (f"{ab_test.n_users:,} users per arm in {ab_test.batches} batches (the policy refits after each); "
                f"tuned arm `{ab_test.policy}`")
        if ab_test.compare:
            text += ", compared arms " + ", ".join(f"`{c}`" for c in ab_test.compare)
        return text
