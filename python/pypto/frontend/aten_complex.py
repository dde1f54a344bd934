"""Complex arithmetic and math for `pypto.optimize`: +, -, *, / and where between complex values,
real tensors and Python scalars (`1j * x`, `z + 1`, `z / (2 - 3j)`), exp, log, sqrt, pow,
reciprocal, sgn, angle, abs, conj, neg, and the constructors torch.complex and torch.polar.

A complex value is a real tensor with a trailing axis of 2 (real, imaginary), as aten_fft.py
holds it. Every operand is first brought to that form (`_pair`): a complex value is itself, a
real tensor gets a zero imaginary part, a Python number a [re, im] constant that broadcasts. The
formulas are torch's (its complex kernels follow the C99 functions of <complex.h>): exp(a + ib) =
e^a (cos b + i sin b), log z = log|z| + i angle(z), sqrt by the stable half-angle form, pow by
repeated products for small integer exponents and exp(p log z) otherwise."""

from __future__ import annotations

import math
import numbers

import torch

from .. import dtypes
from .aten_fft import (_REAL, _complex_out, _parts, _real_dtype, complex_converter,
                       complex_only, is_complex, real_to_pair)
from .fx_importer import V, converter

aten = torch.ops.aten


def signbit_id(ctx, t: int, dt) -> int:
    """Whether t's sign bit is set (-0.0 too, as C's signbit): t < 0, or 1 / t = -inf."""
    zero = ctx.constant(0.0, dt)
    return ctx.op("Or", [ctx.op("Less", [t, zero]),
                         ctx.op("Less", [ctx.op("Div", [ctx.constant(1.0, dt), t]), zero])])


def atan2_id(ctx, ty: int, tx: int, dt) -> int:
    """atan(y / x), moved to the right quadrant where x < 0 (by -pi where y's sign bit is set,
    -0.0 included, as C's atan2); +-0 (y's sign) where x = y = 0, and +-pi where x is -0."""
    zero = ctx.constant(0.0, dt)
    a = ctx.op("Atan", [ctx.op("Div", [ty, tx])])  # x = 0: y/x = +-inf, atan = +-pi/2
    y_neg = signbit_id(ctx, ty, dt)
    turn = ctx.op("Where", [y_neg, ctx.constant(-math.pi, dt), ctx.constant(math.pi, dt)])
    a = ctx.op("Where", [signbit_id(ctx, tx, dt), ctx.op("Add", [a, turn]), a])
    both_zero = ctx.op("And", [ctx.op("Equal", [tx, zero]), ctx.op("Equal", [ty, zero])])
    at_origin = ctx.op("Where", [signbit_id(ctx, tx, dt), turn, ty])  # y itself: +-0
    return ctx.op("Where", [both_zero, at_origin, a])


def _is_real_operand(x) -> bool:
    return (isinstance(x, V) and not x.dtype.is_complex) or (
        isinstance(x, numbers.Real) and not isinstance(x, complex))


def _out_real(ctx, node) -> torch.dtype:
    """The real dtype of the node's complex output."""
    cdt = node.meta["val"].dtype
    if cdt not in _REAL:
        ctx.unsupported(f"complex dtype {cdt} (supported: complex64, complex128)")
    return _REAL[cdt]


def _pair(ctx, x, dt: torch.dtype) -> int:
    """x as a [..., 2] tensor of `dt` (real, imaginary): a complex value as it is held, a real
    tensor with a zero imaginary part, a Python number as a [re, im] constant."""
    if isinstance(x, V) and x.dtype.is_complex:
        if _real_dtype(x) == dt:
            return x.id
        return ctx.op("Cast", [x.id], {"to": dtypes.onnx_code(dt)})
    if isinstance(x, V):
        return real_to_pair(ctx, x, dt)
    if isinstance(x, numbers.Number):
        z = complex(x)
        return ctx.constant([z.real, z.imag], dt)
    ctx.unsupported(f"a complex operand of type {type(x).__name__}")


def _join(ctx, re: int, im: int) -> int:
    """[..., 1] real and imaginary parts joined into [..., 2]."""
    return ctx.op("Concat", [re, im], {"axis": -1})


def _unsq(ctx, t: int) -> int:
    return ctx.op("Unsqueeze", [t, ctx.ints([-1])])


def _sq(ctx, t: int) -> int:
    return ctx.op("Squeeze", [t, ctx.ints([-1])])


def _product(ctx, a: int, b: int) -> int:
    """The complex product of two [..., 2] tensors."""
    (ar, ai), (br, bi) = _parts(ctx, a), _parts(ctx, b)
    re = ctx.op("Sub", [ctx.op("Mul", [ar, br]), ctx.op("Mul", [ai, bi])])
    im = ctx.op("Add", [ctx.op("Mul", [ar, bi]), ctx.op("Mul", [ai, br])])
    return _join(ctx, re, im)


