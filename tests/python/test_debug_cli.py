"""`pto check`, `pto bench` and PTO_VERIFY_PASSES, run as a user would, on small ONNX models made
here with onnx.helper. `pto check`'s numbers are checked against a fault of known size
(PTO_TEST_PERTURB_VALUE adds 1 to one kernel's output); `pto bench`'s fields against each other and
the options; the progress bar under a pseudo-terminal. Run with:
    PTO_BIN=build/pto ~/.cache/pypto/venv/bin/python -m pytest tests/python/test_debug_cli.py
"""

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from test_cli import PTO, expect_error, pto


def conv_model(path, batch="N"):
    """x[batch, 3, 8, 8] -> Conv(4) -> Relu -> Conv(8) -> Add(bias) -> Relu -> GlobalAveragePool
    -> Flatten -> Gemm(5) -> Softmax; every node has a name and its own output value."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
             for n, s in [("w1", (4, 3, 3, 3)), ("w2", (8, 4, 3, 3)), ("b2", (1, 8, 1, 1)),
                          ("wf", (5, 8)), ("bf", (5,))]]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "b2"], ["a2"], "add2"),
        helper.make_node("Relu", ["a2"], ["r2"], "relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], "pool"),
        helper.make_node("Flatten", ["p"], ["f"], "flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["g"], "fc", transB=1),
        helper.make_node("Softmax", ["g"], ["y"], "softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "convnet",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [batch, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def rows(stdout):
    """`pto check`'s table: value -> (max abs, max rel, mismatches)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"(\S+) +(\S+) +(\S+) +\w+\[[\d, ]*\] +(\d\.\d\de[+-]\d\d) +"
                     r"(\d\.\d\de[+-]\d\d) +(\d+)", line)
        if m:
            out[m.group(3)] = (float(m.group(4)), float(m.group(5)), int(m.group(6)))
    return out


# ---- pto check ----

@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_check_passes_a_correct_model_at_every_level(tmp_path, level):
    m = conv_model(tmp_path / "m.onnx")
    r = pto("check", m, "--level", level, "--dim", "N=2")
    assert r.returncode == 0, r.stderr
    assert f"level {level}" in r.stdout and "ok: every compared value is within tolerance" in r.stdout
    table = rows(r.stdout)
    assert "y" in table  # the graph output is always compared
    if level == 0:  # nothing fused: every node's value
        assert set(table) == {"c1", "r1", "c2", "a2", "r2", "p", "f", "g", "y"}
    for abs_err, rel_err, bad in table.values():
        assert bad == 0 and abs_err < 1e-4


