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

__all__ = ["DynamicQuantizedLinear", "StaticQuantizedConv2d", "calibrate", "quantize_dynamic"]

_ACTIVATIONS = ("per_row", "per_tensor")

# ---- the op the torch frontend compiles: pypto::dynamic_quantized_linear ----

_lib = torch.library.Library("pypto", "FRAGMENT")
_lib.define("dynamic_quantized_linear(Tensor x, Tensor weight, Tensor weight_scale, "
            "Tensor? weight_zero_point, Tensor? bias, bool per_row) -> Tensor")


def _quantize_rows(x: torch.Tensor, per_row: bool):
    """x [..., K] float to uint8 values (as float32) with DynamicQuantizeLinear's formula, per row
    or for the whole tensor; returns (q, scale, zero_point), scale and zero point [rows, 1]."""
    rows = x.reshape(-1, x.shape[-1]).float()
    groups = rows if per_row else rows.reshape(1, -1)
    # A 0 in every group: the range always includes 0 (and an empty row has one).
    padded = torch.nn.functional.pad(groups, (0, 1))
    mn, mx = padded.amin(1, keepdim=True), padded.amax(1, keepdim=True)
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
    def from_float(cls, linear: torch.nn.Module, per_channel: bool = True,
                   per_row: bool = True) -> "DynamicQuantizedLinear":
        """Symmetric int8 weights: scale = max |w| / 127 per output channel (or per tensor).
        `linear`: a torch.nn.Linear, or transformers' Conv1D (GPT-2's Linear, weight [in, out])."""
        w = linear.weight.detach()
        q, scale = _symmetric_int8(w.t() if _is_hf_conv1d(linear) else w, per_channel)
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


def _is_hf_conv1d(m: torch.nn.Module) -> bool:
    """transformers' Conv1D: a Linear whose weight is stored [in, out] (GPT-2)."""
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers.")


