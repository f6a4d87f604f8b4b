"""Linear bandit problems with fixed arm features, batched over replications.

Every replication is its own random instance drawn from its own seed, so replication ``r``
of a batch equals a one-replication problem built from ``replication_seeds(seed, R)[r]``.

Metric 0 is the reward; metrics 1.. are auxiliary constraint metrics (Daulton et al. 2019,
section 3.1). Expected outcomes are ``E[y_m | a] = x_a^T theta_m``; observations add
independent Gaussian noise of standard deviation ``noise_std[m]``.

Regret is measured against the *best feasible* arm: the arm of largest expected reward
among those satisfying the instance-level constraint ``E[c | a] >= (1 - alpha) E[c | b]``
for every constraint metric (the baseline is always feasible). Without constraint metrics
that is simply the best arm. (The papers plot regret without defining the comparator for
the constrained case; measuring against the best infeasible arm would reward violations.)

**Devices.** Every builder takes ``device=`` (default: the CPU). The instances are drawn on the
CPU, replication by replication, from each replication's own ``torch.Generator`` (so the numbers
are the same on every device and replication ``r`` is still the one-replication problem of its
seed), then moved to ``device`` once; every tensor the problem makes afterwards (the step's noise,
the index of its rows) is made on the device of its ``arm_features``. Float64 throughout.

**Building a million instances.** That per-replication loop costs about 150 us a replication (150 s
at ``R = 1,000,000``). ``instances="counter"`` draws every replication's instance at once, where the
problem will live, from counter-based streams keyed by the replication's seed
(``bayes_safe.random.counter_normal``): replication ``r`` is still a function of its own seed alone
(the one-replication problem of that seed under the same option), with the same law as the default
instances and different numbers. Arms constrained to a half-space (every arm's mean reward
positive) are drawn by reflecting a symmetric draw into it; arms in the intersection of two
half-spaces (``daulton2019``) by drawing their component in the plane of the two parameters in
polar form (a Gaussian's angle is uniform and independent of its radius, so the wedge is sampled
exactly) and the rest freely: the law of per-arm rejection, without rejection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._validation import check_in_range, check_positive_int, check_std
from ..random import (
    Generator,
    _seed_tensor,
    counter_normal,
    counter_uniform,
    replication_seeds,
    standard_normal,
)
from .problem import Constraint, Problem, Units, chosen_rows

__all__ = ["LinearBandit", "Step", "daulton2019", "kazerouni2017", "kazerouni2017_neurips"]

#: what a policy sees at one step (the ``Units`` of a ``Problem``; the older name)
Step = Units


@dataclass
class LinearBandit(Problem):
    """A batch of ``R`` linear bandit instances with ``K`` fixed arms in ``R^d``: a ``Problem``.

    Each step every replication sees its ``K`` arms and its baseline arm; ``draw`` also draws
    the step's observation noise ``[R, M]`` (common random numbers: the outcome of any arm
    uses it) from the run's ``ReplicationRNG`` under the key ``"env/noise"``
    (``replication_streams = True``), so replication ``r`` of a batch is bit for bit the
    one-replication run of its seed. The constraints are the paper's form,
    ``Constraint.from_alpha(metric, alpha)`` for every constraint metric (none when
    ``alpha`` is None).

    ``expected`` is the ``[R, K, M]`` table of mean outcomes (an attribute here, read by the
    studies); ``expected_all(units)`` returns it for ``simulate``.

    Attributes:
        name: the problem's registry name.
        arm_features: ``[R, K, d]`` float64.
        parameters: ``[R, M, d]``: reward parameter then one per constraint metric.
        noise_std: ``[M]`` observation noise standard deviations.
        baseline_action: ``[R]`` the baseline policy's fixed action.
        alpha: the instance-level constraint level used for regret and violations (None
            when the problem has no constraint metric).
        metric_names: names of the ``M`` metrics (``"reward"`` first).
        parameter_std: the standard deviation of the prior the parameters were drawn from
            (``N(0, s^2 I)``), i.e. the well-specified prior of a Bayesian model of this
            problem; None when unknown.
    """

    name: str = field()  # field(): no default (the Problem base class's defaults are not theirs)
    arm_features: torch.Tensor
    parameters: torch.Tensor = field()
    noise_std: torch.Tensor = field()
    baseline_action: torch.Tensor
    alpha: float | None = None
    metric_names: list[str] = field(default_factory=lambda: ["reward"])
    seeds: list[int] = field(default_factory=list)
    parameter_std: float | None = None

    def __post_init__(self):
        R, K, d = self.arm_features.shape
        self.replications, self.num_arms, self.dim = R, K, d
        self.num_metrics = self.parameters.shape[1]
        # elementwise product and sum: the rounding of each entry does not depend on R (an einsum
        # may pick a batch-size-dependent kernel), so replication r is bit-identical alone
        self.expected = (self.arm_features[:, :, None, :] * self.parameters[:, None, :, :]).sum(-1)  # [R, K, M]
        rows = torch.arange(R, device=self.arm_features.device)
        self.baseline_expected = self.expected[rows, self.baseline_action]  # [R, M]
        self.feasible = self.instance_feasible(self.expected)  # [R, K]
        reward = self.expected[..., 0].masked_fill(~self.feasible, float("-inf"))
        self.optimal_action = reward.argmax(-1)
        self.optimal_reward = self.expected[rows, self.optimal_action, 0]
        self._rows = rows

    #: the Problem protocol: replication-separable streams, outputs built here (not re-checked)
    replication_streams = True
    _trusted_outputs = True

    @property
    def constraints(self) -> tuple[Constraint, ...]:
        """``Constraint.from_alpha(m, alpha)`` for every constraint metric (none without ``alpha``)."""
        if self.alpha is None:
            return ()
        return tuple(Constraint.from_alpha(m, self.alpha) for m in self.metric_names[1:])

    @property
    def num_constraints(self) -> int:
        return self.num_metrics - 1

    def instance_feasible(self, expected: torch.Tensor) -> torch.Tensor:
        """Whether outcomes ``expected [R, ..., M]`` meet ``E[c|a] >= (1 - alpha) E[c|b]`` for every constraint."""
        if self.num_constraints == 0 or self.alpha is None:
            return torch.ones(expected.shape[:-1], dtype=torch.bool, device=expected.device)
        base = self.baseline_expected[:, 1:]
        base = base.reshape(base.shape[0], *([1] * (expected.dim() - 2)), base.shape[-1])
        return (expected[..., 1:] >= (1 - self.alpha) * base).all(-1)

    def __repr__(self) -> str:
        noise = [round(v, 6) for v in self.noise_std.reshape(-1).tolist()]
        return (f"LinearBandit(name={self.name!r}, replications={self.replications}, num_arms={self.num_arms}, "
                f"dim={self.dim}, metric_names={list(self.metric_names)}, alpha={self.alpha}, noise_std={noise}, "
                f"parameter_std={self.parameter_std})")

    def step(self, t: int = 0) -> Units:
        """The candidates ``[R, K, d]`` and baseline arms ``[R]`` (fixed arms: the same every step)."""
        return Units(self.arm_features, self.baseline_action)

    def draw(self, n: int, generator: Generator = None) -> Units:
        """The ``n = R`` units of one step: the fixed arms and the step's noise ``[R, M]`` (``context``)."""
        if n != self.replications:
            raise ValueError(f"n: problem {self.name!r} has {self.replications} replications; draw(n) needs n = "
                             f"{self.replications}, got {n!r}")
        noise = standard_normal((self.replications, self.num_metrics), generator, key="env/noise",
                                device=self.arm_features.device)
        return Units(self.arm_features, self.baseline_action, None, noise)

    def outcomes(self, units: Units, actions: torch.Tensor) -> torch.Tensor:
        """Observed metrics ``[R, M]`` of ``actions [R]``: the mean plus ``noise_std`` x the step's noise."""
        return torch.addcmul(chosen_rows(self.expected, self._rows, actions), units.context, self.noise_std)

    def expected_all(self, units: Units) -> torch.Tensor:
        """The mean outcomes of every arm ``[R, K, M]`` (the same every step)."""
        return self.expected