def test_check_names_the_first_broken_kernel(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    # Level 0: each node is a kernel; relu1's output comes back 1 too large.
    r = pto("check", m, "--level", "0", env={"PTO_TEST_PERTURB_VALUE": "r1"})
    expect_error(r, "the first is at node 'relu1' (Relu), value 'r1'", "max abs error 1,",
                 code=1)
    table = rows(r.stdout)
    assert table["c1"][2] == 0  # before the fault: fine
    assert abs(table["r1"][0] - 1.0) < 1e-6 and table["r1"][2] == 4 * 8 * 8  # exactly +1
    assert table["c2"][2] > 0  # after it: everything downstream differs, but is not named
    assert "<- beyond tolerance" in r.stdout
    # Level 2: the fault in the fused Conv+Add+Relu kernel is named by that kernel's output.
    r = pto("check", m, "--level", "2", env={"PTO_TEST_PERTURB_VALUE": "r2"})
    expect_error(r, "node 'relu2' (Relu), value 'r2'", code=1)


def test_check_tolerances_have_an_effect(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    env = {"PTO_TEST_PERTURB_VALUE": "y"}  # softmax output + 1: an error of exactly 1
    expect_error(pto("check", m, "--level", "0", env=env), "value 'y'", code=1)
    assert pto("check", m, "--level", "0", "--atol", "1.01", env=env).returncode == 0
    # rtol alone: |d| = 1 <= rtol * |y| needs rtol >= 1 / min(y); y is a probability > 0.
    assert pto("check", m, "--level", "0", "--rtol", "1e6", env=env).returncode == 0


def test_check_inputs_from_files_and_errors(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = pto("check", m, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0 and "f32[3, 3, 8, 8]" in r.stdout, r.stderr
    expect_error(pto("check"), "no model file", code=2)
    expect_error(pto("check", m, "--rtol", "abc"), "--rtol", code=2)
    expect_error(pto("check", m, "--atol", "-1"), "--atol", code=2)
    expect_error(pto("check", m, "--level", "4"), "--level", code=2)
    expect_error(pto("check", tmp_path / "missing.onnx"), "missing.onnx", code=1)
    expect_error(pto("check", m, "--input", "z=1.npy"), "no input named 'z'", code=1)
    expect_error(pto("check", m, env={"PTO_TEST_PERTURB_VALUE": "nope"}), "no value 'nope'")
    assert "usage: pto check" in pto("check", "--help").stdout


def test_check_compares_level3_blocked_values_in_nchw(tmp_path):
    m = bn_model(tmp_path / "bn.onnx")
    r = pto("check", m, "--level", "3", "--dim", "N=2")
    assert r.returncode == 0, r.stderr
    # At level 3 relu1's output exists only as r1_blocked, f32[N, 2, 14, 14, 16]; it is compared
    # after being turned back into f32[2, 32, 14, 14].
    assert re.search(r"relu1 +Relu +r1 +f32\[2, 32, 14, 14\]", r.stdout), r.stdout
    assert rows(r.stdout)["r1"][2] == 0
    r = pto("check", m, "--level", "3", env={"PTO_TEST_PERTURB_VALUE": "r1_blocked"})
    expect_error(r, "node 'relu1' (Relu), value 'r1'", code=1)


# ---- PTO_VERIFY_PASSES ----

def bn_model(path):
    """x[N, 16, 14, 14] -> Conv(32) -> BatchNormalization -> Relu -> Conv(32) -> Relu: FoldBatchNorm
    and (level 3) AssignLayouts both rewrite it."""
    rng = np.random.default_rng(0)
    c = 32
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.standard_normal((c, 16, 3, 3)) * 0.1),
        ("w2", rng.standard_normal((c, c, 3, 3)) * 0.1), ("s", rng.uniform(0.5, 1.5, c)),
        ("b", rng.standard_normal(c) * 0.1), ("m", rng.standard_normal(c) * 0.1),
        ("v", rng.uniform(0.5, 2, c))]]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"], "bn1"),
             helper.make_node("Relu", ["n1"], ["r1"], "relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], "relu2")]
    graph = helper.make_graph(
        nodes, "bn", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 16, 14, 14])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["N", c, 14, 14])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_verify_passes_on_a_model(tmp_path):
    m = bn_model(tmp_path / "bn.onnx")
    r = pto("compile", m, "--level", "3", env={"PTO_VERIFY_PASSES": "1", "PTO_LOG": "info"})
    assert r.returncode == 0, r.stderr
    verified = re.findall(r"PTO_VERIFY_PASSES: pass (\w+): outputs unchanged", r.stderr)
    # Only the passes that rewrote the graph are rerun.
    assert verified == ["FoldBatchNorm", "AssignLayouts"], r.stderr
    # Within zero tolerance, folding BatchNorm into the weights changes rounding: it is named.
    r = pto("compile", m, env={"PTO_VERIFY_PASSES": "1", "PTO_VERIFY_PASSES_RTOL": "0",
                               "PTO_VERIFY_PASSES_ATOL": "0"})
    expect_error(r, "PTO_VERIFY_PASSES: pass FoldBatchNorm, output 'y': changed the result "
                    "beyond tolerance (rtol 0, atol 0): max abs error")
    # The check runs inside pto check as well, before anything is compared.
    assert pto("check", m, "--level", "3", env={"PTO_VERIFY_PASSES": "1"}).returncode == 0
    expect_error(pto("compile", m, env={"PTO_VERIFY_PASSES": "on"}), "PTO_VERIFY_PASSES")
    expect_error(pto("compile", m, env={"PTO_VERIFY_PASSES": "1",
                                        "PTO_VERIFY_PASSES_RTOL": "x"}), "PTO_VERIFY_PASSES_RTOL")


# ---- pto bench ----

LATENCY = re.compile(r"latency: +mean ([\d.]+) ms, min ([\d.]+), p50 ([\d.]+), p90 ([\d.]+), "
                     r"p99 ([\d.]+), max ([\d.]+) \((\d+) runs\)")
THROUGHPUT = re.compile(r"throughput: ([\d.]+) inferences/s \(([\d.]+) runs/s x batch (\d+)\)")


