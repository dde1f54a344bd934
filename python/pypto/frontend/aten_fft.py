"""Converters of torch's FFTs (aten._fft_r2c, _fft_c2c, _fft_c2r: torch.fft.fft/rfft/fftn/...,
and FNet's `fftn(x).real`) into ONNX DFT nodes, one per transformed dim.

A complex value is held as ONNX holds it: a real tensor with a trailing axis of 2 (real,
imaginary), complex64 as float32 and complex128 as float64. Its V keeps torch's complex dtype and
shape (without that axis), so the converters here know it for what it is. The ops that may read
a complex value: the FFTs, view_as_real / view_as_complex (no copy), clone and copies, matmul /
bmm (four real products), sum / mean, and the ops that only move or select elements (view,
permute, slice, cat, slice_scatter, ...: the real op on the [..., 2] tensor, its axes counted in
the complex rank); complex zeros/ones/full are made as [..., 2] constants; arithmetic and math
(exp, log, sqrt, angle, ...) are in aten_complex.py. Any other op on one is a
NotImplementedError that names it (FxImporter.convert asks `complex_converter_for`).

torch's normalization (0: none, 1: 1 / sqrt(n), 2: 1 / n, n the product of the transformed
sizes) is a Mul by a constant; ONNX's inverse DFT divides by its length itself, so an inverse
transform multiplies that back. The transformed sizes must be static."""

from __future__ import annotations

import math

import torch

from .. import dtypes
from .fx_importer import CONVERTERS, V, converter, is_static

aten = torch.ops.aten

_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX = {v: k for k, v in _REAL.items()}

# Converters of ops whose inputs include a complex value, by target.
COMPLEX_CONVERTERS: dict = {}


def complex_converter(*targets):
    """Registers the converter of targets whose inputs include a complex value; an op that only
    ever reads complex values (view_as_real, _fft_c2c) is a plain converter as well."""

    def register(fn):
        for t in targets:
            COMPLEX_CONVERTERS[t] = fn
            CONVERTERS.setdefault(t, fn)
        return fn

    return register


def complex_only(*targets):
    """Registers the converter of targets for the case where an input is complex only; their
    real converters (aten_ops) stay as they are."""

    def register(fn):
        for t in targets:
            COMPLEX_CONVERTERS[t] = fn
        return fn

    return register


def is_complex(x) -> bool:
    return isinstance(x, V) and x.dtype.is_complex


def complex_converter_for(ctx, node, args, kwargs):
    """The converter of `node` when one of its inputs is complex, or a NotImplementedError."""
    fn = COMPLEX_CONVERTERS.get(node.target)
    if fn is None:
        ctx.unsupported("complex tensors can only be read by the FFTs, view_as_real, "
                        "arithmetic (+, -, *, / with complex, real or scalar operands, where), "
                        "abs, angle, conj, neg, exp, log, sqrt, pow by a scalar, reciprocal, "
                        "sgn, matmul/bmm, sum/mean, clone, copy and the ops that move or select "
                        "elements (view, permute, transpose, slice, select, index, flip, roll, "
                        "cat, stack, expand, squeeze, unsqueeze, slice_scatter, select_scatter); "
                        "this op reads one: "
                        "take the real and imaginary parts with torch.view_as_real(...) first")
    return fn


def _real_dtype(x: V) -> torch.dtype:
    if x.dtype not in _REAL:
        raise NotImplementedError(f"complex dtype {x.dtype} (supported: complex64, complex128)")
    return _REAL[x.dtype]


def _complex_out(ctx, node, id) -> V:
    val = node.meta["val"]
    return V(id, val.dtype, tuple(val.shape))


def _sizes(ctx, shape, dims) -> list[int]:
    sizes = [shape[d] for d in dims]
    if not all(is_static(s) for s in sizes):
        ctx.unsupported("an FFT over a dim of symbolic size (the transformed sizes must be "
                        "static; the batch may stay symbolic)")
    return [int(s) for s in sizes]


def _dft(ctx, t, axis: int, inverse=False, onesided=False, length: int | None = None) -> int:
    return ctx.op("DFT", [t, None if length is None else ctx.ints([length]), ctx.ints([axis])],
                  {"inverse": int(inverse), "onesided": int(onesided)})


