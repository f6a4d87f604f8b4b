"""Portable, code-free state of every model and policy: tensors in safetensors, configuration in JSON.

``save_state(obj, "posterior")`` writes ``posterior.json`` (what the object is: its type, its
configuration such as the prior, the likelihood's noise, alpha and the constraint declarations,
the feature network's layers, and the names, dtypes and shapes of its tensors) and
``posterior.safetensors`` (the numbers). ``load_state("posterior")`` gives back an object that
predicts, samples (same seed, same draws) and updates like the original.

Loading never executes code from a file: there is no pickle, the JSON is data and safetensors
holds raw numbers. Every structural problem (unknown format version or type, a tampered JSON,
a missing, extra or mis-shaped tensor, a non-finite value where none can be) raises
``StateError``, a ``ValueError`` whose message names the file and what was expected.

What can be saved:

* models: ``BayesianLinear`` (conjugate Gaussian, Normal-Inverse-Gamma, and NUTS / SVI with
  their stored observations and posterior draws), ``PerArmLinear``, ``CTSPosterior``,
  ``ProbitGP`` and its views ``SuccessProbability`` / ``ScaledOutcome`` (views of one GP are
  saved once and load sharing it), ``RidgeRewardModel``, and ``torch.nn`` modules built from
  ``Sequential``, ``Linear`` and standard activations (the offline policy networks);
* policies: ``ThompsonSampling``, ``Greedy``, ``Random``, ``LinUCB``, ``LUCB``, ``CLUCB``,
  ``CLUCB2ASC``, ``TSASC``, ``BCTS``, ``ConstraintMask``, with their configuration, running
  sums and models (save between steps, not between ``select`` and ``update``);
* a mapping ``{role: model}``.

Priors: Pyro distributions (``Normal``, ``Laplace``, ``StudentT``, ``Cauchy``,
``MultivariateNormal``, ``.to_event``, ``.expand``, ``InverseGamma`` on the noise) are saved as
their parameters. A prior written as a Pyro model function is saved as its import path
``module:function``: it must be defined at the top level of an importable module (saving a
lambda, a nested function or a function of ``__main__`` raises ``ValueError`` naming it).
Loading imports that module only when asked, ``load_state(path, allow_imports=True)``;
otherwise ``StateError`` names the path and the flag. The same holds for a ``CLUCB`` whose
known baseline reward is a function.

Example:
    >>> import torch, pyro.distributions as dist
    >>> from bayes_safe.models import BayesianLinear
    >>> m = BayesianLinear(dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.1)
    >>> m.update(torch.randn(20, 3), torch.randn(20))
    >>> path = save_state(m, "posterior")      # writes posterior.json and posterior.safetensors
    >>> back = load_state(path)
    >>> torch.equal(back.posterior_mean, m.posterior_mean)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from ._format import (
    FORMAT,
    VERSION,
    Decoder,
    Encoder,
    StateError,
    read_header,
    read_tensors,
    state_paths,
    write_pair,
)
from ._models import can_encode_model, decode_model, encode_model
from ._policies import SAVEABLE_POLICIES, decode_policy, encode_policy, policy_type_name

__all__ = ["FORMAT", "SAVEABLE_POLICIES", "VERSION", "StateError", "load_state", "read_kind", "save_state", "state_paths"]


def _is_policy(obj) -> bool:
    from ..policies.base import Policy

    return isinstance(obj, Policy)


def save_state(obj, path, *, max_observations: int | None = None) -> Path:
    """Save a model, a policy or a mapping ``{role: model}`` as ``NAME.json`` + ``NAME.safetensors``.

    Args:
        obj: what to save (see the module docstring for the types).
        path: ``NAME`` or ``NAME.json``; the directory is created if missing. Each file is
            written atomically (the tensors first, then the JSON that names their checksum).
        max_observations: keep at most this many evenly spaced stored observations of each
            ``ProbitGP`` (``None``: all); the object itself is left untouched.

    Returns:
        the path of the JSON file.

    Raises:
        TypeError: a type that cannot be saved (the message lists the saveable ones).
        ValueError: a callable prior that cannot be imported back (a lambda, a nested function).
    """
    from .._validation import check_positive_int

    max_observations = check_positive_int(max_observations, "max_observations", allow_none=True)
    enc = Encoder(max_observations=max_observations)
    if _is_policy(obj):
        kind, node = "policy", encode_policy(obj, enc, "policy", lambda role, m: encode_model(m, enc, role))
    elif isinstance(obj, Mapping):
        kind, node = "models", {"type": "models", "roles": {str(r): encode_model(m, enc, str(r)) for r, m in obj.items()}}
    else:
        kind, node = "model", encode_model(obj, enc, "model")
    return write_pair(path, kind, node, enc.tensors)


def save_models_file(models: Mapping, path, *, max_observations: int | None = None) -> Path:
    """A ``{role: model}`` mapping as one state of kind ``"models"`` (what ``save_models`` writes per group)."""
    enc = Encoder(max_observations=max_observations)
    node = {"type": "models", "roles": {str(r): encode_model(m, enc, str(r)) for r, m in models.items()}}
    return write_pair(path, "models", node, enc.tensors)


def save_policy_config(policy, path, saved_as: Mapping[str, str]) -> Path:
    """A policy's configuration whose models are references ``{"saved_as": saved_as[role]}`` to other files."""
    enc = Encoder()
    node = encode_policy(policy, enc, "policy", lambda role, m: {"saved_as": saved_as[role]})
    return write_pair(path, "policy-config", node, enc.tensors)


def read_kind(path) -> str:
    """The kind of a saved state (``"model"``, ``"models"``, ``"policy"``, ``"policy-config"``), read from its JSON only."""
    return read_header(path)[1]["kind"]


def load_file(path, *, allow_imports: bool = False, resolve: Callable | None = None):
    """``(kind, object)`` of a saved state; ``resolve(name, where)`` gives the models a policy configuration refers to."""
    json_path, header = read_header(path)
    tensors = read_tensors(json_path, header)
    dec = Decoder(json_path, tensors, allow_imports=allow_imports, resolve=resolve)
    kind, node = header["kind"], header["object"]
    if kind in ("policy", "policy-config"):
        obj = decode_policy(node, dec, "policy")
    elif kind == "models":
        roles = dec.field(node, "roles", dict, "object")
        obj = {role: decode_model(n, dec, role) for role, n in roles.items()}
    else:
        obj = decode_model(node, dec, "model")
    unused = sorted(set(tensors) - dec.used)
    if unused:
        dec.fail(f"the tensor file holds tensors the JSON does not use: {unused[:5]}")
    return kind, obj


def load_state(path, *, allow_imports: bool = False):
    """Load what ``save_state`` wrote: a model, a policy or a ``{role: model}`` mapping.

    Args:
        path: ``NAME``, ``NAME.json`` or ``NAME.safetensors``.
        allow_imports: import the module of a prior saved as ``module:function`` (this runs that
            module's code: allow it only for code you trust). Without it such a state raises
            ``StateError`` naming the import path.

    Raises:
        StateError: (a ``ValueError``) the files are missing, not a bayes_safe state, of another
            format version, tampered with or truncated; the message names the file.
    """
    kind, obj = load_file(path, allow_imports=allow_imports)
    if kind == "policy-config":
        raise StateError(f"{state_paths(path)[0]}: a policy configuration whose models are saved in other files of "
                         "its directory; load it with bayes_safe.diagnostics.load_policy")
    return obj


def can_save(obj) -> bool:
    """Whether ``obj`` (a model or a policy) has a codec."""
    return policy_type_name(obj) is not None if _is_policy(obj) else can_encode_model(obj)
