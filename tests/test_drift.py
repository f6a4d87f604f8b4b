"""Drifting problems (issue 30): the presets of ``bayes_safe.envs.drifting`` (an abrupt change and a
slow rotation), the Problem protocol's step (``draw(n, generator, step=t)``), and ``simulate``'s
regret and violations against the drifted optimum, on the lean Thompson path and the general one.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import (
    PROBLEMS,
    Constraint,
    DriftingLinearBandit,
    Problem,
    Units,
    daulton2019,
    daulton2019_abrupt,
    daulton2019_rotating,
    kazerouni2017_neurips,
    kazerouni2017_neurips_abrupt,
    kazerouni2017_neurips_rotating,
    make_problem,
)
from bayes_safe.random import replication_seeds

F64 = torch.float64
# small instances: fast, and the optimum can move
SMALL = {"num_arms": 6, "dim": 3, "baseline_rank": 3}
GUARDED = {"num_arms": 6, "dim": 3, "top_reward": 4, "baseline_rank": 2}


def _model(env, metric=0, forgetting=None):
    prior = dist.Normal(torch.zeros(env.dim, dtype=F64), torch.tensor(1.0, dtype=F64)).expand([env.dim]).to_event(1)
    return BayesianLinear(prior, noise_std=float(env.noise_std[metric]), batch_shape=[env.replications],
                          forgetting=forgetting)


class _GeneralTS(ThompsonSampling):
    """A subclass: ``simulate`` takes its general path (``policy.select`` / ``policy.update``)."""


class _Fixed:
    """Plays a fixed action sequence ``[T, R]`` (a deterministic policy for hand-computed regret)."""

    def __init__(self, actions):
        self.actions, self.t = actions, 0

    def select(self, features, baseline, generator=None, valid=None):
        a = self.actions[self.t]
        self.t += 1
        return a.clone()

    def update(self, features_chosen, reward, constraints=None, actions=None):
        pass


def _hand_judged(env, actions, T):
    """Regret ``[T, R]`` and violations ``[T, R]`` computed here from ``env.expected_at(t)``: the best
    action meeting ``E[c|a] >= (1 - alpha) E[c|b]`` (the baseline always does), violations of the
    plays that break it (never the baseline's)."""
    R = env.replications
    regret = torch.zeros(T, R, dtype=F64)
    violation = torch.zeros(T, R, dtype=torch.bool)
    for t in range(T):
        table = env.expected_at(t)
        for r in range(R):
            b = int(env.baseline_action[r])
            ok = [True] * env.num_arms
            if env.alpha is not None:
                ok = [bool((table[r, k, 1:] >= (1 - env.alpha) * table[r, b, 1:]).all()) for k in range(env.num_arms)]
                ok[b] = True
            best = max(float(table[r, k, 0]) for k in range(env.num_arms) if ok[k])
            a = int(actions[t, r])
            regret[t, r] = best - float(table[r, a, 0])
            violation[t, r] = not ok[a]
    return regret, violation


# ------------------------------------------------------------------------------- the presets
def test_abrupt_change_switches_the_parameters_at_the_change_step():
    env = kazerouni2017_neurips_abrupt(replications=3, seed=4, change_step=5, **SMALL)
    base = kazerouni2017_neurips(replications=3, seed=4, **SMALL)
    assert isinstance(env, DriftingLinearBandit) and env.kind == "abrupt"
    torch.testing.assert_close(env.expected_at(0), base.expected, rtol=0, atol=0)  # before: the stationary preset
    assert env.expected_at(4) is env.expected_at(0)  # one table object per regime
    after = env.expected_at(5)
    assert after is env.expected_at(1000)
    assert not torch.equal(after, env.expected_at(4))
    torch.testing.assert_close(env.parameters_at(5), env.changed_parameters, rtol=0, atol=0)
    torch.testing.assert_close(after, torch.einsum("rkd,rmd->rkm", env.arm_features, env.changed_parameters))
    # the change matters: every replication's optimal arm moves
    assert (after[..., 0].argmax(-1) != base.expected[..., 0].argmax(-1)).all()


def test_a_drifting_constraint_changes_only_the_guardrail_and_breaks_the_old_optimum():
    env = daulton2019_abrupt(replications=3, seed=1, change_step=10, drifting="constraint", **GUARDED)
    assert env.drifting_metrics == (1,)
    before, after = env.parameters_at(9), env.parameters_at(10)
    torch.testing.assert_close(before[:, 0], after[:, 0], rtol=0, atol=0)  # the reward stays
    assert not torch.equal(before[:, 1], after[:, 1])
    table = env.expected_at(10)
    for r in range(3):
        b, best = int(env.baseline_action[r]), int(env.optimal_action[r])
        assert float(table[r, b, 1]) > 0  # the relative guardrail keeps its meaning
        if best != b:  # the old optimum breaks the guardrail after the change
            assert float(table[r, best, 1]) < (1 - env.alpha) * float(table[r, b, 1])


def test_rotation_preserves_the_norm_and_turns_by_the_angle_per_step():
    angle = 0.01
    env = daulton2019_rotating(replications=2, seed=3, angle=angle, drifting="reward", **GUARDED)
    theta0 = env.parameters_at(0)
    torch.testing.assert_close(theta0, env.parameters, rtol=0, atol=0)
    for t in (1, 7, 250):
        now, nxt = env.parameters_at(t), env.parameters_at(t + 1)
        torch.testing.assert_close(now.norm(dim=-1), theta0.norm(dim=-1))  # norms preserved
        cos = (now[:, 0] * nxt[:, 0]).sum(-1) / (now[:, 0].norm(dim=-1) * nxt[:, 0].norm(dim=-1))
        torch.testing.assert_close(torch.arccos(cos.clamp(-1, 1)), torch.full((2,), angle, dtype=F64), atol=1e-6, rtol=0)
        cos0 = (theta0[:, 0] * now[:, 0]).sum(-1) / theta0[:, 0].norm(dim=-1) ** 2  # t steps: t x angle in total
        torch.testing.assert_close(cos0, torch.full((2,), math.cos(t * angle), dtype=F64))
        torch.testing.assert_close(now[:, 1], theta0[:, 1], rtol=0, atol=0)  # the constraint does not drift
        torch.testing.assert_close(env.expected_at(t), torch.einsum("rkd,rmd->rkm", env.arm_features, now))


def test_batched_presets_equal_the_one_replication_problems_of_their_seeds():
    R, T = 3, 12
    builders = [lambda **k: kazerouni2017_neurips_abrupt(change_step=6, **SMALL, **k),
                lambda **k: kazerouni2017_neurips_rotating(angle=0.05, **SMALL, **k)]
    for build in builders:
        env = build(replications=R, seed=11)
        trace = simulate(ThompsonSampling(_model(env)), env, T, seed=2)
        run_seeds = replication_seeds(2, R)
        for r in range(R):
            one = build(replications=1, seed=[env.seeds[r]])
            for t in (0, 6, 11):
                torch.testing.assert_close(one.expected_at(t)[0], env.expected_at(t)[r], rtol=0, atol=0)
            alone = simulate(ThompsonSampling(_model(one)), one, T, seed=[run_seeds[r]])
            assert torch.equal(alone.actions[:, 0], trace.actions[:, r])
            assert torch.equal(alone.regret[:, 0], trace.regret[:, r])


# ------------------------------------------------------------------ simulate against the drift
@pytest.mark.parametrize("path", ["lean", "general"])
def test_simulate_counts_regret_against_the_drifted_optimum(path):
    env = kazerouni2017_neurips_abrupt(replications=2, seed=0, change_step=4, **SMALL)
    T = 9
    policy = ThompsonSampling(_model(env)) if path == "lean" else _GeneralTS(_model(env))
    trace = simulate(policy, env, T, seed=3)
    regret, _ = _hand_judged(env, trace.actions, T)
    torch.testing.assert_close(trace.regret, regret, rtol=0, atol=1e-12)
    torch.testing.assert_close(trace.optimal_reward[5], env.expected_at(5)[..., 0].max(-1).values)


def test_the_lean_and_general_paths_agree_on_a_drifting_problem_with_forgetting():
    env = kazerouni2017_neurips_rotating(replications=2, seed=5, angle=0.05, **SMALL)
    lean = simulate(ThompsonSampling(_model(env, forgetting=0.9)), env, 20, seed=1)
    general = simulate(_GeneralTS(_model(env, forgetting=0.9)), env, 20, seed=1)
    assert torch.equal(lean.actions, general.actions)
    assert torch.equal(lean.regret, general.regret)


def test_simulate_judges_the_guardrail_against_the_drifted_constraint():
    env = daulton2019_abrupt(replications=2, seed=2, change_step=3, drifting="all", **GUARDED)
    T = 7
    actions = torch.arange(T * 2).reshape(T, 2) % env.num_arms  # every arm played, before and after
    trace = simulate(_Fixed(actions), env, T, seed=0)
    assert torch.equal(trace.actions, actions)
    regret, violation = _hand_judged(env, actions, T)
    torch.testing.assert_close(trace.regret, regret, rtol=0, atol=1e-12)
    assert torch.equal(trace.violation, violation)
    # TS-ASC runs on it (the general path), reproducibly
    runs = [simulate(TSASC(_model(env), [_model(env, 1)], alpha=env.alpha), env, T, seed=4) for _ in range(2)]
    assert torch.equal(runs[0].actions, runs[1].actions)


# --------------------------------------------------------------- a user's problem with the step
class SwappingOffers(Problem):
    """Two offers whose mean rewards swap at ``swap_at``; a guardrail on a second metric that drifts
    with them. Uses the step through the protocol: ``draw(n, generator, step=0)``."""

    name = "swapping-offers"
    metric_names = ("click", "complaints")
    constraints = (Constraint.absolute("complaints", at_most=0.5),)
    replications = 2

    def __init__(self, swap_at=4):
        self.swap_at = swap_at
        self.steps_seen = []

    def draw(self, n, generator, step=0):
        self.steps_seen.append(step)
        features = torch.eye(2, dtype=F64).expand(n, 2, 2)
        noise = torch.randn(n, 2, generator=generator, dtype=F64)
        return Units(features, torch.zeros(n, dtype=torch.long), context=(step, noise))

    def _table(self, step, n):
        click = [0.2, 0.8] if step < self.swap_at else [0.8, 0.2]
        complaints = [0.1, 0.3] if step < self.swap_at else [0.9, 0.1]
        return torch.tensor([click, complaints], dtype=F64).T.expand(n, 2, 2)  # [n, K, M]

    def expected_all(self, units):
        step, _ = units.context
        return self._table(step, len(units))

    def outcomes(self, units, actions):
        step, noise = units.context
        return self._table(step, len(units))[torch.arange(len(units)), actions] + 0.1 * noise


def test_a_users_drifting_problem_gets_the_step_and_is_judged_per_step():
    problem = SwappingOffers(swap_at=4)
    T = 8
    actions = torch.tensor([[1, 0]] * T)  # replication 0 keeps offer 1, replication 1 offer 0
    trace = simulate(_Fixed(actions), problem, T, seed=0)
    assert problem.steps_seen == list(range(T))
    # by hand: before the swap offer 1 is best (0.8) and allowed; after it, offer 0 clicks 0.8 but
    # its complaints 0.9 break the guardrail, so the best allowed is offer 1 (0.2)
    expected_regret = torch.tensor([[0.0, 0.6]] * 4 + [[0.0, -0.6]] * 4, dtype=F64)
    torch.testing.assert_close(trace.regret, expected_regret)
    expected_violation = torch.tensor([[False, False]] * 4 + [[False, True]] * 4)
    assert torch.equal(trace.violation, expected_violation)
    # a Thompson policy runs on it too
    model = BayesianLinear(dist.Normal(torch.zeros(2, dtype=F64), 1.0).to_event(1), noise_std=0.1, batch_shape=[2],
                           forgetting=0.9)
    problem = SwappingOffers(swap_at=10)
    trace = simulate(ThompsonSampling(model), problem, 20, seed=1)
    assert problem.steps_seen == list(range(20))
    assert float(trace.regret[15:].mean()) < 0.6  # it follows the swap with forgetting


def test_a_problem_without_a_step_parameter_is_called_as_before():
    class Stationary(SwappingOffers):
        def draw(self, n, generator):
            units = super().draw(n, generator, step=0)
            return units

    problem = Stationary()
    trace = simulate(_Fixed(torch.ones(5, 2, dtype=torch.long)), problem, 5, seed=0)
    assert torch.equal(trace.regret, torch.zeros(5, 2, dtype=F64))


# -------------------------------------------------------------------------- registry, bad input
def test_the_presets_are_registered_by_name():
    for name in ("kazerouni2017-neurips-abrupt", "kazerouni2017-neurips-rotating", "daulton2019-abrupt",
                 "daulton2019-rotating"):
        assert name in PROBLEMS
        env = make_problem(name, replications=1, seed=0, **(GUARDED if name.startswith("daulton") else SMALL))
        assert env.name == name and isinstance(env, DriftingLinearBandit)
        assert name in repr(env)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="drifting"):
        daulton2019_abrupt(replications=1, drifting="reward-and-more", **GUARDED)
    with pytest.raises(ValueError, match="drifting"):
        from bayes_safe.envs import abrupt_change

        abrupt_change(kazerouni2017_neurips(**SMALL), drifting="constraint")  # no constraint metric
    with pytest.raises(ValueError, match="change_step"):
        kazerouni2017_neurips_abrupt(change_step=0, **SMALL)
    for angle in (0.0, -1.0, float("nan"), 4.0, True):
        with pytest.raises(ValueError, match="angle"):
            kazerouni2017_neurips_rotating(angle=angle, **SMALL)
    env = kazerouni2017_neurips_abrupt(**SMALL)
    with pytest.raises(ValueError, match="step"):
        env.draw(1, None)  # a drifting problem needs the step
    with pytest.raises(ValueError, match="step"):
        env.expected_at(-1)
    with pytest.raises(ValueError, match="^n:"):
        env.draw(2, None, step=0)
    assert isinstance(daulton2019(replications=1, **GUARDED).expected, torch.Tensor)  # the stationary one unchanged


