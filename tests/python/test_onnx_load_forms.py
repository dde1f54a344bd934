"""pypto.onnx.load takes what onnxruntime.InferenceSession takes: a path (str or PathLike), the
serialized bytes, or an onnx.ModelProto; anything else is a TypeError. Results against
onnxruntime on the same model."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _model():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "forms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["str", "path", "bytes", "bytearray", "proto"])
def test_every_form_matches_onnxruntime(tmp_path, form):
    m = _model()
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    given = {"str": str(path), "path": path, "bytes": m.SerializeToString(),
             "bytearray": bytearray(m.SerializeToString()), "proto": m}[form]
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    exe = pypto.onnx.load(given)
    np.testing.assert_allclose(np.asarray(exe(x)), want, rtol=1e-5, atol=1e-6)
    assert exe.input_names == ["x"] and exe.output_names == ["y"]


def test_bytes_model_reports_its_precision():
    exe = pypto.onnx.load(_model().SerializeToString(), precision="bf16")
    x = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    report = exe.precision_report(x)
    assert "y" in str(report)


def test_other_types_and_bad_bytes_are_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="file path, bytes or an onnx.ModelProto"):
        pypto.onnx.load(42)
    with pytest.raises(FileNotFoundError, match="no such file"):
        pypto.onnx.load(tmp_path / "missing.onnx")
    with pytest.raises(Exception, match="<bytes>"):
        pypto.onnx.load(b"\x08\x07garbage")