def _modulus(ctx, z: int, dt) -> int:
    """|z| as [..., 1], scaled by max(|re|, |im|) as hypot is, so that it neither underflows
    (|z| = 1e-30 squares to 0 in float32) nor overflows."""
    m = ctx.op("ReduceMax", [ctx.op("Abs", [z]), ctx.ints([-1])], {"keepdims": 1})
    plain = ctx.op("Or", [ctx.op("Equal", [m, ctx.constant(0.0, dt)]), ctx.op("IsInf", [m])])
    s = ctx.op("Where", [plain, ctx.constant(1.0, dt), m])  # 0 and inf need no scaling
    scaled = ctx.op("ReduceSumSquare", [ctx.op("Div", [z, s]), ctx.ints([-1])], {"keepdims": 1})
    return ctx.op("Mul", [ctx.op("Sqrt", [scaled]), s])


def _conj(ctx, z: int, dt) -> int:
    return ctx.op("Mul", [z, ctx.constant([1.0, -1.0], dt)])


def _quotient(ctx, a: int, b: int, dt) -> int:
    """a / b for [..., 2] tensors by Smith's method, as torch's complex division: the larger of
    b's parts divides the smaller (no overflow or underflow of |b|^2); a divisor of 0 gives
    a's parts over |0| (inf or nan), as torch."""
    (ar, ai), (c, d) = _parts(ctx, a), _parts(ctx, b)
    swap = ctx.op("Less", [ctx.op("Abs", [c]), ctx.op("Abs", [d])])
    big, small = ctx.op("Where", [swap, d, c]), ctx.op("Where", [swap, c, d])
    rat = ctx.op("Div", [small, big])
    scl = ctx.op("Div", [ctx.constant(1.0, dt),
                         ctx.op("Add", [big, ctx.op("Mul", [small, rat])])])

    def mul(x, y):
        return ctx.op("Mul", [x, y])

    re = ctx.op("Where", [swap, ctx.op("Add", [mul(ar, rat), ai]),
                          ctx.op("Add", [ar, mul(ai, rat)])])
    im = ctx.op("Where", [swap, ctx.op("Sub", [mul(ai, rat), ar]),
                          ctx.op("Sub", [ai, mul(ar, rat)])])
    zero = ctx.constant(0.0, dt)
    by_zero = ctx.op("And", [ctx.op("Equal", [c, zero]), ctx.op("Equal", [d, zero])])
    return _join(ctx, ctx.op("Where", [by_zero, ctx.op("Div", [ar, ctx.op("Abs", [c])]),
                                       mul(re, scl)]),
                 ctx.op("Where", [by_zero, ctx.op("Div", [ai, ctx.op("Abs", [d])]),
                                  mul(im, scl)]))


def _reciprocal(ctx, z: int, dt) -> int:
    return _quotient(ctx, ctx.constant([1.0, 0.0], dt), z, dt)


def _angle(ctx, z: int, dt) -> int:
    """atan2(im, re) as [..., 1]."""
    re, im = _parts(ctx, z)
    return atan2_id(ctx, im, re, dt)


def _exp(ctx, z: int, dt) -> int:
    """e^re (cos im + i sin im); a real z stays real (exp(inf + 0i) = inf + 0i, not inf * 0)."""
    re, im = _parts(ctx, z)
    e = ctx.op("Exp", [re])
    real = ctx.op("Equal", [im, ctx.constant(0.0, dt)])
    return _join(ctx, ctx.op("Mul", [e, ctx.op("Cos", [im])]),
                 ctx.op("Where", [real, im, ctx.op("Mul", [e, ctx.op("Sin", [im])])]))


def _log(ctx, z: int, dt) -> int:
    return _join(ctx, ctx.op("Log", [_modulus(ctx, z, dt)]), _angle(ctx, z, dt))


def _real_factor(ctx, r, dt) -> int:
    """A real operand that scales both parts of a [..., 2] tensor: a tensor gets a trailing axis
    of 1, a number is a scalar constant."""
    t = ctx.as_tensor(r, dt)
    return _unsq(ctx, t) if isinstance(r, V) else t


# ---- arithmetic ----


@complex_only(aten.mul.Tensor, aten.mul.Scalar)
def _mul(ctx, node, a, b):
    """(ar + i ai)(br + i bi) = ar br - ai bi + i (ar bi + ai br); a real factor scales both."""
    dt = _out_real(ctx, node)
    if _is_real_operand(a) or _is_real_operand(b):
        c, r = (b, a) if _is_real_operand(a) else (a, b)
        return _complex_out(ctx, node, ctx.op("Mul", [_pair(ctx, c, dt), _real_factor(ctx, r, dt)]))
    return _complex_out(ctx, node, _product(ctx, _pair(ctx, a, dt), _pair(ctx, b, dt)))


