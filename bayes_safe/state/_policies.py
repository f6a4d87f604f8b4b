"""Codecs of the policies: configuration (alpha, delta, bounds, mode, ...) and learning state.

A policy node holds its type, its configuration and running sums, and one node per model
role (``policy.models()``): either the model itself (``save_state``) or ``{"saved_as": name}``
when the models live in their own files (``bayes_safe.diagnostics.save_models``). Policies are
rebuilt by their public constructors, so a tampered configuration fails their validation.
A step in progress (``select`` called, ``update`` not yet) is not saved: save between steps.
"""

from __future__ import annotations

import sys

import torch

from .._validation import EXPLORATIONS
from ._format import Decoder, Encoder
from ._models import build, decode_model
from ._priors import callable_path, import_callable

_F64 = torch.float64
_LONG = torch.long

SAVEABLE_POLICIES = ("ThompsonSampling", "Greedy", "Random", "LinUCB", "LUCB", "CLUCB", "CLUCB2ASC", "TSASC", "BCTS",
                     "ConstraintMask")


def _policy_types() -> dict:
    from .. import policies as P

    return {name: getattr(P, name) for name in SAVEABLE_POLICIES}


def policy_type_name(policy) -> str | None:
    """The saveable type name of ``policy`` (exact type: a subclass may behave differently), else None."""
    if "bayes_safe.policies" not in sys.modules:
        return None
    for name, cls in _policy_types().items():
        if type(policy) is cls:
            return name
    return None


def _bound(conf) -> torch.Tensor:
    return conf.weight_bound


def encode_policy(policy, enc: Encoder, what: str, model_node) -> dict:
    """The node of a policy; ``model_node(role, model)`` gives the node of each model."""
    name = policy_type_name(policy)
    if name is None:
        raise TypeError(f"{what}: cannot save a policy of type {type(policy).__name__}; saveable: {', '.join(SAVEABLE_POLICIES)}")
    node: dict = {"type": name, "models": {role: model_node(role, m) for role, m in policy.models().items()}}
    t = enc.tensor
    if name == "ThompsonSampling":
        node["exploration"] = policy.exploration
    if name in ("LinUCB", "LUCB", "CLUCB"):
        conf = policy.confidence
        node.update(delta=float(conf.delta), weight_bound=t(_bound(conf), f"{what}.weight_bound"),
                    radius_scale=float(getattr(conf, "radius_scale", 1.0)))
    if name == "CLUCB":
        if policy._baseline_fixed is not None:
            node["baseline_reward"] = t(policy._baseline_fixed, f"{what}.baseline_reward")
        else:
            node["baseline_reward"] = {"callable": callable_path(policy._baseline_fn, f"{what}.baseline_reward")}
        node.update(alpha=float(policy.alpha), state={
            k: t(getattr(policy, k), f"{what}.{k}") for k in
            ("z", "baseline_reward_played", "baseline_reward_total", "num_optimistic", "num_conservative")})
    elif name == "CLUCB2ASC":
        conf = policy.reward_confidence
        node.update(alpha=policy.alpha.tolist(), delta=float(policy.delta), mode=policy.mode,
                    weight_bound=t(_bound(conf), f"{what}.weight_bound"),
                    constraint_weight_bounds=[t(_bound(c), f"{what}.constraint_weight_bounds{j}")
                                              for j, c in enumerate(policy.constraint_confidences)],
                    baseline_lower_bound=list(policy.baseline_lower_bound),
                    radius_scale=float(getattr(conf, "radius_scale", 1.0)),
                    num_constraints=policy.num_constraints,
                    state={k: t(getattr(policy, k), f"{what}.{k}") for k in ("z", "v", "w", "num_conservative")})
    elif name == "TSASC":
        declared = getattr(policy, "constraints", None)
        if declared is not None:  # constraint declarations (direction, form, confidence), not alpha
            node.update(constraints=[c.to_dict() for c in declared], num_constraints=policy.num_constraints)
        else:
            node.update(alpha=policy.alpha.tolist(), num_constraints=policy.num_constraints)
        names = getattr(policy, "metric_names", None)
        if names is not None:
            node["metric_names"] = list(names)
        node.update(fallback=policy.fallback, confidence_draws=int(policy.confidence_draws))
        node["chance_refresh"] = getattr(policy, "chance_refresh", None)
        if getattr(policy, "pending", "ignore") != "ignore":  # issue 45's option (files without it: "ignore")
            node.update(pending=policy.pending, pending_z=float(policy.pending_z))
        # the cached banks of chance draws (chance_refresh): a loaded copy makes the same decisions
        node["chance_bank"] = [{"model": int(m), "rows": int(rows), "weights": t(w, f"{what}.chance_bank{m}")}
                               for m, (_, w, rows) in sorted(getattr(policy, "_bank", {}).items())]
    elif name == "BCTS":
        node.update(sigma_online=t(policy.sigma_online, f"{what}.sigma_online"),
                    random_teaching=t(policy.random_teaching, f"{what}.random_teaching"),
                    num_teaching_examples=int(policy.num_teaching_examples), taught=bool(policy._taught))
    return node


