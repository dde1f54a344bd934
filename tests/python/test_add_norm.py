"""Adds feeding a LayerNormalization or RMSNormalization (a decomposed SkipLayerNormalization,
BERT's embedding sum, a residual Add): at level 2 one kernel, "Add+LayerNormalization", the norm's
kernel summing the operands as it loads each row. Against onnxruntime, and bit for bit against the
unfused graph (numpy's float32 sum, then the norm alone on PyPTO's kernel)."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import pypto

F = TensorProto.FLOAT


def sum_norm_model(path, shapes, adds, n, norm="LayerNormalization", sum_out=(), consts=(),
                   opset=17):
    """Operands x0.. of `shapes` (those in `consts` initializers), Adds s0.. (terms: >= 0 an
    operand, < 0 the result of Add -1 - t), the last one normalized over the last axis (Scale, B
    of [n]); outputs y and the sums in `sum_out`. Returns the feeds."""
    rng = np.random.default_rng(len(shapes) * 100 + n)
    vals = [rng.standard_normal(s).astype(np.float32) * 2 + 0.5 for s in shapes]
    inputs = [helper.make_tensor_value_info(f"x{i}", F, list(s))
              for i, s in enumerate(shapes) if i not in consts]
    inits = [numpy_helper.from_array(vals[i], f"x{i}") for i in consts]
    inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, n).astype(np.float32), "scale"))
    nodes = []
    for k, (l, r) in enumerate(adds):
        term = lambda t: f"x{t}" if t >= 0 else f"s{-1 - t}"
        nodes.append(helper.make_node("Add", [term(l), term(r)], [f"s{k}"]))
    ins = [f"s{len(adds) - 1}", "scale"]
    if norm == "LayerNormalization":
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        ins.append("bias")
    nodes.append(helper.make_node(norm, ins, ["y"], epsilon=1e-5, axis=-1))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    outputs += [helper.make_tensor_value_info(f"s{k}", F, None) for k in sum_out]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    save(model, path)
    return {f"x{i}": v for i, v in enumerate(vals) if i not in consts}, vals


def ort_run(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def steps_of(exe):
    return [s["rule"] or s["op"] for s in exe._compiled.steps]


def norm_alone(tmp_path, x, path_of_model, norm):
    """The norm node of the model at `path_of_model` alone, on input x: the unfused graph's
    second kernel."""
    import onnx
    m = onnx.load(path_of_model)
    node = [nd for nd in m.graph.node if nd.op_type == norm][0]
    node.input[0] = "x"
    g = helper.make_graph([node], "n", [helper.make_tensor_value_info("x", F, list(x.shape))],
                          [helper.make_tensor_value_info("y", F, None)],
                          [i for i in m.graph.initializer if i.name in node.input])
    alone = helper.make_model(g, opset_imports=m.opset_import)
    alone.ir_version = 10
    p = str(tmp_path / "alone.onnx")
    save(alone, p)
    exe = pypto.onnx.load(p, 0)
    return exe(x=x)


CASES = {
    # name: (shapes, adds, consts, sum_out)
    "residual": ([(1, 128, 768), (1, 128, 768)], [(0, 1)], (), ()),
    "embedding_sum": ([(2, 128, 768), (128, 768), (768,)], [(0, 1), (-1, 2)], (1, 2), ()),
    "skip_layer_norm": ([(3, 16, 768), (3, 16, 768), (768,)], [(0, 1), (-1, 2)], (2,), (1,)),
    "partial_sum_out": ([(5, 17), (5, 17), (5, 17)], [(0, 1), (-1, 2)], (), (0, 1)),
    "tree": ([(4, 7)] * 4, [(0, 1), (2, 3), (-1, -2)], (), ()),
}


@pytest.mark.parametrize("norm", ["LayerNormalization", "RMSNormalization"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_against_onnxruntime_and_unfused(tmp_path, name, norm):
    shapes, adds, consts, sum_out = CASES[name]
    path = str(tmp_path / "m.onnx")
    n = shapes[0][-1]
    feeds, vals = sum_norm_model(path, shapes, adds, n, norm, sum_out, consts, opset=23)
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == [f"Add+{norm}"]
    got = exe(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    if norm == "LayerNormalization" or ort_supports_rms():
        want = ort_run(path, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_array_equal(g, w)
    # The unfused graph: numpy's float32 Adds in the graph's order, then the norm's own kernel.
    sums = []
    for l, r in adds:
        term = lambda t: vals[t] if t >= 0 else sums[-1 - t]
        sums.append(term(l) + term(r))
    np.testing.assert_array_equal(got[0], norm_alone(tmp_path, sums[-1], path, norm))
    for g, k in zip(got[1:], sum_out):
        np.testing.assert_array_equal(g, sums[k])


def ort_supports_rms():
    try:
        import onnx
        g = helper.make_graph([helper.make_node("RMSNormalization", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [1, 2])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.ones(2, np.float32), "s")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
        m.ir_version = 10
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


@pytest.mark.parametrize("n", [1, 7, 17, 768, 4099])
@pytest.mark.parametrize("rows", [1, 5])
def test_row_lengths(tmp_path, n, rows):
    path = str(tmp_path / "m.onnx")
    feeds, _ = sum_norm_model(path, [(rows, n), (rows, n), (n,)], [(0, 1), (-1, 2)], n)
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == ["Add+LayerNormalization"]
    np.testing.assert_allclose(exe(**feeds), ort_run(path, feeds)[0], rtol=1e-4, atol=1e-4)


def test_llama_rms_norm_after_add(tmp_path):
    """h = x + r; h * rsqrt(mean(h^2) + eps) * w, written out in ops: recognized as
    RMSNormalization, then fused with the Add."""
    n = 64
    rng = np.random.default_rng(5)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["x", "r"], ["h"]),
        helper.make_node("Mul", ["h", "h"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["one", "rms"], ["inv"]),
        helper.make_node("Mul", ["h", "inv"], ["hn"]),
        helper.make_node("Mul", ["hn", "w"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(w, "w")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, F, [2, 9, n])
                                       for v in ("x", "r")],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    path = str(tmp_path / "m.onnx")
    save(m, path)
    feeds = {"x": rng.standard_normal((2, 9, n)).astype(np.float32),
             "r": rng.standard_normal((2, 9, n)).astype(np.float32)}
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == ["Add+RMSNormalization"]
    np.testing.assert_allclose(exe(**feeds), ort_run(path, feeds)[0], rtol=1e-4, atol=1e-5)


def test_broadcast_over_sequence_stays_a_tile_program(tmp_path):
    path = str(tmp_path / "m.onnx")
    feeds, _ = sum_norm_model(path, [(2, 5, 33), (2, 1, 33)], [(0, 1)], 33)
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == ["Elementwise"]
    np.testing.assert_allclose(exe(**feeds), ort_run(path, feeds)[0], rtol=1e-4, atol=1e-4)


def test_add_norm_env(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    feeds, _ = sum_norm_model(path, [(6, 40), (6, 40)], [(0, 1)], 40)
    monkeypatch.setenv("PTO_ADD_NORM", "0")
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == ["Elementwise"]
    np.testing.assert_allclose(exe(**feeds), ort_run(path, feeds)[0], rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("PTO_ADD_NORM", "yes")
    with pytest.raises(ValueError, match="PTO_ADD_NORM"):
        pypto.onnx.load(path, 2)(**feeds)


@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_layer_normalization(tmp_path, with_bias):
    """onnxruntime's SkipLayerNormalization (input + skip + bias, also output 3, then the norm):
    one Add+LayerNormalization kernel writing the sum too."""
    n = 768
    rng = np.random.default_rng(9)
    ins = ["x", "skip", "gamma", "beta"] + (["bias"] if with_bias else [])
    node = helper.make_node("SkipLayerNormalization", ins, ["y", "", "", "sum"],
                            domain="com.microsoft", epsilon=1e-12)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(v, F, [2, 16, n]) for v in ("x", "skip")],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("sum", F, None)],
        [numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), k)
         for k in ins[2:]])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    path = str(tmp_path / "m.onnx")
    save(m, path)
    feeds = {k: rng.standard_normal((2, 16, n)).astype(np.float32) for k in ("x", "skip")}
    exe = pypto.onnx.load(path, 2)
    assert steps_of(exe) == ["Add+LayerNormalization"]
    got, want = exe(**feeds), ort_run(path, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
