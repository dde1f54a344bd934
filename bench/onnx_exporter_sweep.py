#!/usr/bin/env python3
"""The test zoo's models as today's default ONNX exporter writes them, through onnxruntime and
PyPTO: `torch.onnx.export(model, args, dynamo=True)` (the torch.export-based exporter, the
default since PyTorch 2.9, at its default opset), then onnxruntime and `pypto.onnx.load(file,
level=2 and 3)`, each compared with eager PyTorch (max |got - want| / max |want|). Also lists the
ops PyPTO ran on its reference interpreter instead of a CPU kernel.

    python bench/onnx_exporter_sweep.py                       # every zoo model, batch 2
    python bench/onnx_exporter_sweep.py --dynamic             # a dynamic batch: exported at 2,
                                                              # run at batches 1 and 3
    python bench/onnx_exporter_sweep.py --models resnet18,bert --json out.jsonl

Random weights (tests/python/torch_models.py: build, randomize_), the zoo's inputs. One child
process per model, with a time limit (the exporter takes 5-200 s a model here). A row per model:
ok (PyPTO within 1e-4 of eager at every level and batch, every node on a CPU kernel), wrong,
reference (some op on the reference interpreter), error (PyPTO's), or the exporter's own
failure. docs/unseen_models.md has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-4
MARK = "@@sweep@@"


def child(name: str, dynamic: bool, folder: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, str(REPO / "tests" / "python"))
    sys.path.insert(0, str(REPO / "python"))
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    import torch_models as tm

    import pypto

    row: dict = {"name": name}
    model = tm.randomize_(tm.build(name))

    wrapped = tm.FirstOutput(model).eval()
    args = tm.inputs(name, 2)
    names = [f"x{i}" for i in range(len(args))]
    path = os.path.join(folder, f"{name}.onnx")
    kw = {}
    if dynamic:
        kw["dynamic_shapes"] = (tuple({0: torch.export.Dim.DYNAMIC} for _ in args),)
    try:
        torch.onnx.export(wrapped, args, path, dynamo=True, input_names=names,
                          output_names=["y"], external_data=False, **kw)
    except Exception as e:  # noqa: BLE001 - the exporter's failure is a row, not a crash
        row["status"] = "export failed"
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()[0]  # no terminal colors
        row["error"] = f"{type(e).__name__}: {first[:200]}"
        return row
    file = onnx.load(path, load_external_data=False)
    row["opset"] = next(o.version for o in file.opset_import if o.domain in ("", "ai.onnx"))
    row["nodes"] = len(file.graph.node)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    try:
        compiled = {level: pypto.onnx.load(path, level=level) for level in (2, 3)}
    except Exception as e:  # noqa: BLE001
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return row
    row["err"] = {}
    for batch in ((1, 3) if dynamic else (2,)):
        xs = tm.inputs(name, batch)
        with torch.inference_mode():
            want = wrapped(*xs).float().numpy().astype(np.float64)
        feeds = {n: x.numpy() for n, x in zip(names, xs)}

        def rel(got) -> float:
            got = np.asarray(got, dtype=np.float64)
            if got.shape != want.shape:
                return float("inf")
            return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))

        row["err"][f"ort b{batch}"] = rel(session.run(None, feeds)[0])
        for level, exe in compiled.items():
            try:
                row["err"][f"L{level} b{batch}"] = rel(exe(*[feeds[n] for n in names]))
            except Exception as e:  # noqa: BLE001
                row["status"] = "error"
                row["error"] = f"L{level} b{batch}: {type(e).__name__}: {str(e)[:300]}"
                return row
    row["reference_ops"] = sorted({op for level in compiled for op, backend in
                                   compiled[level]._compiled.node_backends if backend != "cpu"})
    worst = max(v for k, v in row["err"].items() if not k.startswith("ort"))
    row["status"] = ("wrong" if worst > TOLERANCE else
                     "reference" if row["reference_ops"] else "ok")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated zoo names (default: every zoo model)")
    ap.add_argument("--dynamic", action="store_true",
                    help="export with a dynamic batch and run at batches 1 and 3")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a model (default 900)")
    ap.add_argument("--json", help="append each row to this JSON-lines file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(MARK + json.dumps(child(a.child, a.dynamic, a.folder)), flush=True)
        return 0

    sys.path.insert(0, str(REPO / "tests" / "python"))
    import torch_models as tm

    names = a.models.split(",") if a.models else list(tm.ZOO)
    unknown = [n for n in names if n not in tm.ZOO]
    if unknown:
        ap.error(f"not zoo models: {', '.join(unknown)}")
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        for i, name in enumerate(names, 1):
            cmd = [sys.executable, __file__, "--child", name, "--folder", folder]
            cmd += ["--dynamic"] if a.dynamic else []
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith(MARK)]
                row = (json.loads(lines[-1][len(MARK):]) if lines else
                       {"name": name, "status": "crash",
                        "error": (r.stderr.strip().splitlines() or ["?"])[-1][:300]})
            except subprocess.TimeoutExpired:
                row = {"name": name, "status": "timeout"}
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            errs = row.get("err", {})
            worst = {k: max((v for kk, v in errs.items() if kk.startswith(k)), default=None)
                     for k in ("ort", "L2", "L3")}
            cells = " ".join(f"{k} {v:.1e}" if v is not None else f"{k} -"
                             for k, v in worst.items())
            extra = row.get("error") or ", ".join(row.get("reference_ops", []))
            print(f"[{i}/{len(names)}] {name:20s} {row['status']:13s} opset {row.get('opset', '-')}"
                  f" {cells} {extra}", flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0 if not any(k in counts for k in ("wrong", "error", "crash", "reference")) else 1


if __name__ == "__main__":
    sys.exit(main())
