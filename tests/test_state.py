"""The portable state format (``bayes_safe.state``): every model and policy saves and loads back.

Written as a user would: save, load, and check that the loaded object predicts, samples (same
seed, same draws) and updates like the original; that nothing in a received directory is ever
executed; and that every broken file is refused with a message naming it.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from bayes_safe.diagnostics import load_models, load_policy, save_models
from bayes_safe.envs import daulton2019, kazerouni2017
from bayes_safe.factory import POLICIES, make_policy
from bayes_safe.models import BayesianLinear, PerArmLinear
from bayes_safe.policies import BCTS, TSASC, ConstraintMask, CTSPosterior
from bayes_safe.random import ReplicationRNG
from bayes_safe.state import StateError, load_state, save_state

F64 = torch.float64


def _data(n=30, d=3, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, n, d, generator=g, dtype=F64)
    y = X @ torch.linspace(-1, 1, d, dtype=F64) + 0.3 * torch.randn(*batch, n, generator=g, dtype=F64)
    return X, y


def _gen(seed=7):
    return torch.Generator().manual_seed(seed)


def _round_trip(obj, tmp_path, name="state", **kw):
    path = save_state(obj, tmp_path / name)
    assert path == tmp_path / f"{name}.json" and (tmp_path / f"{name}.safetensors").is_file()
    return load_state(path, **kw)


def _same_linear(a, b, features):
    torch.testing.assert_close(a.posterior_mean, b.posterior_mean, rtol=0, atol=0)
    for x, y in zip(a.predict(features), b.predict(features)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert torch.equal(a.sample(_gen()), b.sample(_gen()))
    assert torch.equal(a.num_observations, b.num_observations)


# ------------------------------------------------------------------------------- linear models
@pytest.mark.parametrize("prior", [
    dist.Normal(0.0, 1.0).expand([3]).to_event(1),
    dist.MultivariateNormal(torch.zeros(3, dtype=F64), covariance_matrix=torch.eye(3, dtype=F64) * 2),
    dist.Normal(torch.zeros(4, 3, dtype=F64), 0.5).to_event(1),
])
def test_conjugate_gaussian_round_trip(prior, tmp_path):
    m = BayesianLinear(prior, noise_std=0.3, batch_shape=[4])
    X, y = _data(batch=(4,))
    m.update(X, y)
    back = _round_trip(m, tmp_path)
    assert type(back) is BayesianLinear and back.conjugate and back.noise_std == 0.3
    torch.testing.assert_close(back.posterior_covariance, m.posterior_covariance, rtol=0, atol=0)
    _same_linear(m, back, X[:, :5])
    X2, y2 = _data(n=5, batch=(4,), seed=1)
    m.update(X2, y2)  # an update after loading moves both alike
    back.update(X2, y2)
    _same_linear(m, back, X2)


def test_normal_inverse_gamma_round_trip_with_numpy_inputs(tmp_path):
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_prior=dist.InverseGamma(3.0, 2.0))
    X, y = _data()
    m.update(X.numpy(), y.numpy())
    back = _round_trip(m, tmp_path)
    assert isinstance(back.noise_prior, dist.InverseGamma)
    _same_linear(m, back, X[:4])
    a, b = m.noise_variance_posterior, back.noise_variance_posterior
    assert torch.equal(a.concentration, b.concentration) and torch.equal(a.rate, b.rate)
    back.update(np.ones((2, 3)), np.array([0.5, 1.0]))
    m.update(np.ones((2, 3)), np.array([0.5, 1.0]))
    _same_linear(m, back, X[:4])


def test_svi_model_keeps_its_draws_data_and_refits(tmp_path):
    m = BayesianLinear(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3, inference="svi",
                       inference_options={"svi_steps": 50, "num_samples": 40, "seed": 3})
    X, y = _data()
    m.update(X, y)
    m.fit()
    back = _round_trip(m, tmp_path)
    assert not back.conjugate and back.engine.method == "svi" and back.engine.num_samples == 40
    assert torch.equal(back._draws, m._draws) and torch.equal(back.engine.svi_losses, m.engine.svi_losses)
    for a, b in zip(m.predict(X[:4]), back.predict(X[:4])):
        assert torch.equal(a, b)
    assert torch.equal(m.sample(_gen()), back.sample(_gen()))
    m.fit()
    back.fit()  # the stored observations and the seed give the same refit
    assert torch.equal(m._draws, back._draws)


def test_nuts_model_keeps_chains_for_diagnostics(tmp_path):
    m = BayesianLinear(dist.StudentT(3.0, 0.0, 1.0).expand([2]).to_event(1), noise_prior=dist.InverseGamma(2.0, 1.0),
                       inference="nuts", inference_options={"num_samples": 20, "warmup_steps": 20, "seed": 1})
    X, y = _data(n=15, d=2)
    m.update(X, y)
    m.fit()
    back = _round_trip(m, tmp_path)
    assert set(back.engine.chains) == set(m.engine.chains) and "noise_var" in back.engine.chains
    for k, v in m.engine.sample_stats.items():
        assert torch.equal(v, back.engine.sample_stats[k])
    assert torch.equal(back.engine.noise_draws, m.engine.noise_draws)
    assert torch.equal(m.sample(_gen()), back.sample(_gen()))


def test_per_arm_and_cts_posteriors_round_trip(tmp_path):
    g = _gen(1)
    per_arm = PerArmLinear(dist.Normal(0.0, 0.5).expand([2]).to_event(1), num_arms=3, noise_std=0.5, batch_shape=[4])
    cts = CTSPosterior(num_arms=3, dim=2, v=0.5, batch_shape=[4], refresh_every=7)
    for _ in range(20):
        c = torch.randn(4, 2, generator=g, dtype=F64)
        a = torch.randint(0, 3, (4,), generator=g)
        per_arm.update(c, c.sum(-1), a)
        cts.update(c, c.sum(-1), a)
    features = torch.randn(4, 3, 2, generator=g, dtype=F64)
    for model in (per_arm, cts):
        back = _round_trip(model, tmp_path, type(model).__name__)
        assert type(back) is type(model)
        torch.testing.assert_close(back.posterior_mean, model.posterior_mean, rtol=0, atol=0)
        torch.testing.assert_close(back.posterior_covariance, model.posterior_covariance, rtol=0, atol=0)
        assert torch.equal(back.sample_at(features, _gen()), model.sample_at(features, _gen()))
        c, a = torch.randn(4, 2, generator=g, dtype=F64), torch.tensor([0, 1, 2, 0])
        back.update(c, c.sum(-1), a)
        model.update(c, c.sum(-1), a)
        torch.testing.assert_close(back.posterior_mean, model.posterior_mean, rtol=0, atol=0)
    assert back._since_refresh == cts._since_refresh


# ------------------------------------------------------------------------------- probit GP, networks
@pytest.fixture(scope="module")
def probit():
    from bayes_safe.models import ProbitGP

    g = _gen(5)
    X = torch.randn(600, 4, generator=g, dtype=F64)
    y = (X[:, 0] + 0.5 * torch.randn(600, generator=g, dtype=F64) > 0).double()
    gp = ProbitGP(4, hidden=(8, 3), activation="tanh", refit_every=None, nn_epochs=2, nn_min_steps=30, gp_epochs=1, seed=0,
                  nn_holdout=0.2, nn_patience=3)
    gp.update(X, y)
    gp.fit()
    return gp, X, y


def test_a_probit_gp_file_written_before_the_refit_options_loads_with_their_defaults(probit, tmp_path):
    import json

    gp, X, _ = probit
    path = save_state(gp, tmp_path / "old")
    doc = json.loads(path.read_text())

    def strip(node):  # the file as the version before nn_holdout / nn_patience wrote it
        if isinstance(node, dict):
            if node.get("type") == "ProbitGP":
                node["config"].pop("nn_holdout"), node["config"].pop("nn_patience")
            for v in node.values():
                strip(v)

    strip(doc)
    path.write_text(json.dumps(doc))
    back = load_state(path)
    assert (back.nn_holdout, back.nn_patience) == (0.1, 2)
    assert torch.equal(back.predict(X[:5])[0], gp.predict(X[:5])[0])


def test_probit_gp_views_share_one_posterior_after_loading(probit, tmp_path):
    from bayes_safe.models import ScaledOutcome, SuccessProbability

    gp, X, y = probit
    policy = TSASC(ScaledOutcome(gp, [1.0, 1.5, 2.0]), SuccessProbability(gp), alpha=0.05)
    back = _round_trip(policy, tmp_path)
    assert back.reward_model.model is back.constraint_models[0].model  # one GP, saved once
    new = back.reward_model.model
    assert new.weight_names == gp.weight_names and new.num_fits == 1 and new.num_observations == 600
    assert (new.nn_holdout, new.nn_patience) == (0.2, 3)  # the refit schedule travels with the model
    for a, b in zip(gp.predict(X[:20]), new.predict(X[:20])):
        assert torch.equal(a, b)
    assert torch.equal(new.gp_predictive(X[:5])[1], gp.gp_predictive(X[:5])[1])
    features = X[:6].reshape(2, 3, 4)
    baseline = torch.tensor([0, 1])
    assert torch.equal(policy.select(features, baseline, _gen()), back.select(features, baseline, _gen()))
    assert torch.equal(back.alpha, policy.alpha)
    # the loaded model refits like the original (same data, same generator state)
    original = gp.compact()
    new.update(X[:10], y[:10])
    original.update(X[:10], y[:10])
    new.fit()
    original.fit()
    assert torch.equal(new.weight_mean, original.weight_mean)


def test_probit_gp_saved_with_fewer_observations(probit, tmp_path):
    gp, X, _y = probit
    path = save_state(gp, tmp_path / "gp", max_observations=50)
    small = load_state(path)
    assert small.observations()[0].shape == (50, 4) and small.num_observations == 600
    assert gp.observations()[0].shape == (600, 4)  # the original keeps its data
    assert torch.equal(small.predict(X[:3])[0], gp.predict(X[:3])[0])


def test_offline_policy_network_and_ridge_reward_model(tmp_path):
    from bayes_safe.offline.estimators import RidgeRewardModel
    from bayes_safe.offline.policy import mlp_policy

    net = mlp_policy(5, 3, hidden=8, seed=1)
    ridge = RidgeRewardModel(torch.randn(3, 5, dtype=F64), torch.randn(3, dtype=F64), 0.0, 1.0)
    back = _round_trip({"policy": net, "reward_model": ridge, "linear": torch.nn.Linear(2, 2)}, tmp_path)
    x = torch.randn(4, 5)
    assert torch.equal(back["policy"](x), net(x)) and type(back["policy"][-1]) is type(net[-1])
    assert torch.equal(back["reward_model"].predict(x.double()), ridge.predict(x.double()))
    with pytest.raises(TypeError, match="cannot save a torch module of type Bilinear"):
        save_state(torch.nn.Bilinear(2, 2, 1), tmp_path / "bad")


# ------------------------------------------------------------------------------- policies
@pytest.mark.parametrize("name", POLICIES)
def test_every_factory_policy_round_trips_and_continues(name, tmp_path):
    env = kazerouni2017(replications=3, seed=0) if name in ("lucb", "clucb") else daulton2019(replications=3, seed=0)
    policy = make_policy(name, env, alpha=0.2 if name in ("clucb",) else None)
    rng = ReplicationRNG.from_seed(1, replications=3)
    for t in range(5):
        step = env.step(t)
        a = policy.select(step.features, step.baseline, rng)
        rows = torch.arange(3)
        reward = step.features[rows, a, 0]
        cons = step.features[rows, a, 1:2]
        policy.update(step.features[rows, a], reward, cons, a)
    back = _round_trip(policy, tmp_path)
    assert type(back) is type(policy)
    for key in ("alpha", "delta", "mode"):
        if hasattr(policy, key):
            value = getattr(policy, key)
            assert torch.equal(value, getattr(back, key)) if torch.is_tensor(value) else value == getattr(back, key)
    step = env.step(5)
    rng1, rng2 = ReplicationRNG.from_seed(2, replications=3), ReplicationRNG.from_seed(2, replications=3)
    a1 = policy.select(step.features, step.baseline, rng1)
    a2 = back.select(step.features, step.baseline, rng2)
    assert torch.equal(a1, a2)
    rows = torch.arange(3)
    for p, a in ((policy, a1), (back, a2)):
        p.update(step.features[rows, a], step.features[rows, a, 0], step.features[rows, a, 1:2], a)
    for role, m in policy.models().items():
        torch.testing.assert_close(back.models()[role].posterior_mean, m.posterior_mean, rtol=0, atol=0)


def test_bcts_and_constraint_mask_keep_teaching_and_sigma(tmp_path):
    rng = ReplicationRNG.from_seed(0, replications=2)
    bcts = BCTS(torch.tensor([0.25, 1.0]), num_arms=3, dim=2, teaching=["random", "cts"], batch_shape=[2])
    allowed = torch.tensor([[True, False, True]] * 2)
    bcts.learn_constraints(lambda step, g: (torch.ones(2, 3, 2, dtype=F64), allowed), num_examples=20, generator=rng)
    back = _round_trip(bcts, tmp_path)
    assert torch.equal(back.sigma_online, bcts.sigma_online) and torch.equal(back.random_teaching, bcts.random_teaching)
    assert back.num_teaching_examples == 20
    f = torch.randn(2, 3, 2, dtype=F64)
    assert torch.equal(bcts.select(f, generator=_gen()), back.select(f, generator=_gen()))
    mask = _round_trip(ConstraintMask(num_arms=3, dim=2, batch_shape=[2]), tmp_path, "mask")
    assert type(mask) is ConstraintMask and mask.reward_model.num_arms == 3


def test_save_models_keeps_the_policy_configuration(tmp_path):
    env = daulton2019(replications=2, seed=0)
    policy = make_policy("ts-asc", env, alpha=0.07)
    paths = save_models(policy, tmp_path / "models", prefix=("alpha=0.07", "TS-ASC"))
    assert [p.name for p in paths] == ["alpha=0.07__TS-ASC__reward.json", "alpha=0.07__TS-ASC__constraint0.json",
                                       "alpha=0.07__TS-ASC__policy.json"]
    assert json.loads(paths[-1].read_text())["object"]["alpha"] == [0.07]
    assert set(load_models(tmp_path / "models")) == {"alpha=0.07__TS-ASC__reward", "alpha=0.07__TS-ASC__constraint0"}
    back = load_policy(tmp_path / "models", ("alpha=0.07", "TS-ASC"))
    assert type(back) is TSASC and torch.equal(back.alpha, policy.alpha)
    step = env.step(0)
    assert torch.equal(back.select(step.features, step.baseline, _gen()), policy.select(step.features, step.baseline, _gen()))
    with pytest.raises(StateError, match="load it with bayes_safe.diagnostics.load_policy"):
        load_state(paths[-1])


# ------------------------------------------------------------------------------- custom priors
HORSESHOE = """
import pyro, pyro.distributions as dist, torch

