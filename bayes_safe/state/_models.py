"""Codecs of the models: one encode / decode pair per saveable type.

Encoders read the object's attributes and write its configuration as JSON and its numbers as
tensors; decoders rebuild the object with its public constructor (which validates the
configuration) and then put the saved state in place, checking every tensor's dtype, shape and
finiteness first.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from .._validation import EXPLORATIONS
from ._format import Decoder, Encoder, StateError, dtype_from_name, dtype_name
from ._priors import decode_distribution, decode_prior, encode_distribution, encode_prior

_F64 = torch.float64
_LONG = torch.long

SAVEABLE_MODELS = ("BayesianLinear (conjugate, Normal-Inverse-Gamma, Gibbs, Langevin, NUTS, SVI, laplace), PerArmLinear, CTSPosterior, ProbitGP "
                   "and its views SuccessProbability / ScaledOutcome, RidgeRewardModel, LogisticRewardModel, and "
                   "torch.nn modules built from Sequential, Linear and standard activations")


def build(dec: Decoder, where: str, make):
    """Call a constructor; its validation errors become ``StateError`` naming the file."""
    try:
        return make()
    except StateError:
        raise
    except (ValueError, TypeError, RuntimeError, torch.linalg.LinAlgError) as exc:
        dec.fail(f"{where}: the saved configuration is not valid ({type(exc).__name__}: {exc})")


def _cat(parts, dim):
    return torch.cat(parts, dim) if parts else None


# ---------------------------------------------------------------------- BayesianLinear
def _enc_linear(m, enc: Encoder, what: str) -> dict:
    node = {
        "type": "BayesianLinear", "dim": int(m.dim), "batch_shape": list(m.batch_shape),
        "prior": encode_prior(m.prior, enc, f"{what}.prior"),
        "noise_std": m.noise_std,
        "noise_prior": None if m.noise_prior is None else encode_distribution(m.noise_prior, enc, f"{what}.noise_prior"),
        "conjugate": bool(m.conjugate), "count": int(m._count),
        "masked_count": enc.optional(m._masked_count, f"{what}.masked_count"),
    }
    if getattr(m, "adaptive", None) is not None:  # adaptive forgetting: the test's settings and statistics
        det = m._detector
        cfg = m.adaptive
        node.update(forgetting="adaptive", forgetting_rule=m.forgetting_rule,
                    adaptive={"threshold": cfg.threshold, "drift": cfg.drift,
                              # the 0/1 test's settings (issue 43; absent from states written before: defaults)
                              "false_alarm_rate": cfg.false_alarm_rate, "odds_ratio": cfg.odds_ratio,
                              "outcomes": cfg.outcomes, "warmup": cfg.warmup, "keep": cfg.keep,
                              "warmup_events": cfg.warmup_events, "ones": enc.tensor(det.ones, f"{what}.adaptive.ones"),
                              "upper": enc.tensor(det.upper, f"{what}.adaptive.upper"),
                              "lower": enc.tensor(det.lower, f"{what}.adaptive.lower"),
                              "alarms": enc.tensor(det.alarms, f"{what}.adaptive.alarms"),
                              "since": enc.tensor(det.since, f"{what}.adaptive.since")})
    elif getattr(m, "forgetting", None) is not None:  # (absent: no forgetting, as in states written before)
        node.update(forgetting=float(m.forgetting), forgetting_rule=m.forgetting_rule)
    if getattr(m, "feature_names", None) is not None:  # (absent: no names, as in states written before: x0, x1, ...)
        node["feature_names"] = list(m.feature_names)
    if getattr(m, "decay", None) is not None:  # a per-arm model's decay of unplayed arms (issue 43)
        node["decay"] = float(m.decay)
    if m.conjugate and getattr(m, "_base", None) is not None:  # the base prior forgetting returns to (issue 43)
        node.update(base_loc=enc.tensor(m._base[0], f"{what}.base_loc"),
                    base_precision=enc.tensor(m._base[1], f"{what}.base_precision"))
    if m.conjugate:
        node.update(prior_loc=enc.tensor(m._prior_loc, f"{what}.prior_loc"),
                    prior_precision=enc.tensor(m._prior_precision, f"{what}.prior_precision"),
                    precision=enc.tensor(m.precision, f"{what}.precision"), eta=enc.tensor(m.eta, f"{what}.eta"))
        if m.noise_prior is not None:
            node.update(a=enc.tensor(m._a, f"{what}.a"), b0=enc.tensor(m._b0, f"{what}.b0"), sq=enc.tensor(m._sq, f"{what}.sq"))
        return node
    e = m.engine
    if getattr(m, "engine_name", None) == "laplace":  # the online Laplace approximation: its summary, no rows
        node.update(engine="laplace", likelihood=m.likelihood, laplace={
            "options": {k: getattr(e, k) for k in _LAPLACE_OPTIONS},
            "counters": {"n": int(e.n), "since_refresh": int(e.since_refresh)},
            "tensors": {k: enc.tensor(v, f"{what}.laplace.{k}") for k, v in e.state_tensors().items()}})
        if e.base_H is not None:  # the base prior forgetting returns to, as its data summary (issue 43; absent:
            # the prior)
            node["laplace"]["base"] = {"H": enc.tensor(e.base_H, f"{what}.laplace.base.H"),
                                       "g": enc.tensor(e.base_g, f"{what}.laplace.base.g")}
        return node
    if getattr(m, "engine_name", None) in ("gibbs", "langevin"):
        node.update(engine=m.engine_name, likelihood=m.likelihood, chain=_enc_chain(e, enc, f"{what}.chain"))
        return node
    node.update(
        method=e.method, refit_every=m.refit_every,
        inference_options={"num_samples": e.num_samples, "warmup_steps": e.warmup_steps, "num_chains": e.num_chains,
                           "svi_steps": e.svi_steps, "svi_lr": e.svi_lr, "seed": e.seed,
                           "svi_particles": e.svi_particles, "svi_tol": e.svi_tol},
        X=enc.optional(_cat(m._X, -2), f"{what}.X"), y=enc.optional(_cat(m._y, -1), f"{what}.y"),
        since_fit=int(m._since_fit), draws=enc.tensor(m._draws, f"{what}.draws"),
        # the row weights adaptive restarts left, and whether one waits for its refit (issue 43)
        row_weight=enc.optional(m._row_weight, f"{what}.row_weight"), restart_pending=bool(m._restart_pending),
        engine={"fitted": bool(e.fitted), "fit_seconds": float(e.fit_seconds),
                "draws": enc.optional(e._draws, f"{what}.engine.draws"),
                "noise_draws": enc.optional(e._noise_draws, f"{what}.engine.noise_draws"),
                "svi_losses": enc.optional(e.svi_losses, f"{what}.engine.svi_losses"),
                "svi_converged": enc.optional(e.svi_converged, f"{what}.engine.svi_converged"),
                "svi_draws": {k: enc.tensor(v, f"{what}.svi_draws.{k}") for k, v in e._svi_draws.items()},
                "chains": {k: enc.tensor(v, f"{what}.chains.{k}") for k, v in e._chains.items()},
                "sample_stats": {k: enc.tensor(v, f"{what}.sample_stats.{k}") for k, v in e._sample_stats.items()}},
    )
    return node


# the numbers of a Gibbs or Langevin chain: the data it has seen and its current state
_CHAIN_COUNTERS = {"gibbs": ("n", "_n_at_draw"),
                   "langevin": ("n", "_n_at_draw", "_n_at_refresh", "_adapt_count", "_refresh_origin")}
_OPTIONAL_COUNTERS = {"refresh_origin"}  # absent from states saved before issue 43's restarts (then 0)
_LAPLACE_OPTIONS = ("refresh_every", "em_steps", "newton_steps", "tol")
_CHAIN_OPTIONS = {"gibbs": ("sweeps", "burn_in", "predict_sweeps", "pg_terms", "seed"),
                  "langevin": ("steps", "burn_in", "predict_steps", "seed")}


def _chain_tensors(e, kind: str) -> dict:
    """name -> tensor (or None) of a chain engine's state; the rows only up to ``n`` (0/1 likelihoods)."""
    out = {"xtx": e._xtx, "xty": e._xty, "yty": e._yty,
           "X": e._X[..., : e.n, :] if e.likelihood != "gaussian" else None,
           "y": e._y[..., : e.n] if e.likelihood != "gaussian" else None}
    if kind == "gibbs":
        st = e.state
        out.update(w=st.w, v=st.v, inv=st.inv, s2=st.s2, **{f"aux.{k}": v for k, v in st.aux.items()})
        if e._n_eff is not None:  # the weighted count of a forgetting or restarted chain (issues 30, 43)
            out["n_eff"] = e._n_eff
        if getattr(e, "row_mask", None) is not None:  # the row weights adaptive restarts left (issue 43)
            out["row_mask"] = e.row_mask
    else:
        out.update(theta=e.theta, log_step=e.log_step, factor=e.factor, accept_rate=e.accept_rate,
                   rejected_non_finite=e.rejected_non_finite)
        if e._n_eff is not None:  # the weighted count an adaptive restart left (issue 43)
            out["n_eff"] = e._n_eff
    return out