# ------------------------------------------------------------------------ the command line
_SWAP_MODULE = '''
import torch
from bayes_safe.envs import Units


class Swap:
    """Two offers whose click rates swap at step 150; one context feature (a constant)."""
    metric_names = ("click",)
    noise_std = (0.1,)

    def draw(self, n, generator, step=0):
        return Units(torch.eye(2, dtype=torch.float64).expand(n, 2, 2), torch.zeros(n, dtype=torch.long),
                     context=step)

    def expected_all(self, units):
        rates = [0.2, 0.8] if units.context < 150 else [0.8, 0.2]
        return torch.tensor(rates, dtype=torch.float64).reshape(1, 2, 1).expand(len(units), 2, 1)

    def outcomes(self, units, actions):
        return self.expected_all(units)[torch.arange(len(units)), actions]
'''


@pytest.mark.parametrize("forgetting", ["0.95", "adaptive"])
def test_the_command_line_runs_a_users_drifting_problem_with_forgetting(tmp_path, monkeypatch, capsys, forgetting):
    import json

    from bayes_safe.cli import main

    (tmp_path / "swap.py").write_text(_SWAP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = {}
    for name, extra in (("none", []), ("forget", ["--forgetting", forgetting])):
        assert main(["simulate", "--problem", "swap:Swap", "--policy", "ts", "--replications", "4", "--horizon", "300",
                     "--no-progress", "--out", name, *extra]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["forget"]["models"]["click"].endswith(
        "adaptive forgetting: CUSUM k=0.5)" if forgetting == "adaptive" else "forgetting 0.95)")
    # after the swap the forgetting model follows; without it, 150 plays of the old best hold it back
    # (measured: 0.48x with 0.95, 0.11x adaptive)
    assert runs["forget"]["final_cumulative_regret_mean"] < 0.6 * runs["none"]["final_cumulative_regret_mean"]


def test_the_command_line_refuses_forgetting_where_it_cannot_run(tmp_path, monkeypatch, capsys):
    from bayes_safe.cli import main

    monkeypatch.chdir(tmp_path)
    for args, message in ((["--policy", "clucb", "--forgetting", "0.9"], "--forgetting: 'clucb' builds confidence sets"),
                          (["--policy", "ts", "--forgetting", "1.5"], "argument --forgetting: expected a factor in (0, 1]"),
                          (["--policy", "random", "--forgetting", "adaptive"], "--forgetting: the random policy")):
        with pytest.raises(SystemExit) as exit_info:
            main(["simulate", "--problem", "kazerouni2017-neurips-abrupt", "--replications", "2", "--horizon", "5",
                  "--no-progress", "--out", "run", *args])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert not (tmp_path / "run").exists()


_CLICK_DROP_MODULE = '''
import torch
from bayes_safe.envs import Units


class ClickDrop:
    """Two articles of 0/1 clicks; article 0 (0.5, then 0.2 from step 400) beats article 1 (0.35) until
    the change. One constant feature; the clicks drawn from the step's generator."""
    metric_names = ("click",)
    noise_std = (0.5,)

    def draw(self, n, generator, step=0):
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        return Units(torch.eye(2, dtype=torch.float64).expand(n, 2, 2), torch.zeros(n, dtype=torch.long),
                     context=(step, u))

    def expected_all(self, units):
        step = units.context[0]
        rates = [0.5 if step < 400 else 0.2, 0.35]
        return torch.tensor(rates, dtype=torch.float64).reshape(1, 2, 1).expand(len(units), 2, 1)

    def outcomes(self, units, actions):
        p = self.expected_all(units)[torch.arange(len(units)), actions]
        return (units.context[1][:, None] < p).to(torch.float64)
'''


def test_the_command_line_names_the_0_1_change_tests_settings(tmp_path, monkeypatch):
    """``--forgetting adaptive:outcomes=binary,...``: a user's 0/1 problem with the library's Gaussian
    ridge models runs the 0/1 test with the settings named (issue 43), and it finds a click drop
    that leaves the model without forgetting on the old best article."""
    import json

    from bayes_safe.cli import main

    (tmp_path / "clickdrop.py").write_text(_CLICK_DROP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = {}
    setting = "adaptive:outcomes=binary,false_alarm_rate=1e-4,odds_ratio=2,warmup=40"
    for name, extra in (("none", []), ("binary", ["--forgetting", setting])):
        assert main(["simulate", "--problem", "clickdrop:ClickDrop", "--policy", "ts", "--replications", "8",
                     "--horizon", "1200", "--seed", "3", "--no-progress", "--out", name, *extra]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    described = runs["binary"]["models"]["click"]
    assert "0/1 CUSUM, odds ratio 2" in described and "false_alarm_rate=0.0001" in described
    assert runs["binary"]["final_cumulative_regret_mean"] < 0.6 * runs["none"]["final_cumulative_regret_mean"]


@pytest.mark.parametrize(("value", "message"), [
    ("adaptive:outcome=binary", "unknown setting 'outcome'"),
    ("adaptive:outcomes=bernoulli", "outcomes: expected one of ['auto', 'gaussian', 'binary']"),
    ("adaptive:false_alarm_rate=often", "false_alarm_rate: expected a number, got 'often'"),
    ("adaptive:warmup=2.5", "warmup: expected an integer, got '2.5'"),
    ("adaptive:keep", "expected adaptive:KEY=VALUE,..."),
    ("adaptive:keep=0.1,keep=0.2", "setting 'keep' given twice"),
    ("adaptive:odds_ratio=0.5", "odds_ratio: expected a finite number > 1"),
])
def test_bad_change_test_settings_on_the_command_line_name_the_setting(tmp_path, monkeypatch, capsys, value, message):
    from bayes_safe.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--problem", "kazerouni2017-neurips-abrupt", "--policy", "ts", "--replications", "2",
              "--horizon", "5", "--no-progress", "--out", "run", "--forgetting", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--forgetting" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
