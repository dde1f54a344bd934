"""ConvTranspose2d layers of segmentation/detection decoders, a DBNet decoder block and GridSample,
alone: PyPTO against torch eager and ONNX Runtime in the same process, interleaved, with each
layer's GFLOP/s.

    python bench/conv_transpose.py                 # 1 thread; --threads 2; --quick; --no-ort
    python bench/conv_transpose.py --cpu-time      # process CPU time instead of wall time
    python bench/conv_transpose.py --fma-gflops 150  # print the fraction of that peak

Cases (batch 1): DBNet's probability head (2x2 stride 2: 64 -> 64 at 160x160, 64 -> 1 at
320x320, i.e. a 640x640 image), UNet decoder steps (2x2 stride 2: 512 -> 256 at 32x32, 128 -> 64
at 128x128), 4x4 stride 2 pad 1 upsamplers (DCGAN/pix2pix style: 256 -> 128 at 32x32, 64 -> 32
at 128x128), a stride-1 3x3 pad 1 (64 -> 64 at 64x64), a DBNet decoder block (ConvTranspose2d 2x2
s2 + BatchNorm2d + ReLU, 64 -> 64 at 160x160 and 256 -> 64 4x4 s2 p1 + BN + ReLU at 80x80), and
grid_sample (bilinear zeros, nearest border; 32 channels, 128x128 input, 128x128 grid). Each case
has seed-0 weights; pypto.optimize(level 2, static shapes) and ONNX Runtime (the module exported by
torch.onnx.export, graph optimizations on) are checked against eager (max |diff| / max |eager|
<= 1e-4) and then all are timed in interleaved repetitions (one untimed call, then calls for about
20 ms; --quick: 5 ms); the table quotes the median of 7 repetitions (--quick: 3). FLOPs = 2 x N x
Cin x H x W x Cout/groups x kh x kw for a ConvTranspose; the FMA peak is what
`build/bench/pto_bench --only fma` prints for the thread count (--fma-gflops). Run with
PYTHONPATH pointing at another build's python/ to time that one. --cpu-time measures the process's
CPU time rather than wall time: on a machine shared with other jobs (load above the core count)
wall times mostly measure waiting, while CPU time of a 1-thread run still compares the libraries
(it hides what other threads do, so it is meant for --threads 1).
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

import pypto


class Block(torch.nn.Module):
    """ConvTranspose2d + BatchNorm2d + ReLU (a DBNet/FPN decoder step)."""

    def __init__(self, cin, cout, k, s, p):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(cin, cout, k, stride=s, padding=p, bias=False)
        self.bn = torch.nn.BatchNorm2d(cout)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return torch.relu(self.bn(self.up(x)))


class Sample(torch.nn.Module):
    def __init__(self, mode, padding_mode):
        super().__init__()
        self.mode, self.padding_mode = mode, padding_mode

    def forward(self, x, grid):
        return F.grid_sample(x, grid, mode=self.mode, padding_mode=self.padding_mode,
                             align_corners=False)


def conv_case(cin, cout, h, w, k, s, p, block=False):
    layer = (Block(cin, cout, k, s, p) if block
             else torch.nn.ConvTranspose2d(cin, cout, k, stride=s, padding=p))
    return layer, (torch.randn(1, cin, h, w),), 2 * cin * h * w * cout * k * k


def sample_case(mode, padding_mode):
    x = torch.randn(1, 32, 128, 128)
    grid = torch.rand(1, 128, 128, 2) * 2.2 - 1.1
    return Sample(mode, padding_mode), (x, grid), 0


# (name, builder)
CASES = [
    ("dbnet 64->64 2x2s2 @160", lambda: conv_case(64, 64, 160, 160, 2, 2, 0)),
    ("dbnet 64->1 2x2s2 @320", lambda: conv_case(64, 1, 320, 320, 2, 2, 0)),
    ("unet 512->256 2x2s2 @32", lambda: conv_case(512, 256, 32, 32, 2, 2, 0)),
    ("unet 128->64 2x2s2 @128", lambda: conv_case(128, 64, 128, 128, 2, 2, 0)),
    ("up 256->128 4x4s2p1 @32", lambda: conv_case(256, 128, 32, 32, 4, 2, 1)),
    ("up 64->32 4x4s2p1 @128", lambda: conv_case(64, 32, 128, 128, 4, 2, 1)),
    ("s1 64->64 3x3p1 @64", lambda: conv_case(64, 64, 64, 64, 3, 1, 1)),
    ("block 64->64 2x2s2+BN+ReLU", lambda: conv_case(64, 64, 160, 160, 2, 2, 0, True)),
    ("block 256->64 4x4s2p1+BN+ReLU", lambda: conv_case(256, 64, 80, 80, 4, 2, 1, True)),
    ("grid_sample bilinear zeros", lambda: sample_case("bilinear", "zeros")),
    ("grid_sample nearest border", lambda: sample_case("nearest", "border")),
]


def timed(fn, seconds: float, clock=time.perf_counter) -> float:
    fn()
    n, t0 = 0, clock()
    while True:
        fn()
        n += 1
        t = clock() - t0
        if t >= seconds:
            return t / n


def ort_session(module, inputs, threads):
    import onnxruntime as ort

    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, buf, dynamo=False, opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(buf.getvalue(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
    return lambda: sess.run(None, feeds)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--fma-gflops", type=float, default=0.0)
    ap.add_argument("--cpu-time", action="store_true", help="time.process_time, not wall time")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    pypto.set_num_threads(args.threads)
    reps, seconds = (3, 0.005) if args.quick else (7, 0.02)
    print(f"threads {args.threads}; {'CPU' if args.cpu_time else 'wall'} times in ms (median of "
          f"{reps}); pypto from {pypto.__file__}")
    print(f"{'case':30s} {'eager':>8s} {'ort':>8s} {'pypto':>8s} {'/eager':>7s} {'/ort':>6s} "
          f"{'GFLOP/s':>8s} {'of peak':>7s}  kernels")
    for name, build in CASES:
        if args.only not in name:
            continue
        torch.manual_seed(0)
        module, inputs, flops = build()
        module.eval()
        with torch.inference_mode():
            want = module(*inputs)
        fast = pypto.optimize(module, inputs, level=2, dynamic=False)
        fns = {"eager": lambda: module(*inputs), "pypto": lambda: fast(*inputs)}
        if not args.no_ort:
            fns["ort"] = ort_session(module, inputs, args.threads)
        for who in ("pypto", "ort"):
            if who in fns:
                got = torch.as_tensor(fns[who]())
                err = float((got - want).abs().max() / want.abs().max())
                assert err <= 1e-4, f"{name}: {who} relative error {err}"
        kernels = ",".join(f"{s['rule'] or s['op']}[{s['backend']}]" for s in fast.compiled.steps)

        rounds = {k: [] for k in fns}
        with torch.inference_mode():
            for _ in range(reps):
                for k, fn in fns.items():
                    rounds[k].append(timed(fn, seconds, clock))
        t = {k: statistics.median(v) for k, v in rounds.items()}
        te, tp, to = t["eager"], t["pypto"], t.get("ort", float("nan"))
        gf = flops / tp / 1e9
        peak = f"{gf / args.fma_gflops:7.1%}" if args.fma_gflops and flops else f"{'-':>7s}"
        print(f"{name:30s} {te * 1e3:8.3f} {to * 1e3:8.3f} {tp * 1e3:8.3f} {tp / te:7.2f} "
              f"{tp / to:6.2f} {gf:8.1f} {peak}  {kernels}", flush=True)


if __name__ == "__main__":
    main()
