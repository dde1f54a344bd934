"""The wrong answers the valid-program fuzzer (fuzz_valid.py) found, each shrunk to a few nodes
and checked against onnxruntime (graph optimizations off) at every level, on one and two
threads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuzz_valid import check_case

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
          np.dtype(bool): TensorProto.BOOL}


def _model(nodes, feeds, inits, outputs, opset=18):
    ins = [helper.make_tensor_value_info(k, _TYPES[v.dtype], list(v.shape))
           for k, v in feeds.items()]
    outs = [onnx.ValueInfoProto(name=o) for o in outputs]
    g = helper.make_graph(nodes, "repro", ins, outs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _agrees(nodes, feeds, inits, outputs, opset=18):
    findings = check_case(_model(nodes, feeds, inits, outputs, opset), feeds)
    assert not isinstance(findings, tuple), findings  # onnxruntime took the model
    assert findings == []


@pytest.mark.parametrize("op", ["Greater", "GreaterOrEqual", "Less"])
@pytest.mark.parametrize("x_shape, w_shape, b_shape", [
    ((5, 9), (9, 4), (5, 4)),
    ((3, 1, 9), (9, 4), (3, 1, 1)),
    ((1, 3, 1, 9), (9, 1), (1, 3, 1, 1)),
])
def test_matmul_then_comparison(op, x_shape, w_shape, b_shape):
    # The MatMul+Elementwise epilogue took a chain ending in a comparison and stored its bool
    # result as if it were a half one (two bytes per element into a one-byte tensor).
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "b": rng.standard_normal(b_shape).astype(np.float32)}
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32)}
    _agrees([helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node(op, ["m", "b"], ["y"])], feeds, inits, ["y"])


@pytest.mark.parametrize("axis", [1, -3])
def test_blocked_concat_with_a_constant_of_odd_channels(axis):
    # Level 3: a Concat on channels of a blocked conv's output and a constant, channel counts not
    # whole blocks, becomes a GatherChannels; AssignLayouts read its constant input as an
    # elementwise op's broadcast operand and left it 4-D beside the 5-D blocked value.
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 16, 17, 5)).astype(np.float32)}
    inits = {"w1": rng.standard_normal((16, 1, 3, 3)).astype(np.float32),
             "w2": rng.standard_normal((16, 1, 3, 1)).astype(np.float32),
             "c": rng.standard_normal((3, 1, 10, 2)).astype(np.float32)}
    _agrees([helper.make_node("Conv", ["x", "w1"], ["a"], group=16, pads=[1, 0, 1, 0],
                              strides=[2, 2]),
             helper.make_node("Conv", ["a", "w2"], ["b"], group=16, pads=[1, 0, 2, 0]),
             helper.make_node("Concat", ["b", "c"], ["y"], axis=axis)], feeds, inits, ["y"])


def test_view_of_a_view_keeps_its_buffer():
    # Unsqueeze(Flatten(y)) and Squeeze(Flatten(y)), graph outputs, each view its own kernel:
    # liveness took the Unsqueeze's step as the one that made y (the root of both views), so the
    # step that did make y and a same-size sibling planned only the sibling; y took the sibling's
    # arena slot, which a later int64 Add then overwrote (one thread, level 2 and 3).
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
             "b": rng.uniform(0.5, 2, (1, 3, 8, 8)).astype(np.float32),
             "i": rng.integers(-5, 6, (1, 3, 8, 8)).astype(np.int64)}
    inits = {"ax0": np.array([0], np.int64), "j": rng.integers(-5, 6, (1, 3, 8, 8))}
    _agrees([helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Pow", ["b", "t"], ["y"]),
             helper.make_node("Sigmoid", ["t"], ["s"]),
             helper.make_node("ReduceL2", ["s"], ["r"], axes=[0, -3, 2], keepdims=0),
             helper.make_node("Flatten", ["y"], ["f"], axis=0),
             helper.make_node("Unsqueeze", ["f", "ax0"], ["u"]),
             helper.make_node("Squeeze", ["f", "ax0"], ["q"]),
             helper.make_node("Add", ["i", "j"], ["k"]),
             helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT)],
            feeds, inits, ["r", "u", "q", "kf"], opset=17)


@pytest.mark.parametrize("case", ["depthwise", "pointwise", "small", "two_convs", "plain"])
def test_conv_relu_keeps_nan(case):
    # Relu and Clip applied in a conv kernel's registers (min(max(y, lo), hi)) turned a NaN into
    # the lower bound: VMAXPS returns its second operand when either is NaN. Relu(NaN) is NaN.
    x_shape, w_shape, group = {"depthwise": ((1, 40, 9, 13), (40, 1, 3, 3), 40),
                               "pointwise": ((3, 47, 2, 9), (8, 47, 1, 1), 1),
                               "small": ((1, 3, 9, 9), (16, 3, 3, 3), 1),
                               "two_convs": ((1, 16, 9, 9), (32, 16, 3, 3), 1),
                               "plain": ((2, 8, 17, 17), (12, 8, 3, 3), 1)}[case]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    x.reshape(-1)[::37] = np.nan
    pads = [0, 0, 0, 0] if w_shape[-1] == 1 else [1, 1, 1, 1]
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32), "lo": np.float32(0),
             "hi": np.float32(6)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=group, pads=pads)]
    if case == "two_convs":
        inits["w2"] = rng.standard_normal((16, 32, 3, 3)).astype(np.float32)
        nodes = [helper.make_node("Conv", ["x", "w"], ["c0"], pads=pads),
                 helper.make_node("Relu", ["c0"], ["c1"]),
                 helper.make_node("Conv", ["c1", "w2"], ["c"], pads=pads)]
    act = "Clip" if case == "small" else "Relu"
    nodes.append(helper.make_node(act, ["c"] + (["lo", "hi"] if act == "Clip" else []), ["y"]))
    _agrees(nodes, {"x": x}, inits, ["y"])


@pytest.mark.parametrize("c_shape", [(4,), (2, 4), ()])
@pytest.mark.parametrize("const_c", [False, True])
def test_gemm_beta_zero_leaves_c_unread(c_shape, const_c):
    # beta = 0: onnxruntime and ONNX's reference evaluator do not read C (BLAS's convention);
    # PyPTO computed 0 * C, a NaN where C holds an Inf or a NaN.
    rng = np.random.default_rng(0)
    c = rng.standard_normal(c_shape).astype(np.float32)
    c.reshape(-1)[0] = np.inf
    if c.size > 1:
        c.reshape(-1)[1] = np.nan
    feeds = {"a": rng.standard_normal((2, 3)).astype(np.float32)}
    inits = {"b": rng.standard_normal((3, 4)).astype(np.float32)}
    (inits if const_c else feeds)["c"] = c
    _agrees([helper.make_node("Gemm", ["a", "b", "c"], ["y"], beta=0.0, alpha=2.0)], feeds, inits,
            ["y"])


def test_gemm_beta_zero_then_batch_norm():
    # FoldBatchNorm folds beta * C into the new bias: with beta = 0, C stays unread there too.
    rng = np.random.default_rng(0)
    inits = {"b": rng.standard_normal((3, 4)).astype(np.float32),
             "c": np.array([np.inf, np.nan, 1, 2], np.float32),
             "s": rng.uniform(0.5, 1.5, 4).astype(np.float32),
             "t": rng.standard_normal(4).astype(np.float32),
             "mu": rng.standard_normal(4).astype(np.float32),
             "var": rng.uniform(0.5, 1.5, 4).astype(np.float32)}
    _agrees([helper.make_node("Gemm", ["a", "b", "c"], ["g"], beta=0.0),
             helper.make_node("BatchNormalization", ["g", "s", "t", "mu", "var"], ["y"])],
            {"a": rng.standard_normal((2, 3)).astype(np.float32)}, inits, ["y"])


@pytest.mark.parametrize("shape", [(1, 2, 7, 8), (1, 2, 67, 16), (2, 3, 300, 32)])
def test_attention_nan_in_a_query(shape):
    # A NaN in a query makes its row of scores NaN, and softmax's row NaN; the fused Attention
    # kernel took the row for one with no visible key (the max over NaN scores stayed -inf) and
    # wrote zeros.
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    feeds["q"][0, 0, 3, 2] = np.nan
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    _agrees(nodes, feeds, {"c": np.float32(shape[-1] ** -0.5)}, ["y"])
