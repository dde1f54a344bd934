"""Malformed ONNX models (as a fuzzer writes them: structure-aware mutations of valid ones) are
refused with a ValueError naming the node, or compile; never a crash, a hang or an internal
error. Each case here was found by fuzzing pypto.onnx.load."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _model(nodes, inputs, outputs=("y",), initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", list(inputs),
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                           for o in outputs], list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _x(shape):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)


@pytest.mark.parametrize("op,attrs", [("Sum", {}), ("Mean", {}), ("Max", {}),
                                      ("Einsum", {"equation": "i,i->i"}),
                                      ("Concat", {"axis": 0})])
def test_an_omitted_variadic_input_is_refused(op, attrs):
    """Sum reached a pass as Add with a missing input (an internal error), Einsum a failed check
    on value id -1."""
    m = _model([helper.make_node(op, ["x", ""], ["y"], name="n", **attrs)], [_x([3])])
    with pytest.raises(ValueError, match=rf"\[{op}\] node 'n': input 1 is missing: {op}'s "
                                         "variadic inputs cannot be omitted"):
        pypto.onnx.load(m)


def test_a_conv_declaring_a_huge_plane_compiles_without_walking_it():
    """A height of 2^40 made the planner walk every output row at compile time (a hang)."""
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3],
                                 pads=[1, 1, 1, 1])], [_x([1, 8, 2 ** 40, 4])], initializers=[w])
    exe = pypto.onnx.load(m)
    assert exe.output_names == ["y"]


def test_names_that_are_not_utf8_are_escaped_in_the_error():
    """Protobuf keeps a name's bytes as they are: an error quoting one became a UnicodeDecodeError
    without the error's message."""
    m = _model([helper.make_node("FooBar", ["x"], ["y"], name="ZZZZ")], [_x([3])])
    data = m.SerializeToString().replace(b"ZZZZ", b"\xb4\xff\xfe\x80")
    with pytest.raises(NotImplementedError,
                       match=r"\[FooBar\] node '\\xb4\\xff\\xfe\\x80': operator 'FooBar' is not "
                             "supported"):
        pypto.onnx.load(data)
