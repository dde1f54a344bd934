"""Small-output convs (a few output positions per image, as a streaming audio model's: Silero
VAD's STFT and encoder) on the CPU's small-output kernel, against ONNX Runtime: a 1-D conv stack
written with onnx.helper (an STFT-like strided conv, convs with pads, strides, a dilation, groups,
ReLU and a residual Add, a sigmoid head with one output channel), with a known and with a
symbolic time axis (the kernel then chosen per run from the actual width)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _stack(path, time_dim):
    rng = np.random.default_rng(0)

    def init(name, shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    inits = [
        init("w0", (66, 1, 64), 0.1),      # STFT-like: kernel 64, stride 32
        init("w1", (40, 66, 3)), init("b1", (40,)),
        init("w2", (32, 40, 3)), init("b2", (32,)),
        init("w3", (32, 8, 3)),            # groups 4, dilation 2
        init("w4", (48, 32, 1)), init("b4", (48,)),
        init("w5", (1, 48, 1)), init("b5", (1,)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["s"], strides=[32]),
        helper.make_node("Conv", ["s", "w1", "b1"], ["c1"], pads=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[2, 2], dilations=[2], group=4),
        helper.make_node("Add", ["c3", "r2"], ["a3"]),
        helper.make_node("Relu", ["a3"], ["r3"]),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"]),
        helper.make_node("Relu", ["c4"], ["r4"]),
        helper.make_node("Conv", ["r4", "w5", "b5"], ["c5"]),
        helper.make_node("Sigmoid", ["c5"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "small_convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, time_dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.mark.parametrize("symbolic", [False, True])
def test_small_conv_stack_matches_onnx_runtime(tmp_path, symbolic):
    path = tmp_path / "small.onnx"
    _stack(path, "t" if symbolic else 160)
    exe = pypto.onnx.load(path)
    assert sorted({b for _, b in exe._compiled.node_backends}) == ["cpu"]
    described = [exe._compiled.describe_step(i) for i in range(len(exe._compiled.steps))]
    # 160 samples: the STFT conv has 4 positions, then 4, 2, 2, 2, 2: every conv on the
    # small-output kernel when the width is known (with a symbolic one it is chosen per run).
    assert sum("small output" in d for d in described) == (0 if symbolic else 6), described
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    widths = [160, 96, 288, 1024, 160] if symbolic else [160, 160]
    for t in widths:  # 288 samples: 8 positions; 1024: 31 (the implicit GEMM)
        x = rng.standard_normal((1, 1, t)).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(exe(x), want, rtol=1e-4, atol=1e-5)
