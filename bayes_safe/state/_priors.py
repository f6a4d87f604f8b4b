"""Priors as data: Pyro distributions and GPyTorch priors as JSON specs, Pyro-model priors as import paths.

A distribution prior is written as its type and parameters (tensors), rebuilt with
``pyro.distributions`` on load; no code from the file runs. A callable prior (a Pyro model such
as a horseshoe) is written as the import path ``"module:qualname"`` of the function; loading
imports it only with ``allow_imports=True``. Lambdas, nested functions and functions of
``__main__`` cannot be imported back, so saving a model with one raises ``ValueError``.
"""

from __future__ import annotations

import importlib
import sys

import torch
import torch.distributions as tdist

from ._format import Decoder, Encoder, StateError

# (torch class, parameter names), checked in order (subclasses first)
_SIMPLE = (
    ("InverseGamma", tdist.InverseGamma, ("concentration", "rate")),
    ("HalfCauchy", tdist.HalfCauchy, ("scale",)),
    ("HalfNormal", tdist.HalfNormal, ("scale",)),
    ("LogNormal", tdist.LogNormal, ("loc", "scale")),
    ("Normal", tdist.Normal, ("loc", "scale")),
    ("Laplace", tdist.Laplace, ("loc", "scale")),
    ("Cauchy", tdist.Cauchy, ("loc", "scale")),
    ("StudentT", tdist.StudentT, ("df", "loc", "scale")),
    ("Gamma", tdist.Gamma, ("concentration", "rate")),
)
SAVEABLE = "Normal, Laplace, StudentT, Cauchy, MultivariateNormal, Independent (.to_event), expanded distributions, " \
    "InverseGamma, Gamma, HalfCauchy, HalfNormal, LogNormal, or a Pyro model function defined in an importable module"


