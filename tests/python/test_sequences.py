"""ONNX sequences and optionals built with onnx.helper, run by PyPTO (the reference kernels, through
the Executable) and compared with onnxruntime: sequences as inputs and outputs (lists of arrays),
SplitToSequence / SequenceInsert / SequenceErase / SequenceAt / ConcatFromSequence, SequenceMap
with a body, a sequence growing in a Loop, optionals (None for an empty one), the ONNX export
round trip, and the errors for a wrong input kind and for a tensor op given a sequence."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _save(path, nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "seq", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path.write_bytes(model.SerializeToString())
    return path


def _same(got, want, rtol=1e-6, atol=1e-6):
    """got (PyPTO) against want (onnxruntime): None, a list of arrays or an array."""
    if want is None:
        assert got is None
        return
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _same(g, w, rtol, atol)
        return
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _check(path, feeds, levels=(0, 2)):
    """Runs `path` in PyPTO at each level and in onnxruntime on `feeds`; returns the last model."""
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for level in levels:
        model = pypto.onnx.load(path, level)
        got = model(**feeds)
        got = list(got) if isinstance(got, tuple) else [got]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    return model


def _seq(name, elem=F, shape=None):
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _split_edit_concat(path):
    """x [4, 6] -> SplitToSequence(axis 1, split 2) -> insert y at 1 -> erase the last -> concat
    along axis 1; also its length and element 0."""
    pos = numpy_helper.from_array(np.array(1, np.int64), "pos")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    nodes = [
        helper.make_node("SplitToSequence", ["x", "two"], ["parts"], axis=1),
        helper.make_node("SequenceInsert", ["parts", "y", "pos"], ["ins"]),
        helper.make_node("SequenceErase", ["ins"], ["er"]),
        helper.make_node("ConcatFromSequence", ["er"], ["cat"], axis=1),
        helper.make_node("SequenceLength", ["er"], ["n"]),
        helper.make_node("SequenceAt", ["er", "zero"], ["first"]),
    ]
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    return _save(path, nodes, [_vi("x", F, [4, 6]), _vi("y", F, [4, 1])],
                 [_vi("cat", F, None), _vi("n", I64, []), _vi("first", F, None), _seq("er")],
                 [two, pos, zero])


def test_split_insert_erase_concat(tmp_path):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32),
             "y": rng.standard_normal((4, 1)).astype(np.float32)}
    model = _check(_split_edit_concat(tmp_path / "m.onnx"), feeds)
    # The sequence ops have no CPU kernels: they ran on the reference backend.
    backends = dict(model._compiled.node_backends)
    assert backends["SplitToSequence"] == "reference"


def test_sequence_input_and_output(tmp_path):
    """A sequence in (a list of arrays of different shapes), stacked elements and a sequence
    out; SplitToSequence with keepdims=0 and ConcatFromSequence with new_axis=1."""
    nodes = [helper.make_node("SequenceAt", ["s", "minus1"], ["last"]),
             helper.make_node("SplitToSequence", ["last"], ["rows"], axis=0, keepdims=0),
             helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=-1, new_axis=1)]
    minus1 = numpy_helper.from_array(np.array(-1, np.int64), "minus1")
    path = _save(tmp_path / "m.onnx", nodes, [_seq("s", F, ["a", 3])],
                 [_vi("stacked", F, None), _seq("rows")], [minus1])
    rng = np.random.default_rng(1)
    s = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 5, 4)]
    _check(path, {"s": s})


def test_sequence_map_with_a_tensor_input(tmp_path):
    """SequenceMap: body(x, w) = (x * w, Shape(x)) over a sequence and a whole tensor."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Shape", ["x"], ["sh"])],
        "body", [_vi("x", F, ["n"]), _vi("w", F, [1])], [_vi("xw", F, ["n"]), _vi("sh", I64, [1])])
    nodes = [helper.make_node("SequenceMap", ["s", "w"], ["out", "shapes"], body=body)]
    path = _save(tmp_path / "m.onnx", nodes, [_seq("s", F, ["n"]), _vi("w", F, [1])],
                 [_seq("out"), _seq("shapes", I64)])
    s = [np.arange(k, dtype=np.float32) for k in (3, 1, 4)]
    _check(path, {"s": s, "w": np.array([2.5], np.float32)})


