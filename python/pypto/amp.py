"""pypto.amp: mixed precision for modules already optimized by PyPTO.

    fast = pypto.optimize(model, (x,))
    with pypto.amp.autocast(dtype=torch.bfloat16):   # or torch.float16
        y = fast(x)          # the products in bf16, the rest in fp32; y is float32

Inside the context an optimized module runs a copy of itself compiled with bf16 (or fp16) matrix
products (the AutoMixedPrecision pass: both operands rounded to bf16 or fp16, fp32 accumulation,
VDPBF16PS where the CPU has it; fp16 runs the fp32 kernels on rounded operands); everything else,
and the outputs, stay float32. The copy is compiled on the first
call inside the context and kept. `torch.autocast` around an optimized module is an error, not
silently ignored: use this, or ``pypto.optimize(model, dtype=torch.bfloat16)``. See
docs/precision.md.
"""

from __future__ import annotations

import contextvars

_dtype: contextvars.ContextVar = contextvars.ContextVar("pypto_amp_dtype", default=None)


def amp_dtype():
    """The dtype of the innermost active pypto.amp.autocast, or None."""
    return _dtype.get()


class autocast:  # noqa: N801 - the name PyTorch users know
    """Context manager (and decorator) running optimized modules with bf16 or fp16 matrix
    products (dtype: torch.bfloat16, the default, or torch.float16)."""

    def __init__(self, dtype=None, enabled: bool = True):
        import torch

        if dtype is None:
            dtype = torch.bfloat16
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"pypto.amp.autocast: dtype must be torch.bfloat16 or torch.float16, "
                             f"got {dtype!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"pypto.amp.autocast: enabled must be a bool, got "
                            f"{type(enabled).__name__}")
        self.dtype = dtype
        self.enabled = enabled
        self._tokens: list = []

    def __enter__(self):
        self._tokens.append(_dtype.set(self.dtype if self.enabled else None))
        return self

    def __exit__(self, *exc):
        _dtype.reset(self._tokens.pop())
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapper


class GradScaler:  # noqa: D101 - the name API.md lists
    """Loss scaling is for training, which PyPTO does not do yet: a clear error, not a no-op."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("pypto.amp.GradScaler: PyPTO compiles models for inference; "
                                  "training (and so loss scaling) is not supported yet")
