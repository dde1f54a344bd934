"""The integer shape arithmetic of real models (position ids from an attention mask, ranges over a
symbolic sequence length, rotary angles) runs on CPU kernels, not the reference interpreter, and
matches onnxruntime: Shape, Size, Gather, Range, CumSum, ConstantOfShape, int64 Add/Sub/Mul/Div/
Mod/Max/Neg/Abs, comparisons, Not, Where, Cast, and float32 Sin/Cos."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(path) -> None:
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "one"], ["seq"], axis=0),
        n("Range", ["zero", "seq", "one"], ["pos"]),                  # [seq]
        n("CumSum", ["mask", "one"], ["cum"]),                         # [batch, seq]
        n("Mul", ["cum", "mask"], ["cm"]),
        n("Add", ["cm", "one"], ["pid"]),                              # HF position ids
        n("Mod", ["pid", "three"], ["mod"], fmod=0),
        n("Div", ["pid", "minus_two"], ["div"]),                       # truncates toward 0
        n("Sub", ["div", "mod"], ["sub"]),
        n("Unsqueeze", ["pos", "zero_axes"], ["pos2"]),                # [1, seq]
        n("Max", ["sub", "pos2"], ["mx"]),
        n("Neg", ["mx"], ["neg"]),
        n("Abs", ["sub"], ["abs"]),
        n("Add", ["neg", "abs"], ["mixed"]),
        n("Equal", ["mask", "zero"], ["pad"]),
        n("Not", ["pad"], ["keep"]),
        n("Shape", ["mask"], ["mshape"]),
        n("ConstantOfShape", ["mshape"], ["fill"],
          value=numpy_helper.from_array(np.array([-7], np.int64))),
        n("Where", ["keep", "mixed", "fill"], ["ids"]),
        n("Less", ["pos2", "seq"], ["lt"]),
        n("GreaterOrEqual", ["ids", "pos2"], ["ge"]),
        n("And", ["lt", "ge"], ["both"]),
        n("Cast", ["pid"], ["pidf"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["pidf", "last_axis"], ["pid3"]),               # [batch, seq, 1]
        n("Mul", ["pid3", "freq"], ["angle"]),                         # [batch, seq, 8]
        n("Cos", ["angle"], ["cos"]),
        n("Sin", ["angle"], ["sin"]),
        n("Mul", ["x", "cos"], ["xc"]),
        n("Mul", ["x", "sin"], ["xs"]),
        n("Add", ["xc", "xs"], ["y"]),
        n("Size", ["x"], ["size"]),
    ]
    inits = [_const("zero", np.int64(0)), _const("one", np.int64(1)),
             _const("three", np.int64(3)), _const("minus_two", np.int64(-2)),
             _const("zero_axes", np.array([0], np.int64)),
             _const("last_axis", np.array([-1], np.int64)),
             _const("freq", (10000.0 ** -(np.arange(8) / 8)).astype(np.float32) * 37)]
    graph = helper.make_graph(
        nodes, "shape_kernels",
        [helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("both", TensorProto.BOOL, ["batch", "seq"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8]),
         helper.make_tensor_value_info("size", TensorProto.INT64, [])],
        inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("batch,seq", [(2, 16), (3, 5)])
def test_shape_arithmetic_runs_on_cpu_and_matches_onnxruntime(tmp_path, batch, seq):
    path = tmp_path / "shape_kernels.onnx"
    _model(path)
    rng = np.random.default_rng(seq)
    mask = (rng.random((batch, seq)) < 0.8).astype(np.int64)
    mask[:, 0] = 1
    x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"mask": mask, "x": x})
    model = pypto.onnx.load(path)
    got = model(mask, x)
    on_reference = [op for op, b in model._compiled.node_backends if b != "cpu"]
    assert not on_reference, f"on the reference interpreter: {on_reference}"
    for name, g, w in zip(("ids", "both", "y", "size"), got, want):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.shape)
        if name == "y":  # float32 sin/cos of angles up to ~600: a few ulp of the operands
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)
