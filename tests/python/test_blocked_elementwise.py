"""Elementwise programs between blocked convolutions at level 3 whose operands include per-channel
values ([C, 1, 1]: a layer scale, a bias, a BatchNorm's scale): on blocked [N, C/c, H, W, c] tensors
such an operand is one row of c values repeated for every position. Compared with onnxruntime on
the same file. 16 and 48 channels run blocked (the per-channel operand a splat of one vector in the
executor's chains, or copied row by row in its passes); 24 at this size stays NCHW."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _model(channels, size, body):
    """x -> conv a, conv b; body(a, b, x, s, t, lo, hi) -> f; f -> conv -> y. s and t: [C, 1, 1]."""
    rng = np.random.default_rng(channels + size)

    def weight(name, shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    c = channels
    inits = [weight("w1", [c, c, 1, 1]), weight("w2", [c, c, 1, 1]), weight("w3", [c, c, 1, 1]),
             weight("s", [c, 1, 1], 1.0), weight("t", [c, 1, 1], 1.0),
             numpy_helper.from_array(np.float32(-0.5), "lo"),
             numpy_helper.from_array(np.float32(0.7), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"])]
    nodes += body()
    nodes.append(helper.make_node("Conv", ["f", "w3"], ["y"]))
    graph = helper.make_graph(
        nodes, "blocked_elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


# Each body starts from a - b: a per-channel Mul straight after a conv would be folded into its
# weights, and a conv output alone would become the conv's epilogue.
BODIES = {
    # FastViT's token mixer: x + s * (a - b)
    "layer_scale": lambda: [_node("Sub", ["a", "b"], "d"), _node("Mul", ["d", "s"], "e"),
                            _node("Add", ["e", "x"], "f")],
    # an affine per channel (an unfolded BatchNorm), then ReLU
    "affine_relu": lambda: [_node("Sub", ["a", "b"], "d"), _node("Mul", ["d", "s"], "e"),
                            _node("Add", ["e", "t"], "g"), _node("Relu", ["g"], "f")],
    # per-channel operands on the left of Sub and Div, and as a Max bound
    "left_operands": lambda: [_node("Sub", ["a", "b"], "d"), _node("Sub", ["s", "d"], "e"),
                              _node("Max", ["e", "t"], "g"), _node("Div", ["t", "g"], "f")],
    # a splat computed from two per-channel operands, then Clip
    "splat_of_rows": lambda: [_node("Mul", ["s", "t"], "u"), _node("Sub", ["a", "b"], "d"),
                              _node("Mul", ["d", "u"], "e"), _node("Clip", ["e", "lo", "hi"], "f")],
    # not a chain (two heavy functions): the executor's passes over the tile
    "two_heavy": lambda: [_node("Sub", ["a", "b"], "d"), _node("Sigmoid", ["d"], "e"),
                          _node("Mul", ["e", "s"], "g"), _node("Tanh", ["g"], "f")],
}


@pytest.mark.parametrize("channels", [16, 24, 48])
@pytest.mark.parametrize("body", sorted(BODIES))
def test_per_channel_operands_on_blocked_values(tmp_path, channels, body):
    m = _model(channels, 28, BODIES[body])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    x = np.random.default_rng(7).standard_normal([1, channels, 28, 28]).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    exe = pypto.onnx.load(path, level=3)
    got = np.asarray(exe(x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
