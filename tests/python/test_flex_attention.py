"""FlexAttention (domain ai.onnx.preview): the importer splices its score_mod and prob_mod
subgraphs between the standard ops of attention (src/frontend/onnx/preview_ops.cpp), and
RecognizeAttention fuses the plain, masked and soft-capped forms into one Attention kernel.
Compared with ONNX's own reference implementation (onnx.reference) at sizes past the kernel's
tiles, and a Gemma-2-style soft-capped attention module through pypto.optimize with eager."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import pypto

PREVIEW = "ai.onnx.preview"
F = TensorProto.FLOAT


def _scores(name="scores"):
    return (helper.make_tensor_value_info(name, F, ["B", "H", "L", "S"]),
            helper.make_tensor_value_info(name + "_out", F, ["B", "H", "L", "S"]))


def _soft_cap(cap):
    i, o = _scores()
    return helper.make_graph(
        [helper.make_node("Div", ["scores", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
         helper.make_node("Mul", ["t", "cap"], ["scores_out"])],
        "soft_cap", [i], [o], [helper.make_tensor("cap", F, [], [cap])])


def _causal():
    i, o = _scores()
    c = lambda n, v, s=(): helper.make_tensor(n, TensorProto.INT64, list(s), v)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["scores"], ["shape"]),
        helper.make_node("Gather", ["shape", "i2"], ["l"], axis=0),
        helper.make_node("Gather", ["shape", "i3"], ["s"], axis=0),
        helper.make_node("Range", ["zero", "l", "one"], ["qr"]),
        helper.make_node("Reshape", ["qr", "qs"], ["qi"]),
        helper.make_node("Range", ["zero", "s", "one"], ["kr"]),
        helper.make_node("Reshape", ["kr", "ks"], ["ki"]),
        helper.make_node("GreaterOrEqual", ["qi", "ki"], ["keep"]),
        helper.make_node("Where", ["keep", "scores", "ninf"], ["scores_out"]),
    ]
    inits = [c("zero", [0]), c("one", [1]), c("i2", [2]), c("i3", [3]),
             c("qs", [1, 1, -1, 1], [4]), c("ks", [1, 1, 1, -1], [4]),
             helper.make_tensor("ninf", F, [], [float("-inf")])]
    return helper.make_graph(nodes, "causal", [i], [o], inits)


def _outer_bias():
    """Adds the main graph's input `bias` (a capture from the enclosing scope)."""
    i, o = _scores()
    return helper.make_graph([helper.make_node("Add", ["scores", "bias"], ["scores_out"])],
                             "bias", [i], [o])


def _prob_scale(v):
    i, o = _scores("probs")
    return helper.make_graph([helper.make_node("Mul", ["probs", "k"], ["probs_out"])], "p", [i],
                             [o], [helper.make_tensor("k", F, [], [v])])


def _model(b, hq, hkv, length, keys, e, ev, bias=False, **attrs):
    vi = lambda n, s: helper.make_tensor_value_info(n, F, s)  # noqa: E731
    inputs = [vi("q", [b, hq, length, e]), vi("k", [b, hkv, keys, e]), vi("v", [b, hkv, keys, ev])]
    if bias:
        inputs.append(vi("bias", [1, hq, length, keys]))
    node = helper.make_node("FlexAttention", ["q", "k", "v"], ["y"], domain=PREVIEW, **attrs)
    g = helper.make_graph([node], "flex", inputs, [vi("y", None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 26),
                                               helper.make_opsetid(PREVIEW, 1)])


CASES = {
    # name: (b, hq, hkv, L, S, E, Ev, attributes, fused into one Attention)
    "plain": (2, 4, 4, 70, 70, 32, 32, {}, True),
    "gqa_causal": (1, 8, 2, 131, 131, 64, 64, {"score_mod": _causal()}, True),
    "soft_cap": (1, 4, 4, 77, 150, 32, 48, {"score_mod": _soft_cap(5.0), "scale": 0.4}, True),
    "outer_bias": (2, 2, 1, 33, 40, 16, 16, {"score_mod": _outer_bias()}, True),
    "prob_mod": (1, 2, 2, 20, 24, 8, 8, {"prob_mod": _prob_scale(0.5)}, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_against_the_onnx_reference(tmp_path, name):
    b, hq, hkv, length, keys, e, ev, attrs, fused = CASES[name]
    bias = name == "outer_bias"
    model = _model(b, hq, hkv, length, keys, e, ev, bias=bias, **attrs)
    path = tmp_path / "flex.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(len(name))
    feeds = {"q": rng.standard_normal((b, hq, length, e)).astype(np.float32),
             "k": rng.standard_normal((b, hkv, keys, e)).astype(np.float32),
             "v": rng.standard_normal((b, hkv, keys, ev)).astype(np.float32)}
    if bias:
        feeds["bias"] = rng.standard_normal((1, hq, length, keys)).astype(np.float32)
    if bias:  # onnx.reference does not pass outer values into the subgraphs: numpy's answer
        group = hq // hkv
        kk, vv = (np.repeat(feeds[n], group, axis=1) for n in "kv")
        s = feeds["q"] @ kk.transpose(0, 1, 3, 2) / np.sqrt(e) + feeds["bias"]
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ vv
    else:
        want = ReferenceEvaluator(model).run(None, feeds)[0]
    for level in (0, 2):
        exe = pypto.onnx.load(str(path), level=level)
        np.testing.assert_allclose(np.asarray(exe(**feeds)), want, rtol=1e-4, atol=2e-5)
        ops = [op for op, backend in exe._compiled.node_backends]
        assert all(backend == "cpu" for _, backend in exe._compiled.node_backends), ops
    if fused:
        assert ops == ["Attention"], ops  # one kernel, no [b, h, L, S] scores in memory


class SoftCapped(torch.nn.Module):
    """Gemma-2's attention core: scaled scores soft-capped, a causal mask, softmax, V."""

    def __init__(self, cap=50.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        s = torch.tanh(s / self.cap) * self.cap
        n = s.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)


def test_gemma2_soft_cap_runs_as_one_attention_kernel():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 96, 32) * 3 for _ in range(3))
    model = SoftCapped(cap=20.0).eval()
    fast = pypto.optimize(model, (q, k, v))
    with torch.inference_mode():
        torch.testing.assert_close(fast(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)
    assert ("Attention", "cpu") in fast._compiled.node_backends
    assert "Tanh" not in [op for op, _ in fast._compiled.node_backends]


def test_malformed_modifiers_are_clear_errors(tmp_path):
    """A score_mod with two inputs, and Q of rank 3, are ValueErrors naming the node."""
    i, o = _scores()
    extra = helper.make_tensor_value_info("extra", F, ["B", "H", "L", "S"])
    two = helper.make_graph([helper.make_node("Add", ["scores", "extra"], ["scores_out"])], "two",
                            [i, extra], [o])
    onnx.save(_model(1, 2, 2, 4, 4, 8, 8, score_mod=two), tmp_path / "two.onnx")
    with pytest.raises(ValueError, match="score_mod must have one input"):
        pypto.onnx.load(str(tmp_path / "two.onnx"))
    m = _model(1, 2, 2, 4, 4, 8, 8)
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("q", F, [1, 4, 16]))
    onnx.save(m, tmp_path / "rank3.onnx")
    with pytest.raises(ValueError, match="Q must be a 4-D tensor"):
        pypto.onnx.load(str(tmp_path / "rank3.onnx"))
