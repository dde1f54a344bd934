"""PyPTO: PyTorch and ONNX models, and tensor programs, compiled to tiles and run on all cores.

    fast = pypto.optimize(model, example_inputs=(x,))   # a torch.nn.Module
    fast = torch.compile(model, backend="pypto")
    exe = pypto.onnx.load("model.onnx")

See docs/python.md for every entry point.
"""

from __future__ import annotations

from . import _C
from .device import device_info, is_available
from .options import (get_num_threads, get_optimization_options, reset_optimization_options,
                      set_num_threads, set_optimization_options)
from .runtime import CompiledGraph
from . import onnx

__version__ = "0.1.0"

try:
    import torch as _torch  # noqa: F401
except ImportError:  # ONNX-only use: the torch entry points are absent
    _torch = None

if _torch is not None:
    from .optimize import OptimizedModule, optimize
    from .jit import jit
    from .custom_ops import custom_op
    from . import dynamo as _dynamo

    _dynamo.register()

__all__ = [
    "CompiledGraph", "OptimizedModule", "custom_op", "device_info", "get_num_threads",
    "get_optimization_options", "is_available", "jit", "onnx", "optimize",
    "reset_optimization_options", "set_num_threads", "set_optimization_options",
]