def _is_linear(m: torch.nn.Module) -> bool:
    return type(m) is torch.nn.Linear or _is_hf_conv1d(m)


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
        MultiheadAttention's out_proj keep fp32, as in PyTorch), and transformers' Conv1D
        (GPT-2's Linear layers, which PyTorch's quantize_dynamic leaves in fp32).
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
    count = _swap(model, lambda name, m: _is_linear(m) and (name in names or (
                  torch.nn.Linear in types and (type(m) in types or _is_hf_conv1d(m)))),
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


# ---- static quantization: calibrate ----

_lib.define("quantized_conv2d(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, "
            "float x_scale, int x_zero_point, int[] stride, int[] padding, int[] dilation, "
            "int groups) -> Tensor")


def _quantize_static(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """QuantizeLinear to uint8, as float32 values: saturate(round(x / scale) + zp)."""
    q = torch.round(x.float() / torch.tensor(scale, dtype=torch.float32)) + zero_point
    return torch.clamp(torch.nan_to_num(q, nan=float(zero_point)), 0, 255)


@torch.library.impl(_lib, "quantized_conv2d", "CompositeExplicitAutograd")
def _quantized_conv2d(x, weight, weight_scale, bias, x_scale, x_zero_point, stride, padding,
                      dilation, groups):
    q = _quantize_static(x, x_scale, x_zero_point) - x_zero_point
    # Exact integer sums in float64; zero padding of (x - zp) is padding x with its zero point.
    acc = torch.nn.functional.conv2d(q.double(), weight.double(), None, stride, padding,
                                     dilation, groups).float()
    scale = torch.tensor(x_scale, dtype=torch.float32) * weight_scale.float()
    y = acc * scale.reshape(1, -1, 1, 1)
    if bias is not None:
        y = y + bias.float().reshape(1, -1, 1, 1)
    return y


@torch.library.register_fake("pypto::quantized_conv2d", lib=_lib)
def _quantized_conv2d_fake(x, weight, weight_scale, bias, x_scale, x_zero_point, stride,
                           padding, dilation, groups):
    n, _, h, w = x.shape
    kh, kw = weight.shape[2:]
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return x.new_empty((n, weight.shape[0], oh, ow), dtype=torch.float32)


def _symmetric_int8(w: torch.Tensor, per_channel: bool):
    """w (output channels first) to symmetric int8: (int8 weight, float scale per channel)."""
    w = w.detach().float()
    flat = w.reshape(w.shape[0], -1)
    amax = flat.abs().amax(1) if per_channel else flat.abs().max().reshape(1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    shape = (-1,) + (1,) * (w.dim() - 1)
    q = torch.clamp(torch.round(w / scale.reshape(shape)), -127, 127).to(torch.int8)
    return q, scale


class StaticQuantizedConv2d(torch.nn.Module):
    """A Conv2d with an int8 weight (symmetric, per output channel) and an input quantized to
    uint8 with a scale and zero point fixed by calibration; the output is float:
    float(acc) * (x_scale * w_scale[c]) + bias[c]."""

    def __init__(self, conv: torch.nn.Conv2d, x_min: float, x_max: float,
                 per_channel: bool = True):
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise NotImplementedError(f"pypto.quantization.calibrate: Conv2d with padding "
                                      f"{conv.padding!r} / padding_mode {conv.padding_mode!r}")
        q, scale = _symmetric_int8(conv.weight, per_channel)
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale", scale.expand(conv.out_channels).clone())
        self.register_buffer("bias", None if conv.bias is None else conv.bias.detach().clone())
        lo, hi = min(float(x_min), 0.0), max(float(x_max), 0.0)
        self.x_scale = float(torch.tensor((hi - lo) / 255.0 if hi > lo else 1.0,
                                          dtype=torch.float32))
        self.x_zero_point = int(round(min(max(-lo / self.x_scale, 0.0), 255.0)))
        self.stride, self.padding = list(conv.stride), list(conv.padding)
        self.dilation, self.groups = list(conv.dilation), conv.groups

    def forward(self, x):
        return torch.ops.pypto.quantized_conv2d(x, self.weight, self.weight_scale, self.bias,
                                                self.x_scale, self.x_zero_point, self.stride,
                                                self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[1] * self.groups}, {self.weight.shape[0]}, "
                f"kernel_size={tuple(self.weight.shape[2:])}, stride={tuple(self.stride)}, "
                f"x_scale={self.x_scale:.4g}, x_zero_point={self.x_zero_point}")


def _as_args(batch):
    if isinstance(batch, dict):
        return (), batch
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def _fold_batch_norms(model: torch.nn.Module) -> int:
    """Folds each eval-mode BatchNorm2d that alone reads a Conv2d's output into the conv (as
    torch.ao.quantization.fuse_modules does), found by torch.fx tracing; the BatchNorm becomes an
    Identity. A model fx cannot trace keeps its BatchNorms (they then run as their own kernels).
    Returns how many were folded."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    try:
        traced = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - data-dependent control flow etc.: nothing folded
        return 0
    modules = dict(model.named_modules())
    folded = 0
    for node in traced.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target),
                                                      torch.nn.BatchNorm2d):
            continue
        src = node.args[0] if node.args else None
        if not isinstance(src, torch.fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue
        conv, bn = modules.get(src.target), modules[node.target]
        if type(conv) is not torch.nn.Conv2d or bn.training or not bn.track_running_stats:
            continue
        # Both modules must be used once in the graph (a shared module cannot be rewritten).
        uses = [n.target for n in traced.graph.nodes if n.op == "call_module"]
        if uses.count(src.target) != 1 or uses.count(node.target) != 1:
            continue
        fused = fuse_conv_bn_eval(conv, bn)
        parent_c, _, name_c = src.target.rpartition(".")
        parent_b, _, name_b = node.target.rpartition(".")
        setattr(model.get_submodule(parent_c) if parent_c else model, name_c, fused)
        setattr(model.get_submodule(parent_b) if parent_b else model, name_b,
                torch.nn.Identity())
        folded += 1
    return folded


def calibrate(model: torch.nn.Module, calibration_batches, *, per_channel: bool = True,
              inplace: bool = False) -> torch.nn.Module:
    """Static int8 for convolutional models: runs `calibration_batches` (an iterable of inputs:
    a tensor, a tuple of arguments or a dict of keyword arguments per batch) through the float
    model, records the range of every Conv2d's input, and returns a copy (inplace: the model)
    whose Conv2d layers are StaticQuantizedConv2d: int8 weights per output channel, inputs
    quantized to uint8 with the calibrated scale and zero point, float outputs. Depthwise
    convolutions stay float: they are memory-bound, and as int8 they would add the input's
    quantization and the int32 accumulators' scale pass to a float kernel that fuses its
    epilogue (MobileNetV2, 1 thread: 1.4x slower with them int8, and no more accurate; see
    docs/precision.md). Linear layers stay float too (use quantize_dynamic for them)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"pypto.quantization.calibrate expects a torch.nn.Module, got "
                        f"{type(model).__name__}")
    original = model
    if not inplace:
        model = copy.deepcopy(model)
    _fold_batch_norms(model)

    def selected(m):
        return type(m) is torch.nn.Conv2d and not (m.groups > 1 and m.groups == m.in_channels)

    ranges: dict = {}

    def observe(mod, args):
        x = args[0].detach()
        lo, hi = float(x.min()), float(x.max())
        old = ranges.get(mod)
        ranges[mod] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    hooks = [m.register_forward_pre_hook(observe) for m in model.modules() if selected(m)]
    if not hooks:
        raise ValueError(f"pypto.quantization.calibrate: {type(model).__name__} has no "
                         "torch.nn.Conv2d to quantize (for Linear layers use quantize_dynamic)")
    batches = 0
    try:
        with torch.no_grad():
            for batch in calibration_batches:
                args, kwargs = _as_args(batch)
                model(*args, **kwargs)
                batches += 1
    finally:
        for h in hooks:
            h.remove()
    if batches == 0:
        raise ValueError("pypto.quantization.calibrate: calibration_batches is empty")
    never = [n for n, m in model.named_modules() if selected(m) and m not in ranges]
    if never:
        raise ValueError(f"pypto.quantization.calibrate: the calibration batches never reached "
                         f"{never[:5]}; their input ranges are unknown")
    _swap(model, lambda _, m: m in ranges,
          lambda m: StaticQuantizedConv2d(m, *ranges[m], per_channel=per_channel))
    if not inplace:
        object.__setattr__(model, "_pypto_float_model", original)
    return model
