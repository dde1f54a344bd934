#!/usr/bin/env python3
"""Peak memory of one inference from an ONNX file: PyPTO (weights held once, and with
release_packed_weights off) against ONNX Runtime (ORT_ENABLE_ALL), each in a fresh process.

    python bench/memory.py [--models resnet50,bert] [--threads 1]

The files are run.py's exports (exported first when missing). Each child imports only its engine
and numpy, records its resident set after the imports (the baseline), loads the model, runs it
once and records its peak resident set: "model MiB" is peak minus baseline, what the model costs
in memory. The file's weight bytes are the floor for any engine that keeps them in fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "@@memory@@"
ENGINES = ["ort", "pypto", "pypto-keep"]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(engine: str, path: str, kind: str, threads: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "image":
        x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    else:
        x = rng.integers(0, 1000, (1, 128), dtype=np.int64)
    r: dict = {"engine": engine}
    if engine == "ort":
        import onnxruntime as ort

        r["baseline_mib"] = rss_mib()
        o = ort.SessionOptions()
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
        sess.run(None, {sess.get_inputs()[0].name: x})
    else:
        import pypto

        r["baseline_mib"] = rss_mib()
        pypto.set_num_threads(threads)
        pypto.set_optimization_options({"release_packed_weights": engine == "pypto"})
        model = pypto.onnx.load(path)
        model(x)
        s = model.stats(x.shape)
        r.update({k: s[k] for k in ("weight_bytes", "packed_weight_bytes",
                                    "released_weight_bytes", "peak_bytes")})
    r["peak_mib"] = peak_mib()
    r["model_mib"] = r["peak_mib"] - r["baseline_mib"]
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,bert")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", nargs=3, metavar=("ENGINE", "PATH", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(child(*args.child, args.threads)), flush=True)
        return 0

    sys.path.insert(0, str(HERE))
    import run as bench  # the benchmark's model list and ONNX cache

    rows = []
    for m in [s for s in args.models.split(",") if s]:
        if m not in bench.MODELS:
            ap.error(f"unknown model '{m}' (known: {', '.join(bench.MODELS)})")
        path = bench.onnx_path(m, 1)
        if not path.is_file():
            subprocess.run([sys.executable, str(HERE / "run.py"), "--threads", "1", "--child",
                            "export", "--model", m, "--batch", "1"], check=True,
                           stdout=subprocess.DEVNULL)
        file_weights = sum(f.stat().st_size for f in path.parent.iterdir()
                           if f.suffix in ("", ".onnx", ".data")) / 2**20
        row = {"model": m, "file_mib": file_weights}
        for e in ENGINES:
            p = subprocess.run([sys.executable, __file__, "--threads", str(args.threads),
                                "--child", e, str(path), bench.MODELS[m][1]],
                               capture_output=True, text=True, env=os.environ)
            out = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
            if p.returncode or not out:
                tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                row[e] = {"error": tail[:200]}
            else:
                row[e] = json.loads(out[-1][len(MARK):])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    def cell(r: dict) -> str:
        if "model_mib" not in r:
            return f"failed: {r['error']}"
        return f"{r['model_mib']:.0f} ({r['peak_mib']:.0f})"

    print(f"\nPeak memory of load + one run, batch 1, {args.threads} thread(s): MiB over each "
          "process's baseline after its imports (the whole process's peak RSS)\n")
    print("| model | ONNX file | ORT | PyPTO | PyPTO, weights kept | PyPTO packed / released |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        p = r["pypto"]
        extra = (f"{p['packed_weight_bytes'] / 2**20:.0f} / {p['released_weight_bytes'] / 2**20:.0f}"
                 if "packed_weight_bytes" in p else "-")
        print(f"| {r['model']} | {r['file_mib']:.0f} | {cell(r['ort'])} | {cell(p)} | "
              f"{cell(r['pypto-keep'])} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
