"""What reduced precision costs in accuracy on every model of the test zoo, in one run.

    python bench/accuracy.py                       # every zoo model
    python bench/accuracy.py --models bert,resnet18

For each model of tests/python/torch_models.py (random weights, seed 0, the zoo's inputs: 64x64
images, 16 tokens, batch 2), the error of its main output against PyTorch eager fp32, as
max |got - fp32| / max |fp32|:
  - eager-bf16 / eager-f16: PyTorch eager under torch.autocast("cpu", dtype=torch.bfloat16 /
    torch.float16) (the peers);
  - pypto-bf16 / pypto-f16: pypto.optimize(model, dtype=torch.bfloat16 / torch.float16);
  - pypto-int8: pypto.quantization: calibrate(model, 4 random batches) when the model has
    convolutions, then quantize_dynamic on its Linear layers;
  - eager-int8: torch.ao.quantization.quantize_dynamic(model, {Linear}) (Linear layers only;
    convolutions stay fp32, so conv nets show its Linear error alone).
Random weights make no claim about a trained model's accuracy (tests/python/test_quantization.py
and test_precision.py measure all-MiniLM-L6-v2's real weights); they show which models and ops
reduced precision hurts more than others, against PyTorch's own reduced precision on the same
model. Randomly initialized MobileNets and EfficientNet output values near 1e-9, below fp16's
range: fp16 and PyTorch's int8 flush them to 0 (an error of 1.0), PyTorch's fp16 autocast too. Writes bench/results/accuracy.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "python"))

ENGINES = ["eager-bf16", "pypto-bf16", "eager-f16", "pypto-f16", "eager-int8", "pypto-int8"]


def errors(name: str, engines: list[str]) -> dict:
    import torch

    import pypto
    import torch_models

    model = torch_models.build(name)
    x = torch_models.inputs(name, 2)
    with torch.inference_mode():
        want = torch_models.first_tensor(model(*x)).float()
    out = {}
    for e in engines:
        t0 = time.perf_counter()
        try:
            if e in ("eager-bf16", "eager-f16"):
                dtype = torch.bfloat16 if e == "eager-bf16" else torch.float16
                with torch.inference_mode(), torch.autocast("cpu", dtype=dtype):
                    got = torch_models.first_tensor(model(*x))
            elif e in ("pypto-bf16", "pypto-f16"):
                dtype = torch.bfloat16 if e == "pypto-bf16" else torch.float16
                got = torch_models.first_tensor(pypto.optimize(model, x, dtype=dtype)(*x))
            elif e == "eager-int8":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                               torch.qint8)
                with torch.inference_mode():
                    got = torch_models.first_tensor(q(*x))
            else:
                q = model
                if any(type(m) is torch.nn.Conv2d for m in model.modules()):
                    g = torch.Generator().manual_seed(7)
                    batches = [torch.randn(*x[0].shape, generator=g) for _ in range(4)]
                    q = pypto.quantization.calibrate(model, batches)
                if any(pypto.quantization._is_linear(m) for m in q.modules()):
                    q = pypto.quantization.quantize_dynamic(q)
                got = torch_models.first_tensor(pypto.optimize(q, x)(*x))
            out[e] = {"error": torch_models.relative_error(got.float(), want),
                      "seconds": time.perf_counter() - t0}
        except Exception as err:  # noqa: BLE001 - recorded; the run carries on
            out[e] = {"failed": f"{type(err).__name__}: {err}"[:300]}
        print(f"{name} {e}: {out[e]}", file=sys.stderr)
    return out


def table(results: dict, engines: list[str]) -> str:
    head = ["model", *engines]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, res in results.items():
        cells = []
        for e in engines:
            r = res.get(e, {})
            cells.append(f"{r['error']:.1e}" if "error" in r else "failed" if r else "-")
        rows.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(rows)


def main() -> int:
    import torch_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(torch_models.CORE))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e} (known: {', '.join(ENGINES)})")
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in torch_models.ZOO:
            raise SystemExit(f"unknown model {m} (known: {', '.join(torch_models.ZOO)})")
    results = {m: errors(m, engines) for m in models}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accuracy.json").write_text(json.dumps(results, indent=1))
    text = table(results, engines)
    (out / "accuracy.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