def _enc_chain(e, enc: Encoder, what: str) -> dict:
    kind = e.method
    return {
        "options": {k: int(getattr(e, k)) for k in _CHAIN_OPTIONS[kind]}
        | ({"compile": bool(e.compile)} if kind == "langevin" else {}),
        "counters": {k.lstrip("_"): int(getattr(e, k)) for k in _CHAIN_COUNTERS[kind]},
        "tensors": {k: enc.optional(v, f"{what}.{k}") for k, v in _chain_tensors(e, kind).items()},
    }


def _dec_chain(m, node: dict, dec: Decoder, where: str) -> None:
    """Put a saved chain state into the freshly built engine ``m.engine``, checking every tensor
    against the shape and dtype the engine holds (rows: ``[*b, n, d]`` / ``[*b, n]``)."""
    e = m.engine
    kind = e.method
    counters = dec.field(node, "counters", dict, where)
    names = {k.lstrip("_"): k for k in _CHAIN_COUNTERS[kind]}
    if not set(names) - _OPTIONAL_COUNTERS <= set(counters) <= set(names):
        dec.fail(f"{where}.counters: expected exactly {sorted(names)}, got {sorted(counters)}")
    for name, attr in names.items():
        if name in counters:
            setattr(e, attr, dec.int_field(counters, name, f"{where}.counters"))
    refs = dict(dec.field(node, "tensors", dict, where))
    template = _chain_tensors(e, kind)
    n, b, d = e.n, tuple(e.batch_shape), e.dim
    if kind == "gibbs" and "row_mask" in refs:  # the row weights adaptive restarts left (issue 43)
        mask = dec.tensor(refs.pop("row_mask"), f"{where}.tensors.row_mask", dtype=_F64, finite=True)
        if mask.dim() != len(b) + 1 or tuple(mask.shape[:-1]) != b or mask.shape[-1] > n or bool(
                ((mask < 0) | (mask > 1)).any()):
            dec.fail(f"{where}.tensors.row_mask: expected weights in [0, 1] of shape [*{list(b)}, m], m <= {n}")
        e.row_mask = mask.clone()
    if "n_eff" in refs and "n_eff" not in template:  # the weighted count an adaptive restart left (issue 43)
        if e.likelihood != "gaussian":
            dec.fail(f"{where}.tensors.n_eff: only a Gaussian likelihood keeps a weighted count")
        count = dec.tensor(refs.pop("n_eff"), f"{where}.tensors.n_eff", shape=b, dtype=_F64, finite=True)
        if bool(((count < 0) | (count > n)).any()):
            dec.fail(f"{where}.tensors.n_eff: expected weighted counts in [0, {n}]")
        e._n_eff = count.clone()
    if e.likelihood != "gaussian":
        template["X"] = torch.zeros((*b, n, d), dtype=_F64)
        template["y"] = torch.zeros((*b, n), dtype=_F64)
    if set(refs) != set(template):
        dec.fail(f"{where}.tensors: expected exactly {sorted(template)}, got {sorted(refs)}")
    if kind == "gibbs":  # the scales and the noise variance come and go with the prior and the sweeps
        optional = {"v": (*b, d), "inv": (*b, d), "s2": b}
        for name, shape in optional.items():
            template[name] = None if refs.get(name) is None else torch.zeros(shape, dtype=_F64)
    values = {}
    for name, like in template.items():
        if like is None:
            if refs[name] is not None:
                dec.fail(f"{where}.tensors.{name}: this model keeps no {name!r}, the file has one")
            values[name] = None
            continue
        finite = name not in ("log_step",)
        values[name] = dec.tensor(refs[name], f"{where}.tensors.{name}", shape=tuple(like.shape), dtype=like.dtype,
                                  finite=finite).clone()
    e._xtx, e._xty, e._yty = values["xtx"], values["xty"], values["yty"]
    if e.likelihood != "gaussian":
        e._X, e._y = values["X"], values["y"]
        if kind == "gibbs":
            e._sign = 2.0 * e._y - 1.0
            e._fixed = None
    if kind == "gibbs":
        st = e.state
        st.w, st.v, st.inv, st.s2 = values["w"], values["v"], values["inv"], values["s2"]
        st.aux = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("aux.")}
        e._scaled, e._fixed = None, None
        if "n_eff" in values:
            e._n_eff = values["n_eff"]
    else:
        e.theta, e.log_step, e.factor = values["theta"], values["log_step"], values["factor"]
        e.accept_rate, e.rejected_non_finite = values["accept_rate"], values["rejected_non_finite"]
        e._cache = e._stale_cache = None


