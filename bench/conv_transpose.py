"""ConvTranspose2d layers of segmentation/detection decoders, alone: PyPTO against torch eager in
the same process, interleaved, with each layer's fraction of the machine's FMA peak.

    python bench/conv_transpose.py                 # 1 thread; --threads 2; --quick
    python bench/conv_transpose.py --fma-gflops 150  # print the fraction of that peak

Layers (batch 1): DBNet's probability head (2x2 stride 2: 64 -> 64 at 160x160, 64 -> 1 at
320x320, i.e. a 640x640 image), UNet decoder steps (2x2 stride 2: 512 -> 256 at 32x32, 128 -> 64
at 128x128) and 4x4 stride 2 pad 1 upsamplers (DCGAN/pix2pix style: 256 -> 128 at 32x32, 64 -> 32
at 128x128). Each layer is a lone nn.ConvTranspose2d with seed-0 weights; pypto.optimize(level 2,
static shapes) is checked against eager (max |diff| / max |eager| <= 1e-4) and then both are timed
in interleaved repetitions (one untimed call, then calls for about 20 ms; --quick: 5 ms); the table
quotes the median of 7 repetitions (--quick: 3). FLOPs = 2 x N x Cin x H x W x Cout/groups x
kh x kw; the FMA peak is what `build/bench/pto_bench --only fma` prints for the thread count
(--fma-gflops). Run with PYTHONPATH pointing at another build's python/ to time that one (a build
without the CPU kernel runs the reference interpreter).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import pypto

# (name, Cin, Cout, H, W, kernel, stride, padding)
LAYERS = [
    ("dbnet 64->64 2x2s2 @160", 64, 64, 160, 160, 2, 2, 0),
    ("dbnet 64->1 2x2s2 @320", 64, 1, 320, 320, 2, 2, 0),
    ("unet 512->256 2x2s2 @32", 512, 256, 32, 32, 2, 2, 0),
    ("unet 128->64 2x2s2 @128", 128, 64, 128, 128, 2, 2, 0),
    ("up 256->128 4x4s2p1 @32", 256, 128, 32, 32, 4, 2, 1),
    ("up 64->32 4x4s2p1 @128", 64, 32, 128, 128, 4, 2, 1),
]


def timed(fn, seconds: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return t / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fma-gflops", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pypto.set_num_threads(args.threads)
    reps, seconds = (3, 0.005) if args.quick else (7, 0.02)
    print(f"threads {args.threads}; times in ms (median of {reps}); pypto from {pypto.__file__}")
    print(f"{'layer':26s} {'eager':>9s} {'pypto':>9s} {'pypto/eager':>11s} {'backend':>9s} "
          f"{'GFLOP/s':>8s} {'of peak':>7s}")
    for name, cin, cout, h, w, k, s, p in LAYERS:
        torch.manual_seed(0)
        layer = torch.nn.ConvTranspose2d(cin, cout, k, stride=s, padding=p).eval()
        x = torch.randn(1, cin, h, w)
        with torch.inference_mode():
            want = layer(x)
        fast = pypto.optimize(layer, (x,), level=2, dynamic=False)
        got = torch.as_tensor(fast(x))
        err = float((got - want).abs().max() / want.abs().max())
        assert err <= 1e-4, f"{name}: relative error {err}"
        backend = ",".join(sorted({b for op, b in fast.compiled.node_backends
                                   if op == "ConvTranspose"}))

        def eager():
            with torch.inference_mode():
                layer(x)

        rounds = {"eager": [], "pypto": []}
        for _ in range(reps):
            rounds["eager"].append(timed(eager, seconds))
            rounds["pypto"].append(timed(lambda: fast(x), seconds))
        te, tp = (statistics.median(rounds[e]) for e in ("eager", "pypto"))
        flops = 2 * cin * h * w * cout * k * k
        peak = f"{flops / tp / 1e9 / args.fma_gflops:7.1%}" if args.fma_gflops else f"{'-':>7s}"
        print(f"{name:26s} {te * 1e3:9.3f} {tp * 1e3:9.3f} {tp / te:11.2f} {backend:>9s} "
              f"{flops / tp / 1e9:8.1f} {peak}", flush=True)


if __name__ == "__main__":
    main()
