"""The memory compiled models allocate from.

    pypto.enable_memory_pool()     # models compiled from now on share one process-wide pool
    pypto.set_memory_allocator("unified")   # the same ("per_model": each model its own, default)
    pypto.memory_stats()           # {'reserved_bytes': ..., 'in_use_bytes': ..., ...}
    pypto.memory.set_policy(nontemporal="never", reuse_distance=2)   # how the caches are used

Each compiled model (an optimized module, a loaded ONNX model) allocates its planned arena and
unplanned buffers from a caching pool; a block it gives back serves its next run. By default each
model has its own pool. With the process-wide pool, blocks one model's run gave back serve the
next model's run, so several models run in turn hold about the memory of the largest run instead
of the sum (docs/python.md, "Memory"). Models compiled before the call keep the pool they have.

The memory policy (set_policy) says how kernels and the memory planner use the caches; each knob's
measured effect is in docs/python.md, "Memory policy".
"""

from __future__ import annotations

from . import _C


def enable_pool(enabled: bool = True) -> None:
    """Models compiled from now on share one process-wide pool (False: each its own, the
    default; models compiled while it was on keep using it)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enable_memory_pool: enabled must be a bool, not {type(enabled).__name__}")
    _C.enable_memory_pool(enabled)


_ALLOCATORS = {"unified": True, "per_model": False}


def set_allocator(kind: str) -> None:
    """Which pool models compiled from now on allocate from: "unified", one process-wide pool
    (enable_pool()), or "per_model", each model its own (the default). PyPTO runs on the CPU, so
    host memory is the only memory: a device allocator name is a ValueError."""
    if not isinstance(kind, str):
        raise TypeError(f"set_memory_allocator: kind must be a str, not {type(kind).__name__}")
    if kind not in _ALLOCATORS:
        raise ValueError(f"set_memory_allocator: unknown allocator {kind!r}; one of 'unified' "
                         "(one process-wide pool shared by every model compiled after the call) "
                         "or 'per_model' (each model its own pool, the default)")
    enable_pool(_ALLOCATORS[kind])


def pool_enabled() -> bool:
    """Whether models compiled now take the process-wide pool."""
    return _C.memory_pool_enabled()


def stats() -> dict:
    """The counters of every live compiled model's pool, summed (the shared pool once):
    reserved_bytes (held from the system, in use or cached), in_use_bytes, peak_in_use_bytes (the
    sum of each pool's own peak: an upper bound on the process's), system_allocations (blocks
    taken from the system) and pool_hits (requests served from cached blocks)."""
    return dict(_C.memory_stats())


_NONTEMPORAL = ("auto", "never", "always")


def set_policy(prefetch_distance: int | None = None, reuse_distance: int | None = None,
               nontemporal: str | None = None) -> None:
    """Sets the process-wide memory policy; an argument left None keeps its current value.

    nontemporal: "auto" (the default) stores the outputs of elementwise programs and
    LayerNormalization with streaming stores (no read of the lines first) when they are larger
    than the last-level cache, "never" stores normally, "always" streams them (and Softmax's) at
    any size. prefetch_distance: before a tile of an elementwise program runs,
    prefetch this many cache lines of each contiguous input past the tile; -1 the built-in choice
    (the default, off), 0 off, 1..1024.
    reuse_distance: 0 (the default) lets the planner place each buffer in the best-fitting free
    gap; k in 1..64 prefers a gap freed within the last k stages by a buffer no larger than L2,
    whose lines are still cached.

    nontemporal and prefetch_distance take effect on the next run of any model; reuse_distance
    applies to memory plans made after the call (at compile time, and for each new input-shape
    signature)."""
    pf, reuse, nt = _C.memory_policy()
    if prefetch_distance is not None:
        pf = _int_in("prefetch_distance", prefetch_distance, -1, 1024)
    if reuse_distance is not None:
        reuse = _int_in("reuse_distance", reuse_distance, 0, 64)
    if nontemporal is not None:
        if not isinstance(nontemporal, str):
            raise TypeError(f"set_policy: nontemporal must be a str ({', '.join(_NONTEMPORAL)}), "
                            f"not {type(nontemporal).__name__}")
        if nontemporal not in _NONTEMPORAL:
            raise ValueError(f"set_policy: nontemporal must be one of {', '.join(_NONTEMPORAL)}, "
                             f"got {nontemporal!r}")
        nt = _NONTEMPORAL.index(nontemporal)
    _C.set_memory_policy(pf, reuse, nt)


def get_policy() -> dict:
    """The memory policy now: {'prefetch_distance': int, 'reuse_distance': int,
    'nontemporal': 'auto' | 'never' | 'always'}."""
    pf, reuse, nt = _C.memory_policy()
    return {"prefetch_distance": pf, "reuse_distance": reuse, "nontemporal": _NONTEMPORAL[nt]}


def reset_policy() -> None:
    """Back to the defaults: prefetch_distance=-1, reuse_distance=0, nontemporal="auto"."""
    _C.set_memory_policy(-1, 0, 0)


def _int_in(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"set_policy: {name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"set_policy: {name} must be in {lo}..{hi}, got {v}")
    return v