def _dec_linear(node: dict, dec: Decoder, where: str):
    from ..models import BayesianLinear

    d = dec.int_field(node, "dim", where, minimum=1)
    b = dec.shape_field(node, "batch_shape", where)
    prior = decode_prior(node.get("prior"), dec, f"{where}.prior")
    noise_std = dec.float_field(node, "noise_std", where, allow_none=True)
    noise_spec = node.get("noise_prior")
    noise_prior = None if noise_spec is None else decode_distribution(noise_spec, dec, f"{where}.noise_prior")
    conjugate = dec.field(node, "conjugate", bool, where)
    count = dec.int_field(node, "count", where)
    masked = dec.tensor(node.get("masked_count"), f"{where}.masked_count", shape=b, dtype=_LONG, optional=True)
    if masked is not None and bool((masked < 0).any()):
        dec.fail(f"{where}.masked_count: expected counts >= 0")
    adaptive = None
    if node.get("forgetting") == "adaptive":  # adaptive forgetting (issue 30): its settings, statistics below
        from ..models.change_detection import AdaptiveForgetting

        adaptive = dec.field(node, "adaptive", dict, where)
        settings = {k: adaptive[k] for k in ("false_alarm_rate", "odds_ratio", "outcomes", "warmup", "keep",
                                             "warmup_events") if k in adaptive}
        forgetting = build(dec, f"{where}.adaptive", lambda: AdaptiveForgetting(adaptive.get("threshold"),
                                                                               adaptive.get("drift"), **settings))
    else:
        forgetting = dec.float_field(node, "forgetting", where, allow_none=True) if "forgetting" in node else None
    rule = node.get("forgetting_rule", "stabilized")
    names = node.get("feature_names")  # checked by the constructor (a bad list: StateError naming the file)
    if conjugate:
        m = build(dec, where, lambda: BayesianLinear(prior, noise_std, noise_prior, batch_shape=b, inference="conjugate", dim=d,
                                                     forgetting=forgetting, forgetting_rule=rule,
                                                     feature_names=names))

        def t(name, shape):
            return dec.tensor(node.get(name), f"{where}.{name}", shape=shape, dtype=_F64, finite=True).clone()

        m._prior_loc, m._prior_precision = t("prior_loc", (*b, d)), t("prior_precision", (*b, d, d))
        m.precision, m.eta = t("precision", (*b, d, d)), t("eta", (*b, d))
        m._prior_eta = (m._prior_precision @ m._prior_loc[..., None])[..., 0]  # what stabilised forgetting keeps
        if noise_prior is not None:
            m._a, m._b0, m._sq = t("a", b), t("b0", b), t("sq", b)
            m._set_sq0(m._prior_loc, m._prior_precision)
        m._factor, m._dirty = None, None
        if "base_loc" in node:
            m._set_base(t("base_loc", (*b, d)), t("base_precision", (*b, d, d)))
    elif "laplace" in node:  # the online Laplace approximation
        likelihood = dec.field(node, "likelihood", str, where)
        state = dec.field(node, "laplace", dict, where)
        opts = dec.field(state, "options", dict, f"{where}.laplace")
        if set(opts) != set(_LAPLACE_OPTIONS):
            dec.fail(f"{where}.laplace.options: expected exactly {sorted(_LAPLACE_OPTIONS)}, got {sorted(opts)}")
        m = build(dec, where, lambda: BayesianLinear(prior, noise_std, noise_prior, batch_shape=b, inference="laplace",
                                                     dim=d, likelihood=likelihood, inference_options=opts,
                                                     forgetting=forgetting, forgetting_rule=rule, feature_names=names))
        counters = dec.field(state, "counters", dict, f"{where}.laplace")
        if set(counters) != {"n", "since_refresh"}:
            dec.fail(f"{where}.laplace.counters: expected exactly ['n', 'since_refresh'], got {sorted(counters)}")
        refs = dec.field(state, "tensors", dict, f"{where}.laplace")
        template = m.engine.state_tensors()
        if set(refs) != set(template):
            dec.fail(f"{where}.laplace.tensors: expected exactly {sorted(template)}, got {sorted(refs)}")
        values = {k: dec.tensor(refs[k], f"{where}.laplace.tensors.{k}", shape=tuple(v.shape), dtype=_F64, finite=True)
                  for k, v in template.items()}
        m.engine.load_state_tensors(values, dec.int_field(counters, "n", f"{where}.laplace.counters"),
                                    dec.int_field(counters, "since_refresh", f"{where}.laplace.counters"))
        if "base" in state:
            base = dec.field(state, "base", dict, f"{where}.laplace")
            H = dec.tensor(base.get("H"), f"{where}.laplace.base.H", shape=(*b, d, d), dtype=_F64, finite=True)
            g = dec.tensor(base.get("g"), f"{where}.laplace.base.g", shape=(*b, d), dtype=_F64, finite=True)
            build(dec, f"{where}.laplace.base", lambda: m.engine.set_base_summary(H.clone(), g.clone()))
    elif "chain" in node:  # a Gibbs or Langevin chain (NUTS / SVI nodes have no "chain")
        engine = dec.field(node, "engine", str, where)
        if engine not in _CHAIN_OPTIONS:
            dec.fail(f"{where}: field 'engine' must be 'gibbs' or 'langevin', got {engine!r}")
        likelihood = dec.field(node, "likelihood", str, where)
        chain = dec.field(node, "chain", dict, where)
        opts = dec.field(chain, "options", dict, f"{where}.chain")
        optional = {"compile"} if engine == "langevin" else set()  # (absent from states saved before it existed)
        if not set(_CHAIN_OPTIONS[engine]) <= set(opts) <= set(_CHAIN_OPTIONS[engine]) | optional:
            dec.fail(f"{where}.chain.options: expected exactly {sorted(_CHAIN_OPTIONS[engine])} "
                     f"(and optionally {sorted(optional)}), got {sorted(opts)}")
        m = build(dec, where, lambda: BayesianLinear(prior, noise_std, noise_prior, batch_shape=b, inference=engine, dim=d,
                                                     likelihood=likelihood, inference_options=opts,
                                                     forgetting=forgetting, forgetting_rule=rule,
                                                     feature_names=names))
        _dec_chain(m, chain, dec, f"{where}.chain")
    else:
        method = dec.field(node, "method", str, where)
        if method not in ("nuts", "svi"):
            dec.fail(f"{where}: field 'method' must be 'nuts' or 'svi', got {method!r}")
        opts = dec.field(node, "inference_options", dict, where)
        keys = {"num_samples", "warmup_steps", "num_chains", "svi_steps", "svi_lr", "seed"}
        newer = {"svi_particles", "svi_tol"}  # absent from states saved before they existed
        if not keys <= set(opts) <= keys | newer or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in opts.values()):
            dec.fail(f"{where}: field 'inference_options' must hold numbers for {sorted(keys)} "
                     f"(and optionally {sorted(newer)})")
        refit = dec.int_field(node, "refit_every", where, minimum=1, allow_none=True)
        m = build(dec, where, lambda: BayesianLinear(prior, noise_std, noise_prior, batch_shape=b, inference=method, dim=d,
                                                     refit_every=refit, inference_options=opts,
                                                     forgetting=forgetting, forgetting_rule=rule,
                                                     feature_names=names))
        e = m.engine
        X = dec.tensor(node.get("X"), f"{where}.X", dtype=_F64, finite=True, optional=True)
        y = dec.tensor(node.get("y"), f"{where}.y", dtype=_F64, finite=True, optional=True)
        if (X is None) != (y is None):
            dec.fail(f"{where}: X and y must both be saved or both be absent")
        if X is not None:
            if X.dim() != len(b) + 2 or tuple(X.shape[: len(b)]) != b or X.shape[-1] != d or tuple(y.shape) != tuple(X.shape[:-1]):
                dec.fail(f"{where}: X {list(X.shape)} and y {list(y.shape)} must have shapes [*{list(b)}, n, {d}] and [*{list(b)}, n]")
            m._X, m._y = [X.clone()], [y.clone()]
        m._since_fit = dec.int_field(node, "since_fit", where)
        m._fitted_count = max((0 if X is None else X.shape[-2]) - m._since_fit, 0)
        rows = 0 if X is None else X.shape[-2]
        weight = dec.tensor(node.get("row_weight"), f"{where}.row_weight", dtype=_F64, finite=True, optional=True)
        if weight is not None and (weight.dim() != len(b) + 1 or tuple(weight.shape[:-1]) != b or weight.shape[-1] > rows
                                   or bool(((weight < 0) | (weight > 1)).any())):
            dec.fail(f"{where}.row_weight: expected weights in [0, 1] of shape [*{list(b)}, m], m <= {rows}")
        m._row_weight = None if weight is None else weight.clone()
        pending = node.get("restart_pending", False)  # (absent from states saved before issue 43's restarts)
        if not isinstance(pending, bool):
            dec.fail(f"{where}.restart_pending: expected true or false, got {pending!r}")
        m._restart_pending = pending
        if weight is not None and not pending and weight.shape[-1] == rows - m._since_fit:
            m._fitted_count = max(int(weight.sum(-1).min()), 1)  # as ``BayesianLinear._fit`` left it
        S = e.num_draws
        m._draws = dec.tensor(node.get("draws"), f"{where}.draws", shape=(S, *b, d), dtype=_F64, finite=True).clone()
        eng = dec.field(node, "engine", dict, where)
        e.fitted = dec.field(eng, "fitted", bool, where)
        e.fit_seconds = dec.float_field(eng, "fit_seconds", where)
        e._draws = dec.tensor(eng.get("draws"), f"{where}.engine.draws", shape=(S, *b, d), dtype=_F64, finite=True, optional=True)
        e._noise_draws = dec.tensor(eng.get("noise_draws"), f"{where}.engine.noise_draws", shape=(S, *b), dtype=_F64,
                                    finite=True, optional=True)
        e.svi_losses = dec.tensor(eng.get("svi_losses"), f"{where}.engine.svi_losses", dtype=_F64, optional=True)
        e.svi_converged = dec.tensor(eng.get("svi_converged"), f"{where}.engine.svi_converged", shape=b,
                                     dtype=torch.bool, optional=True)
        refs = eng.get("svi_draws") or {}  # absent from older states
        if not isinstance(refs, dict):
            dec.fail(f"{where}: field 'engine.svi_draws' must be a mapping of site names to tensors")
        e._svi_draws = {k: dec.tensor(v, f"{where}.svi_draws.{k}", dtype=_F64) for k, v in refs.items()}
        for name in ("chains", "sample_stats"):
            refs = dec.field(eng, name, dict, where)
            setattr(e, f"_{name}", {k: dec.tensor(v, f"{where}.{name}.{k}") for k, v in refs.items()})
    m._count = count
    m._masked_count = None if masked is None else masked.clone()
    if adaptive is not None:
        _dec_detector(m._detector, adaptive, dec, where, b)
    if "decay" in node:
        decay = dec.float_field(node, "decay", where)
        if not 0 < decay < 1:
            dec.fail(f"{where}.decay: expected a number in (0, 1), got {decay!r}")
        m.decay = decay
    return m


