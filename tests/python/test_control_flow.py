"""ONNX control flow (If, Loop, Scan) built with onnx.helper, run by PyPTO and compared with
onnxruntime: captures of outer values, an If inside a Loop, scan outputs and zero iterations, a
Loop with only a condition, Scan along several axes in both directions, a silero-style If on a
shape-derived condition (folded away when the shape is static), and the ONNX export round trip.
Subgraphs are compiled: node_backends lists their nodes ("node/attribute/op") and the kernels
that run them; a Loop of MatMul+Relu, a Scan RNN cell, Scan opset 8, and one compiled Loop
model run from 4 threads at once."""

import subprocess
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _save(path, nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "cf", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path.write_bytes(model.SerializeToString())
    return path


def _check(path, feeds, rtol=1e-5, atol=1e-6, level=None):
    """Runs `path` in PyPTO and onnxruntime on `feeds`; returns the loaded PyPTO model."""
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    model = pypto.onnx.load(path, level)
    got = model(**feeds)
    if not isinstance(got, (list, tuple)):
        got = [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return model


def _nested(model):
    """node_backends entries of the subgraphs' nodes: {"node/attribute/op": backend}."""
    return {op: b for op, b in model._compiled.node_backends if "/" in op}


def _assert_nested_on_cpu(model, *ops):
    """Every subgraph node runs on a CPU kernel, and each of `ops` is one of them."""
    nested = _nested(model)
    assert nested and set(nested.values()) == {"cpu"}, nested
    for op in ops:
        assert any(name.split("/")[-1] == op for name in nested), (op, nested)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _if_model(path):
    """y = If(sum(x) > 0) then x + w (w an outer initializer) else x * x - x (x captured twice)."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    then_g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [],
                               [_vi("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["xx"]),
                                helper.make_node("Sub", ["xx", "x"], ["e"])], "else", [],
                               [_vi("e", F, [2, 3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    return _save(path, nodes, [_vi("x", F, [2, 3])], [_vi("y", F, [2, 3])], [w, zero])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_captures(tmp_path, sign):
    x = (sign * (np.abs(np.random.default_rng(0).standard_normal((2, 3))) + 0.1)).astype(np.float32)
    model = _check(_if_model(tmp_path / "if.onnx"), {"x": x})
    assert "If" in model.graph.ops
    _assert_nested_on_cpu(model, "Add", "Mul", "Sub")
    assert {n.split("/")[1] for n in _nested(model)} == {"then_branch", "else_branch"}


def _loop_if_model(path):
    """acc = Loop(M) { If(i % 2 == 0) acc + x else acc - 2 x }; the If reads x from two scopes
    out, so x is a capture of the If and of the Loop; scan output: acc * i."""
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero_i")
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "x"], ["a1"])], "then", [],
                               [_vi("a1", F, [3])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["x2"]),
                                helper.make_node("Sub", ["acc_in", "x2"], ["a2"])], "else", [],
                               [_vi("a2", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]),
         helper.make_node("Equal", ["r", "zero_i"], ["even"]),
         helper.make_node("If", ["even"], ["acc_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc_out", "fi"], ["scan"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [3]), _vi("scan", F, [3])], [two, zero])
    nodes = [helper.make_node("Loop", ["m", "", "acc0"], ["acc", "scans"], body=body)]
    return _save(path, nodes, [_vi("m", I64, []), _vi("acc0", F, [3]), _vi("x", F, [3])],
                 [_vi("acc", F, [3]), _vi("scans", F, [None, 3])])


@pytest.mark.parametrize("trips", [0, 1, 5])
def test_if_inside_loop_with_scan_outputs(tmp_path, trips):
    rng = np.random.default_rng(trips)
    feeds = {"m": np.array(trips, np.int64), "acc0": rng.standard_normal(3).astype(np.float32),
             "x": rng.standard_normal(3).astype(np.float32)}
    model = _check(_loop_if_model(tmp_path / "loop_if.onnx"), feeds)
    # The If inside the body is compiled too: its branches' nodes are listed under the body's.
    _assert_nested_on_cpu(model, "Mod", "If", "Add", "Sub")
    assert any(n.count("/") == 4 and "/then_branch/" in n for n in _nested(model)), _nested(model)


def test_loop_with_only_cond(tmp_path):
    """while acc < limit: acc = acc * 2 + 1 (no M; the body computes cond); acc grows in a
    carried [1] tensor, and a carried counter counts the iterations."""
    one_f = numpy_helper.from_array(np.ones((1,), np.float32), "one_f")
    two_f = numpy_helper.from_array(np.full((1,), 2, np.float32), "two_f")
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_in", "two_f"], ["a2"]),
         helper.make_node("Add", ["a2", "one_f"], ["a_out"]),
         helper.make_node("Less", ["a_out", "limit"], ["c1"]),
         helper.make_node("Squeeze", ["c1"], ["cond_out"]),
         helper.make_node("Add", ["n_in", "i"], ["n_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("a_in", F, [1]),
                 _vi("n_in", I64, [])],
        [_vi("cond_out", B, []), _vi("a_out", F, [1]), _vi("n_out", I64, [])], [one_f, two_f])
    nodes = [helper.make_node("Loop", ["", "c0", "a0", "n0"], ["a", "n"], body=body)]
    path = _save(tmp_path / "while.onnx", nodes,
                 [_vi("c0", B, []), _vi("a0", F, [1]), _vi("n0", I64, []), _vi("limit", F, [1])],
                 [_vi("a", F, [1]), _vi("n", I64, [])])
    for c0 in (True, False):
        _check(path, {"c0": np.array(c0), "a0": np.array([0.5], np.float32),
                      "n0": np.array(0, np.int64), "limit": np.array([100.0], np.float32)})


def test_loop_growing_carried_value(tmp_path):
    """A carried value that grows each iteration (Concat): its type is generalized."""
    body = helper.make_graph(
        [helper.make_node("Concat", ["s_in", "v"], ["s_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("s_in", F, [None])],
        [_vi("cond_out", B, []), _vi("s_out", F, [None])])
    nodes = [helper.make_node("Loop", ["m", "", "s0"], ["s"], body=body)]
    path = _save(tmp_path / "grow.onnx", nodes,
                 [_vi("m", I64, []), _vi("s0", F, [1]), _vi("v", F, [2])], [_vi("s", F, [None])])
    for m in (0, 1, 3):
        model = _check(path, {"m": np.array(m, np.int64), "s0": np.ones(1, np.float32),
                              "v": np.array([2.0, 3.0], np.float32)})
    assert "Concat" in [n.split("/")[-1] for n in _nested(model)], _nested(model)


def test_loop_carried_matrix_growing_rows(tmp_path):
    """A carried matrix whose rows double each iteration (Concat of itself): the body, compiled
    once with an unknown row count, runs on every shape; its MatMul runs on the CPU kernel."""
    w = numpy_helper.from_array(
        np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32) * 0.5, "w")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "w"], ["p"]),
         helper.make_node("Concat", ["s_in", "p"], ["s_out"], axis=0),
         helper.make_node("ReduceSum", ["p"], ["total"], keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("s_in", F, [None, 4])],
        [_vi("cond_out", B, []), _vi("s_out", F, [None, 4]), _vi("total", F, [])])
    nodes = [helper.make_node("Loop", ["m", "", "s0"], ["s", "totals"], body=body)]
    path = _save(tmp_path / "double.onnx", nodes, [_vi("m", I64, []), _vi("s0", F, [1, 4])],
                 [_vi("s", F, [None, 4]), _vi("totals", F, [None])], [w])
    s0 = np.random.default_rng(6).standard_normal((1, 4)).astype(np.float32)
    for m in (0, 4):
        model = _check(path, {"m": np.array(m, np.int64), "s0": s0}, rtol=1e-4, atol=1e-5)
    assert _nested(model)["Loop_0/body/MatMul"] == "cpu", _nested(model)


def _loop_matmul_model(path, n=32, trips=5):
    """x = Relu(x @ w + b) five times (M an initializer), w and b outer initializers captured
    by the body, plus a scan output of each iteration's row sums."""
    rng = np.random.default_rng(21)
    w = numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(n).astype(np.float32) * 0.1, "b")
    m = numpy_helper.from_array(np.array(trips, np.int64), "m")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_in", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["xwb"]),
         helper.make_node("Relu", ["xwb"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out", "one"], ["rows"], keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("x_in", F, [n, n])],
        [_vi("cond_out", B, []), _vi("x_out", F, [n, n]), _vi("rows", F, [n])],
        [numpy_helper.from_array(np.array([1], np.int64), "one")])
    nodes = [helper.make_node("Loop", ["m", "", "x"], ["y", "sums"], body=body, name="loop_0")]
    return _save(path, nodes, [_vi("x", F, [n, n])], [_vi("y", F, [n, n]),
                                                       _vi("sums", F, [trips, n])], [w, b, m])


@pytest.mark.parametrize("level", [0, 2])
def test_loop_matmul_relu_body_runs_on_cpu_kernels(tmp_path, level):
    x = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
    model = _check(_loop_matmul_model(tmp_path / "loop_mm.onnx"), {"x": x}, rtol=1e-4,
                   atol=1e-5, level=level)
    backends = model._compiled.node_backends
    assert backends[0] == ("Loop", "cpu"), backends
    assert ("loop_0/body/MatMul", "cpu") in backends, backends
    _assert_nested_on_cpu(model, "MatMul", "Relu")


def _run_in_four_threads(model, feeds, want):
    """Thread t calls `model` on feeds[t] 10 times, all four at once; each result must be
    want[t] (onnxruntime's)."""
    errors = []

    def work(t):
        try:
            for _ in range(10):
                got = model(**feeds[t])
                got = got if isinstance(got, (list, tuple)) else [got]
                for g, w in zip(got, want[t]):
                    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
        except Exception as e:  # noqa: BLE001 - reported below, with the thread
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_one_compiled_loop_from_four_threads(tmp_path):
    """Four threads run one compiled Loop model at once, each on its own input, 10 times each;
    every result is onnxruntime's for that input."""
    path = _loop_matmul_model(tmp_path / "loop_mm.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = pypto.onnx.load(path)
    xs = [np.random.default_rng(40 + t).standard_normal((32, 32)).astype(np.float32)
          for t in range(4)]
    want = [sess.run(None, {"x": x}) for x in xs]
    _run_in_four_threads(model, [{"x": x} for x in xs], want)


def _scan_rnn_model(path, opset=17, batch=3, hidden=8, inp=5, steps=7, wh_scale=0.5):
    """h_t = Tanh(x_t @ wx + h_{t-1} @ wh + b) over the steps of xs, with every h_t stacked;
    opset 8 scans a batch: xs [batch, steps, inp], h0 [batch, hidden], and the body sees one
    batch entry ([inp] and [hidden] with a leading 1 added by Unsqueeze)."""
    rng = np.random.default_rng(17)
    wx = numpy_helper.from_array(rng.standard_normal((inp, hidden)).astype(np.float32) * 0.5, "wx")
    wh = numpy_helper.from_array(
        rng.standard_normal((hidden, hidden)).astype(np.float32) * wh_scale, "wh")
    b = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) * 0.1, "b")
    if opset >= 9:
        h_shape, x_shape, xs_shape, h0_shape = [batch, hidden], [batch, inp], [steps, batch, inp], \
            [batch, hidden]
    else:
        h_shape, x_shape, xs_shape, h0_shape = [1, hidden], [1, inp], [batch, steps, 1, inp], \
            [batch, 1, hidden]
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "wx"], ["xw"]),
         helper.make_node("MatMul", ["h_in", "wh"], ["hw"]),
         helper.make_node("Add", ["xw", "hw"], ["s"]),
         helper.make_node("Add", ["s", "b"], ["sb"]),
         helper.make_node("Tanh", ["sb"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y"])],
        "cell", [_vi("h_in", F, h_shape), _vi("x_t", F, x_shape)],
        [_vi("h_out", F, h_shape), _vi("y", F, h_shape)])
    inputs = ["h0", "xs"] if opset >= 9 else ["", "h0", "xs"]
    nodes = [helper.make_node("Scan", inputs, ["h", "ys"], body=body, num_scan_inputs=1,
                              name="rnn")]
    ys_shape = [steps] + h_shape if opset >= 9 else [batch, steps] + h_shape
    return _save(path, nodes, [_vi("h0", F, h0_shape), _vi("xs", F, xs_shape)],
                 [_vi("h", F, h0_shape), _vi("ys", F, ys_shape)], [wx, wh, b], opset=opset)


@pytest.mark.parametrize("opset", [8, 17])
def test_scan_rnn_cell_runs_on_cpu_kernels(tmp_path, opset):
    path = _scan_rnn_model(tmp_path / f"rnn{opset}.onnx", opset)
    inputs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()
    rng = np.random.default_rng(opset)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in inputs}
    model = _check(path, feeds, rtol=1e-4, atol=1e-5)
    _assert_nested_on_cpu(model, "MatMul", "Tanh")
    assert all(n.startswith("rnn/body/") for n in _nested(model)), _nested(model)


