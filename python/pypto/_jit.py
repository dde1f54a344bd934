"""@pypto.jit: a Python function over tensors becomes one compiled graph.

    @pypto.jit
    def lj_potential(r):
        s6 = (3.4 / r) ** 6
        return 4 * 0.1 * (s6 * s6 - s6)

The first call with a given set of input shapes and dtypes captures the function with
torch.export and compiles it; later calls with the same signature reuse the compiled graph.
Tensors go in and come out without copies; numpy arrays work too (numpy in, numpy out).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

from .frontend import torch_capture
from .runtime import CompiledGraph


class _AsModule(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _key(x: Any):
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, (int, float, bool, str, type(None))):
        return ("value", type(x), x)
    raise TypeError(f"@pypto.jit: arguments must be tensors, numpy arrays or Python scalars, "
                    f"got {type(x).__name__}")


class JitFunction:
    """The compiled form of a function; one compiled graph per input signature."""

    def __init__(self, fn: Callable, level: int | None, tile: Any = None):
        from .options import tile_option

        tile_option(tile, f"@pypto.jit({fn.__name__})")  # the form now; the fit when compiling
        self.fn, self.level, self.tile = fn, level, tile
        self._cache: dict[Any, tuple[torch_capture.Captured, CompiledGraph]] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        numpy_in = any(isinstance(x, np.ndarray) for x in flat)
        flat = [torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in flat]
        key = (spec, tuple(_key(x) for x in flat))
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._compile(*pytree.tree_unflatten(flat, spec))
                self._cache[key] = entry
        cap, compiled = entry
        tensors = [x for x, (kind, _) in zip(flat, cap.inputs) if kind == "tensor"]
        outs = compiled.run(tensors, like="numpy" if numpy_in else "torch")
        return pytree.tree_unflatten(outs, cap.out_spec)

    def _compile(self, args, kwargs):
        with torch.no_grad():
            try:
                cap = torch_capture.capture(_AsModule(self.fn), tuple(args), kwargs,
                                            dynamic=False,
                                            what=f"@pypto.jit function {self.fn.__name__}")
            except NotImplementedError as e:
                raise NotImplementedError(str(e)) from None
        return cap, CompiledGraph(cap.graph, self.level, tile=self.tile)

    def stats(self) -> dict:
        """Kernel count and planned memory of the most recently compiled signature (see
        CompiledGraph.stats); a function not called yet has none."""
        if not self._cache:
            raise RuntimeError(f"@pypto.jit function {self.fn.__name__} has not been called yet: "
                               "it compiles on its first call")
        return next(reversed(self._cache.values()))[1].stats()

    def describe_tiles(self) -> str:
        """The kernels and tiling plans of the most recently compiled signature
        (CompiledGraph.describe_tiles)."""
        if not self._cache:
            raise RuntimeError(f"@pypto.jit function {self.fn.__name__} has not been called yet: "
                               "it compiles on its first call")
        return next(reversed(self._cache.values()))[1].describe_tiles()

    @property
    def cache_size(self) -> int:
        """How many input signatures have been compiled."""
        return len(self._cache)


def jit(fn: Callable | None = None, *, level: int | None = None, tile: Any = None):
    """Decorator: ``@pypto.jit``, ``@pypto.jit(level=1)``, ``@pypto.jit(tile=(rows, cols))``.

    tile: pin the tile shape of the function's tile kernels instead of letting the tiling planner
    choose: ``(rows, cols)`` of the output merged to 2-D, ``(cols,)``, or a dict from a kernel's
    name (one of its nodes or its output) to such a shape. A malformed tile is an error here; one
    whose working set does not fit L1 (or that cuts rows a kernel reduces) is a ValueError from
    the first call, naming the kernel, the buffer, the bytes needed and available.
    """
    if fn is None:
        return lambda f: JitFunction(f, level, tile)
    if not callable(fn):
        raise TypeError(f"@pypto.jit decorates a function, got {type(fn).__name__}")
    return JitFunction(fn, level, tile)