def _dec_detector(det, adaptive: dict, dec: Decoder, where: str, b: tuple) -> None:
    """The change test's statistics (issue 30; ``since``, issue 43: absent before, then taken as
    past the warm-up)."""
    for name in ("upper", "lower"):
        v = dec.tensor(adaptive.get(name), f"{where}.adaptive.{name}", shape=b, dtype=_F64, finite=True).clone()
        if bool((v < 0).any()):
            dec.fail(f"{where}.adaptive.{name}: expected values >= 0")
        setattr(det, name, v)
    for name in ("alarms", "since", "ones"):
        if name == "since" and name not in adaptive:
            det.since = torch.full(b, det.warmup, dtype=_LONG)
            continue
        if name == "ones" and name not in adaptive:  # (absent before issue 43's event warm-up: past it)
            det.since = det.since + 2 * det.warmup_events
            det.ones = torch.full(b, det.warmup_events, dtype=_LONG)
            continue
        v = dec.tensor(adaptive.get(name), f"{where}.adaptive.{name}", shape=b, dtype=_LONG).clone()
        if bool((v < 0).any()):
            dec.fail(f"{where}.adaptive.{name}: expected counts >= 0")
        setattr(det, name, v)


# ---------------------------------------------------------------------- PerArmLinear, CTSPosterior
def _enc_per_arm(m, enc: Encoder, what: str) -> dict:
    node = {"type": "PerArmLinear", "num_arms": int(m.num_arms), "batch_shape": list(m.batch_shape),
            "arms": _enc_linear(m.arms, enc, f"{what}.arms")}
    rule = m.__dict__.get("thompson_exploration")
    if rule is not None:  # the policies' default draw rule (calibrated_per_arm's, issue 44; absent: none)
        node["thompson_exploration"] = rule
    clock = getattr(m, "_clock", None)
    if clock is not None:  # the decay that waits / stops / recalls (issue 43; absent: none, as in states before)
        node["clock"] = {"decay": clock.decay, "idle_after": clock.idle_after, "max_sd": clock.max_sd,
                         "explore_rate": clock.explore_rate, "recall": clock.recall,
                         "idle": enc.tensor(clock.idle, f"{what}.clock.idle")}
        if clock.recall is not None:
            node["clock"].update(held=enc.tensor(clock.held, f"{what}.clock.held"),
                                 kept_precision=enc.tensor(clock.kept_precision, f"{what}.clock.kept_precision"),
                                 kept_eta=enc.tensor(clock.kept_eta, f"{what}.clock.kept_eta"),
                                 score=enc.tensor(clock.score, f"{what}.clock.score"))
    return node