def _normalize(ctx, t, dtype, normalization: int, n: int, inverse_n: int) -> int:
    """torch's scale (normalization over n points), times the inverse_n ONNX divided by."""
    scale = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}.get(int(normalization))
    if scale is None:
        ctx.unsupported(f"FFT normalization mode {normalization}")
    scale *= inverse_n
    return t if scale == 1.0 else ctx.op("Mul", [t, ctx.constant(scale, dtype)])


def _axes(dims, rank: int) -> list[int]:
    return [d + rank if d < 0 else d for d in dims]


@converter(aten._fft_r2c.default)
def _fft_r2c(ctx, node, x, dim, normalization, onesided):
    """Real to complex: the last dim first (a real [..., 1] signal, one-sided if asked), then the
    others complex to complex."""
    dt = _REAL[node.meta["val"].dtype]
    dims = _axes(dim, x.rank)
    sizes = _sizes(ctx, x.shape, dims)
    t = ctx.op("Unsqueeze", [ctx.as_tensor(x, dt), ctx.ints([-1])])
    t = _dft(ctx, t, dims[-1], onesided=bool(onesided))
    for d in dims[:-1]:
        t = _dft(ctx, t, d)
    return _complex_out(ctx, node, _normalize(ctx, t, dt, normalization, math.prod(sizes), 1))


@complex_converter(aten._fft_c2c.default)
def _fft_c2c(ctx, node, x, dim, normalization, forward):
    dt = _real_dtype(x)
    dims = _axes(dim, x.rank)
    n = math.prod(_sizes(ctx, x.shape, dims))
    t = x.id
    for d in dims:
        t = _dft(ctx, t, d, inverse=not forward)
    return _complex_out(ctx, node, _normalize(ctx, t, dt, normalization, n, 1 if forward else n))


@complex_converter(aten._fft_c2r.default)
def _fft_c2r(ctx, node, x, dim, normalization, last_dim_size):
    """Complex to real: the other dims inverse complex to complex, then the last dim's one-sided
    inverse to `last_dim_size` real points."""
    dt = _real_dtype(x)
    dims = _axes(dim, x.rank)
    sizes = _sizes(ctx, x.shape, dims[:-1]) + [int(last_dim_size)]
    t = x.id
    for d in dims[:-1]:
        t = _dft(ctx, t, d, inverse=True)
    t = _dft(ctx, t, dims[-1], inverse=True, onesided=True, length=int(last_dim_size))
    t = ctx.op("Squeeze", [t, ctx.ints([-1])])
    n = math.prod(sizes)
    return V(_normalize(ctx, t, dt, normalization, n, n), dt, tuple(node.meta["val"].shape))


@complex_converter(aten.view_as_real.default)
def _view_as_real(ctx, node, x):
    return V(x.id, _real_dtype(x), tuple(x.shape) + (2,))


@converter(aten.view_as_complex.default)
def _view_as_complex(ctx, node, x):
    if x.dtype not in _COMPLEX or not x.shape or x.shape[-1] != 2:
        ctx.unsupported(f"view_as_complex of a {x.dtype} tensor of shape {list(x.shape)} "
                        "(expected float32 or float64 with a last dim of 2)")
    return V(x.id, _COMPLEX[x.dtype], tuple(x.shape[:-1]))


@complex_only(aten.clone.default, aten._to_copy.default,
              torch.ops.prims.convert_element_type.default)
def _copy(ctx, node, x, *args, **kwargs):
    to = node.meta["val"].dtype
    if to == x.dtype:
        return _complex_out(ctx, node, ctx.op("Identity", [x]))
    if to not in _REAL:
        ctx.unsupported(f"a copy of a {x.dtype} tensor to {to} (take .real or .abs() first)")
    return _complex_out(ctx, node, ctx.op("Cast", [x.id], {"to": dtypes.onnx_code(_REAL[to])}))


def real_to_pair(ctx, x, dt: torch.dtype) -> int:
    """A real (or integer) tensor as a complex one of real dtype dt: [..., 1] padded to
    [..., 2] with a zero imaginary part."""
    t = ctx.op("Unsqueeze", [ctx.as_tensor(x, dt), ctx.ints([-1])])
    pads = [0] * (x.rank + 1) * 2
    pads[-1] = 1
    return ctx.op("Pad", [t, ctx.ints(pads)])


def to_complex(ctx, node, x) -> V:
    """A real (or integer) tensor cast to a complex dtype."""
    cdt = node.meta["val"].dtype
    if cdt not in _REAL:
        ctx.unsupported(f"complex dtype {cdt} (supported: complex64, complex128)")
    return _complex_out(ctx, node, real_to_pair(ctx, x, _REAL[cdt]))


