"""ONNX Runtime's QOperator ops (domain com.microsoft: QLinearAdd, QGemm, ...; what quantize_static
writes with QuantFormat.QOperator) against ONNX Runtime: single-node graphs from onnx.helper, then
whole quantized CNN and transformer files. Pass LowerQLinearOps (level 2+) runs them as
DequantizeLinear -> float op -> QuantizeLinear on the CPU kernels; the reference interpreter
(level 0) quantizes the exact result. ONNX Runtime rounds its float32 or lookup-table result once,
so both may differ from it by one step of the output grid where the exact value lies near a
rounding edge: the tests allow one step and ask that nearly all outputs be equal."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import pypto
import pypto.onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

_NP = {"u8": np.uint8, "s8": np.int8}
_TP = {"u8": TensorProto.UINT8, "s8": TensorProto.INT8}


def _save(tmp_path, nodes, inputs, outputs, inits, name="m"):
    g = helper.make_graph(nodes, name, inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def _qparams(prefix: str, dt: str, scale: float, zp: int) -> dict:
    return {f"{prefix}_s": np.float32(scale), f"{prefix}_z": _NP[dt](zp)}


def _random_q(rng, dt, shape):
    info = np.iinfo(_NP[dt])
    return rng.integers(info.min, info.max + 1, size=shape).astype(_NP[dt])


def _check(path, feeds, ops_on_cpu=True, min_equal=0.97):
    """Runs the file in ONNX Runtime, PyPTO (default level) and PyPTO's reference (level 0);
    returns the max difference in output steps (both PyPTO runs within one)."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    worst = 0
    for level in (None, 0):
        m = pypto.onnx.load(path, level)
        if level is None and ops_on_cpu:
            backends = m._compiled.node_backends
            assert all(b == "cpu" for _, b in backends), backends
        got = np.asarray(m(*feeds.values()))
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert diff.max() <= 1, (level, diff.max())
        assert (diff == 0).mean() >= min_equal, (level, (diff == 0).mean())
        worst = max(worst, diff.max())
    return worst


@pytest.mark.parametrize("dt", ["u8", "s8"])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", [((2, 3, 17), (2, 3, 17)), ((2, 3, 17), (3, 1)),
                                    ((1, 7), ()), ((5,), (4, 1))])
def test_binary_matches_onnx_runtime(tmp_path, op, dt, shapes):
    rng = np.random.default_rng(1)
    a_shape, b_shape = shapes
    inits = {**_qparams("a", dt, 0.0513, 3), **_qparams("b", dt, 0.1127, -4 if dt == "s8" else 130),
             **_qparams("y", dt, 0.0917 if op == "QLinearAdd" else 0.3071, 7)}
    node = helper.make_node(op, ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"],
                            domain="com.microsoft")
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("a", _TP[dt], a_shape),
                                 helper.make_tensor_value_info("b", _TP[dt], b_shape)],
              [helper.make_tensor_value_info("y", _TP[dt], None)], inits)
    _check(p, {"a": _random_q(rng, dt, a_shape), "b": _random_q(rng, dt, b_shape)})


_UNARY = [
    ("QLinearSigmoid", {}, (3, 17)),
    ("QLinearLeakyRelu", {"alpha": 0.1}, (3, 17)),
    ("QLinearSoftmax", {"axis": -1, "opset": 13}, (4, 33)),
    ("QLinearSoftmax", {"axis": 1, "opset": 11}, (2, 3, 9)),
    ("QLinearGlobalAveragePool", {}, (2, 5, 7, 9)),
    ("QLinearAveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     (1, 4, 9, 11)),
    ("QLinearAveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "count_include_pad": 1,
                            "pads": [0, 0, 1, 1], "ceil_mode": 1}, (1, 3, 7, 6)),
]


@pytest.mark.parametrize("dt", ["u8", "s8"])
@pytest.mark.parametrize("op,attrs,shape", _UNARY, ids=lambda v: v if isinstance(v, str) else "")
def test_unary_matches_onnx_runtime(tmp_path, op, attrs, shape, dt):
    rng = np.random.default_rng(2)
    y_scale, y_zp = (1 / 256, -128 if dt == "s8" else 0) if op == "QLinearSoftmax" else (0.0419, 5)
    inits = {**_qparams("x", dt, 0.0713, -3 if dt == "s8" else 120),
             **_qparams("y", dt, y_scale, y_zp)}
    node = helper.make_node(op, ["x", "x_s", "x_z", "y_s", "y_z"], ["y"], domain="com.microsoft",
                            **attrs)
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("x", _TP[dt], shape)],
              [helper.make_tensor_value_info("y", _TP[dt], None)], inits)
    _check(p, {"x": _random_q(rng, dt, shape)})