def _dec_per_arm(node: dict, dec: Decoder, where: str):
    from ..models import PerArmLinear

    K = dec.int_field(node, "num_arms", where, minimum=1)
    b = dec.shape_field(node, "batch_shape", where)
    arms = _dec_linear(dec.field(node, "arms", dict, where), dec, f"{where}.arms")
    if tuple(arms.batch_shape) != (*b, K) or not arms.conjugate:
        dec.fail(f"{where}.arms: expected a conjugate model of batch shape {[*b, K]}, got {list(arms.batch_shape)}")
    rule = node.get("thompson_exploration")
    if rule is not None and rule not in EXPLORATIONS:
        dec.fail(f"{where}: field 'thompson_exploration' must be one of {list(EXPLORATIONS)}, got {rule!r}")
    clock = node.get("clock")
    if clock is None:
        m = build(dec, where, lambda: PerArmLinear(arms.prior, K, arms.noise_std, arms.noise_prior, batch_shape=b))
        m.arms = arms
        if rule is not None:
            m.thompson_exploration = rule
        return m
    if not isinstance(clock, dict):
        dec.fail(f"{where}: field 'clock' must be a mapping")
    options = {k: clock.get(k) for k in ("decay", "idle_after", "max_sd", "explore_rate", "recall")}
    m = build(dec, where, lambda: PerArmLinear(arms.prior, K, arms.noise_std, arms.noise_prior, batch_shape=b,
                                               **options))
    m.arms = arms
    if rule is not None:
        m.thompson_exploration = rule
    shape = (*b, K)
    c = m._clock
    idle = dec.tensor(clock.get("idle"), f"{where}.clock.idle", shape=shape, dtype=_LONG).clone()
    if bool((idle < 0).any()):
        dec.fail(f"{where}.clock.idle: expected counts >= 0")
    c.idle = idle
    if c.recall is not None:
        d = arms.dim
        c.held = dec.tensor(clock.get("held"), f"{where}.clock.held", shape=shape, dtype=torch.bool).clone()
        c.kept_precision = dec.tensor(clock.get("kept_precision"), f"{where}.clock.kept_precision", shape=(*shape, d, d),
                                      dtype=_F64, finite=True).clone()
        c.kept_eta = dec.tensor(clock.get("kept_eta"), f"{where}.clock.kept_eta", shape=(*shape, d), dtype=_F64,
                                finite=True).clone()
        c.score = dec.tensor(clock.get("score"), f"{where}.clock.score", shape=shape, dtype=_F64, finite=True).clone()
    return m


