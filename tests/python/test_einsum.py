"""Einsum on the GEMM kernels (the LowerEinsum pass, level 2) against ONNX Runtime: contractions
with batch, row, column and contracted labels in any order, several labels per group, labels
summed out of one operand, broadcast batch axes, ellipses, a symbolic batch, one-operand
reductions and transposes; attention written as two einsums becomes one Attention kernel;
diagonals and traces (a repeated label: Transpose, Reshape and a strided Slice first); an Einsum
the pass does not take (level 1; an output that repeats a label) still runs, on the reference
interpreter."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import pypto


def _model(path, equation, shapes, consts=None, symbolic=False):
    consts = consts or {}
    names = [f"x{i}" for i in range(len(shapes))]
    inputs, inits = [], []
    for name, shape in zip(names, shapes):
        if name in consts:
            inits.append(numpy_helper.from_array(consts[name], name))
        else:
            dims = ["batch"] + list(shape[1:]) if symbolic else list(shape)
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _check(tmp_path, equation, shapes, const=(), symbolic=False, backends=("cpu",), level=2):
    rng = np.random.default_rng(0)
    arrays = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    consts = {k: v for k, v in arrays.items() if int(k[1:]) in const}
    feeds = {k: v for k, v in arrays.items() if k not in consts}
    path = str(tmp_path / "m.onnx")
    _model(path, equation, shapes, consts, symbolic)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exe = pypto.onnx.load(path, level=level)
    got = exe(**feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    used = {b for _, b in exe._compiled.node_backends}
    assert used == set(backends), exe._compiled.node_backends
    return exe


@pytest.mark.parametrize("equation, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 7, 8), (2, 3, 5, 8)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)]),
    ("bij,bjk->bki", [(3, 4, 5), (3, 5, 6)]),
    ("bij,jk->bik", [(3, 4, 5), (5, 6)]),           # B without the batch label
    ("ij,bjk->kbi", [(4, 5), (3, 5, 6)]),
    ("bsd,dhk->bshk", [(2, 7, 12), (12, 3, 4)]),    # several N labels (EinsumDense)
    ("bshk,hkd->bsd", [(2, 7, 3, 4), (3, 4, 12)]),  # several K labels
    ("abcd,cdbe->aeb", [(2, 3, 4, 5), (4, 5, 3, 6)]),
    ("bij,bkj->bik", [(1, 4, 5), (3, 6, 5)]),        # batch broadcast from 1
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("bij,bjk->b", [(3, 4, 5), (3, 5, 6)]),         # every label but the batch summed
    ("bi,bi->b", [(5, 7), (5, 7)]),
    ("i,j->ij", [(6,), (7,)]),
    ("ijx,jk->ik", [(4, 5, 3), (5, 6)]),            # x summed out of A alone
    ("ij,jk", [(4, 5), (5, 6)]),                     # implicit output
    ("bij->bj", [(3, 4, 5)]),
    ("ijk->kji", [(3, 4, 5)]),
    ("ij->", [(3, 4)]),
])
def test_einsum_on_gemm(tmp_path, equation, shapes):
    _check(tmp_path, equation, shapes)


def test_einsum_dense_weights_and_symbolic_batch(tmp_path):
    _check(tmp_path, "bsd,dhk->bshk", [(3, 9, 16), (16, 4, 8)], const=(1,), symbolic=True)
    _check(tmp_path, "bhqd,bhkd->bhqk", [(2, 4, 9, 8), (2, 4, 9, 8)], symbolic=True)


def test_einsum_attention_becomes_one_kernel(tmp_path):
    b, h, s, d = 2, 4, 16, 8
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhqk,bhkd->bhqd"),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, s, d]) for n in "qkv"]
    graph = helper.make_graph(nodes, "attn", vi,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(
                                  np.array(d ** -0.5, np.float32), "scale")])
    path = str(tmp_path / "attn.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = {"q": q, "k": k, "v": v}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    exe = pypto.onnx.load(path)
    np.testing.assert_allclose(exe(**feeds), want, rtol=1e-5, atol=1e-6)
    ops = [op for op, _ in exe._compiled.node_backends]
    assert ops == ["Attention"], ops


def test_einsum_attention_over_a_symbolic_batch(tmp_path):
    """MaxViT's window attention as the dynamo exporter writes it, with a symbolic batch: the
    first einsum's output keeps the batch symbol through the bias Add and Softmax, so the second
    one's operands have one batch dim and both go to the GEMM (the type inference of an Einsum
    over symbolic dims made it unknown, and the second einsum ran on the reference)."""
    g, h, s, d = 4, 2, 7, 8
    eq1, eq2 = "B G H I D, B G H J D -> B G H I J", "B G H I J, B G H J D -> B G H I D"
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation=eq1),
        helper.make_node("Add", ["s", "bias"], ["sb"]),
        helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation=eq2),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", g, h, s, d])
          for n in "qkv"]
    rng = np.random.default_rng(4)
    graph = helper.make_graph(nodes, "window_attention", vi,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(
                                  rng.standard_normal((1, h, s, s)).astype(np.float32), "bias")])
    path = str(tmp_path / "attn.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    exe = pypto.onnx.load(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        feeds = {n: rng.standard_normal((batch, g, h, s, d)).astype(np.float32) for n in "qkv"}
        np.testing.assert_allclose(exe(**feeds), sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    assert {b for _, b in exe._compiled.node_backends} == {"cpu"}, exe._compiled.node_backends


@pytest.mark.parametrize("equation, shapes", [
    ("ii->i", [(5, 5)]),
    ("ii->", [(7, 7)]),                              # a trace
    ("ii", [(6, 6)]),                                # implicit output: the trace
    ("bii->bi", [(3, 4, 4)]),
    ("bii->b", [(3, 9, 9)]),
    ("iji->ij", [(4, 3, 4)]),                        # the pair not adjacent
    ("ibi->bi", [(5, 2, 5)]),
    ("iiii->i", [(3, 3, 3, 3)]),                     # two pairs of one label
    ("iijj->ij", [(2, 2, 3, 3)]),
    ("bii,bij->bj", [(2, 5, 5), (2, 5, 7)]),         # a diagonal, then a product
    ("ij,kjj->ik", [(3, 4), (6, 4, 4)]),
])
def test_einsum_diagonals_on_cpu(tmp_path, equation, shapes):
    _check(tmp_path, equation, shapes)


def test_einsum_at_level_1_stays_on_the_reference(tmp_path):
    _check(tmp_path, "bij,bjk->bik", [(3, 4, 5), (3, 5, 6)], backends=("reference",), level=1)
    _check(tmp_path, "bii->bi", [(3, 4, 4)], backends=("reference",), level=1)