def _rejection_arms(gen, num_arms, dim, thetas, draw, max_batches=200):
    """Draw ``num_arms`` feature vectors with every expected metric ``x^T theta_m > 0``."""
    kept, n = [], 0
    for _ in range(max_batches):
        cand = draw((4 * num_arms, dim), gen)
        ok = ((cand @ thetas.T) > 0).all(-1)
        kept.append(cand[ok])
        n += int(ok.sum())
        if n >= num_arms:
            return torch.cat(kept)[:num_arms]
    return None


def _validate_common(replications, seed, num_arms, dim, noise_std, min_arms: int = 1):
    """Check the sizes every constructor takes (before any drawing) and return the seeds."""
    replications = check_positive_int(replications, "replications")
    num_arms = check_positive_int(num_arms, "num_arms")
    if num_arms < min_arms:
        raise ValueError(f"num_arms: expected an int >= {min_arms}, got {num_arms!r}")
    check_positive_int(dim, "dim")
    check_std(noise_std, "noise_std")
    return replication_seeds(seed, replications)


def _normal(shape, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64, device=gen.device)


def _uniform_pm1(shape, gen):
    return 2 * torch.rand(shape, generator=gen, dtype=torch.float64, device=gen.device) - 1


_CPU = torch.device("cpu")

#: the ways to draw the instances (module docstring)
INSTANCES = ("generator", "counter")

