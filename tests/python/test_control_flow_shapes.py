"""Control-flow subgraphs compiled for the shapes they run on (CompileOptions::specialize_subgraphs,
docs/architecture.md "Compiled control flow"): a branch or body whose captured inputs have
symbolic dims is compiled again for each concrete input-shape signature, so shape arithmetic on
them folds, an If on a shape inside it becomes its branch, and the ops after it get a known rank
and their CPU kernels. The models (onnx.helper) follow Silero VAD: If(Shape(x)[-1] == 1)
squeezes the last axis or keeps x, so what follows has an unknown rank until the shape is known;
a Conv then reads it. Results are compared with onnxruntime; node_backends says where each
subgraph node ran. The real Silero VAD file is checked too when the silero-vad wheel is unpacked
(skipped otherwise: it is not in the repository)."""

import os
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _silero_path() -> str:
    """Silero VAD's own ONNX file: PTO_SILERO_VAD, else the one the silero-vad distribution
    installed (scripts/setup.sh installs it without its dependencies), found through its
    metadata: an import lookup would find bench/silero_vad.py first where a test put bench/ on
    sys.path."""
    if os.environ.get("PTO_SILERO_VAD"):
        return os.environ["PTO_SILERO_VAD"]
    import importlib.metadata
    try:
        dist = importlib.metadata.distribution("silero-vad")
    except importlib.metadata.PackageNotFoundError:
        return ""
    return str(dist.locate_file("silero_vad/data/silero_vad.onnx"))


SILERO = _silero_path()


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _save(path, nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "cf", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path.write_bytes(model.SerializeToString())
    return path


def _squeeze_if_last_is_one(x, out, prefix):
    """Silero's pattern: out = Squeeze(x, -1) if x.shape[-1] == 1 else x; `out` has an unknown
    rank while x's last dim is symbolic."""
    then_g = helper.make_graph([helper.make_node("Squeeze", [x, "axis_last"], [prefix + "sq"])],
                               prefix + "squeeze", [], [_vi(prefix + "sq", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", [x], [prefix + "id"])],
                               prefix + "keep", [], [_vi(prefix + "id", F, None)])
    return [helper.make_node("Shape", [x], [prefix + "shape"]),
            helper.make_node("Gather", [prefix + "shape", "axis_last"], [prefix + "last"], axis=0),
            helper.make_node("Equal", [prefix + "last", "one"], [prefix + "is1"]),
            helper.make_node("If", [prefix + "is1"], [out], then_branch=then_g,
                             else_branch=else_g, name=prefix + "if")]


def _constants(rng):
    w = numpy_helper.from_array((rng.standard_normal((6, 4, 1)) * 0.5).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    return [w, b, numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array(16000, np.int64), "sr16k")]


def _if_conv_model(path):
    """y = If(sr == 16000) then Relu(Conv(Unsqueeze(squeeze_if_last_is_one(x)), w, b + d))
    else ReduceMean(x) * 2; x is [N, 4, L] (symbolic), w and b outer initializers, b + d an outer
    value computed at run time: all three are captures of the branch."""
    then_nodes = _squeeze_if_last_is_one("x", "u", "t_") + [
        helper.make_node("Unsqueeze", ["u", "axis_last"], ["v"]),
        helper.make_node("Conv", ["v", "w", "bias"], ["c"], kernel_shape=[1], name="conv"),
        helper.make_node("Relu", ["c"], ["t"])]
    then_g = helper.make_graph(then_nodes, "sr16k_branch", [], [_vi("t", F, None)])
    else_g = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[2], keepdims=1),
         helper.make_node("Add", ["m", "m"], ["e"])], "other_branch", [], [_vi("e", F, None)])
    nodes = [helper.make_node("Add", ["b", "d"], ["bias"]),
             helper.make_node("Equal", ["sr", "sr16k"], ["c16"]),
             helper.make_node("If", ["c16"], ["y"], then_branch=then_g, else_branch=else_g,
                              name="if_sr")]
    return _save(path, nodes, [_vi("x", F, ["N", 4, "L"]), _vi("sr", I64, []), _vi("d", F, [6])],
                 [_vi("y", F, None)], _constants(np.random.default_rng(3)), opset=13)


