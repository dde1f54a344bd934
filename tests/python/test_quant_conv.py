"""Statically quantized convolutions (ONNX Runtime's quantize_static) on PyPTO's int8 conv kernels
(QLinearConv, src/backend/cpu/quant_conv.cpp), against ONNX Runtime on the same file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pypto
import pypto.onnx


class SmallConvNet(torch.nn.Module):
    """A strided 3x3 conv, a grouped conv, a depthwise conv and a 1x1 conv, with ReLUs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.c2 = torch.nn.Conv2d(16, 24, 3, padding=1, groups=2)
        self.dw = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.pw = torch.nn.Conv2d(24, 10, 1)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.dw(x))
        return self.pw(x)


def _inputs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 20, 18)).astype(np.float32) for _ in range(n)]


def _quantize(tmp_path, quant_format, per_channel: bool, activations: str = "QInt8"):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    fp32 = tmp_path / "net.onnx"
    torch.onnx.export(SmallConvNet().eval(), (torch.zeros(1, 3, 20, 18),), str(fp32),
                      input_names=["x"], output_names=["y"], dynamo=False, opset_version=17)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": x} for x in _inputs(4, 1)])

        def get_next(self):
            return next(self.data, None)

    q = tmp_path / f"net_{quant_format.name}_{per_channel}_{activations}.onnx"
    quantize_static(str(fp32), str(q), Reader(), quant_format=quant_format,
                    per_channel=per_channel, activation_type=getattr(QuantType, activations),
                    weight_type=QuantType.QInt8)
    return q


def _load_on_cpu(path, op: str):
    """The model, loaded; checks that it has 4 `op` nodes and every node runs on a CPU kernel."""
    m = pypto.onnx.load(path)
    backends = m._compiled.node_backends
    assert [o for o, _ in backends].count(op) == 4, backends
    assert all(b == "cpu" for _, b in backends), [o for o, b in backends if b != "cpu"]
    return m


def _output_step(path) -> float:
    """The scale of the DequantizeLinear that gives the output: one step of its quantized grid."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    (node,) = [n for n in m.graph.node if n.output[0] == m.graph.output[0].name]
    assert node.op_type == "DequantizeLinear", node.op_type
    return float(inits[node.input[1]])


@pytest.mark.parametrize("per_channel,activations",
                         [(False, "QInt8"), (True, "QInt8"), (True, "QUInt8")])
def test_qoperator_conv_net_matches_onnx_runtime(tmp_path, per_channel, activations):
    """QOperator format: every conv is a QLinearConv and runs on the int8 kernel; the outputs are
    ONNX Runtime's to one step of the output's quantized grid (both round half to even; ONNX
    Runtime requantizes in float, PyPTO as the ONNX reference in double), nearly all exactly
    (measured: all, on these inputs)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat

    q = _quantize(tmp_path, QuantFormat.QOperator, per_channel, activations)
    m = _load_on_cpu(q, "QLinearConv")
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    step = _output_step(q)
    for x in _inputs(3, 7):
        got = np.asarray(m(x))
        want = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape
        diff = np.abs(got - want)
        assert diff.max() <= step * 1.001, (diff.max(), step)
        assert (diff == 0).mean() >= 0.99, (diff == 0).mean()