def check_timing(text, runs, batch):
    lat = [tuple(map(float, m)) for m in LATENCY.findall(text)]
    thr = [tuple(map(float, m)) for m in THROUGHPUT.findall(text)]
    assert lat and len(lat) == len(thr), text
    for (mean, mn, p50, p90, p99, mx, n), (ips, rps, b) in zip(lat, thr):
        assert n == runs and b == batch
        assert 0 < mn <= p50 <= p90 <= p99 <= mx and mn <= mean <= mx
        assert abs(rps - 1000 / mean) <= 0.001 * rps + 0.05  # mean has 4+ significant digits
        assert abs(ips - rps * batch) <= 0.1 + 0.001 * ips
    return lat


def test_bench_reports_trtexec_fields(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    r = pto("bench", m, "--batch", "4", "--warmup", "2", "--iterations", "7", "--threads", "1",
            "--level", "3")
    assert r.returncode == 0, r.stderr
    assert "level 3, 1 threads, batch 4" in r.stdout
    assert "input  x: f32[4, 3, 8, 8] random" in r.stdout  # --batch rebound the symbolic N
    assert re.search(r"warm-up: +2 runs in", r.stdout)
    check_timing(r.stdout, 7, 4)
    mem = re.search(r"memory: +arena ([\d.]+) MiB planned .* process peak RSS ([\d.]+) MiB",
                    r.stdout)
    assert mem and float(mem.group(2)) > 1, r.stdout
    assert "\r" not in r.stderr and "#" not in r.stderr  # no progress bar off a terminal


def test_bench_batch_errors_and_usage(tmp_path):
    fixed = conv_model(tmp_path / "fixed.onnx", batch=2)
    expect_error(pto("bench", fixed, "--batch", "4", "--iterations", "1"),
                 "input 'x' has a fixed batch of 2", code=1)
    r = pto("bench", fixed, "--batch", "2", "--iterations", "3", "--warmup", "0")
    assert r.returncode == 0 and "batch 2" in r.stdout, r.stderr
    m = conv_model(tmp_path / "m.onnx")
    expect_error(pto("bench", m, "--batch", "2", "--dim", "N=3"), "disagree", code=2)
    expect_error(pto("bench", m, "--compare", "torch"), "--compare", code=2)
    expect_error(pto("bench", m, "--iterations", "0"), "--iterations", code=2)
    expect_error(pto("bench", m, "--batch", "0"), "--batch", code=2)
    expect_error(pto("bench"), "no model file", code=2)
    assert "--compare onnxruntime" in pto("bench", "--help").stdout


def test_bench_compares_with_onnxruntime(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    r = pto("bench", m, "--batch", "3", "--warmup", "1", "--iterations", "5", "--threads", "2",
            "--compare", "onnxruntime", env={"PTO_PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr
    import onnxruntime
    assert f"onnxruntime {onnxruntime.__version__} (CPU, ORT_ENABLE_ALL, 2 intra-op threads" \
        in r.stdout
    assert len(check_timing(r.stdout, 5, 3)) == 2  # ours and theirs
    assert re.search(r"ratio: +pypto p50 is [\d.]+x onnxruntime's speed", r.stdout)


def test_bench_compare_without_onnxruntime_is_a_clear_error(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    # A Python where `import onnxruntime` fails.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['onnxruntime'] = None\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    r = pto("bench", m, "--iterations", "2", "--compare", "onnxruntime",
            env={"PTO_PYTHON": str(wrapper)})
    expect_error(r, "onnxruntime is not installed", "scripts/setup.sh", code=1)
    r = pto("bench", m, "--iterations", "2", "--compare", "onnxruntime",
            env={"PTO_PYTHON": str(tmp_path / "no_such_python")})
    expect_error(r, "cannot run Python", code=1)


def test_bench_progress_bar_on_a_terminal(tmp_path):
    m = conv_model(tmp_path / "m.onnx")
    leader, follower = pty.openpty()
    env = dict(os.environ)
    env.pop("PTO_ISA", None)
    p = subprocess.run([str(PTO), "bench", str(m), "--warmup", "3", "--iterations", "20"],
                       stdout=subprocess.PIPE, stderr=follower, env=env, timeout=120)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert p.returncode == 0
    assert b"pypto [" in seen and b"] 20/20" in seen, seen
    assert b"\r" not in p.stdout  # the bar goes to the terminal, never into the results
