"""PyPTO: PyTorch and ONNX models, and tensor programs, compiled to tiles and run on all cores.

    fast = pypto.optimize(model, example_inputs=(x,))   # a torch.nn.Module
    fast = torch.compile(model, backend="pypto")
    exe = pypto.onnx.load("model.onnx")
    pypto.save(fast, "model.pto"); fast = pypto.load("model.pto")   # no recompiling

See docs/python.md for every entry point.
"""

from __future__ import annotations

import importlib.abc as _abc
import sys as _sys

from . import _C
from .device import device_info, is_available
from .options import (get_num_threads, get_optimization_options, get_threading,
                      reset_optimization_options, set_num_threads, set_optimization_options,
                      set_threading)
from .runtime import CompiledGraph
from .serialization import load, save, save_graph
from . import amp, debug, memory, onnx, profiler, tuning
from .memory import enable_pool as enable_memory_pool, set_allocator as set_memory_allocator
from .memory import stats as memory_stats

__version__ = "0.1.0"

# The PyTorch entry points, imported on first use: `import pypto` does not import torch (about
# 2 s and 600 MiB), so ONNX-only programs never pay for it.
_TORCH_ENTRIES = {"optimize": "_optimize", "OptimizedModule": "_optimize", "jit": "_jit",
                  "custom_op": "custom_ops", "quantization": "quantization"}


def __getattr__(name: str):
    module = _TORCH_ENTRIES.get(name)
    if module is None:
        raise AttributeError(f"module 'pypto' has no attribute '{name}'")
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise AttributeError(f"pypto.{name} needs PyTorch, which is not installed ({e})") from e
    import importlib

    value = importlib.import_module(f".{module}", __name__)
    if module != name:  # an entry point of the module, else the module itself
        value = getattr(value, name)
    globals()[name] = value
    return value


def _with_torch() -> None:
    """Once torch is loaded: threading "auto" (if asked for) now runs on its OpenMP team, and
    torch.compile(backend="pypto") is registered. The backend loads pypto.dynamo (and with it
    the converters) at its first use, not here: torch is often imported by a pypto module
    (`import pypto.quantization` first in a process), and importing the converters in the
    middle of that module would find it half initialized."""
    _C.recheck_threading()
    from torch._dynamo import list_backends, register_backend

    if "pypto" not in list_backends(exclude_tags=()):
        register_backend(name="pypto")(_dynamo_backend)


def _dynamo_backend(gm, example_inputs, **kwargs):
    """torch.compile(backend="pypto"): pypto.dynamo.backend, imported when first called."""
    from .dynamo import backend

    return backend(gm, example_inputs, **kwargs)


def _register_backend_with_torch() -> None:
    """torch.compile(backend="pypto") works whenever torch is imported, before or after pypto:
    now if it is loaded, else right after it loads (an installed package is also found through
    its torch_dynamo_backends entry point)."""
    if "torch" in _sys.modules:
        _with_torch()
        return

    class _AfterTorch(_abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "torch":
                return None
            _sys.meta_path.remove(self)
            spec = None
            for finder in _sys.meta_path:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") \
                    else None
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            exec_module = spec.loader.exec_module

            def exec_then_register(module):
                exec_module(module)
                _with_torch()

            spec.loader.exec_module = exec_then_register
            return spec

    _sys.meta_path.insert(0, _AfterTorch())


_register_backend_with_torch()

__all__ = [
    "CompiledGraph", "OptimizedModule", "amp", "custom_op", "debug", "device_info",
    "enable_memory_pool", "get_num_threads", "memory", "memory_stats", "set_memory_allocator",
    "get_optimization_options", "get_threading", "is_available", "jit", "load", "onnx",
    "optimize", "profiler", "quantization", "reset_optimization_options", "save", "save_graph", "set_num_threads",
    "set_optimization_options", "set_threading", "tuning",
]
