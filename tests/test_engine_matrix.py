"""Every posterior engine in production (issue 27): the Decider, action probabilities, saving with
decisions pending, replay after a crash, and a real ``bayes-safe serve`` killed mid-way.

Engines: conjugate Gaussian and Normal-Inverse-Gamma; Gibbs (Laplace, Student-t, horseshoe priors;
probit and logistic likelihoods); Langevin (a callable Pyro prior); NUTS and SVI (lazy refits); the
probit GP's views as the video-upload policy uses them; per-arm models; and the unbatched model
(the one-stream case). Inputs are what a user has: numpy arrays, lists, a DataFrame.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from serving import ServeProcess

from bayes_safe import TSASC, BayesianLinear
from bayes_safe.models import PerArmLinear
from bayes_safe.online import Decider, DecisionLog
from bayes_safe.policies import ThompsonSampling
from bayes_safe.state import save_state

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
D, K = 4, 5


def _normal(d=D, scale=1.0):
    return dist.Normal(torch.zeros(d, dtype=F64), torch.full((d,), scale, dtype=F64)).to_event(1)


def _laplace(d=D):
    return dist.Laplace(torch.zeros(d, dtype=F64), torch.ones(d, dtype=F64)).to_event(1)


def _student(d=D):
    return dist.StudentT(3.0, torch.zeros(d, dtype=F64), torch.ones(d, dtype=F64)).to_event(1)


def horseshoe_prior():
    """A horseshoe written as a Pyro model (the Gibbs engine recognises it); importable, so it saves."""
    tau = pyro.sample("tau", dist.HalfCauchy(1.0))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(D)).to_event(1))
    return pyro.sample("w", dist.Normal(torch.zeros(D), tau * lam).to_event(1))


def log_scale_prior():
    """A hierarchical prior only the Langevin engine samples (a callable Pyro prior)."""
    s = pyro.sample("s", dist.LogNormal(0.0, 0.5))
    return pyro.sample("w", dist.Normal(0.0, s).expand([D]).to_event(1))


# ---------------------------------------------------------------------------------- the cases
class Case:
    """A policy to serve, the contexts it sees and the outcomes it is told."""

    def __init__(self, build, dim=D, arms=K, constraints=0, imports=False):
        self.build, self.dim, self.arms, self.constraints, self.imports = build, dim, arms, constraints, imports

    def context(self, rng):
        """``(candidate features [K, d] as a numpy array, valid mask or None)``."""
        return rng.normal(size=(self.arms, self.dim)), None

    def outcome(self, action, rng):
        c = [float(rng.random() < 0.3) for _ in range(self.constraints)] or None
        return float(rng.normal() + 0.1 * action), c


def _tsasc(reward, constraint):
    return TSASC(reward, [constraint], alpha=0.5)


def _dose_finding(batch, confidence=None):
    from dose_finding import DoseFinding

    problem = DoseFinding(confidence=confidence)
    models = problem.models(batch)
    return TSASC(models[0], models[1:], constraints=problem.constraints, metric_names=problem.metric_names)


class DoseCase(Case):
    """tests/dose_finding.py: an NIG efficacy model and a logistic (Gibbs) adverse-event model."""

    def __init__(self, batch=1, confidence=None):
        super().__init__(lambda: _dose_finding(batch, confidence), dim=6, arms=7, constraints=1)

    def context(self, rng):
        from dose_finding import dose_features

        return dose_features(torch.as_tensor(rng.normal(size=(1, 3))))[0].numpy(), None

    def outcome(self, action, rng):
        u = action / 3.0
        risk = 1.0 / (1.0 + np.exp(5.0 - 1.2 * u))
        return float(2.0 + u + 0.5 * rng.normal()), [float(rng.random() < risk)]


_GP_CACHE: dict = {}


def _fitted_gp():
    """A small ProbitGP fitted on 300 uploads logged under random valid actions (once per process)."""
    if "model" not in _GP_CACHE:
        from bayes_safe.envs.video_upload import FEATURE_DIM, VideoUpload
        from bayes_safe.models import ProbitGP

        env = VideoUpload(seed=0)
        up = env.draw(300)
        g = torch.Generator().manual_seed(1)
        a = torch.rand(300, 4, generator=g, dtype=F64).masked_fill(~up.valid, -1).argmax(-1)
        model = ProbitGP(FEATURE_DIM, seed=0, nn_epochs=1, nn_min_steps=20, refit_every=None, gp_epochs=1)
        model.update(up.features[torch.arange(300), a], env.outcomes(up, a).success.double())
        model.fit()
        _GP_CACHE.update(model=model, env=env)
    return copy.deepcopy(_GP_CACHE["model"]), _GP_CACHE["env"]


class VideoCase(Case):
    """The video-upload TS-ASC: ``ScaledOutcome`` reward and ``SuccessProbability`` constraint views
    of one ProbitGP (as ``VideoUploadProblem.make_policy`` builds it), refitting every 4 outcomes."""

    def __init__(self):
        from bayes_safe.envs.video_upload import FEATURE_DIM

        super().__init__(self._build, dim=FEATURE_DIM, arms=4, constraints=1)

    def _build(self):
        from bayes_safe.models import ScaledOutcome, SuccessProbability

        model, env = _fitted_gp()
        model.refit_every = 4
        self.scale = env.reward_scale
        self.units = env.draw(64)
        return TSASC(ScaledOutcome(model, env.reward_scale), SuccessProbability(model), alpha=0.5)

    def context(self, rng):
        i = int(rng.integers(0, len(self.units.features)))
        return self.units.features[i].numpy(), self.units.valid[i].numpy()

    def outcome(self, action, rng):
        success = float(rng.random() < 0.7)
        return success * float(self.scale[action]), [success]


NUTS = {"num_samples": 16, "warmup_steps": 16}
SVI = {"num_samples": 16, "svi_steps": 30}
CASES = {
    "conjugate": Case(lambda: ThompsonSampling(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1]))),
    "normal-inverse-gamma": Case(lambda: ThompsonSampling(
        BayesianLinear(_normal(), noise_prior=dist.InverseGamma(2.0, 1.0), batch_shape=[1]))),
    "gibbs-laplace": Case(lambda: ThompsonSampling(BayesianLinear(_laplace(), noise_std=1.0, batch_shape=[1]))),
    "gibbs-student": Case(lambda: ThompsonSampling(BayesianLinear(_student(), noise_std=1.0, batch_shape=[1]))),
    "gibbs-horseshoe": Case(lambda: ThompsonSampling(BayesianLinear(horseshoe_prior, dim=D, noise_std=1.0,
                                                                    batch_shape=[1])), imports=True),
    "gibbs-probit": Case(lambda: _tsasc(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1]),
                                        BayesianLinear(_normal(), likelihood="probit", batch_shape=[1])), constraints=1),
    "gibbs-logistic": Case(lambda: _tsasc(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1]),
                                          BayesianLinear(_normal(), likelihood="logistic", batch_shape=[1])),
                           constraints=1),
    "gibbs-laplace-constraint": Case(lambda: _tsasc(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1]),
                                                    BayesianLinear(_laplace(), noise_std=1.0, batch_shape=[1])),
                                     constraints=1),
    "dose-finding": DoseCase(),
    "dose-finding-chance": DoseCase(confidence=0.8),  # a chance constraint on the logistic model's draws
    "langevin": Case(lambda: ThompsonSampling(BayesianLinear(log_scale_prior, dim=D, noise_std=1.0, batch_shape=[1])),
                     imports=True),
    "nuts": Case(lambda: ThompsonSampling(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1], inference="nuts",
                                                         inference_options=NUTS))),
    "svi": Case(lambda: ThompsonSampling(BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1], inference="svi",
                                                        inference_options=SVI))),
    "probit-gp": VideoCase(),
    "per-arm": Case(lambda: ThompsonSampling(PerArmLinear(_normal(), K, noise_std=1.0, batch_shape=[1]))),
    # the one-stream case: no batch shape
    "unbatched-conjugate": Case(lambda: ThompsonSampling(BayesianLinear(_normal(), noise_std=1.0))),
    "unbatched-logistic": Case(lambda: _tsasc(BayesianLinear(_normal(), noise_std=1.0),
                                              BayesianLinear(_normal(), likelihood="logistic")), constraints=1),
    "unbatched-dose-finding": DoseCase(batch=None),
    "unbatched-per-arm": Case(lambda: ThompsonSampling(PerArmLinear(_normal(), K, noise_std=1.0))),
}


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch):
    """The callable priors live in this module; loading imports it by name (``allow_imports``)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _saved_bytes(policy, directory: Path) -> dict[str, bytes]:
    """Every file ``save_state`` writes for ``policy``: the whole saved model state, byte for byte."""
    json_path = save_state(policy, directory / "policy")
    files = {p.name: p.read_bytes() for p in (json_path, json_path.with_suffix(".safetensors"))}
    assert all(files.values())
    return files


