"""pypto.quantization: int8 models, in the shape PyTorch users know.

    q = pypto.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    fast = pypto.optimize(q, (x,))       # the Linear layers run on PyPTO's int8 GEMM

Dynamic quantization stores each selected Linear's weight as int8 (symmetric, one scale per output
channel by default) and quantizes its input to uint8 when it runs, from the input's own range: one
scale and zero point per row (per token) by default, which keeps transformers within a fraction of
a percent of fp32, or one for the whole tensor (``activation="per_tensor"``, what PyTorch's and
ONNX Runtime's dynamic quantization do). The integer product is exact; the result is
``float(acc) * (x_scale * w_scale[n]) + bias[n]``. The quantized module runs in eager PyTorch too
(slowly, with the same numbers); optimized, each layer is one DynamicQuantizeMatMul kernel on
VPDPBUSD (AVX512_VNNI / AVX-VNNI) or its exact fallback.

Models quantized by ``torch.ao.quantization.quantize_dynamic`` are optimized the same way:
pypto.optimize swaps their dynamic quantized Linear modules for this module's equivalent with the
same int8 weights and scales (per-tensor activations, as PyTorch computes them).

``fast.precision_report()`` on an optimized quantized model compares it with the float model it
was quantized from. See docs/precision.md.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch

__all__ = ["DynamicQuantizedLinear", "quantize_dynamic"]

_ACTIVATIONS = ("per_row", "per_tensor")

# ---- the op the torch frontend compiles: pypto::dynamic_quantized_linear ----

_lib = torch.library.Library("pypto", "FRAGMENT")
_lib.define("dynamic_quantized_linear(Tensor x, Tensor weight, Tensor weight_scale, "
            "Tensor? weight_zero_point, Tensor? bias, bool per_row) -> Tensor")


def _quantize_rows(x: torch.Tensor, per_row: bool):
    """x [..., K] float to uint8 values (as float32) with DynamicQuantizeLinear's formula, per row
    or for the whole tensor; returns (q, scale, zero_point), scale and zero point [rows, 1]."""
    rows = x.reshape(-1, x.shape[-1]).float()
    if per_row:
        mn = rows.amin(1, keepdim=True).clamp(max=0) if rows.shape[1] else torch.zeros(
            rows.shape[0], 1)
        mx = rows.amax(1, keepdim=True).clamp(min=0) if rows.shape[1] else torch.zeros(
            rows.shape[0], 1)
    else:
        mn = rows.min().clamp(max=0).reshape(1, 1) if rows.numel() else torch.zeros(1, 1)
        mx = rows.max().clamp(min=0).reshape(1, 1) if rows.numel() else torch.zeros(1, 1)
    scale = torch.where(mx == mn, torch.ones_like(mx), mx - mn) / 255.0
    zp = torch.round(torch.clamp(-mn / scale, 0, 255))
    q = torch.clamp(torch.round(rows / scale) + zp, 0, 255)
    return q, scale, zp


@torch.library.impl(_lib, "dynamic_quantized_linear", "CompositeExplicitAutograd")
def _dynamic_quantized_linear(x, weight, weight_scale, weight_zero_point, bias, per_row):
    q, scale, zp = _quantize_rows(x, per_row)
    w = weight.double()
    if weight_zero_point is not None:
        w = w - weight_zero_point.double().reshape(-1, 1)
    # Exact integer sums (far below 2^53), wrapped to int32 as the kernels' accumulators are.
    acc = ((q - zp).double() @ w.t()).to(torch.int64).to(torch.int32).float()
    y = acc * (scale * weight_scale.float().reshape(1, -1))
    if bias is not None:
        y = y + bias.float()
    return y.reshape(*x.shape[:-1], weight.shape[0])


@torch.library.register_fake("pypto::dynamic_quantized_linear", lib=_lib)
def _dynamic_quantized_linear_fake(x, weight, weight_scale, weight_zero_point, bias, per_row):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=torch.float32)


# ---- the module ----


class DynamicQuantizedLinear(torch.nn.Module):
    """A Linear with an int8 weight and a uint8 input quantized at run time.

    weight: int8 [out_features, in_features]; weight_scale: float32 [out_features] (per channel)
    or [1]; weight_zero_point: int8 like weight_scale, or None (symmetric); bias: float32 or None;
    per_row: one activation scale per row of the input (per token) or one per call."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                 weight_zero_point: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 per_row: bool = True):
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise TypeError(f"DynamicQuantizedLinear: weight must be a 2-D int8 tensor, got "
                            f"{weight.dtype} {tuple(weight.shape)}")
        n = weight.shape[0]
        if weight_scale.numel() not in (1, n):
            raise ValueError(f"DynamicQuantizedLinear: weight_scale has {weight_scale.numel()} "
                             f"values; expected 1 or {n} (one per output channel)")
        self.in_features, self.out_features = weight.shape[1], n
        self.per_row = bool(per_row)
        self.register_buffer("weight", weight.detach().clone())
        self.register_buffer("weight_scale", weight_scale.detach().float().reshape(-1).clone())
        self.register_buffer("weight_zero_point", None if weight_zero_point is None else
                             weight_zero_point.detach().to(torch.int8).reshape(-1).clone())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, per_channel: bool = True,
                   per_row: bool = True) -> "DynamicQuantizedLinear":
        """Symmetric int8 weights: scale = max |w| / 127 per output channel (or per tensor)."""
        w = linear.weight.detach().float()
        amax = w.abs().amax(1) if per_channel else w.abs().max().reshape(1)
        scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        q = torch.clamp(torch.round(w / scale.reshape(-1, 1)), -127, 127).to(torch.int8)
        return cls(q, scale, None, linear.bias, per_row)

    @classmethod
    def from_torch_ao(cls, mod: torch.nn.Module) -> "DynamicQuantizedLinear":
        """The equivalent of a torch.ao.nn.quantized.dynamic.Linear: its int8 weight, scales and
        zero points, per-tensor activations (as PyTorch quantizes them)."""
        name = type(mod).__name__
        w = mod.weight()
        if not w.is_quantized or w.dtype != torch.qint8:
            raise NotImplementedError(f"pypto.optimize: {name} with {w.dtype} weights is not "
                                      "supported (int8 dynamic quantization is: dtype=torch.qint8)")
        if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            if w.q_per_channel_axis() != 0:
                raise NotImplementedError(f"pypto.optimize: {name}: per-channel weight scales "
                                          f"along axis {w.q_per_channel_axis()} (not 0)")
            scale, zp = w.q_per_channel_scales(), w.q_per_channel_zero_points()
        else:
            scale, zp = torch.tensor([w.q_scale()]), torch.tensor([w.q_zero_point()])
        zp = None if bool((zp == 0).all()) else zp
        return cls(w.int_repr(), scale.float(), zp, mod.bias(), per_row=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.pypto.dynamic_quantized_linear(x, self.weight, self.weight_scale,
                                                        self.weight_zero_point, self.bias,
                                                        self.per_row)

    def extra_repr(self) -> str:
        channel = "per channel" if self.weight_scale.numel() > 1 else "per tensor"
        act = "per row" if self.per_row else "per tensor"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight=int8 {channel}, activation=uint8 {act}")


# ---- quantize_dynamic ----


def _bad_dtype(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if dtype in (getattr(torch, "quint4x2", None), getattr(torch, "quint2x4", None)) or \
            "int4" in name or "int2" in name:
        return f"{name}: 4-bit and 2-bit weights are not supported; use torch.qint8"
    if "float8" in name:
        return f"{name}: float8 is not supported; use torch.qint8"
    if dtype == torch.float16:
        return ("float16: dynamic float16 weights are not quantization; use "
                "pypto.optimize(model, dtype=torch.float16) for fp16 products, or torch.qint8")
    return f"{name}: supported is torch.qint8 (int8 weights, uint8 activations)"


def _selected(spec) -> tuple[set, set]:
    """Module types and qualified names from quantize_dynamic's qconfig_spec."""
    types, names = set(), set()
    for key in spec:
        if isinstance(key, str):
            names.add(key)
        elif isinstance(key, type) and issubclass(key, torch.nn.Module):
            types.add(key)
        else:
            raise TypeError(f"pypto.quantization.quantize_dynamic: qconfig_spec entries must be "
                            f"module types or qualified module names, got {key!r}")
    unsupported = {t for t in types if t is not torch.nn.Linear}
    if unsupported:
        raise NotImplementedError(
            "pypto.quantization.quantize_dynamic: only torch.nn.Linear is quantized dynamically; "
            f"got {sorted(t.__name__ for t in unsupported)} (for convolutions use static "
            "quantization, pypto.quantization.calibrate)")
    return types, names


def quantize_dynamic(model: torch.nn.Module, qconfig_spec: Iterable | None = None,
                     dtype=torch.qint8, inplace: bool = False, mapping=None, *,
                     per_channel: bool = True, activation: str = "per_row") -> torch.nn.Module:
    """Replaces the model's Linear layers by DynamicQuantizedLinear (int8 weights, uint8
    activations quantized at run time), as torch.ao.quantization.quantize_dynamic does.

    qconfig_spec: module types ({torch.nn.Linear}, the default) and/or qualified module names
        ({"encoder.layer.0.output.dense"}) to quantize; a dict's keys are used the same way.
        Only exact torch.nn.Linear modules are replaced (subclasses such as
        MultiheadAttention's out_proj keep fp32, as in PyTorch).
    dtype: torch.qint8.
    inplace: modify `model` instead of a copy.
    per_channel: one weight scale per output channel (True) or per layer.
    activation: "per_row" (one input scale per row: per token) or "per_tensor".
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"pypto.quantization.quantize_dynamic expects a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if dtype != torch.qint8:
        raise NotImplementedError(f"pypto.quantization.quantize_dynamic: dtype "
                                  f"{_bad_dtype(dtype)}")
    if mapping is not None:
        raise NotImplementedError("pypto.quantization.quantize_dynamic: a custom mapping is not "
                                  "supported (Linear maps to DynamicQuantizedLinear)")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"pypto.quantization.quantize_dynamic: activation must be one of "
                         f"{_ACTIVATIONS}, got {activation!r}")
    types, names = _selected({torch.nn.Linear} if qconfig_spec is None else qconfig_spec)
    known = {n for n, _ in model.named_modules()}
    missing = names - known
    if missing:
        raise ValueError(f"pypto.quantization.quantize_dynamic: no module named "
                         f"{sorted(missing)} in {type(model).__name__}")
    original = model
    if not inplace:
        model = copy.deepcopy(model)
    count = _swap(model, lambda name, m: (type(m) in types or name in names) and
                  type(m) is torch.nn.Linear,
                  lambda m: DynamicQuantizedLinear.from_float(m, per_channel,
                                                              activation == "per_row"))
    if count == 0:
        raise ValueError(f"pypto.quantization.quantize_dynamic: {type(model).__name__} has no "
                         "torch.nn.Linear module to quantize")
    # The float model, for precision_report() (not a submodule: not in state_dict or .to()).
    if not inplace:
        object.__setattr__(model, "_pypto_float_model", original)
    return model


def _swap(model: torch.nn.Module, select, make) -> int:
    """Replaces every submodule m (named `name`) with select(name, m) by make(m); the count."""
    count = 0
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if select(full, child):
                setattr(parent, child_name, make(child))
                count += 1
    return count


def _torch_ao_dynamic_types() -> tuple:
    try:
        import torch.ao.nn.quantized.dynamic as qd
    except ImportError:  # pragma: no cover - torch without ao
        return ()
    return tuple(getattr(qd, n) for n in ("Linear",) if hasattr(qd, n))


def _torch_ao_unsupported(model: torch.nn.Module) -> list[str]:
    """Quantized torch.ao modules PyPTO does not translate (LSTM, GRU, static modules, ...)."""
    out = []
    inside = [name + "." for name, m in model.named_modules()
              if isinstance(m, _torch_ao_dynamic_types())]
    for name, m in model.named_modules():
        if any(name.startswith(p) for p in inside):  # their packed parameters
            continue
        mod = type(m).__module__
        if mod.startswith(("torch.ao.nn.quantized", "torch.nn.quantized",
                           "torch.ao.nn.intrinsic.quantized")) and \
                not isinstance(m, _torch_ao_dynamic_types()) and \
                type(m).__name__ not in ("QuantStub", "DeQuantStub", "Identity"):
            out.append(f"{name or '<root>'} ({mod}.{type(m).__name__})")
    return out


def from_torch_ao(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with torch.ao dynamic quantized Linear modules replaced by their
    DynamicQuantizedLinear equivalents (a copy; `model` itself when it has none). Other quantized
    torch.ao modules are rejected with their names."""
    bad = _torch_ao_unsupported(model)
    if bad:
        raise NotImplementedError("pypto.optimize: these quantized PyTorch modules are not "
                                  "supported: " + ", ".join(bad[:5]) +
                                  (" ..." if len(bad) > 5 else "") +
                                  " (supported: dynamic quantized Linear, "
                                  "pypto.quantization.quantize_dynamic)")
    kinds = _torch_ao_dynamic_types()
    if not kinds or not any(isinstance(m, kinds) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    _swap(model, lambda _, m: isinstance(m, kinds), DynamicQuantizedLinear.from_torch_ao)
    return model
