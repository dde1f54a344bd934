"""The memory compiled models allocate from.

    pypto.enable_memory_pool()     # models compiled from now on share one process-wide pool
    pypto.memory_stats()           # {'reserved_bytes': ..., 'in_use_bytes': ..., ...}

Each compiled model (an optimized module, a loaded ONNX model) allocates its planned arena and
unplanned buffers from a caching pool; a block it gives back serves its next run. By default each
model has its own pool. With the process-wide pool, blocks one model's run gave back serve the
next model's run, so several models run in turn hold about the memory of the largest run instead
of the sum (docs/python.md, "Memory"). Models compiled before the call keep the pool they have.
"""

from __future__ import annotations

from . import _C


def enable_pool(enabled: bool = True) -> None:
    """Models compiled from now on share one process-wide pool (False: each its own, the
    default; models compiled while it was on keep using it)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enable_memory_pool: enabled must be a bool, not {type(enabled).__name__}")
    _C.enable_memory_pool(enabled)


def pool_enabled() -> bool:
    """Whether models compiled now take the process-wide pool."""
    return _C.memory_pool_enabled()


def stats() -> dict:
    """The counters of every live compiled model's pool, summed (the shared pool once):
    reserved_bytes (held from the system, in use or cached), in_use_bytes, peak_in_use_bytes (the
    sum of each pool's own peak: an upper bound on the process's), system_allocations (blocks
    taken from the system) and pool_hits (requests served from cached blocks)."""
    return dict(_C.memory_stats())
