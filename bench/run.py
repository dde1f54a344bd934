"""PyPTO against PyTorch on this machine, in one run, as one markdown table (rules:
BENCHMARKING.md).

    python bench/run.py                      # everything: about an hour on 2 cores
    python bench/run.py --quick --models resnet18,bert --threads 1

Measures, on each thread count:
- the ceilings and PyPTO's SGEMM with build/bench/pto_bench (FMA peak per ISA, memory bandwidth),
  and torch.mm on the same shapes;
- models built in code with random weights (seed 0): batch 1 latency and batch 8 throughput of
  pypto.optimize(model, level=0) against PyTorch eager, both under torch.inference_mode, after
  checking that the outputs agree.

Every configuration (what x batch x threads x engine) runs in a process of its own with
PTO_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS set to the thread count, engines one after
the other (PyPTO, then PyTorch); PyTorch on 2+ threads runs with OMP_WAIT_POLICY unset and PASSIVE
and the better one counts. Each call is timed on its own after a warm-up; the table quotes medians
(p10-p90 and the count in the JSON, with peak RSS and CPU utilisation). The full results go to
bench/results/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {  # name in tests/python/torch_models.py -> (title, kind)
    "resnet18": ("ResNet-18", "image"),
    "resnet50": ("ResNet-50", "image"),
    "mobilenet_v2": ("MobileNetV2", "image"),
    "bert": ("BERT-base", "text"),
    "gpt2": ("GPT-2 small", "text"),
}
IMAGE, SEQ = 224, 128
TOLERANCE = 1e-3  # max |pypto - torch| / max |torch| on the model's main output

# Timing protocol: warm-up calls and seconds, then at least `calls` calls and `seconds`, capped.
FULL = dict(warmup_calls=3, warmup_s=1.0, calls=10, seconds=4.0, cap_s=60.0)
QUICK = dict(warmup_calls=1, warmup_s=0.0, calls=3, seconds=0.2, cap_s=20.0)


# ---- measurement (children) ----

def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def measure(fn, protocol: dict) -> dict:
    """Times calls of fn one by one; returns seconds (sorted), median, p10, p90, CPU utilisation."""
    start = time.perf_counter()
    n = 0
    while n < protocol["warmup_calls"] or time.perf_counter() - start < protocol["warmup_s"]:
        fn()
        n += 1
        if time.perf_counter() - start > protocol["cap_s"]:
            break
    times = []
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if len(times) >= protocol["calls"] and t1 - wall0 >= protocol["seconds"]:
            break
        if t1 - wall0 >= protocol["cap_s"]:
            break
    wall = time.perf_counter() - wall0
    times.sort()

    def q(p):
        pos = p * (len(times) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(times) - 1)
        return times[lo] + (times[hi] - times[lo]) * (pos - lo)

    return {"median": q(0.5), "p10": q(0.1), "p90": q(0.9), "count": len(times),
            "cpu_util": (cpu_seconds() - cpu0) / wall if wall > 0 else 0.0}


def child_setup(threads: int):
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(REPO / "python"))
    sys.path.insert(0, str(REPO / "tests" / "python"))


def child_torch_mm(args) -> dict:
    import torch

    child_setup(args.threads)
    protocol = QUICK if args.quick else FULL
    out = []
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        a = torch.rand(m, k, generator=g) * 2 - 1
        b = torch.rand(k, n, generator=g) * 2 - 1
        c = torch.empty(m, n)
        print(f"torch.mm {shape} threads {args.threads}", file=sys.stderr)
        with torch.inference_mode():
            r = measure(lambda: torch.mm(a, b, out=c), protocol)
        r.update(m=m, k=k, n=n, gflops=2 * m * n * k / r["median"] / 1e9)
        out.append(r)
    return {"sgemm": out, "torch_parallel": torch.__config__.parallel_info()}


def model_inputs(name: str, batch: int):
    import torch

    torch.manual_seed(1000 + batch)
    if MODELS[name][1] == "image":
        return (torch.randn(batch, 3, IMAGE, IMAGE),)
    return (torch.randint(0, 1000, (batch, SEQ)),)


def child_model(args) -> dict:
    import torch

    child_setup(args.threads)
    import torch_models

    model = torch_models.build(args.model)
    x = model_inputs(args.model, args.batch)
    protocol = QUICK if args.quick else FULL
    result = {"model": args.model, "batch": args.batch, "threads": args.threads,
              "engine": args.engine}
    with torch.inference_mode():
        want = torch_models.first_tensor(model(*x))
    if args.engine == "torch":
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with torch.inference_mode(), counter:
            model(*x)
        result["flops"] = counter.get_total_flops()
        run = lambda: model(*x)  # noqa: E731
    else:
        import pypto

        pypto.set_num_threads(args.threads)
        t0 = time.perf_counter()
        fast = pypto.optimize(model, example_inputs=x, level=0)
        with torch.inference_mode():
            got = torch_models.first_tensor(fast(*x))
        result["compile_s"] = time.perf_counter() - t0
        err = torch_models.relative_error(got, want)
        result["max_rel_err"] = err
        result["ok"] = bool(err <= TOLERANCE)
        if not result["ok"]:  # a fast wrong answer is a failure, not a result
            return result
        run = lambda: fast(*x)  # noqa: E731
    print(f"{args.engine} {args.model} batch {args.batch} threads {args.threads}",
          file=sys.stderr)
    with torch.inference_mode():
        result.update(measure(run, protocol))
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


# ---- the driver ----

def child_env(threads: int, wait_policy: str | None = None) -> dict:
    env = dict(os.environ)
    for var in ["PTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"]:
        env[var] = str(threads)
    for var in ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY"]:
        env.pop(var, None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def run_child(cmd: list[str], env: dict, timeout: float) -> dict | None:
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        print(f"FAILED ({p.returncode}): {' '.join(cmd)}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def self_cmd(args, *extra) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *(["--quick"] if args.quick else []),
            *extra]


def torch_child(args, threads: int, extra: list[str]) -> dict | None:
    """PyTorch with the OpenMP wait policy that serves it best on 2+ threads."""
    best = None
    for policy in ([None] if threads == 1 else [None, "PASSIVE"]):
        r = run_child(self_cmd(args, "--threads", str(threads), *extra),
                      child_env(threads, policy), args.timeout)
        if r is None:
            continue
        r["omp_wait_policy"] = policy or "default"
        if best is None:
            best = r
        elif "sgemm" in r:  # torch.mm: the better policy per shape
            for i, new in enumerate(r["sgemm"]):
                if new["median"] < best["sgemm"][i]["median"]:
                    new["omp_wait_policy"] = r["omp_wait_policy"]
                    best["sgemm"][i] = new
        elif r["median"] < best["median"]:
            best = r
    return best


def median_round(rounds: list[dict | None]) -> dict | None:
    """The round with the median of the rounds' medians (any failed round fails the lot)."""
    if not rounds or any(r is None for r in rounds):
        return None
    if any("median" not in r for r in rounds):  # a wrong answer: report the first
        return next(r for r in rounds if "median" not in r)
    return sorted(rounds, key=lambda r: r["median"])[(len(rounds) - 1) // 2]


def fmt_time(r: dict) -> str:
    return f"{r['median'] * 1e3:.2f} ms"


def main_driver(args) -> int:
    threads = [int(t) for t in args.threads.split(",")]
    models = [m for m in args.models.split(",") if m] if args.models else (
        ["resnet18", "bert"] if args.quick else list(MODELS))
    for m in models:
        if m not in MODELS:
            sys.exit(f"unknown model '{m}' (known: {', '.join(MODELS)})")
    batches = [1] if args.quick and not args.batches else [int(b) for b in
                                                           (args.batches or "1,8").split(",")]
    bench_bin = Path(args.pto_bench)
    if not bench_bin.is_file():
        sys.exit(f"{bench_bin} is missing: build it (scripts/bench.sh does)")

    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
               "pto_bench": {}, "torch_mm": {}, "models": []}
    for t in threads:
        print(f"== pto_bench, {t} thread(s)", file=sys.stderr)
        cmd = [str(bench_bin), "--threads", str(t), *(["--quick"] if args.quick else [])]
        if args.no_gemm:
            cmd += ["--only", "fma,memory"]
        results["pto_bench"][t] = run_child(cmd, child_env(t), args.timeout)
        pb = results["pto_bench"][t]
        if pb and pb.get("sgemm"):
            shapes = ",".join(f"{s['m']}x{s['k']}x{s['n']}" for s in pb["sgemm"])
            results["torch_mm"][t] = torch_child(args, t, ["--child", "torch-mm",
                                                           "--shapes", shapes])
    for m in models:
        for b in batches:
            for t in threads:
                extra = ["--model", m, "--batch", str(b)]
                ptos, refs = [], []
                for _ in range(args.rounds):  # engines interleaved: A B A B ...
                    ptos.append(run_child(self_cmd(args, "--threads", str(t), "--child", "model",
                                                   "--engine", "pypto", *extra), child_env(t),
                                          args.timeout))
                    refs.append(torch_child(args, t, ["--child", "model", "--engine", "torch",
                                                      *extra]))
                results["models"].append({"model": m, "batch": b, "threads": t,
                                          "pypto": median_round(ptos), "torch": median_round(refs),
                                          "pypto_rounds": ptos, "torch_rounds": refs})
    table = markdown(results)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results["table"] = table
    path.write_text(json.dumps(results, indent=1))
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


