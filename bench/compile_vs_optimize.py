#!/usr/bin/env python3
"""torch.compile(model, backend="pypto") against pypto.optimize(model) and eager PyTorch on the zoo
models, steady state, in one run (issue 14 T3; rules: BENCHMARKING.md; usage: bench/README.md).

    python bench/compile_vs_optimize.py                        # ALWAYS_ON + dynamic BERT, 1 thread
    python bench/compile_vs_optimize.py --quick --models resnet18,bert --no-dynamic

Cases: every model of tests/python/torch_models.py's ALWAYS_ON (--models: any zoo names, or
"core" for the ten benchmark models) at batch 1 (--batch) on its zoo input, and BERT-base with
dynamic sizes at two sequence lengths (--seqs, default 16 and 64): torch.compile(dynamic=True),
and pypto.optimize with the sequence symbolic (a torch.export Dim), each compiled
once and called at both lengths before the timing of one of them. Engines, each (case, engine)
in a process of its own, interleaved (eager, optimize, compile; again for each --rounds):
- eager: the model under torch.inference_mode (the floor);
- optimize: pypto.optimize(model, example_inputs), called under torch.inference_mode;
- compile: torch.compile(model, backend="pypto"), called under torch.inference_mode (the
  inference graph: weights frozen into initializers), with pypto.dynamo.stats() after the
  warm-up: graphs Dynamo made, PyPTO pieces, nodes left to PyTorch, weights frozen / passed per
  call;
- compile_tuned (only when --engines names it): the same under the settings docs/python.md
  suggests for inference, around the first calls: torch._inductor.config.freezing (Dynamo reads
  it: the parameters become graph attributes guarded by identity, not fetched on every call)
  and torch._dynamo.config.use_recursive_dict_tags_for_guards (nn.Module guards checked by dict
  tags).
Each child checks its main output against eager (max relative error <= 1e-4) before timing, then
times calls one by one (bench/run.py's measure; PROTOCOL below), and then the CPU time of as many
calls one by one (time.process_time: less sensitive than wall-clock to other processes on a
shared machine). The ratios compile / optimize are of the medians of the same run (the median
round of each); the target is <= 1.10. JSON goes to bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as base  # noqa: E402  (bench/run.py: children, timing)

MARK = "@@compile-vs-optimize@@"
ENGINES = ["eager", "optimize", "compile"]  # the default --engines
ALL_ENGINES = ENGINES + ["compile_tuned"]
TOLERANCE = 1e-4
TARGET = 1.10  # compile / optimize
# Warm-up 3 calls and 0.5 s, then at least 10 calls and 2 s (bench/run.py's FULL takes 1 s and 4 s:
# 23 cases x 3 engines, each compiling first, fit in about 20 minutes on two loaded cores)
PROTOCOL = dict(warmup_calls=3, warmup_s=0.5, calls=10, seconds=2.0, cap_s=30.0)


def case_name(model: str, seq: int | None) -> str:
    return model if seq is None else f"{model}-dynamic-s{seq}"


def child(args) -> dict:
    engine, model_name = args.child
    seq, other = args.seq, args.other_seq
    import torch

    base.child_setup(args.threads)
    import torch_models

    import pypto
    from pypto import dynamo

    pypto.set_num_threads(args.threads)
    result: dict = {"engine": engine, "case": case_name(model_name, seq), "threads": args.threads}
    model = torch_models.build(model_name)
    if seq is None:
        x = torch_models.inputs(model_name, args.batch)
        xs = [x]
    else:  # the dynamic case: token ids of both lengths, the timed one last
        torch.manual_seed(torch_models.SEED)
        xs = [(torch.randint(0, 1000, (args.batch, s)),) for s in (other, seq)]
        x = xs[-1]
    with torch.inference_mode():
        want = torch_models.first_tensor(model(*x))
    t0 = time.perf_counter()
    if engine == "eager":
        fn = model
    elif engine == "optimize":
        shapes = None
        if seq is not None:
            dim = torch.export.Dim
            # the sequence symbolic (a batch-1 example would specialize a symbolic batch)
            shapes = ({1: dim("seq", min=2, max=512)},)
        fn = pypto.optimize(model, xs[0], dynamic_shapes=shapes)
    else:
        fn = torch.compile(model, backend="pypto", dynamic=True if seq is not None else None)
    stack = contextlib.ExitStack()
    if engine == "compile_tuned":
        import torch._inductor.config

        stack.enter_context(torch._inductor.config.patch(freezing=True))
        stack.enter_context(torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True))
    with stack, torch.inference_mode():
        for a in xs:
            got = torch_models.first_tensor(fn(*a))
    result["compile_s"] = time.perf_counter() - t0  # capture, compile, the first call(s)
    err = torch_models.relative_error(got.detach(), want)
    result["max_rel_err"] = err
    if not err <= TOLERANCE:
        result.update(status="wrong", error=f"max relative error {err:.2e}")
        return result
    protocol = base.QUICK if args.quick else PROTOCOL
    with torch.inference_mode():
        result.update(base.measure(lambda: fn(*x), protocol))
        # CPU seconds per call too: on a loaded machine (other processes on the cores) the
        # wall-clock medians of two children wait for the CPU differently, their CPU time less.
        cpu = []
        for _ in range(result["count"]):
            c0 = time.process_time()
            fn(*x)
            cpu.append(time.process_time() - c0)
    result["cpu_median"] = statistics.median(cpu)
    if engine.startswith("compile"):
        result["dynamo"] = dynamo.stats()
        result["piece_inputs"] = sorted(len(g.input_names) for g in dynamo.pieces())
    result["peak_rss_mib"] = base.peak_rss_mib()
    result["status"] = "ok"
    return result


def fmt(x, spec="{:.2f}"):
    return spec.format(x) if x is not None else "-"


def summarize(results: list[dict], cases: list[str]) -> list[dict]:
    """Per case: the median round of each engine, the ratios and the compile engine's stats."""
    rows = []
    for case in cases:
        row: dict = {"case": case}
        for e in ALL_ENGINES:
            r = base.median_round([r for r in results if r["case"] == case and r["engine"] == e])
            if r is None:
                continue
            row[e] = r["median"] * 1e3 if base.ok(r) else r.get("status", "failed")
            if base.ok(r):
                row[f"{e}_cpu"] = r["cpu_median"] * 1e3
            if e == "compile" and base.ok(r):
                d = r["dynamo"]
                row.update(graphs=d["graphs"], pieces=d["pypto_pieces"],
                           fallback_nodes=d["fallback_nodes"], frozen=d["frozen_weights"],
                           weight_inputs=d["weight_inputs"], fallback_ops=d["fallback_ops"])
        if isinstance(row.get("compile"), float) and isinstance(row.get("optimize"), float):
            row["ratio"] = row["compile"] / row["optimize"]
            row["cpu_ratio"] = row["compile_cpu"] / row["optimize_cpu"]
        if isinstance(row.get("compile_tuned"), float) and isinstance(row.get("optimize"), float):
            row["tuned_cpu_ratio"] = row["compile_tuned_cpu"] / row["optimize_cpu"]
        if isinstance(row.get("compile"), float) and isinstance(row.get("eager"), float):
            row["vs_eager"] = row["eager"] / row["compile"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | eager ms | optimize ms | compile ms | compile / optimize | CPU ms optimize "
             "/ compile | CPU compile / optimize | CPU compile_tuned / optimize | speed-up over "
             "eager | graphs / pieces | nodes left to PyTorch | weights frozen / per call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [fmt(r[e]) if isinstance(r.get(e), float) else str(r.get(e, "-"))
                 for e in ENGINES]
        ratio = fmt(r.get("ratio"), "{:.3f}")
        if r.get("ratio") is not None and r["ratio"] > TARGET:
            ratio += " (over)"
        cpu = f"{fmt(r.get('optimize_cpu'))} / {fmt(r.get('compile_cpu'))}"
        lines.append(f"| {r['case']} | {' | '.join(cells)} | {ratio} | {cpu} | "
                     f"{fmt(r.get('cpu_ratio'), '{:.3f}')} | "
                     f"{fmt(r.get('tuned_cpu_ratio'), '{:.3f}')} | {fmt(r.get('vs_eager'))}x | "
                     f"{r.get('graphs', '-')} / {r.get('pieces', '-')} | "
                     f"{r.get('fallback_nodes', '-')} | {r.get('frozen', '-')} / "
                     f"{r.get('weight_inputs', '-')} |")
    lines.append("")
    for key, what in (("ratio", "wall-clock"), ("cpu_ratio", "CPU time"),
                      ("tuned_cpu_ratio", "CPU time, compile_tuned")):
        ratios = sorted(r[key] for r in rows if r.get(key) is not None)
        if ratios:
            gm = statistics.geometric_mean(ratios)
            within = sum(q <= TARGET for q in ratios)
            lines.append(f"compile / optimize ({what}): geometric mean {gm:.3f}, median "
                         f"{base.quantile(ratios, 0.5):.3f}, max {ratios[-1]:.3f}; {within} of "
                         f"{len(ratios)} cases within {TARGET:.2f}")
    return lines


