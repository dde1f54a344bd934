"""Malformed ONNX models (as a fuzzer writes them: structure-aware mutations of valid ones) are
refused with a ValueError naming the node, or compile; never a crash, a hang or an internal
error. Each case here was found by fuzzing pypto.onnx.load."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import pypto


def _model(nodes, inputs, outputs=("y",), initializers=(), opset=17):
    g = helper.make_graph(nodes, "g", list(inputs),
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                           for o in outputs], list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _x(shape):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)


@pytest.mark.parametrize("op,attrs", [("Sum", {}), ("Mean", {}), ("Max", {}),
                                      ("Einsum", {"equation": "i,i->i"}),
                                      ("Concat", {"axis": 0})])
def test_an_omitted_variadic_input_is_refused(op, attrs):
    """Sum reached a pass as Add with a missing input (an internal error), Einsum a failed check
    on value id -1."""
    m = _model([helper.make_node(op, ["x", ""], ["y"], name="n", **attrs)], [_x([3])])
    with pytest.raises(ValueError, match=rf"\[{op}\] node 'n': input 1 is missing: {op}'s "
                                         "variadic inputs cannot be omitted"):
        pypto.onnx.load(m)


def test_a_conv_declaring_a_huge_plane_compiles_without_walking_it():
    """A height of 2^40 made the planner walk every output row at compile time (a hang)."""
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3],
                                 pads=[1, 1, 1, 1])], [_x([1, 8, 2 ** 40, 4])], initializers=[w])
    exe = pypto.onnx.load(m)
    assert exe.output_names == ["y"]


def test_names_that_are_not_utf8_are_escaped_in_the_error():
    """Protobuf keeps a name's bytes as they are: an error quoting one became a UnicodeDecodeError
    without the error's message."""
    m = _model([helper.make_node("FooBar", ["x"], ["y"], name="ZZZZ")], [_x([3])])
    data = m.SerializeToString().replace(b"ZZZZ", b"\xb4\xff\xfe\x80")
    with pytest.raises(NotImplementedError,
                       match=r"\[FooBar\] node '\\xb4\\xff\\xfe\\x80': operator 'FooBar' is not "
                             "supported"):
        pypto.onnx.load(data)


def _external_weight(location, length=None):
    import onnx

    t = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in [("location", location), ("length", length)]:
        if value is not None:
            e = t.external_data.add()
            e.key, e.value = key, value
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_x([4])],
                  initializers=[t])


def test_external_data_through_a_link_out_of_the_folder_is_refused(tmp_path):
    """A link in the model's folder to a file outside it passed the check of the path's text, and
    the file (here /etc/passwd) became the weight; onnxruntime refuses it too."""
    import os

    os.symlink("/etc/passwd", tmp_path / "w.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_weight("w.bin").SerializeToString())
    with pytest.raises(ValueError, match=r"external data location 'w.bin' leads to '/etc/passwd', "
                                         "outside the model's folder"):
        pypto.onnx.load(path)


def test_external_data_inside_the_folder_through_a_link_loads(tmp_path):
    weights = np.arange(4, dtype=np.float32)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "real.bin").write_bytes(weights.tobytes())
    import os

    os.symlink(tmp_path / "data" / "real.bin", tmp_path / "w.bin")
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_weight("w.bin", "16").SerializeToString())
    np.testing.assert_array_equal(np.asarray(pypto.onnx.load(path)(np.ones(4, np.float32))),
                                  weights + 1)


@pytest.mark.parametrize("location,length,why", [
    (".", None, r"cannot open external data file .* \(not an existing regular file\)"),
    ("w\0.bin", None, r"location holds a NUL byte \(it must be a relative path inside"),
    ("w.bin", "-1", r"external data key 'length' has a bad value '-1'"),
])
def test_bad_external_data_entries_are_named(tmp_path, location, length, why):
    """'.' reported a size of 18446744073709551615 bytes; a length of -1 passed; a NUL cut the
    path short."""
    (tmp_path / "w.bin").write_bytes(np.zeros(4, np.float32).tobytes())
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_weight(location, length).SerializeToString())
    with pytest.raises(ValueError, match=why):
        pypto.onnx.load(path)