def _shapes(policy) -> dict[str, tuple]:
    """The shapes of every model's state tensors (chain state included)."""
    out = {}
    for role, m in policy.models().items():
        engine = getattr(m, "engine", None)
        for owner, prefix in ((m, role), (engine, f"{role}.engine"), (getattr(engine, "state", None), f"{role}.state")):
            for name, value in vars(owner).items() if owner is not None and hasattr(owner, "__dict__") else ():
                if isinstance(value, torch.Tensor) and name not in ("_X", "_y", "_sign"):  # (data rows grow)
                    out[f"{prefix}.{name}"] = tuple(value.shape)
    return out


def _same_shapes(now: dict, before: dict) -> bool:
    """Every state tensor present both times has the shape it had (caches come and go)."""
    return all(now[k] == before[k] for k in now.keys() & before.keys())


def _observations(policy) -> int:
    """How many observations the policy's reward model has learned from."""
    m = policy.models()["reward"]
    m = getattr(m, "arms", m)
    n = m.num_observations
    return int(n.sum()) if isinstance(n, torch.Tensor) else int(n)


def _decide(decider, case, rng):
    x, valid = case.context(rng)
    return decider.decide(x, baseline=0, valid=valid)


# ---------------------------------------------------------------------------------- in process
@pytest.mark.parametrize("name", list(CASES))
def test_every_engine_through_the_decider(name, tmp_path):
    case = CASES[name]
    policy = case.build()
    rng = np.random.default_rng(0)
    log_path = tmp_path / "decisions.sqlite"
    decider = Decider(policy, num_draws=16, update_every=2, log=log_path, seed=0)
    shapes, known = _shapes(policy), _observations(policy)  # (the probit GP starts fitted on 300 uploads)
    for _ in range(5):
        d = _decide(decider, case, rng)
        assert 0 <= d.action < case.arms and 0 < d.propensity <= 1
        assert d.probabilities[d.action] == d.propensity and abs(sum(d.probabilities) - 1) < 1e-9
        reward, constraints = case.outcome(d.action, rng)
        assert decider.feedback(d.decision_id, reward, constraints) is True
        assert decider.feedback(d.decision_id, reward, constraints) is False  # a duplicate: ignored
    decider.refresh()
    assert decider.model_version == 3 and not decider.queued and _observations(policy) == known + 5
    assert _same_shapes(_shapes(policy), shapes), "the propensity draws changed the shape of a model's state"

    # action probabilities: a query, so the saved state is the same byte for byte before and after
    x, valid = case.context(rng)
    before = _saved_bytes(policy, tmp_path / "before")
    probs, se = policy.action_probabilities(x, baseline=0, valid=valid, num_draws=32, seed=3)
    assert tuple(probs.shape) == (1, case.arms) and torch.allclose(probs.sum(-1), torch.ones(1, dtype=F64))
    assert tuple(se.shape) == (1, case.arms) and bool((se >= 0).all())
    assert _saved_bytes(policy, tmp_path / "after") == before, "action_probabilities changed the model's state"

    # saved with a decision pending; the copy is the same posterior (same draws for the same seed)
    pending = _decide(decider, case, rng)
    decider.save(tmp_path / "state")
    copy_ = Decider.load(tmp_path / "state", allow_imports=case.imports)
    assert set(copy_.pending) == {pending.decision_id.split("-")[0]} and copy_.next_id == decider.next_id
    assert _same_shapes(_shapes(copy_.policy), shapes)
    again, _ = copy_.policy.action_probabilities(x, baseline=0, valid=valid, num_draws=32, seed=3)
    torch.testing.assert_close(again, policy.action_probabilities(x, baseline=0, valid=valid, num_draws=32, seed=3)[0])

    # a crash after the snapshot: two more decisions and one feedback reach only the log
    later = [_decide(decider, case, rng) for _ in range(2)]
    decider.feedback(later[0].decision_id, *case.outcome(later[0].action, rng))
    decider.log.close()
    resumed = Decider.load(tmp_path / "state", log=log_path, allow_imports=case.imports)
    assert resumed.replayed == {"decisions": 2, "feedback": 1}
    assert set(resumed.pending) == {pending.decision_id.split("-")[0], later[1].decision_id.split("-")[0]}
    assert resumed.feedback(pending.decision_id, *case.outcome(pending.action, rng)) is True
    assert resumed.feedback(later[1].decision_id, *case.outcome(later[1].action, rng)) is True
    resumed.refresh()
    assert not resumed.pending and _observations(resumed.policy) == known + 8 and resumed.model_version == 5
    d = _decide(resumed, case, rng)
    assert d.decision_id == resumed.public_id(8) and _same_shapes(_shapes(resumed.policy), shapes)
    resumed.save(tmp_path / "state")  # what is saved after any number of decisions loads
    assert Decider.load(tmp_path / "state", allow_imports=case.imports).next_id == 9
    resumed.log.close()

    # the policy a Decider served is still the user's: select and update it directly, outside
    # the Decider's inference mode (state tensors it made there must not refuse an in-place update)
    for served in (policy, resumed.policy):
        x, valid = case.context(rng)
        X = torch.as_tensor(x, dtype=F64)[None]
        mask = None if valid is None else torch.as_tensor(valid)[None]
        a = served.select(X, torch.tensor([0]), generator=torch.Generator().manual_seed(0), valid=mask)
        reward, constraints = case.outcome(int(a[0]), rng)
        served.update(X[:, int(a[0])], torch.tensor([reward], dtype=F64),
                      None if constraints is None else torch.tensor([constraints], dtype=F64), actions=a)
        assert 0 <= int(served.select(X, torch.tensor([0]), valid=mask)[0]) < case.arms