def horseshoe():
    tau = pyro.sample("tau", dist.HalfCauchy(torch.tensor(1.0, dtype=torch.float64)))
    lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(2, dtype=torch.float64)).to_event(1))
    return pyro.sample("w", dist.Normal(torch.zeros(2, dtype=torch.float64), tau * lam).to_event(1))
"""


@pytest.fixture
def prior_module(tmp_path, monkeypatch):
    name = f"my_priors_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HORSESHOE))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def test_custom_prior_function_needs_allow_imports(prior_module, tmp_path):
    m = BayesianLinear(prior_module.horseshoe, noise_std=0.3, dim=2, inference="svi",
                       inference_options={"svi_steps": 30, "num_samples": 20, "seed": 0})
    X, y = _data(n=10, d=2)
    m.update(X, y)
    m.fit()
    path = save_state(m, tmp_path / "hs")
    spec = json.loads(path.read_text())["object"]["prior"]
    assert spec == {"callable": f"{prior_module.__name__}:horseshoe"}
    with pytest.raises(StateError, match=rf"hs.json: .*'{prior_module.__name__}:horseshoe'.*allow_imports=True"):
        load_state(path)
    back = load_state(path, allow_imports=True)
    assert back.prior is prior_module.horseshoe and torch.equal(back.sample(_gen()), m.sample(_gen()))
    # the module is gone on the loading machine: a clear error naming the import path
    text = path.read_text().replace(f"{prior_module.__name__}:horseshoe", "no_such_module_xyz:horseshoe")
    path.write_text(text)
    with pytest.raises(StateError, match="cannot import the prior 'no_such_module_xyz:horseshoe'.*ModuleNotFoundError"):
        load_state(path, allow_imports=True)


def test_a_lambda_prior_is_refused_when_saving(tmp_path):
    def local_prior():
        return pyro.sample("w", dist.Normal(torch.zeros(2, dtype=F64), 1.0).to_event(1))

    m = BayesianLinear(local_prior, noise_std=0.3, dim=2, inference="svi",
                       inference_options={"svi_steps": 5, "num_samples": 5})
    with pytest.raises(ValueError, match="model.prior: the function .*local_prior.* cannot be saved.*importable module"):
        save_state(m, tmp_path / "x")
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------- broken files
@pytest.fixture
def saved(tmp_path):
    m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.3, batch_shape=[2])
    m.update(*_data(batch=(2,)))
    return save_state(m, tmp_path / "m")


def _edit(path, change):
    header = json.loads(path.read_text())
    change(header)
    path.write_text(json.dumps(header))


def test_truncated_tensor_file_is_named(saved):
    tensors = saved.with_suffix(".safetensors")
    tensors.write_bytes(tensors.read_bytes()[:-40])
    with pytest.raises(StateError, match=r"m\.safetensors: its checksum differs"):
        load_state(saved)
    _edit(saved, lambda h: h.pop("sha256"))
    with pytest.raises(ValueError, match=r"m\.safetensors"):
        load_state(saved)


def test_tampered_json_is_named(saved):
    from bayes_safe.state._format import _sha256

    original = saved.read_text()
    cases = [
        (lambda h: h.update(version=99), r"m\.json: state format version 99 is not supported"),
        (lambda h: h.update(format="pickle"), r"m\.json: not a bayes_safe state file"),
        (lambda h: h["object"].update(type="Evil"), r"m\.json: model: unknown model type 'Evil'"),
        (lambda h: h["tensors"]["004.model.precision"].update(shape=[2, 3, 4]), r"tensor '004.model.precision' is .* expected"),
        (lambda h: h["object"].update(batch_shape=[3]), r"m\.json: model.*shape \[2, 3\], expected \[3, 3\]"),
        (lambda h: h["object"].update(noise_std=-1.0), r"m\.json: model: the saved configuration is not valid.*noise_std"),
        (lambda h: h["object"].update(dim="3"), r"m\.json: model: field 'dim' has the wrong type"),
    ]
    for change, message in cases:
        saved.write_text(original)
        _edit(saved, change)
        with pytest.raises(StateError, match=message):
            load_state(saved)
    saved.write_text("{not json")
    with pytest.raises(StateError, match=r"m\.json: not valid JSON"):
        load_state(saved)
    saved.write_text('{"object": ' + "[" * 100_000 + "]" * 100_000 + "}")  # nested past Python's stack (issue 40)
    with pytest.raises(StateError, match=r"m\.json: not a bayes_safe state file \(JSON nested too deep\)"):
        load_state(saved)
    # tensors replaced consistently (checksum recomputed): shapes and values are still checked
    from safetensors.torch import load_file, save_file

    saved.write_text(original)
    tensor_path = saved.with_suffix(".safetensors")
    tensors = load_file(str(tensor_path))
    tensors["005.model.eta"] = torch.full((2, 3), float("nan"), dtype=F64)
    save_file(tensors, str(tensor_path))
    _edit(saved, lambda h: h.update(sha256=_sha256(tensor_path)))
    with pytest.raises(StateError, match=r"m\.json: model\.eta: tensor '005.model.eta' holds non-finite values"):
        load_state(saved)
    tensors["005.model.eta"] = torch.zeros(2, 3, dtype=F64)
    tensors["999.extra"] = torch.zeros(1)
    save_file(tensors, str(tensor_path))
    _edit(saved, lambda h: h.update(sha256=_sha256(tensor_path)))
    with pytest.raises(StateError, match=r"unexpected \['999.extra'\]"):
        load_state(saved)
    with pytest.raises(StateError, match=r"nothing\.json: no such state file"):
        load_state(saved.parent / "nothing")


# ------------------------------------------------------------------------------- security
EVIL = """
import os, pickle, sys

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[1],))

