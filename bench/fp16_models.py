#!/usr/bin/env python3
"""fp16 ONNX files, as tools make them to halve a model's size: PyPTO against onnxruntime.

Each fp32 .onnx file given (or every one in a folder) is converted to fp16 by
onnxconverter-common's `float16.convert_float_to_float16(keep_io_types=True)`, the converter
most fp16 files in the wild come from (fp32 inputs and outputs, Casts around the fp16 graph).
Then, on one thread, in this process:

  error    max |out - ref| / max |ref| against onnxruntime on the fp32 file, for PyPTO (level 3
           by default) and onnxruntime on the fp16 file;
  time     the median call over --seconds of calls, for PyPTO on the fp16 file, PyPTO on the
           fp32 file and onnxruntime on the fp16 file (which fails to load some of them:
           the converter writes value_info types its own Casts contradict);
  nodes    any op that ran on the reference interpreter.

    PY=~/.cache/pypto/venv/bin/python
    $PY -m pip install onnxconverter-common            # not one of PyPTO's dependencies
    $PY bench/zoo_speed.py --keep /tmp/zoo_onnx --rounds 1   # the zoo's fp32 files
    PYTHONPATH=python $PY bench/fp16_models.py /tmp/zoo_onnx --json /tmp/fp16.jsonl

docs/precision.md ("Models that are bf16 or fp16 already") has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def feeds_for(sess) -> dict:
    """Random inputs for a session: unknown dims 1 for the batch (the first), else 16; integer
    inputs are token ids below 100 (masks all ones)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else (1 if k == 0 else 16) for k, d in enumerate(i.shape)]
        if "int" in i.type:
            feeds[i.name] = (np.ones(shape, np.int64) if "mask" in i.name else
                             rng.integers(0, 100, shape).astype(np.int64))
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def median_ms(f, seconds: float) -> float:
    f()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def first(out):
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else out, np.float64)


def check(path32: Path, path16: Path, level: int, seconds: float,
          half_inputs: bool = False) -> dict:
    """One fp32 file and its fp16 conversion: the row of the table (a dict). half_inputs: the
    fp16 file takes fp16 inputs (converted without keep_io_types)."""
    import onnxruntime as ort

    import pypto

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    s32 = ort.InferenceSession(str(path32), so, providers=["CPUExecutionProvider"])
    feeds = feeds_for(s32)
    ref = first(s32.run(None, feeds))
    scale = float(np.abs(ref).max()) or 1.0
    feeds16 = {k: v.astype(np.float16) if half_inputs and v.dtype == np.float32 else v
               for k, v in feeds.items()}
    row: dict = {"model": path32.stem}
    try:
        s16 = ort.InferenceSession(str(path16), so, providers=["CPUExecutionProvider"])
        row["ort16_err"] = float(np.abs(first(s16.run(None, feeds16)) - ref).max() / scale)
        row["ort16_ms"] = median_ms(lambda: s16.run(None, feeds16), seconds)
    except Exception as e:  # noqa: BLE001 - a file onnxruntime rejects is a result
        row["ort16"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    try:
        m16 = pypto.onnx.load(path16, level=level)
        row["pto16_err"] = float(np.abs(first(m16(**feeds16)) - ref).max() / scale)
        row["pto16_ms"] = median_ms(lambda: m16(**feeds16), seconds)
        row["reference_nodes"] = sorted({op for op, b in m16._compiled.node_backends if b != "cpu"})
        m32 = pypto.onnx.load(path32, level=level)
        row["pto32_ms"] = median_ms(lambda: m32(**feeds), seconds)
    except Exception as e:  # noqa: BLE001
        row["pto16"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return row


def cell(row: dict, key: str, fmt: str) -> str:
    return fmt.format(row[key]) if key in row else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="fp32 .onnx files, or folders of them")
    ap.add_argument("--level", type=int, default=3, choices=range(4))
    ap.add_argument("--seconds", type=float, default=0.6, help="of calls per timing")
    ap.add_argument("--json", help="append each row to this file (JSON lines)")
    ap.add_argument("--keep", help="a folder to keep the fp16 files in (default: a temporary one)")
    a = ap.parse_args()
    files = []
    for p in map(Path, a.paths):
        if not p.exists():
            print(f"no such file or folder: {p}", file=sys.stderr)
            return 2
        files += sorted(p.glob("*.onnx")) if p.is_dir() else [p]
    if not files:
        print("no .onnx files in " + " ".join(a.paths), file=sys.stderr)
        return 2
    try:
        from onnxconverter_common import float16
    except ImportError:
        print("needs onnxconverter-common: python -m pip install onnxconverter-common",
              file=sys.stderr)
        return 2
    import onnx
    os.environ.setdefault("PTO_NUM_THREADS", "1")
    out_dir = Path(a.keep or tempfile.mkdtemp(prefix="pto_fp16_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print("| model | ORT fp16 error | PyPTO fp16 error | ORT fp16 ms | PyPTO fp16 ms | "
          "PyPTO fp32 ms | reference nodes / errors |")
    print("|---|---|---|---|---|---|---|")
    for i, f in enumerate(files):
        print(f"[{i + 1}/{len(files)}] {f.stem}", file=sys.stderr, flush=True)
        path16 = out_dir / f.name
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                onnx.save(float16.convert_float_to_float16(onnx.load(str(f)), keep_io_types=True),
                          str(path16))
            row = check(f, path16, a.level, a.seconds)
        except Exception as e:  # noqa: BLE001 - the converter's failure is a row too
            row = {"model": f.stem, "convert": f"{type(e).__name__}: {str(e)[:120]}"}
        notes = ", ".join(row.get("reference_nodes", [])) or "; ".join(
            row[k] for k in ("convert", "ort16", "pto16") if k in row)
        print(f"| {row['model']} | {cell(row, 'ort16_err', '{:.1e}')} | "
              f"{cell(row, 'pto16_err', '{:.1e}')} | {cell(row, 'ort16_ms', '{:.2f}')} | "
              f"{cell(row, 'pto16_ms', '{:.2f}')} | {cell(row, 'pto32_ms', '{:.2f}')} | {notes} |",
              flush=True)
        if a.json:
            with open(a.json, "a") as out:
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