def _enc_cts(m, enc: Encoder, what: str) -> dict:
    return {"type": "CTSPosterior", "num_arms": int(m.num_arms), "dim": int(m.dim), "v": float(m.v),
            "batch_shape": list(m.batch_shape), "refresh_every": int(m.refresh_every),
            "since_refresh": int(m._since_refresh),
            "state": enc.tensor(m._state, f"{what}.state"), "stats": enc.tensor(m._stats, f"{what}.stats"),
            # (absent: no names, as in states written before)
            **({} if getattr(m, "feature_names", None) is None else {"feature_names": list(m.feature_names)})}


def _dec_cts(node: dict, dec: Decoder, where: str):
    from ..policies.bcts import CTSPosterior

    K = dec.int_field(node, "num_arms", where, minimum=1)
    d = dec.int_field(node, "dim", where, minimum=1)
    b = dec.shape_field(node, "batch_shape", where)
    v = dec.float_field(node, "v", where)
    refresh = dec.int_field(node, "refresh_every", where, minimum=1)
    names = node.get("feature_names")  # checked by the constructor (a bad list: StateError naming the file)
    m = build(dec, where, lambda: CTSPosterior(K, d, v, batch_shape=b, refresh_every=refresh, feature_names=names))
    n = m._state.shape[0]
    state = dec.tensor(node.get("state"), f"{where}.state", shape=(n, K, d + 1, d), dtype=_F64, finite=True)
    stats = dec.tensor(node.get("stats"), f"{where}.stats", shape=(n, K, d + 2, d + 2), dtype=_F64, finite=True)
    m._init(state.clone(), stats.clone())
    m._since_refresh = dec.int_field(node, "since_refresh", where)
    return m


# ---------------------------------------------------------------------- ProbitGP and its views
_PROBIT_CONFIG = ("input_dim", "hidden", "activation", "ard", "num_inducing", "refit_every", "nn_epochs", "nn_min_steps",
                  "nn_batch_size", "nn_lr", "nn_weight_decay", "gp_epochs", "gp_batch_size", "ngd_lr", "hyper_lr",
                  "polish_steps", "polish_tol", "jitter", "seed", "nn_holdout", "nn_patience")
#: fields added after files were first written: a file without them loads with these values
_PROBIT_OPTIONAL = {"nn_holdout": 0.1, "nn_patience": 2}


def _state_dict(module, enc: Encoder, what: str) -> dict:
    return {k: enc.tensor(v, f"{what}.{k}") for k, v in module.state_dict().items()}


def _load_state_dict(module, refs, dec: Decoder, where: str) -> None:
    if not isinstance(refs, dict):
        dec.fail(f"{where}: expected a mapping of parameter names to tensors")
    expected = module.state_dict()
    if set(refs) != set(expected):
        dec.fail(f"{where}: parameters {sorted(refs)[:8]} differ from the expected {sorted(expected)[:8]}")
    params = {k for k, _ in module.named_parameters()}  # buffers may hold inf (e.g. a constraint's upper bound)
    values = {k: dec.tensor(refs[k], f"{where}.{k}", shape=tuple(expected[k].shape), dtype=expected[k].dtype,
                            finite=k in params)
              for k in expected}
    build(dec, where, lambda: module.load_state_dict(values, strict=True))


def _enc_probit(m, enc: Encoder, what: str) -> dict:
    from ..models.probit_gp import _ACTIVATIONS

    if enc.max_observations is not None:
        m = m.compact(enc.max_observations)
    activation = next(name for name, cls in _ACTIVATIONS.items() if isinstance(m.network.body[1], cls))
    X, y = m.observations()
    config = {k: getattr(m, k) for k in _PROBIT_CONFIG if k not in ("activation", "ard", "hidden")}
    config.update(hidden=list(m.hidden), activation=activation, ard=bool(m._ard))
    from ._priors import encode_gp_prior

    gp = m.gp
    return {
        "type": "ProbitGP", "config": config,
        "variance_prior": encode_gp_prior(m._variance_prior, enc, f"{what}.variance_prior"),
        "network": _state_dict(m.network, enc, f"{what}.network"),
        "inducing_points": enc.tensor(gp.variational_strategy.inducing_points, f"{what}.inducing_points"),
        "gp": _state_dict(gp, enc, f"{what}.gp"), "gp_training": bool(gp.training),
        "likelihood": _state_dict(m.likelihood, enc, f"{what}.likelihood"),
        "input_loc": enc.tensor(m._input_loc, f"{what}.input_loc"),
        "input_scale": enc.tensor(m._input_scale, f"{what}.input_scale"),
        "weight_mean": enc.tensor(m.weight_mean, f"{what}.weight_mean"),
        "weight_covariance": enc.tensor(m.weight_covariance, f"{what}.weight_covariance"),
        "X": enc.tensor(X, f"{what}.X"), "y": enc.tensor(y, f"{what}.y"),
        "num_observations": int(m.num_observations), "since_fit": int(m._since_fit), "num_fits": int(m.num_fits),
        "fit_info": m.fit_info, "generator": enc.tensor(m._generator.get_state(), f"{what}.generator"),
    }


