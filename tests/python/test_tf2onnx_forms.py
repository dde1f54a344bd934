"""Forms tf2onnx writes for Keras models, built with onnx.helper and compared with onnxruntime
(no TensorFlow needed; bench/keras_models.py runs the real conversions):

- a TensorFlow while loop as an ONNX Loop whose weights are loop-carried values the body passes
  on unchanged (Keras' GRU and SimpleRNN layers): read as constants in the compiled body, so the
  body's Split of its bias folds away and its MatMuls get packed weights;
- ReverseSequence, which tf2onnx writes for Keras' Bidirectional RNNs, on its CPU kernel."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto
from test_control_flow import _save, _vi

F, I32, I64, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(11)


def _check(path, feeds, level=2):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    model = pypto.onnx.load(path, level=level)
    got = model(**feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return model


def _rnn_loop_model(path, hidden=6, inp=5, weights_from="initializer"):
    """tf2onnx's form of a Keras RNN layer: Loop(steps, cond, i0, h0, W, U, bias) whose body
    reads x[i] from the outer graph, carries W (directly), U (through an Identity) and the bias
    [2, hidden] (directly) unchanged, and counts i itself:
        h = tanh(x[i] @ W + b0) * sigmoid(h @ U + b1), b0, b1 = Split(bias).
    weights_from="input": W is a graph input instead (still carried unchanged), which must
    stay an input of the body."""
    w = (RNG.standard_normal((inp, hidden)) * 0.5).astype(np.float32)
    u = (RNG.standard_normal((hidden, hidden)) * 0.5).astype(np.float32)
    bias = RNG.standard_normal((2, hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(u, "U"), numpy_helper.from_array(bias, "bias"),
             numpy_helper.from_array(np.array(0, np.int32), "i0"),
             numpy_helper.from_array(np.array(1, np.int32), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    if weights_from == "initializer":
        inits.append(numpy_helper.from_array(w, "W"))
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i_in"], ["xt"]),
         helper.make_node("MatMul", ["xt", "W_in"], ["xw"]),
         helper.make_node("Split", ["bias_in"], ["b0", "b1"], axis=0),
         helper.make_node("Squeeze", ["b0", "ax0"], ["b0s"]),
         helper.make_node("Squeeze", ["b1", "ax0"], ["b1s"]),
         helper.make_node("Add", ["xw", "b0s"], ["a"]),
         helper.make_node("Tanh", ["a"], ["ta"]),
         helper.make_node("MatMul", ["h_in", "U_in"], ["hu"]),
         helper.make_node("Add", ["hu", "b1s"], ["g"]),
         helper.make_node("Sigmoid", ["g"], ["sg"]),
         helper.make_node("Mul", ["ta", "sg"], ["h_out"]),
         helper.make_node("Identity", ["U_in"], ["U_out"]),
         helper.make_node("Add", ["i_in", "one"], ["i_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["h_out"], ["h_scan"])],
        "while_body",
        [_vi("iter", I64, []), _vi("cond_in", B, []), _vi("i_in", I32, []),
         _vi("h_in", F, ["batch", hidden]), _vi("W_in", F, [inp, hidden]),
         _vi("U_in", F, [hidden, hidden]), _vi("bias_in", F, [2, hidden])],
        [_vi("cond_out", B, []), _vi("i_out", I32, []), _vi("h_out", F, ["batch", hidden]),
         _vi("W_in", F, [inp, hidden]), _vi("U_out", F, [hidden, hidden]),
         _vi("bias_in", F, [2, hidden]), _vi("h_scan", F, ["batch", hidden])])
    nodes = [helper.make_node("Shape", ["x"], ["xs"], start=0, end=1),
             helper.make_node("Squeeze", ["xs", "ax0"], ["steps"]),
             helper.make_node("Loop", ["steps", "", "i0", "h0", "W", "U", "bias"],
                              ["i_n", "h", "W_n", "U_n", "bias_n", "hs"], body=body,
                              name="while_loop")]
    inputs = [_vi("x", F, ["steps", "batch", inp]), _vi("h0", F, ["batch", hidden])]
    if weights_from == "input":
        inputs.append(_vi("W", F, [inp, hidden]))
    return _save(path, nodes, inputs,
                 [_vi("h", F, ["batch", hidden]), _vi("hs", F, ["steps", "batch", hidden]),
                  _vi("i_n", I32, []), _vi("U_n", F, [hidden, hidden])], inits), w


@pytest.mark.parametrize("level", [0, 2])
def test_loop_carried_constant_weights_are_constants_in_the_body(tmp_path, level):
    path, _ = _rnn_loop_model(tmp_path / "rnn.onnx")
    feeds = {"x": RNG.standard_normal((7, 3, 5)).astype(np.float32),
             "h0": RNG.standard_normal((3, 6)).astype(np.float32)}
    model = _check(path, feeds, level=level)
    body = [op for op, _ in model._compiled.node_backends if op.startswith("while_loop/")]
    assert "while_loop/body/MatMul" in body, body
    if level > 0:  # the bias read as a constant: its Split and Squeezes folded
        assert "while_loop/body/Split" not in body, body
        assert "while_loop/body/Squeeze" not in body, body
    # Another shape through the same compiled model.
    feeds = {"x": RNG.standard_normal((2, 1, 5)).astype(np.float32),
             "h0": RNG.standard_normal((1, 6)).astype(np.float32)}
    _check(path, feeds, level=level)


def test_loop_carried_weights_from_an_input_stay_inputs(tmp_path):
    path, w = _rnn_loop_model(tmp_path / "rnn_in.onnx", weights_from="input")
    x = RNG.standard_normal((4, 2, 5)).astype(np.float32)
    h0 = RNG.standard_normal((2, 6)).astype(np.float32)
    model = _check(path, {"x": x, "h0": h0, "W": w})
    # A second call with other weights: nothing of the first W was kept.
    _check(path, {"x": x, "h0": h0, "W": -2 * w})
    assert any(op == "Loop" and b == "cpu" for op, b in model._compiled.node_backends)


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("dtype,trailing", [(np.float32, [4]), (np.float32, [2, 3]),
                                            (np.int64, []), (np.float32, [])])
def test_reverse_sequence_on_cpu(tmp_path, batch_axis, time_axis, dtype, trailing):
    steps, batch = 6, 4
    shape = [0, 0] + trailing
    shape[time_axis], shape[batch_axis] = steps, batch
    elem = TensorProto.INT64 if dtype == np.int64 else F
    path = _save(tmp_path / "rev.onnx",
                 [helper.make_node("ReverseSequence", ["x", "lens"], ["y"],
                                   batch_axis=batch_axis, time_axis=time_axis)],
                 [_vi("x", elem, shape), _vi("lens", I64, [batch])], [_vi("y", elem, shape)])
    x = (RNG.standard_normal(shape) * 100).astype(dtype)
    lens = np.array([6, 0, 1, 4], np.int64)  # whole, none, one step, part
    model = _check(path, {"x": x, "lens": lens})
    assert model._compiled.node_backends == [("ReverseSequence", "cpu")]


def test_reverse_sequence_errors_as_the_reference(tmp_path):
    path = _save(tmp_path / "rev_bad.onnx",
                 [helper.make_node("ReverseSequence", ["x", "lens"], ["y"])],
                 [_vi("x", F, [3, 2]), _vi("lens", I64, ["n"])], [_vi("y", F, [3, 2])])
    model = pypto.onnx.load(path, level=2)
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"sequence length 4 is outside \[0, 3\]"):
        model(x=x, lens=np.array([1, 4], np.int64))
    with pytest.raises(ValueError, match=r"sequence_lens must be \[2\]"):
        model(x=x, lens=np.array([1, 2, 3], np.int64))


@pytest.mark.parametrize("producer", ["tf2onnx", "other"])
def test_tensorflow_op_left_by_tf2onnx_is_a_clear_error(tmp_path, producer):
    """tf2onnx leaves a TensorFlow op it cannot convert (Keras 3's exact GELU: Erfc) in the
    file under its TensorFlow name; onnxruntime refuses such a file, and PyPTO says what it is
    and what to do, for files tf2onnx wrote."""
    graph = helper.make_graph([helper.make_node("Erfc", ["x"], ["y"], name="dense/Gelu/Erfc")],
                              "tf", [_vi("x", F, [2, 3])], [_vi("y", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name=producer)
    path = tmp_path / "erfc.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.raises(NotImplementedError) as e:
        pypto.onnx.load(path)
    msg = str(e.value)
    assert "[Erfc] node 'dense/Gelu/Erfc': operator 'Erfc' is not supported" in msg, msg
    if producer == "tf2onnx":
        assert "left in the file under its TensorFlow name" in msg, msg
        assert "gelu(x, approximate=True)" in msg, msg
    else:
        assert "tf2onnx" not in msg, msg
