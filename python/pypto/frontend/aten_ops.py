"""ATen op -> Tensor Graph converters, one small function per op (or family of ops).

Each converter gets the importer, the FX node (whose FakeTensor metadata gives the output's dtype
and shape) and the node's arguments with FX nodes replaced by ``V`` (tensors), ``SymV`` (symbolic
sizes) or plain Python values. It builds nodes with ``ctx.op`` and returns a ``V`` (or a list of
them for multi-output ops). The set covers torch's core ATen opset as models use it after
``torch.export``'s default decompositions.
"""

from __future__ import annotations

import math
import operator

import torch

from .. import dtypes
from .fx_importer import INT64_MAX, FxImporter, SymV, V, converter, is_static

aten = torch.ops.aten


# ---- helpers ----


def _rep(x):
    """A stand-in for torch.result_type: dimensioned and 0-dim tensors promote differently."""
    if isinstance(x, V):
        return torch.empty((1,) if x.rank else (), dtype=x.dtype)
    if isinstance(x, SymV):
        return 1
    return x


def promote(*xs) -> torch.dtype:
    """torch's type promotion over the operands as they are in the graph."""
    reps = [_rep(x) for x in xs if x is not None]
    if len(reps) == 1:
        r = reps[0]
        return r.dtype if isinstance(r, torch.Tensor) else torch.result_type(torch.empty(()), r)
    out = reps[0]
    for r in reps[1:]:
        dt = torch.result_type(out, r)
        out = torch.empty((1,), dtype=dt) if any(isinstance(z, torch.Tensor) and z.dim()
                                                 for z in (out, r)) else torch.empty((), dtype=dt)
    return out.dtype


def out(ctx: FxImporter, node, id) -> V:
    return ctx.value(id, like=node)


def axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _float_out(node) -> torch.dtype:
    return node.meta["val"].dtype


# ---- elementwise arithmetic with torch's promotion ----


# On bools torch's mul and minimum are a logical and, add and maximum a logical or (masks
# combined as `a * b`, as Hugging Face models do); ONNX's Mul, Add, Max and Min take no bools.
_ON_BOOLS = {"Mul": "And", "Min": "And", "Add": "Or", "Max": "Or"}


def _arith(onnx_op):
    def convert(ctx, node, a, b, alpha=1):
        dt = _float_out(node)
        op = _ON_BOOLS.get(onnx_op, onnx_op) if dt == torch.bool else onnx_op
        if alpha != 1 and dt != torch.bool:
            b = V(ctx.op("Mul", [ctx.as_tensor(b, dt), ctx.as_tensor(alpha, dt)]), dt, ())
        return out(ctx, node, ctx.op(op, [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)]))

    return convert


converter(aten.add.Tensor, aten.add.Scalar)(_arith("Add"))
converter(aten.sub.Tensor, aten.sub.Scalar)(_arith("Sub"))
converter(aten.mul.Tensor, aten.mul.Scalar)(_arith("Mul"))
converter(aten.maximum.default)(_arith("Max"))
converter(aten.minimum.default)(_arith("Min"))


@converter(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):
    dt = _float_out(node)
    if alpha != 1:
        a = V(ctx.op("Mul", [ctx.as_tensor(a, dt), ctx.as_tensor(alpha, dt)]), dt, ())
    return out(ctx, node, ctx.op("Sub", [ctx.as_tensor(b, dt), ctx.as_tensor(a, dt)]))


@converter(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(ctx, node, a, b, rounding_mode=None):
    dt = _float_out(node)
    if rounding_mode is None or dt.is_floating_point:
        q = ctx.op("Div", [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)])
        if rounding_mode == "floor":
            q = ctx.op("Floor", [q])
        elif rounding_mode == "trunc":
            q = _trunc(ctx, q)
        return out(ctx, node, q)
    # Integer division with a rounding mode: compute in double (exact for |x| < 2^53), round.
    fa, fb = ctx.as_tensor(a, torch.float64), ctx.as_tensor(b, torch.float64)
    q = ctx.op("Div", [fa, fb])
    q = ctx.op("Floor", [q]) if rounding_mode == "floor" else _trunc(ctx, q)
    return out(ctx, node, ctx.op("Cast", [q], {"to": dtypes.onnx_code(dt)}))


def _trunc(ctx, q):
    # trunc(x) = sign(x) * floor(|x|)
    return ctx.op("Mul", [ctx.op("Sign", [q]), ctx.op("Floor", [ctx.op("Abs", [q])])])


@converter(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(ctx, node, a, b):
    dt = _float_out(node)
    if not dt.is_floating_point:  # Python semantics (sign of the divisor) = ONNX Mod fmod=0
        return out(ctx, node, ctx.op("Mod", [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)]))
    ta, tb = ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)
    fl = ctx.op("Floor", [ctx.op("Div", [ta, tb])])
    return out(ctx, node, ctx.op("Sub", [ta, ctx.op("Mul", [fl, tb])]))


@converter(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(ctx, node, a, b):
    dt = _float_out(node)
    fmod = 1 if dt.is_floating_point else 0
    if not dt.is_floating_point:
        # C truncation semantics for ints: a - trunc(a / b) * b
        fa, fb = ctx.as_tensor(a, torch.float64), ctx.as_tensor(b, torch.float64)
        t = _trunc(ctx, ctx.op("Div", [fa, fb]))
        r = ctx.op("Sub", [fa, ctx.op("Mul", [t, fb])])
        return out(ctx, node, ctx.op("Cast", [r], {"to": dtypes.onnx_code(dt)}))
    return out(ctx, node, ctx.op("Mod", [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)],
                                 {"fmod": fmod}))


@converter(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(ctx, node, a, b):
    dt = _float_out(node)
    if is_static(b) and b == 2:
        ta = ctx.as_tensor(a, dt)
        return out(ctx, node, ctx.op("Mul", [ta, ta]))
    if is_static(b) and b == 0.5 and dt.is_floating_point:
        return out(ctx, node, ctx.op("Sqrt", [ctx.as_tensor(a, dt)]))
    return out(ctx, node, ctx.op("Pow", [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)]))


def _compare(onnx_op, negate=False):
    def convert(ctx, node, a, b):
        dt = promote(a, b)
        r = ctx.op(onnx_op, [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)])
        return out(ctx, node, ctx.op("Not", [r]) if negate else r)

    return convert


converter(aten.eq.Tensor, aten.eq.Scalar)(_compare("Equal"))
converter(aten.ne.Tensor, aten.ne.Scalar)(_compare("Equal", negate=True))
converter(aten.lt.Tensor, aten.lt.Scalar)(_compare("Less"))
converter(aten.le.Tensor, aten.le.Scalar)(_compare("LessOrEqual"))
converter(aten.gt.Tensor, aten.gt.Scalar)(_compare("Greater"))
converter(aten.ge.Tensor, aten.ge.Scalar)(_compare("GreaterOrEqual"))


