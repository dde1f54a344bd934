"""Depthwise convs on small planes (the flat kernel, src/backend/cpu/conv/conv_depthwise_impl.h,
and the blocked kernel the strided ones keep) inside MobileNet-style blocks, against onnxruntime:
1x1 expansion + Clip, depthwise k x k (stride 1 or 2, pads 0..2) + Clip or Relu, 1x1 projection
(+ the residual Add at stride 1), planes 5..30 and batch 2, at levels 2 and 3, on 1 and 2 threads,
and with PTO_DEPTHWISE_FLAT=0 (the padded-plane kernel) and PTO_DWPW_FLAT=0 (level 3's fused
depthwise + projection row by row on small planes) for comparison."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import pypto

# (batch, channels, h, w, expansion, kernel, stride, pad, activation)
CASES = [
    (1, 16, 6, 6, 96, 3, 1, 1, "Clip"),
    (1, 16, 12, 12, 96, 3, 2, 1, "Clip"),
    (2, 8, 5, 7, 48, 3, 1, 1, "Relu"),
    (1, 24, 24, 24, 144, 3, 1, 1, "Clip"),
    (1, 16, 30, 29, 64, 5, 2, 2, "Clip"),
    (2, 8, 13, 11, 32, 5, 1, 2, "Relu"),
    (1, 32, 3, 3, 192, 3, 1, 1, "Clip"),
    (1, 8, 9, 10, 32, 3, 2, 0, "Clip"),
    (1, 16, 20, 20, 48, 3, 1, 0, "Relu"),
    # SiLU and a general chain after the depthwise conv: the epilogue pass over runs of planes
    # (2x2 planes with mostly-padding taps stay on the blocked kernel)
    (1, 16, 2, 2, 96, 5, 1, 2, "Silu"),
    (1, 16, 4, 4, 96, 5, 1, 2, "Silu"),
    (2, 8, 8, 8, 48, 3, 1, 1, "Silu"),
    (1, 16, 7, 7, 96, 3, 1, 1, "Chain"),
    (2, 8, 12, 12, 48, 3, 2, 1, "Chain"),
    # stride-1 rows that fill their vectors: the gapped kernel (AVX-512), SiLU and a chain after
    (1, 16, 14, 14, 96, 5, 1, 2, "Silu"),
    (2, 8, 28, 28, 48, 3, 1, 1, "Chain"),
]


def block_model(path, n, c, h, w, e, k, s, p, act):
    rng = np.random.default_rng(h * 100 + w + k + s)
    def t(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    inits = [t("we", e, c, 1, 1), t("be", e), t("wd", e, 1, k, k), t("bd", e),
             t("wp", c, e, 1, 1), t("bp", c),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["e"]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["ec"]),
             helper.make_node("Conv", ["ec", "wd", "bd"], ["d"], group=e, kernel_shape=[k, k],
                              strides=[s, s], pads=[p] * 4)]
    if act == "Clip":
        nodes.append(helper.make_node("Clip", ["d", "lo", "hi"], ["da"]))
    elif act == "Relu":
        nodes.append(helper.make_node("Relu", ["d"], ["da"]))
    elif act == "Silu":
        nodes += [helper.make_node("Sigmoid", ["d"], ["ds"]),
                  helper.make_node("Mul", ["d", "ds"], ["da"])]
    else:  # a chain: x * 0.5 + 0.25, then Tanh
        inits += [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                  numpy_helper.from_array(np.array(0.25, np.float32), "quarter")]
        nodes += [helper.make_node("Mul", ["d", "half"], ["dm"]),
                  helper.make_node("Add", ["dm", "quarter"], ["dq"]),
                  helper.make_node("Tanh", ["dq"], ["da"])]
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    residual = s == 1 and (oh, ow) == (h, w)
    nodes.append(helper.make_node("Conv", ["da", "wp", "bp"], ["pj" if residual else "y"]))
    if residual:
        nodes.append(helper.make_node("Add", ["pj", "x"], ["y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}c{}_{}x{}_e{}_k{}s{}p{}_{}".format(*c))
def test_depthwise_block_matches_onnxruntime(tmp_path, monkeypatch, case):
    path = str(tmp_path / "m.onnx")
    block_model(path, *case)
    n, c, h, w = case[:4]
    x = np.random.default_rng(1).standard_normal((n, c, h, w)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    saved = pypto.get_num_threads()
    try:
        # PTO_DWPW_FLAT=0: level 3's fused depthwise + projection row by row on small planes;
        # PTO_DEPTHWISE_ROWS=0: strided short rows not on the rows kernel (AVX-512);
        # PTO_DEPTHWISE_GAPPED=0: stride-1 rows on the masked flat kernel;
        # PTO_DWPW_CHANNEL_SPLIT=0: level 3's small planes on 2 threads in runs or parts
        for name, flat in ((None, None), ("PTO_DEPTHWISE_FLAT", "0"), ("PTO_DWPW_FLAT", "0"),
                           ("PTO_DEPTHWISE_ROWS", "0"), ("PTO_DEPTHWISE_GAPPED", "0"),
                           ("PTO_DWPW_CHANNEL_SPLIT", "0")):
            for var in ("PTO_DEPTHWISE_FLAT", "PTO_DWPW_FLAT", "PTO_DEPTHWISE_ROWS",
                        "PTO_DEPTHWISE_GAPPED", "PTO_DWPW_CHANNEL_SPLIT"):
                monkeypatch.delenv(var, raising=False)
            if name is not None:
                monkeypatch.setenv(name, flat)
            level3_only = name in ("PTO_DWPW_FLAT", "PTO_DWPW_CHANNEL_SPLIT")
            for level in (2, 3) if not level3_only else (3,):
                for threads in (1, 2):
                    pypto.set_num_threads(threads)
                    got = pypto.onnx.load(path, level)(x=x)
                    np.testing.assert_allclose(
                        got, want, rtol=1e-4, atol=1e-4,
                        err_msg=f"level {level}, {threads} thread(s), {name}={flat}")
    finally:
        pypto.set_num_threads(saved)


def test_dwpw_flat_env_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    block_model(path, *CASES[0])  # a 6x6 plane: DwPwConvBlocked at level 3
    monkeypatch.setenv("PTO_DWPW_FLAT", "2")
    with pytest.raises(Exception, match="PTO_DWPW_FLAT"):
        pypto.onnx.load(path, 3)(x=np.zeros((1, 16, 6, 6), np.float32))


def test_dwpw_channel_split_env_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    block_model(path, 1, 16, 7, 7, 96, 3, 1, 1, "Clip")  # 7 rows on 2 threads: the halves
    monkeypatch.setenv("PTO_DWPW_CHANNEL_SPLIT", "yes")
    saved = pypto.get_num_threads()
    try:
        pypto.set_num_threads(2)
        with pytest.raises(Exception, match="PTO_DWPW_CHANNEL_SPLIT"):
            pypto.onnx.load(path, 3)(x=np.zeros((1, 16, 7, 7), np.float32))
    finally:
        pypto.set_num_threads(saved)


# A depthwise conv alone at level 3 (no projection after it: squeeze-excite in EfficientNet) on a
# small padded plane, with a residual Add and an activation fused after it, batch 2: each task
# copies its plane zero-padded into its thread's buffer (conv_blocked.cpp, padded_geometry).
@pytest.mark.parametrize("c,hw,k,act,residual", [(128, 7, 3, "Relu", True),
                                                  (256, 7, 5, "Sigmoid", True),
                                                  (72, 14, 5, None, False),
                                                  (160, 9, 3, "Tanh", False),
                                                  (16, 7, 3, "Relu", True)])  # few planes
def test_lone_padded_depthwise_matches_onnxruntime(tmp_path, c, hw, k, act, residual):
    rng = np.random.default_rng(c + hw + k)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.1).astype(np.float32),
                                     "w0"),
             numpy_helper.from_array(rng.standard_normal((c, 1, k, k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"]),  # a blocked producer
             helper.make_node("Conv", ["x0", "w", "b"], ["d"], group=c, pads=[k // 2] * 4)]
    last = "d"
    if residual:
        nodes.append(helper.make_node("Add", ["d", "x0"], ["r"]))
        last = "r"
    nodes.append(helper.make_node(act or "Identity", [last], ["y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    path = str(tmp_path / "m.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(1).standard_normal((2, c, hw, hw)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    saved = pypto.get_num_threads()
    try:
        for threads in (1, 2):
            pypto.set_num_threads(threads)
            got = pypto.onnx.load(path, 3)(x=x)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{threads} thread(s)")
    finally:
        pypto.set_num_threads(saved)


def test_depthwise_rows_env_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    block_model(path, *CASES[1])  # 12x12 stride 2: 6-wide output rows, the rows kernel's
    monkeypatch.setenv("PTO_DEPTHWISE_ROWS", "on")
    with pytest.raises(Exception, match="PTO_DEPTHWISE_ROWS"):
        pypto.onnx.load(path, 2)(x=np.zeros((1, 16, 12, 12), np.float32))


def test_depthwise_flat_env_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    block_model(path, *CASES[0])
    monkeypatch.setenv("PTO_DEPTHWISE_FLAT", "yes")
    with pytest.raises(Exception, match="PTO_DEPTHWISE_FLAT"):
        pypto.onnx.load(path, 2)(x=np.zeros((1, 16, 6, 6), np.float32))


def test_depthwise_gapped_env_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    block_model(path, 1, 16, 14, 14, 96, 5, 1, 2, "Silu")  # 14-wide stride-1 rows: gapped
    monkeypatch.setenv("PTO_DEPTHWISE_GAPPED", "yes")
    with pytest.raises(Exception, match="PTO_DEPTHWISE_GAPPED"):
        pypto.onnx.load(path, 2)(x=np.zeros((1, 16, 14, 14), np.float32))