def test_running_out_of_memory_in_a_loop_is_an_error_not_an_abort(tmp_path):
    """A Loop accumulating a scan output until allocation fails: freeing the outputs made so far
    while the error unwound allocated in the memory pool, threw from a destructor and aborted the
    process. Run in a child under a 2 GiB address-space limit."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import resource, numpy as np
        from onnx import TensorProto as T, helper as h, numpy_helper as nh
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        body = h.make_graph(
            [h.make_node("Identity", ["cond_in"], ["cond_out"]),
             h.make_node("Add", ["x", "x"], ["scan_out"])], "body",
            [h.make_tensor_value_info("iter", T.INT64, []),
             h.make_tensor_value_info("cond_in", T.BOOL, [])],
            [h.make_tensor_value_info("cond_out", T.BOOL, []),
             h.make_tensor_value_info("scan_out", T.FLOAT, [2, 3])])
        g = h.make_graph([h.make_node("Loop", ["trip", "cond"], ["y"], name="loop", body=body)],
                         "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(np.array(2**63 - 1, np.int64), "trip"),
                          nh.from_array(np.array(True), "cond")])
        m = h.make_model(g, opset_imports=[h.make_operatorsetid("", 17)]); m.ir_version = 8
        import pypto.onnx
        exe = pypto.onnx.load(m)
        try:
            exe(np.ones((2, 3), np.float32))
        except (MemoryError, ValueError) as e:
            print("refused:", type(e).__name__)
    """)
    import os
    from pathlib import Path

    # The child imports this checkout's pypto, as the test did (conftest puts it on sys.path).
    root = str(Path(pypto.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout, (r.stdout, r.stderr[-2000:])


def test_a_pad_past_any_tensor_is_a_value_error():
    """A pad of 2^40 built an index map per output position while compiling: a bare
    MemoryError('std::bad_alloc') with no node named."""
    p = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 0, 2 ** 40], np.int64), "p")
    m = _model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="constant")],
               [_x([1, 4, 8, 8])], initializers=[p], opset=18)
    with pytest.raises(ValueError, match=r"\[Pad\] node 'pad': the padded output "
                                         r"\[1, 4, 8, 1099511627784\] would hold"):
        pypto.onnx.load(m)(np.ones((1, 4, 8, 8), np.float32))


def test_a_dft_longer_than_any_tensor_is_a_value_error():
    n = numpy_helper.from_array(np.array(2 ** 31, np.int64), "n")
    a = numpy_helper.from_array(np.array(1, np.int64), "a")
    m = _model([helper.make_node("DFT", ["x", "n", "a"], ["y"], name="dft")], [_x([1, 8, 1])],
               initializers=[n, a], opset=20)
    with pytest.raises(ValueError, match="a DFT of 2147483648 points needs tables larger"):
        pypto.onnx.load(m)(np.ones((1, 8, 1), np.float32))


def test_long_chains_compile_in_linear_time():
    """32k Relus took 11 s to compile (every group scanned the graph, the fusion of a chain
    walked its span at every join, the tuning signature looked back over the group); 131072
    overflowed the tile program's int16 register numbers and corrupted memory."""
    import time

    for n, budget in [(32768, 30.0), (131072, 120.0)]:  # 0.4 s and 2.2 s here
        nodes = [helper.make_node("Relu", [f"v{i}" if i else "x"], [f"v{i + 1}"], name=f"r{i}")
                 for i in range(n)]
        nodes.append(helper.make_node("Identity", [f"v{n}"], ["y"], name="out"))
        start = time.perf_counter()
        exe = pypto.onnx.load(_model(nodes, [_x([4])]))
        took = time.perf_counter() - start
        x = np.array([-1.0, 0.5, -2.0, 3.0], np.float32)
        np.testing.assert_array_equal(np.asarray(exe(x)), np.maximum(x, 0))
        assert took < budget, f"{n} Relus: {took:.1f} s to compile"