@pytest.mark.parametrize("name", list(CASES))
def test_every_engine_as_replicas_on_one_postgresql_log(name, tmp_path, postgres_server):
    """Two replicas of one state (``ReplicaDecider``): decisions at both, each one's feedback sent
    to the other, both learn every logged row once; a replica's snapshot resumes at its watermark."""
    from bayes_safe.online import ReplicaDecider

    case, url = CASES[name], postgres_server.url()
    policy = case.build()
    known = _observations(policy)
    Decider(policy, num_draws=16, seed=0).save(tmp_path / "state")
    a, b = (ReplicaDecider.load(tmp_path / "state", log=url, allow_imports=case.imports) for _ in range(2))
    rng = np.random.default_rng(0)
    for i in range(4):
        deciding, told = (a, b) if i % 2 else (b, a)
        d = _decide(deciding, case, rng)
        assert told.feedback(d.decision_id, *case.outcome(d.action, rng)) is True
    assert a.sync() == b.sync() == 4
    assert _observations(a.policy) == _observations(b.policy) == known + 4 and a.model_version == 4
    a.save(tmp_path / "snapshot")
    d = _decide(b, case, rng)
    b.feedback(d.decision_id, *case.outcome(d.action, rng))
    again = ReplicaDecider.load(tmp_path / "snapshot", log=url, allow_imports=case.imports)
    assert again.applied == 5 and _observations(again.policy) == known + 5