@pytest.mark.parametrize("dt", ["u8", "s8"])
def test_concat_matches_onnx_runtime(tmp_path, dt):
    """Three inputs on different grids, one on the output's (passed through exactly)."""
    rng = np.random.default_rng(3)
    shapes = [(2, 3, 5), (2, 1, 5), (2, 4, 5)]
    inits = {**_qparams("y", dt, 0.1031, 2), **_qparams("x0", dt, 0.0517, 1),
             **_qparams("x1", dt, 0.1031, 2), **_qparams("x2", dt, 0.2287, 9)}
    names = ["y_s", "y_z"] + [f"{p}{s}" for i in range(3) for p, s in
                              [(f"x{i}", ""), (f"x{i}", "_s"), (f"x{i}", "_z")]]
    node = helper.make_node("QLinearConcat", names, ["y"], domain="com.microsoft", axis=1)
    p = _save(tmp_path, [node], [helper.make_tensor_value_info(f"x{i}", _TP[dt], s)
                                 for i, s in enumerate(shapes)],
              [helper.make_tensor_value_info("y", _TP[dt], None)], inits)
    _check(p, {f"x{i}": _random_q(rng, dt, s) for i, s in enumerate(shapes)})


@pytest.mark.parametrize("dt", ["u8", "s8"])
def test_where_matches_onnx_runtime(tmp_path, dt):
    rng = np.random.default_rng(4)
    inits = {**_qparams("x", dt, 0.0513, 1), **_qparams("b", dt, 0.0209, -2 if dt == "s8" else 100),
             **_qparams("y", dt, 0.0419, 3)}
    node = helper.make_node("QLinearWhere", ["c", "x", "x_s", "x_z", "b", "b_s", "b_z", "y_s",
                                             "y_z"], ["y"], domain="com.microsoft")
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("c", TensorProto.BOOL, (3, 1)),
                                 helper.make_tensor_value_info("x", _TP[dt], (3, 7)),
                                 helper.make_tensor_value_info("b", _TP[dt], (7,))],
              [helper.make_tensor_value_info("y", _TP[dt], None)], inits)
    _check(p, {"c": rng.integers(0, 2, (3, 1)).astype(bool), "x": _random_q(rng, dt, (3, 7)),
               "b": _random_q(rng, dt, (7,))})


@pytest.mark.parametrize("a_dt", ["u8", "s8"])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("out", ["q", "float"])
def test_qgemm_matches_onnx_runtime(tmp_path, a_dt, per_column, trans_b, out):
    """A (uint8 or int8) by an int8 B, per tensor or per column, with an int32 C; requantized or
    float output. Odd sizes: M 3, K 37, N 19."""
    rng = np.random.default_rng(5)
    m, k, n = 3, 37, 19
    b = _random_q(rng, "s8", (n, k) if trans_b else (k, n))
    bs = (rng.uniform(0.005, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    inits = {**_qparams("a", a_dt, 0.03, 4), "b": b, "b_s": bs,
             "b_z": np.zeros(bs.shape, np.int8), "c": rng.integers(-500, 500, n).astype(np.int32)}
    inputs = ["a", "a_s", "a_z", "b", "b_s", "b_z", "c"]
    if out == "q":
        inits.update(_qparams("y", a_dt, 0.08, 6))
        inputs += ["y_s", "y_z"]
    node = helper.make_node("QGemm", inputs, ["y"], domain="com.microsoft", transB=trans_b)
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("a", _TP[a_dt], (m, k))],
              [helper.make_tensor_value_info(
                  "y", _TP[a_dt] if out == "q" else TensorProto.FLOAT, None)], inits)
    feeds = {"a": _random_q(rng, a_dt, (m, k))}
    if out == "q":
        _check(p, feeds)
        return
    want = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for level in (None, 0):
        model = pypto.onnx.load(p, level)
        if level is None:
            assert all(b == "cpu" for _, b in model._compiled.node_backends)
        got = np.asarray(model(feeds["a"]))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_qgemm_alpha_trans_a_and_full_c(tmp_path):
    """alpha 0.5, A transposed ([K, M]), a per-column B and an [M, N] C: the Gemm stays float
    (LowerQdqToInteger takes alpha 1 and A as it is only), on the CPU."""
    rng = np.random.default_rng(6)
    m, k, n = 5, 33, 11
    inits = {**_qparams("a", "u8", 0.0311, 120), "b": _random_q(rng, "s8", (k, n)),
             "b_s": rng.uniform(0.005, 0.02, n).astype(np.float32), "b_z": np.zeros(n, np.int8),
             "c": rng.integers(-900, 900, (m, n)).astype(np.int32),
             **_qparams("y", "u8", 0.0613, 100)}
    node = helper.make_node("QGemm", ["a", "a_s", "a_z", "b", "b_s", "b_z", "c", "y_s", "y_z"],
                            ["y"], domain="com.microsoft", alpha=0.5, transA=1)
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("a", TensorProto.UINT8, (k, m))],
              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    _check(p, {"a": _random_q(rng, "u8", (k, m))})