# ---- NaN through max pooling -------------------------------------------------------------------
# onnxruntime 1.32 gives NaN or not by where the NaN sits in the window (a 1x4 MaxPool of
# [nan, 1, 2, 3] is 3, of [1, 2, 3, nan] NaN; its ArgMax of [1, nan, 2, 3] is 3): no reference.
# PyTorch's max_pool and amax, like numpy's max, give NaN for any window holding one; PyPTO
# followed onnxruntime's "NaN only when first" on some paths. Compared with torch here.

def _with_nans(shape, seed, frac=0.03):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < frac] = np.nan
    return x


def _assert_same_with_nan(got, want):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want))


def _backends(exe):
    return {b for _, b in exe._compiled.node_backends}


@pytest.mark.parametrize("shape,kernel,strides,pads", [
    ([2, 8, 19, 23], [3, 3], [1, 1], [1, 1, 1, 1]),    # folded by lane shifts
    ([1, 64, 28, 28], [3, 3], [2, 2], [1, 1, 1, 1]),   # ResNet's stem pool: even / odd lanes
    ([2, 3, 17, 37], [2, 3], [3, 3], [0, 1, 0, 1]),    # the buffered row
    ([2, 4, 40], [3], [2], [1, 1]),                     # 1-D
    ([1, 3, 6, 10, 10], [2, 3, 3], [1, 2, 2], [0, 1, 1, 0, 1, 1]),  # 3-D, separably
    ([1, 2, 9, 11, 16], [3, 3, 1], [2, 2, 1], [1, 1, 0, 1, 1, 0]),  # level 3's NCHWc blocks
    ([1, 2, 9, 11, 32], [3, 3, 1], [1, 1, 1], [1, 1, 0, 1, 1, 0]),
    ([1, 2, 9, 11, 8], [3, 3, 1], [2, 2, 1], [1, 1, 0, 1, 1, 0]),
    ([1, 2, 9, 11, 5], [3, 3, 1], [2, 2, 1], [1, 1, 0, 1, 1, 0]),
])
def test_max_pool_of_a_window_holding_nan_is_nan(shape, kernel, strides, pads):
    import torch

    x = _with_nans(shape, len(shape) * 100 + shape[-1])
    m = _model([helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=kernel,
                                 strides=strides, pads=pads)], [_x(shape)])
    exe = pypto.onnx.load(m)
    assert _backends(exe) == {"cpu"}
    pool = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d,
            3: torch.nn.functional.max_pool3d}[len(kernel)]
    want = pool(torch.from_numpy(x), kernel, strides, [p for p in pads[:len(kernel)]]).numpy()
    got = np.asarray(exe(x))
    assert np.isnan(want).any() and not np.isnan(want).all()
    _assert_same_with_nan(got, want)


def test_max_pool_indices_point_at_the_nan():
    """With Indices (the reference interpreter's kernel): NaN and the window's last NaN, as
    torch's max_pool2d_with_indices."""
    import torch

    x = _with_nans([2, 3, 11, 13], 7, frac=0.05)
    g = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[3, 3],
                          strides=[2, 2], pads=[1, 1, 1, 1])], "g", [_x(list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    exe = pypto.onnx.load(m)
    assert _backends(exe) == {"reference"}
    y, i = exe(x)
    want_y, want_i = torch.nn.functional.max_pool2d_with_indices(torch.from_numpy(x), 3, 2, 1)
    _assert_same_with_nan(np.asarray(y), want_y.numpy())
    # torch's indices are within each plane; ONNX's count the planes before it.
    planes = np.arange(6).reshape(2, 3, 1, 1) * 11 * 13
    np.testing.assert_array_equal(np.asarray(i), want_i.numpy() + planes)


@pytest.mark.parametrize("shape", [[2, 64, 7, 7], [2, 5, 3, 17], [1, 3, 4, 5, 6]])
def test_global_max_pool_of_a_plane_holding_nan_is_nan(shape):
    import torch

    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    planes = x.reshape(shape[0] * shape[1], -1)
    planes[0, 1] = planes[-1, -1] = np.nan  # neither the first element of its plane
    m = _model([helper.make_node("GlobalMaxPool", ["x"], ["y"], name="gmp")], [_x(shape)])
    exe = pypto.onnx.load(m)
    assert _backends(exe) == {"cpu"}
    want = torch.amax(torch.from_numpy(x), tuple(range(2, len(shape))), keepdim=True).numpy()
    assert np.isnan(want).any() and not np.isnan(want).all()
    _assert_same_with_nan(np.asarray(exe(x)), want)


def test_level_3_max_pool_after_a_conv_propagates_nan():
    """The conv's output is channel-blocked (NCHWc) at level 3; the pool reads the blocks."""
    import torch

    x = np.random.default_rng(3).standard_normal((1, 32, 16, 16)).astype(np.float32)
    w = np.random.default_rng(4).standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.1
    x[0, :, 5, 7] = np.nan  # a 1x1 conv keeps the NaN at its pixel
    m = _model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
                helper.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[3, 3],
                                 strides=[2, 2], pads=[1, 1, 1, 1])],
               [_x([1, 32, 16, 16])], initializers=[numpy_helper.from_array(w, "w")])
    exe = pypto.onnx.load(m, level=3)
    got = np.asarray(exe(x))
    want = torch.nn.functional.max_pool2d(
        torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)), 3, 2, 1).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).sum() == 32 * 4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("op,attrs", [("ReduceMax", {"axes": [1], "keepdims": 0}),
                                      ("ReduceMin", {"axes": [3], "keepdims": 0}),
                                      ("ArgMax", {"axis": 1, "keepdims": 0}),
                                      ("ArgMin", {"axis": 3, "keepdims": 0})])
