#!/usr/bin/env python3
"""One ONNX file through both engines' profilers, 1 thread: where onnxruntime and PyPTO spend a
call, kernel by kernel (docs/zoo_speed.md's op-by-op tables).

    python bench/zoo_profile.py /tmp/zoo_onnx/levit_128s.onnx --level 3 [--runs 10] [--top 15]
    python bench/zoo_profile.py FILE.onnx --json /tmp/prof.json    # every kernel and node

onnxruntime: SessionOptions.enable_profiling (ORT_ENABLE_ALL, 1 thread), its "Node" events.
PyPTO: pypto.profiler.profile(record_shapes=True) around pypto.onnx.load(FILE, level). Each
engine runs --runs times after 2 warm-up calls; every kernel / node keeps its minimum over the
runs (a shared machine preempts single runs). Prints the totals by ORT op and by PyPTO kernel
kind, then the top kernels of each with their input shapes. Inputs are random (integer inputs in
[0, 1000)); symbolic dimensions are 1.

The graphs differ after fusion (ORT keeps activations as nodes and runs convolutions in NCHWc;
PyPTO fuses epilogues), so compare kernels by what they compute: the shapes and source nodes
say which ONNX nodes each one covers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("PTO_NUM_THREADS", "1")
# This checkout's package, as bench/zoo_speed.py finds it (PYTHONPATH still wins when set).
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import pypto  # noqa: E402


def feeds_for(sess) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = (rng.integers(0, 1000, shape) if "int64" in i.type
                         else rng.standard_normal(shape).astype(np.float32))
    return feeds


def ort_profile(path: str, runs: int, prefix: str) -> tuple[dict, dict, float]:
    """{(node, op): min ms}, {(node, op): input shapes}, min ms of a model_run."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = prefix
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = feeds_for(sess)
    for _ in range(2 + runs):
        sess.run(None, feeds)
    trace = sess.end_profiling()
    with open(trace) as f:
        events = json.load(f)
    os.unlink(trace)
    model_runs = [e for e in events if e.get("name") == "model_run"]
    start = model_runs[2]["ts"]  # after the warm-up calls
    durations, shapes = defaultdict(list), {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            key = (e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?"))
            durations[key].append(e["dur"] / 1e3)
            shapes[key] = [list(s.values())[0] for s in e["args"].get("input_type_shape", [])]
    call = min(e["dur"] for e in model_runs[2:]) / 1e3
    return {k: min(v) for k, v in durations.items()}, shapes, call


def pypto_profile(path: str, level: int, runs: int, feeds: dict) -> tuple[dict, float]:
    """{(kernel, input shapes, source nodes): min ms}, min ms of a call."""
    exe = pypto.onnx.load(path, level=level)
    for _ in range(2):
        exe(**feeds)
    best: dict = {}
    calls = []
    for _ in range(runs):
        with pypto.profiler.profile(record_shapes=True) as prof:
            exe(**feeds)
        for r in prof.key_averages(group_by_input_shape=True):
            if r.kind == "call":
                calls.append(r.cpu_time_total / 1e3)
            elif r.kind == "kernel":
                key = (r.key, r.input_shapes, tuple(r.source_ops))
                best[key] = min(best.get(key, float("inf")), r.self_cpu_time_total / 1e3)
    return best, min(calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="an ONNX file (bench/zoo_speed.py --keep writes the zoo's)")
    ap.add_argument("--level", type=int, default=2, choices=range(4), help="PyPTO level")
    ap.add_argument("--runs", type=int, default=10, help="profiled calls per engine (default 10)")
    ap.add_argument("--top", type=int, default=15, help="kernels listed per engine (default 15)")
    ap.add_argument("--json", help="write every kernel and node to this file")
    a = ap.parse_args()
    if a.runs < 1 or a.top < 0:
        ap.error("--runs must be at least 1 and --top at least 0")
    if not os.path.isfile(a.model):
        ap.error(f"no such file: {a.model}")
    prefix = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"zoo_profile_{os.getpid()}")
    nodes, shapes, ort_call = ort_profile(a.model, a.runs, prefix)
    sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
    kernels, pto_call = pypto_profile(a.model, a.level, a.runs, feeds_for(sess))

    by_op, by_kernel = Counter(), Counter()
    for (_, op), t in nodes.items():
        by_op[op] += t
    for (key, _, _), t in kernels.items():
        by_kernel[key.split(" ")[0]] += t  # "ConvBlocked+Relu [winograd]" -> its rule
    name = os.path.basename(a.model)
    print(f"{name}, PyPTO level {a.level}, 1 thread, minimum of {a.runs} runs; load "
          f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(f"  onnxruntime: nodes {sum(nodes.values()):.3f} ms, model_run {ort_call:.3f} ms")
    print(f"  pypto:       kernels {sum(kernels.values()):.3f} ms, call {pto_call:.3f} ms")
    print("by onnxruntime op (ms):")
    for op, t in by_op.most_common(a.top):
        print(f"  {op:30s} {t:8.3f}")
    print("by PyPTO kernel (ms):")
    for k, t in by_kernel.most_common(a.top):
        print(f"  {k:30s} {t:8.3f}")
    print("top PyPTO kernels: ms, kernel, input shapes, source nodes")
    for (key, shp, src), t in sorted(kernels.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {t:7.3f} {key[:36]:36s} {shp[:80]:80s} {', '.join(src[:2])}")
    print("top onnxruntime nodes: ms, op, node, input shapes")
    for (node, op), t in sorted(nodes.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {t:7.3f} {op:22s} {node[:50]:50s} {json.dumps(shapes[(node, op)])[:80]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ort": [{"node": n, "op": op, "ms": t, "shapes": shapes[(n, op)]}
                               for (n, op), t in nodes.items()],
                       "pypto": [{"kernel": k, "shapes": s, "sources": list(src), "ms": t}
                                 for (k, s, src), t in kernels.items()],
                       "ort_call_ms": ort_call, "pypto_call_ms": pto_call}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
