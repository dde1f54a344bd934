"""pypto.optimize on a whole model: torchvision's ResNet-18 (random weights, nothing downloaded).

Compiles the model once from a batch-1 example; the batch is symbolic, so batch 1 and batch 4
then run through the same compiled module. Prints the largest difference from PyTorch eager
(relative to the largest logit) and the time of each, measured in this process on this machine.
PyPTO compiles it at level 2 (BatchNorm folded, Conv+ReLU and residual adds fused, memory
planned) and runs the kernels on its CPU backend (AVX-512, AVX2 or generic, chosen from the CPU),
on the same number of threads as eager (pypto.set_num_threads and torch.set_num_threads).

Run from the root of a clone, after building the extension (see docs/python.md):

    PYTHONPATH=python python examples/optimize_resnet.py

Exits non-zero if an output differs from eager by more than 1e-4 (relative).
"""

import statistics
import sys
import time

import torch
import torchvision

import pypto

IMAGE = 112  # smaller than ImageNet's 224 so the example runs in seconds on a small machine


def median_ms(fn, x, repeat=10):
    times = []  # the correctness check before this was the warm-up
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    torch.manual_seed(0)
    threads = 1
    torch.set_num_threads(threads)
    pypto.set_num_threads(threads)
    model = torchvision.models.resnet18().eval()  # random weights
    t0 = time.perf_counter()
    fast = pypto.optimize(model, example_inputs=(torch.randn(1, 3, IMAGE, IMAGE),))
    print(f"optimize: {time.perf_counter() - t0:.1f} s, symbolic dims {fast.dynamic_dims}")

    ok = True
    with torch.no_grad():
        for batch in (1, 4):
            x = torch.randn(batch, 3, IMAGE, IMAGE)
            got, want = fast(x), model(x)
            err = ((got - want).abs().max() / want.abs().max()).item()
            ok &= got.shape == want.shape and err <= 1e-4
            t_fast, t_eager = median_ms(fast, x), median_ms(model, x)
            print(f"batch {batch}: output {tuple(got.shape)}, max relative error {err:.1e}; "
                  f"pypto {t_fast:.0f} ms, eager {t_eager:.0f} ms "
                  f"(median of 10, {threads} thread: speed-up {t_eager / t_fast:.2f}x)")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
