#!/usr/bin/env python3
"""LinearAttention and CausalConvWithState (ONNX opset 27, the Gated DeltaNet / Mamba ops) on
PyPTO's CPU kernels against PyTorch eager running the same recurrence the way Hugging Face's
CPU fallback for Gated DeltaNet does (one token at a time over all heads), interleaved in one
process. ONNX Runtime 1.32 has no kernel for these opset-27 ops, so PyTorch is the peer.

    python bench/linear_attention.py [--threads 1] [--rounds 5] [--json FILE]

Per case: median ms of a call per engine, the ratio torch / pypto, and the state's bytes (read
and written once a token) over the time, beside the machine's memory read ceiling from
build/bench/pto_bench (the 2 MiB state of one row stays in the L3, so a decoding step can pass it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

F = TensorProto.FLOAT
# name: (batch, tokens, heads, dk, dv), the Qwen3-Next-like layer of 32 heads of 128 x 128.
CASES = {
    "gdn_decode": (1, 1, 32, 128, 128),
    "gdn_prefill_256": (1, 256, 32, 128, 128),
    "gdn_decode_batch8": (8, 1, 32, 128, 128),
}


def linear_model(b, t, h, dk, dv):
    vi = lambda n, s: helper.make_tensor_value_info(n, F, s)  # noqa: E731
    node = helper.make_node("LinearAttention", ["q", "k", "v", "s", "g", "beta"], ["y", "s_out"],
                            q_num_heads=h, kv_num_heads=h, update_rule="gated_delta")
    g = helper.make_graph([node], "la", [vi("q", [b, t, h * dk]), vi("k", [b, t, h * dk]),
                                         vi("v", [b, t, h * dv]), vi("s", [b, h, dk, dv]),
                                         vi("g", [b, t, h]), vi("beta", [b, t, h])],
                          [vi("y", [b, t, h * dv]), vi("s_out", [b, h, dk, dv])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)])


def feeds_for(b, t, h, dk, dv, rng):
    k = rng.standard_normal((b, t, h, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the delta rule's L2-normalized keys
    return {"q": rng.standard_normal((b, t, h * dk)).astype(np.float32),
            "k": k.reshape(b, t, h * dk),
            "v": rng.standard_normal((b, t, h * dv)).astype(np.float32),
            "s": rng.standard_normal((b, h, dk, dv)).astype(np.float32) * 0.1,
            "g": -rng.random((b, t, h)).astype(np.float32) * 0.5,
            "beta": rng.random((b, t, h)).astype(np.float32)}


def torch_recurrence(torch, f, h, dk, dv):
    """The gated delta rule token by token over all heads (transformers'
    torch_recurrent_gated_delta_rule, in the ONNX op's layout)."""
    b, t = f["q"].shape[:2]
    q = torch.from_numpy(f["q"]).view(b, t, h, dk).transpose(1, 2) * dk ** -0.5
    k = torch.from_numpy(f["k"]).view(b, t, h, dk).transpose(1, 2)
    v = torch.from_numpy(f["v"]).view(b, t, h, dv).transpose(1, 2)
    g = torch.from_numpy(f["g"]).transpose(1, 2).exp()
    beta = torch.from_numpy(f["beta"]).transpose(1, 2)
    s = torch.from_numpy(f["s"]).clone()
    out = torch.empty(b, h, t, dv)
    for i in range(t):
        s = s * g[:, :, i, None, None]
        u = beta[:, :, i, None] * (v[:, :, i] - (s * k[:, :, i, :, None]).sum(-2))
        s = s + k[:, :, i, :, None] * u[:, :, None, :]
        out[:, :, i] = (s * q[:, :, i, :, None]).sum(-2)
    return out.transpose(1, 2).reshape(b, t, h * dv), s


def median_ms(fn, rounds):
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def read_ceiling(threads):
    """pto_bench's memory read rate (GB/s, p90) on `threads`, or None when it is not built."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench",
                       "pto_bench")
    if not os.path.exists(exe):
        return None
    import subprocess
    out = subprocess.run([exe, "--only", "memory", "--quick", "--threads", str(threads)],
                         capture_output=True, text=True, check=False).stdout
    try:
        rates = [r["gbps_p90"] for r in json.loads(out)["memory"] if r["kernel"] == "read"]
    except (ValueError, KeyError):
        return None
    return max(rates) if rates else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["PTO_NUM_THREADS"] = str(args.threads)
    import torch

    import pypto
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            b, t, h, dk, dv = CASES[name]
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(linear_model(b, t, h, dk, dv), path)
            exe = pypto.onnx.load(path)
            f = feeds_for(b, t, h, dk, dv, rng)
            got = exe(**f)
            want = torch_recurrence(torch, f, h, dk, dv)
            err = float(np.abs(np.asarray(got[0]) - want[0].numpy()).max())
            pto_ms, torch_ms = [], []
            for _ in range(3):  # interleaved rounds
                pto_ms.append(median_ms(lambda: exe(**f), args.rounds))
                with torch.inference_mode():
                    torch_ms.append(median_ms(lambda: torch_recurrence(torch, f, h, dk, dv),
                                              args.rounds))
            p, q = statistics.median(pto_ms), statistics.median(torch_ms)
            state_gb = 2 * b * h * dk * dv * 4 * t / 1e9  # read and written once a token
            rows.append({"case": name, "pypto_ms": p, "torch_ms": q, "torch_over_pypto": q / p,
                         "state_gbs": state_gb / (p / 1e3), "max_diff": err})
    ceiling = read_ceiling(args.threads)
    print(f"threads {args.threads}, memory read ceiling "
          f"{f'{ceiling:.1f} GB/s' if ceiling else 'not measured (build/bench/pto_bench missing)'}")
    print(f"{'case':<20}{'pypto ms':>10}{'torch ms':>10}{'torch/pypto':>13}{'state GB/s':>12}"
          f"{'max diff':>10}")
    for r in rows:
        print(f"{r['case']:<20}{r['pypto_ms']:>10.3f}{r['torch_ms']:>10.3f}"
              f"{r['torch_over_pypto']:>12.1f}x{r['state_gbs']:>12.1f}{r['max_diff']:>10.1e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": args.threads, "read_ceiling_gbs": ceiling, "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
