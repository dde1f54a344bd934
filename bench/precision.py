"""Reduced precision against its peers, in one run, as markdown (rules: BENCHMARKING.md).

    python bench/precision.py                          # BERT-base and GPT-2 small, 1 and 2 threads
    python bench/precision.py --models bert --threads 1 --quick
    python bench/precision.py --models resnet50,mobilenet_v2 --engines eager,eager-bf16,pypto,pypto-bf16

Measures, on each thread count, in one process per configuration, engines interleaved:
- the ceilings with build/bench/pto_bench: the FMA peak and, where the CPU has AVX512_BF16, the
  VDPBF16PS peak; PyPTO's GEMM in fp32 and bf16 on the models' shapes (B packed ahead, as a
  Linear runs), GFLOP/s and the fraction of each ceiling;
- models (bench/run.py's, random weights, seed 0, batch 1, sequence 128; the conv nets,
  resnet50 and mobilenet_v2, at 224x224, their convs bf16 too) on:
  - eager: PyTorch eager, fp32, under torch.inference_mode (the floor);
  - eager-bf16: the same under torch.autocast("cpu", dtype=torch.bfloat16);
  - ort: ONNX Runtime fp32 (bench/run.py's settings, the same cached export);
  - inductor: torch.compile (Inductor, freezing) fp32, as bench/run.py runs it;
  - inductor-bf16: the same compiled and called under torch.autocast("cpu", dtype=torch.bfloat16)
    (the bf16 peer: oneDNN's bf16 kernels, on AMX where the CPU has it);
  - pypto: pypto.optimize(model, level=2), fp32 (--level: another level for every pypto engine);
  - pypto-bf16: pypto.optimize(model, level=2, dtype=torch.bfloat16);
  - inductor-high: inductor with torch.backends.mkldnn.fp32_precision = "tf32" (the matmuls'
    and convolutions' "high"; PyTorch's CPU matmuls and convs stay fp32 under it: TF32 is a GPU
    format, and oneDNN has no bf16x3);
  - pypto-high: pypto.optimize(model, level=2, matmul_precision="high", conv_precision="high"):
    the float32 products (MatMul, Gemm, convs of 128+ channels) as three bf16 products of heads
    and tails (bf16x3) where the CPU has AMX-BF16;
  - eager-int8: torch.ao.quantization.quantize_dynamic(model, {Linear}, torch.qint8) (eager;
    transformers only: it leaves convolutions in fp32);
  - ort-int8: ONNX Runtime on the export quantized by onnxruntime.quantization.quantize_dynamic
    (transformers: QInt8 weights) or quantize_static (conv nets: QDQ form, or QOperator with
    --ort-format qoperator; QUInt8 activations, QInt8 weights per channel, calibrated on
    CALIBRATION random batches); cached beside the export;
  - pypto-int8: the same quantized ONNX file through pypto.onnx.load (level 2): its integer ops
    (DynamicQuantizeLinear, MatMulInteger, fused into DynamicQuantizeMatMul) on PyPTO's int8
    kernels;
  - pypto-quant: pypto.quantization: quantize_dynamic(model) for transformers (int8 weights per
    channel, activations per row), calibrate(model, the same random batches) for conv nets;
    pypto.optimize(level=2).
  Each engine's output is checked against eager fp32 first: within 1e-3 (fp32), 3e-2 (bf16) or
  0.25 (int8: dynamic quantization of random weights) of max |eager|; each error is in the JSON
  and the table.
The JSON and the table go to bench/results/precision.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (bench/run.py: children, timing, exports, ceilings)

REPO = base.REPO
ENGINES = ["eager", "eager-bf16", "ort", "inductor", "inductor-bf16", "pypto", "pypto-bf16",
           "inductor-high", "pypto-high", "eager-int8",
           "ort-int8", "pypto-int8", "pypto-quant"]
TITLES = {"eager": "eager fp32", "eager-bf16": "eager autocast bf16", "ort": "ORT fp32",
          "inductor-bf16": "Inductor autocast bf16",
          "inductor": "Inductor fp32", "pypto": "PyPTO fp32", "pypto-bf16": "PyPTO bf16",
          "inductor-high": "Inductor 'high' (tf32)", "pypto-high": "PyPTO 'high' (bf16x3)",
          "eager-int8": "eager int8 (dynamic)",
          "ort-int8": "ORT int8", "pypto-int8": "PyPTO int8 (ORT's file)",
          "pypto-quant": "PyPTO int8 (pypto.quantization)"}
TOLERANCE = {"eager-bf16": 3e-2, "pypto-bf16": 3e-2, "inductor-bf16": 3e-2, "eager-int8": 0.25, "ort-int8": 0.25,
             "pypto-int8": 0.25, "pypto-quant": 0.25}
MODELS = ["bert", "gpt2"]
CALIBRATION = 4  # random batches for static quantization (ORT's quantize_static, calibrate)


def calibration_batches(model: str) -> list:
    """The random inputs static quantization calibrates on (seeded; not the timed input)."""
    import torch

    g = torch.Generator().manual_seed(7)
    return [torch.randn(1, 3, base.IMAGE, base.IMAGE, generator=g) for _ in range(CALIBRATION)]
GEMM_SHAPES = "128x768x768,128x768x3072,128x3072x768,1024"


def child(args) -> dict:
    import torch

    base.child_setup(args.threads)
    import torch_models

    result = {"model": args.model, "batch": 1, "threads": args.threads, "engine": args.engine}
    print(f"{args.engine} {args.model} threads {args.threads}", file=sys.stderr)
    model = base.build_model(args.model)
    x = base.model_inputs(args.model, 1)
    with torch.inference_mode():
        want = torch_models.first_tensor(model(*x))
    try:
        if args.engine == "eager":
            run = lambda: model(*x)  # noqa: E731
            got = None
        elif args.engine == "eager-bf16":
            def run():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return model(*x)
            with torch.inference_mode():
                got = torch_models.first_tensor(run()).float()
        elif args.engine in ("inductor", "inductor-bf16", "inductor-high"):
            if args.engine == "inductor-high":
                torch.backends.mkldnn.fp32_precision = "tf32"
            run, got = base.setup_inductor(args, model, x, result,
                                           bf16=args.engine == "inductor-bf16")
        elif args.engine in ("ort", "ort-int8"):
            run, got = base.setup_ort(args, model, x, result)
        elif args.engine == "eager-int8" and base.MODELS[args.model][1] == "image":
            result.update(status="n/a", error="torch.ao quantize_dynamic leaves convolutions fp32")
            return result
        elif args.engine == "eager-int8":
            q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)
            run = lambda: q(*x)  # noqa: E731
            with torch.inference_mode():
                got = torch_models.first_tensor(run())
        elif args.engine == "pypto-int8":
            import pypto

            pypto.set_num_threads(args.threads)
            t0 = time.perf_counter()
            om = pypto.onnx.load(args.onnx, level=args.level)
            result["compile_s"] = time.perf_counter() - t0
            result["node_backends"] = dict(collections.Counter(
                f"{op}:{b}" for op, b in om._compiled.node_backends))
            feed = [t.numpy() for t in x]
            run = lambda: om(*feed)  # noqa: E731
            out = run()
            got = torch.from_numpy(out[0] if isinstance(out, (list, tuple)) else out)
        else:
            import pypto

            pypto.set_num_threads(args.threads)
            dtype = torch.bfloat16 if args.engine == "pypto-bf16" else None
            t0 = time.perf_counter()
            if args.engine == "pypto-quant" and base.MODELS[args.model][1] == "image":
                model = pypto.quantization.calibrate(model, calibration_batches(args.model))
            elif args.engine == "pypto-quant":
                model = pypto.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)
            high = "high" if args.engine == "pypto-high" else None
            fast = pypto.optimize(model, example_inputs=x, level=args.level, dtype=dtype,
                                  matmul_precision=high, conv_precision=high)
            result["compile_s"] = time.perf_counter() - t0
            result["level"] = args.level
            result["kernels"] = sorted({s["rule"] or s["op"] for s in fast.compiled.steps})
            run = lambda: fast(*x)  # noqa: E731
            with torch.inference_mode():
                got = torch_models.first_tensor(fast(*x)).float()
            if dtype is not None or args.engine == "pypto-quant":
                result["precision_report_max_rel"] = fast.precision_report().max_rel_error
        if got is not None:
            err = torch_models.relative_error(got, want)
            result["max_rel_err"] = err
            if not err <= TOLERANCE.get(args.engine, base.TOLERANCE):
                result.update(status="wrong", error=f"max relative error {err:.2e}")
                return result
        with torch.inference_mode():
            result.update(base.measure(run, base.QUICK if args.quick else base.FULL))
        result["peak_rss_mib"] = base.peak_rss_mib()
        result["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - recorded; the driver carries on
        import traceback

        traceback.print_exc()
        result.update(status="failed", error=f"{type(e).__name__}: {e}"[:2000])
    return result


def quantize(export: dict, model: str, fmt: str = "qdq") -> str | None:
    """The export quantized by onnxruntime.quantization (quantize_dynamic with QInt8 weights for
    transformers, quantize_static in QDQ or QOperator form (`fmt`) for conv nets), cached beside
    it; None when that fails."""
    if not base.ok(export):
        return None
    src = Path(export["path"])
    image = base.MODELS[model][1] == "image"
    dst = src.with_name(("model.int8s.onnx" if fmt == "qdq" else "model.int8s.qop.onnx")
                        if image else "model.int8.onnx")
    if not dst.is_file():
        try:
            from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                                  quantize_dynamic, quantize_static)

            if image:
                class Reader(CalibrationDataReader):
                    def __init__(self, name):
                        self.batches = iter([{name: b.numpy()}
                                             for b in calibration_batches(model)])

                    def get_next(self):
                        return next(self.batches, None)

                import onnx

                name = onnx.load(str(src), load_external_data=False).graph.input[0].name
                quant_format = QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator
                if fmt == "qoperator":  # QOperator needs the exporter's Constants as initializers
                    from onnxruntime.quantization.shape_inference import quant_pre_process

                    pre = dst.with_name("model.pre.onnx")
                    quant_pre_process(str(src), str(pre))
                    src = pre
                quantize_static(str(src), str(dst), Reader(name), quant_format=quant_format,
                                per_channel=True, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8)
            else:
                quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        except Exception as e:  # noqa: BLE001 - the int8 engines are then failed, not the run
            print(f"quantization failed: {e}", file=sys.stderr)
            return None
    return str(dst)


def cmd(args, *extra) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *(["--quick"] if args.quick else []),
            "--level", str(args.level), *extra]


def gemm_table(pbs: dict) -> list[str]:
    rows = ["| threads | shape M x K x N | fp32 GFLOP/s | bf16 GFLOP/s | int8 GOPS | bf16 / fp32 | "
            "int8 / fp32 | fp32 % of FMA peak | bf16 % of its peak (AMX or VDPBF16PS) | "
            "bf16x3 fp32-GFLOP/s | bf16x3 / fp32 | bf16x3 % of FMA peak |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def med(g):
        return g["median"] if isinstance(g, dict) else g

    for t, pb in pbs.items():
        if not pb:
            continue
        peaks = {f["isa"]: med(f["gflops"]) for f in pb.get("fma", []) if f["threads"] == t}
        fma = max((v for k, v in peaks.items() if k in ("avx512", "avx2", "generic")), default=0)
        dp, amx = peaks.get("avx512_bf16"), peaks.get("amx_bf16")
        by, bf16_peak = {}, {}
        for s in pb.get("sgemm", []):
            if "gflops" in s:
                by.setdefault((s["m"], s["k"], s["n"]), {})[s["precision"]] = med(s["gflops"])
                if s["precision"] == "bf16":  # the ceiling of the kernel its plan ran
                    bf16_peak[(s["m"], s["k"], s["n"])] = amx if "AMX" in s.get("plan", "") else dp
        for s in pb.get("igemm", []):
            if "gops" in s and s["threads"] == t:
                by.setdefault((s["m"], s["k"], s["n"]), {})["int8"] = med(s["gops"])
        for (m, k, n), v in by.items():
            f32, b16, i8, x3 = v.get("f32"), v.get("bf16"), v.get("int8"), v.get("bf16x3")

            def num(x, fmt="{:.0f}"):
                return fmt.format(x) if x else "-"

            rows.append(f"| {t} | {m} x {k} x {n} | {num(f32)} | {num(b16)} | {num(i8)} | "
                        f"{num(b16 / f32 if b16 and f32 else None, '{:.2f}x')} | "
                        f"{num(i8 / f32 if i8 and f32 else None, '{:.2f}x')} | "
                        f"{num(100 * f32 / fma if f32 and fma else None, '{:.0f}%')} | "
                        f"{num(100 * b16 / bf16_peak[(m, k, n)] if b16 and bf16_peak.get((m, k, n)) else None, '{:.0f}%')} | "
                        f"{num(x3)} | {num(x3 / f32 if x3 and f32 else None, '{:.2f}x')} | "
                        f"{num(100 * x3 / fma if x3 and fma else None, '{:.0f}%')} |")
        rows.append(f"| {t} | ceilings | FMA {fma:.0f} | VDPBF16PS {dp or 0:.0f}"
                    f"{f', AMX {amx:.0f}' if amx else ''} | | | | | | | | |")
    return rows


def model_table(results: list[dict]) -> list[str]:
    head = ["model", "threads", *(TITLES[e] for e in ENGINES), "PyPTO bf16 vs fp32",
            "vs eager bf16", "vs Inductor bf16", "vs ORT fp32", "vs Inductor fp32",
            "PyPTO 'high' vs ORT fp32", "vs Inductor fp32", "vs Inductor 'high'",
            "PyPTO int8 vs ORT int8",
            "vs eager int8", "PyPTO quantization vs ORT int8", "vs eager int8",
            "bf16 rel. error (PyPTO / eager / Inductor)",
            "'high' rel. error (PyPTO / Inductor; PyPTO fp32)",
            "int8 rel. error (PyPTO ORT file / pypto.quantization / ORT / eager)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        res = r["results"]

        def cell(e):
            x = res.get(e) or {}
            if x.get("status") == "ok":
                return f"{x['median'] * 1e3:.2f} ms"
            return x.get("status", "-")

        def ratio(a, b):
            x, y = res.get(a) or {}, res.get(b) or {}
            ok = x.get("status") == "ok" and y.get("status") == "ok"
            return f"{x['median'] / y['median']:.2f}x" if ok else "-"

        def errs(engines):
            return " / ".join(f"{(res.get(e) or {}).get('max_rel_err', float('nan')):.1e}"
                              for e in engines)

        rows.append("| " + " | ".join([base.MODELS[r["model"]][0], str(r["threads"]),
                                       *(cell(e) for e in ENGINES),
                                       ratio("pypto", "pypto-bf16"),
                                       ratio("eager-bf16", "pypto-bf16"),
                                       ratio("inductor-bf16", "pypto-bf16"),
                                       ratio("ort", "pypto-bf16"),
                                       ratio("inductor", "pypto-bf16"),
                                       ratio("ort", "pypto-high"),
                                       ratio("inductor", "pypto-high"),
                                       ratio("inductor-high", "pypto-high"),
                                       ratio("ort-int8", "pypto-int8"),
                                       ratio("eager-int8", "pypto-int8"),
                                       ratio("ort-int8", "pypto-quant"),
                                       ratio("eager-int8", "pypto-quant"),
                                       errs(("pypto-bf16", "eager-bf16", "inductor-bf16")),
                                       errs(("pypto-high", "inductor-high", "pypto")),
                                       errs(("pypto-int8", "pypto-quant", "ort-int8",
                                             "eager-int8"))]) + " |")
    return rows


def driver(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in args.threads.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e} (known: {', '.join(ENGINES)})")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in base.MODELS:
            raise SystemExit(f"unknown model {m} (known: {', '.join(base.MODELS)})")
    pbs = {}
    for t in threads:
        pbs[t] = base.pto_bench(Path(args.pto_bench), t, "fma,sgemm,igemm", args.quick, args.timeout,
                                ("--precision", "f32,bf16,bf16x3", "--packed", "b", "--shapes",
                                 GEMM_SHAPES))
    results = []
    for m in models:
        for t in threads:
            export = base.ensure_export(args, m, 1, t)
            quantized = quantize(export, m, args.ort_format)
            res = {}
            for e in engines:
                extra = ["--child", "--model", m, "--engine", e]
                if e in ("ort", "ort-int8", "pypto-int8"):
                    path = export.get("path") if e == "ort" else quantized
                    if not base.ok(export) or not path:
                        res[e] = {"status": "failed", "error": "export or quantization failed"}
                        continue
                    extra += ["--onnx", path]
                env = base.child_env(t)
                cache = None
                if e.startswith("inductor"):  # a cold cache, compiled on the child's own thread
                    cache = tempfile.mkdtemp(prefix="pto-bench-inductor-")
                    env.update(TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1")
                try:
                    res[e] = base.run_child(cmd(args, "--threads", str(t), *extra), env,
                                            args.timeout)
                finally:
                    if cache:
                        shutil.rmtree(cache, ignore_errors=True)
            results.append({"model": m, "threads": t, "results": res})
            (out / "precision.json").write_text(json.dumps(
                {"gemm": pbs, "level": args.level, "models": results}, indent=1))
    text = ("\n".join(gemm_table(pbs)) + f"\n\nPyPTO at level {args.level}:\n\n" +
            "\n".join(model_table(results)) + "\n")
    (out / "precision.md").write_text(text)
    print(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--level", type=int, choices=(0, 1, 2, 3), default=2,
                    help="PyPTO's graph optimization level for the pypto engines (3: blocked "
                         "layouts for conv nets)")
    ap.add_argument("--ort-format", choices=("qdq", "qoperator"), default="qdq",
                    help="quantize_static's format for the conv nets' int8 file")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"comma-separated, from {', '.join(ENGINES)} (default: all)")
    ap.add_argument("--pto-bench", default=str(REPO / "build" / "bench" / "pto_bench"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        return base.report_child(child(args))
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
