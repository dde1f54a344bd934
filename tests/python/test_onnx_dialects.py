"""ONNX files as other exporters write them: -1 / 0 / '?' / missing dims on graph inputs and
outputs (Paddle2ONNX, older tf2onnx), read as onnxruntime reads them, compared with it."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import pypto


def _dialect_model(path):
    """y = Concat(a, b) @ w + 1 (a: [-1, 4], b: ['?', 4]); z = Relu(c) (c: ['?', '', None]);
    0 only on outputs (onnxruntime holds an input to a 0 it declares); no value_info at all."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
                                "w")
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=0),
             helper.make_node("MatMul", ["ab", "w"], ["m"]),
             helper.make_node("Add", ["m", "one"], ["y"]),
             helper.make_node("Relu", ["c"], ["z"])]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "dialect",
        [helper.make_tensor_value_info("a", f, [-1, 4]),
         helper.make_tensor_value_info("b", f, ["?", 4]),
         helper.make_tensor_value_info("c", f, ["?", "", None])],
        [helper.make_tensor_value_info("y", f, [-1, 3]),
         helper.make_tensor_value_info("z", f, [0, 0, -1])],
        [w, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return path


def test_dynamic_dims_as_other_exporters_write_them(tmp_path, capfd):
    path = _dialect_model(tmp_path / "dialect.onnx")
    capfd.readouterr()
    exe = pypto.onnx.load(path)
    err = capfd.readouterr().err
    # One warning per kind of guess, naming the file and where.
    assert "dialect.onnx: dim_value -1 read as an unknown dimension" in err
    assert "input 'a' dim 0, output 'y' dim 0, output 'z' dim 2 (3 dims)" in err
    assert "dim_value 0 on a graph input, output or value_info read as an unknown dimension" in err
    assert "output 'z' dim 0, output 'z' dim 1 (2 dims)" in err
    assert "dim_param '?' or '' read as a fresh unknown dimension each time" in err
    assert "input 'b' dim 0, input 'c' dim 0, input 'c' dim 1 (3 dims)" in err
    assert err.count("[pypto warn]") == 3, err
    assert exe.graph.type(exe.graph.inputs[1]) == ("f32", [None, 4])

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    # The two '?' are independent: a, b and c each take their own size, twice.
    for na, nb, nc in ((2, 5, 3), (7, 1, 1)):
        feeds = {"a": rng.standard_normal((na, 4)).astype(np.float32),
                 "b": rng.standard_normal((nb, 4)).astype(np.float32),
                 "c": rng.standard_normal((nc, 2, 5)).astype(np.float32)}
        want = sess.run(None, feeds)
        got = exe(**feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert got[0].shape == (na + nb, 3)


def test_value_info_of_another_type_than_the_node_makes(tmp_path, capfd):
    """onnxconverter-common's fp16 conversion declares some Casts' outputs float16 in value_info
    where the Cast makes float: ONNX Runtime refuses the file; PyPTO uses the node's type, says so
    once, and computes what the nodes say (checked against numpy)."""
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=f),
             helper.make_node("Mul", ["x32", "x32"], ["sq"]),
             helper.make_node("Cast", ["sq"], ["y"], to=h)]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", h, [3, 4])],
        [helper.make_tensor_value_info("y", h, [3, 4])], [],
        value_info=[helper.make_tensor_value_info("x32", h, [3, 4]),   # wrong: the Cast makes f32
                    helper.make_tensor_value_info("sq", f, [3, 4])])   # right
    path = tmp_path / "mixed.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                     .SerializeToString())
    capfd.readouterr()
    exe = pypto.onnx.load(path)
    err = capfd.readouterr().err
    assert ("mixed.onnx: value_info declares another element type than the node makes; the "
            "node's is used") in err, err
    assert "'x32' f16 (made f32) (1 value)" in err, err
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float16)
    want = (x.astype(np.float32) ** 2).astype(np.float16)
    np.testing.assert_array_equal(exe(x), want)