def _loop_conv_model(path):
    """A Loop of M steps carrying acc [N, 6, 1]: acc += Relu(Conv(Unsqueeze(
    squeeze_if_last_is_one(x)), w, b)) * i, with a scan output of each step's Conv; x [N, 4, L]
    (symbolic) is captured by the body."""
    body_nodes = _squeeze_if_last_is_one("x", "u", "l_") + [
        helper.make_node("Unsqueeze", ["u", "axis_last"], ["v"]),
        helper.make_node("Conv", ["v", "w", "b"], ["c"], kernel_shape=[1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["r", "fi"], ["ri"]),
        helper.make_node("Add", ["acc_in", "ri"], ["acc_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, None)],
        [_vi("cond_out", B, []), _vi("acc_out", F, None), _vi("c", F, None)])
    nodes = [helper.make_node("Loop", ["m", "", "acc0"], ["acc", "steps"], body=body,
                              name="loop")]
    return _save(path, nodes,
                 [_vi("x", F, ["N", 4, "L"]), _vi("acc0", F, ["N", 6, 1]), _vi("m", I64, [])],
                 [_vi("acc", F, None), _vi("steps", F, None)], _constants(np.random.default_rng(4)),
                 opset=13)


def _compare(model, path, feeds, rtol=1e-5, atol=1e-5):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = model(**feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def _backends(model, prefix):
    """{op: set of backends} of the subgraph nodes whose path starts with `prefix`."""
    out = {}
    for name, backend in model._compiled.node_backends:
        if name.startswith(prefix):
            out.setdefault(name.split("/")[-1], set()).add(backend)
    return out


@pytest.fixture
def specialize_off():
    old = pypto.get_optimization_options()["specialize_subgraphs"]
    pypto.set_optimization_options({"specialize_subgraphs": False})
    yield
    pypto.set_optimization_options({"specialize_subgraphs": old})


def _if_feeds(n, length=1, sr=16000, seed=0):
    rng = np.random.default_rng(seed + n)
    return {"x": rng.standard_normal((n, 4, length)).astype(np.float32),
            "sr": np.array(sr, np.int64), "d": rng.standard_normal(6).astype(np.float32)}


def test_if_branch_conv_runs_on_cpu_for_the_run_shapes(tmp_path):
    path = _if_conv_model(tmp_path / "if_conv.onnx")
    model = pypto.onnx.load(path)
    # Compiled with x's dims unknown, the shape If stays (the Conv, reading a value of unknown
    # rank, takes its rank from the weight).
    assert "If" in _backends(model, "if_sr/then_branch/")
    for n in (1, 3, 1):
        _compare(model, path, _if_feeds(n))
        then = _backends(model, "if_sr/then_branch/")
        assert then["Conv"] == {"cpu"} and "If" not in then, then  # the shape If folded
        assert set().union(*then.values()) == {"cpu"}, then
    _compare(model, path, _if_feeds(2, sr=8000))  # the other branch, same shapes
    assert set().union(*_backends(model, "if_sr/").values()) == {"cpu"}
    # A shape the model's declaration rules out (x's fixed dim 4) is still an error, not a
    # specialization for it.
    bad = _if_feeds(2)
    bad["x"] = np.zeros((2, 5, 1), np.float32)
    with pytest.raises(ValueError):
        model(**bad)


def test_saved_model_specializes_its_branches(tmp_path):
    """A model saved (pypto.save) and loaded back compiles its branches for the run's shapes
    too (the generic compile is what the file holds)."""
    path = _if_conv_model(tmp_path / "if_conv_saved.onnx")
    pypto.save(pypto.onnx.load(path), tmp_path / "if_conv.pto")
    model = pypto.load(tmp_path / "if_conv.pto")
    assert "If" in _backends(model, "if_sr/then_branch/")
    for n in (2, 1):
        _compare(model, path, _if_feeds(n))
    then = _backends(model, "if_sr/then_branch/")
    assert then["Conv"] == {"cpu"} and "If" not in then, then


def test_if_branch_with_specializing_off_runs_the_generic_compile(tmp_path, specialize_off):
    path = _if_conv_model(tmp_path / "if_conv_off.onnx")
    model = pypto.onnx.load(path)
    for n in (1, 3):
        _compare(model, path, _if_feeds(n))
    then = _backends(model, "if_sr/then_branch/")
    assert then["Conv"] == {"cpu"} and "If" in then, then


def test_if_branch_more_shapes_than_specializations(tmp_path):
    """Past the cap (4 signatures a node), other shapes run the generic compile, correctly."""
    path = _if_conv_model(tmp_path / "if_conv_many.onnx")
    model = pypto.onnx.load(path)
    for n in range(1, 8):
        _compare(model, path, _if_feeds(n, seed=n))
    _compare(model, path, _if_feeds(2, seed=11))  # a specialized shape again
    assert _backends(model, "if_sr/then_branch/")["Conv"] == {"cpu"}


def test_if_branch_not_taken_may_not_fit_the_shapes(tmp_path):
    """x's last dim 3: the squeeze branch of the inner If cannot run on it (and is not taken):
    type inference keeps it as it was and FoldConstants takes the other branch. Here the Conv
    then reads a rank-4 value, which onnxruntime rejects too: the run is a clean error."""
    path = _if_conv_model(tmp_path / "if_conv_l3.onnx")
    model = pypto.onnx.load(path)
    with pytest.raises(ValueError, match="kernel_shape"):
        model(**_if_feeds(2, length=3))
    with pytest.raises(Exception, match="num_dims"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, _if_feeds(2, length=3))
    _compare(model, path, _if_feeds(2, length=3, sr=8000))  # the other branch is fine
    _compare(model, path, _if_feeds(2))


def test_if_branch_specialized_from_four_threads(tmp_path):
    """Four threads run one model at once, each on its own batch size (a signature each, all
    compiled while the others run), 10 times; every result is onnxruntime's."""
    path = _if_conv_model(tmp_path / "if_conv_threads.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = pypto.onnx.load(path)
    feeds = [_if_feeds(n, seed=20) for n in (1, 2, 3, 4)]
    want = [sess.run(None, f) for f in feeds]
    errors = []

    def work(t):
        try:
            for _ in range(10):
                np.testing.assert_allclose(np.asarray(model(**feeds[t])), want[t][0], rtol=1e-5,
                                           atol=1e-5)
        except Exception as e:  # noqa: BLE001 - reported below, with the thread
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert _backends(model, "if_sr/then_branch/")["Conv"] == {"cpu"}


def _loop_feeds(n, m, seed=0):
    rng = np.random.default_rng(seed + 10 * n + m)
    return {"x": rng.standard_normal((n, 4, 1)).astype(np.float32),
            "acc0": rng.standard_normal((n, 6, 1)).astype(np.float32),
            "m": np.array(m, np.int64)}


def test_loop_body_conv_runs_on_cpu_for_the_run_shapes(tmp_path):
    path = _loop_conv_model(tmp_path / "loop_conv.onnx")
    model = pypto.onnx.load(path)
    assert "If" in _backends(model, "loop/body/")
    for n, m in ((2, 3), (1, 5), (2, 1)):
        _compare(model, path, _loop_feeds(n, m))
        body = _backends(model, "loop/body/")
        assert body["Conv"] == {"cpu"} and "If" not in body, body
        assert set().union(*body.values()) == {"cpu"}, body


@pytest.mark.skipif(not os.path.isfile(SILERO), reason=f"no Silero VAD model at {SILERO}")
@pytest.mark.parametrize("sr,n,branch", [(16000, 512, "then_branch"), (8000, 256, "else_branch")])
def test_silero_vad_branch_on_cpu_against_onnxruntime(sr, n, branch):
    """Silero VAD streamed over 4 chunks (the state fed back): onnxruntime's outputs, and every
    op of the branch the rate takes on a CPU kernel."""
    model = pypto.onnx.load(SILERO)
    sess = ort.InferenceSession(SILERO, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(sr)
    state, state_ort = np.zeros((2, 1, 128), np.float32), np.zeros((2, 1, 128), np.float32)
    for _ in range(4):
        x = (rng.standard_normal((1, n)) * 0.3).astype(np.float32)
        got = model(input=x, state=state, sr=np.array(sr, np.int64))
        want = sess.run(None, {"input": x, "state": state_ort, "sr": np.array(sr, np.int64)})
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=2e-5)
        state, state_ort = np.asarray(got[1]), want[1]
    taken = _backends(model, f"If_0/{branch}/")
    assert taken and set().union(*taken.values()) == {"cpu"}, taken
