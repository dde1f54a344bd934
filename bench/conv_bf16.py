"""bf16 convolutions layer by layer: every distinct Conv2d (+ ReLU) of a torchvision model
(bench/conv_layers.py's collection, seed-0 weights, batch 1) compiled by PyPTO at one level in
fp32 and with bf16 products (auto_mixed_precision: fp32 inputs and outputs) or, with --precision
bf16x3, with bf16x3 ones (conv_precision="high" on every conv: PTO_CONV_SPLIT_ALL=1 drops the
ConvPrecision pass's channel rule, whose measurement this is), each engine's kernel as
`describe_step` names it, the median of interleaved repetitions and reduced / fp32 speed.

    python bench/conv_bf16.py --model resnet50 --threads 1 [--level 3] [--quick]
    python bench/conv_bf16.py --model resnet50 --precision bf16x3
    python bench/conv_bf16.py --model resnext50_32x4d --baseline taps-off --quick

--baseline taps-off times the reduced-precision model against itself with the AMX taps kernel
turned off (PTO_CONV_TAPS=0 around the baseline's calls: the implicit GEMM then), which is the
per-layer A/B behind the taps kernel's rules (docs/backend/conv.md, "the taps kernel"); the
default baseline is the fp32 model.

This is the measurement behind the Conv kernel's choice of path for bf16 convs
(docs/backend/conv.md, "bf16 products"): the fp32 kernels (blocked direct, Winograd, shifted,
implicit GEMM) against the bf16 implicit GEMM. Run it on a quiet machine, one thread count per
process (PTO_NUM_THREADS is set from --threads).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE.parent / "tests" / "python"))  # torch_models


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layers", default="", help="name patterns, comma-separated (default: all)")
    ap.add_argument("--precision", choices=("bf16", "bf16x3"), default="bf16")
    ap.add_argument("--baseline", choices=("fp32", "taps-off"), default="fp32",
                    help="what the reduced products are timed against (default: the fp32 model)")
    args = ap.parse_args()
    taps_ab = args.baseline == "taps-off"
    os.environ["PTO_NUM_THREADS"] = str(args.threads)
    os.environ["PTO_CONV_SPLIT_ALL"] = "1"  # read by bf16x3 compiles only
    import torch

    import conv_layers
    import pypto

    torch.set_num_threads(args.threads)
    pypto.set_num_threads(args.threads)
    reps, rep_s = (5, 0.002) if args.quick else (11, 0.01)
    low = args.precision
    base = f"{low} taps off" if taps_ab else "fp32"
    new_name = f"{low} taps on" if taps_ab else low
    rows = [f"| layer | count | GFLOP | {new_name if taps_ab else 'fp32'} kernel | {base} ms | "
            f"{new_name} ms | {new_name} / {base} speed | {new_name} GFLOP/s (fp32 work) |",
            "|---|---|---|---|---|---|---|---|"]
    total = {"f32": 0.0, "bf16": 0.0}
    for layer, count in conv_layers.select(conv_layers.collect_layers(args.model), args.layers):
        module = layer.module(relu=True)
        torch.manual_seed(1)
        x = torch.randn(1, layer.c, layer.h, layer.w)
        fast = {} if taps_ab else {
            "f32": pypto.optimize(module, (x,), level=args.level, conv_precision="highest")}
        if low == "bf16x3":
            fast["bf16"] = pypto.optimize(module, (x,), level=args.level, conv_precision="high")
        else:
            pypto.set_optimization_options({"auto_mixed_precision": True})
            try:
                fast["bf16"] = pypto.optimize(module, (x,), level=args.level)
            finally:
                pypto.reset_optimization_options()
        if taps_ab:  # the same compiled model, the kernel switched off around the baseline's calls
            fast["f32"] = fast["bf16"]
        switch = {"f32": "0", "bf16": "1"} if taps_ab else {}
        with torch.inference_mode():
            want = module(x)
            for key, f in fast.items():
                if switch:
                    os.environ["PTO_CONV_TAPS"] = switch[key]
                err = ((f(x) - want).abs().max() / want.abs().max()).item()
                if err > (3e-2 if (key == "bf16" or taps_ab) and low == "bf16" else 1e-3):
                    raise SystemExit(f"{layer.name()} {key}: relative error {err:.1e}")
            times = {k: [] for k in fast}
            for _ in range(reps):  # interleaved: one untimed call, then about rep_s of calls
                for key, f in fast.items():
                    if switch:
                        os.environ["PTO_CONV_TAPS"] = switch[key]
                    f(x)
                    n, t0 = 0, time.perf_counter()
                    while n == 0 or time.perf_counter() - t0 < rep_s:
                        f(x)
                        n += 1
                    times[key].append((time.perf_counter() - t0) / n)
        if switch:
            os.environ.pop("PTO_CONV_TAPS", None)
        med = {k: median(v) for k, v in times.items()}
        c = fast["f32"].compiled
        kernel = "; ".join(
            (s["rule"] or s["op"]) + (f" ({d.splitlines()[0]})" if (d := c.describe_step(i)) else "")
            for i, s in enumerate(c.steps))
        gflop = layer.flops(1) / 1e9
        for k in med:
            total[k] += med[k] * count
        rows.append(f"| {layer.name()} | {count} | {gflop:.3f} | {kernel[:60]} | "
                    f"{med['f32'] * 1e3:.3f} | {med['bf16'] * 1e3:.3f} | "
                    f"{med['f32'] / med['bf16']:.2f}x | {gflop / med['bf16']:.0f} |")
        print(rows[-1], file=sys.stderr)
    rows.append(f"| all (x count) | | | | {total['f32'] * 1e3:.2f} | {total['bf16'] * 1e3:.2f} | "
                f"{total['f32'] / total['bf16']:.2f}x | |")
    print(f"{args.model}, level {args.level}, {args.threads} thread(s)\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
