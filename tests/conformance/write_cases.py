"""Writes the ONNX backend node tests of the installed onnx package to a cache folder.

Recent onnx releases build these cases in memory (onnx.backend.test.loader.load_model_tests)
instead of shipping them as files. This writes each one as

    <cache>/<onnx version>-<LAYOUT>/<test name>/model.onnx
    <cache>/<onnx version>-<LAYOUT>/<test name>/test_data_set_N/{input,output}_K.pb
    <cache>/<onnx version>-<LAYOUT>/<test name>/tolerance.txt        rtol atol
    <cache>/<onnx version>-<LAYOUT>/<test name>/UNSUPPORTED          why (map/string data)

A .pb file is a TensorProto, or for a value the model declares a sequence or an optional, a
SequenceProto or OptionalProto (as the ONNX test data of older releases were written). The folder
is outside the clone (never committed) and reused: a stamp file marks it complete; LAYOUT changes
when what is written changes, so that an older checkout's runner keeps its own folder.
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


LAYOUT = "seq"  # sequences and optionals written as SequenceProto / OptionalProto


def value_proto(a, vtype, name: str):
    """`a` as the .pb of a value of ValueInfo type `vtype` when that is a sequence or an optional,
    else None (then `a` is a tensor)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    kind = vtype.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list([np.asarray(x) for x in a], name,
                                      onnx.SequenceProto.TENSOR)
    if kind == "optional_type":
        inner = vtype.optional_type.elem_type.WhichOneof("value")
        if inner == "sequence_type":
            return numpy_helper.from_optional(None if a is None else list(a), name,
                                              onnx.OptionalProto.SEQUENCE)
        return numpy_helper.from_optional(None if a is None else np.asarray(a), name,
                                          onnx.OptionalProto.TENSOR)
    return None


def write_all(out: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test import loader

    dest = out / f"{onnx.__version__}-{LAYOUT}"
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
        types = {"input": [i.type for i in graph.input], "output": [o.type for o in graph.output]}
        for n, (inputs, outputs) in enumerate(case.data_sets or []):
            ds = d / f"test_data_set_{n}"
            ds.mkdir(exist_ok=True)
            for kind, arrays, names in (("input", inputs, input_names),
                                        ("output", outputs, output_names)):
                for k, a in enumerate(arrays):
                    vtype = types[kind][k] if k < len(types[kind]) else None
                    p = vtype and value_proto(a, vtype, names[k])
                    if p is not None:
                        (ds / f"{kind}_{k}.pb").write_bytes(p.SerializeToString())
                        continue
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