def test_reductions_over_nan_follow_torch(op, attrs):
    """These were right already (guarded here): NaN is the max and min, and the first NaN's index
    is the arg (torch.argmax; onnxruntime's ArgMax skips a NaN that is not first)."""
    import torch

    x = _with_nans([2, 33, 5, 19], 5, frac=0.05)
    out = TensorProto.INT64 if op.startswith("Arg") else TensorProto.FLOAT
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="r", **attrs)], "g",
                          [_x(list(x.shape))], [helper.make_tensor_value_info("y", out, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    axis = attrs.get("axis", attrs.get("axes", [None])[0])
    t = torch.from_numpy(x)
    want = {"ReduceMax": lambda: torch.amax(t, axis), "ReduceMin": lambda: torch.amin(t, axis),
            "ArgMax": lambda: torch.argmax(t, axis), "ArgMin": lambda: torch.argmin(t, axis)}[op]()
    _assert_same_with_nan(np.asarray(pypto.onnx.load(m)(x)), want.numpy())


# ---- Boolean attributes ------------------------------------------------------------------------
# PyPTO read any nonzero as true. onnxruntime 1.32 has no one rule: keepdims=2, ceil_mode=2 and
# largest=2 are false there, transA=2 and count_include_pad=2 true, CumSum's exclusive=2 an error.
# ONNX defines them as 0 or 1; anything else is refused, naming the node and the attribute.

@pytest.mark.parametrize("op,attrs,inputs,opset", [
    ("ReduceMax", {"axes": [1], "keepdims": 2}, ["x"], 17),
    ("ReduceSum", {"keepdims": -1}, ["x"], 17),
    ("ArgMax", {"axis": 1, "keepdims": 2}, ["x"], 17),
    ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 2}, ["x"], 17),
    ("AveragePool", {"kernel_shape": [2, 2], "count_include_pad": 5}, ["x"], 17),
    ("Gemm", {"transA": 2}, ["x2", "b"], 17),
    ("CumSum", {"exclusive": 2}, ["x", "a"], 17),
    ("TopK", {"largest": 2}, ["x", "k"], 17),
])
def test_a_boolean_attribute_other_than_0_or_1_is_refused(op, attrs, inputs, opset):
    import onnxruntime as ort

    inits = [numpy_helper.from_array(np.ones((4, 2), np.float32), "b"),
             numpy_helper.from_array(np.array(1, np.int64), "a"),
             numpy_helper.from_array(np.array([1], np.int64), "k")]
    outputs = ("y", "i") if op == "TopK" else ("y",)
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, [4, 3])
    m = _model([helper.make_node(op, inputs, list(outputs), name="n", **attrs)],
               [x2] if inputs[0] == "x2" else [_x([1, 2, 4, 4])], outputs=outputs,
               initializers=inits, opset=opset)
    for o in m.graph.output:  # ArgMax's output and TopK's indices
        if op == "ArgMax" or o.name == "i":
            o.type.tensor_type.elem_type = TensorProto.INT64
    name, value = next((k, v) for k, v in attrs.items() if k not in ("axes", "axis",
                                                                     "kernel_shape"))
    with pytest.raises(ValueError, match=rf"\[{op}\] node 'n': attribute '{name}' of operator "
                                         rf"{op} is a boolean and must be 0 or 1, got {value}"):
        pypto.onnx.load(m)
    # 0 and 1 load, and give what onnxruntime gives.
    for v in (0, 1):
        m.graph.node[0].attribute[[a.name for a in m.graph.node[0].attribute].index(name)].i = v
        feeds = ({"x2": np.arange(12, dtype=np.float32).reshape(4, 3)} if inputs[0] == "x2"
                 else {"x": np.random.default_rng(v).standard_normal((1, 2, 4, 4))
                       .astype(np.float32)})
        if op == "Gemm" and v == 0:
            continue  # [4, 3] x [4, 2] needs transA
        want = ort.InferenceSession(m.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
        got = pypto.onnx.load(m)(*feeds.values())
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)


