"""Differential fuzzer for VALID ONNX programs: random graphs run through onnxruntime (all graph
optimizations off: the plain reference) and through `pypto.onnx.load` at levels 0-3 on one and two
threads; any difference beyond tolerance, crash or hang is a finding.

    # a campaign of 2000 graphs from seed 0 (one worker process, 60 s per case)
    PYTHONPATH=python python tests/python/fuzz_valid.py --seeds 0:2000 --out /tmp/dfz
    # one case, verbose, keeping the model as /tmp/dfz/case.onnx
    PYTHONPATH=python python tests/python/fuzz_valid.py --one 1234 --save /tmp/dfz/case.onnx
    # the torch-level variant (pypto.optimize against eager)
    PYTHONPATH=python python tests/python/fuzz_valid.py --torch --seeds 0:500

A graph is a pure function of its seed (`make_model(seed)`), so a finding is reproduced from
its number alone; failing models are also written to `<out>/fail/<seed>.onnx`. The comparison:
floats within 1e-4 * max(1, max|ref|) per output (NaN where the reference has NaN), integers and
booleans exact. Values that feed an ArgMax/TopK index or an integer Cast come only from exact
ops (data movement, Relu, Max, ...) so rounding cannot flip them. tests/python/test_fuzz_valid.py
runs a fixed set of seeds in CI (PTO_FUZZ_VALID=N for N more).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I, B = "f", "i", "b"  # the value kinds: float32, int64, bool
_ONNX_TYPE = {F: TensorProto.FLOAT, I: TensorProto.INT64, B: TensorProto.BOOL}
ODD_SIZES = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33]
# PTO_FUZZ_SPECIALS=1: NaN and +-Inf in the float inputs (a separate campaign: where references
# differ most), without convolutions, pools, ArgMax and TopK (see Gen.build).
SPECIALS = os.environ.get("PTO_FUZZ_SPECIALS", "0") == "1"


class Val:
    __slots__ = ("name", "shape", "kind", "exact")

    def __init__(self, name, shape, kind, exact):
        self.name, self.shape, self.kind, self.exact = name, tuple(shape), kind, exact


class Gen:
    """Builds one random graph: a pool of values (shape, kind) that each new node reads from."""

    def __init__(self, seed: int, max_nodes: int | None = None):
        self.rng = np.random.default_rng(seed)
        self.opset = int(self.rng.choice([17, 18, 19, 20, 21]))
        self.nodes, self.inputs, self.inits, self.feeds = [], [], [], {}
        self.pool: list[Val] = []
        self.n = 0
        self.budget = int(self.rng.integers(3, 26)) if max_nodes is None else max_nodes
        self.numel_cap = 40000

    # ---- helpers ----------------------------------------------------------------------------
    def name(self, p="v"):
        self.n += 1
        return f"{p}{self.n}"

    def r(self, a, b=None):
        return int(self.rng.integers(a, b)) if b is not None else int(self.rng.integers(0, a))

    def coin(self, p=0.5):
        return bool(self.rng.random() < p)

    def pick(self, seq):
        return seq[self.r(len(seq))]

    def size(self, big=33):
        if big >= 33 and self.coin(0.08):  # just past a vector width, a tile, a block
            return self.pick([63, 64, 65, 127, 128, 129, 255, 257])
        s = self.pick(ODD_SIZES)
        return s if s <= big else self.pick([1, 3, 5])

    def data(self, shape, kind, specials=False):
        if kind == F:
            a = self.rng.standard_normal(shape).astype(np.float32)
            if self.coin(0.2):
                a *= np.float32(self.pick([0.01, 4.0, 30.0]))
            if specials and SPECIALS and a.size and self.coin(0.5):  # NaN, +-Inf here and there
                flat = a.reshape(-1)
                at = self.rng.integers(0, a.size, max(1, a.size // 50))
                flat[at] = self.rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32),
                                           len(at))
            return a
        if kind == I:
            return self.rng.integers(-5, 6, size=shape).astype(np.int64)
        return self.rng.random(shape) < 0.5

    def new_input(self, shape, kind=F):
        v = Val(self.name("in"), shape, kind, True)
        self.inputs.append(helper.make_tensor_value_info(v.name, _ONNX_TYPE[kind], list(shape)))
        self.feeds[v.name] = self.data(shape, kind, specials=True)
        self.pool.append(v)
        return v

    def const(self, arr, exact=True, add=False):
        arr = np.asarray(arr)
        kind = F if arr.dtype == np.float32 else I if arr.dtype == np.int64 else B
        v = Val(self.name("c"), arr.shape, kind, exact)
        self.inits.append(numpy_helper.from_array(arr, v.name))
        if add:
            self.pool.append(v)
        return v

    def node(self, op, ins, outs_spec, add=True, **attrs):
        """outs_spec: [(shape, kind, exact)]; returns the output Vals."""
        outs = [Val(self.name(), s, k, e) for s, k, e in outs_spec]
        self.nodes.append(helper.make_node(op, [i.name if isinstance(i, Val) else i for i in ins],
                                           [o.name for o in outs], **attrs))
        if add:
            self.pool.extend(outs)
        return outs

    def one(self, op, ins, shape, kind=F, exact=False, **attrs):
        return self.node(op, ins, [(shape, kind, exact)], **attrs)[0]

    def vals(self, kind=None, rank=None, min_rank=0):
        return [v for v in self.pool if (kind is None or v.kind == kind) and
                (rank is None or len(v.shape) == rank) and len(v.shape) >= min_rank]

    def choose(self, kind=F, rank=None, min_rank=0):
        vs = self.vals(kind, rank, min_rank)
        if not vs:
            return None
        # Favour recent values (chains), sometimes reuse an old one (several readers).
        return vs[-1 - min(self.r(len(vs)), self.r(3))] if self.coin(0.7) else self.pick(vs)

    def float_val(self, rank=None, min_rank=0):
        v = self.choose(F, rank, min_rank)
        if v is None:
            shape = self.shape_of_rank(rank if rank is not None else max(min_rank, self.r(1, 5)))
            v = self.new_input(shape)
        return v

    def moved_val(self, min_rank=0):
        """The input of a data-movement op: mostly a float value, sometimes an int64 or bool one
        (movement kernels are per dtype)."""
        if self.coin(0.25):
            vs = [v for v in self.vals(I) + self.vals(B) if len(v.shape) >= min_rank]
            if vs:
                return self.pick(vs)
        return self.float_val(min_rank=min_rank)

    def shape_of_rank(self, rank):
        shape = [self.size() for _ in range(rank)]
        while np.prod(shape) > self.numel_cap:
            shape[self.r(rank)] = 1
        return tuple(shape)

    def bcast_shape(self, shape):
        """A shape broadcastable to `shape` (leading dims dropped, some dims 1)."""
        s = list(shape)
        if s and self.coin(0.3):
            s = s[self.r(len(s) + 1):]
        return tuple(1 if self.coin(0.3) else d for d in s)

    def operand(self, shape, kind=F, fresh=False, exact_only=False):
        """A second operand for a binary op on `shape`: an existing value of a compatible shape
        (not when `fresh`; only an exact one with `exact_only`), a new input or a constant, of
        `shape` or broadcastable to it."""
        same = [v for v in self.vals(kind) if v.shape == tuple(shape) and
                (v.exact or not exact_only)]
        if same and not fresh and self.coin(0.35):
            return self.pick(same)
        bs = self.bcast_shape(shape) if self.coin(0.6) else tuple(shape)
        if self.coin(0.5):
            return self.const(self.data(bs, kind))
        return self.new_input(bs, kind)

    # ---- ops ---------------------------------------------------------------------------------
    def op_unary(self):
        x = self.float_val()
        s, kind = x.shape, self.r(14)
        if kind == 0:
            return self.one("Relu", [x], s, exact=x.exact)
        if kind == 1:
            return self.one("Sigmoid", [x], s)
        if kind == 2:
            return self.one("Tanh", [x], s)
        if kind == 3:
            t = self.one("Tanh", [x], s) if not self.coin(0.3) else self.one(
                "Clip", [x, self.const(np.float32(-4)), self.const(np.float32(4))], s,
                exact=x.exact)
            return self.one("Exp", [t], s)
        if kind == 4:
            a = self.one("Abs", [x], s, exact=x.exact)
            p = self.one("Add", [a, self.const(np.float32(0.5))], s)
            return self.one("Log", [p], s)
        if kind == 5:
            return self.one("Sqrt", [self.one("Abs", [x], s, exact=x.exact)], s)
        if kind == 6:
            return self.one("Erf", [x], s)
        if kind == 7 and self.opset >= 20:
            return self.one("Gelu", [x], s, approximate=self.pick(["none", "tanh"]))
        if kind == 8:
            return self.one("LeakyRelu", [x], s, alpha=float(self.pick([0.01, 0.1, 0.2])))
        if kind == 9:
            lo, hi = sorted(self.rng.standard_normal(2).astype(np.float32))
            ins = [x, self.const(np.float32(lo)), self.const(np.float32(hi))]
            if self.coin(0.3):
                ins = ins[:2] if self.coin() else [x, "", ins[2]]
            return self.one("Clip", ins, s, exact=x.exact)
        if kind == 10:
            return self.one("Neg", [x], s, exact=x.exact)
        if kind == 11:
            return self.one("Abs", [x], s, exact=x.exact)
        if kind == 12:
            # x * sigmoid(x) (SiLU), or the GELU spelled out
            if self.coin():
                return self.one("Mul", [x, self.one("Sigmoid", [x], s)], s)
            d = self.one("Div", [x, self.const(np.float32(1.4142135))], s)
            e = self.one("Erf", [d], s)
            a = self.one("Add", [e, self.const(np.float32(1.0))], s)
            m = self.one("Mul", [x, a], s)
            return self.one("Mul", [m, self.const(np.float32(0.5))], s)
        if not x.exact:  # rounding a rounded value flips at integers (and at denormals)
            return self.one("Relu", [x], s)
        return self.one("Floor" if self.coin() else "Ceil", [x], s, exact=True)

    def op_binary(self):
        x = self.float_val()
        y = self.operand(x.shape)
        if self.coin(0.3):
            x, y = y, x
        s = tuple(np.broadcast_shapes(x.shape, y.shape))
        if np.prod(s) > self.numel_cap:
            return None
        op = self.pick(["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Add", "Mul"])
        exact = x.exact and y.exact and op in ("Max", "Min")
        if op == "Div":
            a = self.one("Abs", [y], y.shape, exact=y.exact)
            y = self.one("Add", [a, self.const(np.float32(0.5))], y.shape)
        if op == "Pow":
            if self.coin(0.25):  # a negative base to an integer power (CanonicalizeOps' Pow 2)
                return self.one("Pow", [x, self.const(np.float32(self.pick([2.0, 3.0, 1.0])))],
                                x.shape)
            if self.coin():
                e = self.const(np.float32(self.pick([2.0, 0.5, 3.0, 1.0, -1.0])))
                a = self.one("Abs", [x], x.shape)
                base = self.one("Add", [a, self.const(np.float32(0.25))], x.shape)
                return self.one("Pow", [base, e], x.shape)
            base = self.one("Add", [self.one("Abs", [x], x.shape), self.const(np.float32(0.5))],
                            x.shape)
            ex = self.one("Tanh", [y], y.shape)
            return self.one("Pow", [base, ex], s)
        return self.one(op, [x, y], s, exact=exact)

    def op_compare_where(self):
        x = self.float_val()
        # Two rounded values may tie (tanh(x) < x for tiny x is decided by the last ulp): a
        # rounded value is compared with a fresh input or constant only.
        y = self.operand(x.shape, fresh=not x.exact, exact_only=True)
        s = tuple(np.broadcast_shapes(x.shape, y.shape))
        if np.prod(s) > self.numel_cap:
            return None
        op = self.pick(["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"])
        if op == "Equal" and not (x.exact and y.exact):
            op = "Greater"
        c = self.one(op, [x, y], s, kind=B, exact=True)
        if self.coin(0.3):
            c = self.one("Not", [c], s, kind=B, exact=True)
        if self.coin(0.2):
            other = self.choose(B) or c
            if _bcast(other.shape, s) == s:
                c = self.one(self.pick(["And", "Or", "Xor"]), [c, other], s, kind=B, exact=True)
        if self.coin(0.25):
            return self.one("Cast", [c], s, exact=True, to=TensorProto.FLOAT)
        a = self.float_val() if self.coin(0.4) else x
        b = self.operand(a.shape)
        try:
            so = tuple(np.broadcast_shapes(c.shape, a.shape, b.shape))
        except ValueError:
            return None
        if np.prod(so) > self.numel_cap:
            return None
        return self.one("Where", [c, a, b], so, exact=a.exact and b.exact)

    def op_int(self):
        """Integer and bool work: an int input or an exact float cast to int64, arithmetic, back."""
        x = self.choose(I)
        if x is None or self.coin(0.3):
            f = self.choose(F)
            if f is not None and f.exact and not SPECIALS and self.coin():  # NaN -> int: UB
                fl = self.one("Floor", [f], f.shape, exact=True)
                x = self.one("Cast", [fl], f.shape, kind=I, exact=True, to=TensorProto.INT64)
            else:
                x = self.new_input(self.shape_of_rank(self.r(1, 4)), I)
        y = self.operand(x.shape, I)
        s = tuple(np.broadcast_shapes(x.shape, y.shape))
        op = self.pick(["Add", "Sub", "Mul", "Max", "Min", "Neg", "Abs", "Greater", "Equal",
                        "Where", "CastBool"])
        if op == "Where":
            c = self.one("Greater", [x, y], s, kind=B, exact=True)
            z = self.operand(s, I)
            return self.one("Where", [c, x, z], s, kind=I, exact=True)
        if op == "CastBool":  # int -> bool -> int, and bool -> float
            b = self.one("Cast", [x], x.shape, kind=B, exact=True, to=TensorProto.BOOL)
            if self.coin():
                return self.one("Cast", [b], x.shape, kind=I, exact=True, to=TensorProto.INT64)
            return self.one("Cast", [b], x.shape, exact=True, to=TensorProto.FLOAT)
        if op in ("Neg", "Abs"):
            r = self.one(op, [x], x.shape, kind=I, exact=True)
        elif op in ("Greater", "Equal"):
            r = self.one(op, [x, y], s, kind=B, exact=True)
        else:
            r = self.one(op, [x, y], s, kind=I, exact=True)
        if self.coin(0.6):
            return self.one("Cast", [r], r.shape, exact=True, to=TensorProto.FLOAT)
        return r

    def axes_input(self, axes):
        return self.const(np.array(axes, np.int64))

    def op_reduce(self):
        x = self.float_val(min_rank=1)
        rank = len(x.shape)
        op = self.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                        "ReduceL2", "ReduceLogSumExp", "ReduceProd"])
        if op == "ReduceProd" and np.prod(x.shape) > 64:
            op = "ReduceSum"  # a long product over- and underflows, in an order-dependent way
        if op == "ReduceProd":
            x = self.one("Add", [self.one("Tanh", [x], x.shape), self.const(np.float32(1.5))],
                         x.shape)
        axes = sorted(set(int(a) for a in self.rng.choice(rank, self.r(1, rank + 1),
                                                          replace=False)))
        if self.coin(0.15):
            axes = []
        keep = self.r(2)
        shape = tuple((1 if keep else None) if (i in axes or not axes) else d
                      for i, d in enumerate(x.shape))
        shape = tuple(d for d in shape if d is not None)
        neg = [a - rank if self.coin(0.3) else a for a in axes]
        exact = x.exact and op in ("ReduceMax", "ReduceMin")
        attrs = {"keepdims": keep}
        attr_axes = self.opset < 18 and op != "ReduceSum"
        if attr_axes:
            if neg:
                attrs["axes"] = neg
            return self.one(op, [x], shape, exact=exact, **attrs)
        ins = [x] if not neg else [x, self.axes_input(neg)]
        return self.one(op, ins, shape, exact=exact, **attrs)

    def op_softmax(self):
        x = self.float_val(min_rank=1)
        rank = len(x.shape)
        ax = self.r(-rank, rank)
        return self.one(self.pick(["Softmax", "LogSoftmax", "Softmax"]), [x], x.shape, axis=ax)

    def op_layernorm(self):
        x = self.float_val(min_rank=1)
        rank = len(x.shape)
        ax = self.r(-rank, rank) if self.coin(0.4) else -1
        norm = x.shape[ax % rank:]
        sc = self.const(self.data(norm, F), exact=False)
        ins = [x, sc] + ([self.const(self.data(norm, F))] if self.coin(0.7) else [])
        return self.one("LayerNormalization", ins, x.shape, axis=ax,
                        epsilon=float(self.pick([1e-5, 1e-3])))

    def op_matmul(self):
        x = self.float_val(min_rank=1)
        if len(x.shape) > 4 or (len(x.shape) == 1 and self.coin(0.7)):
            return None
        k = x.shape[-1]
        n = self.size()
        if self.coin(0.6):
            w = self.const(self.data((k, n), F) * np.float32(1 / np.sqrt(k)))
        else:
            lead = x.shape[:-2] if len(x.shape) >= 3 and self.coin(0.5) else ()
            lead = tuple(1 if self.coin(0.3) else d for d in lead)
            w = self.new_input(lead + (k, n))
        if len(x.shape) == 1:
            out = w.shape[:-2] + (n,)
        else:
            out = tuple(np.broadcast_shapes(x.shape[:-2], w.shape[:-2])) + (x.shape[-2], n)
        if np.prod(out) > self.numel_cap:
            return None
        return self.one("MatMul", [x, w], out)

    def op_gemm(self):
        x = self.float_val(rank=2)
        ta, tb = self.r(2), self.r(2)
        m, k = (x.shape[1], x.shape[0]) if ta else x.shape
        n = self.size()
        wshape = (n, k) if tb else (k, n)
        w = self.const(self.data(wshape, F)) if self.coin(0.7) else self.new_input(wshape)
        ins = [x, w]
        if self.coin(0.7):
            cs = self.pick([(n,), (1, n), (m, n), (m, 1), ()])
            ins.append(self.const(self.data(cs, F)) if self.coin(0.8) else self.new_input(cs))
        attrs = dict(transA=ta, transB=tb)
        if self.coin(0.3):
            attrs["alpha"] = float(self.pick([0.5, 2.0]))
        if self.coin(0.3):
            attrs["beta"] = float(self.pick([0.5, 2.0, 0.0]))
        return self.one("Gemm", ins, (m, n), **attrs)

    def image(self):
        v = self.choose(F, rank=4)
        if v is None or self.coin(0.25):
            c = self.pick([1, 2, 3, 4, 5, 8, 12, 15, 16, 17, 24, 32, 33, 40])
            hw = self.pick([1, 3, 5, 7, 8, 9, 12, 16, 17])
            v = self.new_input((self.pick([1, 1, 2]), c, hw, self.pick([hw, hw, 1, 5, 13])))
        return v

    def op_conv(self):
        x = self.image()
        n, c, hh, ww = x.shape
        groups = 1
        r = self.r(4)
        if r == 1:
            groups = c  # depthwise
        elif r == 2:
            divs = [g for g in range(1, c + 1) if c % g == 0]
            groups = self.pick(divs)
        cout = groups * self.r(1, max(2, 40 // groups + 1)) if groups > 1 else self.r(1, 41)
        if r == 1 and self.coin(0.6):
            cout = c
        kh = self.pick([1, 1, 3, 3, 5, 2, 7])
        kw = kh if self.coin(0.8) else self.pick([1, 3])
        stride = self.pick([1, 1, 1, 2, 3])
        dil = self.pick([1, 1, 1, 2])
        pads = [self.r(0, (k - 1) * dil // 2 + 2) for k in (kh, kw)] * 2
        if self.coin(0.2):
            pads = [self.r(0, 3) for _ in range(4)]
        pads = [min(p, k * dil - 1) if k > 1 else 0 for p, k in zip(pads, (kh, kw, kh, kw))]
        oh = (hh + pads[0] + pads[2] - dil * (kh - 1) - 1) // stride + 1
        ow = (ww + pads[1] + pads[3] - dil * (kw - 1) - 1) // stride + 1
        if oh < 1 or ow < 1 or n * cout * oh * ow > self.numel_cap:
            return None
        w = self.const(self.data((cout, c // groups, kh, kw), F) *
                       np.float32(1 / np.sqrt(c // groups * kh * kw)))
        ins = [x, w] + ([self.const(self.data((cout,), F))] if self.coin(0.6) else [])
        attrs = dict(group=groups, strides=[stride, stride], dilations=[dil, dil])
        if self.coin(0.15) and stride == 1 and dil == 1:
            attrs["auto_pad"] = "SAME_UPPER"
            oh, ow = hh, ww
        else:
            attrs["pads"] = pads
        if self.coin(0.5):
            attrs["kernel_shape"] = [kh, kw]
        y = self.one("Conv", ins, (n, cout, oh, ow), **attrs)
        if self.coin(0.5):
            sc = self.rng.uniform(0.5, 1.5, cout).astype(np.float32)
            bi = self.data((cout,), F)
            mean = self.data((cout,), F)
            var = self.rng.uniform(0.5, 2, cout).astype(np.float32)
            y = self.one("BatchNormalization", [y] + [self.const(a) for a in (sc, bi, mean, var)],
                         y.shape, epsilon=1e-5)
        if self.coin(0.6):
            if self.coin():
                y = self.one("Relu", [y], y.shape)
            else:
                y = self.one("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))],
                             y.shape)
        return y

    def conv(self, x, cout, k=3, stride=1, groups=1, dil=1, bias=True):
        """Conv of `x` with "same" padding (at stride 1); the output Val."""
        n, c, hh, ww = x.shape
        p = dil * (k - 1) // 2
        pads = [p, p, dil * (k - 1) - p, dil * (k - 1) - p]
        oh = (hh + pads[0] + pads[2] - dil * (k - 1) - 1) // stride + 1
        ow = (ww + pads[1] + pads[3] - dil * (k - 1) - 1) // stride + 1
        w = self.const(self.data((cout, c // groups, k, k), F) *
                       np.float32(1 / np.sqrt(c // groups * k * k)))
        ins = [x, w] + ([self.const(self.data((cout,), F))] if bias else [])
        return self.one("Conv", ins, (n, cout, oh, ow), group=groups, pads=pads,
                        strides=[stride, stride], dilations=[dil, dil], kernel_shape=[k, k])

    def op_convnet(self):
        """A chain of convolutions with what CNNs put between them (what level 3 runs in the
        blocked layout): activations, BN, residual adds, per-channel scales, squeeze-excitation,
        pools, concats and splits on channels, 2x upsampling; channel counts not whole blocks."""
        chans = [3, 4, 8, 12, 16, 17, 20, 24, 31, 32, 33, 40]
        # Level 3 blocks a conv from NCHW only when its channels nearly fill whole blocks of 16
        # (AssignLayouts' cost rule); after that, any count.
        full = [15, 16, 16, 31, 32]
        x = self.image()
        prev = x
        for step in range(self.r(2, 6)):
            c = x.shape[1]
            kind = self.r(10) if step else 0
            if kind <= 3:
                dw = self.coin(0.3)
                y = self.conv(x, c if dw else self.pick(full if step == 0 else chans),
                              k=self.pick([1, 3, 3, 5]),
                              stride=self.pick([1, 1, 1, 2]), groups=c if dw else 1,
                              dil=self.pick([1, 1, 2]), bias=self.coin(0.8))
            elif kind == 4 and prev.shape == x.shape and prev is not x:
                y = self.one("Add", [x, prev], x.shape)
            elif kind == 5:
                s = self.rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32)
                y = self.one(self.pick(["Mul", "Add"]), [x, self.const(s)], x.shape)
            elif kind == 6:  # squeeze-excitation
                g = self.one("GlobalAveragePool", [x], x.shape[:2] + (1, 1))
                h = self.one("Relu", [self.conv(g, max(1, c // 4), k=1)], g.shape[:1] +
                             (max(1, c // 4), 1, 1))
                e = self.one("Sigmoid", [self.conv(h, c, k=1)], g.shape)
                y = self.one("Mul", [x, e], x.shape)
            elif kind == 7:
                other = self.conv(x, self.pick(chans), k=1)
                y = self.one("Concat", [x, other], (x.shape[0], c + other.shape[1]) +
                             x.shape[2:], axis=1)
            elif kind == 8 and c >= 2:
                a = self.r(1, c)
                y, _ = self.node("Split", [x, self.const(np.array([a, c - a], np.int64))],
                                 [(x.shape[:1] + (a,) + x.shape[2:], F, False),
                                  (x.shape[:1] + (c - a,) + x.shape[2:], F, False)], axis=1)
            elif kind == 9 and np.prod(x.shape) * 4 <= self.numel_cap:
                y = self.one("Resize", [x, "", self.const(np.array([1, 1, 2, 2], np.float32))],
                             x.shape[:2] + (x.shape[2] * 2, x.shape[3] * 2), mode="nearest")
            else:
                y = self.one("MaxPool", [x], x.shape, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            if self.coin(0.5):
                act = self.r(4)
                if act == 0:
                    y = self.one("Relu", [y], y.shape)
                elif act == 1:
                    y = self.one("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))],
                                 y.shape)
                elif act == 2:
                    y = self.one("Mul", [y, self.one("Sigmoid", [y], y.shape)], y.shape)
                else:
                    y = self.one("LeakyRelu", [y], y.shape, alpha=0.1)
            if np.prod(y.shape) > self.numel_cap:
                return y
            prev, x = x, y
        return x

    def op_bn(self):
        x = self.image() if self.coin(0.8) else self.float_val(min_rank=2)
        c = x.shape[1]
        sc = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        var = self.rng.uniform(0.5, 2, c).astype(np.float32)
        return self.one("BatchNormalization", [x, self.const(sc), self.const(self.data((c,), F)),
                                               self.const(self.data((c,), F)), self.const(var)],
                        x.shape, epsilon=1e-5)

    def op_pool(self):
        x = self.image()
        n, c, hh, ww = x.shape
        op = self.pick(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
        if op.startswith("Global"):
            return self.one(op, [x], (n, c, 1, 1), exact=x.exact and op == "GlobalMaxPool")
        k = [self.pick([1, 2, 3]), self.pick([1, 2, 3])]
        if self.coin(0.7):
            k[1] = k[0]
        s = [self.pick([1, 2]), self.pick([1, 2])]
        pads = [self.r(0, kk // 2 + 1) for kk in k] * 2
        ceil = int(self.coin(0.2))
        dims = []
        for i, d in enumerate((hh, ww)):
            num = d + pads[i] + pads[i + 2] - k[i]
            if num < 0:
                return None
            o = (-(-num // s[i]) if ceil else num // s[i]) + 1
            if ceil and (o - 1) * s[i] >= d + pads[i]:
                # The last window would start in the padding: onnxruntime (and PyTorch) drop it,
                # ONNX's shape inference keeps it, and the graph is rejected downstream.
                return None
            dims.append(o)
        attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=ceil)
        if op == "AveragePool":
            attrs["count_include_pad"] = self.r(2)
        return self.one(op, [x], (n, c, dims[0], dims[1]), exact=x.exact and op == "MaxPool",
                        **attrs)

    def op_reshape(self):
        x = self.float_val() if self.coin(0.85) else (self.choose(I) or self.float_val())
        total = int(np.prod(x.shape))
        # a random factorization of total into 1-4 dims
        dims, rest = [], total
        for _ in range(self.r(0, 3)):
            divs = [d for d in range(1, rest + 1) if rest % d == 0]
            d = self.pick(divs)
            dims.append(d)
            rest //= d
        dims.append(rest)
        self.rng.shuffle(dims)
        dims = [int(d) for d in dims]
        spec = list(dims)
        if self.coin(0.4):
            spec[self.r(len(spec))] = -1
        if self.coin(0.2) and len(x.shape) >= 1 and len(spec) >= 1 and spec[0] == x.shape[0]:
            spec[0] = 0
        op = self.r(3)
        if op == 0 or len(x.shape) == 0:
            return self.one("Reshape", [x, self.const(np.array(spec, np.int64))], tuple(dims),
                            kind=x.kind, exact=x.exact)
        if op == 1:
            ax = self.r(-len(x.shape), len(x.shape) + 1)
            a = ax + len(x.shape) if ax < 0 else ax
            a0 = int(np.prod(x.shape[:a]))
            return self.one("Flatten", [x], (a0, total // a0), kind=x.kind, exact=x.exact,
                            axis=ax)
        # Squeeze / Unsqueeze
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if ones and self.coin():
            ax = [i for i in ones if self.coin()] or ones[:1]
            shape = tuple(d for i, d in enumerate(x.shape) if i not in ax)
            axes = [a - len(x.shape) if self.coin(0.3) else a for a in ax]
            return self.one("Squeeze", [x, self.axes_input(axes)], shape, kind=x.kind,
                            exact=x.exact)
        if len(x.shape) >= 5:
            return None
        a = self.r(len(x.shape) + 1)
        shape = x.shape[:a] + (1,) + x.shape[a:]
        return self.one("Unsqueeze", [x, self.axes_input([a])], shape, kind=x.kind,
                        exact=x.exact)

    def op_transpose(self):
        x = self.moved_val(min_rank=2)
        perm = [int(p) for p in self.rng.permutation(len(x.shape))]
        return self.one("Transpose", [x], tuple(x.shape[p] for p in perm), exact=x.exact,
                        kind=x.kind, perm=perm)

    def op_concat(self):
        x = self.float_val(min_rank=1)
        ax = self.r(len(x.shape))
        parts = [x]
        for _ in range(self.r(1, 3)):
            shp = list(x.shape)
            shp[ax] = self.size(8)
            cands = [v for v in self.vals(F) if len(v.shape) == len(shp) and all(
                a == b for i, (a, b) in enumerate(zip(v.shape, shp)) if i != ax)]
            if cands and self.coin(0.6):
                parts.append(self.pick(cands))
            elif self.coin(0.5):
                parts.append(self.const(self.data(tuple(shp), F)))
            else:
                parts.append(self.new_input(tuple(shp)))
        shape = list(x.shape)
        shape[ax] = sum(p.shape[ax] for p in parts)
        if np.prod(shape) > self.numel_cap:
            return None
        return self.one("Concat", parts, tuple(shape), exact=all(p.exact for p in parts),
                        axis=ax - len(shape) if self.coin(0.3) else ax)

    def op_slice(self):
        x = self.moved_val(min_rank=1)
        rank = len(x.shape)
        axes = sorted(set(int(a) for a in self.rng.choice(rank, self.r(1, rank + 1),
                                                          replace=False)))
        starts, ends, steps, shape = [], [], [], list(x.shape)
        for a in axes:
            d = x.shape[a]
            step = self.pick([1, 1, 1, 2, 3, -1, -1, -2])
            if step > 0:
                s = self.r(0, d)
                e = self.r(s + 1, d + 1)
                if self.coin(0.2):
                    e = 2**31  # INT_MAX-like end
                n = len(range(s, min(e, d), step))
                if self.coin(0.3):
                    s -= d  # negative start
            else:
                s = self.r(0, d)
                e = self.r(-1, s)
                n = len(range(s, e, step))
                if e == -1:
                    e = -(2**31)  # to the start
            if n == 0:
                return None
            starts.append(s)
            ends.append(e)
            steps.append(step)
            shape[a] = n
        ins = [x, self.const(np.array(starts, np.int64)), self.const(np.array(ends, np.int64))]
        if self.coin(0.8) or any(s != 1 for s in steps):
            ins += [self.const(np.array(axes, np.int64)), self.const(np.array(steps, np.int64))]
        elif axes != list(range(len(axes))):
            ins.append(self.const(np.array(axes, np.int64)))
        return self.one("Slice", ins, tuple(shape), kind=x.kind, exact=x.exact)

    def op_gather(self):
        x = self.moved_val(min_rank=1)
        rank = len(x.shape)
        ax = self.r(rank)
        d = x.shape[ax]
        ishape = self.pick([(), (self.r(1, 5),), (2, self.r(1, 4))])
        idx = self.rng.integers(-d, d, size=ishape).astype(np.int64)
        shape = x.shape[:ax] + tuple(ishape) + x.shape[ax + 1:]
        if np.prod(shape) > self.numel_cap:
            return None
        iv = self.const(idx) if self.coin(0.7) else self.new_input(ishape, I)
        if iv.name in self.feeds:
            self.feeds[iv.name] = self.rng.integers(-d, d, size=ishape).astype(np.int64)
        return self.one("Gather", [x, iv], shape, kind=x.kind, exact=x.exact,
                        axis=ax - rank if self.coin(0.3) else ax)

    def op_expand(self):
        x = self.moved_val()
        shape = [d if d != 1 else self.pick([1, 2, 3, 17]) for d in x.shape]
        if self.coin(0.3) and len(shape) < 4:
            shape = [self.pick([2, 3])] + shape
        if np.prod(shape) > self.numel_cap:
            return None
        spec = [1 if (i >= len(shape) - len(x.shape) and x.shape[i - len(shape) + len(x.shape)]
                      == d and self.coin(0.3)) else d for i, d in enumerate(shape)]
        return self.one("Expand", [x, self.const(np.array(spec, np.int64))], tuple(shape),
                        kind=x.kind, exact=x.exact)

    def op_split(self):
        x = self.moved_val(min_rank=1)
        ax = self.r(len(x.shape))
        d = x.shape[ax]
        if d < 2:
            return None
        k = self.r(2, min(d, 4) + 1)
        if self.coin(0.5):
            cuts = sorted(self.rng.choice(np.arange(1, d), k - 1, replace=False))
            sizes = np.diff([0] + [int(c) for c in cuts] + [d]).tolist()
            ins = [x, self.const(np.array(sizes, np.int64))]
            attrs = {}
        else:
            per = -(-d // k)
            sizes = [min(per, d - i * per) for i in range(k) if d - i * per > 0]
            if self.opset < 18 and d % k != 0:
                return None
            ins, attrs = [x], ({"num_outputs": len(sizes)} if self.opset >= 18 else {})
            if self.opset < 18:
                sizes = [d // k] * k
        specs = []
        for sz in sizes:
            shp = list(x.shape)
            shp[ax] = sz
            specs.append((tuple(shp), x.kind, x.exact))
        return self.node("Split", ins, specs, axis=ax, **attrs)[0]

    def op_pad(self):
        x = self.float_val(min_rank=1)
        rank = len(x.shape)
        mode = self.pick(["constant", "constant", "reflect", "edge"])
        pads = []
        for i in range(2 * rank):
            d = x.shape[i % rank]
            lim = d - 1 if mode == "reflect" else 3
            pads.append(self.r(0, lim + 1) if self.coin(0.5) else 0)
        if mode == "constant" and self.coin(0.3):
            pads = [p - self.r(0, 2) if x.shape[i % rank] > 2 else p for i, p in enumerate(pads)]
        shape = tuple(d + pads[i] + pads[i + rank] for i, d in enumerate(x.shape))
        if min(shape) < 1 or np.prod(shape) > self.numel_cap:
            return None
        ins = [x, self.const(np.array(pads, np.int64))]
        if mode == "constant" and self.coin(0.5):
            ins.append(self.const(np.float32(self.pick([0.0, 1.5, -2.0]))))
        return self.one("Pad", ins, shape, exact=x.exact, mode=mode)

    def op_resize(self):
        x = self.image()
        n, c, hh, ww = x.shape
        mode = self.pick(["nearest", "linear", "nearest"])
        sc = self.pick([2.0, 2.0, 3.0, 0.5])
        oh, ow = int(np.floor(hh * sc)), int(np.floor(ww * sc))
        if oh < 1 or ow < 1 or n * c * oh * ow > self.numel_cap:
            return None
        attrs = {"mode": mode}
        if mode == "nearest":
            attrs["nearest_mode"] = self.pick(["floor", "round_prefer_floor"])
            attrs["coordinate_transformation_mode"] = self.pick(["asymmetric", "half_pixel"])
        else:
            attrs["coordinate_transformation_mode"] = self.pick(["half_pixel", "align_corners",
                                                                 "asymmetric"])
        # With scales, align_corners divides by (in * scale - 1) in the ONNX reference and by
        # (floor(in * scale) - 1) in onnxruntime: only sizes are unambiguous there.
        fractional = hh * sc != oh or ww * sc != ow
        if self.coin() and not (fractional and attrs["coordinate_transformation_mode"] ==
                                "align_corners"):
            ins = [x, "", self.const(np.array([1, 1, sc, sc], np.float32))]
        else:
            ins = [x, "", "", self.const(np.array([n, c, oh, ow], np.int64))]
        return self.one("Resize", ins, (n, c, oh, ow), exact=x.exact and mode == "nearest",
                        **attrs)

    def op_cumsum(self):
        x = self.float_val(min_rank=1)
        ax = self.r(-len(x.shape), len(x.shape))
        return self.one("CumSum", [x, self.const(np.array(ax, np.int64))], x.shape,
                        exclusive=self.r(2), reverse=self.r(2))

    def op_argmax(self):
        cands = [v for v in self.vals(F, min_rank=1) if v.exact]
        x = self.pick(cands) if cands else self.new_input(self.shape_of_rank(self.r(1, 4)))
        rank = len(x.shape)
        ax = self.r(-rank, rank)
        keep = self.r(2)
        shape = tuple(1 if i == ax % rank else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i != ax % rank)
        op = self.pick(["ArgMax", "ArgMin"])
        r = self.one(op, [x], shape, kind=I, exact=True, axis=ax, keepdims=keep)
        if self.coin(0.5):
            return self.one("Cast", [r], shape, exact=True, to=TensorProto.FLOAT)
        return r

    def op_topk(self):
        cands = [v for v in self.vals(F, min_rank=1) if v.exact]
        x = self.pick(cands) if cands else self.new_input(self.shape_of_rank(self.r(1, 4)))
        rank = len(x.shape)
        ax = self.r(-rank, rank)
        d = x.shape[ax % rank]
        k = self.r(1, d + 1)
        shape = tuple(k if i == ax % rank else s for i, s in enumerate(x.shape))
        vals, idx = self.node("TopK", [x, self.const(np.array([k], np.int64))],
                              [(shape, F, True), (shape, I, True)], axis=ax,
                              largest=self.r(2), sorted=1)
        return vals

    def op_misc_shape(self):
        """Shape / Size arithmetic (folded), Identity and the `Reshape(x, Shape(y))` idiom."""
        x = self.float_val(min_rank=1)
        sh = self.one("Shape", [x], (len(x.shape),), kind=I, exact=True, add=False)
        return self.one("Reshape", [self.one("Identity", [x], x.shape, exact=x.exact), sh],
                        x.shape, exact=x.exact)

    def op_const_chain(self):
        """Work on constants alone (FoldConstants evaluates it), then joined with a live value."""
        x = self.float_val()
        shape = self.bcast_shape(x.shape)
        c = self.const(self.data(shape, F))
        for _ in range(self.r(1, 4)):
            k = self.r(4)
            if k == 0:
                c = self.one("Mul", [c, self.const(self.data(self.bcast_shape(shape), F))], shape)
            elif k == 1:
                c = self.one(self.pick(["Relu", "Tanh", "Neg", "Sigmoid"]), [c], shape)
            elif k == 2 and len(shape) >= 2:
                perm = list(range(len(shape)))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                t = self.one("Transpose", [c], tuple(shape[p] for p in perm), perm=perm)
                c = self.one("Transpose", [t], shape, perm=perm)
            else:
                c = self.one("Add", [c, self.const(np.float32(self.rng.standard_normal()))], shape)
        return self.one(self.pick(["Add", "Mul", "Sub"]), [x, c], x.shape)

    def mean(self, x, axes):
        shape = tuple(1 if i in [a % len(x.shape) for a in axes] else d
                      for i, d in enumerate(x.shape))
        if self.opset < 18:
            return self.one("ReduceMean", [x], shape, axes=axes, keepdims=1)
        return self.one("ReduceMean", [x, self.axes_input(axes)], shape, keepdims=1)

    def op_spelled_norm(self):
        """LayerNorm / RMSNorm spelled out in primitives (what RecognizeComposites matches), now
        and then a near miss: the second mean over another axis, no eps, a full-shape gamma."""
        x = self.float_val(min_rank=1)
        rank = len(x.shape)
        ax = [-1] if self.coin(0.7) else [rank - 1] if self.coin() else [self.r(rank)]
        ax2 = ax if self.coin(0.85) else [self.r(rank)]
        s = x.shape
        rms = self.coin(0.35)
        if rms:
            d = x
        else:
            d = self.one("Sub", [x, self.mean(x, ax)], s)
        sq = self.one("Mul", [d, d], s) if self.coin() else self.one(
            "Pow", [d, self.const(np.float32(2.0))], s)
        v = self.mean(sq, ax2)
        if self.coin(0.8):
            v = self.one("Add", [v, self.const(np.float32(self.pick([1e-5, 1e-6, 1e-3])))],
                         v.shape)
        r = self.one("Sqrt", [v], v.shape)
        n = self.one("Div", [d, r], s) if self.coin(0.7) else self.one(
            "Mul", [d, self.one("Reciprocal", [r], r.shape)], s)
        if self.coin(0.7):
            gs = (s[-1],) if self.coin(0.7) else s[-1:] if self.coin() else s
            n = self.one("Mul", [n, self.const(self.data(gs, F))], s)
            if self.coin(0.7) and not rms:
                n = self.one("Add", [n, self.const(self.data(gs, F))], s)
        return n

    def op_spelled_act(self):
        """HardSwish and the tanh GELU spelled out, sometimes with a constant that is off."""
        x = self.float_val()
        s = x.shape
        off = self.coin(0.25)
        if self.coin():
            a = self.one("Add", [x, self.const(np.float32(2.5 if off else 3.0))], s)
            c = self.one("Clip", [a, self.const(np.float32(0)), self.const(np.float32(6))], s)
            m = self.one("Mul", [x, c], s)
            return self.one("Div", [m, self.const(np.float32(6.0))], s)
        x3 = self.one("Pow", [x, self.const(np.float32(3.0))], s)
        q = self.one("Mul", [x3, self.const(np.float32(0.05 if off else 0.044715))], s)
        a = self.one("Add", [x, q], s)
        t = self.one("Tanh", [self.one("Mul", [a, self.const(np.float32(0.7978846))], s)], s)
        o = self.one("Add", [t, self.const(np.float32(1.0))], s)
        h = self.one("Mul", [x, self.const(np.float32(0.5))], s)
        return self.one("Mul", [h, o], s)

    def op_attention(self):
        """MatMul(Softmax(Q K^T * scale [+ mask]), V) (RecognizeAttention), odd sizes."""
        b, h = self.pick([1, 2]), self.pick([1, 2, 3])
        sq, sk, d = self.size(), self.size(), self.pick([1, 4, 8, 15, 16, 17, 32, 64])
        lead = (b, h) if self.coin(0.7) else (b * h,)
        q = self.new_input(lead + (sq, d))
        k = self.new_input(lead + (sk, d)) if self.coin(0.8) else self.const(
            self.data(lead + (sk, d), F))
        v = self.new_input(lead + (sk, self.pick([d, d, 5, 16])))
        perm = list(range(len(lead))) + [len(lead) + 1, len(lead)]
        kt = self.one("Transpose", [k], lead + (d, sk), perm=perm)
        sc = self.one("MatMul", [q, kt], lead + (sq, sk))
        scale = np.float32(1 / np.sqrt(d))
        sc = self.one("Mul", [sc, self.const(scale)], sc.shape) if self.coin() else self.one(
            "Div", [sc, self.const(np.float32(np.sqrt(d)))], sc.shape)
        if self.coin(0.5):
            ms = self.pick([(sq, sk), (sk,), lead[:1] + (1,) * (len(lead) - 1) + (1, sk)])
            mask = np.where(self.rng.random(ms) < 0.2, -1e4, 0).astype(np.float32)
            sc = self.one("Add", [sc, self.const(mask) if self.coin() else self.new_input(ms)],
                          sc.shape)
        ax = -1 if self.coin(0.85) else -2
        p = self.one("Softmax", [sc], sc.shape, axis=ax)
        return self.one("MatMul", [p, v], lead + (sq, v.shape[-1]))

    def op_shuffle(self):
        """Channel moves: ShuffleNet's Reshape-Transpose-Reshape, channel Slice/Gather/Concat
        chains (FuseChannelMoves) on an image."""
        x = self.image()
        n, c, hh, ww = x.shape
        divs = [g for g in range(2, c + 1) if c % g == 0]
        if divs and self.coin(0.6):
            g = self.pick(divs)
            r = self.one("Reshape", [x, self.const(np.array([n, g, c // g, hh, ww], np.int64))],
                         (n, g, c // g, hh, ww), exact=x.exact)
            t = self.one("Transpose", [r], (n, c // g, g, hh, ww), exact=x.exact,
                         perm=[0, 2, 1, 3, 4])
            return self.one("Reshape", [t, self.const(np.array([n, c, hh, ww], np.int64))],
                            x.shape, exact=x.exact)
        idx = self.rng.permutation(c)[:self.r(1, c + 1)].astype(np.int64)
        y = self.one("Gather", [x, self.const(idx)], (n, len(idx), hh, ww), exact=x.exact,
                     axis=1)
        if self.coin():
            z = self.one("Slice", [x, self.const(np.array([0], np.int64)),
                                   self.const(np.array([max(1, c // 2)], np.int64)),
                                   self.const(np.array([1], np.int64))],
                         (n, max(1, c // 2), hh, ww), exact=x.exact)
            y = self.one("Concat", [z, y], (n, z.shape[1] + y.shape[1], hh, ww),
                         exact=x.exact, axis=1)
        return y

    def op_cast_chain(self):
        """Casts through narrower or other types: float -> int64 -> float truncates, float ->
        bool -> float is x != 0, int64 -> float -> int64 is exact for small ints."""
        x = self.float_val()
        k = self.r(3) if not SPECIALS else 2  # a NaN cast to an integer is undefined
        if k == 0:
            base = x if x.exact else self.one("Floor", [self.one("Mul", [
                self.new_input(x.shape), self.const(np.float32(3))], x.shape, exact=True)],
                x.shape, exact=True)
            i = self.one("Cast", [base], x.shape, kind=I, exact=True, to=TensorProto.INT64)
            return self.one("Cast", [i], x.shape, exact=True, to=TensorProto.FLOAT)
        if k == 1:  # x != 0 of a rounded x flips where it underflows: exact values only
            x = x if x.exact else self.new_input(x.shape)
            y = self.one("Relu", [x], x.shape, exact=x.exact)
            b = self.one("Cast", [y], x.shape, kind=B, exact=x.exact, to=TensorProto.BOOL)
            return self.one("Cast", [b], x.shape, exact=x.exact, to=TensorProto.FLOAT)
        i = self.choose(I) or self.new_input(self.shape_of_rank(self.r(1, 4)), I)
        f = self.one("Cast", [i], i.shape, exact=True, to=TensorProto.FLOAT)
        return self.one("Cast", [f], i.shape, kind=I, exact=True, to=TensorProto.INT64)

    def op_matmul_forms(self):
        """Sibling MatMuls of one activation (MergeSiblingMatMuls), a MatMul by a transposed
        operand (FoldTransposeIntoGemm), Reshape-Gemm-Reshape (UnflattenMatMul), and an
        elementwise epilogue on the product with operands of assorted shapes."""
        x = self.float_val(min_rank=2)
        if len(x.shape) > 4:
            return None
        k, m = x.shape[-1], x.shape[-2]
        kind = self.r(4)
        if kind == 0:
            outs = []
            for _ in range(self.r(2, 4)):
                n = self.size()
                y = self.one("MatMul", [x, self.const(self.data((k, n), F))], x.shape[:-1] + (n,))
                if self.coin():
                    y = self.one("Add", [y, self.const(self.data((n,), F))], y.shape)
                outs.append(y)
            return outs[-1]
        if kind == 1:
            n = self.size()
            w = self.const(self.data((n, k), F)) if self.coin() else self.new_input((n, k))
            wt = self.one("Transpose", [w], (k, n), perm=[1, 0])
            return self.one("MatMul", [x, wt], x.shape[:-1] + (n,))
        if kind == 2 and len(x.shape) >= 3:
            rows = int(np.prod(x.shape[:-1]))
            n = self.size()
            r = self.one("Reshape", [x, self.const(np.array([-1, k], np.int64))], (rows, k))
            g = self.one("Gemm", [r, self.const(self.data((k, n), F)),
                                  self.const(self.data((n,), F))], (rows, n))
            return self.one("Reshape", [g, self.const(np.array(x.shape[:-1] + (n,), np.int64))],
                            x.shape[:-1] + (n,))
        n = self.size()
        y = self.one("MatMul", [x, self.const(self.data((k, n), F))], x.shape[:-1] + (n,))
        for _ in range(self.r(1, 4)):
            os_ = self.pick([(n,), (m, 1), (1,), y.shape, (1, n), y.shape[:-2] + (1, 1)])
            o = self.const(self.data(os_, F)) if self.coin() else self.new_input(os_)
            y = self.one(self.pick(["Add", "Mul", "Sub", "Max"]), [y, o], y.shape)
            if self.coin(0.4):
                y = self.one(self.pick(["Relu", "Sigmoid", "Tanh"]), [y], y.shape)
        return y

    OPS = [("op_unary", 10), ("op_binary", 12), ("op_compare_where", 4), ("op_int", 2),
           ("op_reduce", 4), ("op_softmax", 3), ("op_layernorm", 2), ("op_matmul", 3),
           ("op_gemm", 2), ("op_conv", 5), ("op_convnet", 4), ("op_bn", 1), ("op_pool", 2),
           ("op_reshape", 4),
           ("op_transpose", 3), ("op_concat", 2), ("op_slice", 3), ("op_gather", 2),
           ("op_expand", 1), ("op_split", 2), ("op_pad", 2), ("op_resize", 1), ("op_cumsum", 1),
           ("op_argmax", 1), ("op_topk", 1), ("op_misc_shape", 1),
           ("op_const_chain", 2), ("op_spelled_norm", 2), ("op_spelled_act", 1),
           ("op_attention", 2), ("op_shuffle", 2), ("op_cast_chain", 1), ("op_matmul_forms", 3)]

    def build(self) -> onnx.ModelProto:
        names = [n for n, _ in self.OPS]
        w = np.array([wt for _, wt in self.OPS], float)
        # Each graph leans towards a few families: conv nets, or matrix/row work.
        w *= self.rng.uniform(0.2, 2.0, len(w))
        if self.coin(0.3):  # a conv net
            w[names.index("op_convnet")] *= 8
        if SPECIALS:
            # Where NaN and Inf meet zeros that a kernel never multiplies (a conv's padding, a
            # Winograd transform's), the NaN positions depend on the algorithm; NaN through
            # MaxPool/ArgMax/TopK is another campaign's. Those ops stay out of this one.
            for op in ("op_conv", "op_convnet", "op_pool", "op_argmax", "op_topk", "op_bn",
                       "op_resize", "op_shuffle"):
                w[names.index(op)] = 0
        w /= w.sum()
        self.new_input(self.shape_of_rank(self.r(1, 5)) if self.coin(0.6) else
                       (1, self.pick([3, 8, 16, 17]), self.pick([5, 8, 9]), self.pick([5, 8, 9])))
        tries = 0
        while len(self.nodes) < self.budget and tries < 200:
            tries += 1
            getattr(self, names[self.rng.choice(len(names), p=w)])()
        # Outputs: every value no node reads, plus a few that are also read (intermediates).
        read = {i for nd in self.nodes for i in nd.input}
        made = [v for v in self.pool if v.name not in self.feeds and v.name not in
                {t.name for t in self.inits}]
        outs = [v for v in made if v.name not in read]
        outs += [v for v in made if v.name in read and self.coin(0.15)]
        if not outs:
            outs = made[-1:] or [self.one("Identity", [self.pool[0]], self.pool[0].shape,
                                          kind=self.pool[0].kind)]
        # Unused inputs are dropped (pypto and ORT agree on them, but they only add noise).
        used = read | {v.name for v in outs}
        inputs = [i for i in self.inputs if i.name in used]
        self.feeds = {k: v for k, v in self.feeds.items() if k in used}
        # Now and then the inputs' sizes are declared symbolic (a name per input and axis, so
        # nothing is known equal): the compiler's paths for shapes known only at run time.
        symbolic = self.coin(0.25)
        if symbolic:
            for vi in inputs:
                for a, d in enumerate(vi.type.tensor_type.shape.dim):
                    if self.coin(0.6):
                        d.dim_param = f"{vi.name}_d{a}"
        outputs = [helper.make_tensor_value_info(v.name, _ONNX_TYPE[v.kind],
                                                 None if symbolic else list(v.shape))
                   for v in outs]
        g = helper.make_graph(self.nodes, "fuzz", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        return m


def _bcast(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def make_case(seed: int):
    """(model, feeds) for a seed: deterministic."""
    g = Gen(seed)
    return g.build(), g.feeds


# ---- running and comparing -------------------------------------------------------------------
def run_ort(model, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def compare(got, want, tol=1e-4, sens=None) -> str | None:
    """None when `got` matches the reference `want`, else why not. `sens`: how far the reference
    itself moves when its inputs and constants move by a few float32 ulps (`sensitivity`): a float
    tolerance of at least 30x that, and integers/bools from an unstable comparison (sens True)
    not compared."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    if want.dtype.kind in "biu":
        if got.dtype.kind not in "biu" or (not np.array_equal(got, want) and sens is not True):
            bad = int(np.sum(got != want)) if got.shape == want.shape else -1
            return f"{bad} of {want.size} integer/bool elements differ (dtype {got.dtype})"
        return None
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    nw, ng = np.isnan(want), np.isnan(got)
    if not np.array_equal(nw, ng) and not (sens is not None and sens == np.inf):
        return f"NaN positions differ ({int(nw.sum())} in ref, {int(ng.sum())} got)"
    fin = ~nw & ~ng
    if not fin.any():
        return None
    w, gg = want[fin], got[fin]
    infw = np.isinf(w)
    if (not np.array_equal(w[infw], gg[infw]) or np.isinf(gg[~infw]).any()) and not (
            sens is not None and sens == np.inf):
        return "Inf positions differ"
    keep = ~np.isinf(w) & ~np.isinf(gg)
    w, gg = w[keep], gg[keep]
    if w.size == 0:
        return None
    scale = max(1.0, float(np.abs(w).max()))
    d = float(np.abs(w - gg).max())
    allowed = max(tol * scale, 30 * float(sens or 0))
    if d > allowed:
        return f"max|diff| {d:.3g} > {allowed:.3g} (tol {tol:g} * {scale:.3g}, sens {sens})"
    return None


