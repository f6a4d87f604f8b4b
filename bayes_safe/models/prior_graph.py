"""A prior's log density and gradient recorded once as a straight-line graph of tensor operations.

The Langevin engine (``langevin.py``) evaluates, at every MALA step of one replication, the
prior's log density in unconstrained coordinates and its gradient. Run eagerly, that is a run
of the Pyro model (its effect handlers, distribution objects and transforms) and a backward
pass of the autograd engine: for a two-site hierarchical prior about 0.5 ms, almost all of it
Python overhead around a few dozen operations on vectors of ``d`` numbers.

``compile_prior`` records one evaluation of a pure function of ``theta`` (value, gradient and
whatever else it returns, ``torch.func`` transforms included) with ``make_fx`` into an FX graph
of ATen operations, simplifies the graph and checks it against the eager function at several
states. The graph is replayed through TorchScript (``torch.jit.trace`` of the straight-line
ATen code), which costs only the operations themselves: on the benchmark's two-site
hierarchical prior, 86 us for value and gradient against 500 us eager.

Simplifications (each keeps the result bit for bit): constant subgraphs are evaluated once;
copies of constants (``lift_fresh_copy``) are dropped; ``x * 1``, ``x / 1``, ``x ** 1``, ``x + 0``,
``x - 0``, additions of a zero tensor, and sums, ``expand`` and ``view`` that keep ``x``'s shape
are replaced by ``x`` when the result has ``x``'s shape and dtype; repeated subexpressions are
computed once.

A graph is a recording of one run, so it is refused (``compile_prior`` returns ``None`` and the
caller stays eager) when it could not replay the prior faithfully:

* the function draws random numbers itself (an operation tagged ``nondeterministic_seeded``);
* it reads a tensor's value into Python (``.item()``, ``bool(tensor)``, ``if x > 0:``), since
  the branch taken at the recording would be frozen;
* it mutates a tensor in place;
* the graph disagrees with the eager function at any check state (relative 1e-9);
* ``make_fx`` cannot trace it.

Example:
    ```python
    import torch
    from bayes_safe.models.prior_graph import compile_prior

    def f(t):  # log density of N(0, 1) on R^3 and its gradient
        return torch.func.grad_and_value(lambda u: -0.5 * (u * u).sum())(t)

    graph = compile_prior(f, (torch.zeros(3, dtype=torch.float64),), checks=[(torch.randn(3, dtype=torch.float64),)])
    grad, value = graph(torch.ones(3, dtype=torch.float64))     # [3], []
    ```
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["compile_prior"]

_aten = torch.ops.aten
# operations that move a tensor's value into Python: a recorded branch would be frozen
_VALUE_READS = {_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default}
_ZERO_FILLS = {_aten.full_like.default, _aten.full.default, _aten.zeros_like.default, _aten.zeros.default,
               _aten.new_zeros.default}
_SUMS = (_aten.sum.default, _aten.sum.dim_IntList)
_RESHAPES = (_aten.expand.default, _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default,
             _aten.alias.default)


def compile_prior(fn: Callable, example: tuple, checks, *, rtol: float = 1e-9) -> Callable | None:
    """Record ``fn`` (a pure function of tensors returning tensors) as a simplified graph.

    Args:
        fn: ``(*tensors) -> tensor or tuple of tensors``; called eagerly at the check inputs.
        example: the input tensors at which the recording is made (their shapes are fixed).
        checks: further input tuples at which the graph must agree with ``fn`` (relative
            ``rtol``, absolute ``rtol * 1e-3``, NaN equal to NaN).

    Returns:
        A callable with ``fn``'s signature and outputs, or ``None`` when the graph cannot be
        trusted to replay ``fn`` (see the module docstring).
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = make_fx(lambda *inputs: fn(*inputs))(*_fresh(example))  # (any callable, bound methods too)
    except Exception:  # noqa: BLE001 - any failure to trace means: stay eager
        return None
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if target is operator.getitem:  # one output of a multi-output operation
            continue
        if target in _VALUE_READS or not isinstance(target, torch._ops.OpOverload):
            return None
        if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
            return None
    _simplify(module)
    runner = _script(module, example)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for inputs in [example, *checks]:
                want, _ = tree_flatten(fn(*_fresh(inputs)))
                got, _ = tree_flatten(runner(*_fresh(inputs)))
                if len(want) != len(got):
                    return None
                for a, b in zip(want, got):
                    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                        if a != b:
                            return None
                    elif a.shape != b.shape or a.dtype != b.dtype or not torch.allclose(
                            b, a, rtol=rtol, atol=rtol * 1e-3, equal_nan=True):
                        return None
    except Exception:  # noqa: BLE001 - the eager function or the graph failed at a check state
        return None
    return runner


