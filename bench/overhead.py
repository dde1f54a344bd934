"""Per-call overhead: graphs of ten tiny ops, PyPTO against ONNX Runtime (issue 14).

The ONNX models are built in a temporary folder (never kept):

  tiny10   10 elementwise ops on a [1, 64] tensor (Relu, Add, Mul, Sigmoid, Sub, Tanh, ...):
           one fused tile kernel at level 2 (onnx.helper)
  small10  10 ops PyPTO cannot fuse into one kernel, with symbolic shape arithmetic: MatMul,
           Add, LayerNormalization, Shape -> Gather -> Concat -> Reshape, Transpose, Softmax,
           ReduceMean on x[n, 64] (run with n = 1; onnx.helper)
  audio    a streaming-audio model in torch, exported with torch.onnx.export (dynamo=False,
           which writes the GRU op): 512 samples [1, 1, 512] and the GRU state [1, 1, 64] in,
           Conv1d(1, 32, 16, stride 8) + ReLU, Conv1d(32, 64, 3, stride 2) + ReLU, GRU(64, 64)
           over the 32 frames, Linear(64, 16); the frames' outputs and the new state out
  lstm     throughput: one LSTM(256, 256) layer over 100 steps of batch 8 (torch.onnx.export);
           fewer calls per block (each call is milliseconds)

and each is timed per call (the median of every call of interleaved rounds, each call timed on
its own, after warm-up) through:

  ort            onnxruntime InferenceSession.run (numpy in and out)
  ort_ortvalue   InferenceSession.run_with_ort_values on OrtValues made once (its Python-level
                 checks cost ~30 us a call in onnxruntime 1.32)
  ort_binding    the same through the session's C binding, sess._sess.run_with_ort_values (a
                 private API with no checks: ORT's floor from Python)
  onnx_numpy     pypto.onnx.load(...)(x) with a numpy array (an OnnxModel)
  run_numpy      CompiledGraph.run([x], like="numpy")
  run_torch      CompiledGraph.run([x]) with a torch tensor (torch tensors out)
  optimize       pypto.optimize of the equivalent torch module, called with a torch tensor
  eager          that torch module, eagerly, under torch.no_grad (for scale)
  cpp            `build/pto bench` on the same file: Executable::run from C++, p50 of its runs
                 (in a child process, right after the Python rounds)

for threads 1 and 2 (PyPTO's pool and ORT's intra-op threads; torch.set_num_threads for the
torch engines). Ratios are against `ort` of the same run and thread count (> 1: slower than ORT).

    PY=~/.cache/pypto/venv/bin/python
    PYTHONPATH=$PWD/python $PY bench/overhead.py                 # ~1 min
    PYTHONPATH=$PWD/python $PY bench/overhead.py --threads 1 --models tiny10 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_tiny10(path: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(np.linspace(-0.5, 0.5, 64, dtype=np.float32).reshape(1, 64), "c")
    ops = ["Relu", "Add", "Mul", "Sigmoid", "Sub", "Tanh", "Add", "Mul", "Relu", "Add"]
    nodes, prev = [], "x"
    for i, op in enumerate(ops):
        out = "y" if i == len(ops) - 1 else f"v{i}"
        ins = [prev] if op in ("Relu", "Sigmoid", "Tanh") else [prev, "c"]
        nodes.append(helper.make_node(op, ins, [out]))
        prev = out
    g = helper.make_graph(nodes, "tiny10",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [c])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def build_small10(path: str) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32) * 0.1, "b"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 64).astype(np.float32), "g"),
        numpy_helper.from_array(rng.standard_normal(64).astype(np.float32) * 0.1, "be"),
        numpy_helper.from_array(np.array([0], np.int64), "z"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
        numpy_helper.from_array(np.array([32], np.int64), "n32"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W"], ["a"]),
        n("Add", ["a", "b"], ["a2"]),
        n("LayerNormalization", ["a2", "g", "be"], ["l"], axis=-1),
        n("Shape", ["l"], ["s"]),
        n("Gather", ["s", "z"], ["s0"], axis=0),
        n("Concat", ["s0", "n32", "m1"], ["ns"], axis=0),
        n("Reshape", ["l", "ns"], ["r"]),
        n("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        n("Softmax", ["t"], ["sm"], axis=-1),
        n("ReduceMean", ["sm", "m1"], ["y"], keepdims=1),
    ]
    g = helper.make_graph(nodes, "small10",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)


class AudioNet:
    """The streaming-audio model: a torch module built from seed 0 (see the module docstring)."""

    def __new__(cls):
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = torch.nn.Conv1d(1, 32, 16, stride=8, padding=4)
                self.conv2 = torch.nn.Conv1d(32, 64, 3, stride=2, padding=1)
                self.gru = torch.nn.GRU(64, 64, batch_first=True)
                self.out = torch.nn.Linear(64, 16)

            def forward(self, audio, h):
                f = torch.relu(self.conv2(torch.relu(self.conv1(audio))))  # [1, 64, 32]
                y, h = self.gru(f.transpose(1, 2), h)
                return self.out(y), h

        torch.manual_seed(0)
        return Net().eval()


def lstm_net():
    import torch

    torch.manual_seed(0)
    return torch.nn.LSTM(256, 256).eval()


# name -> (the torch module, its example inputs as numpy arrays in graph-input order)
TORCH_MODELS = {
    "audio": (AudioNet, lambda rng: [rng.standard_normal((1, 1, 512)).astype(np.float32),
                                     rng.standard_normal((1, 1, 64)).astype(np.float32) * 0.1]),
    "lstm": (lstm_net, lambda rng: [rng.standard_normal((100, 8, 256)).astype(np.float32)]),
}


def build_torch(name: str, path: str) -> None:
    import warnings

    import torch

    xs = [torch.from_numpy(x) for x in TORCH_MODELS[name][1](np.random.default_rng(1))]
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(TORCH_MODELS[name][0](), tuple(xs), path, dynamo=False,
                          opset_version=17)


def torch_module(name: str, path: str):
    """The torch module computing what the ONNX file does (weights read from the file, or the
    exported module made again from the same seed)."""
    if name in TORCH_MODELS:
        return TORCH_MODELS[name][0]()
    import onnx
    import torch
    from onnx import numpy_helper

    w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
         for t in onnx.load(path).graph.initializer}

    class Tiny10(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", w["c"])

        def forward(self, x):
            c = self.c
            y = torch.sigmoid((torch.relu(x) + c) * c) - c
            return torch.relu((torch.tanh(y) + c) * c) + c

    class Small10(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k in ("W", "b", "g", "be"):
                self.register_buffer(k, w[k])

        def forward(self, x):
            a = torch.nn.functional.layer_norm(x @ self.W + self.b, (64,), self.g, self.be)
            t = a.reshape(a.shape[0], 32, -1).transpose(1, 2)
            return torch.softmax(t, dim=-1).mean(dim=-1, keepdim=True)

    return (Tiny10 if name == "tiny10" else Small10)().eval()


def timed(fn, calls: int) -> list[float]:
    """Seconds of each of `calls` calls (each timed alone: on a shared machine a call the
    scheduler interrupts is one outlier, not a slower block)."""
    clock = time.perf_counter
    out = []
    for _ in range(calls):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def cpp_p50(pto: str, model: str, threads: int, iterations: int) -> float | None:
    """p50 seconds of `pto bench` (Executable::run from C++), or None without the binary."""
    if not os.path.exists(pto):
        return None
    out = subprocess.run([pto, "bench", model, "--threads", str(threads), "--warmup",
                          str(min(1000, iterations)),
                          "--iterations", str(iterations)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PTO_PROGRESS": "0"}).stdout
    m = re.search(r"p50 ([0-9.]+)", out)
    return float(m.group(1)) * 1e-3 if m else None


def measure(name: str, path: str, threads: int, rounds: int, calls: int, pto: str) -> dict:
    import onnxruntime as ort
    import torch

    import pypto

    pypto.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(1)
    xs = (TORCH_MODELS[name][1](rng) if name in TORCH_MODELS
          else [rng.standard_normal((1, 64)).astype(np.float32)])
    xts = [torch.from_numpy(x.copy()) for x in xs]

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    feeds = dict(zip(in_names, xs))
    ort_feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    c_feeds = {k: v._get_c_value() for k, v in ort_feeds.items()}
    out_names = [o.name for o in sess.get_outputs()]

    model = pypto.onnx.load(path)
    compiled = model._compiled
    module = torch_module(name, path)
    def first(out):  # the first output, as numpy
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.numpy() if isinstance(out, torch.Tensor) else np.asarray(out)

    with torch.no_grad():
        fast = pypto.optimize(module, tuple(xts))
        want = first(module(*xts))
    got = {
        "ort": first(sess.run(None, feeds)),
        "onnx_numpy": first(model(*xs)),
        "optimize": first(fast(*xts)),
    }
    for k, v in got.items():  # the engines compute the same thing
        if not np.allclose(v, want, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"{name}: {k} differs from eager torch by "
                             f"{np.abs(v - want).max():.3g}")

    def no_grad(fn):
        def call():
            with torch.no_grad():
                fn()
        return call

    engines = {
        "ort": lambda: sess.run(None, feeds),
        "ort_ortvalue": lambda: sess.run_with_ort_values(out_names, ort_feeds),
        "ort_binding": lambda: sess._sess.run_with_ort_values(c_feeds, out_names, None),
        "onnx_numpy": lambda: model(*xs),
        "run_numpy": lambda: compiled.run(xs, like="numpy"),
        "run_torch": lambda: compiled.run(xts),
        "optimize": lambda: fast(*xts),  # records no autograd graph: no torch.no_grad needed
        "eager": no_grad(lambda: module(*xts)),
    }
    samples = {k: [] for k in engines}
    for fn in engines.values():  # warm-up
        timed(fn, calls)
    for _ in range(rounds):  # interleaved: each round times every engine once
        for k, fn in engines.items():
            samples[k] += timed(fn, calls)
    res = {k: statistics.median(v) for k, v in samples.items()}
    res["cpp"] = cpp_p50(pto, path, threads, max(calls * rounds, 2000 if calls >= 100 else 0))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny10,small10,audio,lstm")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=400, help="calls per timed block")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--pto", default=os.path.join(ROOT, "build", "pto"),
                    help="the pto binary for the C++ column (default: this clone's build/pto)")
    a = ap.parse_args()
    builders = {"tiny10": build_tiny10, "small10": build_small10,
                **{k: (lambda path, k=k: build_torch(k, path)) for k in TORCH_MODELS}}
    results = []
    with tempfile.TemporaryDirectory(prefix="pto_overhead_") as tmp:
        for name in a.models.split(","):
            path = os.path.join(tmp, f"{name}.onnx")
            builders[name](path)
            for threads in (int(t) for t in a.threads.split(",")):
                calls = a.calls if name != "lstm" else max(a.calls // 100, 3)
                r = measure(name, path, threads, a.rounds, calls, a.pto)
                results.append({"model": name, "threads": threads, "us": {
                    k: (v * 1e6 if v is not None else None) for k, v in r.items()}})
    import onnxruntime as ort
    import torch

    print(f"per-call latency, us (median of {a.rounds} interleaved rounds x {a.calls} calls; "
          f"cpp: pto bench p50); x = ratio to ort of the same run; onnxruntime {ort.__version__}, "
          f"torch {torch.__version__}")
    keys = list(results[0]["us"])
    print(f"{'model':8} {'thr':>3} " + " ".join(f"{k:>17}" for k in keys))
    for r in results:
        base = r["us"]["ort"]
        cells = []
        for k in keys:
            v = r["us"][k]
            cells.append(f"{'-':>17}" if v is None else f"{v:8.2f} ({v / base:5.2f}x)")
        print(f"{r['model']:8} {r['threads']:>3} " + " ".join(cells))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