def test_sequence_grows_in_a_loop(tmp_path):
    """Loop carries a sequence: starts from SequenceEmpty, appends i * x each iteration."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["acc_in", "xi"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _seq("acc_in")],
        [_vi("cond_out", TensorProto.BOOL, []), _seq("acc_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["m", "", "empty"], ["acc"], body=body),
             helper.make_node("ConcatFromSequence", ["acc"], ["all"], axis=0)]
    path = _save(tmp_path / "m.onnx", nodes, [_vi("x", F, [2]), _vi("m", I64, [])],
                 [_seq("acc"), _vi("all", F, None)])
    _check(path, {"x": np.array([1.0, -2.0], np.float32), "m": np.array(4, np.int64)})


def _optional_model(path):
    """opt: optional(tensor) in; has = OptionalHasElement(opt); y = If(has) then
    OptionalGetElement(opt) * 2 else zeros; the optional passes through Identity as an output."""
    then_g = helper.make_graph(
        [helper.make_node("OptionalGetElement", ["opt"], ["v"]),
         helper.make_node("Add", ["v", "v"], ["t"])], "then", [], [_vi("t", F, [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["zeros"], ["e"])], "else", [],
                               [_vi("e", F, [3])])
    zeros = numpy_helper.from_array(np.zeros(3, np.float32), "zeros")
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [3]))
    nodes = [helper.make_node("OptionalHasElement", ["opt"], ["has"]),
             helper.make_node("If", ["has"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Identity", ["opt"], ["same"])]
    return _save(path, nodes, [helper.make_value_info("opt", opt_t)],
                 [_vi("y", F, [3]), _vi("has", TensorProto.BOOL, []),
                  helper.make_value_info("same", opt_t)], [zeros])


@pytest.mark.parametrize("value", [np.array([1.0, 2.0, -3.0], np.float32), None])
def test_optional_input(tmp_path, value):
    path = _optional_model(tmp_path / "m.onnx")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"opt": value})
    got = pypto.onnx.load(path)(opt=value)
    for g, w in zip(got, want):
        _same(g, w)
    if value is None:
        assert got[2] is None  # the empty optional comes back as None


def test_optional_of_a_sequence_from_a_type_attribute(tmp_path):
    """Optional(type=seq(float)) with no input is empty; OptionalHasElement says so."""
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))
    nodes = [helper.make_node("Optional", [], ["o"], type=seq_t),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
             helper.make_node("Optional", ["s"], ["full"]),
             helper.make_node("OptionalHasElement", ["full"], ["has_full"])]
    path = _save(tmp_path / "m.onnx", nodes, [_vi("x", F, [2])],
                 [_vi("has", TensorProto.BOOL, []), _vi("has_full", TensorProto.BOOL, [])])
    _check(path, {"x": np.ones(2, np.float32)})


def test_export_round_trip(tmp_path):
    """Sequence and optional types, and Optional's type attribute, survive export and import:
    onnxruntime runs the exported file, PyPTO the file read back, both as the original."""
    from pypto import _C

    for name, build, feeds in (
            ("split", _split_edit_concat,
             {"x": np.arange(24, dtype=np.float32).reshape(4, 6),
              "y": np.ones((4, 1), np.float32)}),
            ("opt", _optional_model, {"opt": np.array([1.0, 2.0, 3.0], np.float32)})):
        path = build(tmp_path / f"{name}.onnx")
        back = tmp_path / f"{name}_back.onnx"
        _C.onnx_save(_C.onnx_load(str(path)), str(back))
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        again = ort.InferenceSession(str(back), providers=["CPUExecutionProvider"]).run(None, feeds)
        for g, w in zip(again, want):
            _same(g, w)
        _check(back, feeds)


def test_wrong_input_kind_is_a_clear_error(tmp_path):
    path = _split_edit_concat(tmp_path / "m.onnx")
    model = pypto.onnx.load(path)
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(TypeError, match="input 'x' must be a torch.Tensor or numpy.ndarray, "
                                        "got list \\(the input is f32\\[4, 6\\], not a sequence"):
        model(x=[x], y=np.zeros((4, 1), np.float32))
    seq_path = _save(tmp_path / "s.onnx", [helper.make_node("SequenceLength", ["s"], ["n"])],
                     [_seq("s", F, [2])], [_vi("n", I64, [])])
    seq_model = pypto.onnx.load(seq_path)
    with pytest.raises(TypeError, match="input 's': expected seq<f32\\[2\\]>, got a tensor"):
        seq_model(s=np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="input 's'.*None"):
        seq_model(s=None)
    with pytest.raises(ValueError, match="input 's' element 1: dimension 0 should be 2"):
        seq_model(s=[np.zeros(2, np.float32), np.zeros(3, np.float32)])
    assert seq_model(s=[np.zeros(2, np.float32)] * 3) == 3


def test_tensor_op_on_a_sequence_is_unsupported(tmp_path):
    path = _save(tmp_path / "m.onnx", [helper.make_node("Relu", ["s"], ["y"])],
                 [_seq("s", F, [2])], [_seq("y")])
    with pytest.raises(NotImplementedError, match=r"\[Relu\].*input 's' is a sequence"):
        pypto.onnx.load(path)