def test_qdq_conv_net_matches_onnx_runtime(tmp_path):
    """QDQ format (DequantizeLinear -> Conv -> QuantizeLinear): pass LowerQdqToInteger runs each
    requantized Conv as one QLinearConv on the int8 kernel, as ONNX Runtime fuses the pattern;
    agrees with ONNX Runtime to a step of the output's grid (measured: all equal)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat

    q = _quantize(tmp_path, QuantFormat.QDQ, True)
    m = _load_on_cpu(q, "QLinearConv")
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    step = _output_step(q)
    for x in _inputs(3, 9):
        got, want = np.asarray(m(x)), sess.run(None, {"x": x})[0]
        diff = np.abs(got - want)
        assert diff.max() <= step * 1.001, (diff.max(), step)
        assert (diff == 0).mean() >= 0.95, (diff == 0).mean()


def _qdq_conv_graph(path, activation: str, y_zero_point: int, bias: str):
    """x (float) -> Q -> DQ -> Conv(DQ(W), bias) [-> Relu | Clip(0, 6)] -> Q -> DQ -> y, by hand:
    the forms PyTorch's pt2e export writes (an activation left between Conv and Q, a float bias)
    and onnxruntime's (int32 bias through DequantizeLinear, shared through an Identity)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    xs, ws, ys = np.float32(0.02), rng.uniform(0.002, 0.01, 8).astype(np.float32), np.float32(0.01)
    b = rng.uniform(-0.3, 0.3, 8).astype(np.float32)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in [
        ("xs", xs), ("xz", np.uint8(128)), ("w", w), ("ws", ws), ("wz", np.zeros(8, np.int8)),
        ("ys", ys), ("yz", np.uint8(y_zero_point)), ("lo", np.float32(0)), ("hi", np.float32(6))]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0)]
    if bias == "float":
        inits.append(numpy_helper.from_array(b, "b"))
    else:  # int32 at the sums' scale xs * ws, behind an Identity
        inits += [numpy_helper.from_array(np.round(b / (xs * ws)).astype(np.int32), "bq"),
                  numpy_helper.from_array((xs * ws).astype(np.float32), "bs")]
        nodes += [helper.make_node("DequantizeLinear", ["bq", "bs"], ["bd"], axis=0),
                  helper.make_node("Identity", ["bd"], ["b"])]
    nodes.append(helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]))
    last = "c"
    if activation == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["a"]))
        last = "a"
    elif activation == "Clip":
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["a"]))
        last = "a"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 11])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return float(ys)


@pytest.mark.parametrize("activation,y_zero_point,bias,fused", [
    ("none", 128, "int32", True),
    ("Relu", 0, "float", True),       # Relu is a no-op when 0 is the bottom of the range
    ("Clip", 0, "int32", True),       # and Clip(0, 6) when 6 is above its top (255 * 0.01)
    ("Relu", 100, "float", False),    # negative outputs exist: the Relu stays
])
def test_qdq_conv_forms_lower_to_qlinear_conv(tmp_path, activation, y_zero_point, bias, fused):
    """LowerQdqToInteger's QLinearConv rule on hand-built QDQ graphs, against ONNX Runtime: an
    activation is absorbed only where the output's range makes it a no-op, a float bias is rounded
    to the sums' grid; results within a step of the output grid, nearly all equal."""
    import onnxruntime as ort

    path = tmp_path / f"qdq_{activation}_{y_zero_point}_{bias}.onnx"
    step = _qdq_conv_graph(path, activation, y_zero_point, bias)
    m = pypto.onnx.load(path)
    ops = [o for o, _ in m._compiled.node_backends]
    assert ops.count("QLinearConv") == (1 if fused else 0), ops
    assert ops.count("ConvInteger") == (0 if fused else 1), ops
    assert (activation in ops) == (not fused and activation != "none"), ops
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.uniform(-2.5, 2.5, (1, 4, 9, 11)).astype(np.float32)
        got, want = np.asarray(m(x)), sess.run(None, {"x": x})[0]
        diff = np.abs(got - want)
        assert diff.max() <= step * 1.001, (diff.max(), step)
        assert (diff == 0).mean() >= 0.97, (diff == 0).mean()


@pytest.mark.parametrize("per_column", [False, True])
def test_qdq_matmul_lowers_to_qlinear_matmul(tmp_path, per_column):
    """Q(MatMul(DQ(x), DQ(W))) -> QLinearMatMul on the int8 GEMM (3-D x, per-tensor and
    per-column W scales), against ONNX Runtime on the same file: within a step of the grid."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    w = rng.integers(-127, 128, (40, 24)).astype(np.int8)
    ws = (rng.uniform(0.002, 0.01, 24) if per_column else np.float32(0.005)).astype(np.float32)
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in [
        ("xs", np.float32(0.02)), ("xz", np.int8(3)), ("w", w), ("ws", ws),
        ("ys", np.float32(0.05)), ("yz", np.int8(-5))]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 24])], inits)
    path = tmp_path / "qdq_matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = pypto.onnx.load(path)
    ops = [o for o, _ in m._compiled.node_backends]
    assert ops.count("QLinearMatMul") == 1 and "MatMul" not in ops, ops
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.uniform(-2.5, 2.5, (2, 7, 40)).astype(np.float32)
    got, want = np.asarray(m(x)), sess.run(None, {"x": x})[0]
    diff = np.abs(got - want)
    assert diff.max() <= 0.05 * 1.001, diff.max()
    assert (diff == 0).mean() >= 0.97, (diff == 0).mean()
