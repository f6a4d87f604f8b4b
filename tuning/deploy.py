"""From a finished study to a served state in one step: ``bayes-safe deploy STUDY_DIR STATE_DIR``.

A study (``bayes-safe tune ...``) recommends a setting in ``best.json``: the tolerances,
confidences and forgetting its trials tuned, for the policy its A/B tests ran (TS-ASC over the
problem's own models, with the problem's declared constraints). ``deploy`` builds exactly that
policy, through the same ``make_policy`` the trials used (so the models, their priors and warm
starts, and every declared constraint at its tuned bound are the study's), wraps it in a
``Decider`` and saves the state for ``bayes-safe serve``. Nothing is rebuilt by hand, so the
tolerance's meaning (``bayes_safe.envs.tolerance``) cannot be misread on the way.

The state records where it came from (``Decider.provenance``): the study's name and database
(password hidden), the trial, its parameters, the recommendation it followed and its
``P(feasible)``, the declared limit and the policy bound of every constraint, the time and the
bayes_safe version. ``/health``, ``GET /posterior`` and ``bayes-safe study show STATE_DIR`` print
it.

A study that shows no trial feasible recommends keeping the baseline (``best.json`` has no
``parameters``): ``deploy`` refuses it, naming the recommendation and the closest trial; pass
``trial=`` (``--trial N``) to deploy a trial anyway, which the provenance then records as chosen
by hand. A decision-log study (``tune decision-log``) deploys the served TS-ASC with the tuned
constraints on the posterior the service learned; a logged-data study trains its own policy from
logs and is refused by name.

Example::

    from bayes_safe.tuning.deploy import deploy
    info = deploy("runs/dose", "state/dose", trust_source=True)   # a study of your own problem class
    # then: bayes-safe serve state/dose --log decisions.sqlite
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

__all__ = ["DeployError", "deploy"]


class DeployError(ValueError):
    """A study that cannot be deployed as asked (one line saying why and what to do)."""


def _load_study(study_dir: Path, *, storage=None, name=None, trust_source: bool = False):
    """The stored study of ``study_dir`` (or ``storage``), loaded after the same checks as ``tune resume``."""
    from . import storage as st
    from .cli import check_resume_trust, stored_study_name
    from .study import Study

    url = st.resolve_url(storage, study_dir)
    stored = st.stored_studies(url, what="--storage" if storage is not None else "study_dir")
    try:
        name = stored_study_name(stored, name)
    except ValueError as exc:
        raise DeployError(str(exc)) from None
    props = stored[name]
    if isinstance(props, dict) and props.get("ab_test", {}) is None:
        raise DeployError(f"study_dir: study {name!r} was made in Python with a problem (or policy factory) that "
                          "cannot be rebuilt by name; build its policy in Python with the problem's make_policy")
    check_resume_trust(props, url, trust=trust_source, verb="deploy")
    return Study.load(url, name=name, trust_source=True), url, name


def _best(study_dir: Path, study) -> dict | None:
    """The recommendation the user saw: ``best.json`` of the study's report, else the study's own."""
    path = study_dir / "best.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DeployError(f"study_dir: {path} is not readable JSON ({exc}); rewrite the report with "
                              "bayes-safe tune resume") from None
    return study.best()


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def deploy(study_dir, state_dir, *, trial: int | None = None, storage=None, name: str | None = None,
           trust_source: bool = False, log=None, seed: int = 0, num_draws: int = 200,
           feature_names=None, overwrite: bool = False) -> dict:
    """Build the recommended policy of the study in ``study_dir`` into a ``Decider`` state at
    ``state_dir``; returns its provenance (module docstring).

    Args:
        study_dir: the study's output directory (``--out``: ``study.sqlite`` and ``best.json``).
        state_dir: the state directory to write (whole or not at all); it must not exist unless
            ``overwrite``.
        trial: deploy this completed trial's parameters instead of the recommendation (needed when
            the study recommends keeping the baseline).
        storage, name: the study's database when it is not ``study_dir/study.sqlite`` (a
            PostgreSQL URL), and its name when the database holds several.
        trust_source: consent to import the problem class a study of your own problem names
            (``module:Class``), as ``tune resume --trust-source``.
        log: a decision log (path or PostgreSQL URL) for the new state, or None (``serve --log``
            gives one later).
        seed, num_draws, feature_names: the ``Decider``'s.
        overwrite: replace an existing ``state_dir``.

    Raises:
        DeployError: the study recommends keeping the baseline (and no ``trial``), the trial is
            not a completed one, the study trains its own policy from logs, or ``state_dir`` exists.
    """
    from bayes_safe import __version__
    from bayes_safe.online import Decider

    from . import storage as st

    study_dir, state_dir = Path(study_dir), Path(state_dir)
    if isinstance(trial, bool) or (trial is not None and not isinstance(trial, int)):
        raise TypeError(f"trial: expected a trial number (int) or None, got {trial!r}")
    if state_dir.exists() and not overwrite:
        raise DeployError(f"state_dir: {state_dir} exists; choose a new directory or pass --overwrite")
    if not study_dir.is_dir() and storage is None:
        raise DeployError(f"study_dir: no such directory {str(study_dir)!r} (the --out of bayes-safe tune)")
    study, url, name = _load_study(study_dir, storage=storage, name=name, trust_source=trust_source)
    problem = study.ab_test.problem
    if getattr(problem, "offline", False) and not callable(getattr(problem, "_target", None)):
        raise DeployError(f"study_dir: study {name!r} tunes a policy trained from logs ({problem.name}); it has no "
                          "served policy to deploy")
    best = _best(study_dir, study)
    observed = study.observed()
    if trial is not None:
        if trial not in observed:
            raise DeployError(f"trial: {trial} is not a completed trial of study {name!r} (completed: "
                              f"{sorted(observed)[:20]})")
        parameters = dict(study.experiment.trials[trial].arm.parameters)
        chosen_by = "trial (chosen by hand)"
    elif best is None:
        raise DeployError(f"study_dir: study {name!r} has no completed trial; nothing to deploy")
    elif best.get("parameters") is None:
        closest = (best.get("closest_infeasible") or [{}])[0].get("trial")
        raise DeployError(f"study_dir: study {name!r} recommends: {best.get('recommendation', 'keep the baseline')} "
                          f"(no trial shown feasible with probability {best.get('confidence', 0.9):g}); nothing to "
                          f"deploy. To deploy a trial anyway, pass --trial N"
                          + (f" (the closest to feasible: trial {closest})" if closest is not None else ""))
    else:
        trial, parameters, chosen_by = int(best["trial"]), dict(best["parameters"]), "best.json"
    kind = study.ab_test.policy
    if getattr(problem, "offline", False):  # a decision-log study: the served TS-ASC at the tuned constraints
        policy = problem._target(parameters)
    else:
        env = problem.make_env(parameters, int(seed))
        policy = problem.make_policy(kind, parameters, env, seed=int(seed), refit_every=1)
    for role, model in policy.models().items():
        shape = tuple(getattr(model, "batch_shape", ()))
        if shape not in ((), (1,)):
            raise DeployError(f"study_dir: the study's {role} model has batch_shape {list(shape)}; a served policy "
                              "needs one stream (the problem's models(None) should build unbatched models)")
    declared = [c.describe() for c in getattr(problem, "declared", ()) or ()]
    provenance = _json_safe({
        "study": name, "storage": st.display_url(url), "study_dir": str(study_dir.resolve()),
        "problem": getattr(problem, "import_path", None) or problem.name, "policy": kind,
        "trial": trial, "parameters": parameters, "chosen_by": chosen_by,
        "recommendation": None if best is None else best.get("recommendation"),
        "p_feasible": None if best is None or trial != best.get("trial") else best.get("p_feasible"),
        "declared_constraints": declared,
        "policy_bounds": study.policy_bounds(parameters) if hasattr(study, "policy_bounds") else None,
        "deployed_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "bayes_safe": __version__})
    decider = Decider(policy, seed=int(seed), num_draws=num_draws, log=log, feature_names=feature_names)
    decider.provenance = provenance
    if state_dir.exists() and overwrite:
        import shutil

        tmp = state_dir.with_name(state_dir.name + ".deploying")
        if tmp.exists():
            shutil.rmtree(tmp)
        decider.save(tmp)
        old = state_dir.with_name(state_dir.name + ".replaced")
        if old.exists():
            shutil.rmtree(old)
        state_dir.rename(old)
        tmp.rename(state_dir)
        shutil.rmtree(old)
    else:
        decider.save(state_dir)
    if decider.log is not None:
        decider.log.close()
    return provenance