@pytest.mark.parametrize("name", ["gibbs-logistic", "gibbs-horseshoe", "langevin"])
def test_chain_engines_continue_from_the_played_draw(name):
    """A decision moves a chain exactly as one ordinary draw does; the other S - 1 draws leave no trace."""
    case = CASES[name]
    policy = case.build()
    model = policy.models()["constraint0" if case.constraints else "reward"]
    rng = np.random.default_rng(1)
    decider = Decider(policy, num_draws=8, seed=0)
    for _ in range(4):
        d = _decide(decider, case, rng)
        decider.feedback(d.decision_id, *case.outcome(d.action, rng))
    engine = model.engine
    state = engine.state.w.clone() if hasattr(engine, "state") else engine.theta.clone()
    _decide(decider, case, rng)
    moved = engine.state.w if hasattr(engine, "state") else engine.theta
    assert moved.shape == state.shape  # [1, d]: one chain, not S of them
    assert engine._n_at_draw == engine.n  # the played draw counts as the chain's draw


def test_propensity_is_the_probability_of_the_played_action():
    """Gibbs logistic constraint: the logged propensities match the actions' frequencies over many
    decisions from the same posterior (the propensity is exact given the sweep's latent variables)."""
    case = CASES["gibbs-logistic"]
    policy = case.build()
    rng = np.random.default_rng(2)
    decider = Decider(policy, num_draws=64, seed=0)
    for _ in range(30):
        d = _decide(decider, case, rng)
        decider.feedback(d.decision_id, *case.outcome(d.action, rng))
    x, _ = case.context(rng)
    decisions = [decider.decide(x, baseline=0) for _ in range(300)]  # no feedback: the posterior stays
    counts = np.bincount([d.action for d in decisions], minlength=K) / len(decisions)
    mean_probs = np.mean([d.probabilities for d in decisions], axis=0)
    assert np.abs(counts - mean_probs).max() < 0.1
    probs, _ = policy.action_probabilities(x, baseline=0, num_draws=2000, seed=0)
    assert np.abs(probs[0].numpy() - mean_probs).max() < 0.1


