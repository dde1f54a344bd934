"""Writes the ONNX backend node tests of the installed onnx package to a cache folder.

Recent onnx releases build these cases in memory (onnx.backend.test.loader.load_model_tests)
instead of shipping them as files. This writes each one as

    <cache>/<onnx version>/<test name>/model.onnx
    <cache>/<onnx version>/<test name>/test_data_set_N/{input,output}_K.pb
    <cache>/<onnx version>/<test name>/tolerance.txt        rtol atol
    <cache>/<onnx version>/<test name>/UNSUPPORTED          why (sequence/map/string data)

The folder is outside the clone (never committed) and reused: a stamp file marks it complete.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path


def default_cache() -> Path:
    root = os.environ.get("PTO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pypto")
    return Path(root) / "onnx-node-tests"


def write_all(out: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test import loader

    dest = out / onnx.__version__
    stamp = dest / ".complete"
    if stamp.exists():
        return dest
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_model_tests(kind="node")
    for case in cases:
        d = dest / case.name
        d.mkdir(parents=True, exist_ok=True)
        onnx.save(case.model, d / "model.onnx")
        (d / "tolerance.txt").write_text(f"{case.rtol} {case.atol}\n")
        why = None
        graph = case.model.graph
        input_names = [i.name for i in graph.input]
        output_names = [o.name for o in graph.output]
        for n, (inputs, outputs) in enumerate(case.data_sets or []):
            ds = d / f"test_data_set_{n}"
            ds.mkdir(exist_ok=True)
            for kind, arrays, names in (("input", inputs, input_names),
                                        ("output", outputs, output_names)):
                for k, a in enumerate(arrays):
                    if isinstance(a, onnx.TensorProto):  # exotic dtypes come pre-serialized
                        (ds / f"{kind}_{k}.pb").write_bytes(a.SerializeToString())
                        continue
                    if isinstance(a, np.generic):
                        a = np.asarray(a)
                    if not isinstance(a, np.ndarray) or a.dtype == object or a.dtype.kind in "USc":
                        why = f"{kind} {k} is {type(a).__name__} " \
                              f"{getattr(a, 'dtype', '')}: not a numeric tensor"
                        continue
                    try:
                        t = numpy_helper.from_array(a, names[k] if k < len(names) else "")
                    except Exception as e:  # noqa: BLE001 - exotic dtypes (float8, int4)
                        why = f"{kind} {k}: {e}"
                        continue
                    (ds / f"{kind}_{k}.pb").write_bytes(t.SerializeToString())
        if why:
            (d / "UNSUPPORTED").write_text(why + "\n")
    stamp.write_text(f"{len(cases)}\n")
    return dest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=default_cache())
    args = p.parse_args()
    print(write_all(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
