"""The long tail of ONNX ops that ran only on the reference interpreter now run on CPU kernels
(docs/backend/tail.md), checked against ONNX Runtime on one-node ONNX graphs: several shapes, odd
sizes, axes, attributes, NaN and infinities; node_backends must show the CPU kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import pypto
from one_node import run_one_node


def _run(tmp_path, node, x, inits=(), opset=18, dtype=TensorProto.FLOAT):
    got, want, backends = run_one_node(tmp_path, node, x, inits, opset, dtype)
    assert backends == {node.op_type: "cpu"}, backends
    return got, want


def _rand(shape, seed, lo=-3.0, hi=3.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("shape, axes", [
    ((2, 3, 7, 9), None),            # the default [0, 2, 3]: per channel of NCHW
    ((3, 5, 17, 19), [2, 3]),        # per plane
    ((2, 80, 301), [2]),             # features over frames (speech front ends)
    ((2, 80, 301), [1, 2]),
    ((4, 33), [0]),                  # columns: packed first
    ((2, 3, 4, 5), [1, 3]),          # two reduced runs apart
    ((5, 1, 9), [-1]),
])
def test_mean_variance_normalization(tmp_path, shape, axes):
    x = _rand(shape, 1, -2, 6)
    attrs = {} if axes is None else {"axes": axes}
    got, want = _run(tmp_path, helper.make_node("MeanVarianceNormalization", ["x"], ["y"],
                                                **attrs), x, opset=13)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_mean_variance_normalization_specials(tmp_path):
    # A NaN or an infinity makes its whole group NaN, in both. (A constant group is 0 here, by
    # ONNX's function body (sqrt(var) + 1e-9); onnxruntime 1.32 divides by sqrt(var) alone and
    # gives NaN, so it is left out of the comparison.)
    x = _rand((4, 40), 2)
    x[1, 17] = np.nan
    x[2, 3] = np.inf
    got, want = _run(tmp_path, helper.make_node("MeanVarianceNormalization", ["x"], ["y"],
                                                axes=[1]), x, opset=13)
    assert np.isnan(got[1:3]).all() and np.isnan(want[1:3]).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 0), (13, 1), (11, 1), (11, 0), (11, 2)])
def test_hardmax(tmp_path, opset, axis):
    x = np.round(_rand((3, 4, 17), 3), 1)  # ties: the first maximum wins
    x[1, 2, 5] = np.nan   # not first along any axis: skipped
    x[2, 0, 0] = np.inf
    x[2, 3, :] = -np.inf
    got, want = _run(tmp_path, helper.make_node("Hardmax", ["x"], ["y"], axis=axis), x,
                     opset=opset)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("length", [3, 8, 17, 33])
def test_hardmax_nan_first(tmp_path, length):
    # A row whose first element is NaN is all zeros, as onnxruntime gives for rows like these.
    # (Its running maximum is vectorized: where a NaN's lane meets larger values, as in some random
    # rows, or a NaN comes later, the one-hot position depends on the lanes; not compared. Here a
    # later NaN is skipped.)
    x = np.tile(np.arange(length, dtype=np.float32), (3, 1))
    x[0, 0] = np.nan
    x[2, :] = np.nan
    got, want = _run(tmp_path, helper.make_node("Hardmax", ["x"], ["y"], axis=-1), x, opset=13)
    np.testing.assert_array_equal(got, want)
    assert got[0].sum() == 0 and got[2].sum() == 0 and got[1, -1] == 1


@pytest.mark.parametrize("lambd, bias", [(0.5, 0.0), (1.5, 1.5), (0.25, 0.1)])
def test_shrink(tmp_path, lambd, bias):
    x = _rand((3, 1001), 4)
    x.flat[:6] = [np.nan, np.inf, -np.inf, lambd, -lambd, 0.0]
    got, want = _run(tmp_path, helper.make_node("Shrink", ["x"], ["y"], lambd=lambd, bias=bias), x)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape, axis", [((5, 19), 1), ((5, 19), 0), ((2, 7, 9, 3), 1),
                                         ((2, 7, 9, 3), -1)])
def test_lp_normalization(tmp_path, p, shape, axis):
    x = _rand(shape, 5)
    x[0] = 0.0  # a zero norm: zeros
    x.flat[-1] = np.nan
    got, want = _run(tmp_path, helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p), x,
                     opset=13)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size, alpha, beta, bias", [(5, 1e-4, 0.75, 1.0), (3, 2e-2, 0.5, 2.0),
                                                     (7, 1e-3, 1.2, 1.0)])
def test_lrn(tmp_path, size, alpha, beta, bias):
    x = _rand((2, 13, 9, 11), 6, -20, 20)
    got, want = _run(tmp_path, helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha,
                                                beta=beta, bias=bias), x, opset=13)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("upper, k", [(1, 0), (0, 0), (1, -2), (0, 3), (1, 100), (0, -100)])
def test_trilu(tmp_path, dtype, upper, k):
    x = (_rand((3, 6, 9), 7) * 100).astype(dtype)
    onnx_type = TensorProto.FLOAT if dtype == np.float32 else TensorProto.INT64
    got, want = _run(tmp_path, helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper), x,
                     [("k", np.array(k, np.int64))], opset=14, dtype=onnx_type)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op, lo, hi", [("Tan", -1.5, 1.5), ("Asin", -1.1, 1.1),
                                        ("Acos", -1.1, 1.1), ("Atan", -50, 50), ("Sinh", -20, 20),
                                        ("Cosh", -20, 20), ("Asinh", -1e3, 1e3),
                                        ("Acosh", 0.5, 100), ("Atanh", -1.1, 1.1)])
def test_trigonometry(tmp_path, op, lo, hi):
    x = _rand((7, 333), 8, lo, hi)
    x.flat[:5] = [np.nan, np.inf, -np.inf, 0.0, 1.0]
    got, want = _run(tmp_path, helper.make_node(op, ["x"], ["y"]), x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # libm and onnxruntime: a few ulp


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu_against_torch(tmp_path, alpha):
    # SwiGLU (opset 24) is newer than onnxruntime's CPU kernels: checked against PyTorch,
    # a * sigmoid(alpha a) * b.
    import torch
    a, b = _rand((5, 4, 1001), 9, -10, 10), _rand((5, 4, 1001), 10)
    path = str(tmp_path / "m.onnx")
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n in "ab"]
    graph = helper.make_graph([helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=alpha)], "g",
                              info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]), path)
    exe = pypto.onnx.load(path)
    got = exe(a=a, b=b)
    ta = torch.from_numpy(a).double()
    want = (ta * torch.sigmoid(alpha * ta) * torch.from_numpy(b).double()).float().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert {b for _, b in exe._compiled.node_backends} == {"cpu"}, exe._compiled.node_backends


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("n, classes, max_out, iou, score", [(8400, 4, 100, 0.5, 0.25),
                                                             (500, 3, 20, 0.3, None),
                                                             (97, 2, 1000, 0.7, 0.1)])
def test_non_max_suppression(tmp_path, center, n, classes, max_out, iou, score):
    rng = np.random.default_rng(n)
    xy = rng.uniform(0, 600, (2, n, 2)).astype(np.float32)
    wh = rng.uniform(10, 100, (2, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy + wh / 2, wh] if center else [xy, xy + wh], -1)
    scores = (rng.uniform(0, 1, (2, classes, n)) ** 4).astype(np.float32)
    names = ["b", "s", "m", "iou"] + ([] if score is None else ["th"])
    inits = [numpy_helper.from_array(np.array([max_out], np.int64), "m"),
             numpy_helper.from_array(np.array([iou], np.float32), "iou")]
    if score is not None:
        inits.append(numpy_helper.from_array(np.array([score], np.float32), "th"))
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", names, ["y"], center_point_box=center)], "g",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, list(boxes.shape)),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, list(scores.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)], initializer=inits)
    path = str(tmp_path / "m.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    feeds = {"b": boxes, "s": scores}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exe = pypto.onnx.load(path)
    got = exe(**feeds)
    assert dict(exe._compiled.node_backends) == {"NonMaxSuppression": "cpu"}
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("four_d", [True, False])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot, ids", [(0, True), (32, True), (0, False)])
def test_rotary_embedding(tmp_path, four_d, interleaved, rot, ids):
    B, H, S, D, P = 2, 4, 37, 64, 100
    rng = np.random.default_rng(rot + interleaved)
    x = rng.standard_normal((B, H, S, D) if four_d else (B, S, H * D)).astype(np.float32)
    half = (rot or D) // 2
    angle = rng.uniform(0, 6.3, (P, half) if ids else (B, S, half))
    feeds = {"x": x, "c": np.cos(angle).astype(np.float32), "s": np.sin(angle).astype(np.float32)}
    if ids:
        feeds["p"] = rng.integers(0, P, (B, S)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    if not four_d:
        attrs["num_heads"] = H
    info = [helper.make_tensor_value_info(k, TensorProto.INT64 if k == "p" else TensorProto.FLOAT,
                                          list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph([helper.make_node("RotaryEmbedding", list(feeds), ["y"], **attrs)],
                              "g", info, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                        None)])
    path = str(tmp_path / "m.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exe = pypto.onnx.load(path)
    got = exe(**feeds)
    assert dict(exe._compiled.node_backends) == {"RotaryEmbedding": "cpu"}
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm, sampling", [("half_pixel", 2), ("output_half_pixel", 0)])
def test_roi_align(tmp_path, mode, ctm, sampling):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 25, 34)).astype(np.float32)
    R = 40
    xy = rng.uniform(-20, 500, (R, 2))
    rois = np.concatenate([xy, xy + rng.uniform(4, 200, (R, 2))], 1).astype(np.float32)
    feeds = {"x": x, "r": rois, "b": rng.integers(0, 2, R).astype(np.int64)}
    node = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], mode=mode, output_height=7,
                            output_width=5, sampling_ratio=sampling, spatial_scale=1 / 16,
                            coordinate_transformation_mode=ctm)
    info = [helper.make_tensor_value_info(k, TensorProto.INT64 if k == "b" else TensorProto.FLOAT,
                                          list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", info,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = str(tmp_path / "m.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exe = pypto.onnx.load(path)
    got = exe(**feeds)
    assert dict(exe._compiled.node_backends) == {"RoiAlign": "cpu"}
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("shape, attrs", [
    ((2, 8, 33), dict(kernel_shape=[4], strides=[2], pads=[1, 2])),
    ((1, 16, 28, 31), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 4, 12, 13), dict(kernel_shape=[2, 3], auto_pad="SAME_UPPER")),
    ((1, 2, 6, 7, 8), dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2])),
])
def test_lp_pool(tmp_path, p, shape, attrs):
    x = _rand(shape, 11)
    got, want = _run(tmp_path, helper.make_node("LpPool", ["x"], ["y"], p=p, **attrs), x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