# ---- Errors after import name the file ----------------------------------------------------------

def _gather_out_of_range():
    """A constant Gather out of range: the error comes when the passes fold it (compile)."""
    d = numpy_helper.from_array(np.arange(4, dtype=np.float32), "d")
    i = numpy_helper.from_array(np.array([7], np.int64), "i")
    return _model([helper.make_node("Gather", ["d", "i"], ["t"], name="gather"),
                   helper.make_node("Add", ["x", "t"], ["y"], name="add")], [_x([1])],
                  initializers=[d, i])


def _reshape_to_an_input():
    """Reshape to a shape given at run time: the error comes running it."""
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    return _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], [_x([6]), s])


def test_errors_compiling_or_running_a_file_start_with_its_name(tmp_path):
    """Import errors started with the file, errors of the compile and of a run did not."""
    import onnx

    path = str(tmp_path / "bad.onnx")
    onnx.save(_gather_out_of_range(), path)
    with pytest.raises(ValueError) as e:
        pypto.onnx.load(path)(np.ones(1, np.float32))
    assert str(e.value).startswith(f"{path}: [Gather] node 'gather': index 7 is out of range")
    onnx.save(_reshape_to_an_input(), path)
    exe = pypto.onnx.load(path)
    with pytest.raises(ValueError) as e:
        exe(np.ones(6, np.float32), np.array([4, 4], np.int64))
    assert str(e.value) == f"{path}: [Reshape] node 'reshape': cannot reshape f32[6] (6 elements) " \
                           "to [4, 4]"
    # Bytes are "<bytes>", as at import; one prefix, however deep the error.
    with pytest.raises(ValueError, match=r"^<bytes>: \[Reshape\] node 'reshape': cannot reshape"):
        pypto.onnx.load(_reshape_to_an_input())(np.ones(6, np.float32), np.array([4, 4], np.int64))
    np.testing.assert_array_equal(np.asarray(exe(np.ones(6, np.float32), np.array([2, 3]))),
                                  np.ones((2, 3), np.float32))


# ---- Errors inside subgraphs and functions name the node that holds them -------------------------