def peak(results: dict, threads: int) -> float | None:
    """The FMA peak (GFLOP/s) of the ISA the kernels run with, on `threads` threads."""
    pb = results["pto_bench"].get(threads)
    if not pb:
        return None
    isa = pb["machine"]["isa"]
    for f in pb.get("fma", []):
        if f["isa"] == isa and f["threads"] == threads:
            return f["gflops"]
    return None


def markdown(results: dict) -> str:
    rows = ["| benchmark | threads | PyPTO | PyTorch | speed-up | % of FMA peak (PyPTO / PyTorch) "
            "| check |",
            "|---|---|---|---|---|---|---|"]
    for t, pb in results["pto_bench"].items():
        if not pb:
            rows.append(f"| pto_bench | {t} | failed | | | | |")
            continue
        for f in pb.get("fma", []):
            rows.append(f"| FMA peak, {f['isa']} | {t} | {f['gflops']:.1f} GFLOP/s | | | | |")
        for mem in pb.get("memory", []):
            mib = mem["array_bytes"] / 2**20
            rows.append(f"| memory {mem['kernel']} ({mib:.0f} MiB arrays) | {t} | "
                        f"{mem['gbps']:.1f} GB/s | | | | |")
    for t, pb in results["pto_bench"].items():
        if not pb:
            continue
        torch_mm = (results["torch_mm"].get(t) or {}).get("sgemm", [])
        p = peak(results, t)
        for i, s in enumerate(pb.get("sgemm", [])):
            name = f"SGEMM {s['m']}x{s['k']}x{s['n']} ({s['label']})"
            if not s["ok"]:
                rows.append(f"| {name} | {t} | WRONG | | | | err {s['max_rel_err']:.1e} |")
                continue
            tm = torch_mm[i] if i < len(torch_mm) else None
            ours = f"{s['gflops']:.1f} GFLOP/s"
            theirs = f"{tm['gflops']:.1f} GFLOP/s" if tm else "-"
            ratio = f"{s['gflops'] / tm['gflops']:.2f}x" if tm else "-"
            frac = f"{100 * s['gflops'] / p:.0f}% / {100 * tm['gflops'] / p:.0f}%" if p and tm \
                else "-"
            rows.append(f"| {name} | {t} | {ours} | {theirs} | {ratio} | {frac} | "
                        f"err {s['max_rel_err']:.1e} |")
    for r in results["models"]:
        title = MODELS[r["model"]][0]
        b, t = r["batch"], r["threads"]
        what = f"{title}, batch {b} " + ("latency" if b == 1 else "throughput")
        pto, ref = r["pypto"], r["torch"]
        if pto is None or ref is None:
            rows.append(f"| {what} | {t} | {'failed' if pto is None else ''} | "
                        f"{'failed' if ref is None else ''} | | | |")
            continue
        if not pto["ok"]:
            rows.append(f"| {what} | {t} | WRONG | {fmt_time(ref)} | | | "
                        f"err {pto['max_rel_err']:.1e} |")
            continue
        unit = "img/s" if MODELS[r["model"]][1] == "image" else "seq/s"

        def show(x):
            return fmt_time(x) if b == 1 else f"{b / x['median']:.1f} {unit}"

        p = peak(results, t)
        frac = "-"
        if p and "flops" in ref:
            gflop = ref["flops"] / 1e9
            frac = f"{100 * gflop / pto['median'] / p:.0f}% / {100 * gflop / ref['median'] / p:.0f}%"
        rows.append(f"| {what} | {t} | {show(pto)} | {show(ref)} | "
                    f"{ref['median'] / pto['median']:.2f}x | {frac} | "
                    f"err {pto['max_rel_err']:.1e} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="few calls, small arrays, a subset of shapes, models and batches")
    ap.add_argument("--models", default="", help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--batches", default="", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--no-gemm", action="store_true", help="skip the SGEMM comparison")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each model configuration, engines interleaved; the table quotes "
                         "the median round (use 3 before claiming a 2-thread win)")
    ap.add_argument("--pto-bench", default=str(REPO / "build" / "bench" / "pto_bench"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child process")
    # A child process: one configuration, JSON on the last line of stdout.
    ap.add_argument("--child", choices=["torch-mm", "model"], help=argparse.SUPPRESS)
    ap.add_argument("--engine", choices=["pypto", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        r = child_torch_mm(args) if args.child == "torch-mm" else child_model(args)
        print(json.dumps(r))
        return 0
    return main_driver(args)


if __name__ == "__main__":
    sys.exit(main())