def _fresh(inputs: tuple) -> tuple:
    return tuple(t.detach().clone() for t in inputs)


def _script(module: torch.fx.GraphModule, example: tuple) -> Callable:
    """The graph as a TorchScript function (``torch.jit.trace`` of straight-line ATen code: no
    branch to freeze), which replays it with less Python per operation than the FX module
    (about 3x on the benchmark prior); the FX module itself when TorchScript is unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.trace is deprecated in torch 2.x (still shipped)
            return torch.jit.trace(module, _fresh(example), check_trace=False)
    except Exception:  # noqa: BLE001
        return module


def _simplify(module: torch.fx.GraphModule) -> None:
    """Fold constants, drop copies and identities, merge repeated subexpressions (in place)."""
    graph = module.graph
    constant: dict[torch.fx.Node, torch.Tensor] = {}
    zero: set[torch.fx.Node] = set()
    seen: dict[tuple, torch.fx.Node] = {}
    folded = 0
    for node in list(graph.nodes):
        if node.op == "get_attr":
            value = getattr(module, node.target)
            if isinstance(value, torch.Tensor):
                constant[node] = value
            continue
        if node.op != "call_function":
            continue
        target, args, kwargs = node.target, node.args, node.kwargs
        if target is _aten.lift_fresh_copy.default and args[0] in constant:
            node.replace_all_uses_with(args[0])
            graph.erase_node(node)
            continue
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.fx.Node)]
        if inputs and all(a in constant for a in inputs):  # a constant subgraph: evaluate it now
            real_args, real_kwargs = torch.fx.node.map_arg((args, kwargs), lambda a: constant[a])
            value = target(*real_args, **real_kwargs)
            if isinstance(value, torch.Tensor):
                name = f"_folded_{folded}"
                folded += 1
                module.register_buffer(name, value)
                with graph.inserting_before(node):
                    new = graph.get_attr(name)
                new.meta = dict(node.meta)
                node.replace_all_uses_with(new)
                graph.erase_node(node)
                constant[new] = value
                continue
        same = _identity_of(node, zero)
        if same is not None:
            node.replace_all_uses_with(same)
            graph.erase_node(node)
            continue
        if target in _ZERO_FILLS and _fills_zero(node) or target in _RESHAPES + _SUMS and args[0] in zero:
            zero.add(node)
        key = (target, _hashable(args), _hashable(kwargs))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            continue
        seen[key] = node
    graph.eliminate_dead_code()
    module.recompile()


def _identity_of(node: torch.fx.Node, zero: set) -> torch.fx.Node | None:
    """The input ``x`` that ``node`` returns unchanged (same shape and dtype), or ``None``."""
    args = node.args
    if not args or node.kwargs.get("alpha", 1) != 1:
        return None
    target = node.target
    x = args[0]
    candidate = None
    if target in (_aten.mul.Tensor, _aten.div.Tensor) and len(args) == 2 and _is_number(args[1], 1):
        candidate = x
    elif target in (_aten.add.Tensor, _aten.sub.Tensor) and len(args) == 2:
        if _is_number(args[1], 0) or args[1] in zero:
            candidate = x
        elif target is _aten.add.Tensor and x in zero:
            candidate = args[1]
    elif target is _aten.pow.Tensor_Scalar and _is_number(args[1], 1):
        candidate = x
    elif target in _RESHAPES and target is not _aten.alias.default or target is _aten.sum.default:
        candidate = x  # (a sum is an identity when it keeps the shape: a 0-dim input)
    if not isinstance(candidate, torch.fx.Node):
        return None
    out, inp = node.meta.get("val"), candidate.meta.get("val")
    if not (isinstance(out, torch.Tensor) and isinstance(inp, torch.Tensor)):
        return None
    if out.shape != inp.shape or out.dtype != inp.dtype:
        return None
    return candidate


def _is_number(value, number) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == number


def _fills_zero(node: torch.fx.Node) -> bool:
    target = node.target
    if target in (_aten.zeros_like.default, _aten.zeros.default, _aten.new_zeros.default):
        return True
    return len(node.args) >= 2 and _is_number(node.args[1], 0)


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    return value
