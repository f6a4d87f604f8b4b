"""Forward pass, JVP and VJP of simple sequential policies from one set of stored activations.

The meta-gradient of Algorithm 2 (Kachuee & Lee 2022, s.3.3) needs, at the same parameters
``theta`` and on the same inner batch, the policy's output, a vector-Jacobian product (the
inner gradient, and later the policy's gradient at the updated penalty weights) and a
Jacobian-vector product (the directional derivative along the meta gradient; see
``bayes_safe.offline.training._meta_core``). With autograd these are three passes, the
forward-mode one recording dual numbers and a graph (measured 3.8x a plain forward for the
two-layer MLP on 2,640 rows). For a policy that is an ``nn.Sequential`` of ``nn.Linear``,
``nn.ReLU``, ``nn.Tanh`` and a final softmax (the library's ``mlp_policy``),
``SequentialJet`` runs the forward once, keeps each layer's input, and computes JVPs and
VJPs on any subset of rows from them in closed form (one matrix product per parameter and
per layer). Any other module goes through autograd (``supports`` says which).

Shapes: contexts ``x [B, d]``, probabilities ``[B, A]``, parameter tensors as in the module.
"""

from __future__ import annotations

import torch
from torch import nn

from .policy import Softmax, mask_probs

__all__ = ["ENGINES", "AutogradJet", "SequentialJet", "check_engine", "jet_class", "supports"]

#: how the meta-gradient differentiates the policy: the closed forms when they apply, or always
#: the closed forms (``nn.Sequential`` MLPs only), or autograd (any module)
ENGINES = ("auto", "jet", "autograd")

_ELEMENTWISE = (nn.ReLU, nn.Tanh)


def _is_softmax(layer: nn.Module) -> bool:
    return isinstance(layer, Softmax) or (isinstance(layer, nn.Softmax) and layer.dim in (-1, 1))


def supports(policy: nn.Module) -> bool:
    """True for an ``nn.Sequential`` of ``Linear`` / ``ReLU`` / ``Tanh`` layers ending in a softmax
    over the last dimension, with no buffers (what ``SequentialJet`` differentiates)."""
    if not isinstance(policy, nn.Sequential) or len(policy) < 2 or any(True for _ in policy.buffers()):
        return False
    *body, last = list(policy)
    return (_is_softmax(last) and isinstance(body[0], nn.Linear)
            and all(isinstance(layer, (nn.Linear, *_ELEMENTWISE)) for layer in body))


