"""Element types by name: PyPTO's short names, torch dtypes and ONNX type codes."""

from __future__ import annotations

import torch

# torch dtype -> (PyPTO name, ONNX TensorProto code)
_TORCH = {
    torch.float32: ("f32", 1),
    torch.float64: ("f64", 11),
    torch.float16: ("f16", 10),
    torch.bfloat16: ("bf16", 16),
    torch.int8: ("i8", 3),
    torch.int16: ("i16", 5),
    torch.int32: ("i32", 6),
    torch.int64: ("i64", 7),
    torch.uint8: ("u8", 2),
    torch.uint16: ("u16", 4),
    torch.uint32: ("u32", 12),
    torch.uint64: ("u64", 13),
    torch.bool: ("bool", 9),
}
_BY_NAME = {name: dt for dt, (name, _) in _TORCH.items()}


def name(dtype: torch.dtype) -> str:
    """PyPTO's name for a torch dtype ("f32", "i64", ...); TypeError for one PyPTO lacks."""
    try:
        return _TORCH[dtype][0]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported by PyPTO "
                        f"(supported: {', '.join(str(d) for d in _TORCH)})") from None


def onnx_code(dtype: torch.dtype) -> int:
    name(dtype)  # raises for unsupported ones
    return _TORCH[dtype][1]


def from_name(n: str) -> torch.dtype:
    return _BY_NAME[n]
