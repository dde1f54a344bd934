"""The per-call path of a compiled ONNX model (pypto.onnx.load(...)(x)): numpy arrays go to C++ in
one call and the rest through pypto.runtime._to_c, the Executable moves the values it drops
instead of copying them. Results are checked against onnxruntime on bench/overhead.py's models."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import pypto

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import overhead  # noqa: E402

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def small10(tmp_path_factory):
    """(pypto model, onnxruntime session) of small10: x[n, 64] in, symbolic n."""
    path = str(tmp_path_factory.mktemp("call_path") / "small10.onnx")
    overhead.build_small10(path)
    return pypto.onnx.load(path), ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def ort_run(sess, x):
    return sess.run(None, {"x": np.ascontiguousarray(x)})[0]


def test_shape_changes_between_calls_match_onnxruntime(small10):
    model, sess = small10
    rng = np.random.default_rng(0)
    kept = []
    for n in (1, 3, 1, 5, 2, 2, 1):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        want = ort_run(sess, x)
        got = model(x)
        assert type(got) is np.ndarray and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        got_t = model(torch.from_numpy(x))
        assert isinstance(got_t, torch.Tensor)
        np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model(x=x), want, rtol=1e-5, atol=1e-6)
        kept.append((got, got.copy()))
    for got, copy in kept:  # no later call wrote over an earlier call's output
        np.testing.assert_array_equal(got, copy)


def test_non_contiguous_and_other_byte_order_inputs(small10):
    model, sess = small10
    rng = np.random.default_rng(1)
    wide = rng.standard_normal((3, 128)).astype(np.float32)
    view = wide[:, ::2]  # strided: read where it is
    np.testing.assert_allclose(model(view), ort_run(sess, view), rtol=1e-5, atol=1e-6)
    tview = torch.from_numpy(wide).t().contiguous().t()[:, 1::2]
    np.testing.assert_allclose(model(tview).numpy(), ort_run(sess, tview.numpy()), rtol=1e-5,
                               atol=1e-6)
    big = view.astype(">f4")  # not DLPack-capable as it is: converted on the way in
    np.testing.assert_allclose(model(big), ort_run(sess, view), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(np.float32(2) * view), ort_run(sess, 2 * view), rtol=1e-5,
                               atol=1e-6)


def test_bad_inputs_still_raise_clear_errors(small10):
    model, _ = small10
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(TypeError, match="input 'x': expected dtype f32, got f64"):
        model(x.astype(np.float64))
    with pytest.raises(ValueError, match="input 'x': expected rank 2"):
        model(x[0])
    with pytest.raises(ValueError, match="input 'x': dimension 1 should be 64"):
        model(np.zeros((2, 63), np.float32))
    with pytest.raises(TypeError, match="input 'x' must be a torch.Tensor or numpy.ndarray, "
                                        "got list"):
        model([[0.0] * 64])
    with pytest.raises(TypeError, match="expected 1 input"):
        model._compiled.run([x, x])
    np.testing.assert_array_equal(model(x), model(x))  # and the model still runs after them


def test_threads_sharing_the_model_with_different_shapes(small10):
    model, sess = small10
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((n, 64)).astype(np.float32) for n in (1, 2, 3, 4)]
    wants = [ort_run(sess, x) for x in xs]
    errors = []

    def work(i):
        try:
            for k in range(40):
                x = xs[(i + k) % 4]
                got = model(x) if k % 2 else model(torch.from_numpy(x)).numpy()
                np.testing.assert_allclose(got, wants[(i + k) % 4], rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def build_prepared(path):
    """Nodes whose CPU kernels read their attributes and constant inputs once, when the kernel is
    made (Reshape's shape with 0 and -1, Transpose without perm, Reduce axes as a constant input,
    LayerNormalization with its statistics), on x[n, m, 8] with both first dimensions symbolic;
    the constant c is read by two steps."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "g"),
        numpy_helper.from_array(np.linspace(-0.2, 0.2, 8, dtype=np.float32), "c"),
        numpy_helper.from_array(np.array([0, -1, 4], np.int64), "shape"),
        numpy_helper.from_array(np.array([-1, 0], np.int64), "axes"),
    ]
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "g", "c"], ["l", "mean", "inv"], axis=-1, epsilon=1e-3),
        n("Add", ["l", "c"], ["a"]),
        n("Reshape", ["a", "shape"], ["r"]),
        n("Transpose", ["r"], ["t"]),
        n("Relu", ["t"], ["u"]),
        n("ReduceSum", ["u", "axes"], ["y"], keepdims=0),
    ]
    f = TensorProto.FLOAT
    g = helper.make_graph(
        nodes, "prepared", [helper.make_tensor_value_info("x", f, ["n", "m", 8])],
        [helper.make_tensor_value_info("y", f, None),
         helper.make_tensor_value_info("mean", f, None),
         helper.make_tensor_value_info("inv", f, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_parameters_read_once_hold_for_every_shape(tmp_path):
    path = str(tmp_path / "prepared.onnx")
    build_prepared(path)
    model = pypto.onnx.load(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    kept = []
    for shape in ((1, 2, 8), (3, 4, 8), (2, 6, 8), (1, 2, 8), (5, 2, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        wants = sess.run(None, {"x": x})
        gots = model(x)
        for got, want in zip(gots, wants):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        kept.append([(g, g.copy()) for g in gots])
    for outs in kept:  # no later call wrote over an earlier call's outputs
        for got, copy in outs:
            np.testing.assert_array_equal(got, copy)


def test_reshape_read_once_still_rejects_a_shape_it_cannot_take(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = str(tmp_path / "reshape.onnx")
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([-1, 3], np.int64), "s")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
    model = pypto.onnx.load(path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(model(x), -x.reshape(4, 3))
    with pytest.raises(ValueError, match=r"\[Reshape\] .*cannot reshape"):
        model(x[:1])
    np.testing.assert_array_equal(model(x), -x.reshape(4, 3))
