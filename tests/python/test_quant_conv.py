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
    """QDQ format (DequantizeLinear -> Conv -> QuantizeLinear), which pass LowerQdqToInteger runs
    as ConvInteger (on the int8 kernel) and float scales: agrees with ONNX Runtime, which fuses the
    pattern into its integer conv, to a step of the output's grid (measured: all equal)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat

    q = _quantize(tmp_path, QuantFormat.QDQ, True)
    m = _load_on_cpu(q, "ConvInteger")
    sess = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"])
    step = _output_step(q)
    for x in _inputs(3, 9):
        got, want = np.asarray(m(x)), sess.run(None, {"x": x})[0]
        diff = np.abs(got - want)
        assert diff.max() <= step * 1.001, (diff.max(), step)
        assert (diff == 0).mean() >= 0.95, (diff == 0).mean()