with open(sys.argv[2], "wb") as f:
    pickle.dump(Payload(), f)
"""


def test_diagnose_never_unpickles_a_received_file(tmp_path):
    run = tmp_path / "run"
    env = daulton2019(replications=2, seed=0)
    policy = make_policy("ts", env)
    policy.update(env.step(0).features[:, 0], torch.zeros(2, dtype=F64), None, torch.zeros(2, dtype=torch.long))
    save_models(policy, run / "models")
    marker = tmp_path / "PWNED"
    script = tmp_path / "make_evil.py"
    script.write_text(EVIL)
    subprocess.run([sys.executable, str(script), str(marker), str(run / "models" / "evil.pt")], check=True)
    assert not marker.exists()
    exe = Path(sys.executable).parent / "bayes-safe"
    done = subprocess.run([str(exe), "diagnose", str(run)], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert not marker.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "evil.pt saved in the old pickle format" in lines[0]
    assert "unpickling can execute code" in lines[0] and "Traceback" not in done.stderr
    assert not (run / "diagnostics").exists()


def test_an_old_pickle_directory_gets_one_clear_line(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "alpha=0.01__TS-ASC__reward.pt").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ValueError, match=r"^[^\n]*alpha=0.01__TS-ASC__reward.pt saved in the old pickle format "
                                         r"\(\*\.pt\), which bayes_safe no longer loads[^\n]*re-run[^\n]*$"):
        load_models(models)
    with pytest.raises(ValueError, match="old pickle format"):
        load_policy(models)


def test_no_torch_pickles_anywhere():
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("bayes_safe", "tuning", "studies"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            if "weights_only=False" in text or "torch.save(" in text or "torch.load(" in text:
                offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_tsasc_with_constraint_declarations_round_trips(tmp_path):
    """A lower-is-better guardrail ("at most 1.02 x the baseline") is saved as its declaration, not as alpha."""
    import pyro.distributions as dist

    from bayes_safe import TSASC, BayesianLinear, Constraint
    from bayes_safe.state import load_state, save_state

    def model():
        prior = dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([3]).to_event(1)
        return BayesianLinear(prior, noise_std=0.5, batch_shape=[2])

    declared = [Constraint.relative("unsubscribe", at_most=1.02)]
    policy = TSASC(model(), [model()], constraints=declared)
    X = torch.randn(2, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    policy.update(X[:, 0], torch.ones(2, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64))
    back = load_state(save_state(policy, tmp_path / "policy"))
    assert list(back.constraints) == declared
    assert back.alpha is None
    baseline = torch.zeros(2, dtype=torch.long)
    a = policy.select(X, baseline, generator=torch.Generator().manual_seed(5))
    b = back.select(X, baseline, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_logistic_reward_model_round_trips(tmp_path):
    from bayes_safe.offline.estimators import LogisticRewardModel

    g = torch.Generator().manual_seed(0)
    model = LogisticRewardModel(torch.randn(5, 3, generator=g, dtype=torch.float64),
                                torch.randn(5, generator=g, dtype=torch.float64))
    back = load_state(save_state(model, tmp_path / "dm"))
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    assert torch.equal(back.predict(x), model.predict(x))