def test_stats_count_the_body_kernels(tmp_path, pto_bin):
    """stats() and `pto compile --stats` count the Loop body's kernels and its packed weight
    beside the model's own (the Loop step): the same numbers as the body compiled as a model of
    its own, its captures initializers."""
    path = _loop_matmul_model(tmp_path / "loop_mm.onnx")
    import onnx

    m = onnx.load(str(path))
    body = next(a.g for a in m.graph.node[0].attribute if a.name == "body")
    alone = _save(tmp_path / "body.onnx", list(body.node), list(body.input), list(body.output),
                  list(body.initializer)
                  + [i for i in m.graph.initializer if i.name in ("w", "b")])
    s = pypto.onnx.load(path)._compiled.stats()
    b = pypto.onnx.load(alone)._compiled.stats()
    assert s["kernels"] == 1, s
    assert b["fused_kernels"] >= 1 and b["packed_weight_bytes"] > 0, b
    for key, want in (("subgraph_kernels", "kernels"), ("subgraph_fused_kernels", "fused_kernels"),
                      ("packed_weight_bytes", "packed_weight_bytes")):
        assert s[key] == b[want], (key, s, b)
    r = subprocess.run([str(pto_bin), "compile", str(path), "--stats"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = (f"kernels: 1 (0 fused); in control-flow subgraphs: {b['kernels']} "
            f"({b['fused_kernels']} fused)")
    assert line in r.stdout, r.stdout
    assert "subgraph memory: " in r.stdout, r.stdout
    r = subprocess.run([str(pto_bin), "compile", str(path), "--dump-tiles"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for k in range(b["kernels"]):  # the body's kernels, under the Loop's path
        assert f"kernel loop_0/body/{k} [cpu]" in r.stdout, r.stdout


@pytest.mark.parametrize("hidden", [8, 512])
def test_one_compiled_scan_from_four_threads(tmp_path, hidden):
    """Four threads run one compiled Scan RNN at once (slices of each thread's own scan input,
    stacked outputs: copied, or with hidden 512 written in place by the body), 10 times each;
    every result is onnxruntime's for that input."""
    # wh scaled as 1/sqrt(hidden): a larger recurrent gain makes the cell chaotic, and rounding
    # differences grow past any tolerance within a few steps.
    path = _scan_rnn_model(tmp_path / "rnn.onnx", steps=9, hidden=hidden,
                           wh_scale=0.5 * (8 / hidden) ** 0.5)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = pypto.onnx.load(path)
    feeds = [{i.name: np.random.default_rng(50 + t).standard_normal(i.shape).astype(np.float32)
              for i in sess.get_inputs()} for t in range(4)]
    want = [sess.run(None, f) for f in feeds]
    _run_in_four_threads(model, feeds, want)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_axes_and_directions(tmp_path, reverse):
    """Two scan inputs sliced along axes 0 and 1 (the second reversed when `reverse`), a running
    sum state, and two scan outputs stacked along axes 1 and 0 (the first reversed)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["s_in", "ab"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "k"], ["y1"]),
         helper.make_node("Neg", ["ab"], ["y2"])],
        "body", [_vi("s_in", F, [4]), _vi("a", F, [4]), _vi("b", F, [4])],
        [_vi("s_out", F, [4]), _vi("y1", F, [4]), _vi("y2", F, [4])])
    d = 1 if reverse else 0
    nodes = [helper.make_node("Scan", ["s0", "xa", "xb"], ["s", "ys1", "ys2"], body=body,
                              num_scan_inputs=2, scan_input_axes=[0, 1],
                              scan_input_directions=[0, d], scan_output_axes=[1, 0],
                              scan_output_directions=[1, 0])]
    path = _save(tmp_path / "scan.onnx", nodes,
                 [_vi("s0", F, [4]), _vi("xa", F, [5, 4]), _vi("xb", F, [4, 5]), _vi("k", F, [4])],
                 [_vi("s", F, [4]), _vi("ys1", F, [4, 5]), _vi("ys2", F, [5, 4])])
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(s).astype(np.float32)
             for n, s in (("s0", (4,)), ("xa", (5, 4)), ("xb", (4, 5)), ("k", (4,)))}
    _check(path, feeds)


@pytest.mark.parametrize("out_axis,reverse", [(0, False), (0, True), (1, False), (1, True)])
def test_scan_outputs_written_in_place(tmp_path, out_axis, reverse):
    """The compiled body writes each step's scan output (4 KiB, the least written in place) into
    its slice of the stacked output (axis 0, or axis 1 behind a leading 1: contiguous slices),
    in either direction; the final state is that output's value but does not share its memory.
    The number of steps changes between calls of one loaded model (1, 6, 3)."""
    n = 1024
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "w"], ["xw"]),
         helper.make_node("Add", ["h_in", "xw"], ["a"]),
         helper.make_node("Tanh", ["a"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y"])],
        "cell", [_vi("h_in", F, [1, n]), _vi("x_t", F, [1, 5])],
        [_vi("h_out", F, [1, n]), _vi("y", F, [1, n])])
    w = numpy_helper.from_array(
        np.random.default_rng(8).standard_normal((5, n)).astype(np.float32) * 0.5, "w")
    ys_shape = [None, 1, n] if out_axis == 0 else [1, None, n]
    nodes = [helper.make_node("Scan", ["h0", "xs"], ["h", "ys"], body=body, num_scan_inputs=1,
                              scan_output_axes=[out_axis],
                              scan_output_directions=[int(reverse)])]
    path = _save(tmp_path / "scan.onnx", nodes,
                 [_vi("h0", F, [1, n]), _vi("xs", F, [None, 1, 5])],
                 [_vi("h", F, [1, n]), _vi("ys", F, ys_shape)], [w])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = pypto.onnx.load(path)
    _assert_nested_on_cpu(model, "MatMul", "Tanh")
    for steps in (1, 6, 3):
        rng = np.random.default_rng(steps)
        feeds = {"h0": rng.standard_normal((1, n)).astype(np.float32),
                 "xs": rng.standard_normal((steps, 1, 5)).astype(np.float32)}
        h, ys = (np.asarray(t) for t in model(**feeds))
        want_h, want_ys = sess.run(None, feeds)
        np.testing.assert_allclose(h, want_h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ys, want_ys, rtol=1e-5, atol=1e-6)
        assert not np.shares_memory(h, ys)


def test_loop_packed_weight_kept_when_the_trip_count_changes(tmp_path):
    """One loaded Loop model (x = Relu(x @ w + b), w packed once when the body compiled) run with
    M = 3, 7, 0, 3: every result is onnxruntime's, and the packed weight is the same one all
    along (stats count it once, the model's steps and memory plan unchanged)."""
    path = _loop_matmul_model(tmp_path / "loop_mm.onnx", trips=3)
    import onnx

    m = onnx.load(str(path))  # M a graph input instead of an initializer; sums of any length
    m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "m"))
    m.graph.input.append(_vi("m", I64, []))
    m.graph.output[1].CopyFrom(_vi("sums", F, [None, 32]))
    path.write_bytes(m.SerializeToString())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = pypto.onnx.load(path)
    x = np.random.default_rng(4).standard_normal((32, 32)).astype(np.float32)
    first = model._compiled.stats()
    assert first["packed_weight_bytes"] > 0, first
    for trips in (3, 7, 0, 3):
        feeds = {"x": x, "m": np.array(trips, np.int64)}
        got = model(**feeds)
        for g, w in zip(got, sess.run(None, feeds)):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
        s = model._compiled.stats()
        for key in ("packed_weight_bytes", "subgraph_kernels", "kernels"):
            assert s[key] == first[key], (trips, key, s, first)


def _silero_like(path, n):
    """silero VAD's pattern: If(Shape(x)[1] == 16000) picks one of two sub-networks."""
    idx = numpy_helper.from_array(np.array(1, np.int64), "idx")
    sr = numpy_helper.from_array(np.array(16000, np.int64), "sr")
    w16 = numpy_helper.from_array(np.full((1,), 0.5, np.float32), "w16")
    w8 = numpy_helper.from_array(np.full((1,), 2.0, np.float32), "w8")
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w16"], ["t0"]),
                                helper.make_node("ReduceMean", ["t0"], ["t"], keepdims=0)],
                               "sr16k", [], [_vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "w8"], ["e0"]),
                                helper.make_node("ReduceMax", ["e0"], ["e"], keepdims=0)],
                               "sr8k", [], [_vi("e", F, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "idx"], ["len"], axis=0),
             helper.make_node("Equal", ["len", "sr"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=then_g, else_branch=else_g)]
    return _save(path, nodes, [_vi("x", F, [1, n])], [_vi("y", F, [])], [idx, sr, w16, w8])


