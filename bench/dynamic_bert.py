#!/usr/bin/env python3
"""BERT-base with a symbolic sequence: one compiled model for every length against one compiled
per length and onnxruntime, in one run (usage: bench/README.md).

    python bench/dynamic_bert.py                   # seq 16, 64, 128, batch 1, 1 thread
    python bench/dynamic_bert.py --seqs 16,128 --threads 2 --rounds 5

transformers' BertModel (bert-base-uncased's config, random weights, eval) on token ids and a
padding mask. Engines, all in this process, timed round-robin per length (median of --rounds
rounds of --reps calls each, after 3 warm-up calls):
- pypto-dynamic: pypto.optimize with torch.export Dims for batch and sequence, compiled once;
- pypto-static: pypto.optimize with dynamic=False, compiled for each length;
- pypto-onnx: pypto.onnx.load of the dynamic-axes ONNX export (torch.onnx.export, dynamo);
- ort: onnxruntime on the same file (all graph optimizations, intra-op threads = --threads);
- pypto-onnx-ts, ort-ts: the same two on the TorchScript exporter's file (dynamo=False, the same
  dynamic axes), which flattens every Linear to Reshape-Gemm-Reshape and slices its position
  ids to min(seq, 512) (--no-torchscript leaves them out).
Each engine's output is checked against eager PyTorch first, and the Attention ops of each PyPTO
model are counted (12 = every layer's attention is one op).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))


class Hidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def inputs(seq: int, batch: int = 1):
    g = torch.Generator().manual_seed(seq)
    return torch.randint(0, 30000, (batch, seq), generator=g), torch.ones(batch, seq,
                                                                          dtype=torch.long)


def attention_ops(compiled) -> int:
    return [s["rule"] or s["op"] for s in compiled.steps].count("Attention")


def median_ms(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="16,64,128")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-torchscript", action="store_true",
                    help="leave out the TorchScript exporter's file (pypto-onnx-ts, ort-ts)")
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]

    import onnxruntime as ort
    import transformers
    from torch.export import Dim

    import pypto

    torch.set_num_threads(args.threads)
    pypto.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Hidden(transformers.BertModel(transformers.BertConfig())).eval()

    t0 = time.perf_counter()
    spec = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    dynamic = pypto.optimize(model, inputs(32, 2), dynamic_shapes=(spec, spec))
    dynamic(*inputs(seqs[0]))
    print(f"pypto-dynamic compiled in {time.perf_counter() - t0:.1f} s")
    static = {}
    for s in seqs:
        static[s] = pypto.optimize(model, inputs(s), dynamic=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    files = {"": True} if args.no_torchscript else {"": True, "-ts": False}  # suffix: dynamo
    from_onnx, sessions = {}, {}
    for suffix, dynamo in files.items():
        path = os.path.join(tempfile.mkdtemp(), "bert.onnx")
        axes = {0: "batch", 1: "seq"}
        torch.onnx.export(model, inputs(32, 2), path, input_names=["ids", "mask"],
                          output_names=["y"], dynamic_axes={"ids": axes, "mask": axes, "y": axes},
                          dynamo=dynamo)
        from_onnx[suffix] = pypto.onnx.load(path)
        sessions[suffix] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    print(f"\nBERT-base, batch 1, {args.threads} thread(s), load average "
          f"{os.getloadavg()[0]:.2f}; median of {args.rounds} rounds x {args.reps} calls, ms")
    onnx_names = [f"{e}{suffix}" for suffix in files for e in ("pypto-onnx", "ort")]
    print(f"| seq | pypto-dynamic | pypto-static | {' | '.join(onnx_names)} | dynamic / static | "
          f"dynamic / ort | {' | '.join(f'pypto-onnx{x} / ort{x}' for x in files)} | "
          f"Attention ops (dynamic, static, {', '.join(f'onnx{x}' for x in files)}) |")
    print("|---" * (6 + len(onnx_names) + len(files)) + "|")
    for s in seqs:
        ids, mask = inputs(s)
        with torch.inference_mode():
            want = model(ids, mask)
        npi, npm = ids.numpy(), mask.numpy()
        engines = {
            "pypto-dynamic": lambda: dynamic(ids, mask),
            "pypto-static": lambda s=s: static[s](ids, mask),
        }
        for x in files:
            engines[f"pypto-onnx{x}"] = lambda x=x: from_onnx[x](npi, npm)
            engines[f"ort{x}"] = lambda x=x: sessions[x].run(None, {"ids": npi, "mask": npm})[0]
        with torch.inference_mode():
            for name, fn in engines.items():
                got = torch.as_tensor(np.asarray(fn()))
                err = (got - want).abs().max().item()
                assert err < 1e-3, f"{name} at seq {s}: max error {err}"
                for _ in range(3):
                    fn()
            times = {name: [] for name in engines}
            for _ in range(args.rounds):
                for name, fn in engines.items():
                    times[name].append(median_ms(fn, args.reps))
        med = {name: statistics.median(t) for name, t in times.items()}
        counts = (attention_ops(dynamic.compiled), attention_ops(static[s].compiled),
                  *(attention_ops(from_onnx[x]._compiled) for x in files))
        print(f"| {s} | {med['pypto-dynamic']:.2f} | {med['pypto-static']:.2f} | "
              + "".join(f"{med[e]:.2f} | " for e in onnx_names)
              + f"{med['pypto-dynamic'] / med['pypto-static']:.2f} | "
              f"{med['pypto-dynamic'] / med['ort']:.2f} | "
              + "".join(f"{med[f'pypto-onnx{x}'] / med[f'ort{x}']:.2f} | " for x in files)
              + f"{counts} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
