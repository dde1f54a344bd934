"""The `pto` command: help and exit codes, `pto info`, and `pto run` against numpy and onnxruntime.

Runs the built binary: $PTO_BIN, else $PTO_BUILD_DIR/pto (default <repo>/build/pto). Models are made with
onnx.helper; .npy files with numpy. Run with:
    /root/.cache/pypto/venv/bin/python -m pytest tests/python/test_cli.py
"""

import os
import pathlib
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("PTO_BUILD_DIR", REPO / "build"))
PTO = pathlib.Path(os.environ.get("PTO_BIN", BUILD / "pto"))


def test_pto_is_built():
    # A missing binary is a failure, not a reason to skip: every test below needs it.
    assert PTO.exists(), f"{PTO} not built (set PTO_BIN or PTO_BUILD_DIR)"


def pto(*args, env=None):
    full_env = dict(os.environ)
    full_env.pop("PTO_ISA", None)
    full_env.update(env or {})
    return subprocess.run([str(PTO), *map(str, args)], capture_output=True, text=True,
                          env=full_env, timeout=120)


def save_model(path, nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return path


def identity_model(path, elem_type, dims):
    """A graph whose output is its input: `pto run` reads the .npy and writes it back."""
    x = helper.make_tensor_value_info("x", elem_type, dims)
    return save_model(path, [], [x], [x])


def expect_error(result, *parts, code=1):
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "pto: error: " in result.stderr
    for p in parts:
        assert str(p) in result.stderr, result.stderr


# ---- help, usage and exit codes ----

def test_help_lists_every_command():
    r = pto("--help")
    assert r.returncode == 0
    for cmd in ["info", "run", "bench", "profile", "compile", "tune", "check"]:
        assert f"  {cmd} " in r.stdout
    r = pto("run", "--help")
    assert r.returncode == 0 and "--output-dir" in r.stdout and "[-1, 1)" in r.stdout
    assert pto("help", "info").returncode == 0


def test_usage_errors_exit_2():
    expect_error(pto(), "no command", code=2)
    expect_error(pto("frobnicate"), "unknown command 'frobnicate'", code=2)
    expect_error(pto("run"), "no model file", code=2)
    expect_error(pto("run", "m.onnx", "--repeat", "0"), "--repeat", code=2)
    expect_error(pto("run", "m.onnx", "--seed", "abc"), "--seed", code=2)
    expect_error(pto("run", "m.onnx", "--input", "no_equals_sign"), "NAME=VALUE", code=2)
    expect_error(pto("run", "m.onnx", "--input", "a=1.npy", "--input", "a=2.npy"), "twice", code=2)
    expect_error(pto("run", "m.onnx", "--dim", "n=-3"), "--dim n", code=2)
    expect_error(pto("run", "m.onnx", "--bogus"), "unknown option '--bogus'", code=2)
    expect_error(pto("run", "m.onnx", "--output-dir"), "needs a value", code=2)
    expect_error(pto("info", "extra"), "unexpected argument", code=2)


# ---- pto tune ----

def gemm_model(path):
    """y = Gelu(x @ W) * 2 + Exp(z): a GEMM with an epilogue and an elementwise kernel."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 384)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TP.FLOAT, [96, 256])
    z = helper.make_tensor_value_info("z", TP.FLOAT, [96, 384])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["g"]),
             helper.make_node("Exp", ["z"], ["e"]), helper.make_node("Mul", ["e", "two"], ["f"]),
             helper.make_node("Add", ["g", "f"], ["y"])]
    return save_model(path, nodes, [x, z], [y], [w, two])


def cache_entries(path):
    """The entries of a tuning cache file (docs/tuning.md "The file"), read as JSON."""
    import json
    text = pathlib.Path(path).read_text()
    body = text[:text.rindex('"checksum"')].rstrip().rstrip(",") + "}"
    return json.loads(body)["entries"]


def test_tune_stores_winners_that_compile_then_uses(tmp_path):
    model = gemm_model(tmp_path / "m.onnx")
    cache = tmp_path / "tune.json"
    r = pto("tune", model, "--level", "exhaustive", "--threads", "1", "--trials", "6",
            "--cache", cache)
    assert r.returncode == 0, r.stderr
    assert "planner ms" in r.stdout and "tuned ms" in r.stdout and "candidate(s) timed" in r.stdout
    entries = cache_entries(cache)
    assert entries and all(e["threads"] == 1 for e in entries)
    winners = sum(1 for e in entries if e["knobs"])
    # The next compile with this cache takes every winner; --no-tune-cache none of them.
    env = {"PTO_TUNE_CACHE": str(cache), "PTO_NUM_THREADS": "1"}
    c = pto("compile", model, "--stats", env=env)
    assert c.returncode == 0, c.stderr
    assert f"tuned kernels: {winners} " in c.stdout
    off = pto("compile", model, "--stats", "--no-tune-cache", env=env)
    assert off.returncode == 0 and "tuned kernels: 0 " in off.stdout
    # Tuning again finds the kernels tuned before in the cache (and tunes those --trials left).
    again = pto("tune", model, "--level", "exhaustive", "--threads", "1", "--cache", cache)
    assert again.returncode == 0 and "(cached)" in again.stdout, again.stdout


def test_tune_usage_errors(tmp_path):
    expect_error(pto("tune"), "no model file", code=2)
    expect_error(pto("tune", "m.onnx", "--level", "quick"), "--level", code=2)
    expect_error(pto("tune", "m.onnx", "--trials", "0"), "--trials", code=2)
    r = pto("tune", "--help")
    assert r.returncode == 0 and "usage: pto tune" in r.stdout and "--no-early-stop" in r.stdout
    assert "--for-load" in r.stdout


def test_tune_probes_the_pool_on_several_threads(tmp_path):
    """On 2 threads pto tune prints the pool probe (2 threads' speed-up over one), saying whether
    thread knobs were tried; on 1 thread there is no probe."""
    model = gemm_model(tmp_path / "m.onnx")
    for threads, extra in (("2", []), ("2", ["--for-load"]), ("1", [])):
        r = pto("tune", model, "--level", "fast", "--threads", threads, "--trials", "2",
                "--cache", tmp_path / f"tune{threads}{len(extra)}.json", *extra)
        assert r.returncode == 0, r.stderr
        assert ("pool speed-up" in r.stdout) == (threads == "2"), r.stdout
        if "hold the cores" in r.stdout:
            assert ("--for-load: thread knobs tried anyway" in r.stdout) == bool(extra), r.stdout


# ---- pto info ----

def sysfs_cache_bytes(level):
    base = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        if (int((index / "level").read_text()) == level
                and (index / "type").read_text().strip() != "Instruction"):
            size = (index / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            return int(size.rstrip("KMG")) * mult
    return None


def test_info_shows_the_machine():
    r = pto("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"onnx opsets: 7 to {onnx.defs.onnx_opset_version()}" in out
    assert f"{len(os.sched_getaffinity(0))} logical" in out
    assert "isa:         " in out and "(best supported)" in out
    assert "ops:" in out and "registered" in out
    l1 = sysfs_cache_bytes(1)
    if l1:  # read from the machine, not a constant
        assert f"L1d {l1 // 1024} KiB" in out or f"L1d {l1} B" in out


def test_info_isa_override():
    r = pto("info", env={"PTO_ISA": "generic"})
    assert r.returncode == 0 and "isa:         generic (from PTO_ISA)" in r.stdout
    expect_error(pto("info", env={"PTO_ISA": "sse9"}), "PTO_ISA='sse9'")


def test_info_disable_ext():
    """PTO_DISABLE_EXT takes an extension out of the kernels pto info reports (AMX tiles, where the
    CPU has them, give way to the vector kernels); an unknown name is an error."""
    both = pto("info", env={"PTO_DISABLE_EXT": "amx_bf16,amx_int8"})
    assert both.returncode == 0, both.stderr
    assert "AMX tiles" not in both.stdout
    plain = pto("info")
    if "+amx_bf16" in plain.stdout:
        assert "bf16:        AMX tiles (amx_bf16)" in plain.stdout
    expect_error(pto("info", env={"PTO_DISABLE_EXT": "amx_bf17"}),
                 "PTO_DISABLE_EXT: unknown extension 'amx_bf17'")


# ---- pto run ----

def test_run_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    a = helper.make_tensor_value_info("a", TP.FLOAT, ["batch", 4])
    b = helper.make_tensor_value_info("b", TP.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    c = onnx.numpy_helper.from_array(np.array([0.5, -1, 2, 3], np.float32), "c")
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])]
    model = save_model(tmp_path / "addmul.onnx", nodes, [a, b], [y], [c])

    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((5, 4), np.float32),
             "b": rng.standard_normal((1, 4), np.float32)}
    for name, v in feeds.items():
        np.save(tmp_path / f"{name}.npy", v)
    out_dir = tmp_path / "out"
    r = pto("run", model, "--input", f"a={tmp_path / 'a.npy'}", f"--input=b={tmp_path / 'b.npy'}",
            "--output-dir", out_dir, "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "engine: cpu, level 2, 2 of 2 nodes on CPU kernels" in r.stdout, r.stdout
    assert "median of 3 runs" in r.stdout
    assert "output y: f32[5, 4]" in r.stdout

    expect = ort.InferenceSession(str(model)).run(None, feeds)[0]
    got = np.load(out_dir / "y.npy")
    assert got.dtype == np.float32 and got.shape == (5, 4)
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)


def test_run_integer_model_matches_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    a = helper.make_tensor_value_info("a", TP.INT64, [3])
    y = helper.make_tensor_value_info("y", TP.INT64, None)
    k = onnx.numpy_helper.from_array(np.array([2, -3, 4], np.int64), "k")
    model = save_model(tmp_path / "imul.onnx", [helper.make_node("Mul", ["a", "k"], ["y"])],
                       [a], [y], [k])
    r = pto("run", model, "--seed", "11", "--output-dir", tmp_path)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "y.npy")
    # Random integer inputs lie in [0, 10): recover the input and compare with onnxruntime.
    x = got // np.array([2, -3, 4])
    assert ((0 <= x) & (x < 10)).all()
    expect = ort.InferenceSession(str(model)).run(None, {"a": x.astype(np.int64)})[0]
    np.testing.assert_array_equal(got, expect)


NUMPY_DTYPES = {
    TP.FLOAT: np.float32, TP.DOUBLE: np.float64, TP.FLOAT16: np.float16, TP.INT8: np.int8,
    TP.INT16: np.int16, TP.INT32: np.int32, TP.INT64: np.int64, TP.UINT8: np.uint8,
    TP.UINT16: np.uint16, TP.UINT32: np.uint32, TP.UINT64: np.uint64, TP.BOOL: np.bool_,
}


@pytest.mark.parametrize("elem_type", list(NUMPY_DTYPES), ids=lambda t: TP.DataType.Name(t))
def test_npy_round_trip_through_pto(elem_type, tmp_path):
    dtype = NUMPY_DTYPES[elem_type]
    rng = np.random.default_rng(elem_type)
    cases = {
        "c_order": (rng.standard_normal((3, 5)) * 40),
        "fortran": np.asfortranarray(rng.standard_normal((4, 3)) * 40),
        "scalar": np.array(7.0),
        "empty": np.zeros((0, 3)),
        "big_endian": (rng.standard_normal((2, 3)) * 40),
    }
    for name, raw in cases.items():
        v = raw.astype(dtype) if dtype is not np.bool_ else raw > 0
        if name == "big_endian":
            v = v.astype(v.dtype.newbyteorder(">"))
        if name == "fortran":
            v = np.asfortranarray(v)
        model = identity_model(tmp_path / f"{name}.onnx", elem_type, list(v.shape))
        np.save(tmp_path / f"{name}_in.npy", v)
        out = tmp_path / name
        r = pto("run", model, "--input", f"x={tmp_path / f'{name}_in.npy'}", "--output-dir", out)
        assert r.returncode == 0, (name, r.stderr)
        back = np.load(out / "x.npy")
        assert back.dtype == np.dtype(dtype), name  # native little-endian
        assert back.shape == v.shape, name
        np.testing.assert_array_equal(back, v, err_msg=name)
        # What pto writes is byte-identical to what numpy writes for the same array.
        assert (out / "x.npy").read_bytes() == _npy_bytes(np.asarray(v, dtype, order="C"), tmp_path)


def _npy_bytes(arr, tmp_path):
    p = tmp_path / "ref.npy"
    np.save(p, arr)
    return p.read_bytes()


def test_random_inputs_are_seeded_and_in_range(tmp_path):
    model = identity_model(tmp_path / "f.onnx", TP.FLOAT, ["n", 1000])
    outs = []
    for seed in ["3", "3", "4"]:
        d = tmp_path / f"s{len(outs)}"
        r = pto("run", model, "--seed", seed, "--dim", "n=2", "--output-dir", d)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(d / "x.npy"))
    assert outs[0].shape == (2, 1000)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])
    assert outs[0].min() >= -1 and outs[0].max() < 1 and outs[0].std() > 0.5

    b = identity_model(tmp_path / "b.onnx", TP.BOOL, [500])
    r = pto("run", b, "--output-dir", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    bools = np.load(tmp_path / "b" / "x.npy")
    assert 150 < bools.sum() < 350


def test_symbolic_dims_default_to_one_with_a_note(tmp_path):
    model = identity_model(tmp_path / "m.onnx", TP.FLOAT, ["batch", 3])
    r = pto("run", model)
    assert r.returncode == 0, r.stderr
    assert "note: dimension 'batch' set to 1" in r.stderr and "output x: f32[1, 3]" in r.stdout
    r = pto("run", model, "--dim", "batch=6", "--print-graph")
    assert "output x: f32[6, 3]" in r.stdout and "input  %x: f32[batch, 3]" in r.stdout


def test_threads_level_and_engine(tmp_path):
    model = identity_model(tmp_path / "m.onnx", TP.FLOAT, [3])
    r = pto("run", model, "--threads", "4", "--level", "0")
    assert r.returncode == 0 and "engine: cpu, level 0" in r.stdout, r.stdout
    r = pto("run", model, "--engine", "reference", "--level", "2")
    assert r.returncode == 0 and "engine: reference" in r.stdout
    assert "no effect on the reference engine" in r.stderr
    expect_error(pto("run", model, "--level", "7"), "--level", code=2)
    expect_error(pto("run", model, "--engine", "gpu"), "--engine", code=2)


def test_output_names_are_sanitized(tmp_path):
    x = helper.make_tensor_value_info("x", TP.FLOAT, [2])
    outs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ["out/y:0", "out_y_0", ".."]]
    nodes = [helper.make_node("Relu", ["x"], ["out/y:0"]),
             helper.make_node("Exp", ["x"], ["out_y_0"]),
             helper.make_node("Relu", ["out_y_0"], [".."])]
    model = save_model(tmp_path / "m.onnx", nodes, [x], outs)
    r = pto("run", model, "--output-dir", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == ["out_y_0.npy", "out_y_0_1.npy", "output_2.npy"]


def test_bad_files_exit_1_with_a_message(tmp_path):
    model = identity_model(tmp_path / "m.onnx", TP.FLOAT, [2, 3])
    expect_error(pto("run", tmp_path / "absent.onnx"), "absent.onnx")
    (tmp_path / "junk.onnx").write_bytes(os.urandom(300))
    expect_error(pto("run", tmp_path / "junk.onnx"), "junk.onnx")
    expect_error(pto("run", model, "--input", f"x={tmp_path / 'none.npy'}"), "none.npy")
    expect_error(pto("run", model, "--input", f"nope={tmp_path / 'none.npy'}"), "'nope'", "'x'")
    np.save(tmp_path / "i32.npy", np.zeros((2, 3), np.int32))
    expect_error(pto("run", model, "--input", f"x={tmp_path / 'i32.npy'}"), "'x'", "dtype")
    np.save(tmp_path / "rank.npy", np.zeros((6,), np.float32))
    expect_error(pto("run", model, "--input", f"x={tmp_path / 'rank.npy'}"), "'x'", "rank")
    (tmp_path / "cut.npy").write_bytes((tmp_path / "rank.npy").read_bytes()[:-3])
    expect_error(pto("run", model, "--input", f"x={tmp_path / 'cut.npy'}"), "cut.npy")
    expect_error(pto("run", tmp_path), "is a folder")
    (tmp_path / "a_file").write_text("x")
    expect_error(pto("run", model, "--output-dir", tmp_path / "a_file"), "a_file")
    unknown_op = tmp_path / "op.onnx"
    x = helper.make_tensor_value_info("x", TP.FLOAT, [2])
    save_model(unknown_op, [helper.make_node("NoSuchOp", ["x"], ["y"], name="n0")], [x],
               [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    expect_error(pto("run", unknown_op), "NoSuchOp", "n0")


def conv_bn_relu_model(path):
    """Conv -> BatchNormalization -> Relu: level 1 folds the BN, level 2 makes one kernel."""
    rng = np.random.default_rng(0)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(4, 3, 3, 3), "w"),
             numpy_helper.from_array(f(4), "scale"), numpy_helper.from_array(f(4), "bias"),
             numpy_helper.from_array(f(4), "mean"),
             numpy_helper.from_array(np.abs(f(4)) + 0.5, "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"],
                              name="bn"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    x = helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])
    return save_model(path, nodes, [x], [y], inits)


def test_compile_stats_levels(tmp_path):
    m = conv_bn_relu_model(tmp_path / "m.onnx")
    l0 = pto("compile", m, "--level", "0", "--stats")
    assert l0.returncode == 0, l0.stderr
    assert "kernels: 3 (0 fused)" in l0.stdout
    l2 = pto("compile", m, "--level", "2", "--stats")
    assert l2.returncode == 0, l2.stderr
    assert "nodes: 3 -> 2 after the passes" in l2.stdout
    assert "FoldBatchNorm" in l2.stdout
    assert "kernels: 1 (1 fused)" in l2.stdout


def test_compile_dump_after_and_tiles(tmp_path):
    m = conv_bn_relu_model(tmp_path / "m.onnx")
    r = pto("compile", m, "--dump-after", "FoldBatchNorm", "--dump-tiles")
    assert r.returncode == 0, r.stderr
    assert "// after FoldBatchNorm" in r.stderr and "BatchNormalization" not in r.stderr
    assert "kernel 0 [cpu] Conv+Relu: conv relu" in r.stdout
    env = pto("compile", m, env={"PTO_DUMP_AFTER": "FoldBatchNorm"})
    assert "// after FoldBatchNorm" in env.stderr
    expect_error(pto("compile", m, "--dump-after", "NoSuchPass"), "unknown pass 'NoSuchPass'")


def test_compile_lists_passes(tmp_path):
    listed = pto("compile", "--list-passes")
    assert listed.returncode == 0 and "FoldBatchNorm" in listed.stdout
    assert "level 2:" in listed.stdout


def test_compile_dump_tiles_shows_plans_and_pins(tmp_path):
    x = helper.make_tensor_value_info("x", TP.FLOAT, [37, 1000])
    y = helper.make_tensor_value_info("y", TP.FLOAT, [37, 1000])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Add", ["s", "b"], ["y"], name="add")]
    b = numpy_helper.from_array(np.linspace(-1, 1, 1000, dtype=np.float32), "b")
    m = save_model(tmp_path / "sig_bias.onnx", nodes, [x], [y], [b])
    r = pto("compile", m, "--dump-tiles")
    assert r.returncode == 0, r.stderr
    assert "tiling planner: L1d" in r.stdout
    assert "plan: tiles " in r.stdout and "working set" in r.stdout, r.stdout
    r = pto("compile", m, "--dump-tiles", "--tile", "y=5x96")
    assert r.returncode == 0, r.stderr
    assert "plan: tiles 88 of 5x96 (pinned), tail 2x40" in r.stdout, r.stdout
    expect_error(pto("compile", m, "--tile", "add=512x512"), "register r0")
    expect_error(pto("compile", m, "--tile", "nope=4x4"), "no tile kernel")
    expect_error(pto("compile", m, "--tile", "4xq"), "expected [KERNEL=]ROWSxCOLS", code=2)


def test_run_and_check_sequence_and_optional_inputs(tmp_path):
    """`pto run` takes a sequence input as a list of .npy files or as ONNX test data (.pb), runs an
    optional input not given as empty, and writes a sequence output one file an element; the
    files equal onnxruntime's outputs. `pto check` compares a sequence element by element."""
    import onnxruntime as ort

    seq_in = helper.make_tensor_sequence_value_info("s", TP.FLOAT, [2, "n"])
    opt_in = helper.make_value_info(
        "o", helper.make_optional_type_proto(helper.make_tensor_type_proto(TP.FLOAT, [2])))
    nodes = [helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=1),
             helper.make_node("SplitToSequence", ["c"], ["parts"], axis=1, keepdims=1),
             helper.make_node("OptionalHasElement", ["o"], ["has"])]
    model = save_model(tmp_path / "seq.onnx", nodes, [seq_in, opt_in],
                       [helper.make_tensor_value_info("c", TP.FLOAT, [2, None]),
                        helper.make_tensor_sequence_value_info("parts", TP.FLOAT, [2, 1]),
                        helper.make_tensor_value_info("has", TP.BOOL, [])], opset=18)
    rng = np.random.default_rng(0)
    items = [rng.standard_normal((2, 3)).astype(np.float32),
             rng.standard_normal((2, 2)).astype(np.float32)]
    for k, a in enumerate(items):
        np.save(tmp_path / f"a{k}.npy", a)
    (tmp_path / "s.pb").write_bytes(numpy_helper.from_list(items, "s").SerializeToString())
    (tmp_path / "o.pb").write_bytes(
        numpy_helper.from_optional(np.ones(2, np.float32), "o").SerializeToString())
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def check_outputs(out_dir, optional):
        c, parts, has = session.run(None, {"s": items, "o": optional})
        np.testing.assert_allclose(np.load(out_dir / "c.npy"), c, rtol=1e-6)
        for k, part in enumerate(parts):
            np.testing.assert_allclose(np.load(out_dir / f"parts_{k}.npy"), part, rtol=1e-6)
        assert not (out_dir / f"parts_{len(parts)}.npy").exists()
        assert np.load(out_dir / "has.npy") == has

    r = pto("run", model, "--input", f"s={tmp_path / 'a0.npy'},{tmp_path / 'a1.npy'}",
            "--output-dir", tmp_path / "list")
    assert r.returncode == 0, r.stderr
    assert "input  o: none" in r.stdout and "output parts: a sequence of 5" in r.stdout
    check_outputs(tmp_path / "list", None)

    r = pto("run", model, "--input", f"s={tmp_path / 's.pb'}", "--input",
            f"o={tmp_path / 'o.pb'}", "--output-dir", tmp_path / "pb")
    assert r.returncode == 0, r.stderr
    check_outputs(tmp_path / "pb", np.ones(2, np.float32))

    r = pto("check", model, "--input", f"s={tmp_path / 's.pb'}")
    assert r.returncode == 0, r.stderr
    assert "parts[4]" in r.stdout and "compared 7 of 7 values" in r.stdout

    r = pto("run", model)
    assert r.returncode == 1
    assert "input 's': a sequence of tensors; give it with --input s=a.npy,b.npy" in r.stderr
    r = pto("run", model, "--input", f"s={tmp_path / 'a0.npy'},")
    assert r.returncode == 1 and "an empty file name in the list" in r.stderr
    r = pto("bench", model, "--input", f"s={tmp_path / 's.pb'}", "--compare", "onnxruntime")
    assert r.returncode != 0 and "input 's' is a sequence" in r.stderr
