"""Text generation (transformers' generate(), greedy, with its KV cache) against the peers, in one
run, as markdown (rules: BENCHMARKING.md).

    python bench/generate.py                             # GPT-2 small and a Llama-style decoder,
                                                         # 1 and 2 threads (~25 min)
    python bench/generate.py --models gpt2 --threads 1 --engines eager,pypto --quick

A decoder (random weights, seed 0, built from its config: `gpt2` is GPT-2 small, 124M
parameters; `llama` a Llama-style decoder of the same width, 12 layers of 768 with 12 query and
4 K/V heads, SwiGLU 2048, a 32000-token vocabulary, 110M) continues a --prompt-token prompt by
--new-tokens tokens (min_new_tokens = max_new_tokens: every engine generates the same count).
One process per model x threads x engine:
- eager: PyTorch eager, fp32, under torch.inference_mode (the floor);
- eager-bf16: the model in bfloat16 (model.to(torch.bfloat16), as decoders are usually loaded:
  half the bytes of weights to read per token);
- inductor: model.forward = torch.compile(model.forward) (Inductor, freezing), fp32;
- pypto: model.forward = torch.compile(model.forward, backend="pypto"), fp32;
- pypto-bf16: the same on the bfloat16 model (PyPTO computes in fp32 with bf16 products, its
  weights packed in bf16);
- ort: ONNX Runtime (ORT_ENABLE_ALL) on the decoder exported with its past keys and values as
  inputs and outputs, driven by a greedy loop in Python (bench/generate_ort.py);
- pypto-onnx: the same exported file and loop on pypto.onnx.load, fp32 (PyPTO's ONNX path on
  ONNX Runtime's own terms: no generate(), no Dynamo). --exporter picks the file's exporter
  (TorchScript, the default, or dynamo).
Before timing, each engine's tokens are compared with eager fp32's: fp32 engines must give the
same tokens (and scores within 1e-4 of max |score|); bf16 engines report the error of their first
scores (the prompt's logits) against fp32 (within 3e-2) and how many tokens agree before the first
difference (bf16 rounding may pick another token where two are close; then the sequences part).
Timing (BENCHMARKING.md's protocol, each call timed): generate() of --new-tokens tokens and of
one token; tokens/s = new tokens / median call; prefill = the one-token call (the prompt's forward
and the first token); decode = (median of the long call - the short one) / (new tokens - 1), the
time of a step with the cache. Decode reads every weight once a token (the embedding's rows
aside), so its bytes per token / decode time is set against the memory read ceiling measured in
the same run (`pto_bench --only memory`, arrays 4x the L3, the `read` kernel) on the same thread
count. PyTorch engines on 2 threads run with OMP_WAIT_POLICY unset and PASSIVE, the better kept.
The JSON and the table go to bench/results/generate.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (bench/run.py: children, timing, ceilings)

REPO = base.REPO
MARK = "@@generate@@ "
ENGINES = ["eager", "eager-bf16", "inductor", "pypto", "pypto-bf16", "ort", "pypto-onnx"]
MODELS = ["gpt2", "llama"]
TORCH_ENGINES = {"eager", "eager-bf16", "inductor"}  # run under both OpenMP wait policies


def build_model(name: str):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    elif name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048))
    else:
        raise SystemExit(f"unknown model {name}")
    return model.eval()


def weight_bytes(model) -> int:
    """Bytes of the weights a decode step reads: every parameter once (tied ones once), except
    embedding tables that only an Embedding gathers from (a row a token); a table an output layer
    shares (GPT-2's tied head) is read whole, so it counts."""
    import torch

    read = {}
    for m in model.modules():
        if not isinstance(m, torch.nn.Embedding):
            for p in m.parameters(recurse=False):
                read[p.data_ptr()] = p.numel() * p.element_size()
    return sum(read.values())


def child(args) -> dict:
    import torch

    base.child_setup(args.threads)
    result = {"status": "ok", "engine": args.engine, "model": args.model,
              "threads": args.threads, "torch": torch.__version__}
    model = build_model(args.model)
    vocab = model.config.vocab_size
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (1, args.prompt_tokens))

    def generate(m, new):
        with torch.inference_mode():
            return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, output_scores=True,
                              return_dict_in_generate=True, pad_token_id=0)

    want = generate(model, args.new_tokens)
    want_tokens = want.sequences[0, args.prompt_tokens:].tolist()
    half = args.engine.endswith("-bf16")
    if half:
        model = model.to(torch.bfloat16)
    result["weight_bytes"] = weight_bytes(model)

    t0 = time.perf_counter()
    if args.engine in ("ort", "pypto-onnx"):
        import generate_ort

        workdir = tempfile.mkdtemp(prefix="pto-gen-onnx-")
        make = (generate_ort.ort_generator if args.engine == "ort"
                else generate_ort.pypto_onnx_generator)
        try:
            run = make(model, ids, args.threads, workdir, dynamo=args.exporter == "dynamo")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # the session holds the weights
        if args.engine == "ort":
            result["onnxruntime"] = generate_ort.version()
        result["exporter"] = args.exporter
    else:
        if args.engine == "inductor":
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
            model.forward = torch.compile(model.forward)
        elif args.engine.startswith("pypto"):
            import pypto

            pypto.set_num_threads(args.threads)
            model.forward = torch.compile(model.forward, backend="pypto")

        def run(new):
            out = generate(model, new)
            return out.sequences[0, args.prompt_tokens:].tolist(), out.scores

    tokens, scores = run(args.new_tokens)  # compiles (both cache shapes) where there is a compiler
    run(1)
    result["compile_s"] = time.perf_counter() - t0

    def error(got, ref):  # on the finite scores: min_new_tokens masks the end token with -inf
        finite = torch.isfinite(ref)
        return ((got.float() - ref)[finite].abs().max() / ref[finite].abs().max()).item()

    result["first_scores_error"] = error(scores[0], want.scores[0])
    agree = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), len(tokens))
    result["tokens_agree"] = agree
    result["same_tokens"] = tokens == want_tokens
    if half:
        result["check"] = "ok" if result["first_scores_error"] <= 3e-2 else "wrong"
    else:
        errs = [error(s, r) for s, r in zip(scores, want.scores)]
        result["scores_error"] = max(errs) if result["same_tokens"] else None
        result["check"] = ("ok" if result["same_tokens"] and max(errs) <= 1e-4 else "wrong")
    if result["check"] != "ok":
        result["status"] = "wrong"
        return result

    protocol = base.QUICK if args.quick else base.FULL
    long = base.measure(lambda: run(args.new_tokens), protocol)
    short = base.measure(lambda: run(1), protocol)
    result["generate"] = long
    result["prefill"] = short
    result["tokens_per_s"] = args.new_tokens / long["median"]
    result["decode_s"] = (long["median"] - short["median"]) / (args.new_tokens - 1)
    result["median"] = long["median"]
    result["peak_rss_mib"] = base.peak_rss_mib()
    return result


