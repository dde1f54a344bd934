#!/usr/bin/env python3
"""Tree ensembles (ai.onnx.ml TreeEnsembleRegressor / TreeEnsembleClassifier, as skl2onnx exports
scikit-learn's forests) on PyPTO's CPU kernel against ONNX Runtime, in one process.

    python bench/ml_trees.py [--trees 100] [--depth 8] [--rows 10000] [--features 20]
                             [--threads 1,2] [--rounds 7] [--quick] [--json FILE]

The forest is a scikit-learn RandomForestRegressor (and a 3-class RandomForestClassifier) of
--trees trees of --depth levels fitted on random data, exported by skl2onnx (zipmap off). Engines
are timed interleaved in --rounds rounds (each the median of a burst of calls; the best round is
reported) at each thread count (PTO_NUM_THREADS / pypto.set_num_threads, onnxruntime's
intra_op_num_threads). Reported: ms a call for each engine, PyPTO's time / ORT's, the outputs'
largest difference, and the load average before and after (/proc/loadavg).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import pypto  # noqa: E402


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


def export(kind: str, trees: int, depth: int, features: int, path: Path):
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from skl2onnx import to_onnx
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, features)).astype(np.float32)
    if kind == "regressor":
        model = RandomForestRegressor(trees, max_depth=depth, random_state=0, n_jobs=1)
        model.fit(x, x[:, 0] * 2 + np.sin(x[:, 1] * 3) + rng.standard_normal(len(x)) * 0.3)
        onx = to_onnx(model, x[:1])
    else:
        model = RandomForestClassifier(trees, max_depth=depth, random_state=0, n_jobs=1)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 0.7)
        model.fit(x, y)
        onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}})
    path.write_bytes(onx.SerializeToString())
    return onx.graph.input[0].name


def burst(f, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(kind, args, threads, tmp):
    path = Path(tmp) / f"{kind}.onnx"
    name = export(kind, args.trees, args.depth, args.features, path)
    x = np.random.default_rng(1).standard_normal((args.rows, args.features)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    pypto.set_num_threads(threads)
    exe = pypto.onnx.load(str(path))
    backends = sorted({b for _, b in exe._compiled.node_backends})
    want = sess.run(None, {name: x})
    got = exe(**{name: x})
    got = got if isinstance(got, (list, tuple)) else [got]
    diff = max(float(np.abs(np.asarray(g, np.float64) - w).max()) for g, w in zip(got, want))
    engines = {"pypto": lambda: exe(**{name: x}), "ort": lambda: sess.run(None, {name: x})}
    best = {k: float("inf") for k in engines}
    for _ in range(args.rounds):
        for k, f in engines.items():
            best[k] = min(best[k], burst(f, args.calls))
    return {"model": kind, "threads": threads, "rows": args.rows, "trees": args.trees,
            "depth": args.depth, "pypto_ms": best["pypto"] * 1e3, "ort_ms": best["ort"] * 1e3,
            "ratio": best["pypto"] / best["ort"], "max_abs_diff": diff, "backends": backends}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", type=int, default=100)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="10 trees, 1000 rows, 2 rounds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.trees, args.rows, args.rounds, args.calls = 10, 1000, 2, 2
    before = loadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ["regressor", "classifier"]:
            for t in [int(v) for v in args.threads.split(",")]:
                r = bench(kind, args, t, tmp)
                results.append(r)
                print(f"{kind:10s} {r['trees']} trees depth {r['depth']} x {r['rows']} rows, "
                      f"{t} thread(s): pypto {r['pypto_ms']:.2f} ms ({'/'.join(r['backends'])}), "
                      f"ort {r['ort_ms']:.2f} ms, pypto/ort {r['ratio']:.2f}, "
                      f"max |diff| {r['max_abs_diff']:.2g}", flush=True)
    after = loadavg()
    print(f"load average (1 min) before {before}, after {after}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "loadavg_before": before,
                                               "loadavg_after": after}, indent=1))


if __name__ == "__main__":
    main()