def _dec_probit(node: dict, dec: Decoder, where: str):
    from ..models.probit_gp import ProbitGP
    from ._priors import decode_gp_prior

    cfg = dec.field(node, "config", dict, where)
    if isinstance(cfg, dict):
        cfg = {**_PROBIT_OPTIONAL, **cfg}
    if set(cfg) != set(_PROBIT_CONFIG):
        dec.fail(f"{where}: field 'config' must hold exactly {list(_PROBIT_CONFIG)}")
    kwargs = {k: cfg[k] for k in _PROBIT_CONFIG if k != "input_dim"}
    kwargs["variance_prior"] = decode_gp_prior(node.get("variance_prior"), dec, f"{where}.variance_prior")
    m = build(dec, where, lambda: ProbitGP(cfg["input_dim"], **kwargs))
    D, p = m.input_dim, m.feature_dim
    _load_state_dict(m.network, node.get("network"), dec, f"{where}.network")
    m.network.eval()
    inducing = dec.tensor(node.get("inducing_points"), f"{where}.inducing_points", dtype=_F64, finite=True)
    if inducing.dim() != 2 or inducing.shape[1] != p:
        dec.fail(f"{where}.inducing_points: expected shape [M, {p}], got {list(inducing.shape)}")
    gp = build(dec, where, lambda: m._build_gp(inducing.clone()))
    _load_state_dict(gp, node.get("gp"), dec, f"{where}.gp")
    gp.train(dec.field(node, "gp_training", bool, where))
    m.gp = gp
    _load_state_dict(m.likelihood, node.get("likelihood"), dec, f"{where}.likelihood")

    def t(name, shape, dtype=_F64):
        return dec.tensor(node.get(name), f"{where}.{name}", shape=shape, dtype=dtype, finite=True).clone()

    m._input_loc, m._input_scale = t("input_loc", (D,), torch.float32), t("input_scale", (D,), torch.float32)
    m.weight_mean, m.weight_covariance = t("weight_mean", (p,)), t("weight_covariance", (p, p))
    from ..models._gaussian import cholesky as _cholesky

    # recomputed as the model computes it: same numbers and the same memory layout (LAPACK's
    # column-major factor), so predictions and draws match the original bit for bit
    m._weight_factor = build(dec, f"{where}.weight_covariance", lambda: _cholesky(m.weight_covariance))
    X = dec.tensor(node.get("X"), f"{where}.X", dtype=_F64, finite=True)
    y = dec.tensor(node.get("y"), f"{where}.y", dtype=_F64, finite=True)
    if X.dim() != 2 or X.shape[1] != D or tuple(y.shape) != (X.shape[0],):
        dec.fail(f"{where}: X {list(X.shape)} and y {list(y.shape)} must have shapes [n, {D}] and [n]")
    if bool(((y != 0) & (y != 1)).any()):
        dec.fail(f"{where}.y: expected binary outcomes 0/1")
    m._X, m._y = ([X.clone()], [y.clone()]) if X.shape[0] else ([], [])
    m.num_observations = dec.int_field(node, "num_observations", where)
    m._since_fit = dec.int_field(node, "since_fit", where)
    m.num_fits = dec.int_field(node, "num_fits", where)
    m.fit_info = dec.field(node, "fit_info", dict, where)
    state = dec.tensor(node.get("generator"), f"{where}.generator", dtype=torch.uint8)
    build(dec, f"{where}.generator", lambda: m._generator.set_state(state.clone()))
    return m


def _enc_view(m, enc: Encoder, what: str) -> dict:
    from ..models.probit_gp import ScaledOutcome

    node = {"type": type(m).__name__, "model": encode_model(m.model, enc, f"{what}.model")}
    if isinstance(m, ScaledOutcome):
        node["scale"] = enc.tensor(m.scale, f"{what}.scale")
    return node


def _dec_view(node: dict, dec: Decoder, where: str):
    from ..models.probit_gp import ProbitGP, ScaledOutcome, SuccessProbability

    model = decode_model(dec.field(node, "model", dict, where), dec, f"{where}.model")
    if not isinstance(model, ProbitGP):
        dec.fail(f"{where}.model: expected a ProbitGP, got {type(model).__name__}")
    if node["type"] == "ScaledOutcome":
        scale = dec.tensor(node.get("scale"), f"{where}.scale", dtype=_F64, finite=True)
        return build(dec, where, lambda: ScaledOutcome(model, scale.clone()))
    return SuccessProbability(model)


# ---------------------------------------------------------------------- RidgeRewardModel
def _enc_ridge(m, enc: Encoder, what: str) -> dict:
    return {"type": "RidgeRewardModel", "weights": enc.tensor(m.weights, f"{what}.weights"),
            "intercepts": enc.tensor(m.intercepts, f"{what}.intercepts"), "low": m.low, "high": m.high}


def _dec_ridge(node: dict, dec: Decoder, where: str):
    from ..offline.estimators import RidgeRewardModel

    w = dec.tensor(node.get("weights"), f"{where}.weights", dtype=_F64, finite=True)
    if w.dim() != 2:
        dec.fail(f"{where}.weights: expected shape [A, d], got {list(w.shape)}")
    c = dec.tensor(node.get("intercepts"), f"{where}.intercepts", shape=(w.shape[0],), dtype=_F64, finite=True)
    return RidgeRewardModel(w.clone(), c.clone(), dec.float_field(node, "low", where), dec.float_field(node, "high", where))


# ---------------------------------------------------------------------- LogisticRewardModel
def _enc_logistic(m, enc: Encoder, what: str) -> dict:
    return {"type": "LogisticRewardModel", "weights": enc.tensor(m.weights, f"{what}.weights"),
            "intercepts": enc.tensor(m.intercepts, f"{what}.intercepts")}


def _dec_logistic(node: dict, dec: Decoder, where: str):
    from ..offline.estimators import LogisticRewardModel

    w = dec.tensor(node.get("weights"), f"{where}.weights", dtype=_F64, finite=True)
    if w.dim() != 2:
        dec.fail(f"{where}.weights: expected shape [A, d], got {list(w.shape)}")
    c = dec.tensor(node.get("intercepts"), f"{where}.intercepts", shape=(w.shape[0],), dtype=_F64, finite=True)
    return LogisticRewardModel(w.clone(), c.clone())


# ---------------------------------------------------------------------- torch.nn modules
_PLAIN = {"ReLU": nn.ReLU, "Tanh": nn.Tanh, "Sigmoid": nn.Sigmoid, "Identity": nn.Identity, "GELU": nn.GELU,
          "SiLU": nn.SiLU, "Softplus": nn.Softplus}