def _parts(ctx, x) -> tuple[int, int]:
    """(real, imaginary) of a complex operand, as [..., 1] tensors."""
    return ctx.op("Split", [x, ctx.ints([1, 1])], {"axis": -1}, num_outputs=2)


# ---- data movement, products and sums of complex values ----
#
# A complex value of rank r is a real tensor of rank r + 1 whose last axis holds (real,
# imaginary): ops that move, select or sum along the complex dims run as the real op on that
# tensor, their axes counted in the complex rank, the last axis left where it is (torch.stft's
# permute of the frames, a Fourier neural operator's mode slicing, bmm and slice_scatter, the
# Llama reference's rotary embedding as a complex product).


def _as_real(x: V) -> V:
    """The real [..., 2] tensor a complex value is held as."""
    return V(x.id, _real_dtype(x), tuple(x.shape) + (2,))


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _all_complex(ctx, node, xs):
    if not all(is_complex(x) for x in xs) or len({x.dtype for x in xs}) != 1:
        ctx.unsupported("a complex tensor with a real one, or complex tensors of two dtypes "
                        "(make both complex of one dtype first)")


def _on_real(target, ctx, node, x, *args):
    """The real converter of `target` on x's [..., 2] tensor; the result is typed as the node's
    complex output."""
    return CONVERTERS[target](ctx, node, _as_real(x), *args)


@complex_only(aten.permute.default)
def _c_permute(ctx, node, x, dims):
    return _on_real(node.target, ctx, node, x, [_axis(d, x.rank) for d in dims] + [x.rank])


@complex_only(aten.transpose.int)
def _c_transpose(ctx, node, x, d0, d1):
    return _on_real(node.target, ctx, node, x, _axis(d0, x.rank), _axis(d1, x.rank))


@complex_only(aten.unsqueeze.default)
def _c_unsqueeze(ctx, node, x, d):
    return _on_real(node.target, ctx, node, x, _axis(d, x.rank + 1))