class SequentialJet:
    """The forward pass of a supported policy (``supports``) at ``params``, kept for JVPs and VJPs.

    Args:
        policy: the module (its structure is read; its parameters are not).
        params: ``{name: tensor}`` in ``policy.named_parameters()`` naming (e.g. ``"0.weight"``).
        x: ``[B, d]`` contexts.
        mask: ``[B, A]`` bool available actions, or None: the output is renormalised over them
            (``mask_probs``).

    Attributes:
        probs: ``[B, A]`` the (masked) action probabilities, without a graph.
    """

    def __init__(self, policy: nn.Sequential, params: dict[str, torch.Tensor], x: torch.Tensor,
                 mask: torch.Tensor | None = None):
        self.layers = list(policy)[:-1]
        self.params = params
        # per body layer: its input (Linear) or its elementwise derivative (ReLU, Tanh)
        self.saved: list[torch.Tensor] = []
        self._rows_key, self._rows_saved = None, None
        with torch.no_grad():
            h = x
            for i, layer in enumerate(self.layers):
                if isinstance(layer, nn.Linear):
                    self.saved.append(h)
                    bias = params.get(f"{i}.bias")
                    h = h @ params[f"{i}.weight"].t() if bias is None else torch.addmm(bias, h, params[f"{i}.weight"].t())
                elif isinstance(layer, nn.ReLU):
                    self.saved.append((h > 0).to(h.dtype))
                    h = h.clamp_min(0)
                else:
                    h = torch.tanh(h)
                    self.saved.append(1.0 - h.square())
            e = torch.exp(h - h.amax(-1, keepdim=True))
            self.softmax = e / e.sum(-1, keepdim=True)
            self.mask = None if mask is None else mask.to(self.softmax.dtype)
            if self.mask is None:
                self.probs = self.softmax
            else:
                pm = self.softmax * self.mask
                self.norm = pm.sum(-1, keepdim=True).clamp_min(1e-30)
                self.probs = pm / self.norm

    @staticmethod
    def _take(t: torch.Tensor | None, rows):
        return t if (t is None or rows is None) else t.index_select(0, rows)

    def _at(self, rows) -> tuple[list[torch.Tensor], torch.Tensor, tuple]:
        """The saved tensors, softmax and mask terms on ``rows`` (gathered once per ``rows`` object:
        Algorithm 2 takes a JVP and then a VJP on the same violating rows)."""
        if rows is None:
            return self.saved, self.softmax, (self.mask, getattr(self, "norm", None), self.probs)
        if self._rows_key is not rows:
            take = self._take
            masked = (None, None, None) if self.mask is None else (take(self.mask, rows), take(self.norm, rows),
                                                                   take(self.probs, rows))
            self._rows_key = rows
            self._rows_saved = ([take(t, rows) for t in self.saved], take(self.softmax, rows), masked)
        return self._rows_saved

    def jvp(self, tangents: dict[str, torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[R, A]``: the derivative of the probabilities along ``tangents`` (same names and
        shapes as ``params``), on ``rows`` (an index tensor; None: every row)."""
        saved, p, (m, s, q) = self._at(rows)
        with torch.no_grad():
            dh = None  # the contexts do not move
            for i, layer in enumerate(self.layers):
                if isinstance(layer, nn.Linear):
                    h = saved[i]
                    w_t = tangents[f"{i}.weight"]
                    b_t = tangents.get(f"{i}.bias")
                    out = h @ w_t.t() if b_t is None else torch.addmm(b_t, h, w_t.t())
                    if dh is not None:
                        out = out.addmm_(dh, self.params[f"{i}.weight"].t())
                    dh = out
                else:
                    dh = dh * saved[i]
            dp = p * (dh - (p * dh).sum(-1, keepdim=True))
            if m is None:
                return dp
            dpm = dp * m
            return dpm / s - q * (dpm.sum(-1, keepdim=True) / s)

    def vjp(self, cotangent: torch.Tensor, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``{name: [param shape]}``: ``sum_rows cotangent . d probs / d param`` on ``rows``
        (``cotangent [R, A]`` for those rows; None: every row)."""
        saved, p, (m, s, q) = self._at(rows)
        with torch.no_grad():
            g = cotangent.to(self.softmax.dtype)
            if m is not None:
                g = m * (g - (g * q).sum(-1, keepdim=True)) / s
            g = p * (g - (g * p).sum(-1, keepdim=True))  # d / d logits
            grads: dict[str, torch.Tensor] = {}
            for i in range(len(self.layers) - 1, -1, -1):
                layer = self.layers[i]
                if isinstance(layer, nn.Linear):
                    grads[f"{i}.weight"] = g.t() @ saved[i]
                    if f"{i}.bias" in self.params:
                        grads[f"{i}.bias"] = g.sum(0)
                    if i > 0:
                        g = g @ self.params[f"{i}.weight"]
                else:
                    g = g * saved[i]
            return {name: grads[name] for name in self.params}


class AutogradJet:
    """The same interface as ``SequentialJet`` for any policy module, through autograd.

    The forward records a graph (for full-batch VJPs); ``jvp`` on a subset of rows runs
    one forward with dual numbers (``torch.autograd.forward_ad``) that records a graph too, so
    a later ``vjp`` on the same rows reuses it (the pattern of Algorithm 2's last step).
    """

    def __init__(self, policy: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
                 mask: torch.Tensor | None = None):
        from torch.func import functional_call

        self.policy, self.x, self.mask = policy, x, mask
        self.buffers = {n: b.detach() for n, b in policy.named_buffers()}
        self.leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        self._call = functional_call
        with torch.enable_grad():
            self._out = self._forward(self.leaves, x, mask)
        self.probs = self._out.detach()
        self._rows = None  # (rows, leaves, output graph) of the last jvp

    def _forward(self, params, x, mask):
        return mask_probs(self._call(self.policy, (params, self.buffers), (x,)), mask)

    def _rows_inputs(self, rows):
        return self.x.index_select(0, rows), (None if self.mask is None else self.mask.index_select(0, rows))

    def jvp(self, tangents: dict[str, torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
        import torch.autograd.forward_ad as fwAD

        rows = torch.arange(self.x.shape[0]) if rows is None else rows
        x, mask = self._rows_inputs(rows)
        leaves = {n: p.detach().requires_grad_(True) for n, p in self.leaves.items()}
        with torch.enable_grad(), fwAD.dual_level():
            duals = {n: fwAD.make_dual(leaves[n], tangents[n]) for n in leaves}
            out, dprobs = fwAD.unpack_dual(self._forward(duals, x, mask))
        self._rows = (rows, leaves, out)
        return dprobs.detach()

    def vjp(self, cotangent: torch.Tensor, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if rows is None:
            out, leaves = self._out, self.leaves
        else:
            if self._rows is None or self._rows[0] is not rows:
                x, mask = self._rows_inputs(rows)
                leaves = {n: p.detach().requires_grad_(True) for n, p in self.leaves.items()}
                with torch.enable_grad():
                    self._rows = (rows, leaves, self._forward(leaves, x, mask))
            _, leaves, out = self._rows
        names = list(leaves)
        with torch.enable_grad():
            grads = torch.autograd.grad(out, [leaves[n] for n in names], cotangent.to(out.dtype), retain_graph=True,
                                        allow_unused=True)
        return {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(names, grads)}


def check_engine(engine: str, name: str = "engine") -> str:
    """``engine`` if it is one of ``ENGINES``, else a ``ValueError`` naming ``name``."""
    if engine not in ENGINES:
        choices = ", ".join(repr(e) for e in ENGINES[:-1]) + f" or {ENGINES[-1]!r}"
        raise ValueError(f"{name}: expected {choices}, got {engine!r}")
    return engine


def jet_class(policy: nn.Module, engine: str = "auto") -> type:
    """``SequentialJet`` for ``engine="jet"``, or ``"auto"`` when ``supports`` the
    policy; ``AutogradJet`` otherwise."""
    check_engine(engine)
    return SequentialJet if engine == "jet" or (engine == "auto" and supports(policy)) else AutogradJet
