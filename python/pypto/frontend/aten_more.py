"""More ATen converters, for the ops real-world models reach beyond the common core (issue 14):
log2/log10, atan2, var, diagonal, sort, cdist, embedding_bag, grid_sample, col2im (F.fold),
reflection/replication padding, batch norm with batch statistics, and a named error for the ops
a compiled graph cannot run (.item(), random numbers, training-mode dropout)."""

from __future__ import annotations

import math

import torch

from .. import dtypes
from .aten_complex import atan2_id
from .aten_ops import _batch_norm, _dims, _fill, _float_out, _onnx_pads, axis, out
from .fx_importer import V, converter, is_static

aten = torch.ops.aten


# ---- more math: log2/log10, atan2, var, diagonal ----


def _log_base(base: float):
    def convert(ctx, node, x):
        dt = _float_out(node)
        ln = ctx.op("Log", [ctx.as_tensor(x, dt)])
        return out(ctx, node, ctx.op("Mul", [ln, ctx.constant(1.0 / math.log(base), dt)]))

    return convert


converter(aten.log2.default)(_log_base(2.0))
converter(aten.log10.default)(_log_base(10.0))


@converter(aten.atan2.default)
def _atan2(ctx, node, y, x):
    dt = _float_out(node)
    return out(ctx, node, atan2_id(ctx, ctx.as_tensor(y, dt), ctx.as_tensor(x, dt), dt))


@converter(aten.var.correction, aten.var.dim, aten.var.default)
def _var(ctx, node, x, dims=None, unbiased=None, keepdim=False, *, correction=None):
    """sum((x - mean)^2) / (n - correction), n the count of reduced elements (also symbolic)."""
    if isinstance(unbiased, bool):  # var.dim(x, dim, unbiased, keepdim); var.default(x, unbiased)
        correction = int(unbiased)
    correction = 1 if correction is None else correction
    dt = _float_out(node)
    tx = ctx.as_tensor(x, dt)
    axes = ctx.ints(_dims(ctx, x, dims))
    mean = ctx.op("ReduceMean", [tx, axes], {"keepdims": 1})
    d = ctx.op("Sub", [tx, mean])
    s = ctx.op("ReduceSum", [ctx.op("Mul", [d, d]), axes], {"keepdims": int(bool(keepdim))})
    n = ctx.op("Cast", [ctx.op("Div", [ctx.op("Size", [tx]), ctx.op("Size", [mean])])],
               {"to": dtypes.onnx_code(dt)})
    denom = ctx.op("Sub", [n, ctx.constant(float(correction), dt)])
    return out(ctx, node, ctx.op("Div", [s, denom]))