@complex_only(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _c_squeeze(ctx, node, x, dims=None):
    if dims is None:
        dims = [i for i, s in enumerate(x.shape) if is_static(s) and s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    return _on_real(node.target, ctx, node, x, [_axis(d, x.rank) for d in dims])


@complex_only(aten.slice.Tensor, aten.slice_copy.Tensor)
def _c_slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    return _on_real(node.target, ctx, node, x, _axis(dim, x.rank), start, end, step)


@complex_only(aten.select.int, aten.select_copy.int)
def _c_select(ctx, node, x, dim, index):
    return _on_real(node.target, ctx, node, x, _axis(dim, x.rank), index)


@complex_only(aten._assert_tensor_metadata.default)
def _c_assert_metadata(ctx, node, *args, **kwargs):  # export's check of a dtype: nothing to run
    return None


@complex_only(aten.flip.default)
def _c_flip(ctx, node, x, dims):
    return _on_real(node.target, ctx, node, x, [_axis(d, x.rank) for d in dims])


@complex_only(aten.index_select.default)
def _c_index_select(ctx, node, x, dim, index):  # torch.roll and fftshift are index_selects
    return _on_real(node.target, ctx, node, x, _axis(dim, x.rank), index)


@complex_only(aten.index.Tensor)
def _c_index(ctx, node, x, indices):  # the [..., 2] axis is past the indexed dims: a ':'
    return _on_real(node.target, ctx, node, x, indices)


@complex_only(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _c_view(ctx, node, x, sizes):
    return _on_real(node.target, ctx, node, x, list(sizes) + [2])


@complex_only(aten.expand.default, aten.expand_copy.default)
def _c_expand(ctx, node, x, sizes):
    sizes = [1 if is_static(s) and s == -1 else s for s in sizes]  # -1: x's size, 1 broadcasts
    return _complex_out(ctx, node, ctx.op("Expand", [x.id, ctx.shape_tensor(sizes + [2])]))


@complex_only(aten.cat.default)
def _c_cat(ctx, node, tensors, dim=0):
    _all_complex(ctx, node, tensors)
    d = _axis(dim, node.meta["val"].dim())
    return _complex_out(ctx, node, ctx.op("Concat", [t.id for t in tensors], {"axis": d}))


@complex_only(aten.stack.default)
def _c_stack(ctx, node, tensors, dim=0):
    _all_complex(ctx, node, tensors)
    d = _axis(dim, node.meta["val"].dim())
    parts = [ctx.op("Unsqueeze", [t.id, ctx.ints([d])]) for t in tensors]
    return _complex_out(ctx, node, ctx.op("Concat", parts, {"axis": d}))


@complex_only(aten.slice_scatter.default)
def _c_slice_scatter(ctx, node, x, src, dim=0, start=None, end=None, step=1):
    _all_complex(ctx, node, [x, src])
    return CONVERTERS[node.target](ctx, node, _as_real(x), _as_real(src), _axis(dim, x.rank),
                                   start, end, step)


@complex_only(aten.select_scatter.default)
def _c_select_scatter(ctx, node, x, src, dim, index):
    _all_complex(ctx, node, [x, src])
    return CONVERTERS[node.target](ctx, node, _as_real(x), _as_real(src), _axis(dim, x.rank),
                                   index)


@complex_only(aten.copy.default, aten.copy_.default)
def _c_copy(ctx, node, dst, src, non_blocking=False):
    _all_complex(ctx, node, [dst, src])
    return CONVERTERS[node.target](ctx, node, _as_real(dst), _as_real(src))


def _sum(onnx_op: str):
    def convert(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
        if dtype is not None and dtype != x.dtype:
            ctx.unsupported(f"a sum of a {x.dtype} tensor in {dtype}")
        if isinstance(dims, int):
            dims = [dims]
        axes = list(range(x.rank)) if not dims else [_axis(d, x.rank) for d in dims]
        if not axes:  # a rank-0 value
            return _complex_out(ctx, node, ctx.op("Identity", [x.id]))
        return _complex_out(ctx, node, ctx.op(onnx_op, [x.id, ctx.ints(axes)],
                                              {"keepdims": int(bool(keepdim))}))

    return convert


complex_only(aten.sum.dim_IntList, aten.sum.default)(_sum("ReduceSum"))
complex_only(aten.mean.dim, aten.mean.default)(_sum("ReduceMean"))


@complex_only(aten.bmm.default, aten.matmul.default, aten.mm.default)
def _c_matmul(ctx, node, a, b):
    """(ar + i ai)(br + i bi): four real products (two where one operand is real)."""
    dt = _REAL[node.meta["val"].dtype]
    last = ctx.ints([-1])

    def parts(x):
        if not is_complex(x):
            return ctx.cast(x, dt), None
        return tuple(ctx.op("Squeeze", [p, last]) for p in _parts(ctx, x))

    (ar, ai), (br, bi) = parts(a), parts(b)

    def mm(p, q):
        return ctx.op("MatMul", [p, q])

    if ai is None:
        re, im = mm(ar, br), mm(ar, bi)
    elif bi is None:
        re, im = mm(ar, br), mm(ai, br)
    else:
        re = ctx.op("Sub", [mm(ar, br), mm(ai, bi)])
        im = ctx.op("Add", [mm(ar, bi), mm(ai, br)])
    both = [ctx.op("Unsqueeze", [p, last]) for p in (re, im)]
    return _complex_out(ctx, node, ctx.op("Concat", both, {"axis": -1}))


def complex_fill(ctx, node, shape_id: int, fill) -> V:
    """A complex tensor of `shape_id`'s shape, every element `fill`: zeros with (re, im) added."""
    dt = _REAL.get(node.meta["val"].dtype)
    if dt is None:
        ctx.unsupported(f"complex dtype {node.meta['val'].dtype} (supported: complex64, "
                        "complex128)")
    z = complex(fill)
    shape = ctx.op("Concat", [shape_id, ctx.ints([2])], {"axis": 0})
    t = ctx.op("ConstantOfShape", [shape], {"value": torch.zeros(1, dtype=dt)})
    if z != 0:
        t = ctx.op("Add", [t, ctx.constant([z.real, z.imag], dt)])
    return _complex_out(ctx, node, t)


@complex_only(aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
              aten.empty_like.default)
def _c_full_like(ctx, node, x, *args, **kwargs):
    name = node.target.__name__
    fill = args[0] if name.startswith("full_like") else (1 if "ones" in name else 0)
    if not isinstance(fill, (int, float, complex)):
        ctx.unsupported("a fill value computed in the graph")
    if not node.meta["val"].dtype.is_complex:
        ctx.unsupported(f"{name} of a complex tensor in {node.meta['val'].dtype}")
    return complex_fill(ctx, node, ctx.shape_tensor(list(x.shape)), fill)
