"""Converters of the ATen ops that write into part of a tensor: what in-place assignments
(``x[:, :c] = y``, ``x[idx] += v``, ``x.scatter_(...)``) become after torch.export functionalizes
them. Each builds a new tensor from the old one and the written part; nothing is in place.

- slice_scatter, step 1: Concat of the part before the slice, the source and the part after it
  (Slice + Concat, so symbolic sizes work); step > 1: ScatterElements with a Range-built index.
- select_scatter: slice_scatter of the source unsqueezed, one index wide.
- index_put: ScatterND on the indexed dims moved first (accumulate: reduction add); a boolean
  mask with one value: Where.
- scatter / scatter_add / scatter_reduce: ScatterElements and its reductions.
- masked_scatter: the k-th true position takes source's k-th element (CumSum + Gather + Where).
"""

from __future__ import annotations

import torch

from .. import dtypes
from .aten_ops import _fill, axis, out, stack_indices
from .fx_importer import INT64_MAX, SymV, V, converter, is_static

aten = torch.ops.aten


def _size(ctx, x: V, d: int) -> int:
    """x's size along d as an int64 [1] tensor (a constant when static)."""
    s = x.shape[d]
    return ctx.ints([int(s)]) if is_static(s) else ctx.op("Shape", [x], {"start": d, "end": d + 1})


def _bound(ctx, x: V, d: int, b, default: int) -> int:
    """A slice bound as torch reads it, in [0, size] as an int64 [1] tensor: None is `default`,
    negative counts from the end, beyond the size clamps."""
    if b is None:
        b = default
    if isinstance(b, SymV):
        return b.id  # a symbolic bound is a size: non-negative
    size = _size(ctx, x, d)
    t = ctx.ints([b])
    if b < 0:
        t = ctx.op("Max", [ctx.op("Add", [size, t]), ctx.ints([0])])
    return ctx.op("Min", [t, size])


@converter(aten.slice_scatter.default)
def _slice_scatter(ctx, node, x, src, dim=0, start=None, end=None, step=1):
    d = axis(dim, x.rank)
    dt = x.dtype
    src_t = ctx.cast(src, dt)
    whole = (start in (None, 0)) and (end is None or (is_static(end) and end >= INT64_MAX))
    if whole and step == 1:
        return out(ctx, node, ctx.op("Identity", [src_t]))  # src is all of x
    lo = _bound(ctx, x, d, start, 0)
    hi = ctx.op("Max", [_bound(ctx, x, d, end, INT64_MAX), lo])  # an empty slice ends at start
    axes = ctx.ints([d])
    if step == 1:
        before = ctx.op("Slice", [x, ctx.ints([0]), lo, axes])
        after = ctx.op("Slice", [x, hi, ctx.ints([INT64_MAX]), axes])
        return out(ctx, node, ctx.op("Concat", [before, src_t, after], {"axis": d}))
    # step > 1: the written positions are Range(lo, hi, step) along d, broadcast to src's shape.
    squeeze0 = ctx.ints([0])
    r = ctx.op("Range", [ctx.op("Squeeze", [lo, squeeze0]), ctx.op("Squeeze", [hi, squeeze0]),
                         ctx.constant(int(step), torch.int64)])
    shape = [1] * x.rank
    shape[d] = -1
    idx = ctx.op("Expand", [ctx.op("Reshape", [r, ctx.ints(shape)]), ctx.op("Shape", [src_t])])
    return out(ctx, node, ctx.op("ScatterElements", [x, idx, src_t], {"axis": d}))


@converter(aten.select_scatter.default)
def _select_scatter(ctx, node, x, src, dim, index):
    d = axis(dim, x.rank)
    u = ctx.value(ctx.op("Unsqueeze", [ctx.cast(src, x.dtype), ctx.ints([d])]), dtype=x.dtype,
                  shape=x.shape[:d] + (1,) + x.shape[d + 1:])
    if isinstance(index, SymV):
        end = SymV(ctx.op("Add", [index.id, ctx.ints([1])]))
    else:
        end = index + 1 if index != -1 else None
    return _slice_scatter(ctx, node, x, u, d, index, end, 1)


@converter(aten.copy.default, aten.copy_.default)
def _copy(ctx, node, dst, src, non_blocking=False):
    """dst's shape and dtype, src's values (broadcast)."""
    s = ctx.cast(src, dst.dtype)
    if tuple(map(str, s.shape)) == tuple(map(str, dst.shape)):
        return out(ctx, node, ctx.op("Identity", [s]))
    return out(ctx, node, ctx.op("Expand", [s, ctx.op("Shape", [dst])]))


