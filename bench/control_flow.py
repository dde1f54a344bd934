"""Compiled control flow: a Loop and a Scan whose bodies are real compute, PyPTO against ONNX
Runtime (docs/architecture.md, "Compiled control flow").

The ONNX models are built in a temporary folder (never kept):

  loop_mm   x = Relu(x @ w) 16 times (Loop with M = 16), x and w [256, 256], w an outer
            initializer the body captures
  scan_rnn  an RNN cell under Scan over 64 steps: h = Tanh(x_t @ wx + h @ wh + b), batch 16,
            input 128, hidden 256, every h stacked as a scan output
  scan_tiny a Scan over 1024 steps whose body is one 1-element Add (a running sum, every sum
            stacked): the per-step overhead, which the time per call divided by 1024 bounds

each timed per call (median and fastest of every call of interleaved rounds, after warm-up)
through:

  ort        onnxruntime InferenceSession.run
  compiled   pypto.onnx.load(...)(x): the node runs its compiled subgraph (CPU kernels)
  reference  `build/pto run --engine reference` (in a child process, after the Python rounds):
             the reference interpreter, which is how an Executable ran a control-flow node
             before subgraphs were compiled (the model is that one node)

Ratios are against `ort` of the same run (> 1: slower than ORT).

    PY=~/.cache/pypto/venv/bin/python
    PYTHONPATH=$PWD/python $PY bench/control_flow.py                # ~1 min
    PYTHONPATH=$PWD/python $PY bench/control_flow.py --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _save(path, nodes, inputs, outputs, inits):
    import onnx
    from onnx import helper

    g = helper.make_graph(nodes, os.path.basename(path), inputs, outputs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def build_loop_mm(path: str) -> dict:
    from onnx import TensorProto as T, helper, numpy_helper

    n, trips = 256, 16
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), "w")
    m = numpy_helper.from_array(np.array(trips, np.int64), "m")
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_in", "w"], ["xw"]),
         helper.make_node("Relu", ["xw"], ["x_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("x_in", T.FLOAT, [n, n])],
        [vi("cond_out", T.BOOL, []), vi("x_out", T.FLOAT, [n, n])])
    _save(path, [helper.make_node("Loop", ["m", "", "x"], ["y"], body=body)],
          [vi("x", T.FLOAT, [n, n])], [vi("y", T.FLOAT, [n, n])], [w, m])
    return {"x": rng.standard_normal((n, n)).astype(np.float32)}


def build_scan_rnn(path: str) -> dict:
    from onnx import TensorProto as T, helper, numpy_helper

    batch, inp, hidden, steps = 16, 128, 256, 64
    rng = np.random.default_rng(1)

    def init(name, *shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    inits = [init("wx", inp, hidden, scale=inp ** -0.5), init("wh", hidden, hidden,
                                                               scale=hidden ** -0.5),
             init("b", hidden, scale=0.1)]
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "wx"], ["xw"]),
         helper.make_node("MatMul", ["h_in", "wh"], ["hw"]),
         helper.make_node("Add", ["xw", "hw"], ["s"]),
         helper.make_node("Add", ["s", "b"], ["sb"]),
         helper.make_node("Tanh", ["sb"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y"])],
        "cell", [vi("h_in", T.FLOAT, [batch, hidden]), vi("x_t", T.FLOAT, [batch, inp])],
        [vi("h_out", T.FLOAT, [batch, hidden]), vi("y", T.FLOAT, [batch, hidden])])
    scan = helper.make_node("Scan", ["h0", "xs"], ["h", "ys"], body=body, num_scan_inputs=1)
    _save(path, [scan],
          [vi("h0", T.FLOAT, [batch, hidden]), vi("xs", T.FLOAT, [steps, batch, inp])],
          [vi("h", T.FLOAT, [batch, hidden]), vi("ys", T.FLOAT, [steps, batch, hidden])], inits)
    return {"h0": np.zeros((batch, hidden), np.float32),
            "xs": rng.standard_normal((steps, batch, inp)).astype(np.float32)}


def build_scan_tiny(path: str) -> dict:
    from onnx import TensorProto as T, helper

    steps = 1024
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "acc", [vi("s_in", T.FLOAT, [1]), vi("x_t", T.FLOAT, [1])],
        [vi("s_out", T.FLOAT, [1]), vi("y", T.FLOAT, [1])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)
    _save(path, [scan], [vi("s0", T.FLOAT, [1]), vi("xs", T.FLOAT, [steps, 1])],
          [vi("s", T.FLOAT, [1]), vi("ys", T.FLOAT, [steps, 1])], [])
    rng = np.random.default_rng(2)
    return {"s0": np.zeros(1, np.float32),
            "xs": rng.standard_normal((steps, 1)).astype(np.float32)}


MODELS = {"loop_mm": build_loop_mm, "scan_rnn": build_scan_rnn, "scan_tiny": build_scan_tiny}


def time_calls(fns: dict, rounds: int, calls: int) -> dict:
    """(median, fastest) seconds per call of each engine, rounds interleaved so load drifts hit
    all. On a loaded machine a call is often preempted once (a few ms): the fastest call is then
    the better view of the engines themselves."""
    times = {k: [] for k in fns}
    for f in fns.values():  # warm-up
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            for _ in range(calls):
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def reference_time(pto: str, path: str, feeds: dict, threads: int, repeat: int, tmp: str) -> float:
    """Median seconds of `pto run --engine reference` over `repeat` runs of the same inputs."""
    args = [pto, "run", path, "--engine", "reference", "--repeat", str(repeat), "--threads",
            str(threads)]
    for name, x in feeds.items():
        f = os.path.join(tmp, f"{name}.npy")
        np.save(f, x)
        args += ["--input", f"{name}={f}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    m = re.search(r"^run:\s+([\d.]+)\s*(ms|s|us)", out, re.M)
    if not m:
        raise RuntimeError(f"no run time in pto run's output:\n{out}")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5, help="calls per engine per round")
    ap.add_argument("--reference-repeat", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--pto", default=os.environ.get("PTO_BIN", os.path.join(ROOT, "build", "pto")))
    a = ap.parse_args()

    import onnxruntime as ort

    import pypto

    pypto.set_num_threads(a.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    print(f"threads {a.threads}, rounds {a.rounds} x {a.calls} calls; ms per call, median "
          f"(fastest); reference: median of {a.reference_repeat} runs")
    print(f"{'model':10} {'ort':>16} {'compiled':>16} {'reference':>10} {'comp/ort':>12} "
          f"{'ref/comp':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            path = os.path.join(tmp, f"{name}.onnx")
            feeds = MODELS[name](path)
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            model = pypto.onnx.load(path)
            want = sess.run(None, feeds)
            got = model(**feeds)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(np.asarray(g), w, rtol=1e-3, atol=1e-4)
            assert all(b == "cpu" for _, b in model._compiled.node_backends)
            engines = {"ort": lambda: sess.run(None, feeds), "compiled": lambda: model(**feeds)}
            t = time_calls(engines, a.rounds, a.calls)
            ref = reference_time(a.pto, path, feeds, a.threads, a.reference_repeat, tmp)
            (om, of), (cm, cf) = t["ort"], t["compiled"]
            print(f"{name:10} {om * 1e3:7.2f} ({of * 1e3:6.2f}) {cm * 1e3:7.2f} ({cf * 1e3:6.2f}) "
                  f"{ref * 1e3:10.1f} {cm / om:5.2f} ({cf / of:4.2f}) {ref / cm:9.1f}")


if __name__ == "__main__":
    main()
