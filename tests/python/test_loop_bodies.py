"""Loop bodies in the forms recurrent models take (tf2onnx writes Keras' GRU, SimpleRNN and masked
LSTM layers so), built with onnx.helper and compared with onnxruntime: a GRU-like cell whose body
slices and splits its gate pre-activations with constant parameters, counts its own steps and
computes its cond (Less / And on int32 counters, a trip count from the input's Shape); inputs of
symbolic batch and length run at several shapes and trip counts (zero included) through one
compiled model, the body compiled for each run's shapes (docs/architecture.md, "Compiled control
flow"). Also bodies whose outputs are their inputs: a carried value handed on unchanged, a scan
output that is a carried input, one value returned twice."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto
from test_control_flow import _save, _vi

F, I32, I64, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
H, X = 5, 3  # hidden and input sizes of the cell


def _check(path, feeds, model=None):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    model = model or pypto.onnx.load(path)
    got = model(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return model


def _const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _gru_loop_model(path, split_input=False):
    """A GRU-like cell as tf2onnx writes a Keras GRU: Loop(M = len(x), cond, t0, h0, U) with
    body: xt = Gather(x, t); gx = xt @ W + b; gh = h @ U (U carried unchanged, a graph input);
    z, r, n = Slice(gh) along the last axis (constants; or one Split when split_input);
    h' = z * h + (1 - z) * tanh(Split(gx)[2] + r * n); cond' = (t + 1 < len) and (iter + 1 < M)
    on int32; scan output h'. x [T, N, X] and h0 [N, H] have symbolic dims."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.standard_normal((X, 3 * H)) * 0.5).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3 * H).astype(np.float32), "b")
    gates = []
    if split_input:
        gates.append(helper.make_node("Split", ["gh", "thirds"], ["z_pre", "r_pre", "n_pre"],
                                      axis=-1))
    else:
        for k, name in enumerate(["z_pre", "r_pre", "n_pre"]):
            gates.append(helper.make_node("Slice", ["gh", f"s{k}", f"e{k}", "last"], [name]))
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "t_in"], ["xt"], axis=0),
         helper.make_node("MatMul", ["xt", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["gx"]),
         helper.make_node("Split", ["gx", "thirds"], ["gx0", "gx1", "gx2"], axis=1),
         helper.make_node("MatMul", ["h_in", "U_in"], ["gh"])] + gates + [
         helper.make_node("Add", ["z_pre", "gx0"], ["z_sum"]),
         helper.make_node("Sigmoid", ["z_sum"], ["z"]),
         helper.make_node("Add", ["r_pre", "gx1"], ["r_sum"]),
         helper.make_node("Sigmoid", ["r_sum"], ["r"]),
         helper.make_node("Mul", ["r", "n_pre"], ["rn"]),
         helper.make_node("Add", ["gx2", "rn"], ["n_sum"]),
         helper.make_node("Tanh", ["n_sum"], ["n"]),
         helper.make_node("Sub", ["one_f", "z"], ["omz"]),
         helper.make_node("Mul", ["omz", "n"], ["a1"]),
         helper.make_node("Mul", ["z", "h_in"], ["a2"]),
         helper.make_node("Add", ["a1", "a2"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["h_scan"]),
         helper.make_node("Identity", ["U_in"], ["U_out"]),
         helper.make_node("Add", ["t_in", "one_i"], ["t_out"]),
         helper.make_node("Cast", ["iter"], ["iter32"], to=I32),
         helper.make_node("Add", ["iter32", "one_i"], ["iter_next"]),
         helper.make_node("Less", ["t_out", "len32"], ["more_t"]),
         helper.make_node("Less", ["iter_next", "m32"], ["more_i"]),
         helper.make_node("And", ["more_t", "more_i"], ["cond_out"])],
        "gru_body",
        [_vi("iter", I64, []), _vi("cond_in", B, []), _vi("t_in", I32, []),
         _vi("h_in", F, ["N", H]), _vi("U_in", F, [H, 3 * H])],
        [_vi("cond_out", B, []), _vi("t_out", I32, []), _vi("h_out", F, ["N", H]),
         _vi("U_out", F, [H, 3 * H]), _vi("h_scan", F, ["N", H])],
        [w, b, _const("one_i", 1, np.int32), _const("one_f", 1.0, np.float32),
         _const("thirds", [H, H, H]), _const("last", [-1])]
        + [_const(f"s{k}", [k * H]) for k in range(3)]
        + [_const(f"e{k}", [(k + 1) * H]) for k in range(3)])
    nodes = [helper.make_node("Shape", ["x"], ["xs"], start=0, end=1),
             helper.make_node("Squeeze", ["xs", "ax0"], ["steps"]),
             helper.make_node("Cast", ["steps"], ["len32"], to=I32),
             helper.make_node("Cast", ["steps"], ["m32"], to=I32),
             helper.make_node("Greater", ["steps", "zero64"], ["cond0"]),
             helper.make_node("Loop", ["steps", "cond0", "t0", "h0", "U"],
                              ["t_n", "h", "U_n", "hs"], body=body, name="gru")]
    return _save(path, nodes,
                 [_vi("x", F, ["T", "N", X]), _vi("h0", F, ["N", H]), _vi("U", F, [H, 3 * H])],
                 [_vi("h", F, ["N", H]), _vi("hs", F, ["T", "N", H]), _vi("t_n", I32, [])],
                 [_const("ax0", [0]), _const("zero64", 0), _const("t0", 0, np.int32)])


