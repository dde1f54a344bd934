"""PyPTO's threading modes on whole models run alone (no PyTorch work between calls).

The other half of bench/coexist.py: `auto` runs kernels on PyTorch's OpenMP team, which helps
beside PyTorch; this checks that it costs nothing where PyPTO runs alone. One process, torch
loaded, each model compiled once with pypto.optimize; the modes are alternated round after round
(--calls timed calls each, after 5 untimed), so a shared machine's slow spells fall on all of them
alike. Prints every round's median and the median of those, per model and mode, in ms.

    PY=~/.cache/pypto/venv/bin/python
    $PY bench/threading_alone.py                       # ~2 min
    $PY bench/threading_alone.py --modes own,auto,omp --rounds 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(models: list[str], modes: list[str], threads: int, rounds: int, calls: int) -> dict:
    import torch
    import torchvision

    sys.path.insert(0, str(REPO / "python"))  # this checkout's pypto, without PYTHONPATH
    import pypto

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    pypto.set_num_threads(threads)
    x = torch.randn(1, 3, 224, 224)
    results: dict = {}
    before = pypto.get_threading()
    try:
        for name in models:
            net = getattr(torchvision.models, name)().eval()
            with torch.inference_mode():
                want = net(x)
            fast = pypto.optimize(net, (x,))
            err = (fast(x) - want).abs().max().item()
            if err > 1e-3 * max(1.0, want.abs().max().item()):
                raise SystemExit(f"{name}: PyPTO differs from eager by {err:.3g}")
            for _ in range(rounds):
                for mode in modes:
                    pypto.set_threading(mode)
                    for _ in range(5):
                        fast(x)
                    times = []
                    for _ in range(calls):
                        t = time.perf_counter()
                        fast(x)
                        times.append(time.perf_counter() - t)
                    results.setdefault(name, {}).setdefault(mode, []).append(
                        statistics.median(times) * 1e3)
    finally:
        pypto.set_threading(before)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2,resnet50",
                    help="torchvision model names (random weights)")
    ap.add_argument("--modes", default="own,auto", help="PTO_THREADING modes to alternate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=40, help="timed calls per mode per round")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= {"own", "auto", "omp"}:
        ap.error(f"--modes: own, auto and/or omp, not {args.modes!r}")
    if args.threads < 1 or args.rounds < 1 or args.calls < 1:
        ap.error("--threads, --rounds and --calls must be at least 1")
    import torchvision

    models = args.models.split(",")
    unknown = [m for m in models if not callable(getattr(torchvision.models, m, None))]
    if unknown:
        ap.error(f"--models: not torchvision models: {', '.join(unknown)}")
    results = measure(models, modes, args.threads, args.rounds, args.calls)
    print(f"threads {args.threads}, {args.rounds} rounds of {args.calls} calls per mode; ms")
    for name, by_mode in results.items():
        for mode, rounds in by_mode.items():
            print(f"{name:16} {mode:5} " + " ".join(f"{t:7.2f}" for t in rounds)
                  + f"   median {statistics.median(rounds):7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "calls": args.calls, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
