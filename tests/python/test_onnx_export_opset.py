"""pypto.onnx.export of an optimized graph whose passes made ops newer than the model's opset
(Attention is opset 23, Gelu 20): the file says the newer opset, older nodes are written in its
form, and ONNX Runtime runs it to the same numbers."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import pypto


def _ops(path):
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    return proto, [n.op_type for n in proto.graph.node]


def _default_opset(proto):
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


class Block(torch.nn.Module):
    """Attention (through SDPA), GELU and LayerNorm: every fused op has a late ONNX opset."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.ln = torch.nn.LayerNorm(64)
        self.up = torch.nn.Linear(64, 128)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = self.ln(x + a.transpose(1, 2).reshape(b, s, 64))
        return torch.nn.functional.gelu(self.up(h))


def test_optimized_transformer_block_exports_for_onnxruntime(tmp_path):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 10, 64)
    path = tmp_path / "block.onnx"
    pypto.onnx.export(pypto.optimize(model, (x,)), (x,), path)
    proto, ops = _ops(path)
    assert "Attention" in ops and _default_opset(proto) >= 23
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, s in ((2, 10), (3, 10)):  # the batch is symbolic
        xb = torch.randn(b, s, 64)
        (got,) = sess.run(None, {sess.get_inputs()[0].name: xb.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got, model(xb).numpy(), rtol=1e-4, atol=1e-5)


def _attention_model(opset, seq=6, width=32, heads=2):
    """x -> single-head-split attention written as MatMul/Softmax/MatMul, then x - mean(x) with
    ReduceMean's axes as an attribute (opset < 18) and a Squeeze-free graph."""
    rng = np.random.default_rng(opset)
    d = width // heads
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) * 0.2)
                                     .astype(np.float32), f"w{c}") for c in "qkv"]
    inits += [numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), "split_shape"),
              numpy_helper.from_array(np.array([1, seq, width], np.int64), "merge_shape"),
              numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale")]
    nodes = []
    for c in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"{c}2"]),
                  helper.make_node("Reshape", [f"{c}2", "split_shape"], [f"{c}4"]),
                  helper.make_node("Transpose", [f"{c}4"], [f"{c}h"],
                                   perm=[0, 2, 3, 1] if c == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["attn"]),
              helper.make_node("ReduceMean", ["attn"], ["mean"], axes=[-1], keepdims=1),
              helper.make_node("Sub", ["attn", "mean"], ["y"])]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_opset17_model_gains_attention_and_reduce_axes_become_an_input(tmp_path):
    src = tmp_path / "attn17.onnx"
    onnx.save(_attention_model(17), str(src))
    x = np.random.default_rng(1).standard_normal((1, 6, 32)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out = tmp_path / "attn17_opt.onnx"
    pypto.onnx.export(pypto.onnx.load(src), None, out)
    proto, ops = _ops(out)
    assert "Attention" in ops and _default_opset(proto) >= 23
    (mean,) = [n for n in proto.graph.node if n.op_type == "ReduceMean"]
    assert len(mean.input) == 2 and not any(a.name == "axes" for a in mean.attribute)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # PyPTO reads back what it wrote.
    np.testing.assert_allclose(pypto.onnx.load(out)(x), want, rtol=1e-5, atol=1e-5)


def test_model_older_than_opset13_with_attention_is_a_clear_error(tmp_path):
    src = tmp_path / "attn12.onnx"
    onnx.save(_attention_model(12), str(src))
    compiled = pypto.onnx.load(src)
    x = np.random.default_rng(2).standard_normal((1, 6, 32)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x), want, rtol=1e-5, atol=1e-5)  # it runs; export cannot
    with pytest.raises(NotImplementedError, match="opset 12.*opset 2[3-9].*version_converter"):
        pypto.onnx.export(compiled, None, tmp_path / "out.onnx")