@pytest.mark.parametrize("decisions", [200, 1000])
def test_a_logistic_constraint_model_decides_a_thousand_times(decisions, tmp_path):
    """TS-ASC with a logistic (Gibbs) constraint model, the default 200 propensity draws (issue 27:
    the log held 2 decisions after 1,000 attempts); it saves and loads at the end (about 2 s)."""
    case = CASES["dose-finding"]
    decider = Decider(case.build(), log=tmp_path / "decisions.sqlite", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(decisions):
        d = _decide(decider, case, rng)
        decider.feedback(d.decision_id, *case.outcome(d.action, rng))
    assert len(decider.log) == decisions and decider.model_version == decisions
    assert decider.policy.models()["constraint0"].engine.state.w.shape == (1, 6)
    decider.save(tmp_path / "state")
    decider.log.close()
    loaded = Decider.load(tmp_path / "state", log=tmp_path / "decisions.sqlite")
    assert loaded.next_id == decisions and not loaded.pending
    loaded.log.close()


def test_the_unbatched_model_is_the_one_stream_case(tmp_path):
    """``ThompsonSampling(BayesianLinear(prior, noise_std=1.0))``: select, action_probabilities, the
    Decider with DataFrame / list inputs, saving and loading; batch_shape=[1] gives the same answers."""
    import pandas as pd

    names = ["a", "b", "c", "d"]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, D))
    y = X @ np.array([1.0, -0.5, 0.0, 0.3]) + 0.1 * rng.normal(size=40)
    plain = BayesianLinear(_normal(), noise_std=1.0)
    plain.update(torch.as_tensor(X), torch.as_tensor(y))
    one = BayesianLinear(_normal(), noise_std=1.0, batch_shape=[1])
    one.update(torch.as_tensor(X)[None], torch.as_tensor(y)[None])
    candidates = rng.normal(size=(K, D))
    policy = ThompsonSampling(plain)
    action = policy.select(candidates, generator=torch.Generator().manual_seed(0))
    assert tuple(action.shape) == (1,)
    probs, se = policy.action_probabilities(candidates, num_draws=500, seed=0)
    same, _ = ThompsonSampling(one).action_probabilities(candidates, num_draws=500, seed=0)
    assert tuple(probs.shape) == tuple(se.shape) == (1, K)
    torch.testing.assert_close(probs, same)

    decider = Decider(policy, feature_names=names, num_draws=50, log=tmp_path / "log.sqlite", seed=0)
    for t in range(6):
        frame = pd.DataFrame(rng.normal(size=(K, D)), columns=names)
        d = decider.decide(frame if t % 2 else frame.to_numpy().tolist(), baseline=0)
        decider.feedback(d.decision_id, np.float64(rng.normal()))
    pending = decider.decide(pd.DataFrame(candidates, columns=names))
    decider.save(tmp_path / "state")
    loaded = Decider.load(tmp_path / "state")
    reward = loaded.policy.models()["reward"]
    assert reward.batch_shape == torch.Size([])
    torch.testing.assert_close(reward.posterior_mean, plain.posterior_mean)
    assert loaded.feedback(pending.decision_id, 0.5) is True
    assert int(reward.num_observations) == 40 + 7
    assert loaded.decide(candidates).decision_id == loaded.public_id(7)
    decider.log.close()


