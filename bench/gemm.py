"""PyPTO's SGEMM against the best BLAS in the venv: torch.mm and numpy's matmul (OpenBLAS), on
square, transformer and convolution shapes, as GFLOP/s and % of the FMA peak (usage:
bench/README.md).

    python bench/gemm.py                       # 13 shapes x threads 1, 2 (about 10 minutes)
    python bench/gemm.py --quick --threads 1 --shapes 512,128x768x3072

Shapes are MxKxN (C[M, N] = A[M, K] B[K, N], row-major fp32); a conv layer as an implicit GEMM is
OC x (C*KH*KW) x (OH*OW). Per thread count T, each engine runs in a process of its own with
PTO_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS = T:
- PyPTO: `pto_bench --only fma,sgemm --shapes ...` (pto::cpu::sgemm, its FMA peak from the same
  process);
- torch.mm: run.py's torch.mm child (torch.set_num_threads(T); on 2+ threads OMP_WAIT_POLICY
  unset and PASSIVE, the better per shape);
- numpy: np.matmul(a, b, out=c) in a child whose OPENBLAS_NUM_THREADS sets OpenBLAS's pool (read
  back with openblas_get_num_threads, with the kernel OpenBLAS chose, when numpy's BLAS is
  scipy-openblas).
Each result is checked first (numpy against a float64 product: max |diff| / max |ref| <= 1e-4;
pto_bench checks its own on sampled entries); --rounds repeats the three engines in turn and the
table quotes each one's median round.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402 - the shared helpers: children, pto_bench, timing

SHAPES = {  # MxKxN -> what it is
    "256x256x256": "square",
    "512x512x512": "square",
    "1024x1024x1024": "square",
    "2048x2048x2048": "square",
    "128x768x768": "BERT b1 attention proj",
    "128x768x2304": "BERT b1 Q/K/V proj merged (MergeSiblingMatMuls)",
    "128x768x3072": "BERT b1 FFN up",
    "128x3072x768": "BERT b1 FFN down",
    "1024x768x3072": "BERT b8 FFN up",
    "64x576x3136": "ResNet-50 layer1 3x3 (im2col)",
    "256x2304x196": "ResNet-50 layer3 3x3 (im2col)",
    "128x1152x784": "ResNet-50 layer2 3x3 (im2col)",
    "512x4608x49": "ResNet-50 layer4 3x3 (im2col)",
}
MARK = "@@gemm@@ "
TOLERANCE = 1e-4


def parse_shape(text: str) -> tuple[int, int, int]:
    """"S" (a square) or "MxKxN"."""
    dims = [int(d) for d in text.split("x")]
    if len(dims) == 1:
        return dims[0], dims[0], dims[0]
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"bad shape '{text}': expected S or MxKxN")
    return dims[0], dims[1], dims[2]


def shape_key(m: int, k: int, n: int) -> str:
    return f"{m}x{k}x{n}"


# ---- the numpy child ----

def openblas_info() -> dict:
    """The kernel and thread count of numpy's scipy-openblas, as it reports them; {} for another
    BLAS."""
    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*"))
    if not libs:
        return {}
    lib = ctypes.CDLL(libs[0])
    for suffix in ("64_", ""):
        corename = getattr(lib, f"scipy_openblas_get_corename{suffix}", None)
        threads = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
        if corename and threads:
            corename.restype = ctypes.c_char_p
            return {"corename": corename().decode(), "threads": threads()}
    return {}


def child_numpy(args) -> dict:
    import numpy as np

    protocol = bench.QUICK if args.quick else bench.FULL
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    out = {"status": "ok", "numpy": np.__version__, "blas": blas.get("name"),
           "blas_version": blas.get("version"), "openblas": openblas_info(), "sgemm": []}
    rng = np.random.default_rng(0)
    for text in args.shapes.split(","):
        m, k, n = parse_shape(text)
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        c = np.empty((m, n), np.float32)
        print(f"numpy matmul {text} threads {args.threads}", file=sys.stderr)
        np.matmul(a, b, out=c)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        r = {"m": m, "k": k, "n": n,
             "max_rel_err": float(np.abs(c - ref).max() / np.abs(ref).max())}
        r["ok"] = r["max_rel_err"] <= TOLERANCE
        if r["ok"]:
            r.update(bench.measure(lambda: np.matmul(a, b, out=c), protocol))
            r["gflops"] = 2 * m * n * k / r["median"] / 1e9
        out["sgemm"].append(r)
    return out


# ---- the driver ----

def by_shape(result: dict | None) -> dict[str, dict]:
    """A child's or pto_bench's SGEMM results, keyed MxKxN; only the checked ones."""
    if not result or "sgemm" not in result:
        return {}
    return {shape_key(s["m"], s["k"], s["n"]): s for s in result["sgemm"]
            if s.get("ok", True) and "gflops" in s}


def measure_round(args, threads: int, shapes: str) -> dict:
    bench_bin = Path(args.pto_bench)
    print(f"== pto_bench sgemm, {threads} thread(s)", file=sys.stderr)
    pto = bench.pto_bench(bench_bin, threads, "fma,sgemm", args.quick, args.timeout,
                          ("--shapes", shapes))
    print(f"== torch.mm, {threads} thread(s)", file=sys.stderr)
    torch_mm = bench.torch_child(args, threads, ["--child", "torch-mm", "--shapes", shapes])
    print(f"== numpy, {threads} thread(s)", file=sys.stderr)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--threads", str(threads),
           "--shapes", shapes, *(["--quick"] if args.quick else [])]
    numpy = bench.run_child(cmd, bench.child_env(threads), args.timeout, marker=MARK)
    return {"pypto": pto, "torch": torch_mm, "numpy": numpy}


def median_gflops(rounds: list[dict], engine: str, key: str) -> float | None:
    values = sorted(s["gflops"] for s in (by_shape(r[engine]).get(key) for r in rounds) if s)
    return values[(len(values) - 1) // 2] if values else None


def pto_errors(rounds: list[dict], key: str) -> list[float]:
    errs = []
    for r in rounds:
        for s in (r["pypto"] or {}).get("sgemm", []):
            if shape_key(s["m"], s["k"], s["n"]) == key:
                errs.append(s["max_rel_err"])
    return errs


def markdown(results: dict) -> str:
    load = results["loadavg_start"]
    parts = [f"Load average at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / "
             f"15 min)" + (", at the end {:.2f} / {:.2f} / {:.2f}".format(*results["loadavg_end"])
                           if "loadavg_end" in results else "") +
             f"; medians of {results['rounds']} round(s); GFLOP/s."]
    head = ["shape MxKxN", "what", "threads", "PyPTO", "torch.mm", "numpy (OpenBLAS)",
            "best BLAS", "PyPTO / best", "% of FMA peak (PyPTO / best)", "PyPTO error"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    blas, peaks = [], []
    for t, rounds in results["threads"].items():
        t = int(t)
        fma = bench.best_fma([r["pypto"] for r in rounds], t)
        peak = fma["gflops"] if fma else None
        for r in rounds:
            info = (r["numpy"] or {}).get("openblas")
            if info:
                blas.append(f"{t} thread(s): OpenBLAS kernel {info['corename']}, "
                            f"{info['threads']} thread(s)")
        for key in results["shapes"]:
            ours = median_gflops(rounds, "pypto", key)
            peers = {"torch.mm": median_gflops(rounds, "torch", key),
                     "numpy": median_gflops(rounds, "numpy", key)}
            best_name, best = max(((n, g) for n, g in peers.items() if g), key=lambda p: p[1],
                                  default=(None, None))
            errs = pto_errors(rounds, key)

            def fmt(g):
                return f"{g:.1f}" if g else "-"

            row = [key, SHAPES.get(key, ""), str(t), fmt(ours) if ours or not errs else "WRONG",
                   fmt(peers["torch.mm"]), fmt(peers["numpy"]),
                   f"{best:.1f} ({best_name})" if best else "-",
                   f"{ours / best:.2f}" if ours and best else "-",
                   f"{100 * ours / peak:.0f}% / {100 * best / peak:.0f}%" if ours and best and peak
                   else "-", f"{max(errs):.0e}" if errs else "-"]
            rows.append("| " + " | ".join(row) + " |")
        if fma:
            peaks.append(bench.fma_note(fma, t))
    if peaks:
        parts.append("FMA peak (pto_bench, best of the rounds): " + "; ".join(peaks) + ".")
    parts.append("\n".join(rows))
    if blas:
        parts.append("numpy's BLAS: " + "; ".join(dict.fromkeys(blas)) + ".")
    return "\n\n".join(parts)


def main_driver(args) -> int:
    threads = [int(t) for t in args.threads.split(",")]
    shapes = [shape_key(*parse_shape(s)) for s in args.shapes.split(",")]
    if not Path(args.pto_bench).is_file():
        sys.exit(f"{args.pto_bench} is missing: build it (scripts/bench.sh does)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gemm-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
               "quick": args.quick, "rounds": args.rounds, "shapes": shapes,
               "loadavg_start": os.getloadavg(), "threads": {t: [] for t in threads}}

    def save():
        results["table"] = markdown(results)
        path.write_text(json.dumps(results, indent=1))

    for _ in range(args.rounds):  # engines in turn: A B C, A B C, ...
        for t in threads:
            results["threads"][t].append(measure_round(args, t, ",".join(shapes)))
            save()
    results["loadavg_end"] = os.getloadavg()
    save()
    print(results["table"])
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated S or MxKxN")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the engines in turn; the table quotes the median round")
    ap.add_argument("--quick", action="store_true", help="few calls per shape")
    ap.add_argument("--pto-bench", default=str(bench.REPO / "build" / "bench" / "pto_bench"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child process")
    ap.add_argument("--show", metavar="JSON",
                    help="print the tables of an earlier run's results file and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.show:
        print(markdown(json.loads(Path(args.show).read_text())))
        return 0
    if args.child:
        args.threads = int(args.threads)
        return bench.report_child(child_numpy(args), MARK)
    return main_driver(args)


if __name__ == "__main__":
    sys.exit(main())