def callable_path(fn, what: str) -> str:
    """``"module:qualname"`` of a function that can be imported back, else ``ValueError`` naming ``what``."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise ValueError(
            f"{what}: the function {fn!r} cannot be saved: a callable (such as a Pyro-model prior) is saved as its "
            "import path (module:function), so it must be defined at the top level of an importable module "
            "(not a lambda, a nested function or a function of __main__)"
        )
    target = sys.modules.get(module)
    obj = target
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise ValueError(f"{what}: the function {fn!r} is not reachable as {module}:{qualname}, so it could not be "
                         "imported back; define it at the top level of an importable module")
    return f"{module}:{qualname}"


def import_callable(path: str, dec: Decoder, where: str):
    """Import ``module:qualname``, only if the caller allowed imports."""
    if not isinstance(path, str) or path.count(":") != 1:
        dec.fail(f"{where}: expected an import path 'module:function', got {path!r}")
    if not dec.allow_imports:
        dec.fail(f"{where}: the prior is the Python function {path!r}; loading it imports and runs the code of "
                 "that module, so pass allow_imports=True (on the command line --allow-imports) if you trust it")
    module, qualname = path.split(":")
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - any failure to import is reported as such
        dec.fail(f"{where}: cannot import the prior {path!r} ({type(exc).__name__}: {exc})")
    if not callable(obj):
        dec.fail(f"{where}: {path!r} is not callable")
    return obj


def encode_distribution(d, enc: Encoder, what: str) -> dict:
    """The JSON spec of a distribution (tensors through ``enc``)."""
    from pyro.distributions.torch_distribution import ExpandedDistribution

    if isinstance(d, ExpandedDistribution):
        return {"dist": "Expanded", "batch_shape": list(d.batch_shape), "base": encode_distribution(d.base_dist, enc, what)}
    if isinstance(d, tdist.Independent):
        return {"dist": "Independent", "reinterpreted_batch_ndims": int(d.reinterpreted_batch_ndims),
                "base": encode_distribution(d.base_dist, enc, what)}
    if isinstance(d, tdist.MultivariateNormal):
        attrs = vars(d)
        which = next((n for n in ("covariance_matrix", "precision_matrix") if n in attrs), "scale_tril")
        return {"dist": "MultivariateNormal", "loc": enc.tensor(d.loc, f"{what}.loc"),
                which: enc.tensor(getattr(d, which), f"{what}.{which}")}
    for name, cls, params in _SIMPLE:
        if isinstance(d, cls):
            return {"dist": name, **{p: enc.tensor(torch.as_tensor(getattr(d, p)), f"{what}.{p}") for p in params}}
    raise TypeError(f"{what}: cannot save a prior of type {type(d).__name__}; saveable priors: {SAVEABLE}")


def decode_distribution(spec, dec: Decoder, where: str):
    import pyro.distributions as dist

    if not isinstance(spec, dict) or not isinstance(spec.get("dist"), str):
        dec.fail(f"{where}: expected a distribution spec {{'dist': name, ...}}, got {spec!r}")
    kind = spec["dist"]
    try:
        if kind == "Expanded":
            base = decode_distribution(spec.get("base"), dec, where)
            return base.expand(dec.field(spec, "batch_shape", list, where))
        if kind == "Independent":
            base = decode_distribution(spec.get("base"), dec, where)
            return dist.Independent(base, dec.int_field(spec, "reinterpreted_batch_ndims", where))
        if kind == "MultivariateNormal":
            loc = dec.tensor(spec.get("loc"), f"{where}.loc", finite=True)
            which = [n for n in ("covariance_matrix", "precision_matrix", "scale_tril") if n in spec]
            if len(which) != 1:
                dec.fail(f"{where}: a MultivariateNormal needs exactly one of covariance_matrix, precision_matrix, scale_tril")
            matrix = dec.tensor(spec[which[0]], f"{where}.{which[0]}", finite=True)
            return dist.MultivariateNormal(loc, **{which[0]: matrix})
        for name, _cls, params in _SIMPLE:
            if kind == name:
                values = [dec.tensor(spec.get(p), f"{where}.{p}", finite=True) for p in params]
                return getattr(dist, name)(*values)
    except StateError:
        raise
    except (ValueError, RuntimeError, TypeError) as exc:
        dec.fail(f"{where}: invalid {kind} parameters ({exc})")
    dec.fail(f"{where}: unknown distribution {kind!r}; expected one of {SAVEABLE}")


def encode_prior(prior, enc: Encoder, what: str) -> dict:
    if isinstance(prior, tdist.Distribution):
        return encode_distribution(prior, enc, what)
    if callable(prior):
        return {"callable": callable_path(prior, what)}
    raise TypeError(f"{what}: cannot save a prior of type {type(prior).__name__}; saveable priors: {SAVEABLE}")


def decode_prior(spec, dec: Decoder, where: str):
    if isinstance(spec, dict) and "callable" in spec:
        return import_callable(spec["callable"], dec, where)
    return decode_distribution(spec, dec, where)


# ---------------------------------------------------------------------- GPyTorch priors (ProbitGP)
_GP_PRIORS = {
    "GammaPrior": ("concentration", "rate"),
    "NormalPrior": ("loc", "scale"),
    "LogNormalPrior": ("loc", "scale"),
    "HalfCauchyPrior": ("scale",),
}


def encode_gp_prior(prior, enc: Encoder, what: str):
    if prior is None:
        return None
    import gpytorch

    for name, params in _GP_PRIORS.items():
        cls = getattr(gpytorch.priors, name)
        if type(prior) is cls:
            return {"prior": name, **{p: enc.tensor(torch.as_tensor(getattr(prior, p)), f"{what}.{p}") for p in params}}
    raise TypeError(f"{what}: cannot save a GPyTorch prior of type {type(prior).__name__}; expected one of {sorted(_GP_PRIORS)}")


def decode_gp_prior(spec, dec: Decoder, where: str):
    if spec is None:
        return False  # ProbitGP(variance_prior=False): no prior
    import gpytorch

    name = spec.get("prior") if isinstance(spec, dict) else None
    if name not in _GP_PRIORS:
        dec.fail(f"{where}: unknown GPyTorch prior {name!r}; expected one of {sorted(_GP_PRIORS)}")
    values = [dec.tensor(spec.get(p), f"{where}.{p}", finite=True) for p in _GP_PRIORS[name]]
    try:
        return getattr(gpytorch.priors, name)(*values)
    except (ValueError, RuntimeError) as exc:
        dec.fail(f"{where}: invalid {name} parameters ({exc})")