# ---------------------------------------------------------------------------------- a real server
SERVED = {
    # (case, slow); a callable prior is served with --allow-imports (the state imports its module)
    "conjugate": (CASES["conjugate"], False),
    "gibbs-logistic": (CASES["dose-finding"], False),
    "gibbs-laplace": (CASES["gibbs-laplace-constraint"], False),
    "normal-inverse-gamma": (CASES["normal-inverse-gamma"], True),
    "gibbs-probit": (CASES["gibbs-probit"], True),
    "langevin": (Case(lambda: ThompsonSampling(BayesianLinear(_laplace(), noise_std=1.0, batch_shape=[1],
                                                               inference="langevin"))), True),
    "langevin-callable-prior": (CASES["langevin"], True),
    "nuts": (CASES["nuts"], True),
    "svi": (CASES["svi"], True),
    "probit-gp": (CASES["probit-gp"], True),
    "per-arm": (CASES["per-arm"], True),
    "unbatched-logistic": (CASES["unbatched-logistic"], True),
}


def _serve(state: Path, log: Path, allow_imports: bool, tmp_path: Path) -> ServeProcess:
    """``bayes-safe serve STATE --log LOG [--allow-imports]`` on 127.0.0.1 (``tests/serving.py``)."""
    count = len(list(tmp_path.glob("serve*.err")))
    return ServeProcess(state, "--log", log, *(["--allow-imports"] if allow_imports else []),
                        stderr=tmp_path / f"serve{count}.err")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if slow else n
                                  for n, (_, slow) in SERVED.items()])