def _gru_feeds(steps, batch, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((steps, batch, X)).astype(np.float32),
            "h0": rng.standard_normal((batch, H)).astype(np.float32),
            "U": (rng.standard_normal((H, 3 * H)) * 0.5).astype(np.float32)}


@pytest.mark.parametrize("split_input", [False, True])
def test_gru_like_loop_at_several_shapes_and_trip_counts(tmp_path, split_input):
    path = _gru_loop_model(tmp_path / "gru.onnx", split_input)
    model = None
    # One compiled model: new batch sizes and lengths, back to the first shapes, more shapes
    # than a node specializes for (4), and a zero-trip loop (no scan output part at all).
    for k, (steps, batch) in enumerate([(6, 2), (6, 3), (1, 2), (6, 2), (4, 1), (9, 4), (0, 2)]):
        model = _check(path, _gru_feeds(steps, batch, k), model)
    body = [(op, b) for op, b in model._compiled.node_backends if op.startswith("gru/body/")]
    assert body and {b for _, b in body} == {"cpu"}, body
    ops = {op.split("/")[-1] for op, _ in body}
    assert ("Split" if split_input else "Slice") in ops, ops


def _aliasing_model(path):
    """Loop(M, cond) carrying a (changed each step), k (handed on unchanged: a body output that
    is its input) and c (computed, returned both as the carried value and as a scan output), with
    scan outputs a_in itself (a body input as a scan output) and k; cond is c's sum > limit."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a_in", "k_in"], ["ak"]),
         helper.make_node("Add", ["ak", "c_in"], ["c_out"]),
         helper.make_node("Sin", ["a_in"], ["a_out"]),
         helper.make_node("ReduceSum", ["c_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "alias_body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("a_in", F, ["N"]), _vi("k_in", F, ["N"]),
         _vi("c_in", F, ["N"])],
        [_vi("cond_out", B, []), _vi("a_out", F, ["N"]), _vi("k_in", F, ["N"]),
         _vi("c_out", F, ["N"]), _vi("a_in", F, ["N"]), _vi("c_out", F, ["N"]),
         _vi("k_in", F, ["N"])])
    nodes = [helper.make_node("Loop", ["m", "cond0", "a0", "k0", "c0"],
                              ["a", "k", "c", "as", "cs", "ks"], body=body, name="alias")]
    return _save(path, nodes,
                 [_vi("m", I64, []), _vi("cond0", B, []), _vi("a0", F, ["N"]),
                  _vi("k0", F, ["N"]), _vi("c0", F, ["N"]), _vi("limit", F, [])],
                 [_vi(n, F, None) for n in ["a", "k", "c", "as", "cs", "ks"]])


@pytest.mark.parametrize("m,cond0,limit,n", [(5, True, 1e9, 3), (7, True, 2.0, 4),
                                             (0, True, 1e9, 3), (4, False, 1e9, 2),
                                             (6, True, 1e9, 1)])
def test_body_outputs_that_are_its_inputs(tmp_path, m, cond0, limit, n):
    path = _aliasing_model(tmp_path / "alias.onnx")
    rng = np.random.default_rng(m + n)
    feeds = {"m": np.array(m, np.int64), "cond0": np.array(cond0), "limit": np.array(limit, np.float32),
             "a0": rng.standard_normal(n).astype(np.float32),
             "k0": rng.standard_normal(n).astype(np.float32),
             "c0": np.abs(rng.standard_normal(n)).astype(np.float32)}
    model = _check(path, feeds)
    # The same model again: nothing of the first call's carried values or scan parts was kept,
    # and the caller's arrays are unchanged.
    before = {k: np.copy(v) for k, v in feeds.items()}
    out = model(**feeds)
    _check(path, feeds, model)
    for k, v in feeds.items():
        np.testing.assert_array_equal(v, before[k])
    # Outputs are the caller's to write: writing one changes no other output of the call.
    out = [np.asarray(o) for o in out]
    if out[1].size:
        ks = np.copy(out[5])
        out[1][...] = 123.0
        np.testing.assert_array_equal(out[5], ks)