def main() -> int:
    sys.path.insert(0, str(base.REPO / "tests" / "python"))
    import torch_models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="always_on",
                    help="comma-separated zoo names, or always_on / core")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqs", default="16,64", help="the dynamic BERT's two sequence lengths")
    ap.add_argument("--no-dynamic", action="store_true", help="skip the dynamic BERT cases")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--other-seq", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return base.report_child(child(args), MARK)

    named = {"always_on": torch_models.ALWAYS_ON, "core": torch_models.CORE}
    models = named.get(args.models) or base.parse_list(args.models, list(torch_models.ZOO),
                                                       "model")
    engines = base.parse_list(args.engines, ALL_ENGINES, "engine")
    configs = [(m, None, None) for m in models]
    if not args.no_dynamic:
        a, b = (int(s) for s in args.seqs.split(","))
        configs += [("bert", a, b), ("bert", b, a)]
    cases = [case_name(m, s) for m, s, _ in configs]
    results = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"compile_vs_optimize-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for model, seq, other in configs:
        for _ in range(args.rounds):
            for e in engines:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", e, model,
                       "--threads", str(args.threads), "--batch", str(args.batch),
                       *(["--seq", str(seq), "--other-seq", str(other)] if seq else []),
                       *(["--quick"] if args.quick else [])]
                r = base.run_child(cmd, base.child_env(args.threads), args.timeout, MARK)
                r.update({"engine": e, "case": case_name(model, seq), "threads": args.threads})
                results.append(r)
                ms = r["median"] * 1e3 if base.ok(r) else None
                print(f"{case_name(model, seq)} {e}: {r.get('status')} {fmt(ms)} ms",
                      file=sys.stderr)
                path.write_text(json.dumps({"args": vars(args), "results": results,
                                            "load": os.getloadavg()}, indent=1))
    rows = summarize(results, cases)
    path.write_text(json.dumps({"args": vars(args), "results": results, "summary": rows,
                                "load": os.getloadavg()}, indent=1))
    print(f"# torch.compile(backend=\"pypto\") vs pypto.optimize, batch {args.batch}, "
          f"{args.threads} thread(s) (load average {os.getloadavg()[0]:.2f})\n")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
