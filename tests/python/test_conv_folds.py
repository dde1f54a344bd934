"""The forms tf2onnx and other exporters leave around convolutions, folded into the conv at
level >= 1 and compared with onnxruntime: a Mul or Add by a per-channel constant after a Conv
(tf2onnx's depthwise batch norms; FoldBatchNorm reads it as a BN) and a Pad by zeros on the
spatial axes before one (TensorFlow's asymmetric "SAME" padding; CanonicalizeOps/PadIntoConv),
TensorFlow's Conv1D, a 1 x k Conv between an Unsqueeze and a Squeeze of the height axis, made a
1-D Conv (CanonicalizeOps/Conv1D), after which its batch norm and causal Pad fold too, and a Conv
over a width of 1 (a Conv1D through jax2tf/tf2onnx) run as the 1-D conv at level >= 2
(CanonicalizeOps/ConvUnitWidth). Forms that are not the same computation stay as they are."""

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


@pytest.mark.parametrize("case", ["reflect", "value", "channels", "crop"])
def test_other_pads_stay(tmp_path, case):
    # A crop (negative pad) before a padded conv: the conv's zeros replace the cropped edge, the
    # combined padding would keep it (found by fuzz_valid.py).
    pads = {"channels": [0, 1, 1, 1, 0, 0, 1, 1],
            "crop": [0, 0, 0, 2, 0, 0, -1, -1]}.get(case, [0, 0, 1, 1, 0, 0, 1, 1])
    ins = ["x", "pads"] + (["v"] if case == "value" else [])
    attrs = {"mode": "reflect"} if case == "reflect" else {}
    nodes = [helper.make_node("Pad", ins, ["xp"], **attrs),
             helper.make_node("Conv", ["xp", "w"], ["y"],
                              **({"pads": [2, 1, 2, 1]} if case == "crop" else {}))]
    inits = {"w": _w(4, 5 if case == "channels" else 4, 3, 3), "pads": np.array(pads, np.int64),
             "v": np.float32(0.5)}
    ops = _run(tmp_path, nodes, inits, [1, 4, 7, 7])
    assert "Pad" in ops, ops


