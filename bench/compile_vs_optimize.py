#!/usr/bin/env python3
"""torch.compile(model, backend="pypto") against pypto.optimize(model) and eager PyTorch on the zoo
models, steady state, in one run (issue 14 T3; rules: BENCHMARKING.md; usage: bench/README.md).

    python bench/compile_vs_optimize.py                        # ALWAYS_ON + dynamic BERT, 1 thread
    python bench/compile_vs_optimize.py --quick --models resnet18,bert --no-dynamic

Cases: every model of tests/python/torch_models.py's ALWAYS_ON (--models: any zoo names, or
"core" for the ten benchmark models) at batch 1 (--batch) on its zoo input, and BERT-base with
dynamic sizes at two sequence lengths (--seqs, default 16 and 64): torch.compile(dynamic=True),
and pypto.optimize with the sequence symbolic (a torch.export Dim), each compiled
once and called at both lengths before the timing of one of them. Engines (--engines), each
(case, engine) in a process of its own, interleaved in the order given (again for each --rounds):
- eager: the model under torch.inference_mode (the floor);
- optimize: pypto.optimize(model, example_inputs), called under torch.inference_mode;
- compile: torch.compile(model, backend="pypto"), called under torch.inference_mode (the
  inference graph: weights frozen into initializers), with pypto.dynamo.stats() after the
  warm-up: graphs Dynamo made, PyPTO pieces, nodes left to PyTorch, weights frozen / passed per
  call;
- dynamo_floor: Dynamo's own cost per call, the least torch.compile can cost over the compiled
  graph: torch.compile with a backend whose callable returns the outputs of its first call and
  does nothing else, timed with pypto.optimize's model run (untimed) before each call, so the
  caches are in the state a real call finds them (its back-to-back median too: warm_median).
  optimize + dynamo_floor is the best a torch.compile backend can do: the "bound" column;
- dynamo_eager (only when --engines names it): torch.compile with a backend returning
  gm.forward (Dynamo's floor with eager kernels).
An engine may name settings after a colon, joined by "+" (compile:tuned, dynamo_floor:tuned+
skip_guards): PyTorch's own switches, entered around the first calls (where Dynamo compiles)
or around the timed calls (skip_guards), from SETTINGS below; compile_tuned is compile:tuned.
Each child checks its main output against eager (max relative error <= 1e-4; not for
dynamo_floor) before timing, then times calls one by one (PROTOCOL below), wall-clock and CPU
time (time.process_time: less sensitive than wall-clock to other processes on a shared
machine) of each call. The ratios compile / optimize are of the medians of the same run (the
median round of each); the target is <= 1.10. eager, optimize and compile are timed back to
back, as a user calls one model. The compile child then times its calls again alternated with
pypto.optimize's model (both timed): the "paired" ratio compares the two at the same moments,
which holds on a loaded machine where separate processes do not, though both run slower there
than back to back (the two copies of the weights evict each other from the caches).
JSON goes to bench/results/.
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
ENGINES = ["eager", "optimize", "compile", "dynamo_floor"]  # the default --engines
KINDS = ENGINES + ["dynamo_eager"]  # what an engine runs; settings may follow after a colon
ALIASES = {"compile_tuned": "compile:tuned"}
# PyTorch's switches for inference (docs/python.md): (phase, what it enters). "compile": around
# the first calls, where Dynamo captures and compiles (it reads them then); "call": around the
# timed calls.
SETTINGS = {
    # Dynamo makes the parameters graph attributes guarded by identity, not inputs it fetches
    "freezing": ("compile", lambda torch: torch._inductor.config.patch(freezing=True)),
    # the guards of a module tree whose dicts have not changed are skipped as a whole
    "dict_tags": ("compile", lambda torch: torch._dynamo.config.patch(
        use_recursive_dict_tags_for_guards=True)),
    # parameters installed as graph attributes guarded by shape only (not suggested)
    "free_tensors": ("compile", lambda torch: torch._dynamo.config.patch(
        install_free_tensors=True)),
    # only the guards that tell cache entries apart are checked (unsafe: PyTorch's name)
    "skip_guards": ("call", lambda torch: torch.compiler.set_stance(
        "default", skip_guard_eval_unsafe=True)),
}
SETTINGS["tuned"] = ("compile", lambda torch: _both(torch, "freezing", "dict_tags"))
TOLERANCE = 1e-4
TARGET = 1.10  # compile / optimize
# Warm-up 3 calls and 0.5 s, then at least 10 calls and 2 s (bench/run.py's FULL takes 1 s and 4 s:
# 23 cases x 3 engines, each compiling first, fit in about 20 minutes on two loaded cores)
PROTOCOL = dict(warmup_calls=3, warmup_s=0.5, calls=10, seconds=2.0, cap_s=30.0)


def _both(torch, *names):
    stack = contextlib.ExitStack()
    for n in names:
        stack.enter_context(SETTINGS[n][1](torch))
    return stack


def parse_engine(spec: str) -> tuple[str, list[str]]:
    """An engine name: its kind and settings ("compile:tuned+skip_guards")."""
    kind, _, settings = ALIASES.get(spec, spec).partition(":")
    names = [n for n in settings.split("+") if n]
    unknown = [n for n in [kind] if n not in KINDS] + [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)} in {spec!r} (engines: "
                         f"{', '.join(KINDS)}; settings: {', '.join(SETTINGS)})")
    return kind, names


def settings_context(torch, names: list[str], phase: str):
    stack = contextlib.ExitStack()
    for n in names:
        if SETTINGS[n][0] == phase:
            stack.enter_context(SETTINGS[n][1](torch))
    return stack


def floor_backend(gm, example_inputs):
    """Dynamo's own cost: a callable that returns the outputs of its first call (run by the graph
    itself) and does nothing else. Not a correct backend: it answers every call alike."""
    outs = []

    def call(*args):
        if not outs:
            outs.append(gm(*args))
        return outs[0]
    return call


def measure(fn, protocol: dict, between=None) -> dict:
    """bench/run.py's measure, with the CPU time of each call too, and `between` before each
    call, warm-up included, timed on its own (paired_median, paired_cpu_median)."""
    wall, cpu, paired, paired_cpu = [], [], [], []
    start = time.perf_counter()
    n = 0
    while n < protocol["warmup_calls"] or time.perf_counter() - start < protocol["warmup_s"]:
        if between is not None:
            between()
        fn()
        n += 1
        if time.perf_counter() - start > protocol["cap_s"]:
            break
    wall0, cpu0 = time.perf_counter(), base.cpu_seconds()
    while True:
        if between is not None:
            c0, t0 = time.process_time(), time.perf_counter()
            between()
            paired.append(time.perf_counter() - t0)
            paired_cpu.append(time.process_time() - c0)
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        t1, c1 = time.perf_counter(), time.process_time()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        if len(wall) >= protocol["calls"] and t1 - wall0 >= protocol["seconds"]:
            break
        if t1 - wall0 >= protocol["cap_s"]:
            break
    elapsed = time.perf_counter() - wall0
    result = {**base.summary(wall), "cpu_median": statistics.median(cpu),
              "cpu_util": (base.cpu_seconds() - cpu0) / elapsed if elapsed > 0 else 0.0}
    if paired:
        result.update(paired_median=statistics.median(paired),
                      paired_cpu_median=statistics.median(paired_cpu))
    return result


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
    kind, settings = parse_engine(engine)
    t0 = time.perf_counter()
    dynamic = True if seq is not None else None
    optimized = None
    if kind in ("optimize", "compile", "dynamo_floor"):
        shapes = None
        if seq is not None:
            dim = torch.export.Dim
            # the sequence symbolic (a batch-1 example would specialize a symbolic batch)
            shapes = ({1: dim("seq", min=2, max=512)},)
        optimized = pypto.optimize(model, xs[0], dynamic_shapes=shapes)
        if kind != "optimize":  # built for the paired timing: not this engine's compile time
            t0 = time.perf_counter()
    if kind == "eager":
        fn = model
    elif kind == "optimize":
        fn = optimized
    elif kind == "compile":
        fn = torch.compile(model, backend="pypto", dynamic=dynamic)
    elif kind == "dynamo_eager":
        fn = torch.compile(model, backend=lambda gm, example_inputs: gm.forward, dynamic=dynamic)
    else:
        fn = torch.compile(model, backend=floor_backend, dynamic=dynamic)
    with settings_context(torch, settings, "compile"), torch.inference_mode():
        for a in xs:
            got = torch_models.first_tensor(fn(*a))
    result["compile_s"] = time.perf_counter() - t0  # capture, compile, the first call(s)
    if kind != "dynamo_floor":
        err = torch_models.relative_error(got.detach(), want)
        result["max_rel_err"] = err
        if not err <= TOLERANCE:
            result.update(status="wrong", error=f"max relative error {err:.2e}")
            return result
    protocol = base.QUICK if args.quick else PROTOCOL
    with settings_context(torch, settings, "call"), torch.inference_mode():
        if kind == "dynamo_floor":  # warm: back to back
            result["warm_median"] = measure(lambda: fn(*x), protocol)["median"]
        if kind == "dynamo_floor":
            # each call after a call of pypto.optimize's model (untimed in the median): the
            # caches as a real call, which runs a model, finds them; the paired ratio too
            result.update(measure(lambda: fn(*x), protocol, between=lambda: optimized(*x)))
        else:
            # back to back, as a user calls one model (the optimize child does the same)
            result.update(measure(lambda: fn(*x), protocol))
        if kind == "compile":
            # then alternated with pypto.optimize's model, both timed: a ratio of the same
            # moments, which holds on a loaded machine where separate processes do not. Two
            # copies of the weights then evict each other from the caches, so both run slower
            # than back to back (a small CNN's weights are most of its memory traffic)
            p = measure(lambda: fn(*x), protocol, between=lambda: optimized(*x))
            result.update(paired_self_median=p["median"], paired_self_cpu_median=p["cpu_median"],
                          paired_median=p["paired_median"],
                          paired_cpu_median=p["paired_cpu_median"])
    if kind == "compile":
        result["dynamo"] = dynamo.stats()
        result["piece_inputs"] = sorted(len(g.input_names) for g in dynamo.pieces())
    result["peak_rss_mib"] = base.peak_rss_mib()
    result["status"] = "ok"
    return result


def fmt(x, spec="{:.2f}"):
    return spec.format(x) if x is not None else "-"


def summarize(results: list[dict], cases: list[str], engines: list[str]) -> list[dict]:
    """Per case: the median round of each engine, the ratios and the compile engine's stats."""
    rows = []
    for case in cases:
        row: dict = {"case": case}
        for e in engines:
            r = base.median_round([r for r in results if r["case"] == case and r["engine"] == e])
            if r is None:
                continue
            row[e] = r["median"] * 1e3 if base.ok(r) else r.get("status", "failed")
            if base.ok(r):
                row[f"{e}_cpu"] = r["cpu_median"] * 1e3
                if "warm_median" in r:
                    row[f"{e}_warm"] = r["warm_median"] * 1e3
            if base.ok(r) and "paired_median" in r:  # this engine over optimize, paired
                row[f"{e}_paired"] = r.get("paired_self_median", r["median"]) / r["paired_median"]
                row[f"{e}_paired_cpu"] = (r.get("paired_self_cpu_median", r["cpu_median"])
                                          / r["paired_cpu_median"])
            if e == "compile" and base.ok(r):
                d = r["dynamo"]
                row.update(graphs=d["graphs"], pieces=d["pypto_pieces"],
                           fallback_nodes=d["fallback_nodes"], frozen=d["frozen_weights"],
                           weight_inputs=d["weight_inputs"], fallback_ops=d["fallback_ops"])
        opt, opt_cpu = row.get("optimize"), row.get("optimize_cpu")
        if isinstance(opt, float):
            if isinstance(row.get("compile"), float):
                row["ratio"] = row["compile"] / opt
                row["cpu_ratio"] = row["compile_cpu"] / opt_cpu
            floor = row.get("dynamo_floor")
            if isinstance(floor, float):  # the best ratio a backend adding nothing could reach
                row["bound"] = (opt + floor) / opt
                row["cpu_bound"] = (opt_cpu + row["dynamo_floor_cpu"]) / opt_cpu
                if isinstance(row.get("compile"), float):
                    row["ours"] = row["compile"] - opt - floor
            for e in engines:
                if e not in ("optimize", "compile") and isinstance(row.get(e), float):
                    row[f"{e}_cpu_ratio"] = row[f"{e}_cpu"] / opt_cpu
        if "compile_paired_cpu" in row and "dynamo_floor_paired_cpu" in row:
            row["paired_cpu_bound"] = 1 + row["dynamo_floor_paired_cpu"]
        if isinstance(row.get("compile"), float) and isinstance(row.get("eager"), float):
            row["vs_eager"] = row["eager"] / row["compile"]
        rows.append(row)
    return rows