@pytest.mark.parametrize("op,advice", [
    ("QAttention", "quantize the unfused model"),
    ("QEmbedLayerNormalization", "quantize the unfused model"),
    ("DynamicQuantizeLSTM", "load the float model the file was quantized from, or quantize it "
                            "again keeping the LSTM float with op_types_to_quantize=['MatMul', "
                            "'Gemm', 'Conv']"),
    ("QLinearReduceMean", "QuantFormat.QDQ"),
    ("DecoderMaskedMultiHeadAttention", "before the optimizer fuses it"),
])
def test_unsupported_contrib_ops_are_rejected_with_advice(tmp_path, op, advice):
    """What quantize_dynamic writes for a model onnxruntime.transformers.optimizer fused
    (QAttention, QEmbedLayerNormalization) or for an LSTM, QOperator ops onnxruntime does not
    write, and float contrib ops the importer does not read (it reads SkipLayerNormalization and
    the others of tests/python/test_contrib_ops.py): the error names the op and says what to
    do."""
    node = helper.make_node(op, ["x"], ["y"], domain="com.microsoft")
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4))],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], {})
    with pytest.raises(NotImplementedError, match=rf"\[{op}\].*{re.escape(advice)}"):
        pypto.onnx.load(p)


def test_channels_last_pooling_is_rejected(tmp_path):
    inits = {**_qparams("x", "u8", 0.05, 3), **_qparams("y", "u8", 0.05, 3)}
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "x_s", "x_z", "y_s", "y_z"], ["y"],
                            domain="com.microsoft", channels_last=1)
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                               (1, 4, 4, 3))],
              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    with pytest.raises(NotImplementedError, match=r"channels_last=1 \(NHWC\) is not supported"):
        pypto.onnx.load(p)


# ---- Whole files quantized by quantize_static, QOperator format ----

class SmallCnn(torch.nn.Module):
    """Every QOperator op onnxruntime writes for a CNN: QLinearConv, QLinearLeakyRelu,
    QLinearSigmoid, QLinearConcat, QLinearAveragePool, QLinearMul, QLinearAdd (residual), 8-bit
    MaxPool, QLinearGlobalAveragePool, QGemm and QLinearSoftmax."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(16, 8, 1)
        self.c4 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        f = torch.nn.functional
        y = torch.cat([f.leaky_relu(self.c1(x), 0.1), torch.sigmoid(self.c2(x))], 1)
        y = self.c3(f.avg_pool2d(y, 2))
        y = y * torch.sigmoid(y)
        y = f.max_pool2d(torch.relu(self.c4(y)) + y, 2)
        return torch.softmax(self.fc(f.adaptive_avg_pool2d(y, 1).flatten(1)), -1)


class TinyEncoder(torch.nn.Module):
    """A two-layer transformer encoder over token ids (BERT-like): QLinearMatMul (batched for the
    attention), QLinearAdd, QLinearMul, QLinearSoftmax, QGemm; LayerNorm stays float."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(100, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = torch.nn.Linear(32, 3)

    def forward(self, ids):
        return self.fc(self.enc(self.emb(ids)))