def _conv_unit_width(tmp_path, level, x_shape, w_shape, transposed_filter=False, **attrs):
    """A Conv over a width of 1 (jax2tf's and tf2onnx's Conv1D) at `level`, against onnxruntime;
    returns the ops that ran."""
    w = _w(*w_shape)
    inits = {"w": w, "b": _w(w_shape[0])}
    nodes = [helper.make_node("Conv", ["x", "wt" if transposed_filter else "w", "b"], ["y"],
                              **attrs)]
    if transposed_filter:  # the filter as jax2tf writes it: a Transpose of an HWIO constant
        inits["w"] = np.ascontiguousarray(w.transpose(2, 3, 1, 0))
        nodes.insert(0, helper.make_node("Transpose", ["w"], ["wt"], perm=[3, 2, 0, 1]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    exe = pypto.onnx.load(str(path), level=level)
    for h in (37, 5):  # a symbolic H takes two sizes
        shape = [h if isinstance(d, str) else d for d in x_shape]
        x = RNG.standard_normal(shape).astype(np.float32)
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        np.testing.assert_allclose(np.asarray(exe(x=x)), want, rtol=1e-5, atol=1e-5)
    return [op for op, _ in exe._compiled.node_backends]


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("case", ["plain", "pads_strides_dilations", "grouped", "symbolic",
                                  "transposed_filter", "same_upper"])
def test_conv_over_unit_width_runs_as_1d(tmp_path, case, level):
    """Conv on [N, C, H, 1] with a [O, I, k, 1] filter (magika's Conv1D, exported through jax2tf
    and tf2onnx) runs as the 1-D conv on [N, C, H] at level >= 2 (CanonicalizeOps/ConvUnitWidth:
    the 2-D kernels vectorized along the width of 1 at a third of the speed)."""
    x_shape, w_shape, attrs = [2, 8, 37, 1], [6, 8, 5, 1], {"kernel_shape": [5, 1]}
    if case == "pads_strides_dilations":
        attrs = {"pads": [3, 0, 1, 0], "strides": [2, 3], "dilations": [2, 1]}
    elif case == "grouped":
        w_shape, attrs = [6, 4, 3, 1], {"group": 2, "pads": [1, 0, 1, 0]}
    elif case == "same_upper":
        attrs = {"auto_pad": "SAME_UPPER", "strides": [2, 2]}
    elif case == "symbolic":
        x_shape = ["n", 8, "h", 1]
        attrs = {"pads": [2, 0, 2, 0]}
    ops = _conv_unit_width(tmp_path, level, x_shape, w_shape, case == "transposed_filter", **attrs)
    assert ops == (["Squeeze", "Conv", "Unsqueeze"] if level >= 2 else ["Conv"]), ops


@pytest.mark.parametrize("case", ["width_padded", "width_2", "filter_width_2", "plane_1x1"])
def test_other_convs_stay_2d(tmp_path, case):
    x_shape, w_shape, attrs = [1, 4, 9, 1], [3, 4, 3, 1], {}
    if case == "plane_1x1":  # squeeze-excite after global pooling
        x_shape, w_shape = [2, 4, 1, 1], [3, 4, 1, 1]
    elif case == "width_padded":
        attrs = {"pads": [1, 1, 1, 1]}
    elif case == "width_2":
        x_shape = [1, 4, 9, 2]
    else:
        x_shape, w_shape = [1, 4, 9, 2], [3, 4, 3, 2]
    assert _conv_unit_width(tmp_path, 2, x_shape, w_shape, **attrs) == ["Conv"]

def _conv1d_nodes(x_to_4d, stride=1, dilation=1, group=1, pads=(0, 1, 0, 1)):
    """tf2onnx's Conv1D: [N, C, W] -> Unsqueeze (or Reshape) to [N, C, 1, W] -> Conv with a
    [M, C/g, 1, k] kernel -> Squeeze to [N, M, W'] -> batch norm Mul, Add -> Relu."""
    head = ([helper.make_node("Unsqueeze", ["xp", "ax2"], ["x4"])] if x_to_4d == "unsqueeze"
            else [helper.make_node("Reshape", ["xp", "shape4"], ["x4"])])
    return [helper.make_node("Pad", ["x", "pads3"], ["xp"])] + head + [
        helper.make_node("Conv", ["x4", "w", "b"], ["c4"], kernel_shape=[1, 3],
                         strides=[1, stride], dilations=[1, dilation], group=group,
                         pads=list(pads)),
        helper.make_node("Squeeze", ["c4", "ax2"], ["c"]),
        helper.make_node("Mul", ["c", "s"], ["m"]),
        helper.make_node("Add", ["m", "t"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"])]


@pytest.mark.parametrize("x_to_4d", ["unsqueeze", "reshape"])
@pytest.mark.parametrize("stride,dilation,group", [(1, 2, 1), (2, 1, 1), (1, 1, 8)])
def test_conv1d_as_tensorflow_writes_it_becomes_1d(tmp_path, x_to_4d, stride, dilation, group):
    n, c, w = 2, 8, 23
    inits = {"w": _w(8, 8 // group, 1, 3), "b": _w(8), "s": _w(1, 8, 1), "t": _w(1, 8, 1),
             "ax2": np.array([2], np.int64), "shape4": np.array([n, c, 1, -1], np.int64),
             # Keras' causal padding: 2 * dilation zeros on the left of the width axis.
             "pads3": np.array([0, 0, 2 * dilation, 0, 0, 0], np.int64)}
    ops = _run(tmp_path, _conv1d_nodes(x_to_4d, stride, dilation, group), inits, [n, c, w])
    for gone in ("Squeeze", "Unsqueeze", "Reshape", "Pad", "Mul", "Add"):
        assert gone not in ops, ops
    assert ops == ["Conv", "Relu"], ops


@pytest.mark.parametrize("case", ["height_padded", "tall_image", "squeeze_read_twice"])
def test_other_height_one_convs_stay_2d(tmp_path, case):
    """A kernel of height 1 on an image of height > 1, a conv padded along height, and a conv
    whose 4-D output is read by more than the Squeeze are not 1-D convs."""
    inits = {"w": _w(8, 8, 1, 3), "b": _w(8), "s": _w(1, 8, 1), "t": _w(1, 8, 1),
             "ax2": np.array([2], np.int64), "shape4": np.array([2, 8, 1, -1], np.int64),
             "pads3": np.array([0, 0, 0, 0, 0, 0], np.int64)}
    pads = (1, 1, 1, 1) if case == "height_padded" else (0, 1, 0, 1)
    nodes = _conv1d_nodes("unsqueeze", pads=pads)
    if case == "height_padded":  # the output then has height 3: reduce it away instead
        nodes[3] = helper.make_node("ReduceMax", ["c4"], ["c"], axes=[2], keepdims=0)
    x_shape = [2, 8, 11]
    if case == "tall_image":  # a 4-D image of height 5 straight into the conv
        nodes = nodes[2:]
        nodes[0] = helper.make_node("Conv", ["x", "w", "b"], ["c4"], kernel_shape=[1, 3],
                                    pads=[0, 1, 0, 1])
        nodes[1] = helper.make_node("ReduceMax", ["c4"], ["c"], axes=[2], keepdims=0)
        x_shape = [2, 8, 5, 11]
    if case == "squeeze_read_twice":
        nodes[-1] = helper.make_node("Relu", ["a"], ["r"])
        nodes.append(helper.make_node("ReduceSum", ["c4"], ["total"], keepdims=0))
        nodes.append(helper.make_node("Add", ["r", "total"], ["y"]))
    ops = _run(tmp_path, nodes, inits, x_shape)
    assert "Conv" in ops, ops
    if case != "tall_image":
        assert "Squeeze" in ops or "ReduceMax" in ops, ops


def test_conv1d_of_one_channel_nwc_input(tmp_path):
    """tf2onnx's first Conv1D of a one-channel [N, W, 1] signal: Unsqueeze to [N, 1, W, 1], a
    Reshape to [N, 1, 1, W] (its NHWC-to-NCHW Transpose, made a Reshape for one channel), the
    1 x k Conv, the Squeeze; no rank-3 value has the conv's [N, 1, W] shape, so a Reshape makes
    one, and the batch norm still folds."""
    nodes = [helper.make_node("Unsqueeze", ["x", "ax1"], ["u"]),
             helper.make_node("Reshape", ["u", "shape4"], ["x4"]),
             helper.make_node("Conv", ["x4", "w"], ["c4"], kernel_shape=[1, 9], strides=[1, 2],
                              pads=[0, 3, 0, 4]),
             helper.make_node("Squeeze", ["c4", "ax2"], ["c"]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    inits = {"w": _w(16, 1, 1, 9), "s": _w(1, 16, 1), "t": _w(1, 16, 1),
             "ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64),
             "shape4": np.array([2, 1, 1, 400], np.int64)}
    ops = _run(tmp_path, nodes, inits, [2, 400, 1])
    assert ops == ["Reshape", "Conv"], ops
