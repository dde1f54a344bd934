"""The main job: a model optimized by PyPTO, checked against PyTorch eager, with its speed against
eager and where its time goes. scripts/demo.sh installs and builds what is missing first.

    python scripts/demo.py [MODEL] [--batch N] [--repeat N] [--threads N]

MODEL is one of the PyTorch-test zoo (default resnet18 at 224x224; see tests/python/
torch_models.py), built with random weights, never downloaded.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import pypto  # noqa: E402
import torch_models as tm  # noqa: E402

TOLERANCE = 1e-4  # the model tests' bound: max|pypto - eager| / max|eager|


def median_seconds(fn, repeat: int) -> float:
    for _ in range(3):  # warm-up: first-run allocations, caches, thread pool start
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="resnet18", choices=list(tm.ZOO))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", type=int, default=20, help="timed runs of each (median reported)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads for both PyPTO and PyTorch (default: every core)")
    p.add_argument("--image", type=int, default=224, help="image size of the vision models")
    p.add_argument("--level", type=int, default=3, choices=range(4),
                   help="optimization level (default 3: level 2 plus blocked NCHWc convolutions)")
    a = p.parse_args()

    if a.model in ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small",
                   "efficientnet_b0", "convnext_tiny"):
        tm.ZOO[a.model] = tm._vision(a.model, image=a.image)
    # Both engines on the same number of threads.
    pypto.set_num_threads(a.threads or None)
    threads = pypto.get_num_threads()
    torch.set_num_threads(threads)
    model = tm.build(a.model)
    args = tm.inputs(a.model, a.batch)
    shapes = ", ".join(f"{list(x.shape)} {x.dtype}" for x in args)
    print(f"model    {a.model}, random weights (seed {tm.SEED}); input {shapes}")

    t0 = time.perf_counter()
    fast = pypto.optimize(model, example_inputs=args, level=a.level)
    print(f"optimize {time.perf_counter() - t0:.1f} s (capture with torch.export, import, "
          f"compile at level {fast.compiled.level}); dynamic dims {fast.dynamic_dims}")

    with torch.inference_mode():
        want = tm.first_tensor(model(*args))
    got = tm.first_tensor(fast(*args))
    err = tm.relative_error(got, want)
    ok = err <= TOLERANCE
    print(f"check    max relative error vs PyTorch eager {err:.2e} "
          f"({'OK' if ok else 'MISMATCH'}, bound {TOLERANCE:g})")

    backends = fast.compiled.node_backends
    fallback = collections.Counter(op for op, b in backends if b != "cpu")
    on_cpu = len(backends) - sum(fallback.values())
    stats = fast.stats(*args)
    print(f"compile  {stats['nodes_in']} nodes captured, {stats['nodes']} after the graph passes, "
          f"{stats['kernels']} kernels ({stats['fused_kernels']} fused); intermediates "
          f"{stats['peak_bytes'] / 2**20:.1f} MiB planned vs "
          f"{stats['unplanned_peak_bytes'] / 2**20:.1f} MiB unplanned")
    print(f"kernels  {on_cpu} of {len(backends)} nodes on CPU kernels "
          f"({pypto.device_info()['isa']})" +
          (f"; on the reference: {', '.join(f'{op} x{n}' for op, n in fallback.items())}"
           if fallback else ""))

    t_pto = median_seconds(lambda: fast(*args), a.repeat)
    with torch.inference_mode():
        t_eager = median_seconds(lambda: model(*args), a.repeat)
    print(f"time     PyPTO {t_pto * 1e3:.1f} ms, PyTorch eager {t_eager * 1e3:.1f} ms "
          f"({threads} thread{'s' if threads > 1 else ''}, median of {a.repeat}): "
          f"speed-up {t_eager / t_pto:.2f}x")

    # Where the time goes: pypto.profiler over `repeat` calls (after the timed ones, so PyTorch's
    # threads from the eager timing are idle again), per kernel kind (fusion rule or op).
    for _ in range(3):
        fast(*args)
    with pypto.profiler.profile() as prof:
        for _ in range(a.repeat):
            fast(*args)
    by_op: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    flops: dict[str, float] = collections.defaultdict(float)
    for r in prof.key_averages():
        if r.kind != "kernel":
            continue
        name = r.key.split(" [")[0]
        by_op[name] += r.cpu_time_total / 1e3 / a.repeat  # ms per call
        count[name] += 1
        flops[name] += r.flops / a.repeat
    total = sum(by_op.values())
    peak = pypto.device_info()["fma"]["gflops_per_core"] * threads
    print(f"\nwhere the time goes (pypto.profiler over {a.repeat} calls: {total:.1f} ms of kernels "
          f"a call; by kernel: fusion rule or op; % of the {peak:.0f} GFLOP/s FMA peak)")
    print(f"  {'kernel':<26}{'count':>6}{'ms':>10}{'share':>8}{'% peak':>9}")
    above = False
    for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])[:10]:
        pct = 100 * flops[op] / (ms * 1e6) / peak if flops[op] and ms else 0
        above = above or pct > 100
        rate = f"{pct:.0f}%" if pct else ""
        print(f"  {op:<26}{count[op]:>6}{ms:>10.2f}{ms / total:>8.1%}{rate:>9}")
    if above:
        print("  (over 100%: FLOPs are counted as the direct convolution's; Winograd F(4x4, 3x3) "
              "does about a quarter of its multiplies)")
    what = {0: "each node as its own kernel",
            1: "graph passes (docs/passes.md)",
            2: "graph passes, fusion into kernels, planned memory (docs/fusion.md)",
            3: "level 2 plus blocked NCHWc convolutions (docs/passes.md, AssignLayouts)"}
    print(f"\nLevel {fast.compiled.level}: {what[fast.compiled.level]}. Other levels: --level N. "
          "Full tables against torch.compile and ONNX Runtime: scripts/bench.sh.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
