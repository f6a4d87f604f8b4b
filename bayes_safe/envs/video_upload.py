"""A simulator of the video-upload transcoding decision (Daulton et al. 2019, section 5).

The real data behind the paper is not public. This simulator keeps the paper's structure:

* a context ``x`` in ``R^39`` built from the device model and OS (sparse one-hots), the
  connection class (2G/3G/4G/wifi), the measured network download speed, the country, the
  file size, the source bitrate and the source resolution (section 5, 5.1);
* four actions ``{360p, 480p, 720p, 1080p}``, never above the source resolution;
* a Bernoulli success outcome whose probability falls with the upload size relative to the
  (hidden) upload bandwidth and varies by sub-population (device tier, connection, country);
* the paper's tabular reward ``r = 1(success) * sum_{a' <= a} omega_{a'}`` with positive
  additive offsets ``omega`` (``omega_360p = 1`` in the paper, section 5.1);
* a baseline production policy (a rule by connection class) and the paper's metrics:
  reliability (success rate), quality preserved at 1080p (``q_1080p``, section 5.3) and the
  share of uploads at each quality, overall and per sub-population.

The generating equations are written out in ``docs/video_upload.md``; the numbers live in
``VideoUploadParameters``.

Streams and common random numbers: ``VideoUpload.draw`` returns a batch of
``Uploads`` (contexts, the model's context-action feature vectors for every action, the
valid-action mask, the baseline action, the true success probabilities, and one uniform
``u_i`` per upload). ``VideoUpload.outcomes`` decides success as ``u_i < p(x_i, a_i)``,
so the *same* uniform decides an upload's success under every policy (common random numbers:
a policy that picks a more reliable action for an upload can only turn a failure into a
success, never the reverse). Successive ``draw`` calls continue one seeded stream.

Model features (what a policy's model sees, ``D = 45``): the 39 context columns, then the
action encoding: the one-hot of the action's resolution (4 columns), ``log`` of the upload size
in megabits at that action, and ``log`` of the estimated transfer time at the measured download
speed (size / speed, in seconds), named by ``FEATURE_NAMES`` (``VideoUpload.feature_names``,
kept by the models built for the problem: ``bayes-safe diagnose`` shows these names). Both last columns are computable from observed context
(file size, source bitrate, speed) and the action's target bitrate; they let a model express
"success falls with size relative to bandwidth" without having to learn a division.

``VideoUpload`` is a ``bayes_safe.envs.Problem``: every upload brings a new context, baseline
action and valid-action mask; ``outcomes`` returns ``Outcomes`` whose ``metrics`` are the
``[n, 2]`` table (reward, success), and ``expected_all`` gives the true means, so
``bayes_safe.simulate(policy, VideoUpload(alpha=0.0), T)`` reports regret against the best
action that keeps each upload's success probability at least ``(1 - alpha)`` times the
baseline's, and a violation whenever the chosen action does not (section 3.1's instance-level
constraint). The study ``studies/video_upload.py`` runs its own batched stream (``draw`` a
batch, ``select``, ``outcomes``, ``update`` after the batch, as production refits would).
``VideoUploadProblem`` is the same simulator as an ``ABProblem`` (``bayes_safe.envs.ab_problem``):
what ``bayes_safe.tuning.ABTest`` needs to run the paper's A/B tests of TS-ASC's parameters
(section 5.3) on it.

Example:
    >>> env = VideoUpload(seed=0)
    >>> up = env.draw(1000)
    >>> up.features.shape, up.valid.shape
    (torch.Size([1000, 4, 45]), torch.Size([1000, 4]))
    >>> out = env.outcomes(up, up.baseline)
    >>> overall = env.metrics(up, out)["overall"]
    >>> round(overall["reliability"], 2) > 0.5
    True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from .._validation import as_tensor, check_finite
from ..random import standard_normal, standard_uniform
from .ab_problem import ABProblem
from .linear import Step
from .problem import Constraint, Problem

__all__ = [
    "ACTION_NAMES",
    "CONNECTIONS",
    "CONTEXT_COLUMNS",
    "CONTEXT_DIM",
    "CONTEXT_NAMES",
    "COUNTRY_TIERS",
    "DEVICE_TIERS",
    "FEATURE_DIM",
    "FEATURE_NAMES",
    "NUM_ACTIONS",
    "RESOLUTIONS",
    "VIDEO_UPLOAD_PARAMETERS",
    "Outcomes",
    "Uploads",
    "VideoUpload",
    "VideoUploadParameters",
    "VideoUploadProblem",
    "percent_change",
    "video_upload",
]

RESOLUTIONS = (360, 480, 720, 1080)
ACTION_NAMES = ("360p", "480p", "720p", "1080p")
CONNECTIONS = ("2G", "3G", "4G", "wifi")
OS_NAMES = ("android", "ios", "other")
DEVICE_TIERS = ("low", "mid", "high")
COUNTRY_TIERS = ("A", "B", "C")
NUM_ACTIONS = 4
NUM_DEVICES = 13
NUM_COUNTRIES = 12
CONTEXT_DIM = 39
FEATURE_DIM = CONTEXT_DIM + NUM_ACTIONS + 2

#: column layout of the 39-dim context
CONTEXT_COLUMNS = {
    "device_model": slice(0, 13),
    "os": slice(13, 16),
    "connection": slice(16, 20),
    "log_download_mbps": slice(20, 21),
    "country": slice(21, 33),
    "log_file_size_mb": slice(33, 34),
    "log_source_bitrate_mbps": slice(34, 35),
    "source_resolution": slice(35, 39),
}

#: names of the 39 context columns, in ``CONTEXT_COLUMNS`` order: the one-hots as
#: ``<field>_<level>`` (``device_model_0`` .. ``device_model_12``, ``os_android``, ``connection_4G``,
#: ``country_0`` .. ``country_11``, tiers A, B, C of four each, ``source_360p`` ..), the measured
#: values by their unit (``log_download_mbps``, ``log_file_size_mb``, ``log_source_bitrate_mbps``)
CONTEXT_NAMES = (
    *(f"device_model_{m}" for m in range(NUM_DEVICES)),
    *(f"os_{o}" for o in OS_NAMES),
    *(f"connection_{c}" for c in CONNECTIONS),
    "log_download_mbps",
    *(f"country_{c}" for c in range(NUM_COUNTRIES)),
    "log_file_size_mb",
    "log_source_bitrate_mbps",
    *(f"source_{q}" for q in ACTION_NAMES),
)
#: names of the 45 model features (``Uploads.features``): the context's, then the action's
#: one-hot (``action_360p`` ..), ``log_upload_mbit`` (the upload's size at that quality) and
#: ``log_transfer_s`` (its size over the measured download speed). ``VideoUpload.feature_names``:
#: models built for the problem keep them (``bayes-safe diagnose`` names their weights after them)
FEATURE_NAMES = (*CONTEXT_NAMES, *(f"action_{q}" for q in ACTION_NAMES), "log_upload_mbit", "log_transfer_s")


@dataclass(frozen=True)
class VideoUploadParameters:
    """The numbers of the generating process (see ``docs/video_upload.md`` for the equations).

    Indices: countries ``c`` (12, in three tiers A/B/C of four), device models ``m`` (13),
    connection classes ``k`` (2G, 3G, 4G, wifi), resolutions ``j`` (360p..1080p).
    """

    #: P(country), one per country; countries 0-3 are tier A, 4-7 tier B, 8-11 tier C
    country_probs: tuple = (0.10, 0.08, 0.07, 0.05, 0.10, 0.09, 0.08, 0.06, 0.12, 0.10, 0.08, 0.07)
    #: P(connection | country tier), rows A, B, C; columns 2G, 3G, 4G, wifi
    connection_probs: tuple = ((0.01, 0.05, 0.44, 0.50), (0.05, 0.25, 0.45, 0.25), (0.20, 0.40, 0.25, 0.15))
    #: network speed multiplier of each country tier
    country_speed: tuple = (1.3, 0.8, 0.45)
    #: patience multiplier (scales tau) of each country tier
    country_patience: tuple = (1.2, 1.0, 0.8)
    #: P(device tier | country tier), rows A, B, C; columns low, mid, high
    device_tier_probs: tuple = ((0.10, 0.35, 0.55), (0.30, 0.45, 0.25), (0.55, 0.35, 0.10))
    #: device model -> (tier index, OS index); model 0 is a low-end non-Android/iOS phone
    devices: tuple = ((0, 2), (0, 0), (0, 0), (0, 0), (0, 0), (1, 0), (1, 0), (1, 0), (1, 0),
                      (2, 0), (2, 0), (1, 1), (2, 1))
    #: median measured download speed (Mbps) per connection class
    speed_median: tuple = (0.15, 1.5, 12.0, 25.0)
    #: log-normal spread of the measured download speed
    speed_sigma: float = 0.8
    #: upload bandwidth = ratio * measured download speed * exp(upload_sigma * eta), eta hidden
    upload_ratio: float = 0.4
    upload_sigma: float = 0.5
    #: P(source resolution | device tier), rows low, mid, high
    source_probs: tuple = ((0.25, 0.35, 0.35, 0.05), (0.05, 0.15, 0.45, 0.35), (0.02, 0.05, 0.28, 0.65))
    #: median source bitrate (Mbps) per source resolution, and its log-normal spread
    source_bitrate: tuple = (1.5, 2.5, 6.0, 12.0)
    source_bitrate_sigma: float = 0.3
    #: video duration (s): log-normal median and spread, clipped to [duration_min, duration_max]
    duration_median: float = 25.0
    duration_sigma: float = 0.9
    duration_min: float = 2.0
    duration_max: float = 600.0
    #: target bitrate (Mbps) of each upload quality (the upload uses min(source, target))
    target_bitrate: tuple = (0.8, 1.5, 3.0, 6.0)
    #: survival scale tau (s) per connection class, and the Weibull shape kappa
    tau: tuple = (1500.0, 3000.0, 5000.0, 8000.0)
    kappa: float = 1.0
    #: base reliability (app, device, server) per device tier
    device_reliability: tuple = (0.93, 0.96, 0.985)
    #: on-device transcoding survival per device tier (rows) and upload quality (columns)
    transcode_survival: tuple = ((1.0, 0.99, 0.97, 0.92), (1.0, 1.0, 0.995, 0.98), (1.0, 1.0, 1.0, 0.998))
    #: extra reliability factor of the OS 'other'
    other_os_reliability: float = 0.97
    #: baseline production policy: quality index per connection class, capped at the source
    baseline_by_connection: tuple = (0, 0, 1, 3)


@dataclass
class Uploads:
    """A batch of ``n`` uploads: everything a policy sees, plus the simulator's hidden truth.

    Attributes:
        context: ``[n, 39]`` float64 context vectors (layout: ``CONTEXT_COLUMNS``).
        features: ``[n, 4, 45]`` float64 context-action feature vectors, one per action.
        valid: ``[n, 4]`` bool, the actions at or below the source resolution.
        baseline: ``[n]`` long, the baseline production policy's action.
        success_prob: ``[n, 4]`` float64 true ``p(x, a)`` (0 where the action is invalid).
        uniform: ``[n]`` float64 ``U[0, 1)``, the common random number deciding success.
        groups: sub-population labels ``{name: [n] long}``: ``connection``,
            ``source_resolution``, ``device_tier``, ``country_tier``, ``os``.
    """

    context: torch.Tensor
    features: torch.Tensor
    valid: torch.Tensor
    baseline: torch.Tensor
    success_prob: torch.Tensor
    uniform: torch.Tensor
    groups: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.context.shape[0]

    @property
    def step(self) -> Step:
        """What a policy sees: ``Step(features, baseline, valid)``."""
        return Step(self.features, self.baseline, self.valid)

    def __getitem__(self, index) -> Uploads:
        return Uploads(
            self.context[index], self.features[index], self.valid[index], self.baseline[index],
            self.success_prob[index], self.uniform[index], {k: v[index] for k, v in self.groups.items()},
        )


@dataclass
class Outcomes:
    """What happened to ``n`` uploads under some actions.

    Attributes:
        actions: ``[n]`` long. success: ``[n]`` bool (``u < p(x, a)``). reward: ``[n]`` float64
        ``1(success) * sum_{a' <= a} omega_{a'}``. success_prob: ``[n]`` the true ``p(x, a)``.
        quality: ``[n]`` long, the uploaded resolution in lines (360..1080).
        preserved_1080p: ``[n]`` bool, a 1080p source uploaded successfully at 1080p.
    """

    actions: torch.Tensor
    success: torch.Tensor
    reward: torch.Tensor
    success_prob: torch.Tensor
    quality: torch.Tensor
    preserved_1080p: torch.Tensor

    @property
    def metrics(self) -> torch.Tensor:
        """``[n, 2]`` float64: the reward and the 0/1 success (the ``Problem`` protocol's outcome table)."""
        return torch.stack([self.reward, self.success.to(torch.float64)], -1)


def _categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF categorical draws: ``probs [n, k]`` (rows sum to 1) and ``u [n]`` -> ``[n]`` long."""
    cdf = probs.cumsum(-1)
    return (u[:, None] > cdf[:, :-1]).sum(-1)


class VideoUpload(Problem):
    """The video-upload transcoding problem: a seeded stream of uploads and their outcomes.

    A ``bayes_safe.envs.Problem`` with metrics ``("reward", "success")`` and the constraint
    ``Constraint.from_alpha("success", alpha)``.

    Args:
        omega: the four positive additive reward offsets ``(omega_360p, omega_480p, omega_720p,
            omega_1080p)``; the reward of a successful upload at quality ``a`` is
            ``sum_{a' <= a} omega_{a'}`` (Daulton et al. 2019, section 5.1, which fixes
            ``omega_360p = 1`` and searches the others in ``(0, 0.05]``).
        seed: seed of the upload stream (contexts and common random numbers).
        device: where the problem's tensors live (default the CPU; float64). Its own stream is a
            ``torch.Generator`` there; a generator given to ``draw`` draws on its own device and the
            draws are put on this one.
        params: the generating process's numbers (``VideoUploadParameters``).
        alpha: the reliability loss allowed against the baseline, in ``[0, 1)`` (the declared
            constraint ``simulate`` judges violations and regret by; policies take their own).
    """

    name = "video-upload"
    metric_names = ("reward", "success")
    #: per-metric noise scale of default models: a 0/1 success has sd at most 0.5
    noise_std = (0.5, 0.5)
    context_dim = CONTEXT_DIM
    feature_dim = FEATURE_DIM
    #: the names of the ``feature_dim`` model features (``FEATURE_NAMES``)
    feature_names = FEATURE_NAMES
    num_actions = NUM_ACTIONS
    action_names = ACTION_NAMES

    def __init__(self, omega: Sequence[float] = (1.0, 0.02, 0.02, 0.02), seed: int = 0,
                 params: VideoUploadParameters | None = None, alpha: float = 0.0,
                 device: torch.device | str | None = None):
        self.constraints = (Constraint.from_alpha("success", alpha),)
        self.alpha = float(alpha)
        with torch.device("cpu"):  # the user's numbers read on the CPU (then put on ``device`` below)
            omega_t = as_tensor(omega, "omega")
        if omega_t.shape != (NUM_ACTIONS,):
            raise ValueError(f"omega: expected 4 offsets (360p, 480p, 720p, 1080p), got shape {list(omega_t.shape)}")
        check_finite(omega_t, "omega")
        if bool((omega_t <= 0).any()):
            raise ValueError(f"omega: expected positive offsets (the reward must strictly increase with quality), got {omega_t.tolist()}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        # every tensor of the problem on ``device`` (default the CPU), float64; its own stream a generator
        # there (the CPU's numbers on the CPU, the device's own elsewhere: the same law)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        omega_t = omega_t.to(self.device)
        self.omega = omega_t
        self.reward_scale = omega_t.cumsum(0)  # [4] reward of a successful upload at each quality
        self.seed = seed
        self.params = params or VideoUploadParameters()
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._prepare()

    def _prepare(self) -> None:
        p = self.params
        f64, device = torch.float64, self.device
        self._country_probs = torch.tensor(p.country_probs, dtype=f64, device=device)
        self._country_probs = self._country_probs / self._country_probs.sum()
        if self._country_probs.numel() != NUM_COUNTRIES:
            raise ValueError(f"params.country_probs: expected {NUM_COUNTRIES} values")
        self._country_tier = torch.arange(NUM_COUNTRIES, device=device) // 4
        self._conn_probs = torch.tensor(p.connection_probs, dtype=f64, device=device)
        self._conn_probs = self._conn_probs / self._conn_probs.sum(-1, keepdim=True)
        self._tier_probs = torch.tensor(p.device_tier_probs, dtype=f64, device=device)
        self._tier_probs = self._tier_probs / self._tier_probs.sum(-1, keepdim=True)
        dev = torch.tensor(p.devices, dtype=torch.long, device=device)
        if dev.shape != (NUM_DEVICES, 2):
            raise ValueError(f"params.devices: expected {NUM_DEVICES} (tier, os) pairs")
        self._device_tier, self._device_os = dev[:, 0], dev[:, 1]
        # P(model | tier): uniform over the models of that tier
        member = (self._device_tier[None, :] == torch.arange(3, device=device)[:, None]).to(f64)
        self._model_given_tier = member / member.sum(-1, keepdim=True)
        self._source_probs = torch.tensor(p.source_probs, dtype=f64, device=device)
        self._source_probs = self._source_probs / self._source_probs.sum(-1, keepdim=True)
        self._vec = {name: torch.tensor(getattr(p, name), dtype=f64, device=device) for name in (
            "country_speed", "country_patience", "speed_median", "source_bitrate", "target_bitrate",
            "tau", "device_reliability", "transcode_survival")}
        self._baseline_rule = torch.tensor(p.baseline_by_connection, dtype=torch.long, device=device)
        if self._baseline_rule.shape != (4,) or bool(((self._baseline_rule < 0) | (self._baseline_rule > 3)).any()):
            raise ValueError(f"params.baseline_by_connection: expected 4 action indices in 0..3, got {p.baseline_by_connection}")

    # ------------------------------------------------------------------ the stream
    def draw(self, n: int, generator: torch.Generator | None = None) -> Uploads:
        """Draw ``n`` uploads (contexts, features, masks, baseline actions, CRN uniforms).

        Args:
            n: number of uploads (>= 1).
            generator: a ``torch.Generator``; ``None`` continues this problem's own seeded stream.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected a positive int, got {n!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        g = self._generator if generator is None else generator
        p, v, f64 = self.params, self._vec, torch.float64
        # drawn on the generator's device, put on the problem's (a copy only when they differ)
        device = self.device
        U = standard_uniform((7, n), g, dtype=f64, device=device)
        Z = standard_normal((5, n), g, dtype=f64, device=device)
        uniform = standard_uniform((n,), g, dtype=f64, device=device)

        country = _categorical(self._country_probs.expand(n, -1), U[0])
        ctier = self._country_tier[country]
        conn = _categorical(self._conn_probs[ctier], U[1])
        dtier_draw = _categorical(self._tier_probs[ctier], U[2])
        model = _categorical(self._model_given_tier[dtier_draw], U[3])
        dtier, os_ = self._device_tier[model], self._device_os[model]
        source = _categorical(self._source_probs[dtier], U[4])

        speed = v["speed_median"][conn] * v["country_speed"][ctier] * torch.exp(p.speed_sigma * Z[0])
        upload_bw = p.upload_ratio * speed * torch.exp(p.upload_sigma * Z[1])  # hidden
        duration = (p.duration_median * torch.exp(p.duration_sigma * Z[2])).clamp(p.duration_min, p.duration_max)
        src_bitrate = v["source_bitrate"][source] * torch.exp(p.source_bitrate_sigma * Z[3])
        file_mb = src_bitrate * duration / 8.0

        context = torch.zeros(n, CONTEXT_DIM, dtype=f64, device=device)
        rows = torch.arange(n, device=device)
        context[rows, model] = 1.0
        context[rows, 13 + os_] = 1.0
        context[rows, 16 + conn] = 1.0
        context[:, 20] = speed.log()
        context[rows, 21 + country] = 1.0
        context[:, 33] = file_mb.log()
        context[:, 34] = src_bitrate.log()
        context[rows, 35 + source] = 1.0

        actions = torch.arange(NUM_ACTIONS, device=device)
        valid = actions[None, :] <= source[:, None]
        # upload size (Mbit) at each quality: min(source bitrate, target) * duration; the duration
        # is observable as 8 * file size / source bitrate
        up_rate = torch.minimum(src_bitrate[:, None], v["target_bitrate"][None, :])
        size_mbit = up_rate * duration[:, None]
        features = torch.empty(n, NUM_ACTIONS, FEATURE_DIM, dtype=f64, device=device)
        features[:, :, :CONTEXT_DIM] = context[:, None, :]
        features[:, :, CONTEXT_DIM:CONTEXT_DIM + NUM_ACTIONS] = torch.eye(NUM_ACTIONS, dtype=f64, device=device)
        features[:, :, CONTEXT_DIM + 4] = size_mbit.log()
        features[:, :, CONTEXT_DIM + 5] = (size_mbit / speed[:, None]).log()

        prob = self._success_prob(size_mbit, upload_bw, conn, ctier, dtier, os_)
        prob = prob.masked_fill(~valid, 0.0)
        baseline = torch.minimum(self._baseline_rule[conn], source)
        groups = {"connection": conn, "source_resolution": source, "device_tier": dtier,
                  "country_tier": ctier, "os": os_}
        return Uploads(context, features, valid, baseline, prob, uniform, groups)

    def _success_prob(self, size_mbit, upload_bw, conn, ctier, dtier, os_) -> torch.Tensor:
        """``p(x, a) = rho(device, a) * exp(-(T_a / tau)^kappa)`` with ``T_a = size_a / bandwidth``."""
        p, v = self.params, self._vec
        t_upload = size_mbit / upload_bw[:, None]  # seconds
        tau = (v["tau"][conn] * v["country_patience"][ctier])[:, None]
        survive = torch.exp(-((t_upload / tau) ** p.kappa))
        rho = v["device_reliability"][dtier][:, None] * v["transcode_survival"][dtier]
        rho = rho * torch.where(os_ == 2, p.other_os_reliability, 1.0)[:, None]
        return rho * survive

    def success_prob_given_context(self, uploads: Uploads, nodes: int = 40) -> torch.Tensor:
        """``E[p(x, a) | x]``, ``[n, 4]``: the success probability averaged over what the context hides.

        Given the observed context only the upload bandwidth's noise ``eta ~ N(0, 1)`` is
        unknown (the device tier follows from the model, the duration from file size and
        bitrate), so this is a ``nodes``-point Gauss-Hermite average over ``eta``. It is the
        best any model of the features can do: the study's reference ("oracle") policies use it.
        """
        p, v, f64 = self.params, self._vec, torch.float64
        ctx = uploads.context
        speed, file_mb, bitrate = ctx[:, 20].exp(), ctx[:, 33].exp(), ctx[:, 34].exp()
        duration = 8.0 * file_mb / bitrate
        size = torch.minimum(bitrate[:, None], v["target_bitrate"][None, :]) * duration[:, None]
        g = uploads.groups
        x, w = np.polynomial.hermite_e.hermegauss(nodes)
        x, w = (torch.as_tensor(x, dtype=f64, device=ctx.device),
                torch.as_tensor(w, dtype=f64, device=ctx.device) / math.sqrt(2 * math.pi))
        bw = p.upload_ratio * speed[:, None] * torch.exp(p.upload_sigma * x)[None, :]  # [n, Q]
        tau = (v["tau"][g["connection"]] * v["country_patience"][g["country_tier"]])[:, None, None]
        survive = (torch.exp(-(((size[:, :, None] / bw[:, None, :]) / tau) ** p.kappa)) * w).sum(-1)
        dt = g["device_tier"]
        rho = v["device_reliability"][dt][:, None] * v["transcode_survival"][dt]
        rho = rho * torch.where(g["os"] == 2, p.other_os_reliability, 1.0)[:, None]
        return (rho * survive).masked_fill(~uploads.valid, 0.0)

    # ------------------------------------------------------------------ outcomes
    def check_actions(self, uploads: Uploads, actions) -> torch.Tensor:
        """Validate ``actions [n]`` (long, in 0..3, never above the source resolution)."""
        a = torch.as_tensor(actions, device=uploads.features.device)
        n = len(uploads)
        if a.shape != (n,):
            raise ValueError(f"actions: expected shape [{n}] (one per upload), got {list(a.shape)}")
        if a.dtype.is_floating_point or a.dtype == torch.bool:
            raise TypeError(f"actions: expected integer action indices 0..3, got dtype {a.dtype}")
        a = a.long()
        if bool(((a < 0) | (a >= NUM_ACTIONS)).any()):
            raise ValueError(f"actions: expected indices in 0..3 ({', '.join(ACTION_NAMES)}), got values {sorted(set(a.tolist()))}")
        bad = ~uploads.valid[torch.arange(n, device=a.device), a]
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            src = ACTION_NAMES[int(uploads.groups["source_resolution"][i])]
            raise ValueError(
                f"actions: {int(bad.sum())} actions are above the source resolution (e.g. upload {i}: "
                f"{ACTION_NAMES[int(a[i])]} for a {src} source); uploads can only keep or lower the resolution"
            )
        return a

    def outcomes(self, uploads: Uploads, actions) -> Outcomes:
        """Outcomes of playing ``actions [n]`` on ``uploads``: success is ``u < p(x, a)`` (CRN)."""
        a = self.check_actions(uploads, actions)
        rows = torch.arange(len(uploads), device=a.device)
        prob = uploads.success_prob[rows, a]
        success = uploads.uniform < prob
        reward = success.to(torch.float64) * self.reward_scale[a]
        quality = torch.tensor(RESOLUTIONS, device=a.device)[a]
        preserved = success & (a == 3) & (uploads.groups["source_resolution"] == 3)
        return Outcomes(a, success, reward, prob, quality, preserved)

    def expected_reward(self, uploads: Uploads) -> torch.Tensor:
        """``[n, 4]`` expected reward ``p(x, a) * sum_{a' <= a} omega_{a'}`` (0 where invalid)."""
        return uploads.success_prob * self.reward_scale

    def expected_all(self, uploads: Uploads) -> torch.Tensor:
        """``[n, 4, 2]`` mean outcomes of every action: expected reward and success probability."""
        return torch.stack([self.expected_reward(uploads), uploads.success_prob], -1)

    # ------------------------------------------------------------------ metrics
    def metrics(self, uploads: Uploads, outcomes: Outcomes) -> dict:
        """Reliability, ``q_1080p`` and quality shares, overall and per sub-population.

        ``q_1080p`` (the paper's "quality preserved at 1080p", section 5.3) is the fraction of
        uploads with a 1080p source that were uploaded successfully at 1080p; ``None`` for a
        group without 1080p sources. ``expected_reliability`` averages the true ``p(x, a)``.
        """
        out = {"overall": _group_metrics(uploads, outcomes, torch.ones(len(uploads), dtype=torch.bool,
                                                                     device=uploads.features.device))}
        for name, labels in _GROUP_LABELS.items():
            g = uploads.groups[name]
            out[f"by_{name}"] = {lab: _group_metrics(uploads, outcomes, g == i) for i, lab in enumerate(labels)}
        return out

    def __repr__(self) -> str:
        return f"VideoUpload(omega={self.omega.tolist()}, seed={self.seed})"


_GROUP_LABELS = {
    "connection": CONNECTIONS,
    "source_resolution": ACTION_NAMES,
    "device_tier": DEVICE_TIERS,
    "country_tier": COUNTRY_TIERS,
}


def _group_metrics(uploads: Uploads, outcomes: Outcomes, mask: torch.Tensor) -> dict:
    n = int(mask.sum())
    res = {"n": n}
    if n == 0:
        return res | {"reliability": None, "expected_reliability": None, "q_1080p": None,
                      **{f"share_{q}": None for q in ACTION_NAMES}}
    res["reliability"] = float(outcomes.success[mask].double().mean())
    res["expected_reliability"] = float(outcomes.success_prob[mask].mean())
    src1080 = mask & (uploads.groups["source_resolution"] == 3)
    res["n_1080p_sources"] = int(src1080.sum())
    res["q_1080p"] = float(outcomes.preserved_1080p[src1080].double().mean()) if bool(src1080.any()) else None
    for j, q in enumerate(ACTION_NAMES):
        res[f"share_{q}"] = float((outcomes.actions[mask] == j).double().mean())
    return res


def percent_change(policy: torch.Tensor, baseline: torch.Tensor) -> tuple[float, float]:
    """Percent change of a mean against the baseline's, with a delta-method standard error.

    ``policy`` and ``baseline`` are paired per-upload values ``[n]`` (common random numbers:
    the same uploads under both). With ``R = mean(policy) / mean(baseline)``, the change is
    ``100 (R - 1)`` and its standard error ``100 sd(policy_i - R baseline_i) / (sqrt(n) mean(baseline))``
    (the ratio-estimator delta method, which uses the pairing). ``(nan, nan)`` when the
    baseline mean is 0 or ``n < 2``.
    """
    x, y = policy.double(), baseline.double()
    n = x.numel()
    if n < 2 or float(y.mean()) == 0.0:
        return float("nan"), float("nan")
    ratio = x.mean() / y.mean()
    resid = x - ratio * y
    se = resid.std() / math.sqrt(n) / y.mean()
    return float(100 * (ratio - 1)), float(100 * se)


def video_upload(omega: Sequence[float] = (1.0, 0.02, 0.02, 0.02), seed: int = 0) -> VideoUpload:
    """Build the video-upload problem (keyword style, like the other problem builders)."""
    return VideoUpload(omega=omega, seed=seed)


# ---------------------------------------------------------------------- the A/B-testable problem
#: the paper's search space (section 5.3), as the fields of ``bayes_safe.tuning.Range``: omega_360p = 1
#: fixed; the open lower bounds (0, ...] become 1e-4 (omega must be positive: the reward must strictly
#: increase with quality)
VIDEO_UPLOAD_PARAMETERS = (
    {"name": "alpha", "low": 0.0, "high": 0.06},
    {"name": "omega_480", "low": 1e-4, "high": 0.05},
    {"name": "omega_720", "low": 1e-4, "high": 0.04},
    {"name": "omega_1080", "low": 1e-4, "high": 0.03},
)

_OMEGA_NAMES = ("omega_360", "omega_480", "omega_720", "omega_1080")
_WARM_CACHE: dict = {}


@dataclass
class VideoUploadProblem(ABProblem):
    """The paper's video-upload problem (section 5) on ``VideoUpload``.

    Parameters read: ``alpha`` (TS-ASC's tolerated relative drop of success probability) and
    the reward offsets ``omega_480``, ``omega_720``, ``omega_1080`` (``omega_360`` = 1 unless
    given); a parameter a study does not tune takes its value from ``defaults``.

    Arms: ``"ts-asc"`` (TS-ASC, Algorithm 1, reward view ``ScaledOutcome(model, cumsum(omega))``
    and constraint view ``SuccessProbability(model)`` of one ``ProbitGP``)
    and ``"ts"`` (vanilla Thompson sampling on the reward view; alpha is irrelevant to it).

    Warm start (as ``studies/video_upload.py``): before the A/B test, ``warmup`` uploads are
    logged under a uniformly random valid action and one ProbitGP is fitted on them; every arm
    starts from a copy. The log is the same for every trial of a study (``warmup_seed``): it is
    the study's historical exploration data, not part of any trial's randomness, and its
    fitted model is cached per process.

    Args:
        warmup: size of the exploration log.
        warmup_seed: seed of the log and of the warm-start fit.
        model: keyword arguments of ``ProbitGP``.
        defaults: values of parameters a study does not tune.
    """

    _paper_problem: ClassVar[bool] = True  # the report compares a study with the paper's Figure 3c
    warmup: int = 4_000
    warmup_seed: int = 0
    model: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=lambda: {"alpha": 0.01, "omega_360": 1.0, "omega_480": 0.02,
                                                    "omega_720": 0.02, "omega_1080": 0.02})

    name = "video-upload"
    policies = ("ts-asc", "ts")
    compare = ("ts",)
    parameters = VIDEO_UPLOAD_PARAMETERS
    objective = "q_1080p_change"
    outcome_constraints = ("reliability_change >= 0",)
    surface = ("alpha", "omega_1080")

    def __post_init__(self):
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 10:
            raise ValueError(f"warmup: expected an int >= 10 (size of the exploration log), got {self.warmup!r}")
        if not isinstance(self.model, dict):
            raise TypeError(f"model: expected a dict of ProbitGP keyword arguments, got {type(self.model).__name__}")
        unknown = set(self.defaults) - {"alpha", *_OMEGA_NAMES}
        if unknown:
            raise ValueError(f"defaults: unknown parameters {sorted(unknown)}; expected alpha, {', '.join(_OMEGA_NAMES)}")

    # -- metadata
    def metric_names(self) -> tuple[str, ...]:
        return ("reliability", "expected_reliability", "q_1080p", "delivered_quality",
                *[f"share_{q}" for q in ACTION_NAMES], *[f"reliability_{c}" for c in CONNECTIONS])

    def level_metric_names(self) -> tuple[str, ...]:
        return ("violation_rate",)

    def known_parameters(self) -> tuple[str, ...]:
        return ("alpha", *_OMEGA_NAMES)

    def check_parameter_values(self, parameters: Mapping) -> None:
        super().check_parameter_values(parameters)
        alpha = parameters.get("alpha")
        if alpha is not None and not 0 <= float(alpha) < 1:
            raise ValueError(f"parameters: 'alpha' expected a value in [0, 1), got {alpha!r}")
        for name in _OMEGA_NAMES:
            if name in parameters and not float(parameters[name]) > 0:
                raise ValueError(f"parameters: {name!r} expected a reward offset > 0, got {parameters[name]!r}")

    def check_parameters(self, ranges: Sequence) -> None:
        for r in ranges:
            if r.name not in ("alpha", *_OMEGA_NAMES):
                raise ValueError(f"parameter {r.name!r}: the video-upload problem reads only alpha and "
                                 f"{', '.join(_OMEGA_NAMES)}")
            if r.name == "alpha" and not (0 <= r.low and r.high < 1):
                raise ValueError(f"parameter 'alpha': bounds [{r.low}, {r.high}] must lie in [0, 1)")
            if r.name.startswith("omega") and r.low <= 0:
                raise ValueError(f"parameter {r.name!r}: reward offsets must be positive, got low={r.low} "
                                 "(the paper's (0, x] interval: use a small positive lower bound such as 1e-4)")
            if r.integer:
                raise ValueError(f"parameter {r.name!r}: expected a real parameter, not an integer one")

    def config(self) -> dict:
        return {"name": self.name, "warmup": self.warmup, "warmup_seed": self.warmup_seed, "model": dict(self.model),
                "defaults": dict(self.defaults)}

    def describe(self, ab_test) -> str:
        text = super().describe(ab_test) + f"; warm start from an exploration log of {self.warmup:,} uploads"
        return text + (f"; model options {self.model}" if self.model else "")

    # -- the problem
    def _value(self, parameters: Mapping, name: str) -> float:
        return float(parameters[name]) if name in parameters else float(self.defaults[name])

    def make_env(self, parameters: Mapping, seed: int) -> VideoUpload:
        omega = [self._value(parameters, n) for n in _OMEGA_NAMES]
        return VideoUpload(omega=omega, seed=int(seed))

    def _warm_model(self):
        """The ProbitGP fitted on the exploration log (cached per process)."""
        key = (self.warmup, self.warmup_seed, repr(sorted(self.model.items())))
        model = _WARM_CACHE.get(key)
        if model is None:
            from ..models import ProbitGP

            env = VideoUpload(seed=10_007 + self.warmup_seed)
            logged = env.draw(self.warmup)
            # (the probit GP is a CPU model: its warm start is made on the CPU)
            gen = torch.Generator(device="cpu").manual_seed(20_011 + self.warmup_seed)
            a0 = torch.rand(len(logged), 4, generator=gen, dtype=torch.float64, device="cpu").masked_fill(
                ~logged.valid, -1).argmax(-1)
            o0 = env.outcomes(logged, a0)
            model = ProbitGP(FEATURE_DIM, **{"seed": self.warmup_seed, **self.model, "refit_every": None})
            model.update(logged.features[torch.arange(len(logged), device="cpu"), a0], o0.success.double())
            model.fit()
            if len(_WARM_CACHE) >= 4:
                _WARM_CACHE.pop(next(iter(_WARM_CACHE)))
            _WARM_CACHE[key] = model
        return model

    def make_policy(self, kind: str, parameters: Mapping, env: VideoUpload, *, seed: int, refit_every: int):
        from ..models import ScaledOutcome, SuccessProbability
        from ..policies import TSASC, ThompsonSampling

        model = copy.deepcopy(self._warm_model())
        model.refit_every = int(refit_every)
        if kind == "ts-asc":
            return TSASC(ScaledOutcome(model, env.reward_scale), SuccessProbability(model),
                         alpha=self._value(parameters, "alpha"))
        if kind == "ts":
            return ThompsonSampling(ScaledOutcome(model, env.reward_scale))
        raise ValueError(f"policy: expected one of {list(self.policies)} for the video-upload problem, got {kind!r}")

    def feedback(self, env, units, outcomes):
        return outcomes.reward, outcomes.success.double()[:, None]

    def unit_metrics(self, env, units, outcomes) -> dict:
        success = outcomes.success.double()
        source = units.groups["source_resolution"]
        lines = torch.tensor(RESOLUTIONS, dtype=torch.float64, device=outcomes.actions.device)[outcomes.actions]
        out = {
            "reliability": (success, None),
            "expected_reliability": (outcomes.success_prob, None),
            "q_1080p": (outcomes.preserved_1080p.double(), source == 3),
            "delivered_quality": (success * lines, None),
        }
        for j, q in enumerate(ACTION_NAMES):
            out[f"share_{q}"] = ((outcomes.actions == j).double(), None)
        for i, c in enumerate(CONNECTIONS):
            out[f"reliability_{c}"] = (success, units.groups["connection"] == i)
        return out

    def level_metrics(self, env, units, outcomes, baseline_outcomes, parameters) -> dict:
        alpha = self._value(parameters, "alpha")
        return {"violation_rate": (outcomes.success_prob < (1 - alpha) * baseline_outcomes.success_prob).double()}