@converter(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(ctx, node, x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims (dim1, dim2), moved last: those two dims transposed to the end,
    flattened, and the diagonal's elements gathered (their sizes must be static)."""
    d1, d2 = axis(dim1, x.rank), axis(dim2, x.rank)
    n1, n2 = x.shape[d1], x.shape[d2]
    if not (is_static(n1) and is_static(n2)):
        ctx.unsupported("diagonal of symbolic dims")
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    t = ctx.op("Transpose", [x], {"perm": rest + [d1, d2]})
    flat = ctx.op("Reshape", [t, ctx.ints([0] * len(rest) + [-1])])
    r0, c0 = max(0, -offset), max(0, offset)
    length = max(0, min(int(n1) - r0, int(n2) - c0))
    idx = [(i + r0) * int(n2) + i + c0 for i in range(length)]
    return out(ctx, node, ctx.op("Gather", [flat, ctx.constant(idx, torch.int64, (length,))],
                                 {"axis": len(rest)}))


@converter(aten.unfold.default, aten.unfold_copy.default)
def _unfold(ctx, node, x, dim, size, step):
    """Tensor.unfold: the windows [i step, i step + size) of dim, as a new dim of `size` last
    (HaloNet's blocked attention): a Gather of the window indices [windows, size] on dim, then
    the window's positions moved to the end. dim's length must be static."""
    if x.rank == 0:
        ctx.unsupported("unfold of a 0-d tensor")
    d = axis(dim, x.rank)
    length = x.shape[d]
    if not is_static(length):
        ctx.unsupported("unfold of a symbolic dim")
    windows = (int(length) - size) // step + 1
    idx = [[i * step + j for j in range(size)] for i in range(windows)]
    g = ctx.op("Gather", [x, ctx.constant(idx, torch.int64, (windows, size))], {"axis": d})
    if d == x.rank - 1:
        return out(ctx, node, g)
    perm = list(range(d + 1)) + list(range(d + 2, x.rank + 1)) + [d + 1]
    return out(ctx, node, ctx.op("Transpose", [g], {"perm": perm}))


@converter(aten.sort.default, aten.sort.stable)
def _sort(ctx, node, x, *args, stable=None, dim=-1, descending=False):
    """TopK with k = the dim's size (ties may order their indices differently from torch)."""
    if node.target == aten.sort.default and args:
        dim, descending = (list(args) + [descending])[:2]
    elif args:  # sort.stable(x, *, stable, dim, descending) has no positionals past x
        dim = args[0]
    d = axis(dim, x.rank)
    vals = node.meta["val"]
    k = ctx.op("Shape", [x], {"start": d, "end": d + 1})
    v, i = ctx.op("TopK", [x, k], {"axis": d, "largest": int(bool(descending)), "sorted": 1},
                  num_outputs=2)
    return [V(v, vals[0].dtype, vals[0].shape), V(i, vals[1].dtype, vals[1].shape)]


@converter(aten._cdist_forward.default)
def _cdist(ctx, node, a, b, p, compute_mode=None):
    """p-norm distances of every row pair, from the differences themselves (exact, not the
    |a|^2 + |b|^2 - 2ab expansion torch may use for p = 2)."""
    d = ctx.op("Sub", [ctx.op("Unsqueeze", [a, ctx.ints([-2])]),
                       ctx.op("Unsqueeze", [b, ctx.ints([-3])])])  # [..., P, R, M]
    last = ctx.ints([-1])
    keep = {"keepdims": 0}
    if p == 1:
        return out(ctx, node, ctx.op("ReduceSum", [ctx.op("Abs", [d]), last], keep))
    if p == 2:
        return out(ctx, node, ctx.op("Sqrt", [ctx.op("ReduceSum", [ctx.op("Mul", [d, d]), last],
                                                     keep)]))
    if p == float("inf"):
        return out(ctx, node, ctx.op("ReduceMax", [ctx.op("Abs", [d]), last], keep))
    if p <= 0:
        ctx.unsupported(f"cdist with p={p}")
    s = ctx.op("ReduceSum", [ctx.op("Pow", [ctx.op("Abs", [d]), ctx.constant(float(p), a.dtype)]),
                             last], keep)
    return out(ctx, node, ctx.op("Pow", [s, ctx.constant(1.0 / p, a.dtype)]))


@converter(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(ctx, node, weight, indices, offsets, scale_grad_by_freq=False, mode=0,
                   sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=-1):
    """nn.EmbeddingBag (1-D indices with offsets): the rows gathered, each index's bag = the
    count of bag starts at or before it, minus 1, and the rows reduced into their bags with
    ScatterElements (sum, mean, max; an empty bag is 0). Only output 0 is made."""
    if indices.rank != 1 or (padding_idx is not None and padding_idx >= 0):
        ctx.unsupported("embedding_bag with 2-D indices or a padding_idx")
    dt = weight.dtype
    rows = ctx.op("Gather", [weight, indices], {"axis": 0})  # [N, D]
    if per_sample_weights is not None:
        rows = ctx.op("Mul", [rows, ctx.op("Unsqueeze", [per_sample_weights, ctx.ints([1])])])
    starts = offsets.id if not include_last_offset else \
        ctx.op("Slice", [offsets, ctx.ints([0]), ctx.ints([-1]), ctx.ints([0])])
    i64 = dtypes.onnx_code(torch.int64)
    n = ctx.op("Squeeze", [ctx.op("Shape", [indices]), ctx.ints([0])])
    pos = ctx.op("Range", [ctx.constant(0, torch.int64), n, ctx.constant(1, torch.int64)])
    starts64 = ctx.op("Cast", [starts], {"to": i64})
    started = ctx.op("LessOrEqual", [ctx.op("Unsqueeze", [starts64, ctx.ints([0])]),
                                     ctx.op("Unsqueeze", [pos, ctx.ints([1])])])  # [N, B]
    bag = ctx.op("Sub", [ctx.op("ReduceSum", [ctx.op("Cast", [started], {"to": i64}),
                                              ctx.ints([1])], {"keepdims": 0}), ctx.ints([1])])
    idx = ctx.op("Expand", [ctx.op("Unsqueeze", [bag, ctx.ints([1])]), ctx.op("Shape", [rows])])
    bags = ctx.op("Concat", [ctx.op("Shape", [starts]), ctx.op("Shape", [weight], {"start": 1})],
                  {"axis": 0})  # [B, D]
    red = {0: "add", 1: "add", 2: "max"}[mode]
    init = _fill(ctx, node, bags, float("-inf") if mode == 2 else 0.0, dt)
    y = ctx.op("ScatterElements", [init, idx, rows], {"axis": 0, "reduction": red})
    if mode != 0:  # mean divides by, max zeroes empty bags by, the bag sizes
        ones = _fill(ctx, node, ctx.op("Shape", [rows]), 1.0, dt)
        count = ctx.op("ScatterElements", [_fill(ctx, node, bags, 0.0, dt), idx, ones],
                       {"axis": 0, "reduction": "add"})
        zero = ctx.constant(0.0, dt)
        if mode == 1:
            y = ctx.op("Div", [y, ctx.op("Max", [count, ctx.constant(1.0, dt)])])
        else:
            y = ctx.op("Where", [ctx.op("Greater", [count, zero]), y, zero])
    val = node.meta["val"][0]
    return [V(y, val.dtype, val.shape), None, None, None]


@converter(aten.grid_sampler_2d.default)
def _grid_sampler_2d(ctx, node, x, grid, interpolation_mode, padding_mode, align_corners):
    modes = ["linear", "nearest", "cubic"]
    pads = ["zeros", "border", "reflection"]
    xin, g = x.id, ctx.cast(grid, x.dtype).id
    if (modes[interpolation_mode], pads[padding_mode]) == ("cubic", "border"):
        xin, g = _bicubic_border(ctx, x, g, align_corners)
    return out(ctx, node, ctx.op("GridSample", [xin, g], {
        "mode": modes[interpolation_mode], "padding_mode": pads[padding_mode],
        "align_corners": int(bool(align_corners))}))


def _bicubic_border(ctx, x, grid, align_corners):
    """PyTorch's bicubic border mode clamps each of the 4x4 taps; ONNX's GridSample clamps the
    sample point first. They agree once the image is edge-padded by the taps' reach (2 pixels)
    and the grid rescaled so every point keeps its pixel: inside the padding ONNX's per-tap
    border reads equal PyTorch's clamped taps, and beyond it every tap is the edge value in
    both. Unnormalizing g over W gives x; over W + 4 it must give x + 2, so g' = g * W / (W + 4)
    (align_corners: g * (W - 1) / (W + 3))."""
    h, w = x.shape[-2], x.shape[-1]
    if not (isinstance(h, int) and isinstance(w, int)):
        ctx.unsupported("grid_sample bicubic with border padding on a symbolic image size")
    scale = [(w - 1) / (w + 3), (h - 1) / (h + 3)] if align_corners else [w / (w + 4), h / (h + 4)]
    padded = ctx.op("Pad", [x, ctx.ints([0, 0, 2, 2, 0, 0, 2, 2])], {"mode": "edge"})
    return padded, ctx.op("Mul", [grid, ctx.constant(scale, x.dtype)])


@converter(aten.col2im.default)
def _col2im(ctx, node, x, output_size, kernel_size, dilation, padding, stride):
    """F.fold: Col2Im (a batch-less [C*k, L] input gets a batch of 1 and loses it again)."""
    xin = x.id if x.rank == 3 else ctx.op("Unsqueeze", [x, ctx.ints([0])])
    y = ctx.op("Col2Im", [xin, ctx.ints(output_size), ctx.ints(kernel_size)], {
        "dilations": list(dilation), "pads": list(padding) * 2, "strides": list(stride)})
    return out(ctx, node, y if x.rank == 3 else ctx.op("Squeeze", [y, ctx.ints([0])]))


# ---- padding modes, batch norm with batch statistics ----


def _mode_pad(mode: str):
    def convert(ctx, node, x, padding):
        pads = _onnx_pads(x, padding)
        if any(p < 0 for p in pads):
            ctx.unsupported("negative padding")
        return out(ctx, node, ctx.op("Pad", [x, ctx.ints(pads)], {"mode": mode}))

    return convert


converter(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
          aten.reflection_pad3d.default)(_mode_pad("reflect"))
converter(aten.replication_pad1d.default, aten.replication_pad2d.default,
          aten.replication_pad3d.default)(_mode_pad("edge"))


@converter(aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
           aten._native_batch_norm_legit_functional.default)
def _batch_norm_legit(ctx, node, x, w, b, *args):
    """Batch norm; with training=True, over the batch's own statistics (biased variance), with
    the saved mean and 1/std as outputs 1 and 2 (and, for the functional form, the updated
    running mean and variance as outputs 3 and 4, as a train-mode module's forward makes them)."""
    if node.target == aten._native_batch_norm_legit.no_stats:
        mean = var = None
        training, momentum, eps = args
    else:
        mean, var, training, momentum, eps = args
    vals = node.meta["val"]
    functional = node.target == aten._native_batch_norm_legit_functional.default
    if not training:
        y = _batch_norm(ctx, node, x, w, b, mean, var, momentum, eps)[0]
        return [y, None, None] + ([mean, var] if functional else [])
    axes = ctx.ints([0] + list(range(2, x.rank)))
    mu = ctx.op("ReduceMean", [x, axes], {"keepdims": 1})
    d = ctx.op("Sub", [x, mu])
    v = ctx.op("ReduceMean", [ctx.op("Mul", [d, d]), axes], {"keepdims": 1})
    rstd = ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.op("Add", [v, ctx.constant(eps, x.dtype)])])])
    y = ctx.op("Mul", [d, rstd])
    per_channel = ctx.ints([-1] + [1] * (x.rank - 2))
    if w is not None:
        y = ctx.op("Mul", [y, ctx.op("Reshape", [w, per_channel])])
    if b is not None:
        y = ctx.op("Add", [y, ctx.op("Reshape", [b, per_channel])])
    flat = ctx.ints([-1])
    mu, v = ctx.op("Reshape", [mu, flat]), ctx.op("Reshape", [v, flat])
    outs = [V(y, vals[0].dtype, vals[0].shape), V(mu, vals[1].dtype, vals[1].shape),
            V(ctx.op("Reshape", [rstd, flat]), vals[2].dtype, vals[2].shape)]
    if functional:  # running = (1 - momentum) * running + momentum * batch (unbiased variance)
        n = ctx.op("Cast", [ctx.op("Div", [ctx.op("Size", [x]), ctx.op("Size", [mu])])],
                   {"to": dtypes.onnx_code(x.dtype)})
        unbiased = ctx.op("Div", [ctx.op("Mul", [v, n]),
                                  ctx.op("Sub", [n, ctx.constant(1.0, x.dtype)])])
        keep, m = ctx.constant(1.0 - momentum, x.dtype), ctx.constant(momentum, x.dtype)
        for run, batch, val in ((mean, mu, vals[3]), (var, unbiased, vals[4])):
            new = ctx.op("Add", [ctx.op("Mul", [run, keep]), ctx.op("Mul", [batch, m])])
            outs.append(V(new, val.dtype, val.shape))
    return outs


# ---- ops PyPTO cannot compile, with the reason ----

_CANNOT = {
    aten._local_scalar_dense.default:
        "tensor.item() (or int()/float()/bool() of a tensor) reads a value back into Python, "
        "which a compiled graph cannot do; keep the value a tensor, or compute it outside the "
        "module",
    aten.rand.default: "random numbers (torch.rand): a compiled graph is deterministic; pass the "
                       "noise in as an input",
    aten.randn.default: "random numbers (torch.randn): a compiled graph is deterministic; pass "
                        "the noise in as an input",
    aten.randperm.default: "a random permutation (torch.randperm): pass it in as an input",
    aten.native_dropout.default: "dropout in training mode; PyPTO compiles for inference: call "
                                 "model.eval()",
}


def _cannot(ctx, node, *args, **kwargs):
    ctx.unsupported(_CANNOT[node.target])


for _t in _CANNOT:
    converter(_t)(_cannot)