def table(rows: list[dict], engines: list[str]) -> list[str]:
    def cell(r, key, spec="{:.2f}"):
        v = r.get(key)
        return fmt(v, spec) if isinstance(v, float) or v is None else str(v)

    lines = ["| model | eager ms | optimize ms | compile ms | dynamo_floor ms (warm) | compile / "
             "optimize | bound: (optimize + floor) / optimize | CPU compile / optimize | CPU "
             "bound | compile - optimize - floor ms | speed-up over eager | graphs / pieces | "
             "nodes left to PyTorch | weights frozen / per call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = cell(r, "ratio", "{:.3f}")
        if r.get("ratio") is not None and r["ratio"] > TARGET:
            ratio += " (over)"
        lines.append(f"| {r['case']} | {cell(r, 'eager')} | {cell(r, 'optimize')} | "
                     f"{cell(r, 'compile')} | {cell(r, 'dynamo_floor', '{:.3f}')} "
                     f"({cell(r, 'dynamo_floor_warm', '{:.3f}')}) | {ratio} | "
                     f"{cell(r, 'bound', '{:.3f}')} | {cell(r, 'cpu_ratio', '{:.3f}')} | "
                     f"{cell(r, 'cpu_bound', '{:.3f}')} | {cell(r, 'ours', '{:.3f}')} | "
                     f"{cell(r, 'vs_eager')}{'x' if 'vs_eager' in r else ''} | {r.get('graphs', '-')} / {r.get('pieces', '-')} "
                     f"| {r.get('fallback_nodes', '-')} | {r.get('frozen', '-')} / "
                     f"{r.get('weight_inputs', '-')} |")
    lines += ["", "Paired (each call after a call of pypto.optimize's model in the same process, "
              "CPU time, one over the other):", "",
              "| model | compile / optimize | dynamo_floor / optimize | bound: 1 + floor / "
              "optimize |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {cell(r, 'compile_paired_cpu', '{:.3f}')} | "
                     f"{cell(r, 'dynamo_floor_paired_cpu', '{:.3f}')} | "
                     f"{cell(r, 'paired_cpu_bound', '{:.3f}')} |")
    others = [e for e in engines if e not in ENGINES]
    if others:  # every other engine: its medians and its CPU time over optimize's
        lines += ["", "| model | engine | ms | CPU ms | CPU / optimize CPU | CPU / optimize "
                  "CPU, paired | warm ms |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            for e in others:
                lines.append(f"| {r['case']} | {e} | {cell(r, e, '{:.3f}')} | "
                             f"{cell(r, e + '_cpu', '{:.3f}')} | "
                             f"{cell(r, e + '_cpu_ratio', '{:.3f}')} | "
                             f"{cell(r, e + '_paired_cpu', '{:.3f}')} | "
                             f"{cell(r, e + '_warm', '{:.3f}')} |")
    lines.append("")
    keys = [("ratio", "compile / optimize, wall-clock"), ("cpu_ratio", "compile / optimize, CPU"),
            ("bound", "bound (optimize + dynamo_floor) / optimize, wall-clock"),
            ("cpu_bound", "bound, CPU"), ("compile_paired_cpu", "compile / optimize, CPU, paired"),
            ("paired_cpu_bound", "bound, CPU, paired")]
    keys += [(f"{e}_cpu_ratio", f"{e} / optimize, CPU") for e in others]
    for key, what in keys:
        ratios = sorted(r[key] for r in rows if r.get(key) is not None)
        if ratios:
            gm = statistics.geometric_mean(ratios)
            within = sum(q <= TARGET for q in ratios)
            lines.append(f"{what}: geometric mean {gm:.3f}, median "
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
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"comma-separated, each one of {', '.join(KINDS)}, optionally with "
                         f"settings after a colon joined by '+' ({', '.join(SETTINGS)}), e.g. "
                         f"compile:tuned, dynamo_floor:tuned+skip_guards")
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
    engines = [ALIASES.get(e, e) for e in args.engines.split(",") if e]
    for e in engines:
        parse_engine(e)  # unknown engines and settings are errors before anything runs
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
    rows = summarize(results, cases, engines)
    path.write_text(json.dumps({"args": vars(args), "results": results, "summary": rows,
                                "load": os.getloadavg()}, indent=1))
    print(f"# torch.compile(backend=\"pypto\") vs pypto.optimize, batch {args.batch}, "
          f"{args.threads} thread(s) (load average {os.getloadavg()[0]:.2f})\n")
    print("\n".join(table(rows, engines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
