#!/usr/bin/env python3
"""Every model of the test zoo (tests/python/torch_models.py) through pypto.optimize, one process
each: whether it compiles, matches eager at batch 1 and 2, how long that takes, and which of its
nodes run on the reference interpreter instead of a CPU kernel (by op).

    python bench/zoo_census.py                    # every model, a table at the end
    python bench/zoo_census.py --models swin_t,llama --json out.json

A model's row: ok / wrong (outside 1e-4 of eager) / failed (the error's first line) / timeout,
the seconds of build + optimize + both batches, the max relative error, and the reference nodes
as `Op xN`. It is the list of what the zoo test cannot yet require of every model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARK = "@@census@@"


def child(name: str) -> dict:
    sys.path.insert(0, str(REPO / "python"))
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import torch

    import pypto
    import torch_models as tm

    t0 = time.perf_counter()
    model = tm.randomize_(tm.build(name), tm.inputs(name, 16))
    result: dict = {"model": name}
    try:
        fast = pypto.optimize(model, example_inputs=tm.inputs(name, 1))
        err = 0.0
        for batch in (1, 2):
            args = tm.inputs(name, batch)
            with torch.inference_mode():
                want = tm.first_tensor(model(*args))
            got = tm.first_tensor(fast(*args))
            err = max(err, tm.relative_error(got, want))
        result["max_rel_err"] = err
        result["status"] = "ok" if err <= 1e-4 else "wrong"
        backends = fast.compiled.node_backends
        result["reference_ops"] = dict(Counter(op for op, b in backends if b != "cpu"))
        result["nodes"] = len(backends)
    except Exception as e:  # noqa: BLE001 - recorded
        result["status"] = "failed"
        result["error"] = f"{type(e).__name__}: {e}"[:600]
    result["seconds"] = time.perf_counter() - t0
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated zoo names (default: all)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(MARK + json.dumps(child(a.child)))
        return
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import torch_models as tm

    names = a.models.split(",") if a.models else list(tm.ZOO)
    rows = []
    for name in names:
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), PTO_TUNE_CACHE="off")
        t0 = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, __file__, "--child", name], env=env,
                                 capture_output=True, text=True, timeout=a.timeout)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith(MARK)]
            r = json.loads(lines[-1][len(MARK):]) if lines else {
                "model": name, "status": "crashed",
                "error": (out.stderr.strip().splitlines() or ["?"])[-1][:600]}
        except subprocess.TimeoutExpired:
            r = {"model": name, "status": "timeout", "seconds": time.perf_counter() - t0}
        rows.append(r)
        ref = ", ".join(f"{k} x{v}" for k, v in sorted(r.get("reference_ops", {}).items()))
        print(f"{name:20s} {r['status']:8s} {r.get('seconds', 0):6.1f} s  "
              f"{r.get('max_rel_err', float('nan')):.1e}  {ref or r.get('error', '')}", flush=True)
    ok = sum(r["status"] == "ok" for r in rows)
    on_cpu = sum(r["status"] == "ok" and not r.get("reference_ops") for r in rows)
    print(f"\n{ok} of {len(rows)} match eager; {on_cpu} with every node on a CPU kernel")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
