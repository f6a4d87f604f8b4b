"""Torch intra-op threads for simulation loops.

Simulation loops run many tiny tensor operations (4x4 Cholesky factors, 100-arm scores).
Measured on this project's 2-core machines, torch's default of one intra-op thread per core
ran such operations 7x to 80x slower than a single thread when the machine was loaded:
the threads' hand-off costs more than the arithmetic. Every simulation loop in bayes_safe
therefore runs inside :func:`single_thread`, which sets one intra-op thread and restores the
previous setting afterwards. Large fits (NUTS, GP training) are unaffected outside loops.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["single_thread"]


@contextlib.contextmanager
def single_thread():
    """Run the enclosed block with ``torch.set_num_threads(1)``, restoring the old value after."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