def _perturbed(model, feeds, rng, rel=2.4e-7):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    params = {i for n in m.graph.node if n.op_type == "Resize" for i in n.input[1:]}
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in params:
            a = numpy_helper.to_array(t)
            a = (a * (1 + rel * rng.choice([-1.0, 1.0], a.shape))).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    f = {k: ((v * (1 + rel * rng.choice([-1.0, 1.0], v.shape))).astype(np.float32)
             if v.dtype == np.float32 else v) for k, v in feeds.items()}
    return m, f


def sensitivity(model, feeds, want, tries=3):
    """Per output, how far onnxruntime's own result moves when every float input and constant
    moves by two ulps: a float (max|change|; inf where NaN/Inf positions move), or True for an
    integer/bool output that changes (a comparison on the edge), else 0."""
    rng = np.random.default_rng(0)
    sens = [0.0] * len(want)
    for _ in range(tries):
        m, f = _perturbed(model, feeds, rng)
        try:
            outs = run_ort(m, f)
        except Exception:  # noqa: BLE001 - no measure: no leniency
            return [0.0] * len(want)
        for k, (o, w) in enumerate(zip(outs, want)):
            if w.dtype.kind in "biu":
                if not np.array_equal(o, w):
                    sens[k] = True
                continue
            o, w = o.astype(np.float64), w.astype(np.float64)
            if not np.array_equal(np.isfinite(o), np.isfinite(w)):
                sens[k] = np.inf
            elif sens[k] is not True:
                fin = np.isfinite(w)
                d = float(np.abs(o[fin] - w[fin]).max()) if fin.any() else 0.0
                sens[k] = max(sens[k], d)
    return sens