def _quantize_qoperator(tmp_path, net, example, inputs, per_channel, activations, pre=True):
    """ONNX Runtime's pre-processing (constants to initializers, shapes; its symbolic shape
    inference fails on the encoder's attention reshapes: pre=False), then quantize_static."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32 = tmp_path / "net.onnx"
    torch.onnx.export(net.eval(), (torch.from_numpy(example),), str(fp32), input_names=["x"],
                      output_names=["y"], dynamo=False, opset_version=17)
    if pre:
        quant_pre_process(str(fp32), str(fp32.with_suffix(".pre.onnx")))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": x} for x in inputs])

        def get_next(self):
            return next(self.data, None)

    q = tmp_path / f"net_{per_channel}_{activations}.onnx"
    src = fp32.with_suffix(".pre.onnx") if pre else fp32
    quantize_static(str(src), str(q), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, activation_type=getattr(QuantType, activations),
                    weight_type=QuantType.QInt8)
    return q


def _output_scale(q) -> float:
    """The scale of the DequantizeLinear that gives output y: one step of its grid."""
    m = onnx.load(str(q))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    (last,) = [n for n in m.graph.node if n.output[0] == "y"]
    assert last.op_type == "DequantizeLinear"
    return float(inits[last.input[1]])


def _steps_from_onnx_runtime(q, inputs, contrib_ops):
    """Max |PyPTO - ONNX Runtime| over the inputs, in steps of the output's grid (the scale of the
    DequantizeLinear that gives it), and the share of equal outputs; checks that the file holds
    the com.microsoft ops named and every node runs on a CPU kernel."""
    m = onnx.load(str(q))
    assert {n.op_type for n in m.graph.node if n.domain == "com.microsoft"} == contrib_ops
    step = _output_scale(q)
    model = pypto.onnx.load(q)
    assert all(b == "cpu" for _, b in model._compiled.node_backends), \
        [o for o, b in model._compiled.node_backends if b != "cpu"]
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    diffs = [np.abs(np.asarray(model(x)) - sess.run(None, {"x": x})[0]) / step for x in inputs]
    d = np.concatenate([e.ravel() for e in diffs])
    return float(np.round(d.max(), 3)), float((np.round(d, 3) == 0).mean())


@pytest.mark.parametrize("per_channel,activations",
                         [(False, "QUInt8"), (True, "QUInt8"), (True, "QInt8")])
def test_qoperator_cnn_matches_onnx_runtime(tmp_path, per_channel, activations):
    """Measured: all outputs equal (0 steps)."""
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 3, 16, 18)).astype(np.float32) for _ in range(6)]
    q = _quantize_qoperator(tmp_path, SmallCnn(), inputs[0], inputs[:4], per_channel,
                            activations)
    ops = {"QLinearLeakyRelu", "QLinearSigmoid", "QLinearConcat", "QLinearAveragePool",
           "QLinearMul", "QLinearAdd", "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"}
    worst, equal = _steps_from_onnx_runtime(q, inputs[4:], ops)
    assert worst <= 1 and equal >= 0.9, (worst, equal)


@pytest.mark.parametrize("per_channel,activations",
                         [(False, "QUInt8"), (True, "QUInt8"), (True, "QInt8")])
def test_qoperator_transformer_matches_onnx_runtime(tmp_path, per_channel, activations):
    """One-step differences inside (the float detour of QLinearAdd / Softmax / MatMul rounds
    differently near an edge) travel through later layers: the outputs stay within a few steps."""
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 100, (1, 12)).astype(np.int64) for _ in range(8)]
    q = _quantize_qoperator(tmp_path, TinyEncoder(), inputs[0], inputs[:4], per_channel,
                            activations, pre=False)
    worst, equal = _steps_from_onnx_runtime(
        q, inputs[4:], {"QLinearAdd", "QLinearMul", "QLinearSoftmax", "QGemm"})
    assert worst <= 4 and equal >= 0.6, (worst, equal)
    # The CPU path (level 2) against the reference interpreter, which rounds each op's exact
    # result once (level 0): one-step differences inside travel the same way.
    cpu, ref = pypto.onnx.load(q), pypto.onnx.load(q, 0)
    d = np.concatenate([np.abs(np.asarray(cpu(x)) - np.asarray(ref(x))).ravel()
                        for x in inputs[4:]]) / _output_scale(q)
    print(f"vs onnxruntime: {worst} steps, {equal:.0%} equal; vs the reference: "
          f"{d.max():.3g} steps, {(d.round(3) == 0).mean():.0%} equal")
    assert d.max() <= 4.001 and (d.round(3) == 0).mean() >= 0.6


def test_contrib_nodes_export_in_their_domain(tmp_path):
    """Loaded and written back (pypto._C.onnx_save), a QOperator node keeps its domain and the
    domain's opset 1: ONNX Runtime runs the written file to the same bits."""
    from pypto import _C

    inits = {**_qparams("a", "u8", 0.05, 3), **_qparams("y", "u8", 0.1, 5)}
    node = helper.make_node("QLinearAdd", ["a", "a_s", "a_z", "a", "a_s", "a_z", "y_s", "y_z"],
                            ["y"], domain="com.microsoft")
    p = _save(tmp_path, [node], [helper.make_tensor_value_info("a", TensorProto.UINT8, (4,))],
              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    out = tmp_path / "written.onnx"
    _C.onnx_save(_C.onnx_load(str(p)), str(out))
    m = onnx.load(str(out))
    assert [(n.domain, n.op_type) for n in m.graph.node] == [("com.microsoft", "QLinearAdd")]
    assert {o.domain: o.version for o in m.opset_import}.get("com.microsoft") == 1
    a = np.array([0, 7, 200, 255], np.uint8)

    def run(f):
        sess = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
        return sess.run(None, {"a": a})[0]

    np.testing.assert_array_equal(run(out), run(p))