def test_every_engine_served_killed_and_restarted(name, tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    case = SERVED[name][0]
    state, log_path = tmp_path / "state", tmp_path / "decisions.sqlite"
    policy = case.build()
    known = _observations(policy)
    Decider(policy, num_draws=16, update_every=1, seed=0).save(state)
    rng = np.random.default_rng(0)
    acknowledged: dict[str, tuple] = {}
    waiting: list[tuple[str, int]] = []

    def run(server, count):
        for _ in range(count):
            x, valid = case.context(rng)
            body = {"features": x.tolist(), "baseline": 0} | ({} if valid is None else {"valid": valid.tolist()})
            r = server.client.post("/decide", json=body)
            assert r.status_code == 200, r.text
            d = r.json()
            assert 0 <= d["action"] < case.arms and abs(sum(d["probabilities"]) - 1) < 1e-9
            waiting.append((d["decision_id"], d["action"]))
            if len(waiting) > 3:  # delayed, out of order
                decision_id, action = waiting.pop(int(rng.integers(0, 2)))
                reward, constraints = case.outcome(action, rng)
                f = server.client.post("/feedback", json={"decision_id": decision_id, "reward": reward,
                                                          "constraints": constraints})
                assert f.status_code == 200 and f.json() == {"accepted": True}, f.text
                acknowledged[decision_id] = (reward, constraints)

    server = _serve(state, log_path, case.imports, tmp_path)
    run(server, 8)
    server.kill(signal.SIGKILL)  # mid-way, no snapshot since the start: the restart rebuilds from the log
    server = _serve(state, log_path, case.imports, tmp_path)
    assert f"recovered 8 decisions and {len(acknowledged)} feedback" in server.first_line
    again = server.client.post("/feedback", json={"decision_id": next(iter(acknowledged)), "reward": 0.0,
                                                  "constraints": [0.0] * case.constraints or None})
    assert again.status_code == 200 and again.json() == {"accepted": False}  # applied once: a re-send is ignored
    run(server, 4)
    _, err = server.kill(signal.SIGTERM)
    assert server.proc.returncode == 0, err
    assert "Traceback" not in err

    log = DecisionLog(log_path)
    decider = Decider.load(state, log=log, allow_imports=case.imports)
    frame = log.to_dataframe(with_feedback_only=True)
    numbers = {k.split("-")[0]: v for k, v in acknowledged.items()}  # the log keys a decision by its number
    assert set(numbers) == set(frame["decision_id"])  # every acknowledged feedback logged once
    assert decider.next_id == 12 and set(decider.pending) == {str(i) for i in range(12)} - set(numbers)
    assert decider.model_version == len(acknowledged) and _observations(decider.policy) == known + len(acknowledged)
    for k, (reward, _) in numbers.items():
        assert frame.loc[frame["decision_id"] == k, "reward"].item() == pytest.approx(reward)
    x, valid = case.context(rng)
    assert decider.decide(x, baseline=0, valid=valid).decision_id == decider.public_id(12)
    log.close()


def test_a_state_with_a_callable_prior_is_served_only_with_allow_imports(tmp_path):
    """A Langevin model's prior is a Python function: serving it imports its module (runs its
    code), so ``bayes-safe serve`` refuses until ``--allow-imports`` says so, naming the function."""
    case = CASES["langevin"]
    Decider(case.build(), num_draws=8, seed=0).save(tmp_path / "state")
    refused = subprocess.run([sys.executable, "-m", "bayes_safe.cli", "serve", str(tmp_path / "state"), "--port", "0",
                              "--log", str(tmp_path / "log.sqlite")], check=False, capture_output=True, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])),
                             timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "log_scale_prior" in refused.stderr and "--allow-imports" in refused.stderr, refused.stderr
    assert not (tmp_path / "log.sqlite").exists()  # refused before the log was opened
    server = _serve(tmp_path / "state", tmp_path / "log.sqlite", True, tmp_path)
    d = server.client.post("/decide", json={"features": np.eye(K, D).tolist(), "baseline": 0})
    assert d.status_code == 200, d.text
    f = server.client.post("/feedback", json={"decision_id": d.json()["decision_id"], "reward": 0.5})
    assert f.status_code == 200 and f.json() == {"accepted": True}, f.text
    _, err = server.kill(signal.SIGTERM)
    assert server.proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("likelihood", ["logistic", "probit"])
def test_action_probabilities_of_a_batch_of_chains_leave_them_as_they_were(likelihood):
    """R = 3 Gibbs chains (as ``simulate`` keeps them): ``[3, K]`` probabilities, the chains untouched."""
    model = BayesianLinear(_normal(), likelihood=likelihood, batch_shape=[3])
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(3, 20, D)))
    model.update(X, (X[..., 0] > 0).double())
    policy = ThompsonSampling(model)
    policy.select(torch.as_tensor(rng.normal(size=(3, K, D))), generator=torch.Generator().manual_seed(0))
    state = model.engine.state.clone()
    probs, _ = policy.action_probabilities(rng.normal(size=(3, K, D)), num_draws=100, seed=0)
    assert tuple(probs.shape) == (3, K) and torch.allclose(probs.sum(-1), torch.ones(3, dtype=F64))
    assert torch.equal(model.engine.state.w, state.w) and model.engine.state.w.shape == (3, D)
