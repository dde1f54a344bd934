#!/usr/bin/env python3
"""Scaled dot-product attention alone: PyPTO against torch.nn.functional.scaled_dot_product_attention,
time and peak memory, in one run (rules: BENCHMARKING.md; usage: bench/README.md).

    python bench/attention.py                          # every case, threads 1 and 2
    python bench/attention.py --quick --cases s512 --threads 1

Cases (batch 1): prefill of 12 heads of 64 at sequence 128 (BERT-base's), 512, 2048 and 8192,
with and without a causal mask; a Llama-like grouped-query prefill (32 query heads over 8 K/V heads
of 128) at 2048; a decode step (one query against a 4096-long K/V cache) for both head shapes.
Engines:
- torch: F.scaled_dot_product_attention under inference_mode (its CPU flash kernel), float32;
- pypto: pypto.optimize of a module that calls it (RecognizeAttention keeps it one Attention op);
- pypto-unfused: the same with PTO_DISABLE_PASSES=RecognizeAttention (separate MatMul / Softmax
  kernels, the [q, kv] scores in memory), only up to sequence 2048;
- torch-bf16: the same call under torch.autocast("cpu", dtype=torch.bfloat16) (its flash kernel
  on bf16 Q, K, V);
- pypto-bf16: pypto.optimize(..., dtype=torch.bfloat16) (Attention with precision="bf16": both
  products on bf16 operands, on AMX tiles or VDPBF16PS where the CPU has them).
bf16 engines are held to 3e-2 of the float64 reference, float32 ones to 1e-4.
Each (case, threads, engine) runs in a process of its own, engines interleaved for --rounds. Each
child checks its output against torch's float64 math kernel (on the last 256 query rows: the
reference's scores are quadratic) before timing, then reports the median call, the memory its
first call adds (the peak resident set, reset through /proc/self/clear_refs once the inputs are
built and the model compiled, minus the resident set then) and the CPU utilisation. GFLOP/s count 4 * B * H * Sq * L * D (both products; causal: the
visible half), and the FMA ceiling is pto_bench's on the same thread count, measured in the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as base  # noqa: E402  (bench/run.py: children, timing, ceilings)

MARK = "@@attention@@"
ENGINES = ["torch", "pypto", "pypto-unfused", "torch-bf16", "pypto-bf16"]
TOLERANCE = {"torch-bf16": 3e-2, "pypto-bf16": 3e-2}  # others: 1e-4
# name -> (heads, kv heads, head dim, query length, key length, causal)
CASES = {
    "s128": (12, 12, 64, 128, 128, False),
    "s512": (12, 12, 64, 512, 512, False),
    "s512-causal": (12, 12, 64, 512, 512, True),
    "s2048": (12, 12, 64, 2048, 2048, False),
    "s2048-causal": (12, 12, 64, 2048, 2048, True),
    "s8192": (12, 12, 64, 8192, 8192, False),
    "s8192-causal": (12, 12, 64, 8192, 8192, True),
    "gqa-s2048-causal": (32, 8, 128, 2048, 2048, True),
    "decode-4096": (12, 12, 64, 1, 4096, False),
    "gqa-decode-4096": (32, 8, 128, 1, 4096, False),
}
UNFUSED_MAX = 2048  # pypto-unfused holds [H, Sq, L] scores: only up to this length


def flops(case: str) -> float:
    h, _, d, sq, sk, causal = CASES[case]
    visible = sq * sk - (sq * (sq - 1) // 2 if causal and sq == sk else 0)
    return 4.0 * h * visible * d


def status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) / 1024 for x in f if x.startswith(field + ":"))


def child(args) -> dict:
    engine, case = args.child
    threads = args.threads_child
    import numpy as np
    import torch
    import torch.nn.functional as F

    base.child_setup(threads)
    h, hkv, d, sq, sk, causal = CASES[case]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, sq, d, generator=g)
    k = torch.randn(1, hkv, sk, d, generator=g)
    v = torch.randn(1, hkv, sk, d, generator=g)
    gqa = h != hkv

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    result: dict = {"engine": engine, "case": case, "threads": threads}
    with torch.inference_mode():
        if engine == "torch":
            fn = Sdpa().eval()
        elif engine == "torch-bf16":
            sdpa = Sdpa().eval()

            def fn(q, k, v):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return sdpa(q, k, v).float()
        else:
            import pypto

            t0 = time.perf_counter()
            dtype = torch.bfloat16 if engine == "pypto-bf16" else None
            fn = pypto.optimize(Sdpa().eval(), example_inputs=(q, k, v), dtype=dtype)
            result["compile_s"] = time.perf_counter() - t0
            ops = [op for op, _ in fn.compiled.node_backends]
            result["attention_ops"] = ops.count("Attention")
            result["planned_mib"] = fn.stats()["peak_bytes"] / 2**20  # the arena, scores included
        # The memory the first call adds: the peak resident set (VmHWM, reset here through
        # clear_refs) over the resident set with the inputs built and the model compiled.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        baseline = status_mib("VmRSS")
        y = fn(q, k, v)
        result["peak_mib"] = status_mib("VmHWM") - baseline
        # The float64 math kernel on the last rows (every key is visible to them when causal).
        rows = min(sq, 256)
        qs = q[:, :, sq - rows:].double()
        kd, vd = k.double(), v.double()
        if gqa:
            kd = kd.repeat_interleave(h // hkv, dim=1)
            vd = vd.repeat_interleave(h // hkv, dim=1)
        mask = None
        if causal:
            i = torch.arange(sq - rows, sq).unsqueeze(1)
            mask = torch.arange(sk).unsqueeze(0) <= i + (sk - sq)
        want = F.scaled_dot_product_attention(qs, kd, vd, attn_mask=mask)
        got = (y if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y)))
        got = got[:, :, sq - rows:].double()
        err = float(((got - want).abs().max() / want.abs().max()).item())
        result["max_rel_error"] = err
        if not err < TOLERANCE.get(engine, 1e-4):
            result["status"] = "WRONG"
            return result
        result.update(base.measure(lambda: fn(q, k, v), base_protocol(args)))
    result["status"] = "ok"
    return result


def base_protocol(args) -> dict:
    if args.quick:
        return {"warmup_calls": 2, "warmup_s": 0.2, "calls": 5, "seconds": 0.5, "cap_s": 10}
    return {"warmup_calls": 3, "warmup_s": 1.0, "calls": 10, "seconds": 4.0, "cap_s": 30}


def fmt(x, spec="{:.2f}"):
    return spec.format(x) if x is not None else "-"


def table(results: list[dict], fma: dict) -> list[str]:
    engines = [e for e in ENGINES if any(r["engine"] == e for r in results)]
    pairs = [(p, t) for p, t in (("pypto", "torch"), ("pypto-bf16", "torch-bf16"))
             if p in engines and t in engines]
    lines = []
    for t in sorted({r["threads"] for r in results}):
        peak = fma.get(t)
        head = ([f"{e} ms" for e in engines] + [f"{p} / {q}" for p, q in pairs]
                + [f"{e} GFLOP/s (% FMA peak)" for e in engines if e.startswith("pypto")]
                + ["first call MiB " + " / ".join(engines),
                   "arena MiB " + " / ".join(e for e in engines if e.startswith("pypto")),
                   "max rel error"])
        lines += [f"\n### {t} thread(s), FMA ceiling {fmt(peak, '{:.0f}')} GFLOP/s\n",
                  "| case | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
        for case in CASES:
            rs = {e: [r for r in results if r["threads"] == t and r["case"] == case
                      and r["engine"] == e] for e in engines}
            if not any(rs.values()):
                continue

            def med(e, key="median"):
                ok = sorted(r[key] for r in rs[e] if r.get("status") == "ok" and key in r)
                return ok[len(ok) // 2] if ok else None

            def state(e):
                bad = [r.get("status", "failed") for r in rs[e] if r.get("status") != "ok"]
                return bad[0] if bad and med(e) is None else None

            ms = {e: (med(e) * 1e3 if med(e) is not None else None) for e in engines}
            cells = [state(e) or fmt(ms[e]) for e in engines]
            cells += [fmt(ms[q] / ms[p] if ms[q] and ms[p] else None) + "x" for p, q in pairs]
            for e in engines:
                if e.startswith("pypto"):
                    gf = flops(case) / (ms[e] * 1e-3) / 1e9 if ms[e] else None
                    pct = f" ({100 * gf / peak:.0f}%)" if gf and peak else ""
                    cells.append(f"{fmt(gf, '{:.1f}')}{pct}")
            cells.append(" / ".join(fmt(med(e, "peak_mib"), "{:.0f}") for e in engines))
            cells.append(" / ".join(fmt(med(e, "planned_mib"), "{:.0f}") for e in engines
                                    if e.startswith("pypto")))
            err = max((r.get("max_rel_error", 0) for e in engines for r in rs[e]), default=None)
            cells.append(fmt(err, "{:.1e}"))
            lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "CASE"), help=argparse.SUPPRESS)
    ap.add_argument("--threads-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return base.report_child(child(args), MARK)

    cases = base.parse_list(args.cases, list(CASES), "case")
    engines = base.parse_list(args.engines, ENGINES, "engine")
    threads = base.parse_list(args.threads, [1, 2, 4, 8, 16], "thread count", int)
    pto_bench = base.REPO / "build" / "bench" / "pto_bench"
    pbs = {t: [base.pto_bench(pto_bench, t, "fma", True, 120)] for t in threads}
    results = []
    for t in threads:
        for case in cases:
            for _ in range(args.rounds):
                for e in engines:
                    if e == "pypto-unfused" and CASES[case][4] > UNFUSED_MAX:
                        continue
                    env = base.child_env(t)
                    if e == "pypto-unfused":
                        env["PTO_DISABLE_PASSES"] = "RecognizeAttention"
                    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", e, case,
                           "--threads-child", str(t), *(["--quick"] if args.quick else [])]
                    r = base.run_child(cmd, env, 900, MARK)
                    r.update({"engine": e, "case": case, "threads": t})
                    results.append(r)
                    print(f"{case} {e} {t}T: {r.get('status')} "
                          f"{fmt(r.get('median', 0) * 1e3 if r.get('median') else None)} ms",
                          file=sys.stderr)
    fma = {}  # the better of the ceilings before and after (load only lowers it)
    for t in threads:
        pbs[t].append(base.pto_bench(pto_bench, t, "fma", True, 120))
        best = base.best_fma(pbs[t], t)
        fma[t] = best["gflops"] if best else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"attention-{stamp}.json").write_text(json.dumps(
        {"fma": fma, "results": results, "load": os.getloadavg()}, indent=1))
    print(f"# Attention (load average {os.getloadavg()[0]:.2f})")
    print("\n".join(table(results, fma)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
