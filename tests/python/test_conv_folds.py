"""The forms tf2onnx and other exporters leave around convolutions, folded into the conv at
level >= 1 and compared with onnxruntime: a Mul or Add by a per-channel constant after a Conv
(tf2onnx's depthwise batch norms; FoldBatchNorm reads it as a BN) and a Pad by zeros on the
spatial axes before one (TensorFlow's asymmetric "SAME" padding; CanonicalizeOps/PadIntoConv).
Forms that are not the same computation stay as they are."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

F = TensorProto.FLOAT
RNG = np.random.default_rng(3)


def _run(tmp_path, nodes, inits, x_shape, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    exe = pypto.onnx.load(str(path), level=2)
    np.testing.assert_allclose(np.asarray(exe(x=x)), want[0], rtol=1e-5, atol=1e-5)
    return [op for op, _ in exe._compiled.node_backends]


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op,shape", [("Mul", [8, 1, 1]), ("Mul", [1, 8, 1, 1]), ("Mul", []),
                                      ("Add", [8, 1, 1]), ("Sub", [8, 1, 1]), ("Mul", [1])])
@pytest.mark.parametrize("depthwise", [True, False])
def test_channel_constant_folds_into_conv(tmp_path, op, shape, depthwise):
    g = 8 if depthwise else 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=g, pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c", "s"] if op != "Add" else ["s", "c"], ["m"]),
             helper.make_node("Clip", ["m", "lo", "hi"], ["y"])]
    inits = {"w": _w(8, 8 // g, 3, 3), "b": _w(8), "s": _w(*shape),
             "lo": np.float32(0), "hi": np.float32(6)}
    ops = _run(tmp_path, nodes, inits, [1, 8, 9, 9])
    assert op not in ops and "Add" not in ops, ops


@pytest.mark.parametrize("case", ["spatial_constant", "conv_output_read_twice"])
def test_other_constants_are_not_folded(tmp_path, case):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["y" if case != "conv_output_read_twice" else "m"])]
    inits = {"w": _w(4, 4, 3, 3), "s": _w(1, 1, 6, 6) if case == "spatial_constant" else _w(4, 1, 1)}
    if case == "conv_output_read_twice":
        nodes.append(helper.make_node("Add", ["m", "c"], ["y"]))
    ops = _run(tmp_path, nodes, inits, [1, 4, 6, 6])
    assert "Mul" in ops, ops


@pytest.mark.parametrize("pads,stride", [([0, 0, 0, 0, 0, 0, 1, 1], 2), ([0, 0, 1, 2, 0, 0, 2, 1], 1),
                                         ([0, 0, 1, 1, 0, 0, 1, 1], 1)])
def test_zero_pad_folds_into_conv(tmp_path, pads, stride):
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"]),
             helper.make_node("Conv", ["xp", "w"], ["y"], group=6, strides=[stride, stride],
                              pads=[0, 1, 0, 0])]
    ops = _run(tmp_path, nodes, {"w": _w(6, 1, 3, 3), "pads": np.array(pads, np.int64)},
               [1, 6, 11, 11])
    assert ops == ["Conv"], ops


@pytest.mark.parametrize("case", ["reflect", "value", "channels"])
def test_other_pads_stay(tmp_path, case):
    pads = [0, 1, 1, 1, 0, 0, 1, 1] if case == "channels" else [0, 0, 1, 1, 0, 0, 1, 1]
    ins = ["x", "pads"] + (["v"] if case == "value" else [])
    attrs = {"mode": "reflect"} if case == "reflect" else {}
    nodes = [helper.make_node("Pad", ins, ["xp"], **attrs),
             helper.make_node("Conv", ["xp", "w"], ["y"])]
    inits = {"w": _w(4, 5 if case == "channels" else 4, 3, 3), "pads": np.array(pads, np.int64),
             "v": np.float32(0.5)}
    ops = _run(tmp_path, nodes, inits, [1, 4, 7, 7])
    assert "Pad" in ops, ops