def _add_sub(onnx_op: str):
    def convert(ctx, node, a, b, alpha=1):
        dt = _out_real(ctx, node)
        if alpha != 1:
            if isinstance(b, numbers.Number):
                b = complex(b) * alpha
            elif isinstance(alpha, numbers.Real) and not isinstance(alpha, complex):
                return _complex_out(ctx, node, ctx.op(onnx_op, [
                    _pair(ctx, a, dt),
                    ctx.op("Mul", [_pair(ctx, b, dt), ctx.constant(float(alpha), dt)])]))
            else:
                ctx.unsupported(f"{onnx_op.lower()} with a complex alpha")
        return _complex_out(ctx, node, ctx.op(onnx_op, [_pair(ctx, a, dt), _pair(ctx, b, dt)]))

    return convert


complex_only(aten.add.Tensor, aten.add.Scalar)(_add_sub("Add"))
complex_only(aten.sub.Tensor, aten.sub.Scalar)(_add_sub("Sub"))


@complex_only(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):  # b - alpha * a
    return _add_sub("Sub")(ctx, node, b, a, alpha)


@complex_only(aten.div.Tensor, aten.div.Scalar)
def _div(ctx, node, a, b, *, rounding_mode=None):
    """a / b: both parts divided by a real b; Smith's method for a complex b (a complex scalar
    b: a times the constant 1 / b)."""
    if rounding_mode is not None:
        ctx.unsupported(f"a complex division with rounding_mode={rounding_mode!r}")
    dt = _out_real(ctx, node)
    if _is_real_operand(b):
        return _complex_out(ctx, node, ctx.op("Div", [_pair(ctx, a, dt), _real_factor(ctx, b, dt)]))
    if isinstance(b, numbers.Number):
        inv = _pair(ctx, 1 / complex(b), dt)
        return _complex_out(ctx, node, _product(ctx, _pair(ctx, a, dt), inv))
    return _complex_out(ctx, node, _quotient(ctx, _pair(ctx, a, dt), _pair(ctx, b, dt), dt))


@complex_only(aten.reciprocal.default)
def _c_reciprocal(ctx, node, x):
    return _complex_out(ctx, node, _reciprocal(ctx, x.id, _real_dtype(x)))


@complex_only(aten.neg.default)
def _c_neg(ctx, node, x):
    return _complex_out(ctx, node, ctx.op("Neg", [x.id]))


@complex_converter(aten._conj.default, aten.conj_physical.default, aten.conj.default)
def _c_conj(ctx, node, x):
    if not is_complex(x):
        return ctx.value(ctx.op("Identity", [x]), like=node)
    return _complex_out(ctx, node, _conj(ctx, x.id, _real_dtype(x)))


@complex_only(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther,
                   aten.where.Scalar)
def _where(ctx, node, cond, a, b):
    dt = _out_real(ctx, node)
    c = _unsq(ctx, ctx.as_tensor(cond, torch.bool))
    return _complex_out(ctx, node, ctx.op("Where", [c, _pair(ctx, a, dt), _pair(ctx, b, dt)]))


# ---- functions ----


@complex_only(aten.abs.default)
def _abs(ctx, node, x):
    dt = _real_dtype(x)
    return V(_sq(ctx, _modulus(ctx, x.id, dt)), dt, tuple(node.meta["val"].shape))


@complex_only(aten.exp.default)
def _c_exp(ctx, node, x):
    return _complex_out(ctx, node, _exp(ctx, x.id, _real_dtype(x)))


@complex_only(aten.log.default)
def _c_log(ctx, node, x):
    return _complex_out(ctx, node, _log(ctx, x.id, _real_dtype(x)))


