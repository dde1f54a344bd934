"""Mixture-of-experts layers: the batched product exporters write (each row's expert matrix
gathered, then a [S, N, K] x [S, K, 1] MatMul) becomes one GatherMatMul (FuseGatherMatMul, level
2) that multiplies each expert's rows in one GEMM; checked against ONNX Runtime for both weight
layouts, with experts that get no rows, and against PyTorch eager on transformers' MoE models."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper, save

import pypto


def _moe_model(path, w, trans):
    """Y = Squeeze(MatMul(Gather(W, I), Unsqueeze(X, -1)), -1), or the transposed form."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    if trans:  # [S, 1, K] x [S, K, N]
        nodes = [helper.make_node("Gather", ["w", "i"], ["wg"], axis=0),
                 helper.make_node("Unsqueeze", ["x", "ax1"], ["xu"]),
                 helper.make_node("MatMul", ["xu", "wg"], ["p"]),
                 helper.make_node("Squeeze", ["p", "ax1"], ["y0"])]
    else:  # [S, N, K] x [S, K, 1]
        nodes = [helper.make_node("Gather", ["w", "i"], ["wg"], axis=0),
                 helper.make_node("Unsqueeze", ["x", "axm1"], ["xu"]),
                 helper.make_node("MatMul", ["wg", "xu"], ["p"]),
                 helper.make_node("Squeeze", ["p", "axm1"], ["y0"])]
    nodes.append(helper.make_node("Relu", ["y0"], ["y"]))
    k = w.shape[1] if trans else w.shape[2]
    graph = helper.make_graph(
        nodes, "moe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", k]),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), ints("ax1", [1]), ints("axm1", [-1])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 96])
def test_gathered_products_vs_onnxruntime(tmp_path, trans, rows):
    rng = np.random.default_rng(rows)
    experts, n, k = 6, 24, 40
    w = rng.standard_normal((experts, k, n) if trans else (experts, n, k)).astype(np.float32)
    path = str(tmp_path / "moe.onnx")
    _moe_model(path, w, trans)
    exe = pypto.onnx.load(path)
    ops = {op: b for op, b in exe._compiled.node_backends}
    assert ops.get("GatherMatMul") == "cpu", exe._compiled.node_backends
    assert "MatMul" not in ops and "Gather" not in ops
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for s in (rows, rows + 3):  # the row count is symbolic
        feeds = {"x": rng.standard_normal((s, k)).astype(np.float32),
                 "i": rng.integers(0, experts - 2, s).astype(np.int64)}  # 2 experts unused
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(exe(**feeds), want, rtol=1e-5, atol=1e-5)


def test_level_1_keeps_the_gather(tmp_path):
    w = np.random.default_rng(0).standard_normal((3, 8, 4)).astype(np.float32)
    path = str(tmp_path / "moe.onnx")
    _moe_model(path, w, False)
    ops = [op for op, _ in pypto.onnx.load(path, level=1)._compiled.node_backends]
    assert "GatherMatMul" not in ops and "MatMul" in ops


@pytest.mark.parametrize("name", ["Qwen3Moe", "Olmoe"])
def test_transformers_moe_runs_gathered(name):
    transformers = pytest.importorskip("transformers")
    cfg = getattr(transformers, f"{name}Config")(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=500, num_experts=4, num_experts_per_tok=2,
        use_cache=False, **({"moe_intermediate_size": 48, "head_dim": 16}
                            if name == "Qwen3Moe" else {}))
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}Model")(cfg).eval()
    fast = pypto.optimize(model, example_inputs=(torch.randint(0, 500, (1, 10)),))
    ops = [op for op, _ in fast.compiled.node_backends]
    assert ops.count("GatherMatMul") == 4, ops  # gate/up and down, two layers
    for batch in (1, 2):
        ids = torch.randint(0, 500, (batch, 10))
        with torch.inference_mode():
            want = model(ids).last_hidden_state
        torch.testing.assert_close(fast(ids).last_hidden_state, want, rtol=1e-4, atol=1e-5)