@pytest.mark.parametrize("n", [16000, 8000])
def test_silero_style_if_folds_with_a_static_shape(tmp_path, n):
    x = np.random.default_rng(n).standard_normal((1, n)).astype(np.float32)
    model = _check(_silero_like(tmp_path / "vad.onnx", n), {"x": x}, rtol=1e-4)
    assert "If" not in model.graph.ops, model.graph.ops  # the constant cond inlined the branch


def test_silero_style_if_with_a_dynamic_shape(tmp_path):
    path = _silero_like(tmp_path / "vad_dyn.onnx", "n")
    for n in (16000, 512):
        x = np.random.default_rng(n).standard_normal((1, n)).astype(np.float32)
        model = _check(path, {"x": x}, rtol=1e-4)
    assert "If" in model.graph.ops


def test_export_round_trip(tmp_path):
    """Export writes subgraphs that read outer names directly; onnxruntime runs the file."""
    src = _loop_if_model(tmp_path / "loop_if.onnx")
    model = pypto.onnx.load(src, 0)
    out = tmp_path / "exported.onnx"
    pypto.onnx.export(model, None, out)
    rng = np.random.default_rng(7)
    feeds = {"m": np.array(4, np.int64), "acc0": rng.standard_normal(3).astype(np.float32),
             "x": rng.standard_normal(3).astype(np.float32)}
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    again = pypto.onnx.load(out, 0)
    assert str(again.graph) == str(model.graph)