RUNS = [(0, 1), (1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (3, 4)]


def check_case(model, feeds, runs=RUNS, tol=1e-4, conditioned=True, second_opinion=True,
               roundtrip=True):
    """Runs the model on onnxruntime and pypto; returns a list of findings (strings), empty when
    all agree. A model onnxruntime rejects is the generator's fault: ('skip', reason). With
    `conditioned`, an output that differs is compared again within what two-ulp perturbations
    of the inputs do to the reference (ill-conditioned graphs are not findings). With
    `second_opinion`, differences where PyPTO agrees with the ONNX reference evaluator instead
    are returned as ('disagree', what): onnxruntime's numerics or reading of the spec. With
    `roundtrip`, the one-thread level 2 and 3 compiles run after a pypto.save / pypto.load."""
    import pypto
    try:
        want = run_ort(model, feeds)
    except Exception as e:  # noqa: BLE001 - a generator slip, not a finding
        return ("skip", f"onnxruntime: {str(e)[:300]}")
    findings = []
    saved = pypto.get_num_threads()
    data = model.SerializeToString()
    names = [o.name for o in model.graph.output]
    sens = second = None
    disagree = []
    try:
        for level, threads in runs:
            pypto.set_num_threads(threads)
            try:
                exe = pypto.onnx.load(data, level=level)
                if roundtrip and level >= 2 and threads == 1:  # through pypto.save / load too
                    with tempfile.TemporaryDirectory() as tmp:
                        pypto.save(exe, os.path.join(tmp, "m.pto"))
                        exe = pypto.load(os.path.join(tmp, "m.pto"))
                got = exe(**{k: v.copy() for k, v in feeds.items()})
            except Exception as e:  # noqa: BLE001
                findings.append(f"L{level} t{threads}: error {type(e).__name__}: "
                                f"{str(e).splitlines()[0][:300] if str(e) else ''}")
                continue
            if len(want) == 1:
                got = (got,)
            for k, (name, gv, wv) in enumerate(zip(names, got, want)):
                why = compare(gv, wv, tol)
                if why and conditioned:
                    if sens is None:
                        sens = sensitivity(model, feeds, want)
                    why = compare(gv, wv, tol, sens[k])
                if why and second_opinion:
                    if second is None:
                        second = run_onnx_reference(model, feeds) or []
                    if second and not compare(gv, second[k], tol, sens[k] if sens else None):
                        disagree.append(f"L{level} t{threads}: output {name}: {why}")
                        continue
                    # Two references apart by d: rounding noise of that size is no finding.
                    noise = _float_gap(wv, second[k]) if second else 0.0
                    own = float((sens[k] if sens else 0) or 0)
                    if noise and not compare(gv, wv, tol, max(own, noise / 2)):
                        continue
                if why:
                    findings.append(f"L{level} t{threads}: output {name}: {why}")
    finally:
        pypto.set_num_threads(saved)
    if disagree and not findings:
        return ("disagree", " | ".join(disagree))
    return findings


def _float_gap(a, b) -> float:
    """max|a - b| over the finite elements of two float arrays of one shape, else 0."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind != "f" or b.dtype.kind != "f":
        return 0.0
    fin = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[fin].astype(np.float64) - b[fin]).max()) if fin.any() else 0.0


def run_onnx_reference(model, feeds):
    """The ONNX package's own reference evaluator (numpy): a second opinion where onnxruntime
    and PyPTO differ; None when it cannot run the model."""
    try:
        from onnx.reference import ReferenceEvaluator
        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]
    except Exception:  # noqa: BLE001
        return None


# ---- the torch-level variant -----------------------------------------------------------------
def make_torch_case(seed: int):
    """A random nn.Module of torch ops (views, permute, slicing, where, masked_fill, cat, ...)
    and its example inputs."""
    import torch
    rng = np.random.default_rng(seed)
    steps = []
    rank = int(rng.integers(2, 5))
    shape = [int(rng.choice(ODD_SIZES)) for _ in range(rank)]
    while np.prod(shape) > 20000:
        shape[int(rng.integers(rank))] = 1
    n = int(rng.integers(3, 12))
    for _ in range(n):
        steps.append(int(rng.integers(0, 20)))
    params = rng.standard_normal(shape).astype(np.float32)
    wdim = int(rng.choice(ODD_SIZES))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("p", torch.from_numpy(params))
            self.lin = torch.nn.Linear(shape[-1], wdim)
            self.lin2 = torch.nn.Linear(wdim, shape[-1])

        def forward(self, x, y):
            outs = []
            for s in steps:
                if s == 0:
                    x = torch.relu(x) + y
                elif s == 1:
                    x = x.transpose(-1, -2).contiguous().transpose(-1, -2) * 0.5
                elif s == 2:
                    x = torch.where(x > 0.1, x, y * 2)
                elif s == 3:
                    x = x.masked_fill(y < -0.5, -1.0)
                elif s == 4:
                    x = torch.softmax(x, dim=int(seed % x.dim()))
                elif s == 5:
                    x = torch.cat([x[..., :1], x[..., 1:] * 2], dim=-1)
                elif s == 6:
                    x = self.lin2(torch.nn.functional.gelu(self.lin(x)))
                elif s == 7:
                    x = x - x.mean(dim=-1, keepdim=True)
                elif s == 8:
                    x = torch.sigmoid(x) * x + self.p
                elif s == 9:
                    outs.append(x.sum(dim=0))
                elif s == 10:
                    x = torch.flip(x, dims=[-1]) + x
                elif s == 11:
                    x = torch.nn.functional.layer_norm(x, x.shape[-1:])
                elif s == 12:
                    x = x.clamp(-1, 1) / (y.abs() + 1)
                elif s == 13:
                    x = x.reshape(-1).reshape(x.shape).tanh()
                elif s == 14:
                    x = torch.maximum(x, y.flip(0)).exp().log1p()
                elif s == 15:
                    outs.append(x.amax(dim=-1))
                elif s == 16:
                    x = x[..., ::2].repeat_interleave(2, dim=-1)[..., :x.shape[-1]] + x
                elif s == 17:
                    x = torch.cumsum(x, dim=-1) * 0.1
                elif s == 18:
                    x = x.permute(*reversed(range(x.dim()))).contiguous().permute(
                        *reversed(range(x.dim()))) + 1
                else:
                    x = torch.nn.functional.leaky_relu(x, 0.1) ** 2
            return (x, *outs)

    torch.manual_seed(seed)
    m = M().eval()
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    return m, (x, y)


def check_torch_case(seed: int, levels=(1, 2, 3), tol=1e-4):
    import torch
    import pypto
    m, args = make_torch_case(seed)
    with torch.no_grad():
        want = m(*args)
    findings = []
    for level in levels:
        try:
            fast = pypto.optimize(m, args, level=level)
            with torch.no_grad():
                got = fast(*args)
        except Exception as e:  # noqa: BLE001
            findings.append(f"L{level}: error {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        got = got if isinstance(got, (tuple, list)) else (got,)
        for i, (g, w) in enumerate(zip(got, want)):
            why = compare(g.detach().numpy(), w.numpy(), tol)
            if why:
                findings.append(f"L{level}: output {i}: {why}")
    return findings


# ---- the campaign driver ---------------------------------------------------------------------
def _worker(conn, torch_mode):
    while True:
        seed = conn.recv()
        if seed is None:
            return
        try:
            if torch_mode:
                res = check_torch_case(seed)
            else:
                model, feeds = make_case(seed)
                res = check_case(model, feeds)
        except Exception:  # noqa: BLE001
            res = [f"harness: {traceback.format_exc()[-600:]}"]
        conn.send(res)


def campaign(seeds, out, timeout, torch_mode=False):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    os.makedirs(os.path.join(out, "fail"), exist_ok=True)
    log = open(os.path.join(out, "torch.log" if torch_mode else "campaign.log"), "a")
    proc = conn = None
    counts = {"ok": 0, "skip": 0, "fail": 0, "crash": 0, "timeout": 0}
    t0 = time.time()
    def start():
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, torch_mode), daemon=True)
        proc.start()
        child.close()  # the worker's end: its death is then an EOF here
        return proc, conn

    for seed in seeds:
        if proc is None or not proc.is_alive():
            proc, conn = start()
        try:
            conn.send(seed)
        except OSError:  # the worker died after its last answer
            proc, conn = start()
            conn.send(seed)
        done = False
        try:
            done = conn.poll(timeout)
        except (EOFError, OSError):
            done = True
        if done:
            try:
                res = conn.recv()
            except (EOFError, OSError):
                proc.join(5)
                res = [f"crash: the worker died (exit {proc.exitcode})"]
        else:
            res = [f"timeout after {timeout} s"]
            proc.kill()
            proc.join()
            proc = None
        if proc is not None and not proc.is_alive():
            res = res if res and "crash" in str(res) else ["crash: worker died (exit %s)" %
                                                           proc.exitcode]
            proc = None
        if isinstance(res, tuple):  # ('skip' | 'disagree', why)
            counts[res[0]] = counts.get(res[0], 0) + 1
            log.write(f"{seed} {res[0].upper()} {res[1][:300]}\n")
        elif res:
            kind = "timeout" if "timeout" in res[0] else "crash" if "crash" in res[0] else "fail"
            counts[kind] += 1
            log.write(f"{seed} {kind.upper()} " + " | ".join(res)[:1500] + "\n")
            if not torch_mode:
                onnx.save(make_case(seed)[0], os.path.join(out, "fail", f"{seed}.onnx"))
        else:
            counts["ok"] += 1
        if (seed - seeds[0]) % 1000 == 999:
            print(f"seed {seed}: {counts} in {time.time() - t0:.0f} s", flush=True)
        log.flush()
    if proc is not None:
        conn.send(None)
        proc.join(5)
    print(f"{len(seeds)} cases in {time.time() - t0:.0f} s: {counts}")
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:100", help="first:last (exclusive)")
    ap.add_argument("--out", default="/tmp/dfz")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--one", type=int, help="run one seed in this process and print findings")
    ap.add_argument("--save", help="with --one: write the model here")
    ap.add_argument("--torch", action="store_true", help="the torch-level variant")
    a = ap.parse_args()
    if a.one is not None:
        if a.torch:
            print(check_torch_case(a.one))
            return
        model, feeds = make_case(a.one)
        if a.save:
            onnx.save(model, a.save)
        print(onnx.helper.printable_graph(model.graph))
        print(check_case(model, feeds))
        return
    lo, hi = (int(x) for x in a.seeds.split(":"))
    campaign(range(lo, hi), a.out, a.timeout, a.torch)


if __name__ == "__main__":
    sys.exit(main())
