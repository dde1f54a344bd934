"""Planner tiles against tuned tiles on the zoo models, in one run (issue 13; rules: BENCHMARKING.md).

    python bench/tune.py                                # every zoo model, 1 and 2 threads
    python bench/tune.py --models resnet18,bert --threads 1 --level fast

For each model (bench/run.py's ONNX exports: batch 1, 224x224 images, sequence 128; run
bench/run.py once first to export them) and thread count:
  1. `pto tune` at --level (default normal) into a fresh temporary cache, timed (tuning time);
  2. `pto bench` of the planner's plan (`--no-tune-cache`) and of the tuned one (the temporary
     cache), interleaved for --rounds rounds; each round's p50 latency, the median over rounds.
Prints a markdown table: planner ms, tuned ms, speed-up (planner / tuned), kernels taking the
cache's knobs, the cache's entries holding each knob (the winners kept), tuning time, the
tuner's pool probe (2 threads' speed-up over one; "busy": other processes hold the cores, so
conv.threads was not tried unless --for-load) and its whole-model check; and the machine's FMA
ceiling (build/bench/pto_bench --only fma).
The JSON goes to bench/results/tune.json. On a shared machine the numbers are noisy: read the
speed-ups, measured in the same run, not the absolute times.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (bench/run.py: the zoo and its exports)

REPO = base.REPO


def pto_bin() -> Path:
    return Path(os.environ.get("PTO_BIN") or REPO / "build" / "pto")


def run_pto(args: list[str], env: dict | None = None) -> str:
    full = dict(os.environ)
    full.update(env or {})
    r = subprocess.run([str(pto_bin()), *args], capture_output=True, text=True, env=full)
    if r.returncode != 0:
        raise RuntimeError(f"pto {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return r.stdout


def p50_ms(bench_stdout: str) -> float:
    m = re.search(r"p50 ([0-9.]+)", bench_stdout)
    if not m:
        raise RuntimeError(f"no p50 in pto bench output:\n{bench_stdout}")
    return float(m.group(1))


def tuned_kernels(model: str, threads: int, cache: str) -> int:
    out = run_pto(["compile", model, "--stats"],
                  {"PTO_TUNE_CACHE": cache, "PTO_NUM_THREADS": str(threads)})
    m = re.search(r"tuned kernels: (\d+)", out)
    return int(m.group(1)) if m else 0


def cache_knobs(cache: str) -> dict:
    """Entries of the tuning cache holding each knob name (the winners kept)."""
    counts: dict = {}
    text = Path(cache).read_text() if Path(cache).exists() else ""
    for body in re.findall(r'"knobs": \{([^}]*)\}', text):
        for name in re.findall(r'"([a-z_.]+)":', body):
            counts[name] = counts.get(name, 0) + 1
    return counts


def pool_speedup(tune_stdout: str) -> str:
    """The tuner's pool probe: "1.93x", "0.55x busy" (thread knobs not tried), "-" (1 thread)."""
    m = re.search(r"pool speed-up ([0-9.]+x)(.*)", tune_stdout)
    if not m:
        return "-"
    return m.group(1) + (" busy" if "hold the cores" in m.group(2) else "")


def model_check(tune_stdout: str) -> str:
    """The tuner's whole-model check: its comparisons, and whether it kept the winners."""
    m = re.search(r"\(checks ([0-9.x ]+)\)(.*)", tune_stdout)
    if not m:
        return "no winner"
    return m.group(1).strip().replace(" ", " / ") + ("" if "not faster" not in m.group(2)
                                                      else ", dropped")


def measure(model: str, threads: int, args) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cache = str(Path(d) / "tune.json")
        t0 = time.perf_counter()
        tune_out = run_pto(["tune", model, "--level", args.level, "--threads", str(threads),
                            "--cache", cache] + (["--for-load"] if args.for_load else []))
        tuning_s = time.perf_counter() - t0
        bench = ["bench", model, "--threads", str(threads), "--warmup", str(args.warmup),
                 "--iterations", str(args.iterations)]
        planner, tuned = [], []
        for _ in range(args.rounds):  # interleaved
            planner.append(p50_ms(run_pto(bench + ["--no-tune-cache"])))
            tuned.append(p50_ms(run_pto(bench, {"PTO_TUNE_CACHE": cache})))
        p, t = statistics.median(planner), statistics.median(tuned)
        return {"threads": threads, "planner_ms": p, "tuned_ms": t, "speedup": p / t,
                "planner_rounds": planner, "tuned_rounds": tuned,
                "tuned_kernels": tuned_kernels(model, threads, cache), "tuning_s": tuning_s,
                "knobs": cache_knobs(cache), "pool": pool_speedup(tune_out),
                "check": model_check(tune_out),
                "tune_summary": tune_out.strip().splitlines()[-1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(base.DEFAULT_MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--level", default="normal", choices=["fast", "normal", "exhaustive"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--for-load", action="store_true",
                    help="pto tune --for-load: try conv.threads even when other processes hold "
                         "the cores (tunes for this load)")
    args = ap.parse_args()
    if not pto_bin().exists():
        print(f"{pto_bin()} not built", file=sys.stderr)
        return 1
    fma = ""
    pto_bench = pto_bin().parent / "bench" / "pto_bench"
    if pto_bench.exists():
        r = subprocess.run([str(pto_bench), "--only", "fma"], capture_output=True, text=True)
        fma = r.stdout.strip()
    results = {}
    for name in args.models.split(","):
        model = base.onnx_path(name, 1)
        if not model.exists():
            print(f"{name}: {model} missing; run bench/run.py --models {name} first",
                  file=sys.stderr)
            continue
        for threads in (int(t) for t in args.threads.split(",")):
            print(f"{name}, {threads} thread(s) ...", file=sys.stderr)
            results.setdefault(name, []).append(measure(str(model), threads, args))
    lines = [f"Planner vs tuned (pto tune --level {args.level}"
             f"{' --for-load' if args.for_load else ''}), p50 of pto bench, median of "
             f"{args.rounds} interleaved rounds", "",
             "| model | threads | planner ms | tuned ms | speed-up | tuned kernels | knobs kept | "
             "tuning s | pool probe | model check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            knobs = ", ".join(f"{k} {n}" for k, n in sorted(r["knobs"].items()))
            lines.append(f"| {base.MODELS[name][0]} | {r['threads']} | {r['planner_ms']:.3f} | "
                         f"{r['tuned_ms']:.3f} | {r['speedup']:.3f}x | {r['tuned_kernels']} | "
                         f"{knobs or '-'} | {r['tuning_s']:.1f} | {r['pool']} | {r['check']} |")
    if fma:
        lines += ["", "Ceiling (build/bench/pto_bench --only fma):", "", "```", fma, "```"]
    print("\n".join(lines))
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps({"level": args.level, "results": results,
                                               "fma": fma}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