def test_undefined_capture_is_a_value_error(tmp_path):
    then_g = helper.make_graph([helper.make_node("Neg", ["nowhere"], ["t"])], "then", [],
                               [_vi("t", F, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [_vi("e", F, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    path = _save(tmp_path / "bad.onnx", nodes, [_vi("c", B, []), _vi("x", F, [2])],
                 [_vi("y", F, [2])])
    with pytest.raises(ValueError, match="'nowhere' is not defined"):
        pypto.onnx.load(path)


def test_subgraph_reading_a_later_value_is_a_value_error(tmp_path):
    """A branch reads 'late', which the outer graph defines only after the If: a cycle."""
    then_g = helper.make_graph([helper.make_node("Neg", ["late"], ["t"])], "then", [],
                               [_vi("t", F, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [_vi("e", F, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y"], ["late"])]
    path = _save(tmp_path / "cycle.onnx", nodes, [_vi("c", B, []), _vi("x", F, [2])],
                 [_vi("late", F, [2])])
    with pytest.raises(ValueError, match="'late' is not defined before this node"):
        pypto.onnx.load(path)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_if_in_loop_in_scan_at_every_level(tmp_path, level):
    """Scan over the rows of xs; per row, a Loop (2 trips) whose body holds an If; the If reads
    the Scan's outer input k (captured through three scopes) and the row (captured through two)."""
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "row"], ["a1"])], "then", [],
                               [_vi("a1", F, [3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["acc_in", "k"], ["a2"])], "else", [],
                               [_vi("a2", F, [3])])
    loop_body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["b"], to=B),
         helper.make_node("If", ["b"], ["acc_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "loop_body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [3])])
    trips = numpy_helper.from_array(np.array(2, np.int64), "trips")
    scan_body = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "s_in"], ["s_out"], body=loop_body),
         helper.make_node("Relu", ["s_out"], ["y"])],
        "scan_body", [_vi("s_in", F, [3]), _vi("row", F, [3])],
        [_vi("s_out", F, [3]), _vi("y", F, [3])], [trips])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=scan_body,
                              num_scan_inputs=1)]
    path = _save(tmp_path / "nested.onnx", nodes,
                 [_vi("s0", F, [3]), _vi("xs", F, [4, 3]), _vi("k", F, [3])],
                 [_vi("s", F, [3]), _vi("ys", F, [4, 3])])
    rng = np.random.default_rng(11)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32),
             "xs": rng.standard_normal((4, 3)).astype(np.float32),
             "k": rng.standard_normal(3).astype(np.float32)}
    _check(path, feeds, level=level)


