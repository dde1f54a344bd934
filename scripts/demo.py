"""The main job: one model through `pto run` (which prints its outputs and times), then a check
against onnxruntime on the same inputs. scripts/demo.sh installs and builds what is missing first.

    python scripts/demo.py --pto build/pto [MODEL] [-- extra pto run options]

MODEL is one of the built-in models (default resnet18; see tests/python/export_models.py) or a
path to an .onnx file, which gets random inputs (symbolic dimensions set to 1).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import export_models as em  # noqa: E402

TOLERANCE = 1e-4  # the model tests' bound: max|pto - onnxruntime| / max|onnxruntime|


def random_inputs(model: Path) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    rng = np.random.default_rng(em.SEED)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else 1 for d in i.shape]
        kind = i.type[len("tensor("):-1]
        if kind in ("float", "double", "float16"):
            dt = {"float": np.float32, "double": np.float64, "float16": np.float16}[kind]
            out[i.name] = rng.standard_normal(shape).astype(dt)
        elif kind == "bool":
            out[i.name] = rng.integers(0, 2, shape).astype(bool)
        else:  # integer ids or indices: small non-negative values are valid for most models
            out[i.name] = rng.integers(0, 2, shape).astype(np.dtype(kind))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="resnet18")
    p.add_argument("--pto", required=True, help="the pto program")
    p.add_argument("pto_args", nargs=argparse.REMAINDER, help="after --: more `pto run` options")
    a = p.parse_args()
    extra = a.pto_args[1:] if a.pto_args[:1] == ["--"] else a.pto_args

    if a.model in em.MODELS:
        spec = em.MODELS[a.model]
        cached = em.model_path(a.model).exists()
        if not cached:
            print(f"exporting {spec.about} to ONNX (once; cached)...", flush=True)
        model = em.export(a.model)
        inputs = em.make_inputs(a.model)
        print(f"model   {spec.about}, random weights (seed {em.SEED})\n        {model}")
    elif a.model.endswith(".onnx") and Path(a.model).is_file():
        model = Path(a.model).resolve()
        inputs = random_inputs(model)
        print(f"model   {model}")
    else:
        print(f"demo: '{a.model}' is neither a built-in model ({', '.join(em.MODELS)}) nor an "
              ".onnx file", file=sys.stderr)
        return 2

    work = em.cache_root().parent / "demo" / model.stem
    shutil.rmtree(work, ignore_errors=True)
    (work / "inputs").mkdir(parents=True)
    cmd = [a.pto, "run", str(model)]
    for name, arr in inputs.items():
        f = em.output_file(work / "inputs", name)
        np.save(f, arr)
        cmd += ["--input", f"{name}={f}"]
    cmd += ["--output-dir", str(work / "outputs"), *extra]

    # `pto run` prints each output's statistics, the load time and the run time itself.
    print(f"\n$ {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd, stdin=subprocess.DEVNULL)
    if rc != 0:
        print(f"demo: pto run failed (exit {rc})", file=sys.stderr)
        return 1
    print()

    want = em.run_onnxruntime(model, inputs)
    ok = True
    for name, w in want.items():
        f = em.output_file(work / "outputs", name)
        if not f.is_file():
            print(f"output  {name}: MISSING ({f})")
            ok = False
            continue
        g = np.load(f)
        err = em.relative_error(g, w) if g.shape == w.shape else float("inf")
        good = g.dtype == w.dtype and err <= TOLERANCE
        ok &= good
        top = ""
        if "logits" in name and g.ndim == 2 and g.shape[0] == 1:  # image classifier scores
            top = f"; top-5 classes {np.argsort(-g[0])[:5].tolist()}"
        print(f"output  {name}: vs onnxruntime, relative error {err:.2e} "
              f"{'OK' if good else 'MISMATCH'}{top}")
    print("\nall outputs match onnxruntime" if ok else "\nMISMATCH against onnxruntime")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