def _logical(onnx_op):
    def convert(ctx, node, a, b):
        return out(ctx, node, ctx.op(onnx_op, [ctx.as_tensor(a, torch.bool),
                                              ctx.as_tensor(b, torch.bool)]))

    return convert


converter(aten.logical_and.default)(_logical("And"))
converter(aten.logical_or.default)(_logical("Or"))
converter(aten.logical_xor.default)(_logical("Xor"))


@converter(aten.logical_not.default)
def _logical_not(ctx, node, a):
    return out(ctx, node, ctx.op("Not", [ctx.as_tensor(a, torch.bool)]))


@converter(aten.bitwise_not.default)
def _bitwise_not(ctx, node, a):
    return out(ctx, node, ctx.op("Not" if a.dtype == torch.bool else "BitwiseNot", [a]))


@converter(aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor,
           aten.bitwise_and.Scalar, aten.bitwise_or.Scalar, aten.bitwise_xor.Scalar)
def _bitwise(ctx, node, a, b):
    dt = _float_out(node)
    kind = node.target.__name__.split(".")[0].split("_")[1]  # and / or / xor
    op = {"and": "And", "or": "Or", "xor": "Xor"}[kind] if dt == torch.bool else \
        {"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}[kind]
    return out(ctx, node, ctx.op(op, [ctx.as_tensor(a, dt), ctx.as_tensor(b, dt)]))


@converter(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, node, cond, a, b):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("Where", [ctx.as_tensor(cond, torch.bool), ctx.as_tensor(a, dt),
                                           ctx.as_tensor(b, dt)]))


@converter(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx, node, x, mask, value):
    dt = x.dtype
    return out(ctx, node, ctx.op("Where", [ctx.as_tensor(mask, torch.bool),
                                           ctx.as_tensor(value, dt), x]))


# ---- elementwise unary ----

_UNARY = {
    aten.relu.default: "Relu",
    aten.sigmoid.default: "Sigmoid",
    aten.tanh.default: "Tanh",
    aten.exp.default: "Exp",
    aten.log.default: "Log",
    aten.sqrt.default: "Sqrt",
    aten.abs.default: "Abs",
    aten.neg.default: "Neg",
    aten.reciprocal.default: "Reciprocal",
    aten.erf.default: "Erf",
    aten.sin.default: "Sin",
    aten.cos.default: "Cos",
    aten.tan.default: "Tan",
    aten.asin.default: "Asin",
    aten.acos.default: "Acos",
    aten.atan.default: "Atan",
    aten.sinh.default: "Sinh",
    aten.cosh.default: "Cosh",
    aten.asinh.default: "Asinh",
    aten.acosh.default: "Acosh",
    aten.atanh.default: "Atanh",
    aten.floor.default: "Floor",
    aten.ceil.default: "Ceil",
    aten.round.default: "Round",
    aten.sign.default: "Sign",
    aten.isnan.default: "IsNaN",
    aten.hardswish.default: "HardSwish",
    aten.mish.default: "Mish",
    aten.clone.default: "Identity",
    aten.alias.default: "Identity",
    aten.detach.default: "Identity",
    aten.lift_fresh_copy.default: "Identity",
    aten.contiguous.default: "Identity",
}


def _unary(onnx_op):
    def convert(ctx, node, x, *args, **kwargs):
        dt = _float_out(node)
        return out(ctx, node, ctx.op(onnx_op, [ctx.as_tensor(x, dt)]))

    return convert


for _t, _op in _UNARY.items():
    converter(_t)(_unary(_op))


@converter(aten.isinf.default)
def _isinf(ctx, node, x):
    return out(ctx, node, ctx.op("IsInf", [x]))


@converter(aten.rsqrt.default)
def _rsqrt(ctx, node, x):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("Reciprocal", [ctx.op("Sqrt", [ctx.as_tensor(x, dt)])]))


@converter(aten.log1p.default)
def _log1p(ctx, node, x):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("Log", [ctx.op("Add", [ctx.as_tensor(x, dt),
                                                       ctx.constant(1, dt)])]))


@converter(aten.expm1.default)
def _expm1(ctx, node, x):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("Sub", [ctx.op("Exp", [ctx.as_tensor(x, dt)]),
                                         ctx.constant(1, dt)]))


@converter(aten.trunc.default)
def _trunc_op(ctx, node, x):
    return out(ctx, node, _trunc(ctx, x.id))


@converter(aten.silu.default)
def _silu(ctx, node, x):
    return out(ctx, node, ctx.op("Mul", [x, ctx.op("Sigmoid", [x])]))


@converter(aten.gelu.default)
def _gelu(ctx, node, x, approximate="none"):
    return out(ctx, node, ctx.op("Gelu", [x], {"approximate": approximate}))


@converter(aten.hardsigmoid.default)
def _hardsigmoid(ctx, node, x):
    return out(ctx, node, ctx.op("HardSigmoid", [x], {"alpha": 1.0 / 6, "beta": 0.5}))