#: the most float64 numbers one chunk of counter-drawn replications holds at once (1 GiB of words)
_CHUNK_NUMBERS = 1 << 26


def _check_instances(instances) -> str:
    if instances not in INSTANCES:
        raise ValueError(f"instances: expected one of {list(INSTANCES)} ('generator': each replication's own "
                         f"torch.Generator, the numbers of earlier releases; 'counter': every replication at once on "
                         f"the device), got {instances!r}")
    return instances


def _chunks(R: int, per_replication: int, device: torch.device = _CPU):
    """``[lo, hi)`` ranges of replications whose counter draws hold at most ``_CHUNK_NUMBERS`` numbers (on a
    CUDA device up to 1/64 of its free memory in 8-byte numbers: the hash's temporaries take several
    times that, and a large GPU then builds in a few chunks)."""
    numbers = _CHUNK_NUMBERS
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        numbers = max(numbers, free // (64 * 8))
    step = max(1, numbers // max(1, per_replication))
    return [(lo, min(R, lo + step)) for lo in range(0, R, step)]


def _reflected(arms: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``arms [n, K, d]`` from a law symmetric about 0, reflected into ``x^T theta > 0`` (``theta [n, d]``):
    the law of that draw conditioned on the half-space (per-arm rejection's law), without rejection."""
    side = (arms @ theta[:, :, None]) < 0  # [n, K, 1]
    return torch.where(side, -arms, arms)


def _counter_device(device) -> torch.device:
    return _CPU if device is None else torch.device(device)


def _on_device(problem: LinearBandit, device) -> LinearBandit:
    """``problem`` (built on the CPU) with its tensors moved to ``device`` (None or the CPU: itself)."""
    if device is None or torch.device(device) == _CPU:
        return problem
    device = torch.device(device)
    return LinearBandit(
        name=problem.name, arm_features=problem.arm_features.to(device), parameters=problem.parameters.to(device),
        noise_std=problem.noise_std.to(device), baseline_action=problem.baseline_action.to(device),
        alpha=problem.alpha, metric_names=list(problem.metric_names), seeds=problem.seeds,
        parameter_std=problem.parameter_std,
    )


def kazerouni2017(replications: int = 1, seed: int | list[int] = 0, num_arms: int = 100, dim: int = 10,
                  noise_std: float = 2.0, *, device: torch.device | str | None = None,
                  instances: str = "generator") -> LinearBandit:
    """Kazerouni et al. (2017, arXiv v3) section 6: conservative linear bandit simulation.

    100 arms with features ``U[-1, 1]^10``; ``theta* ~ N(0, 10 I)`` redrawn until... (the paper:
    "such that the mean reward associated to each arm is positive", which we implement by
    redrawing each *arm* until its mean reward is positive, as the issue specifies); noise
    ``N(0, 4)``, read as variance 4 (standard deviation 2), the usual ``N(mean, variance)``
    notation. The baseline's mean reward is "the average of the performances of the second
    and third best arm": we append a baseline arm ``K`` with features ``(x_2 + x_3) / 2``,
    whose expected reward is exactly that average (linearity), so the known baseline reward of
    CLUCB is ``x_b^T theta*``. Returns ``K = num_arms + 1`` candidates. ``device``: where the
    problem's tensors live (module docstring; default the CPU). ``instances``: ``"generator"``
    (default) or ``"counter"`` (every replication at once on ``device``; module docstring).
    """
    # the baseline arm averages the 2nd and 3rd best arms: at least 3 arms
    seeds = _validate_common(replications, seed, num_arms, dim, noise_std, min_arms=3)
    if _check_instances(instances) == "counter":
        return _kazerouni2017_counter(seeds, num_arms, dim, noise_std, _counter_device(device))
    feats, thetas = [], []
    for s in seeds:
        gen = torch.Generator(device=_CPU).manual_seed(s)
        while True:
            theta = _normal((dim,), gen) * 10**0.5
            arms = _rejection_arms(gen, num_arms, dim, theta[None], _uniform_pm1)
            if arms is not None:
                break
        mean = arms @ theta
        order = mean.argsort(descending=True)
        base = 0.5 * (arms[order[1]] + arms[order[2]])
        feats.append(torch.cat([arms, base[None]]))
        thetas.append(theta[None])
    R = len(seeds)
    return _on_device(LinearBandit(
        name="kazerouni2017", arm_features=torch.stack(feats), parameters=torch.stack(thetas),
        noise_std=torch.tensor([float(noise_std)], dtype=torch.float64, device=_CPU),
        baseline_action=torch.full((R,), num_arms, dtype=torch.long, device=_CPU), seeds=seeds, parameter_std=10**0.5,
    ), device)


def kazerouni2017_neurips(replications: int = 1, seed: int | list[int] = 0, num_arms: int = 100, dim: int = 4,
                          noise_std: float = 1.0, baseline_rank: int = 10, *, device: torch.device | str | None = None,
                          instances: str = "generator") -> LinearBandit:
    """The NeurIPS 2017 version of the CLUCB experiment, which Daulton et al. (2019) follow.

    100 arms in ``R^4``; features and ``theta`` ``N(0, I)`` with every arm's mean reward
    positive (arms redrawn); ``N(0, 1)`` noise; the baseline is the ``baseline_rank``-th best
    arm (10th by default). ``device``: where the problem's tensors live (module docstring;
    default the CPU; the instances are drawn on the CPU, the same numbers on every device).
    ``instances="counter"``: every replication drawn at once on ``device`` (module docstring;
    about 1 s at ``R = 1,000,000`` on a GPU).

    Example (a million instances on a GPU)::

        env = kazerouni2017_neurips(1_000_000, seed=0, device="cuda", instances="counter")
    """
    seeds = _validate_common(replications, seed, num_arms, dim, noise_std)
    check_positive_int(baseline_rank, "baseline_rank")
    if not 1 <= baseline_rank <= num_arms:
        raise ValueError(f"baseline_rank: expected 1..{num_arms}, got {baseline_rank}")
    if _check_instances(instances) == "counter":
        return _kazerouni2017_neurips_counter(seeds, num_arms, dim, noise_std, baseline_rank, _counter_device(device))
    feats, thetas, base = [], [], []
    for s in seeds:
        gen = torch.Generator(device=_CPU).manual_seed(s)
        while True:
            theta = _normal((dim,), gen)
            arms = _rejection_arms(gen, num_arms, dim, theta[None], _normal)
            if arms is not None:
                break
        feats.append(arms)
        thetas.append(theta[None])
        base.append(int((arms @ theta).argsort(descending=True)[baseline_rank - 1]))
    return _on_device(LinearBandit(
        name="kazerouni2017-neurips", arm_features=torch.stack(feats), parameters=torch.stack(thetas),
        noise_std=torch.tensor([float(noise_std)], dtype=torch.float64, device=_CPU),
        baseline_action=torch.tensor(base, dtype=torch.long, device=_CPU), seeds=seeds, parameter_std=1.0,
    ), device)


def daulton2019(replications: int = 1, seed: int | list[int] = 0, alpha: float = 0.01, num_arms: int = 100,
                dim: int = 4, noise_std: float = 0.1, top_reward: int = 30, baseline_rank: int = 20, *,
                device: torch.device | str | None = None, instances: str = "generator") -> LinearBandit:
    """Daulton et al. (2019) section 4.1: a reward and an auxiliary constraint metric.

    ``theta^(r), theta^(c)`` and arm features are i.i.d. ``N(0, I_4)``; an arm's features are
    redrawn until both expected metrics are positive; ``sigma = 0.1`` on both metrics. The
    baseline arm is the ``baseline_rank``-th (20th) best by expected constraint among the
    ``top_reward`` (30) best by expected reward. The instance is redrawn until the best
    feasible reward (at ``alpha``) is below the best infeasible reward, so that the
    constraint costs reward. ``device``: where the problem's tensors live (module docstring;
    default the CPU). ``instances="counter"``: every replication drawn at once on ``device``
    (module docstring; needs ``dim >= 2``).
    """
    seeds = _validate_common(replications, seed, num_arms, dim, noise_std)
    alpha = check_in_range(alpha, "alpha", 0.0, 1.0)
    check_positive_int(baseline_rank, "baseline_rank")
    check_positive_int(top_reward, "top_reward")
    if not 1 <= baseline_rank <= top_reward <= num_arms:
        raise ValueError(f"baseline_rank, top_reward: expected 1 <= baseline_rank <= top_reward <= num_arms, got {baseline_rank}, {top_reward}")
    if _check_instances(instances) == "counter":
        if dim < 2:
            raise ValueError(f"dim: instances='counter' draws daulton2019's arms in the plane of its two parameters "
                             f"and needs dim >= 2, got {dim}; use instances='generator'")
        return _daulton2019_counter(seeds, alpha, num_arms, dim, noise_std, top_reward, baseline_rank,
                                    _counter_device(device))
    feats, thetas, base = [], [], []
    for s in seeds:
        gen = torch.Generator(device=_CPU).manual_seed(s)
        for _attempt in range(10_000):
            theta = _normal((2, dim), gen)
            arms = _rejection_arms(gen, num_arms, dim, theta, _normal)
            if arms is None:
                continue
            mean = arms @ theta.T  # [K, 2]
            top = mean[:, 0].argsort(descending=True)[:top_reward]
            b = int(top[mean[top, 1].argsort(descending=True)[baseline_rank - 1]])
            feasible = mean[:, 1] >= (1 - alpha) * mean[b, 1]
            if (~feasible).any() and mean[feasible, 0].max() < mean[~feasible, 0].max():
                break
        else:
            raise ValueError(
                f"daulton2019: no instance with a reward/constraint trade-off in 10,000 draws for alpha={alpha}, "
                f"baseline_rank={baseline_rank}, top_reward={top_reward}; choose a baseline_rank below top_reward"
            )
        feats.append(arms)
        thetas.append(theta)
        base.append(b)
    return _on_device(LinearBandit(
        name="daulton2019", arm_features=torch.stack(feats), parameters=torch.stack(thetas),
        noise_std=torch.full((2,), float(noise_std), dtype=torch.float64, device=_CPU),
        baseline_action=torch.tensor(base, dtype=torch.long, device=_CPU), alpha=alpha,
        metric_names=["reward", "constraint"], seeds=seeds, parameter_std=1.0,
    ), device)


# --- instances="counter": every replication at once (module docstring) ----------------------------------------


def _counter_buffers(seeds, K: int, d: int, M: int, device):
    """What a counter build fills: ``(R, the seeds' words [R], features [R, K, d], parameters [R, M, d],
    baseline arms [R])``, the tensors empty, on ``device``."""
    R = len(seeds)
    return (R, _seed_tensor(seeds, device), torch.empty(R, K, d, dtype=torch.float64, device=device),
            torch.empty(R, M, d, dtype=torch.float64, device=device), torch.empty(R, dtype=torch.long, device=device))


def _kazerouni2017_neurips_counter(seeds, K, d, noise_std, baseline_rank, device) -> LinearBandit:
    R, words, feats, thetas, base = _counter_buffers(seeds, K, d, 1, device)
    for lo, hi in _chunks(R, 2 * K * d, device):
        w = words[lo:hi]
        theta = counter_normal(w, "kazerouni2017-neurips/theta", 0, d)
        arms = _reflected(counter_normal(w, "kazerouni2017-neurips/arms", 0, K * d).view(hi - lo, K, d), theta)
        feats[lo:hi], thetas[lo:hi, 0] = arms, theta
        mean = (arms * theta[:, None, :]).sum(-1)  # [n, K]
        base[lo:hi] = mean.topk(baseline_rank, dim=-1).indices[:, -1]
    return LinearBandit(
        name="kazerouni2017-neurips", arm_features=feats, parameters=thetas,
        noise_std=torch.tensor([float(noise_std)], dtype=torch.float64, device=device),
        baseline_action=base, seeds=seeds, parameter_std=1.0,
    )


def _kazerouni2017_counter(seeds, K, d, noise_std, device) -> LinearBandit:
    R = len(seeds)
    words = _seed_tensor(seeds, device)
    feats = torch.empty(R, K + 1, d, dtype=torch.float64, device=device)
    thetas = torch.empty(R, 1, d, dtype=torch.float64, device=device)
    for lo, hi in _chunks(R, K * d, device):
        w = words[lo:hi]
        theta = counter_normal(w, "kazerouni2017/theta", 0, d) * 10**0.5
        cube = 2 * counter_uniform(w, "kazerouni2017/arms", 0, K * d).view(hi - lo, K, d) - 1
        arms = _reflected(cube, theta)
        order = (arms * theta[:, None, :]).sum(-1).topk(3, dim=-1).indices  # [n, 3]
        rows = torch.arange(hi - lo, device=device)
        feats[lo:hi, :K] = arms
        feats[lo:hi, K] = 0.5 * (arms[rows, order[:, 1]] + arms[rows, order[:, 2]])
        thetas[lo:hi, 0] = theta
    return LinearBandit(
        name="kazerouni2017", arm_features=feats, parameters=thetas,
        noise_std=torch.tensor([float(noise_std)], dtype=torch.float64, device=device),
        baseline_action=torch.full((R,), K, dtype=torch.long, device=device), seeds=seeds, parameter_std=10**0.5,
    )


def _wedge_arms(w: torch.Tensor, attempt: int, K: int, d: int, theta: torch.Tensor) -> torch.Tensor:
    """``[n, K, d]`` arms ``x ~ N(0, I)`` conditioned on ``x^T theta_0 > 0`` and ``x^T theta_1 > 0``
    (``theta [n, 2, d]``), exactly: the component in the plane of the two parameters is a standard
    normal in polar form (radius ``sqrt(-2 log U)``, angle uniform on the wedge where both are
    positive); the orthogonal rest is a projected standard normal."""
    n = w.shape[0]
    e1 = theta[:, 0] / theta[:, 0].norm(dim=-1, keepdim=True)
    rest = theta[:, 1] - (theta[:, 1] * e1).sum(-1, keepdim=True) * e1
    e2 = rest / rest.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    # the angle of theta_1 in the plane, in (0, pi); the wedge of both half-planes is (phi - pi/2, pi/2)
    phi = torch.atan2((theta[:, 1] * e2).sum(-1), (theta[:, 1] * e1).sum(-1))  # [n]
    tag = f"daulton2019/arms/{attempt}"
    u = counter_uniform(w, tag + "/angle", 0, K)  # [n, K]
    angle = (phi[:, None] - 0.5 * torch.pi) + u * (torch.pi - phi[:, None])
    radius = torch.sqrt(-2.0 * torch.log1p(-counter_uniform(w, tag + "/radius", 0, K)))
    z = counter_normal(w, tag + "/rest", 0, K * d).view(n, K, d)
    z = z - (z @ e1[:, :, None]) * e1[:, None, :] - (z @ e2[:, :, None]) * e2[:, None, :]
    return z + (radius * torch.cos(angle))[..., None] * e1[:, None, :] + (radius * torch.sin(angle))[..., None] * e2[:, None, :]


def _daulton_baseline(mean: torch.Tensor, top_reward: int, baseline_rank: int, alpha: float):
    """The baseline arm ``[n]`` of ``mean [n, K, 2]`` and whether each instance has the trade-off ``[n]``."""
    top = mean[..., 0].topk(top_reward, dim=-1).indices  # [n, top] best reward first
    pick = mean[..., 1].gather(1, top).topk(baseline_rank, dim=-1).indices[:, -1]
    b = top.gather(1, pick[:, None])[:, 0]
    rows = torch.arange(mean.shape[0], device=mean.device)
    feasible = mean[..., 1] >= (1 - alpha) * mean[rows, b, 1][:, None]
    reward = mean[..., 0]
    best_in = reward.masked_fill(~feasible, float("-inf")).amax(-1)
    best_out = reward.masked_fill(feasible, float("-inf")).amax(-1)
    return b, (~feasible).any(-1) & (best_in < best_out)


def _daulton2019_counter(seeds, alpha, K, d, noise_std, top_reward, baseline_rank, device) -> LinearBandit:
    R, words, feats, thetas, base = _counter_buffers(seeds, K, d, 2, device)
    for lo, hi in _chunks(R, 4 * K * d, device):
        todo = torch.arange(lo, hi, device=device)  # the replications still without an instance
        for attempt in range(10_000):
            w = words[todo]
            theta = counter_normal(w, f"daulton2019/theta/{attempt}", 0, 2 * d).view(-1, 2, d)
            arms = _wedge_arms(w, attempt, K, d, theta)
            b, ok = _daulton_baseline(arms @ theta.mT, top_reward, baseline_rank, alpha)
            done = todo[ok]
            feats[done], thetas[done], base[done] = arms[ok], theta[ok], b[ok]
            todo = todo[~ok]
            if todo.numel() == 0:
                break
        else:
            raise ValueError(
                f"daulton2019: no instance with a reward/constraint trade-off in 10,000 draws for alpha={alpha}, "
                f"baseline_rank={baseline_rank}, top_reward={top_reward}; choose a baseline_rank below top_reward"
            )
    return LinearBandit(
        name="daulton2019", arm_features=feats, parameters=thetas,
        noise_std=torch.full((2,), float(noise_std), dtype=torch.float64, device=device),
        baseline_action=base, alpha=alpha, metric_names=["reward", "constraint"], seeds=seeds, parameter_std=1.0,
    )