def test_body_op_without_a_cpu_kernel_falls_back_alone(tmp_path):
    """CenterCropPad has no CPU kernel: in the compiled body it runs on its reference kernel, the
    Mul beside it on the CPU one, and the result is still onnxruntime's."""
    k = numpy_helper.from_array(np.full((4,), 0.3, np.float32), "k")
    m = numpy_helper.from_array(np.array(3, np.int64), "m")
    s = numpy_helper.from_array(np.array([4], np.int64), "s")
    body = helper.make_graph(
        [helper.make_node("CenterCropPad", ["x_in", "s"], ["a"]),
         helper.make_node("Mul", ["a", "k"], ["x_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("x_in", F, [4])],
        [_vi("cond_out", B, []), _vi("x_out", F, [4])])
    nodes = [helper.make_node("Loop", ["m", "", "x"], ["y"], body=body, name="crop_loop")]
    path = _save(tmp_path / "crop.onnx", nodes, [_vi("x", F, [4])], [_vi("y", F, [4])],
                 [k, m, s], opset=18)
    x = np.array([-0.9, -0.2, 0.4, 1.0], np.float32)
    model = _check(path, {"x": x})
    nested = _nested(model)
    assert nested["crop_loop/body/CenterCropPad"] == "reference", nested
    assert nested["crop_loop/body/Mul"] == "cpu", nested


def test_conv_reading_an_if_of_unknown_rank(tmp_path):
    """Silero VAD's decoder: If(last dim == 1) then Squeeze(x, -1) else x, then a 1-D Conv. The
    branches' ranks differ, so the If's output has no known rank at compile time; the CPU conv
    takes it from the weight. Subgraph specialization off: compiled for the run's shapes, the If
    would fold to its branch."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((6, 4, 3)).astype(np.float32), "w")
    then_g = helper.make_graph([helper.make_node("Squeeze", ["x", "last"], ["t"])], "then", [],
                               [_vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [_vi("e", F, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=-1),
             helper.make_node("Equal", ["shape", "one"], ["eq"]),
             helper.make_node("Squeeze", ["eq"], ["c"]),
             helper.make_node("If", ["c"], ["v"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Conv", ["v", "w"], ["y"], pads=[1, 1])]
    inits = [w, numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "last")]
    path = _save(tmp_path / "m.onnx", nodes, [_vi("x", F, ["n", 4, "t", "u"])],
                 [_vi("y", F, None)], inits)
    x = rng.standard_normal((2, 4, 9, 1)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    old = pypto.get_optimization_options()["specialize_subgraphs"]
    pypto.set_optimization_options({"specialize_subgraphs": False})
    try:
        model = pypto.onnx.load(path)
        np.testing.assert_allclose(model(x=x), want[0], rtol=1e-5, atol=1e-5)
    finally:
        pypto.set_optimization_options({"specialize_subgraphs": old})
    assert ("Conv", "cpu") in model._compiled.node_backends, model._compiled.node_backends
