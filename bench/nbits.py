#!/usr/bin/env python3
"""Weight-only 4- and 8-bit MatMul (onnxruntime's MatMulNBits, as onnxruntime-genai's int4 and
int8 LLM exports and MatMulNBitsQuantizer write it) against ONNX Runtime, and against the same
layer in float32, in one run with the machine's ceilings (docs/precision.md, "Weight-only 4- and
8-bit").

    python bench/nbits.py [--layers 4096x4096,4096x11008,11008x4096] [--rows 1,4,16,128]
                          [--bits 4|8] [--threads 1,2] [--rounds 5] [--quick] [--json FILE]

Each layer (K x N, 4-bit codes or 8 with --bits 8 (onnxruntime-genai's -p int8), block 32, uint8
zero points, random codes) is one MatMulNBits node; rows is
M, the tokens of a call (1: a decoding step; 128: a prompt). Each engine runs one model holding
--copies independent copies of the layer (other codes, the same input), so that, as an LLM's
layers do, the weights come from memory rather than the last-level cache; a call's time divided
by the copies is the time of one layer. Engines, timed interleaved in
rounds (each a burst of calls; the median call of a burst, the best burst of the rounds):
- pypto-nbits-acc0 / ort-nbits-acc0: the node at accuracy_level 0 (float32 products: PyPTO
  multiplies its 4-bit panels, onnxruntime dequantizes);
- pypto-nbits-acc4 / ort-nbits-acc4: accuracy_level 4 (A quantized to int8 per block, as both
  do it: integer dot products, VNNI);
- pypto-f32 / ort-f32: a float32 MatMul by the dequantized weight (what PyPTO ran before it
  read MatMulNBits natively, and what an unquantized model costs).
Each thread count runs in a child process of its own (PTO_NUM_THREADS, onnxruntime's
intra_op_num_threads). Reported: ms a call, the weight's GB/s (the bytes each engine's layout
streams: 4-bit codes + float scales + zero points, or float32) against the memory ceiling
(pto_bench's read kernel), the
GFLOP/s against the FMA ceiling (pto_bench, the same run), and PyPTO's time / ORT's at the
same accuracy level.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINES = ["pypto-nbits-acc0", "ort-nbits-acc0", "pypto-nbits-acc4", "ort-nbits-acc4", "pypto-f32",
           "ort-f32"]
BLOCK = 32


def layer(k: int, n: int, bits: int, seed: int = 0):
    """Codes, scales, packed zero points of a K x N layer of 4- or 8-bit codes, and its float32
    weight [K, N]."""
    import numpy as np
    rng = np.random.default_rng(seed)
    blocks = (k + BLOCK - 1) // BLOCK
    codes = rng.integers(0, 1 << bits, (n, blocks * BLOCK), dtype=np.uint8)
    zeros = rng.integers(0, 1 << bits, (n, blocks + (blocks & 1)), dtype=np.uint8)
    if bits == 4:  # two codes a byte, the first in the low nibble
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, blocks, BLOCK // 2)
        zp = (zeros[:, 0::2] | (zeros[:, 1::2] << 4)).reshape(-1)
    else:
        packed = codes.reshape(n, blocks, BLOCK)
        zp = np.ascontiguousarray(zeros[:, :blocks]).reshape(-1)
    scales = (rng.random((n, blocks), dtype=np.float32) * 0.01 + 0.001)
    w = ((codes[:, :k].astype(np.float32).reshape(n, -1)
          - np.repeat(zeros[:, :blocks], BLOCK, 1)[:, :k]) * np.repeat(scales, BLOCK, 1)[:, :k])
    return packed, scales.reshape(-1), zp, np.ascontiguousarray(w.T)


def save_models(tmp: str, k: int, n: int, bits: int, copies: int) -> dict:
    """The layer's models (nbits-acc0, nbits-acc4, f32), each with `copies` independent copies
    of the layer (other codes and scales) on the same input, outputs y0, y1, ...: one session a
    model, as an LLM's layers are, and weights beyond the last-level cache."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    layers = [layer(k, n, bits, seed) for seed in range(copies)]
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])
    ys = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n])
          for i in range(copies)]
    paths = {}
    for acc in (0, 4):
        nodes, inits = [], []
        for i, (packed, scales, zp, _) in enumerate(layers):
            nodes.append(helper.make_node("MatMulNBits", ["a", f"B{i}", f"S{i}", f"Z{i}"],
                                          [f"y{i}"], domain="com.microsoft", K=k, N=n, bits=bits,
                                          block_size=BLOCK, accuracy_level=acc))
            inits += [numpy_helper.from_array(packed, f"B{i}"),
                      numpy_helper.from_array(scales, f"S{i}"),
                      numpy_helper.from_array(zp, f"Z{i}")]
        g = helper.make_graph(nodes, "nbits", [a], ys, inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
        paths[f"nbits-acc{acc}"] = os.path.join(tmp, f"nbits_{k}x{n}_acc{acc}.onnx")
        onnx.save(m, paths[f"nbits-acc{acc}"])
    nodes = [helper.make_node("MatMul", ["a", f"W{i}"], [f"y{i}"]) for i in range(copies)]
    inits = [numpy_helper.from_array(w, f"W{i}") for i, (_, _, _, w) in enumerate(layers)]
    g = helper.make_graph(nodes, "f32", [a], ys, inits)
    paths["f32"] = os.path.join(tmp, f"f32_{k}x{n}.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), paths["f32"],
              save_as_external_data=sum(w.nbytes for *_, w in layers) > 1 << 30)
    packed, scales, zp, w = layers[0]
    paths["nbits_bytes"] = packed.nbytes + scales.nbytes + zp.nbytes
    paths["f32_bytes"] = w.nbytes
    return paths


def child(args) -> None:
    """One thread count: every layer, rows and engine, interleaved; JSON on stdout."""
    import numpy as np
    import onnxruntime as ort
    import pypto
    threads = args.child
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.layers.split(","):
            k, n = map(int, spec.split("x"))
            copies = args.copies
            if not copies:  # the quantized weights three times the last-level cache
                l3 = pypto.device_info()["l3_bytes"]
                quantized = k * n * args.bits // 8 + k // BLOCK * n * 5  # + scales, zero points
                copies = max(2, -(-3 * l3 // quantized))
            paths = save_models(tmp, k, n, args.bits, copies)
            runners = {}
            for e in args.engines.split(","):
                path = paths[e.split("-", 1)[1] if "nbits" in e else "f32"]
                if e.startswith("pypto"):
                    exe = pypto.onnx.load(path)
                    runners[e] = lambda x, exe=exe: exe(a=x)
                else:
                    so = ort.SessionOptions()
                    so.intra_op_num_threads = threads
                    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
                    runners[e] = lambda x, s=s: s.run(None, {"a": x})
            for m in map(int, args.rows.split(",")):
                x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
                ref = np.asarray(runners[next(iter(runners))](x)[0])
                best = {e: float("inf") for e in runners}
                err = {}
                for e, f in runners.items():
                    got = np.asarray(f(x)[0])
                    err[e] = float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-30))
                for _ in range(args.rounds):
                    for e, f in runners.items():
                        f(x)
                        ts = []
                        t_end = time.perf_counter() + args.burst
                        while len(ts) < 3 or (time.perf_counter() < t_end and len(ts) < 200):
                            t0 = time.perf_counter()
                            f(x)
                            ts.append(time.perf_counter() - t0)
                        # a call runs every copy: the time of one layer
                        best[e] = min(best[e], statistics.median(ts) / copies)
                for e in runners:
                    wb = paths["f32_bytes"] if e.endswith("f32") else paths["nbits_bytes"]
                    results.append({"layer": spec, "k": k, "n": n, "rows": m, "engine": e,
                                    "threads": threads, "ms": best[e] * 1e3,
                                    "weight_gbps": wb / best[e] / 1e9,
                                    "gflops": 2 * m * k * n / best[e] / 1e9,
                                    "rel_diff_vs_first": err[e]})
                print(f"  [{threads}T] {spec} rows {m}: " + ", ".join(
                    f"{e} {best[e] * 1e3:.3f}" for e in runners) + " ms", file=sys.stderr,
                    flush=True)
    print(json.dumps(results))


def ceilings(threads: list[int], quick: bool) -> dict:
    exe = REPO / "build" / "bench" / "pto_bench"
    out = json.loads(subprocess.run(
        [str(exe), "--only", "fma,memory", "--threads", ",".join(map(str, threads)),
         *(["--quick"] if quick else [])], check=True, capture_output=True, text=True).stdout)
    # A call streams its weight: the "read" kernel's rate is the memory ceiling; the FMA peak of
    # the ISA the kernels run with (not the bf16 dot products') the arithmetic one.
    c = {t: {"gbps": 0.0, "gflops": 0.0} for t in threads}
    for r in out["memory"]:
        if r["kernel"] == "read":
            c[r["threads"]]["gbps"] = max(c[r["threads"]]["gbps"], r["gbps_p90"])
    for r in out["fma"]:
        if r["isa"] == out["machine"]["isa"]:
            c[r["threads"]]["gflops"] = max(c[r["threads"]]["gflops"], r["gflops_p90"])
    return c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="4096x4096,4096x11008,11008x4096")
    p.add_argument("--rows", default="1,4,16,128")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--bits", type=int, default=4, choices=[4, 8], help="bits of a weight code")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--copies", type=int, default=0,
                   help="copies of the layer in each model (0: the quantized weights 3x the L3)")
    p.add_argument("--burst", type=float, default=0.3, help="seconds of calls per burst")
    p.add_argument("--quick", action="store_true", help="one small layer, 3 rounds")
    p.add_argument("--json")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.layers, a.rounds, a.burst = "2048x2048", 3, 0.1
    if a.child:
        child(a)
        return
    threads = [int(t) for t in a.threads.split(",")]
    ceil = ceilings(threads, a.quick)
    rows = []
    for t in threads:
        env = dict(os.environ, PTO_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t))
        cmd = [sys.executable, __file__, "--child", str(t), "--layers", a.layers, "--rows",
               a.rows, "--engines", a.engines, "--bits", str(a.bits), "--rounds", str(a.rounds),
               "--copies",
               str(a.copies), "--burst",
               str(a.burst)]
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows += json.loads(out.strip().splitlines()[-1])
    again = ceilings(threads, a.quick)
    for t in threads:
        for key in ("gbps", "gflops"):
            ceil[t][key] = max(ceil[t][key], again[t][key])
    print("\nceilings (pto_bench, best of before and after): " + "; ".join(
        f"{t} thread(s): memory {ceil[t]['gbps']:.1f} GB/s, FMA {ceil[t]['gflops']:.1f} GFLOP/s"
        for t in threads))
    engines = a.engines.split(",")
    print(f"\n{a.bits}-bit codes, block {BLOCK}, uint8 zero points")
    print("\n| layer K x N | rows | threads | " + " | ".join(engines) +
          " | acc0 PyPTO / ORT | acc4 PyPTO / ORT | PyPTO acc0: weight GB/s (% memory), "
          "GFLOP/s (% FMA) |")
    print("|---|---|---|" + "---|" * len(engines) + "---|---|---|")
    keyed = {(r["layer"], r["rows"], r["threads"], r["engine"]): r for r in rows}
    for spec in a.layers.split(","):
        for m in map(int, a.rows.split(",")):
            for t in threads:
                got = {e: keyed.get((spec, m, t, e)) for e in engines}
                if not all(got.values()):
                    continue

                def ratio(acc):
                    ours, theirs = got.get(f"pypto-nbits-{acc}"), got.get(f"ort-nbits-{acc}")
                    return f"{ours['ms'] / theirs['ms']:.2f}x" if ours and theirs else "-"
                ours, c = got.get("pypto-nbits-acc0"), ceil[t]
                rate = "-"
                if ours:
                    gbps, gflops = ours["weight_gbps"], ours["gflops"]
                    rate = (f"{gbps:.1f} ({100 * gbps / c['gbps']:.0f}%), "
                            f"{gflops:.1f} ({100 * gflops / c['gflops']:.0f}%)")
                times = " | ".join(f"{got[e]['ms']:.3f} ms" for e in engines)
                print(f"| {spec} | {m} | {t} | {times} | {ratio('acc0')} | {ratio('acc4')} | "
                      f"{rate} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"ceilings": ceil, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