def decode_policy(node, dec: Decoder, where: str):
    types = _policy_types()
    name = node.get("type") if isinstance(node, dict) else None
    if name not in types:
        dec.fail(f"{where}: unknown policy type {name!r}; expected one of {list(SAVEABLE_POLICIES)}")
    refs = dec.field(node, "models", dict, where)
    models = {role: decode_model(ref, dec, f"{where}.models.{role}") for role, ref in refs.items()}

    def need(*roles):
        if set(models) != set(roles):
            dec.fail(f"{where}: a {name} has the models {list(roles)}, the file names {sorted(models)}")
        return [models[r] for r in roles]

    def constraints():
        C = dec.int_field(node, "num_constraints", where, minimum=1)
        return need("reward", *[f"constraint{j}" for j in range(C)])

    def t(key, **kw):
        return dec.tensor(node.get(key), f"{where}.{key}", **kw)

    cls = types[name]
    if name == "Random":
        need()
        return cls()
    if name == "ThompsonSampling":  # its draw rule (issue 44; absent in files before it: the model's default)
        rule = node.get("exploration")
        if rule is not None and rule not in EXPLORATIONS:
            dec.fail(f"{where}: field 'exploration' must be one of {list(EXPLORATIONS)}, got {rule!r}")
        model = need("reward")[0]
        return build(dec, where, lambda: cls(model, exploration=rule))
    if name == "Greedy":
        return cls(*need("reward"))
    if name == "ConstraintMask":
        return cls(reward_model=need("reward")[0])
    if name in ("LinUCB", "LUCB", "CLUCB"):
        (model,) = need("reward")
        delta = dec.float_field(node, "delta", where)
        bound = t("weight_bound", dtype=_F64, finite=True).clone()
        scale = dec.float_field(node, "radius_scale", where)
        if name == "LinUCB":
            if scale != 1.0:
                dec.fail(f"{where}: a LinUCB has radius_scale 1")
            return build(dec, where, lambda: cls(model, delta=delta, weight_bound=bound))
        if name == "LUCB":
            return build(dec, where, lambda: cls(model, delta=delta, weight_bound=bound, radius_scale=scale))
        spec = node.get("baseline_reward")
        if isinstance(spec, dict) and "callable" in spec:
            baseline = import_callable(spec["callable"], dec, f"{where}.baseline_reward")
        else:
            baseline = t("baseline_reward", dtype=_F64, finite=True).clone()
        alpha = dec.float_field(node, "alpha", where)
        policy = build(dec, where, lambda: cls(model, baseline, alpha=alpha, delta=delta, weight_bound=bound,
                                               radius_scale=scale))
        _restore(policy, node, dec, where, {"z": (policy.replications, policy.dim), "baseline_reward_played": (policy.replications,),
                                            "baseline_reward_total": (policy.replications,),
                                            "num_optimistic": (policy.replications,), "num_conservative": (policy.replications,)})
        return policy
    if name == "CLUCB2ASC":
        reward, *cons = constraints()
        alpha = _alphas(node, len(cons), dec, where)
        bounds = dec.field(node, "constraint_weight_bounds", list, where)
        if len(bounds) != len(cons):
            dec.fail(f"{where}: expected {len(cons)} constraint_weight_bounds")
        cbounds = [dec.tensor(b, f"{where}.constraint_weight_bounds[{j}]", dtype=_F64, finite=True).clone()
                   for j, b in enumerate(bounds)]
        lows = dec.field(node, "baseline_lower_bound", list, where)
        policy = build(dec, where, lambda: cls(
            reward, cons, alpha=alpha, delta=dec.float_field(node, "delta", where),
            mode=dec.field(node, "mode", str, where), weight_bound=t("weight_bound", dtype=_F64, finite=True).clone(),
            constraint_weight_bounds=cbounds, baseline_lower_bound=lows,
            radius_scale=dec.float_field(node, "radius_scale", where)))
        R, d = policy.replications, policy.dim
        _restore(policy, node, dec, where, {"z": (R, d), "v": (R, d), "w": (R, d), "num_conservative": (R,)})
        return policy
    if name == "TSASC":
        reward, *cons = constraints()
        # files written before issue 26 have no metric_names, fallback or confidence_draws: the defaults
        names = node.get("metric_names")
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            dec.fail(f"{where}: field 'metric_names' must be a list of names, got {names!r}")
        options = {"metric_names": names,
                   "fallback": dec.field(node, "fallback", str, where) if "fallback" in node else "safest",
                   "confidence_draws": dec.int_field(node, "confidence_draws", where, minimum=2)
                   if "confidence_draws" in node else 64}
        if "chance_refresh" in node:  # files written before issue 42 have none: the default
            refresh = node["chance_refresh"]
            if refresh is not None and (isinstance(refresh, bool) or not isinstance(refresh, int) or refresh < 1):
                dec.fail(f"{where}: field 'chance_refresh' must be null or an int >= 1, got {refresh!r}")
            options["chance_refresh"] = refresh
        if "pending" in node:  # TS-ASC's margin for pending outcomes (issue 45); the held rows are not state:
            # a Decider holds again what its models have not learned when it loads
            options["pending"] = dec.field(node, "pending", str, where)
            options["pending_z"] = dec.float_field(node, "pending_z", where)
        if "constraints" in node:
            declared = _declarations(node, None if names is not None else len(cons), dec, where)
            return _restore_bank(build(dec, where, lambda: cls(reward, cons, constraints=declared, **options)),
                                 node, dec, where)
        alpha = _alphas(node, len(cons), dec, where)
        return _restore_bank(build(dec, where, lambda: cls(reward, cons, alpha=alpha, **options)), node, dec, where)
    # BCTS
    reward, constraint = need("reward", "constraint")
    sigma = t("sigma_online", dtype=_F64, finite=True).clone()
    teaching = t("random_teaching", dtype=torch.bool)
    policy = build(dec, where, lambda: cls(sigma, reward_model=reward, constraint_model=constraint,
                                           teaching=["random" if r else "cts" for r in teaching.reshape(-1).tolist()]))
    policy.num_teaching_examples = dec.int_field(node, "num_teaching_examples", where)
    policy._taught = dec.field(node, "taught", bool, where)
    return policy


