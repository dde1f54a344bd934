#!/usr/bin/env python3
"""Memory-bound kernels against the machine's measured bandwidth ceiling, under each memory
policy setting (pypto.memory.set_policy).

    python bench/memory_bound.py [--threads 1,2] [--kernels chain1,chain2,layernorm768,...]
                                 [--policies default,nt_never,nt_always,pf0,pf8,pf32]
                                 [--repeats 3] [--calls 10] [--quick]

Kernels (ONNX graphs loaded with pypto.onnx.load), each on tensors of at least 4x the L3 (read
from pypto.device_info(), 128 MiB at least per tensor):
  chain1        y = relu(x * 2 + 1)             1 read, 1 write (write-heavy)
  chain2        y = sigmoid(a) * b + 1           2 reads, 1 write
  layernorm768  LayerNormalization, rows of 768  (and layernorm4096)
  addlayernorm768  LayerNormalization(a + b + c), rows of 768 (and addlayernorm4096): 3 reads,
                1 write (the rule Add+LayerNormalization: the norm kernel sums as it loads)
  sum3          y = a + b + c (a tile program): the same traffic without the norm
  softmax1024   Softmax over the last axis, rows of 1024 (and softmax8192)
With --models bert,gpt2,resnet50 it instead compiles bench/run.py's exported models (batch 1,
exported first by `python bench/run.py` when missing) with reuse_distance 0 and 2 and prints the
planned arena (peak_bytes) and the time of a call under each, interleaved.

GB/s count compulsory traffic only: every input read once and every output written once. The
ceiling is the best STREAM-like kernel of `pto_bench --only memory` (read, copy, triad and their
streaming-store variants; each at its p90 GB/s, as the kernels here count their best call) at the
same thread count, measured in the same run, before and after the kernels; the table prints
each kernel's GB/s and its percentage of that ceiling. Each (policy, kernel) is timed `--repeats`
times interleaved with the other policies (the machine is shared: the best of the repeats is
reported, the median kept in the JSON). A policy is set before its model is compiled (the
planner's reuse_distance applies to plans made after it is set) and again before each timing
(nontemporal and prefetch_distance are read when kernels run).

The final table adds, per kernel, its compute ceiling: the same model on tensors that together
fill half the L2 of each core ("in L2", GB/s counted the same way, default policy settings), so
nothing comes from memory. "bound" is the lower of the two ceilings (memory when the kernel runs
faster in L2 than the bandwidth ceiling, else compute) and "%" the first policy's GB/s as a share
of that lower ceiling; the % of the bandwidth ceiling stays as it was.
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

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "python"))

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import pypto  # noqa: E402

POLICIES = {
    "default": {},
    "nt_never": {"nontemporal": "never"},
    "nt_always": {"nontemporal": "always"},
    "pf0": {"prefetch_distance": 0},
    "pf8": {"prefetch_distance": 8},
    "pf32": {"prefetch_distance": 32},
    # Not a memory policy: compiled with PTO_ADD_NORM=0, an Add+LayerNormalization group runs
    # as the tile program instead of the norm kernel (the A/B of the fold; the same code as
    # `default` for the other kernels).
    "addnorm_off": {},
}
COMPILE_ENV = {"addnorm_off": {"PTO_ADD_NORM": "0"}}


def load_with_env(path, policy):
    """pypto.onnx.load with the policy's compile-time environment (COMPILE_ENV)."""
    env = COMPILE_ENV.get(policy, {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return pypto.onnx.load(path)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m


def vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def scalar(name, v):
    return helper.make_tensor(name, TensorProto.FLOAT, [], [v])


def kernel(name: str, numel: int):
    """(ONNX model, input arrays, bytes moved once) for a kernel of about numel floats a tensor."""
    rng = np.random.default_rng(0)
    if name == "sum3":
        shape = [numel // 4096, 4096]
        m = model([helper.make_node("Add", ["a", "b"], ["s"]),
                   helper.make_node("Add", ["s", "c"], ["y"])],
                  [vi("a", shape), vi("b", shape), vi("c", shape)], [vi("y", shape)])
        xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]
    elif name.startswith("chain"):
        shape = [numel // 4096, 4096]
        if name == "chain1":
            m = model([helper.make_node("Mul", ["x", "two"], ["t"]),
                       helper.make_node("Add", ["t", "one"], ["u"]),
                       helper.make_node("Relu", ["u"], ["y"])],
                      [vi("x", shape)], [vi("y", shape)], [scalar("two", 2.0), scalar("one", 1.0)])
            xs = [rng.standard_normal(shape, dtype=np.float32)]
        else:
            m = model([helper.make_node("Sigmoid", ["a"], ["s"]),
                       helper.make_node("Mul", ["s", "b"], ["t"]),
                       helper.make_node("Add", ["t", "one"], ["y"])],
                      [vi("a", shape), vi("b", shape)], [vi("y", shape)], [scalar("one", 1.0)])
            xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(2)]
    elif name.startswith("addlayernorm"):
        d = int(name[len("addlayernorm"):])
        shape = [numel // d, d]
        m = model([helper.make_node("Add", ["a", "b"], ["s"]),
                   helper.make_node("Add", ["s", "c"], ["x"]),
                   helper.make_node("LayerNormalization", ["x", "g", "bias"], ["y"], axis=-1)],
                  [vi("a", shape), vi("b", shape), vi("c", shape)], [vi("y", shape)],
                  [helper.make_tensor("g", TensorProto.FLOAT, [d], rng.standard_normal(d)),
                   helper.make_tensor("bias", TensorProto.FLOAT, [d], rng.standard_normal(d))])
        xs = [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]
    elif name.startswith("layernorm"):
        d = int(name[len("layernorm"):])
        shape = [numel // d, d]
        m = model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                  [vi("x", shape)], [vi("y", shape)],
                  [helper.make_tensor("g", TensorProto.FLOAT, [d], rng.standard_normal(d)),
                   helper.make_tensor("b", TensorProto.FLOAT, [d], rng.standard_normal(d))])
        xs = [rng.standard_normal(shape, dtype=np.float32)]
    elif name.startswith("softmax"):
        d = int(name[len("softmax"):])
        shape = [numel // d, d]
        m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                  [vi("x", shape)], [vi("y", shape)])
        xs = [rng.standard_normal(shape, dtype=np.float32)]
    else:
        raise SystemExit(f"unknown kernel {name}")
    moved = sum(x.nbytes for x in xs) + xs[0].nbytes  # inputs read once, the output written once
    return m, xs, moved


def zoo_models(names, threads, repeats, calls) -> None:
    cache = Path(os.environ.get("PTO_CACHE", Path.home() / ".cache" / "pypto")) / "bench-onnx"
    for t in threads:
        pypto.set_num_threads(t)
        print(f"\nthreads {t}: reuse_distance 0 vs 2")
        for name in names.split(","):
            text = name in ("bert", "gpt2")  # sequence 128; the others images of 224
            found = sorted(cache.glob(f"{name}-b1-s{128 if text else 224}-*/model.onnx"))
            if not found:
                print(f"{name}: no export under {cache} (run bench/run.py first)")
                continue
            rng = np.random.default_rng(0)
            if text:
                x = rng.integers(0, 1000, (1, 128), dtype=np.int64)
            else:
                x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
            exes, peak, secs = {}, {}, {}
            for k in (0, 2):
                pypto.memory.set_policy(reuse_distance=k)
                exes[k] = pypto.onnx.load(str(found[0]))
                exes[k](x)
                peak[k] = exes[k].stats()["peak_bytes"]
                secs[k] = []
            pypto.memory.reset_policy()
            for _ in range(repeats):
                for k in (0, 2):
                    secs[k].append(time_calls(exes[k], [x], calls))
            b0, b2 = min(secs[0]), min(secs[2])
            m0, m2 = statistics.median(secs[0]), statistics.median(secs[2])
            print(f"{name:<10} peak {peak[0] / 2**20:8.2f} MiB -> {peak[2] / 2**20:8.2f} MiB "
                  f"({100 * (peak[2] / peak[0] - 1):+.1f}%); time {b0 * 1e3:7.2f} ms -> "
                  f"{b2 * 1e3:7.2f} ms (x{b0 / b2:.3f}; medians {m0 * 1e3:.2f} -> {m2 * 1e3:.2f})",
                  flush=True)
            del exes


def ceilings(threads, quick) -> dict:
    exe = REPO / "build" / "bench" / "pto_bench"
    # At the kernels' own priority (a niced ceiling loses the cores to other work and reads
    # low), and its p90 (the 10% fastest calls): the kernels are timed as the best of
    # their calls, so both sides count what the machine does when nothing else holds it.
    args = [str(exe), "--only", "memory", "--threads",
            ",".join(map(str, threads)), "--min-time", "1", "--min-calls", "5"]
    if quick:
        args.append("--quick")
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    best: dict = {}
    for r in out["memory"]:
        t = r["threads"]
        if r["gbps_p90"] > best.get(t, (0, ""))[0]:
            best[t] = (r["gbps_p90"], r["kernel"])
    return best


def time_calls(exe, xs, calls) -> float:
    exe(*xs)  # warm: the arena and output blocks cached, pages touched
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        exe(*xs)
        ts.append(time.perf_counter() - t0)
    return min(ts)


def cached_gbps(name: str, threads: int, repeats: int, calls: int) -> float:
    """GB/s of kernel `name` on tensors that together fill half the L2 of each of `threads`
    cores, so that nothing comes from memory: the rate its instructions allow, its compute
    ceiling (best call of `repeats` x `calls`; the fixed cost of a call, a few microseconds
    against the tens a call takes here, is counted in)."""
    l2 = pypto.device_info()["l2_bytes"]
    tensors = len(kernel(name, 8192)[1]) + 1
    numel = max(8192, threads * l2 // 2 // tensors // 4 // 8192 * 8192)
    m, xs, moved = kernel(name, numel)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{name}.onnx")
        onnx.save(m, path)
        exe = pypto.onnx.load(path)
    return moved / min(time_calls(exe, xs, calls) for _ in range(repeats)) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kernels",
                    default="chain1,chain2,layernorm768,layernorm4096,softmax1024,softmax8192")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="1x the L3 instead of 4x (a smoke test)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--models", help="bert,gpt2,resnet50: reuse_distance 0 vs 2 on these instead")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    if a.models:
        return zoo_models(a.models, threads, a.repeats, a.calls)
    policies = a.policies.split(",")
    have_policy = hasattr(pypto.memory, "set_policy")
    if not have_policy:
        policies = ["default"]
    l3 = pypto.device_info()["l3_bytes"]
    per_tensor = max(l3 * (1 if a.quick else 4), (32 if a.quick else 128) << 20)
    numel = per_tensor // 4 // 8192 * 8192
    print(f"L3 {l3 >> 20} MiB; tensors of {numel * 4 >> 20} MiB", flush=True)
    ceil = ceilings(threads, a.quick)
    results, cached = [], {}
    for t in threads:
        pypto.set_num_threads(t)
        print(f"\nthreads {t}: ceiling {ceil[t][0]:.1f} GB/s ({ceil[t][1]})", flush=True)
        print(f"{'kernel':<14}" + "".join(f"{p:>18}" for p in policies))
        for k in a.kernels.split(","):
            cached[(k, t)] = cached_gbps(k, t, a.repeats, 25 * a.calls)
            m, xs, moved = kernel(k, numel)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, f"{k}.onnx")
                onnx.save(m, path)
                exes = {}
                for p in policies:
                    if have_policy:
                        pypto.memory.reset_policy()
                        pypto.memory.set_policy(**POLICIES[p])
                    exes[p] = load_with_env(path, p)
                if have_policy:
                    pypto.memory.reset_policy()
            best = {p: [] for p in policies}
            for _ in range(a.repeats):  # interleaved: a slow spell hits every policy alike
                for p in policies:
                    if have_policy:  # kernels read nontemporal and prefetch_distance when they run
                        pypto.memory.reset_policy()
                        pypto.memory.set_policy(**POLICIES[p])
                    best[p].append(time_calls(exes[p], xs, a.calls))
            if have_policy:
                pypto.memory.reset_policy()
            row = f"{k:<14}"
            for p in policies:
                s = min(best[p])
                gbps = moved / s / 1e9
                pct = 100 * gbps / ceil[t][0]
                row += f"{gbps:>8.1f} ({pct:>4.0f}%)  "
                results.append({"kernel": k, "threads": t, "policy": p, "seconds": s,
                                "seconds_median": statistics.median(best[p]), "gbps": gbps,
                                "ceiling_gbps": ceil[t][0], "percent": pct, "bytes": moved,
                                "cached_gbps": cached[(k, t)]})
            print(row, flush=True)
            del exes
    # The ceiling again, after the kernels: a busy spell of the shared machine during the first
    # measurement must not flatter the kernels; the best of the two is the ceiling.
    again = ceilings(threads, a.quick)
    for t in threads:
        if again[t][0] > ceil[t][0]:
            ceil[t] = again[t]
    print("\nagainst the best of the ceilings measured before and after; 'in L2': the kernel on "
          "tensors in\nthe L2 (its compute ceiling), 'bound': the lower of the two ceilings, and "
          f"{policies[0]}'s % of it:")
    for t in threads:
        print(f"\nthreads {t}: ceiling {ceil[t][0]:.1f} GB/s ({ceil[t][1]})")
        print(f"{'kernel':<14}" + "".join(f"{p:>18}" for p in policies)
              + f"{'in L2':>8}{'bound':>9}{'%':>6}")
        for k in a.kernels.split(","):
            row = f"{k:<14}"
            mine = [r for r in results if r["threads"] == t and r["kernel"] == k]
            for r in mine:
                r["ceiling_gbps"] = ceil[t][0]
                r["percent"] = 100 * r["gbps"] / ceil[t][0]
                # Whichever ceiling is lower bounds the kernel: memory, or its own instructions.
                r["bound"] = "memory" if r["cached_gbps"] >= ceil[t][0] else "compute"
                r["percent_of_bound"] = 100 * r["gbps"] / min(ceil[t][0], r["cached_gbps"])
                row += f"{r['gbps']:>8.1f} ({r['percent']:>4.0f}%)  "
            print(row + f"{mine[0]['cached_gbps']:>8.1f}{mine[0]['bound']:>9}"
                  f"{mine[0]['percent_of_bound']:>5.0f}%")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
