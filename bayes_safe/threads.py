"""Torch intra-op threads for simulation loops.

Simulation loops run many tiny tensor operations (4x4 Cholesky factors, 100-arm scores).
Measured on this project's 2-core machines, torch's default of one intra-op thread per core
ran such operations 7x to 80x slower than a single thread when the machine was loaded:
the threads' hand-off costs more than the arithmetic. Every simulation loop in bayes_safe
therefore runs inside ``single_thread``, which sets one intra-op thread and restores the
previous setting afterwards. Large fits (NUTS, GP training) are unaffected outside loops.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["single_thread"]


@contextlib.contextmanager
def single_thread():
    """Run the enclosed block with one torch intra-op thread and one BLAS thread for numpy
    (threadpoolctl), restoring the old settings after. numpy's OpenBLAS defaults to a thread
    per core too, and made a 1000 x 50 optimal design 4x to 40x slower on a loaded machine."""
    from threadpoolctl import threadpool_limits

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(old)