@converter(aten.hardtanh.default, aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default,
           aten.clamp_max.default, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(ctx, node, x, lo=None, hi=None):
    name = node.target.__name__
    if name.startswith("clamp_max"):
        lo, hi = None, lo
    if name.startswith("hardtanh"):
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    dt = _float_out(node)
    tx = ctx.as_tensor(x, dt)
    # Clip's bounds are scalars; a tensor bound (clamp.Tensor) broadcasts, so use Max/Min.
    if isinstance(lo, V) or isinstance(hi, V):
        if lo is not None:
            tx = ctx.op("Max", [tx, ctx.as_tensor(lo, dt)])
        if hi is not None:
            tx = ctx.op("Min", [tx, ctx.as_tensor(hi, dt)])
        return out(ctx, node, tx)
    lo_id = None if lo is None else ctx.constant(lo, dt)
    hi_id = None if hi is None else ctx.constant(hi, dt)
    return out(ctx, node, ctx.op("Clip", [tx, lo_id, hi_id]))


@converter(aten.leaky_relu.default)
def _leaky_relu(ctx, node, x, slope=0.01):
    return out(ctx, node, ctx.op("LeakyRelu", [x], {"alpha": float(slope)}))


@converter(aten.elu.default)
def _elu(ctx, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale != 1.0 or input_scale != 1.0:
        ctx.unsupported("elu with scale or input_scale != 1")
    return out(ctx, node, ctx.op("Elu", [x], {"alpha": float(alpha)}))


@converter(aten.softplus.default)
def _softplus(ctx, node, x, beta=1, threshold=20):
    if beta != 1:
        ctx.unsupported("softplus with beta != 1")
    # torch returns x itself above the threshold; Softplus is within rounding of it there.
    return out(ctx, node, ctx.op("Softplus", [x]))


@converter(aten._to_copy.default, aten.to.dtype, torch.ops.prims.convert_element_type.default)
def _to_copy(ctx, node, x, *args, dtype=None, **kwargs):
    dt = _float_out(node)
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        ctx.unsupported(f"copy to device {dev}")
    if dt.is_complex:
        return aten_fft.to_complex(ctx, node, x)
    return out(ctx, node, ctx.cast(x, dt).id if dt != x.dtype else ctx.op("Identity", [x]))


@converter(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
           aten.sym_constrain_range_for_size.default, aten._assert_async.msg)
def _assert(ctx, node, *args, **kwargs):
    return None


# ---- creation ----


def _fill(ctx, node, shape_id, value, dt):
    value_t = torch.tensor([value], dtype=dt)
    return ctx.op("ConstantOfShape", [shape_id], {"value": value_t})


@converter(aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
           aten.scalar_tensor.default, aten.new_full.default, aten.new_zeros.default,
           aten.new_ones.default, aten.new_empty.default, aten.empty_strided.default)
def _full(ctx, node, *args, **kwargs):
    name = node.target.__name__
    val = node.meta["val"]
    if name.startswith("new_"):
        args = args[1:]
    if name.startswith("scalar_tensor"):
        if val.dtype.is_complex:  # a [2] tensor of (real, imaginary)
            from .aten_fft import complex_fill

            return complex_fill(ctx, node, ctx.ints([]), args[0])
        return out(ctx, node, ctx.constant(args[0], val.dtype))
    size = args[0]
    if name.startswith("full") or name.startswith("new_full"):
        fill = args[1]
    elif "zeros" in name or "empty" in name:
        fill = 0
    else:
        fill = 1
    if isinstance(fill, (V, SymV)):
        ctx.unsupported("a fill value computed in the graph")
    if val.dtype.is_complex:  # a [..., 2] tensor of (real, imaginary) pairs
        from .aten_fft import complex_fill

        return complex_fill(ctx, node, ctx.shape_tensor(size), fill)
    return out(ctx, node, _fill(ctx, node, ctx.shape_tensor(size), fill, val.dtype))


@converter(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
           aten.empty_like.default, aten.fill.Scalar)
def _full_like(ctx, node, x, *args, **kwargs):
    name = node.target.__name__
    fill = args[0] if name.startswith(("full_like", "fill")) else (1 if "ones" in name else 0)
    if isinstance(fill, (V, SymV)):
        ctx.unsupported("a fill value computed in the graph")
    dt = _float_out(node)
    return out(ctx, node, _fill(ctx, node, ctx.op("Shape", [x]), fill, dt))


@converter(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx, node, *args, **kwargs):
    name = node.target.__name__
    if name == "arange.default" or (name == "arange" and len(args) == 1):
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    dt = _float_out(node)
    # ONNX's Range takes int16/32/64 and float/double: other types count in int64 (float for
    # half floats) and are cast (transformers' chunked delta rule builds a uint8 arange).
    wide = dt
    if dt not in (torch.int16, torch.int32, torch.int64, torch.float32, torch.float64):
        wide = torch.float32 if dt.is_floating_point else torch.int64
    ids = [ctx.as_tensor(v, wide) for v in (start, end, step)]
    y = ctx.op("Range", ids)
    if wide != dt:
        y = ctx.op("Cast", [y], {"to": dtypes.onnx_code(dt)})
    return out(ctx, node, y)


# ---- shape and layout ----


def _meta_ints(args) -> list:
    """Size arguments as torch's metadata has them (FX nodes -> their SymInt values)."""
    return [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]


def _same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(str(p) == str(q) if not (is_static(p) and is_static(q))
                                    else p == q for p, q in zip(a, b))


def _reshape_target(ctx, x: V, sizes) -> int:
    """A Reshape shape input for torch sizes that may hold SymVs."""
    sizes = list(sizes)
    dynamic = [i for i, s in enumerate(sizes) if not is_static(s)]
    if len(dynamic) == 1 and -1 not in sizes and all(s != 0 for s in sizes if is_static(s)):
        sizes[dynamic[0]] = -1  # the one symbolic size is what the others leave
        return ctx.ints(sizes)
    return ctx.shape_tensor(sizes)


@converter(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx, node, x, sizes):
    if x.pending and x.broadcast_of is not None and _same_sizes(_meta_ints(node.args[1]),
                                                                x.shape):
        return x  # a no-op view of a pending broadcast stays pending
    attrs = {"allowzero": 1} if any(is_static(s) and s == 0 for s in sizes) else {}
    return out(ctx, node, ctx.op("Reshape", [x, _reshape_target(ctx, x, sizes)], attrs))


@converter(aten.permute.default)
def _permute(ctx, node, x, dims):
    perm = [axis(d, x.rank) for d in dims]
    if perm == [1, 0]:
        return _transposed(ctx, node, x)
    return out(ctx, node, ctx.op("Transpose", [x], {"perm": perm}))


@converter(aten.t.default)
def _t(ctx, node, x):
    if x.rank == 2:
        return _transposed(ctx, node, x)
    return out(ctx, node, ctx.op("Transpose", [x], {"perm": list(range(x.rank))[::-1]}))


def _transposed(ctx, node, x: V) -> V:
    """A 2-D transpose, emitted only if a consumer cannot absorb it (Gemm takes transB)."""
    val = node.meta["val"]
    return V(None, val.dtype, val.shape, emit=lambda: ctx.op("Transpose", [x], {"perm": [1, 0]}),
             transpose_of=x)


@converter(aten.transpose.int)
def _transpose(ctx, node, x, d0, d1):
    perm = list(range(x.rank))
    a, b = axis(d0, x.rank), axis(d1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return out(ctx, node, ctx.op("Transpose", [x], {"perm": perm}))


@converter(aten.expand.default, aten.expand_copy.default)
def _expand(ctx, node, x, sizes, implicit=False):
    sizes = list(sizes)
    off = len(sizes) - x.rank
    meta = node.meta["val"].shape
    keeps_matrix = x.rank >= 2 and off >= 0 and all(
        (is_static(t) and t == -1) or _same_sizes([t], [d]) for t, d in zip(sizes[-2:], x.shape[-2:]))
    for i, s in enumerate(sizes):
        j = i - off
        if is_static(s):
            if s == -1:
                sizes[i] = 1  # keep the input's size: 1 broadcasts to it
            continue
        # A symbolic target that is the input's own size there is a no-op: 1 broadcasts to it.
        if j >= 0 and isinstance(x.shape[j], torch.SymInt) and str(x.shape[j]) == str(meta[i]):
            sizes[i] = 1
    emit = lambda: ctx.op("Expand", [x, ctx.shape_tensor(sizes)])  # noqa: E731
    if keeps_matrix:
        # Only batch dims grow: a matmul consumer broadcasts them itself (see _matmul).
        return V(None, node.meta["val"].dtype, meta, emit=emit, broadcast_of=x)
    return out(ctx, node, emit())


@converter(aten.unsqueeze.default)
def _unsqueeze(ctx, node, x, d):
    return out(ctx, node, ctx.op("Unsqueeze", [x, ctx.ints([axis(d, x.rank + 1)])]))


@converter(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(ctx, node, x, dims=None):
    if dims is None:
        dims = [i for i, s in enumerate(x.shape) if is_static(s) and s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    # torch ignores dims whose size is not 1; ONNX rejects them.
    dims = [axis(d, x.rank) for d in dims]
    dims = [d for d in dims if is_static(x.shape[d]) and x.shape[d] == 1]
    if not dims:
        return out(ctx, node, ctx.op("Identity", [x]))
    return out(ctx, node, ctx.op("Squeeze", [x, ctx.ints(dims)]))


@converter(aten.cat.default)
def _cat(ctx, node, tensors, dim=0):
    dt = _float_out(node)
    rank = node.meta["val"].dim()
    # torch.cat skips 1-D empty tensors of any other shape (legacy behaviour).
    ts = [t for t in tensors if not (t.rank == 1 and is_static(t.shape[0]) and t.shape[0] == 0)
          or rank == 1]
    return out(ctx, node, ctx.op("Concat", [ctx.as_tensor(t, dt) for t in ts],
                                 {"axis": axis(dim, rank)}))


@converter(aten.stack.default)
def _stack(ctx, node, tensors, dim=0):
    rank = node.meta["val"].dim()
    d = axis(dim, rank)
    dt = _float_out(node)
    parts = [ctx.op("Unsqueeze", [ctx.as_tensor(t, dt), ctx.ints([d])]) for t in tensors]
    return out(ctx, node, ctx.op("Concat", parts, {"axis": d}))


@converter(aten.split_with_sizes.default, aten.split.Tensor, aten.split_with_sizes_copy.default,
           aten.split_copy.Tensor)
def _split(ctx, node, x, sizes, dim=0):
    vals = node.meta["val"]
    d = axis(dim, x.rank)
    lens = [int(v.shape[d]) for v in vals]
    ids = ctx.op("Split", [x, ctx.ints(lens)], {"axis": d}, num_outputs=len(lens))
    if len(lens) == 1:
        ids = [ids]
    return [V(i, v.dtype, v.shape) for i, v in zip(ids, vals)]


@converter(aten.unbind.int)
def _unbind(ctx, node, x, dim=0):
    vals = node.meta["val"]
    d = axis(dim, x.rank)
    n = len(vals)
    ids = ctx.op("Split", [x, ctx.ints([1] * n)], {"axis": d}, num_outputs=n) if n > 1 else [x.id]
    return [V(ctx.op("Squeeze", [i, ctx.ints([d])]), v.dtype, v.shape) for i, v in zip(ids, vals)]


@converter(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    d = axis(dim, x.rank)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if is_static(start) and is_static(end) and step == 1 and start == 0 and end >= INT64_MAX:
        return out(ctx, node, ctx.op("Identity", [x]))
    return out(ctx, node, ctx.op("Slice", [x, ctx.sym(start), ctx.sym(end), ctx.ints([d]),
                                           ctx.ints([step])]))


@converter(aten.select.int, aten.select_copy.int)
def _select(ctx, node, x, dim, index):
    d = axis(dim, x.rank)
    idx = ctx.constant(index, torch.int64) if is_static(index) else \
        ctx.op("Squeeze", [index.id, ctx.ints([0])])
    return out(ctx, node, ctx.op("Gather", [x, idx], {"axis": d}))


@converter(aten.index_select.default)
def _index_select(ctx, node, x, dim, index):
    return out(ctx, node, ctx.op("Gather", [x, index], {"axis": axis(dim, x.rank)}))


@converter(aten.embedding.default)
def _embedding(ctx, node, weight, indices, padding_idx=-1, *rest):
    return out(ctx, node, ctx.op("Gather", [weight, indices], {"axis": 0}))


@converter(aten.gather.default)
def _gather(ctx, node, x, dim, index, sparse_grad=False):
    return out(ctx, node, ctx.op("GatherElements", [x, index], {"axis": axis(dim, x.rank)}))


def stack_indices(ctx, indices: list) -> tuple[int, int]:
    """Index tensors broadcast together to B and stacked: (B + [k] int64 indices for GatherND /
    ScatterND, a B-shaped int64 zero tensor)."""
    idx = [ctx.cast(t, torch.int64).id for t in indices]
    zero = None  # sum of idx*0: broadcasts every index tensor to B, symbolic sizes included
    for i in idx:
        z = ctx.op("Mul", [i, ctx.constant(0, torch.int64)])
        zero = z if zero is None else ctx.op("Add", [zero, z])
    last = ctx.ints([-1])
    stacked = ctx.op("Concat", [ctx.op("Unsqueeze", [ctx.op("Add", [i, zero]), last]) for i in idx],
                     {"axis": -1})
    return stacked, zero


@converter(aten.index.Tensor)
def _index(ctx, node, x, indices):
    """x[i0, i1, ...] with integer index tensors (None for a ':' dim), numpy's rules: the index
    tensors broadcast together to B; B replaces the indexed dims where they are consecutive, or
    goes first when a ':' separates them."""
    present = [i for i, t in enumerate(indices) if t is not None]
    if any(indices[i].dtype == torch.bool for i in present):
        ctx.unsupported("indexing with a boolean mask (its result size depends on the data)")
    if len(present) == 1:
        d = present[0]
        return out(ctx, node, ctx.op("Gather", [x, ctx.cast(indices[d], torch.int64)],
                                     {"axis": d}))
    stacked, _ = stack_indices(ctx, [indices[i] for i in present])
    rest = [d for d in range(x.rank) if d not in present]
    perm = present + rest
    xt = x.id if perm == list(range(x.rank)) else ctx.op("Transpose", [x], {"perm": perm})
    y = ctx.op("GatherND", [xt, stacked])  # B + the dims not indexed
    consecutive = present == list(range(present[0], present[-1] + 1))
    if consecutive and present[0] > 0:
        nb = node.meta["val"].dim() - len(rest)
        lead = present[0]
        perm2 = [nb + i for i in range(lead)] + list(range(nb)) + \
            [nb + i for i in range(lead, len(rest))]
        y = ctx.op("Transpose", [y], {"perm": perm2})
    return out(ctx, node, y)


def _onnx_pads(x: V, pad) -> list:
    """torch's (begin, end) pairs from the last dim backwards -> ONNX's begins then ends."""
    begins, ends = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        begins[x.rank - 1 - i] = pad[2 * i]
        ends[x.rank - 1 - i] = pad[2 * i + 1]
    return begins + ends


@converter(aten.constant_pad_nd.default)
def _pad(ctx, node, x, pad, value=0):
    pads = _onnx_pads(x, pad)
    y = x.id
    if any(p < 0 for p in pads):  # negative padding crops: a Slice
        r = x.rank
        y = ctx.op("Slice", [y, ctx.ints([max(0, -p) for p in pads[:r]]),
                             ctx.ints([min(p, 0) or INT64_MAX for p in pads[r:]]),
                             ctx.ints(list(range(r)))])
        pads = [max(0, p) for p in pads]
    if any(pads) or y == x.id:
        y = ctx.op("Pad", [y, ctx.ints(pads), ctx.constant(value, x.dtype)], {"mode": "constant"})
    return out(ctx, node, y)


@converter(aten.tril.default, aten.triu.default)
def _trilu(ctx, node, x, diagonal=0):
    upper = node.target.__name__.startswith("triu")
    return out(ctx, node, ctx.op("Trilu", [x, ctx.constant(diagonal, torch.int64)],
                                 {"upper": int(upper)}))


@converter(aten.flip.default)
def _flip(ctx, node, x, dims):
    ids = x.id
    for d in dims:
        d = axis(d, x.rank)
        ids = ctx.op("Slice", [ids, ctx.ints([-1]), ctx.ints([-INT64_MAX]), ctx.ints([d]),
                               ctx.ints([-1])])
    return out(ctx, node, ids)


@converter(aten.repeat.default)
def _repeat(ctx, node, x, repeats):
    repeats = list(repeats)
    xin = x.id
    if len(repeats) > x.rank:  # new leading dims of 1 (Reshape's 0 would copy by position)
        xin = ctx.op("Unsqueeze", [x, ctx.ints(list(range(len(repeats) - x.rank)))])
    return out(ctx, node, ctx.op("Tile", [xin, ctx.shape_tensor(repeats)]))


@converter(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(ctx, node, x, sizes, strides, offset=None):
    """A view by explicit strides over x's storage. x's own strides (its FakeTensor's) say how
    its elements lie in that storage: a contiguous x is its storage in row-major order; a
    permuted one (Longformer's chunked attention views a transposed tensor) is its transpose back
    to the storage's order. Same sizes with strides that differ only on size-1 dims (a
    memory-format change) of a contiguous x is x itself; other static views gather their
    elements. offset None keeps x's storage offset."""
    sizes = _meta_ints(node.args[1])  # SymInts as torch knows them, comparable with x.shape
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    x_strides = list(val.stride()) if isinstance(val, torch.Tensor) else None
    x_offset = val.storage_offset() if isinstance(val, torch.Tensor) else 0
    contiguous, acc = [], 1
    for d in reversed(x.shape):
        contiguous.insert(0, acc)
        acc = acc * d
    if x_strides is None or all(_same_sizes([sz], [1]) or _same_sizes([st], [c])
                                for sz, st, c in zip(x.shape, x_strides, contiguous)):
        x_strides, perm = contiguous, None
    else:  # a permuted x: its dims by decreasing stride are its storage's row-major order
        if not all(is_static(v) for v in [*x_strides, *x.shape, x_offset]):
            ctx.unsupported("as_strided of a non-contiguous tensor with symbolic strides")
        perm = sorted(range(x.rank), key=lambda d: -int(x_strides[d]))
        acc = 1
        for d in reversed(perm):
            if int(x.shape[d]) != 1 and int(x_strides[d]) != acc:
                ctx.unsupported(f"as_strided of a tensor with strides {x_strides} over sizes "
                                f"{list(x.shape)} (not a permutation of a dense layout)")
            acc *= int(x.shape[d])
    offset = x_offset if offset is None else offset
    if is_static(offset) and is_static(x_offset):
        offset = int(offset) - int(x_offset)  # from x's first element
    if perm is None and offset == 0 and _same_sizes(sizes, x.shape) and all(
            _same_sizes([sz], [1]) or _same_sizes([st], [c])
            for sz, st, c in zip(sizes, strides, contiguous)):
        return out(ctx, node, ctx.op("Identity", [x]))
    if not all(is_static(v) for v in [*sizes, *strides, offset, *x.shape]):
        ctx.unsupported("as_strided with symbolic sizes")
    idx = torch.full([int(s) for s in sizes], int(offset), dtype=torch.int64)
    for d, (sz, st) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = int(sz)
        idx = idx + torch.arange(int(sz)).reshape(shape) * int(st)
    numel = math.prod(int(d) for d in x.shape)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= numel):
        ctx.unsupported(f"as_strided reading storage elements {int(idx.min())}.."
                        f"{int(idx.max())} of a tensor of {numel} (outside its own elements)")
    storage = x.id if perm is None else ctx.op("Transpose", [x], {"perm": perm})
    flat = ctx.op("Reshape", [storage, ctx.ints([-1])])
    return out(ctx, node, ctx.op("Gather", [flat, ctx.tensor_constant(f"as_strided_{node.name}",
                                                                     idx)], {"axis": 0}))


@converter(aten.sym_size.int)
def _sym_size(ctx, node, x, dim):
    val = node.meta["val"]
    if is_static(val):
        return int(val)
    d = axis(dim, x.rank)
    return SymV(ctx.op("Shape", [x], {"start": d, "end": d + 1}))


@converter(aten.sym_numel.default)
def _sym_numel(ctx, node, x):
    val = node.meta["val"]
    if is_static(val):
        return int(val)
    return SymV(ctx.op("Reshape", [ctx.op("Size", [x]), ctx.ints([1])]))


# ---- reductions ----


def _dims(ctx, x: V, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.rank))
    if isinstance(dims, int):
        dims = [dims]
    return [axis(d, x.rank) for d in dims]


def _reduce(onnx_op):
    def convert(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
        dt = _float_out(node)
        tx = ctx.as_tensor(x, dt)
        if x.rank == 0:
            return out(ctx, node, ctx.op("Identity", [tx]))
        return out(ctx, node, ctx.op(onnx_op, [tx, ctx.ints(_dims(ctx, x, dims))],
                                     {"keepdims": int(bool(keepdim))}))

    return convert


converter(aten.mean.dim, aten.mean.default)(_reduce("ReduceMean"))
converter(aten.sum.dim_IntList, aten.sum.default)(_reduce("ReduceSum"))
converter(aten.amax.default, aten.max.default)(_reduce("ReduceMax"))  # max(x): over all dims
converter(aten.amin.default, aten.min.default)(_reduce("ReduceMin"))
converter(aten.prod.dim_int, aten.prod.default)(_reduce("ReduceProd"))


@converter(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim, aten.all.dims,
           aten.all.default)
def _any_all(ctx, node, x, dims=None, keepdim=False):
    is_any = node.target.__name__.startswith("any")
    t = ctx.op("Cast", [x], {"to": dtypes.onnx_code(torch.int64)})
    if x.rank == 0:
        r = t
    else:
        r = ctx.op("ReduceMax" if is_any else "ReduceMin", [t, ctx.ints(_dims(ctx, x, dims))],
                   {"keepdims": int(bool(keepdim))})
    return out(ctx, node, ctx.op("Cast", [r], {"to": dtypes.onnx_code(torch.bool)}))


@converter(aten.max.dim, aten.min.dim)
def _max_dim(ctx, node, x, dim, keepdim=False):
    is_max = node.target.__name__.startswith("max")
    d = axis(dim, x.rank)
    v = ctx.op("ReduceMax" if is_max else "ReduceMin", [x, ctx.ints([d])],
               {"keepdims": int(keepdim)})
    i = ctx.op("ArgMax" if is_max else "ArgMin", [x],
               {"axis": d, "keepdims": int(keepdim), "select_last_index": 0})
    vals = node.meta["val"]
    return [V(v, vals[0].dtype, vals[0].shape), V(i, vals[1].dtype, vals[1].shape)]


@converter(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, node, x, dim=None, keepdim=False):
    op = "ArgMax" if node.target.__name__.startswith("argmax") else "ArgMin"
    if dim is None:
        flat = ctx.op("Reshape", [x, ctx.ints([-1])])
        return out(ctx, node, ctx.op(op, [flat], {"axis": 0, "keepdims": 0}))
    return out(ctx, node, ctx.op(op, [x], {"axis": axis(dim, x.rank), "keepdims": int(keepdim)}))


@converter(aten.cumsum.default)
def _cumsum(ctx, node, x, dim, dtype=None):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("CumSum", [ctx.as_tensor(x, dt),
                                            ctx.constant(axis(dim, x.rank), torch.int64)]))


@converter(aten.topk.default)
def _topk(ctx, node, x, k, dim=-1, largest=True, sorted=True):
    vals = node.meta["val"]
    v, i = ctx.op("TopK", [x, ctx.ints([k])], {"axis": axis(dim, x.rank),
                                               "largest": int(largest), "sorted": 1},
                  num_outputs=2)
    return [V(v, vals[0].dtype, vals[0].shape), V(i, vals[1].dtype, vals[1].shape)]


@converter(aten._softmax.default, aten.softmax.int)
def _softmax(ctx, node, x, dim, half_to_float=False):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("Softmax", [ctx.as_tensor(x, dt)], {"axis": axis(dim, x.rank)}))


@converter(aten._log_softmax.default, aten.log_softmax.int)
def _log_softmax(ctx, node, x, dim, half_to_float=False):
    dt = _float_out(node)
    return out(ctx, node, ctx.op("LogSoftmax", [ctx.as_tensor(x, dt)],
                                 {"axis": axis(dim, x.rank)}))


# ---- linear algebra ----


def _gemm_b(b: V):
    """Gemm's B operand and transB: a pending transpose is absorbed."""
    if b.transpose_of is not None and b._id is None:
        return b.transpose_of, 1
    return b, 0


@converter(aten.mm.default)
def _mm(ctx, node, a, b):
    bb, trans = _gemm_b(b)
    if trans:
        return out(ctx, node, ctx.op("Gemm", [a, bb], {"transB": 1}))
    return out(ctx, node, ctx.op("MatMul", [a, b]))


@converter(aten.bmm.default, aten.matmul.default)
def _matmul(ctx, node, a, b):
    # bmm(expand(w), ...) is how torch decomposes a batched-by-2-D matmul; MatMul broadcasts the
    # batch dims itself, so the copies are never made. One operand keeps the output's rank.
    rank = node.meta["val"].dim()
    a2 = a.broadcast_of if a.pending and a.broadcast_of is not None else a
    b2 = b.broadcast_of if b.pending and b.broadcast_of is not None else b
    if max(a2.rank, b2.rank) < rank:
        a2 = a if a2.rank <= b2.rank else a2
        b2 = b if max(a2.rank, b2.rank) < rank else b2
    return out(ctx, node, ctx.op("MatMul", [a2, b2]))


@converter(aten.addmm.default)
def _addmm(ctx, node, bias, a, b, beta=1, alpha=1):
    bb, trans = _gemm_b(b)
    return out(ctx, node, ctx.op("Gemm", [a, bb, bias], {"alpha": float(alpha),
                                                        "beta": float(beta), "transB": trans}))


@converter(aten.baddbmm.default)
def _baddbmm(ctx, node, bias, a, b, beta=1, alpha=1):
    dt = _float_out(node)
    p = ctx.op("MatMul", [a, b])
    if alpha != 1:
        p = ctx.op("Mul", [p, ctx.constant(alpha, dt)])
    if beta == 0:
        return out(ctx, node, p)
    bb = bias.id if beta == 1 else ctx.op("Mul", [bias, ctx.constant(beta, dt)])
    return out(ctx, node, ctx.op("Add", [p, bb]))


# ---- neural-network ops ----


@converter(aten.scaled_dot_product_attention.default)
def _sdpa(ctx, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    return out(ctx, node, _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale,
                                     enable_gqa))


@converter(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(ctx, node, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                    scale=None):
    """What scaled_dot_product_attention dispatches to on the CPU, in torch.compile's graphs
    (AOT autograd traces below it). Its second output, the logsumexp, serves the backward only:
    a graph that reads it (training) keeps the node in PyTorch. Heads of k and v fewer than q's
    are grouped-query attention."""
    if any(u.target is operator.getitem and u.args[1] != 0 for u in node.users):
        ctx.unsupported("the logsumexp output (the backward's) is used")
    y = _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, True)
    return [V(y, q.dtype, tuple(q.shape[:-1]) + (v.shape[-1],)), None]


def _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    """softmax(q k^T * scale + mask) v, as torch's math path computes it; rows that the mask
    hides entirely give 0, as torch's CPU kernel does."""
    if dropout_p:
        ctx.unsupported("attention dropout (PyPTO compiles for inference: call model.eval())")
    dt = q.dtype
    e = q.shape[-1]
    if scale is None:
        if not is_static(e):
            ctx.unsupported("attention with a symbolic head size and no explicit scale")
        scale = 1.0 / math.sqrt(e)
    if is_causal and not (is_static(q.shape[-2]) and is_static(k.shape[-2])):
        # No [L, S] constant for a symbolic length: Attention's is_causal is torch's (top-left:
        # query i sees keys <= i; grouped K/V heads read as they are), for 4-D operands.
        if not (q.rank == k.rank == v.rank == 4):
            ctx.unsupported("causal attention with a symbolic sequence length, not 4-D")
        return ctx.op("Attention", [q, k, v], {"scale": float(scale), "is_causal": 1})
    kk, vv = k.id, v.id
    if enable_gqa and is_static(q.shape[-3]) and is_static(k.shape[-3]) and \
            q.shape[-3] != k.shape[-3]:
        hq, hk = int(q.shape[-3]), int(k.shape[-3])
        kk, vv = (_repeat_heads(ctx, t, hq, hk, t.shape) for t in (k, v))
    perm = list(range(k.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = ctx.op("MatMul", [q, ctx.op("Transpose", [kk], {"perm": perm})])
    scores = ctx.op("Mul", [scores, ctx.constant(scale, dt)])
    masked = is_causal or attn_mask is not None
    neg_inf = ctx.constant(float("-inf"), dt)
    if is_causal:
        l_, s_ = q.shape[-2], k.shape[-2]
        causal = ctx.constant(torch.ones(int(l_), int(s_), dtype=torch.bool).tril().tolist(),
                              torch.bool)
        scores = ctx.op("Where", [causal, scores, neg_inf])
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = ctx.op("Where", [attn_mask, scores, neg_inf])
        else:
            scores = ctx.op("Add", [scores, ctx.cast(attn_mask, dt)])
    p = ctx.op("Softmax", [scores], {"axis": -1})
    if masked:
        # A row whose every score is -inf would be NaN; torch's CPU kernel returns zeros there.
        # A row is alive when its largest score is above -inf: one float reduction per row.
        row_max = ctx.op("ReduceMax", [scores, ctx.ints([-1])], {"keepdims": 1})
        any_alive = ctx.op("Not", [ctx.op("Equal", [row_max, neg_inf])])
        p = ctx.op("Where", [any_alive, p, ctx.constant(0.0, dt)])
    return ctx.op("MatMul", [p, vv])


def _repeat_heads(ctx, t: V, hq: int, hk: int, shape) -> int:
    """[.., hk, S, E] -> [.., hq, S, E], each head repeated hq/hk times (grouped-query)."""
    g = hq // hk
    u = ctx.op("Unsqueeze", [t, ctx.ints([t.rank - 2])])
    ones = [1] * (t.rank + 1)
    ones[t.rank - 2] = g
    ex = ctx.op("Expand", [u, ctx.ints(ones)])
    target = [0] * (t.rank - 3) + [hq, -1, int(shape[-1])]
    return ctx.op("Reshape", [ex, ctx.ints(target)])


@converter(aten.convolution.default)
def _convolution(ctx, node, x, w, b, stride, padding, dilation, transposed, output_padding,
                 groups):
    nd = x.rank - 2

    def per_dim(v):  # one value for every spatial dim (padding="valid" arrives as [0])
        v = [int(i) for i in v]
        return v * nd if len(v) == 1 and nd > 1 else v

    stride, padding, dilation = per_dim(stride), per_dim(padding), per_dim(dilation)
    output_padding = per_dim(output_padding)
    attrs = {"strides": stride, "pads": padding * 2, "dilations": dilation,
             "group": int(groups), "kernel_shape": [int(s) for s in w.shape[2:]]}
    if transposed:
        if any(p != 0 for p in output_padding):
            attrs["output_padding"] = list(output_padding)
        return out(ctx, node, ctx.op("ConvTranspose", [x, w, b], attrs))
    return out(ctx, node, ctx.op("Conv", [x, w, b], attrs))


def _ones_or(ctx, t, n, value, dt):
    return t if t is not None else ctx.constant([value] * n, dt)


@converter(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(ctx, node, x, w, b, mean, var, momentum, eps):
    c = int(x.shape[1])
    w = _ones_or(ctx, w, c, 1.0, x.dtype)
    b = _ones_or(ctx, b, c, 0.0, x.dtype)
    y = ctx.op("BatchNormalization", [x, w, b, mean, var], {"epsilon": float(eps)})
    return [V(y, x.dtype, x.shape), None, None]


@converter(aten.native_layer_norm.default)
def _layer_norm(ctx, node, x, normalized_shape, w, b, eps):
    shape = tuple(int(s) for s in normalized_shape)
    if w is None:  # LayerNormalization needs a scale
        w = ctx.constant([1.0] * math.prod(shape), x.dtype, shape)
    attrs = {"axis": -len(normalized_shape), "epsilon": float(eps)}
    y = ctx.op("LayerNormalization", [x, w, b], attrs)
    return [V(y, x.dtype, x.shape), None, None]


@converter(aten.native_group_norm.default)
def _group_norm(ctx, node, x, w, b, n, c, hw, groups, eps):
    c = int(c)
    w = _ones_or(ctx, w, c, 1.0, x.dtype)
    b = _ones_or(ctx, b, c, 0.0, x.dtype)
    y = ctx.op("GroupNormalization", [x, w, b], {"num_groups": int(groups),
                                                 "epsilon": float(eps)})
    return [V(y, x.dtype, x.shape), None, None]


def _pool_attrs(x, kernel, stride, padding, dilation=None, ceil_mode=False):
    nd = x.rank - 2
    kernel = list(kernel) * (nd if len(kernel) == 1 else 1)
    stride = list(stride) if stride else kernel
    stride = stride * (nd if len(stride) == 1 else 1)
    padding = list(padding) * (nd if len(padding) == 1 else 1)
    attrs = {"kernel_shape": kernel, "strides": stride, "pads": padding * 2,
             "ceil_mode": int(bool(ceil_mode))}
    if dilation is not None:
        dilation = list(dilation) * (nd if len(dilation) == 1 else 1)
        attrs["dilations"] = dilation
    return attrs


@converter(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
           aten.max_pool1d_with_indices.default, aten.max_pool2d.default)
def _max_pool(ctx, node, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    attrs = _pool_attrs(x, kernel, stride, padding, dilation, ceil_mode)
    y = ctx.op("MaxPool", [x], attrs)
    val = node.meta["val"]
    if isinstance(val, torch.Tensor):
        return V(y, val.dtype, val.shape)
    return [V(y, val[0].dtype, val[0].shape), None]


@converter(aten.avg_pool2d.default, aten.avg_pool1d.default, aten.avg_pool3d.default)
def _avg_pool(ctx, node, x, kernel, stride=(), padding=(0,), ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        ctx.unsupported("avg_pool with divisor_override")
    attrs = _pool_attrs(x, kernel, stride, padding, None, ceil_mode)
    attrs["count_include_pad"] = int(bool(count_include_pad))
    return out(ctx, node, ctx.op("AveragePool", [x], attrs))


def _adaptive_bins(size: int, out_size: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive pooling windows: bin i covers [floor(i S / O), ceil((i + 1) S / O))."""
    return [(i * size // out_size, -(-(i + 1) * size // out_size)) for i in range(out_size)]


@converter(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default,
           aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool1d.default)
def _adaptive_avg_pool(ctx, node, x, output_size):
    nd = x.rank - 2
    output_size = list(output_size) * (nd if len(output_size) == 1 else 1)
    if all(s == 1 for s in output_size):
        return out(ctx, node, ctx.op("GlobalAveragePool", [x]))
    spatial = x.shape[2:]
    if not all(is_static(s) for s in spatial):
        ctx.unsupported(f"adaptive_avg_pool to {output_size} from a symbolic spatial size")
    spatial = [int(s) for s in spatial]
    even = [s % o == 0 for s, o in zip(spatial, output_size)]
    # The axes the output size divides pool with equal windows (AveragePool, window 1 elsewhere).
    k = [s // o if e else 1 for s, o, e in zip(spatial, output_size, even)]
    # (The pool of a size to itself, UperNet's pyramid level at a small input, is x.)
    y = ctx.op("AveragePool", [x], {"kernel_shape": k, "strides": k}) if any(
        kk > 1 for kk in k) else x.id
    if all(even):
        return out(ctx, node, y)
    # The others have windows of two lengths, overlapping when the output is the larger: a
    # product with the matrix of window means, P[i, j] = 1 / len_i on bin i's inputs, from the
    # right for the last axis, from the left for the one before it.
    uneven = [a for a in range(nd) if not even[a]]
    if uneven[0] < nd - 2:
        ctx.unsupported(f"adaptive_avg_pool to {output_size} from {spatial}: an uneven window "
                        "on a spatial axis before the last two")
    dtype = node.meta["val"].dtype

    def means(a: int) -> list[list[float]]:
        rows = [[0.0] * spatial[a] for _ in range(output_size[a])]
        for i, (b, e) in enumerate(_adaptive_bins(spatial[a], output_size[a])):
            rows[i][b:e] = [1.0 / (e - b)] * (e - b)
        return rows

    if nd - 1 in uneven:  # [.., W] @ P^T: [W, Ow]
        p = means(nd - 1)
        pt = [list(col) for col in zip(*p)]
        y = ctx.op("MatMul", [y, ctx.constant(pt, dtype)])
    if nd >= 2 and nd - 2 in uneven:  # P: [Oh, H] @ [.., H, Ow]
        y = ctx.op("MatMul", [ctx.constant(means(nd - 2), dtype), y])
    return out(ctx, node, y)


@converter(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default,
           aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default)
def _upsample(ctx, node, x, output_size, *args):
    nearest = "nearest" in node.target.__name__
    val = node.meta["val"]
    if not all(is_static(s) for s in val.shape[2:]):
        ctx.unsupported("upsampling to a symbolic size")
    # N and C come from the input (the batch may be symbolic), the spatial sizes from torch.
    sizes = ctx.op("Concat", [ctx.op("Shape", [x], {"start": 0, "end": 2}),
                              ctx.ints([int(s) for s in val.shape[2:]])], {"axis": 0})
    align = not nearest and bool(args) and args[0] is True  # bilinear's align_corners
    attrs = {"mode": "nearest" if nearest else "linear",
             "coordinate_transformation_mode": "align_corners" if align else
             ("asymmetric" if nearest else "pytorch_half_pixel"),
             "nearest_mode": "floor"}
    return out(ctx, node, ctx.op("Resize", [x, None, None, sizes], attrs))


# ---- quantized ops (pypto.quantization) ----

from .. import quantization as _quantization  # noqa: E402 - defines torch.ops.pypto.*


@converter(torch.ops.pypto.dynamic_quantized_linear.default)
def _dynamic_quantized_linear(ctx, node, x, weight, scale, zero_point, bias, per_row):
    # DynamicQuantizeMatMul takes B as [K, N]: the Linear's int8 weight transposed (a constant
    # fold at level 1 and above).
    w_t = ctx.op("Transpose", [weight], {"perm": [1, 0]})
    inputs = [ctx.cast(x, torch.float32), w_t, scale, zero_point, bias]
    while inputs[-1] is None:
        inputs.pop()
    return out(ctx, node, ctx.op("DynamicQuantizeMatMul", inputs, {"per_row": int(per_row)}))


@converter(torch.ops.pypto.quantized_conv2d.default)
def _quantized_conv2d(ctx, node, x, weight, weight_scale, bias, x_scale, x_zero_point, stride,
                      padding, dilation, groups):
    # ONNX's own ops: QuantizeLinear -> ConvInteger -> Cast -> Mul by x_scale * w_scale[c] (->
    # Add of the bias), per output channel along axis 1.
    f32 = torch.float32
    xs, xz = ctx.constant(float(x_scale), f32), ctx.constant(int(x_zero_point), torch.uint8)
    xq = ctx.op("QuantizeLinear", [ctx.cast(x, f32), xs, xz])
    acc = ctx.op("ConvInteger", [xq, weight, xz],
                 {"strides": list(stride), "pads": list(padding) * 2,
                  "dilations": list(dilation), "group": int(groups)})
    channels = ctx.ints([1, -1, 1, 1])
    scale = ctx.op("Reshape", [ctx.op("Mul", [xs, weight_scale]), channels])
    y = ctx.op("Mul", [ctx.op("Cast", [acc], {"to": dtypes.onnx_code(f32)}), scale])
    if bias is not None:
        y = ctx.op("Add", [y, ctx.op("Reshape", [bias, channels])])
    return out(ctx, node, y)


from . import aten_complex, aten_fft, aten_more, aten_rnn, aten_scatter  # noqa: E402, F401  (register their converters)