def _scan_adding(state_shape, x_shape, body_shapes):
    from onnx import helper as h

    body = h.make_graph(
        [h.make_node("Add", ["s", "xi"], ["s2"], name="body_add"),
         h.make_node("Identity", ["s2"], ["o"], name="body_id")], "body",
        [h.make_tensor_value_info("s", TensorProto.FLOAT, body_shapes[0]),
         h.make_tensor_value_info("xi", TensorProto.FLOAT, body_shapes[1])],
        [h.make_tensor_value_info("s2", TensorProto.FLOAT, None),
         h.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    s0 = h.make_tensor_value_info("s0", TensorProto.FLOAT, state_shape)
    x = h.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    return _model([h.make_node("Scan", ["s0", "x"], ["sN", "ys"], name="scan", body=body,
                               num_scan_inputs=1)], [s0, x], outputs=("sN", "ys"))


def test_a_scan_bodys_shape_error_names_the_scan():
    """At import (the body's shapes known) and at run time (unknown until then), the error named
    the body's Add alone."""
    with pytest.raises(ValueError, match=r"^<bytes>: \[Scan\] node 'scan': subgraph 'body': "
                                         r"\[Add\] node 'body_add': shapes \[2\] and \[3\] cannot"):
        pypto.onnx.load(_scan_adding([2], [5, 3], ([2], [3])))
    for level in (0, 2):  # the interpreter and the compiled body
        exe = pypto.onnx.load(_scan_adding(["a"], ["n", "b"], (None, None)), level=level)
        with pytest.raises(ValueError, match=r"^<bytes>: \[Scan\] node 'scan': subgraph 'body': "
                                             r"\[Add\] node 'body_add': shapes"):
            exe(np.ones(2, np.float32), np.ones((5, 3), np.float32))
        s, ys = exe(np.ones(2, np.float32), np.ones((5, 2), np.float32))
        np.testing.assert_array_equal(np.asarray(s), np.full(2, 6, np.float32))


def test_a_function_output_its_body_does_not_compute_is_blamed_on_the_call():
    """It was blamed on the node reading the output: "[Neg] node 'neg': input 'y2' is not
    defined before this node"."""
    from onnx import helper as h

    ops = [h.make_operatorsetid("", 17), h.make_operatorsetid("local", 1)]
    f = h.make_function("local", "F", ["a"], ["b", "c"], [h.make_node("Relu", ["a"], ["b"])],
                        opset_imports=ops)
    g = h.make_graph([h.make_node("F", ["x"], ["y1", "y2"], name="call", domain="local"),
                      h.make_node("Neg", ["y2"], ["y"], name="neg")], "g", [_x([4])],
                     [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    m = h.make_model(g, opset_imports=ops, functions=[f])
    m.ir_version = 8
    with pytest.raises(ValueError, match=r"^<bytes>: \[F\] node 'call' \(a call of function "
                                         r"'F'\): output 1 \('c'\) of the function is not "
                                         "computed by its body"):
        pypto.onnx.load(m)
    # Leaving that output out of the call is fine.
    m.graph.node[0].output[1] = ""
    m.graph.node[1].input[0] = "y1"
    x = np.array([-1, 2, -3, 4], np.float32)
    np.testing.assert_array_equal(np.asarray(pypto.onnx.load(m)(x)), -np.maximum(x, 0))


def _nested_functions(levels):
    from onnx import helper as h

    ops = [h.make_operatorsetid("", 17), h.make_operatorsetid("local", 1)]
    fs = []
    for i in range(levels):
        body = ([h.make_node("Relu", ["a"], ["b"])] if i == 0 else
                [h.make_node(f"G{i - 1}", ["a"], ["t"], domain="local"),
                 h.make_node(f"G{i - 1}", ["t"], ["b"], domain="local")])
        fs.append(h.make_function("local", f"G{i}", ["a"], ["b"], body, opset_imports=ops))
    g = h.make_graph([h.make_node(f"G{levels - 1}", ["x"], ["y"], name="call", domain="local")],
                     "g", [_x([4])], [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    m = h.make_model(g, opset_imports=ops, functions=fs)
    m.ir_version = 8
    return m


def test_functions_inlining_to_millions_of_nodes_are_refused_before_inlining():
    """25 levels of a function calling the one below twice (1 KB) inlined 2^24 Relus for 25-45 s,
    then a MemoryError; refused now at once, naming the call."""
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^<bytes>: \[G24\] node 'call' \(a call of function "
                                         r"'G24'\): model-local functions would inline to more "
                                         r"than 4194304 nodes here"):
        pypto.onnx.load(_nested_functions(25))
    assert time.perf_counter() - start < 5
    x = np.array([-1, 2, -3, 4], np.float32)  # 2^9 Relus are fine
    np.testing.assert_array_equal(np.asarray(pypto.onnx.load(_nested_functions(10))(x)),
                                  np.maximum(x, 0))