def run_engine(args, model: str, engine: str, threads: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--engine", engine,
           "--model", model, "--threads", str(threads), "--prompt-tokens",
           str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
           "--exporter", args.exporter, *(["--quick"] if args.quick else [])]
    best = None
    policies = [None, "PASSIVE"] if engine in TORCH_ENGINES and threads > 1 else [None]
    for policy in policies:
        env = base.child_env(threads, policy)
        cache = None
        if engine == "inductor":
            cache = tempfile.mkdtemp(prefix="pto-gen-inductor-")
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        env["PYTHONPATH"] = f"{REPO / 'python'}:{Path(__file__).resolve().parent}"
        try:
            r = base.run_child(cmd, env, args.timeout, marker=MARK)
        finally:
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
        r["omp_wait_policy"] = policy or "default"
        if best is None or (not base.ok(best) and base.ok(r)) or (
                base.ok(r) and r["median"] < best["median"]):
            best = r
    return best


def read_ceiling(pb: dict | None, threads: int) -> float | None:
    for r in (pb or {}).get("memory", []):
        if r["kernel"] == "read" and r["threads"] == threads:
            return r["gbps"]
    return None


def markdown(results: dict) -> str:
    lines = []
    for t, ceiling in results["read_gbps"].items():
        lines.append(f"Threads {t}: memory read ceiling {ceiling:.1f} GB/s (pto_bench, arrays 4x "
                     "the L3)." if ceiling else f"Threads {t}: no memory ceiling measured.")
    exporters = {r["exporter"] for r in results["runs"] if "exporter" in r}
    if exporters:
        lines.append(f"ONNX engines' file: {', '.join(sorted(exporters))} exporter.")
    lines.append("")
    lines.append("| model | threads | engine | tokens/s | prefill ms | decode ms/token | decode GB/s "
                 "(% read ceiling) | compile s | check |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"]:
        t = r.get("threads")
        if not base.ok(r):
            lines.append(f"| {r.get('model')} | {t} | {r.get('engine')} | - | - | - | - | - | "
                         f"{r.get('status')}: {str(r.get('error', r.get('check', '')))[:80]} |")
            continue
        ceiling = results["read_gbps"].get(str(t)) or results["read_gbps"].get(t)
        gbps = r["weight_bytes"] / r["decode_s"] / 1e9
        frac = f" ({gbps / ceiling:.0%})" if ceiling else ""
        check = (f"same tokens, {r['scores_error']:.1e}" if r.get("scores_error") is not None
                 else f"first scores {r['first_scores_error']:.1e}, {r['tokens_agree']} tokens "
                      "agree")
        lines.append(f"| {r['model']} | {t} | {r['engine']} | {r['tokens_per_s']:.1f} | "
                     f"{r['prefill']['median'] * 1e3:.1f} | {r['decode_s'] * 1e3:.2f} | "
                     f"{gbps:.1f}{frac} | {r['compile_s']:.1f} | {check} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="the short timing protocol")
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript",
                    help="the ONNX exporter of the ort and pypto-onnx engines' file")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per child")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "generate"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        try:
            result = child(args)
        except Exception as e:  # noqa: BLE001 - the parent reports it
            import traceback

            traceback.print_exc()
            result = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        return base.report_child(result, MARK)
    if args.new_tokens < 2:
        raise SystemExit("--new-tokens must be at least 2 (decode time is the difference of two)")
    models = base.parse_list(args.models, MODELS, "--models")
    engines = base.parse_list(args.engines, ENGINES, "--engines")
    threads = base.parse_list(args.threads, [1, 2, 4, 8, 16, 32, 64], "--threads", int)
    pto_bench = REPO / "build" / "bench" / "pto_bench"
    results = {"prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
               "read_gbps": {}, "runs": []}
    for t in threads:
        pb = base.pto_bench(pto_bench, t, "memory", False, args.timeout)
        results["read_gbps"][t] = read_ceiling(pb, t)
        for m in models:
            for e in engines:
                print(f"== {m}, {t} thread(s), {e}", file=sys.stderr, flush=True)
                r = run_engine(args, m, e, t)
                r.setdefault("model", m)
                r.setdefault("engine", e)
                r.setdefault("threads", t)
                results["runs"].append(r)
    md = markdown(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