def _module_spec(m, what: str) -> dict:
    if type(m) is nn.Sequential:
        return {"module": "Sequential", "layers": [_module_spec(c, f"{what}[{i}]") for i, c in enumerate(m)]}
    if type(m) is nn.Linear:
        return {"module": "Linear", "in_features": m.in_features, "out_features": m.out_features, "bias": m.bias is not None}
    if type(m) is nn.ELU:
        return {"module": "ELU", "alpha": float(m.alpha)}
    if type(m) in (nn.Softmax, nn.LogSoftmax):
        return {"module": type(m).__name__, "dim": m.dim}
    if type(m) is nn.Dropout:
        return {"module": "Dropout", "p": float(m.p)}
    for name, cls in _PLAIN.items():
        if type(m) is cls:
            return {"module": name}
    mod = sys.modules.get("bayes_safe.offline.policy")
    if mod is not None and type(m) is mod.Softmax:
        return {"module": "bayes_safe.Softmax"}
    raise TypeError(f"{what}: cannot save a torch module of type {type(m).__name__}; saveable modules are built from "
                    f"Sequential, Linear, ELU, Softmax, LogSoftmax, Dropout, {', '.join(_PLAIN)} and "
                    "bayes_safe.offline.policy.Softmax")


def _module_from_spec(spec, dec: Decoder, where: str):
    kind = spec.get("module") if isinstance(spec, dict) else None
    if kind == "Sequential":
        layers = dec.field(spec, "layers", list, where)
        return nn.Sequential(*[_module_from_spec(s, dec, f"{where}[{i}]") for i, s in enumerate(layers)])
    if kind == "Linear":
        return build(dec, where, lambda: nn.Linear(dec.int_field(spec, "in_features", where, 1),
                                                   dec.int_field(spec, "out_features", where, 1),
                                                   bias=dec.field(spec, "bias", bool, where)))
    if kind == "ELU":
        return nn.ELU(alpha=dec.float_field(spec, "alpha", where))
    if kind in ("Softmax", "LogSoftmax"):
        return getattr(nn, kind)(dim=dec.field(spec, "dim", (int, type(None)), where))
    if kind == "Dropout":
        return build(dec, where, lambda: nn.Dropout(p=dec.float_field(spec, "p", where)))
    if kind in _PLAIN:
        return _PLAIN[kind]()
    if kind == "bayes_safe.Softmax":
        from ..offline.policy import Softmax

        return Softmax()
    dec.fail(f"{where}: unknown module {kind!r}")


def _enc_module(m, enc: Encoder, what: str) -> dict:
    params = list(m.state_dict().values())
    dtypes = {t.dtype for t in params}
    if len(dtypes) > 1:
        raise TypeError(f"{what}: cannot save a torch module whose tensors have several dtypes {sorted(map(str, dtypes))}")
    return {"type": "torch.nn.Module", "spec": _module_spec(m, what), "training": bool(m.training),
            "dtype": dtype_name(params[0].dtype) if params else None, "state": _state_dict(m, enc, f"{what}.state")}


def _dec_module(node: dict, dec: Decoder, where: str):
    m = _module_from_spec(node.get("spec"), dec, f"{where}.spec")
    if node.get("dtype") is not None:
        m = m.to(dtype_from_name(node["dtype"], f"{dec.path}: {where}.dtype"))
    _load_state_dict(m, node.get("state"), dec, f"{where}.state")
    m.train(dec.field(node, "training", bool, where))
    return m


# ---------------------------------------------------------------------- dispatch
def _encoder_for(model):
    from ..models import BayesianLinear, PerArmLinear

    if type(model) is BayesianLinear:
        return _enc_linear
    if type(model) is PerArmLinear:
        return _enc_per_arm
    bcts = sys.modules.get("bayes_safe.policies.bcts")
    if bcts is not None and type(model) is bcts.CTSPosterior:
        return _enc_cts
    probit = sys.modules.get("bayes_safe.models.probit_gp")
    if probit is not None:
        if type(model) is probit.ProbitGP:
            return _enc_probit
        if type(model) in (probit.SuccessProbability, probit.ScaledOutcome):
            return _enc_view
    estimators = sys.modules.get("bayes_safe.offline.estimators")
    if estimators is not None and type(model) is estimators.RidgeRewardModel:
        return _enc_ridge
    if estimators is not None and type(model) is estimators.LogisticRewardModel:
        return _enc_logistic
    if isinstance(model, nn.Module):
        return _enc_module
    return None


_DECODERS = {
    "BayesianLinear": _dec_linear, "PerArmLinear": _dec_per_arm, "CTSPosterior": _dec_cts, "ProbitGP": _dec_probit,
    "SuccessProbability": _dec_view, "ScaledOutcome": _dec_view, "RidgeRewardModel": _dec_ridge,
    "LogisticRewardModel": _dec_logistic,
    "torch.nn.Module": _dec_module,
}


def can_encode_model(model) -> bool:
    return _encoder_for(model) is not None


def encode_model(model, enc: Encoder, what: str) -> dict:
    """The node of a model (shared objects written once)."""
    encoder = _encoder_for(model)
    if encoder is None:
        raise TypeError(f"{what}: cannot save a model of type {type(model).__name__}; saveable: {SAVEABLE_MODELS}")
    return enc.shared(model, lambda: encoder(model, enc, what))


def decode_model(node, dec: Decoder, where: str):
    if isinstance(node, dict) and "saved_as" in node:
        if dec.resolve is None:
            dec.fail(f"{where}: refers to a model saved in another file ({node['saved_as']!r}); load it with "
                     "bayes_safe.diagnostics.load_policy")
        return dec.resolve(node["saved_as"], where)

    def decode(n):
        kind = n.get("type") if isinstance(n, dict) else None
        if kind not in _DECODERS:
            dec.fail(f"{where}: unknown model type {kind!r}; expected one of {sorted(_DECODERS)}")
        return _DECODERS[kind](n, dec, where)

    return dec.shared(node, decode)