@complex_only(aten.sqrt.default)
def _c_sqrt(ctx, node, x):
    """The principal root, in the stable half-angle form: t = sqrt((|re| + |z|) / 2); for re >= 0
    it is t + i im / (2t), else |im| / (2t) + i t sign(im) (im's sign bit: -0 too); 0 at z = 0,
    inf + i im where im is infinite (C99's csqrt)."""
    dt = _real_dtype(x)
    re, im = _parts(ctx, x.id)
    zero, half = ctx.constant(0.0, dt), ctx.constant(0.5, dt)
    t = ctx.op("Sqrt", [ctx.op("Mul", [ctx.op("Add", [ctx.op("Abs", [re]),
                                                       _modulus(ctx, x.id, dt)]), half])])
    other = ctx.op("Div", [im, ctx.op("Add", [t, t])])  # the part that is not t, im's sign
    right = ctx.op("GreaterOrEqual", [re, zero])
    signed_t = ctx.op("Where", [signbit_id(ctx, im, dt), ctx.op("Neg", [t]), t])
    out_re = ctx.op("Where", [right, t, ctx.op("Abs", [other])])
    out_im = ctx.op("Where", [right, other, signed_t])
    at_zero = ctx.op("Equal", [t, zero])
    out_re = ctx.op("Where", [at_zero, zero, out_re])
    out_im = ctx.op("Where", [at_zero, im, out_im])
    inf_im = ctx.op("IsInf", [im])
    out_re = ctx.op("Where", [inf_im, ctx.constant(math.inf, dt), out_re])
    out_im = ctx.op("Where", [inf_im, im, out_im])
    return _complex_out(ctx, node, _join(ctx, out_re, out_im))


@complex_only(aten.pow.Tensor_Scalar)
def _c_pow(ctx, node, x, p):
    """z^p: repeated products for an integer |p| <= 16, else exp(p log z) (0 at z = 0 for a
    real p > 0, as torch)."""
    dt = _out_real(ctx, node)
    z = _pair(ctx, x, dt)
    n = int(p) if isinstance(p, numbers.Real) and float(p).is_integer() else None
    if n == 0:
        ones = ctx.op("Mul", [z, ctx.constant(0.0, dt)])
        return _complex_out(ctx, node, ctx.op("Add", [ones, ctx.constant([1.0, 0.0], dt)]))
    if n is not None and abs(n) <= 16:
        acc, base, k = None, z, abs(n)
        while k:
            if k & 1:
                acc = base if acc is None else _product(ctx, acc, base)
            k >>= 1
            if k:
                base = _product(ctx, base, base)
        return _complex_out(ctx, node, acc if n > 0 else _reciprocal(ctx, acc, dt))
    if not isinstance(p, numbers.Number):
        ctx.unsupported("a complex power with a tensor exponent")
    w = _log(ctx, z, dt)
    w = (ctx.op("Mul", [w, ctx.constant(float(p), dt)]) if _is_real_operand(p)
         else _product(ctx, w, _pair(ctx, p, dt)))
    return _complex_out(ctx, node, _exp(ctx, w, dt))


@complex_only(aten.sgn.default)
def _c_sgn(ctx, node, x):
    """z / |z|, 0 at z = 0."""
    dt = _real_dtype(x)
    m = _modulus(ctx, x.id, dt)
    zero = ctx.constant(0.0, dt)
    safe = ctx.op("Where", [ctx.op("Equal", [m, zero]), ctx.constant(1.0, dt), m])
    return _complex_out(ctx, node, ctx.op("Div", [x.id, safe]))


@complex_only(aten.angle.default)
def _c_angle(ctx, node, x):
    return V(_sq(ctx, _angle(ctx, x.id, _real_dtype(x))), _real_dtype(x),
             tuple(node.meta["val"].shape))


@converter(aten.angle.default)
def _angle_real(ctx, node, x):
    """The angle of a real number: pi for negatives, 0 otherwise, NaN for NaN."""
    dt = node.meta["val"].dtype
    t = ctx.as_tensor(x, dt)
    zero = ctx.constant(0.0, dt)
    a = ctx.op("Where", [ctx.op("Less", [t, zero]), ctx.constant(math.pi, dt), zero])
    return ctx.value(ctx.op("Where", [ctx.op("IsNaN", [t]), t, a]), like=node)


# ---- constructors (real in, complex out) ----


@converter(aten.complex.default)
def _complex(ctx, node, re, im):
    dt = _out_real(ctx, node)
    tr, ti = ctx.as_tensor(re, dt), ctx.as_tensor(im, dt)
    true = ctx.constant(True, torch.bool)  # Where broadcasts each part to the other's shape
    parts = [_unsq(ctx, ctx.op("Where", [true, a, b])) for a, b in ((tr, ti), (ti, tr))]
    return _complex_out(ctx, node, _join(ctx, *parts))


@converter(aten.polar.default)
def _polar(ctx, node, r, theta):
    """r (cos theta + i sin theta)."""
    dt = _out_real(ctx, node)
    tr, tt = ctx.as_tensor(r, dt), ctx.as_tensor(theta, dt)
    re = ctx.op("Mul", [tr, ctx.op("Cos", [tt])])
    im = ctx.op("Mul", [tr, ctx.op("Sin", [tt])])
    return _complex_out(ctx, node, _join(ctx, _unsq(ctx, re), _unsq(ctx, im)))