def _restore(policy, node, dec: Decoder, where: str, shapes: dict) -> None:
    state = dec.field(node, "state", dict, where)
    if set(state) != set(shapes):
        dec.fail(f"{where}.state: expected exactly {sorted(shapes)}")
    for key, shape in shapes.items():
        current = getattr(policy, key)
        value = dec.tensor(state[key], f"{where}.state.{key}", shape=shape, dtype=current.dtype, finite=True)
        setattr(policy, key, value.clone())


def _declarations(node, count: int | None, dec: Decoder, where: str) -> list:
    """The saved ``Constraint`` declarations (plain data: metric, bound, at_most, versus_baseline and,
    for a chance constraint, confidence); ``count``: one per constraint model, or None (matched by
    metric name: any number)."""
    from ..envs.problem import Constraint

    items = dec.field(node, "constraints", list, where)
    if count is not None and len(items) != count:
        dec.fail(f"{where}: field 'constraints' must hold {count} declarations (one per constraint model), got {len(items)}")
    out = []
    for j, item in enumerate(items):
        if not isinstance(item, dict):
            dec.fail(f"{where}: constraints[{j}] must be an object with metric, bound, at_most and versus_baseline "
                     f"(and optionally confidence), got {item!r}")
        try:
            out.append(Constraint.from_dict(item))
        except (TypeError, ValueError) as exc:
            dec.fail(f"{where}: constraints[{j}]: {exc}")
    return out


def _alphas(node, count: int, dec: Decoder, where: str) -> list[float]:
    alpha = dec.field(node, "alpha", list, where)
    if len(alpha) != count or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in alpha):
        dec.fail(f"{where}: field 'alpha' must hold {count} numbers (one per constraint model), got {alpha!r}")
    return [float(a) for a in alpha]


def _restore_bank(policy, node: dict, dec: Decoder, where: str):
    """TS-ASC's cached banks of chance draws (``chance_refresh``), as saved; files without them (written
    before issue 42) leave none, and the bank is drawn at the first decision."""
    bank = node.get("chance_bank", [])
    if not isinstance(bank, list):
        dec.fail(f"{where}: field 'chance_bank' must be a list, got {bank!r}")
    models = (policy.reward_model, *policy.constraint_models)
    for j, entry in enumerate(bank):
        at = f"{where}.chance_bank[{j}]"
        if not isinstance(entry, dict):
            dec.fail(f"{at}: expected an object with model, rows and weights, got {entry!r}")
        m = dec.int_field(entry, "model", at, minimum=0)
        rows = dec.int_field(entry, "rows", at, minimum=0)
        if m >= len(models):
            dec.fail(f"{at}: model {m} is not one of the policy's {len(models)} models")
        model = models[m]
        shape = (None, *tuple(getattr(model, "batch_shape", ()) or ()), getattr(model, "dim", None))
        weights = dec.tensor(entry.get("weights"), f"{at}.weights", dtype=_F64, finite=True).clone()
        if weights.dim() != len(shape) or any(s is not None and s != w for s, w in zip(shape, weights.shape)):
            dec.fail(f"{at}: weights of shape {list(weights.shape)}, expected [S, *batch_shape, d] of model {m}")
        policy._bank[m] = (model, weights, rows)
    return policy