@converter(aten.index_put.default, aten.index_put_.default)
def _index_put(ctx, node, x, indices, values, accumulate=False):
    """x[i0, i1, ...] = values (+= with accumulate), with index tensors (None: ':') under numpy's
    rules (see aten_ops._index), or one boolean mask of x's shape with a single value."""
    vals = ctx.cast(values, x.dtype)
    present = [i for i, t in enumerate(indices) if t is not None]
    if len(present) == 1 and indices[present[0]].dtype == torch.bool:
        mask = indices[present[0]]
        if mask.rank != x.rank or accumulate or not _one_value(vals):
            ctx.unsupported("index_put with a boolean mask is supported only for a mask of the "
                            "tensor's shape and a single value, without accumulate")
        one = ctx.op("Reshape", [vals, ctx.ints([])])
        return out(ctx, node, ctx.op("Where", [mask, one, x]))
    if any(indices[i].dtype == torch.bool for i in present):
        ctx.unsupported("index_put mixing boolean masks with other indices")
    # The indexed dims go first (ScatterND indexes leading dims), and come back after.
    rest = [d for d in range(x.rank) if d not in present]
    perm = present + rest
    moved = perm != list(range(x.rank))
    xt = ctx.op("Transpose", [x], {"perm": perm}) if moved else x.id
    stacked, zero = stack_indices(ctx, [indices[i] for i in present])  # B + [k]
    rest_shape = ctx.op("Shape", [xt], {"start": len(present)})
    lead = present[0]
    if present == list(range(lead, present[-1] + 1)) and lead > 0:
        # torch's x[...] shape keeps B in place of consecutive indexed dims: values broadcast
        # there, then B moves first, as ScatterND's updates have it.
        nb = max(indices[i].rank for i in present)
        r_shape = ctx.op("Concat", [ctx.op("Shape", [x], {"start": 0, "end": lead}),
                                    ctx.op("Shape", [zero]),
                                    ctx.op("Shape", [x], {"start": present[-1] + 1})], {"axis": 0})
        upd = ctx.op("Expand", [vals, r_shape])
        order = list(range(lead, lead + nb)) + list(range(lead)) + \
            list(range(lead + nb, nb + len(rest)))
        upd = ctx.op("Transpose", [upd], {"perm": order})
    else:  # B + the other dims
        upd = ctx.op("Expand", [vals, ctx.op("Concat", [ctx.op("Shape", [zero]), rest_shape],
                                             {"axis": 0})])
    attrs = {"reduction": "add"} if accumulate else {}
    y = ctx.op("ScatterND", [xt, stacked, upd], attrs)
    if moved:
        y = ctx.op("Transpose", [y], {"perm": [perm.index(d) for d in range(x.rank)]})
    return out(ctx, node, y)


def _one_value(v: V) -> bool:
    return all(is_static(s) and s == 1 for s in v.shape)


def _updates(ctx, x: V, index: V, src) -> int:
    """ScatterElements' updates: src (which torch allows to be larger than index) cut to index's
    shape, or a scalar src expanded to it."""
    if not isinstance(src, V):
        return ctx.op("Expand", [ctx.constant(src, x.dtype), ctx.op("Shape", [index])])
    upd = ctx.cast(src, x.dtype).id
    if tuple(map(str, src.shape)) == tuple(map(str, index.shape)):
        return upd
    return ctx.op("Slice", [upd, ctx.ints([0] * x.rank), ctx.op("Shape", [index]),
                            ctx.ints(list(range(x.rank)))])


_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


@converter(aten.scatter.src, aten.scatter.value, aten.scatter_add.default,
           aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter(ctx, node, x, dim, index, src, reduce=None):
    d = axis(dim, x.rank)
    add = node.target.__name__.startswith("scatter_add")
    red = "add" if add else {None: "none", "add": "add", "multiply": "mul"}[reduce]
    upd = _updates(ctx, x, index, src)
    attrs = {"axis": d} if red == "none" else {"axis": d, "reduction": red}
    return out(ctx, node, ctx.op("ScatterElements", [x, index, upd], attrs))


@converter(aten.scatter_reduce.two)
def _scatter_reduce(ctx, node, x, dim, index, src, reduce, include_self=True):
    d = axis(dim, x.rank)
    if reduce == "mean":
        ctx.unsupported("scatter_reduce with reduce='mean'")
    red = _REDUCTIONS[reduce]
    base = x.id
    if not include_self:
        # The positions the index writes start from the reduction's identity instead of x.
        ident = {"add": 0, "mul": 1, "max": float("-inf"), "min": float("inf")}[red]
        if not x.dtype.is_floating_point and red in ("max", "min"):
            info = torch.iinfo(x.dtype)
            ident = info.min if red == "max" else info.max
        zeros = _fill(ctx, node, ctx.op("Shape", [x]), False, torch.bool)
        ones = _fill(ctx, node, ctx.op("Shape", [index]), True, torch.bool)
        written = ctx.op("ScatterElements", [zeros, index, ones], {"axis": d})
        base = ctx.op("Where", [written, ctx.constant(ident, x.dtype), x])
    upd = _updates(ctx, x, index, src)
    return out(ctx, node, ctx.op("ScatterElements", [base, index, upd],
                                 {"axis": d, "reduction": red}))



@converter(aten.masked_scatter.default)
def _masked_scatter(ctx, node, x, mask, source):
    shape = ctx.op("Shape", [x])
    m = ctx.op("Expand", [mask, shape])
    flat = ctx.ints([-1])
    count = ctx.op("CumSum", [ctx.op("Cast", [ctx.op("Reshape", [m, flat])],
                                     {"to": dtypes.onnx_code(torch.int64)}),
                              ctx.constant(0, torch.int64)])
    pos = ctx.op("Max", [ctx.op("Sub", [count, ctx.ints([1])]), ctx.ints([0])])
    src = ctx.op("Reshape", [ctx.cast(source, x.dtype), flat])
    picked = ctx.op("Reshape", [ctx.op("Gather", [src, pos], {"axis": 0}), shape])
    return out(ctx, node, ctx.op("Where", [m, picked, x]))
