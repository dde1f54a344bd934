"""Every distinct Conv2d layer of torchvision models, alone: PyPTO (levels 2, 3) against torch
eager and ONNX Runtime, as a fraction of the machine's FMA peak (usage: bench/README.md).

    python bench/conv_layers.py                         # ResNet-50, MobileNetV2; batch 1, 8;
                                                        # threads 1, 2 (about an hour on 2 cores)
    python bench/conv_layers.py --quick --models resnet18 --batches 1 --threads 1

The layers are collected from the real models (random weights) with forward hooks on every
nn.Conv2d: input shape (C, H, W), out channels, kernel, stride, padding, dilation, groups, bias,
and how many times each shape occurs. Each layer is rebuilt as a lone nn.Conv2d (with --relu,
Conv2d + ReLU) with seed-0 weights and timed on these engines (--engines):
- eager: torch conv2d under torch.inference_mode;
- ort: ONNX Runtime on the layer exported with torch.onnx.export (a temporary folder),
  ORT_ENABLE_ALL, intra_op_num_threads=T, inter_op_num_threads=1, sequential;
- pypto: pypto.optimize(layer, example_inputs=(x,), level=L) for each L of --levels.
Every engine's output is checked against eager first (max |diff| / max |eager| <= 1e-3; the
error is reported); a wrong one is not timed.

One process per model x batch x threads (torch.set_num_threads, pypto.set_num_threads, ORT's
intra_op_num_threads and PTO_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS /
OPENBLAS_NUM_THREADS all = T; on 2+ threads OMP_WAIT_POLICY=PASSIVE unless --omp-wait-policy
says otherwise: torch's OpenMP workers spinning after an eager call would take the cores from the
engine timed next, and on a busy machine they slow eager itself by 10-60x). In it, per layer,
the engines are warmed up, then timed in interleaved repetitions (eager, ORT, L2, L3, eager,
...): each repetition is one untimed call (so the previous engine's thread pool has gone quiet)
and then enough calls for about 5 ms (--quick: 1 ms); the tables quote the median repetition of
15 (--reps; --quick: 5). The FMA peak comes from `pto_bench --only fma --quick`, run at the start
and the end (the better one counts: load only lowers it); each layer's fraction of it is
FLOPs / median / peak, with
FLOPs = 2 x N x OC x OH x OW x (C / groups) x KH x KW (bias and ReLU not counted). Per model,
the aggregate is sum(FLOPs x count) / sum(median x count), as the model would spend it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as bench  # noqa: E402 - the shared helpers: children, pto_bench, timing

MODELS = {"resnet50": "ResNet-50", "mobilenet_v2": "MobileNetV2", "resnet18": "ResNet-18"}
ENGINES = ["eager", "ort", "pypto"]
LEVELS = [2, 3]
IMAGE = 224
MARK = "@@conv-layers@@ "
# Warm-up per engine (calls, seconds); repetitions; the target length of one repetition.
FULL = dict(warmup_calls=3, warmup_s=0.3, reps=15, rep_s=0.005)
QUICK = dict(warmup_calls=1, warmup_s=0.0, reps=5, rep_s=0.001)


@dataclasses.dataclass(frozen=True)
class Layer:
    c: int
    h: int
    w: int
    oc: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool

    def out_hw(self) -> tuple[int, int]:
        return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in
                     zip((self.h, self.w), self.padding, self.dilation, self.kernel, self.stride))

    def flops(self, batch: int) -> int:
        oh, ow = self.out_hw()
        return 2 * batch * self.oc * oh * ow * (self.c // self.groups) * self.kernel[0] * \
            self.kernel[1]

    def name(self) -> str:
        """E.g. "64->256 @56 1x1", "96->96 @112 3x3 s2 dw", "3->64 @224 7x7 s2 p3"."""
        size = f"{self.h}" if self.h == self.w else f"{self.h}x{self.w}"
        parts = [f"{self.c}->{self.oc} @{size} {self.kernel[0]}x{self.kernel[1]}"]
        if self.stride != (1, 1):
            parts.append(f"s{self.stride[0]}" if self.stride[0] == self.stride[1]
                         else f"s{self.stride[0]}x{self.stride[1]}")
        if self.padding != tuple(k // 2 for k in self.kernel):
            parts.append(f"p{self.padding[0]}" if self.padding[0] == self.padding[1]
                         else f"p{self.padding[0]}x{self.padding[1]}")
        if self.dilation != (1, 1):
            parts.append(f"d{self.dilation[0]}")
        if self.groups > 1:
            parts.append("dw" if self.groups == self.c == self.oc else f"g{self.groups}")
        if self.bias:
            parts.append("+bias")
        return " ".join(parts)

    def module(self, relu: bool):
        import torch

        torch.manual_seed(0)
        conv = torch.nn.Conv2d(self.c, self.oc, self.kernel, self.stride, self.padding,
                               self.dilation, self.groups, self.bias)
        return (torch.nn.Sequential(conv, torch.nn.ReLU()) if relu else conv).eval()


def collect_layers(model_name: str) -> list[tuple[Layer, int]]:
    """The distinct Conv2d layers of the model, in order of first use, with their counts."""
    import torch

    import torch_models

    model = torch_models.build(model_name)
    counts: collections.Counter[Layer] = collections.Counter()

    def hook(conv, inputs, _output):
        if isinstance(conv.padding, str):
            raise NotImplementedError(f"padding='{conv.padding}' in {model_name}")
        _, c, h, w = inputs[0].shape
        counts[Layer(c, h, w, conv.out_channels, tuple(conv.kernel_size), tuple(conv.stride),
                     tuple(conv.padding), tuple(conv.dilation), conv.groups,
                     conv.bias is not None)] += 1

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    with torch.inference_mode():
        model(torch.randn(1, 3, IMAGE, IMAGE))
    for h in handles:
        h.remove()
    return list(counts.items())


def select(layers: list[tuple[Layer, int]], patterns: str) -> list[tuple[Layer, int]]:
    """The layers whose name contains one of the comma-separated patterns (all when empty)."""
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    return [(lay, n) for lay, n in layers if not wanted or any(p in lay.name() for p in wanted)]


# ---- the child: one model x batch x threads ----

def setup_eager(module, x, threads: int, level, tmp: Path) -> Callable:
    return lambda: module(x)


def setup_ort(module, x, threads: int, level, tmp: Path) -> Callable:
    import torch

    path = tmp / "layer.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's notice
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["input"])
    sess = bench.ort_session(str(path), threads)
    feed = {"input": x.numpy()}
    return lambda: torch.from_numpy(sess.run(None, feed)[0])


def setup_pypto(module, x, threads: int, level, tmp: Path) -> Callable:
    import pypto

    fast = pypto.optimize(module, example_inputs=(x,), level=level)
    return lambda: fast(x)


SETUP = {"eager": setup_eager, "ort": setup_ort, "pypto": setup_pypto}


def prepare(keys: list[str], module, x, want, threads: int, tmp: Path) -> tuple[dict, dict]:
    """Sets up each engine and checks its output against eager: the runnable ones, and per key
    its status, setup time and max relative error."""
    import torch

    import torch_models

    runners, info = {}, {}
    for key in keys:
        engine, level = ("pypto", int(key[5:])) if key.startswith("pypto") else (key, None)
        t0 = time.perf_counter()
        try:
            fn = SETUP[engine](module, x, threads, level, tmp)
            with torch.inference_mode():
                got = fn().detach()
        except Exception as e:  # noqa: BLE001 - recorded; the other engines carry on
            info[key] = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:1000]}
            continue
        r = {"setup_s": time.perf_counter() - t0}
        if got.shape != want.shape or got.dtype != want.dtype:
            r.update(status="wrong", error=f"output {got.dtype}{list(got.shape)}")
        else:
            r["max_rel_err"] = torch_models.relative_error(got, want)
            ok = r["max_rel_err"] <= bench.TOLERANCE
            r.update(status="ok" if ok else "wrong")
            if ok:
                runners[key] = fn
        info[key] = r
    return runners, info


def interleaved(runners: dict[str, Callable], protocol: dict) -> dict[str, dict]:
    """Warms each runner up, then times them in turn, repetition by repetition: one untimed
    call, then `inner` calls (about rep_s long); the summary of the per-call times."""
    inner = {}
    for key, fn in runners.items():
        start, n = time.perf_counter(), 0
        while n < protocol["warmup_calls"] or time.perf_counter() - start < protocol["warmup_s"]:
            fn()
            n += 1
        t0 = time.perf_counter()
        fn()
        inner[key] = max(1, min(1000, round(protocol["rep_s"] / (time.perf_counter() - t0))))
    times = {key: [] for key in runners}
    for _ in range(protocol["reps"]):
        for key, fn in runners.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(inner[key]):
                fn()
            times[key].append((time.perf_counter() - t0) / inner[key])
    return {key: {**bench.summary(ts), "inner": inner[key]} for key, ts in times.items()}


def child(args) -> dict:
    import torch

    bench.child_setup(args.threads)
    import pypto

    pypto.set_num_threads(args.threads)
    protocol = dict(QUICK if args.quick else FULL)
    if args.reps:
        protocol["reps"] = args.reps
    keys = bench.config_keys(args.engines.split(","), [int(v) for v in args.levels.split(",")])
    layers = select(collect_layers(args.model), args.layers)
    out = {"model": args.model, "batch": args.batch, "threads": args.threads, "keys": keys,
           "relu": args.relu, "protocol": protocol, "torch_threads": torch.get_num_threads(),
           "pypto_threads": pypto.get_num_threads(), "loadavg_start": os.getloadavg(),
           "layers": []}
    with tempfile.TemporaryDirectory(prefix="pto-conv-layers-") as d:
        for i, (layer, count) in enumerate(layers):
            print(f"[{i + 1}/{len(layers)}] {MODELS[args.model]} batch {args.batch} threads "
                  f"{args.threads}: {layer.name()} (x{count}), load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr, flush=True)
            module = layer.module(args.relu)
            torch.manual_seed(1)
            x = torch.randn(args.batch, layer.c, layer.h, layer.w)
            with torch.inference_mode():
                want = module(x)
            runners, info = prepare(keys, module, x, want, args.threads, Path(d))
            with torch.inference_mode():
                for key, r in interleaved(runners, protocol).items():
                    info[key].update(r)
            out["layers"].append({"layer": dataclasses.asdict(layer), "name": layer.name(),
                                  "count": count, "flops": layer.flops(args.batch),
                                  "results": info})
    out["loadavg_end"] = os.getloadavg()
    out["status"] = "ok"
    return out


# ---- the driver ----

def main_driver(args) -> int:
    models = bench.parse_list(args.models, list(MODELS), "models")
    engines = bench.parse_list(args.engines, ENGINES, "engines")
    levels = bench.parse_list(args.levels, bench.LEVELS, "levels", int)
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    bench_bin = Path(args.pto_bench)
    if not bench_bin.is_file():
        sys.exit(f"{bench_bin} is missing: build it (scripts/bench.sh does)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"conv-layers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
               "quick": args.quick, "relu": args.relu, "loadavg_start": os.getloadavg(),
               "fma": {}, "runs": []}

    def save():
        results["table"] = markdown(results)
        path.write_text(json.dumps(results, indent=1))

    def measure_fma():
        for t in threads:
            print(f"== pto_bench --only fma, {t} thread(s)", file=sys.stderr)
            results["fma"].setdefault(t, []).append(
                bench.pto_bench(bench_bin, t, "fma", True, args.timeout))

    measure_fma()
    for m in models:
        for b in batches:
            for t in threads:
                print(f"== {MODELS[m]} batch {b} threads {t}", file=sys.stderr)
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", m,
                       "--batch", str(b), "--threads", str(t), "--engines", ",".join(engines),
                       "--levels", ",".join(map(str, levels)), "--layers", args.layers,
                       "--reps", str(args.reps), *(["--quick"] if args.quick else []),
                       *(["--relu"] if args.relu else [])]
                policy = args.omp_wait_policy if t > 1 else "default"
                env = bench.child_env(t, None if policy == "default" else policy)
                r = bench.run_child(cmd, env, args.timeout, marker=MARK)
                r["omp_wait_policy"] = policy
                r.update(model=m, batch=b, threads=t)
                results["runs"].append(r)
                save()
    measure_fma()
    results["loadavg_end"] = os.getloadavg()
    save()
    print(results["table"])
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


# ---- the tables ----

def cell(r: dict | None, flops: int, peak: float | None) -> str:
    """'1.23 ms, 80 GF/s (45%)', or why there is no time."""
    if not r:
        return "-"
    if r["status"] != "ok":
        return r["status"].upper()
    gflops = flops / r["median"] / 1e9
    frac = f" ({100 * gflops / peak:.0f}%)" if peak else ""
    return f"{r['median'] * 1e3:.3f} ms, {gflops:.0f} GF/s{frac}"


def best_pypto(results: dict) -> dict | None:
    done = [r for k, r in results.items() if k.startswith("pypto") and r["status"] == "ok"]
    return min(done, key=lambda r: r["median"]) if done else None


def speedup(results: dict, peer: str) -> str:
    mine, other = best_pypto(results), results.get(peer)
    if not mine or not other or other["status"] != "ok":
        return "-"
    return f"{other['median'] / mine['median']:.2f}x"


def layer_table(run: dict, peak: float | None) -> list[str]:
    keys = run["keys"]
    head = ["layer", "count", "MFLOP", *(bench.key_title(k) for k in keys)]
    peers = [k for k in ("eager", "ort") if k in keys]
    if any(k.startswith("pypto") for k in keys):
        head += [f"best PyPTO vs {bench.key_title(k)}" for k in peers]
    head.append("max rel. error")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lay in run["layers"]:
        res = lay["results"]
        row = [lay["name"], str(lay["count"]), f"{lay['flops'] / 1e6:.1f}",
               *(cell(res.get(k), lay["flops"], peak) for k in keys)]
        if any(k.startswith("pypto") for k in keys):
            row += [speedup(res, k) for k in peers]
        errs = [r["max_rel_err"] for r in res.values() if "max_rel_err" in r]
        row.append(f"{max(errs):.0e}" if errs else "-")
        rows.append("| " + " | ".join(row) + " |")
    return rows


def aggregate(run: dict, key: str) -> tuple[float, float, int] | None:
    """sum(FLOPs x count), sum(median x count) and how many layers were timed, over the layers
    the engine ran."""
    flops = seconds = 0.0
    n = 0
    for lay in run["layers"]:
        r = lay["results"].get(key)
        if r and r["status"] == "ok":
            flops += lay["flops"] * lay["count"]
            seconds += r["median"] * lay["count"]
            n += 1
    return (flops, seconds, n) if n else None


def aggregate_table(results: dict) -> list[str]:
    runs = [r for r in results["runs"] if r.get("status") == "ok"]
    if not runs:
        return []
    keys = runs[0]["keys"]
    head = ["model", "batch", "threads", "FMA peak GFLOP/s",
            *(f"{bench.key_title(k)} ms, % peak" for k in keys)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        peak = fma_peak(results, run["threads"])
        row = [MODELS[run["model"]], str(run["batch"]), str(run["threads"]),
               f"{peak:.1f}" if peak else "-"]
        for k in keys:
            agg = aggregate(run, k)
            if not agg:
                row.append("-")
                continue
            flops, seconds, n = agg
            frac = f", {100 * flops / seconds / 1e9 / peak:.0f}%" if peak else ""
            missing = f" ({n}/{len(run['layers'])} layers)" if n < len(run["layers"]) else ""
            row.append(f"{seconds * 1e3:.2f}{frac}{missing}")
        rows.append("| " + " | ".join(row) + " |")
    return rows


def best_fma(results: dict, threads: int) -> dict | None:
    """The best FMA measurement on `threads` threads (at the start or the end of the run)."""
    return bench.best_fma(results["fma"].get(threads) or results["fma"].get(str(threads)) or [],
                          threads)


def fma_peak(results: dict, threads: int) -> float | None:
    f = best_fma(results, threads)
    return f["gflops"] if f else None


def markdown(results: dict) -> str:
    parts = []
    load = results["loadavg_start"]
    note = (f"Load average at the start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 "
            f"min)")
    if "loadavg_end" in results:
        end = results["loadavg_end"]
        note += f", at the end {end[0]:.2f} / {end[1]:.2f} / {end[2]:.2f}"
    peaks = [(t, best_fma(results, int(t))) for t in results["fma"]]
    note += "; FMA peak (pto_bench --only fma --quick, best of the start and the end): " + \
        "; ".join(bench.fma_note(f, int(t)) for t, f in peaks if f)
    parts.append(note + f"; {'Conv2d + ReLU' if results['relu'] else 'Conv2d alone'}; cells: "
                 "median ms, GFLOP/s (% of the FMA peak).")
    agg = aggregate_table(results)
    if agg:
        parts.append("Per model, sum(FLOPs x count) / sum(time x count):\n\n" + "\n".join(agg))
    failed = []
    for run in results["runs"]:
        what = f"{MODELS[run['model']]}, batch {run['batch']}, {run['threads']} thread(s)"
        if run.get("status") != "ok":
            failed.append(f"- {what}: {run.get('error', '?')}")
            continue
        peak = fma_peak(results, run["threads"])
        la, lb = run["loadavg_start"][0], run["loadavg_end"][0]
        policy = run.get("omp_wait_policy", "default")
        title = (f"{what} (FMA peak {peak:.1f} GFLOP/s" if peak else f"{what} (no FMA peak") + \
            f", load {la:.1f} -> {lb:.1f}" + \
            (f", OMP_WAIT_POLICY={policy})" if policy != "default" else ")")
        parts.append(f"{title}:\n\n" + "\n".join(layer_table(run, peak)))
        for lay in run["layers"]:
            for k, r in lay["results"].items():
                if r["status"] != "ok":
                    failed.append(f"- {what}, {lay['name']}, {bench.key_title(k)}: "
                                  f"{r['status']}: {r.get('error', '?')[:300]}")
    if failed:
        parts.append("Failed or wrong:\n" + "\n".join(failed))
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2",
                    help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)),
                    help="PyPTO optimization levels (default 2,3)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"from {', '.join(ENGINES)}")
    ap.add_argument("--layers", default="",
                    help="only the layers whose name contains one of these comma-separated "
                         "strings, e.g. '3x3,@7' (names as in the table)")
    ap.add_argument("--relu", action="store_true", help="time Conv2d + ReLU (the fused epilogue)")
    ap.add_argument("--omp-wait-policy", default="PASSIVE",
                    choices=["PASSIVE", "ACTIVE", "default"],
                    help="OMP_WAIT_POLICY on 2+ threads (default PASSIVE; 'default': unset)")
    ap.add_argument("--quick", action="store_true", help="short warm-up, 5 short repetitions")
    ap.add_argument("--reps", type=int, default=0, help="repetitions (default 15, quick 5)")
    ap.add_argument("--pto-bench", default=str(bench.REPO / "build" / "bench" / "pto_bench"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per child process")
    ap.add_argument("--show", metavar="JSON",
                    help="print the tables of an earlier run's results file and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.show:
        print(markdown(json.loads(Path(args.show).read_text())))
        return 0
    if args.child:
        args.threads = int(args.threads)
        try:
            r = child(args)
        except Exception as e:  # noqa: BLE001 - reported to the driver, which carries on
            traceback.print_exc()
            r = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        return bench.report_child(r, MARK)
    return main_driver(args)


if __name__ == "__main__":
    sys.exit(main())
