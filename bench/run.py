"""PyPTO against its peers on this machine, in one run, as markdown tables (rules:
BENCHMARKING.md; usage and output: bench/README.md).

    python bench/run.py                      # everything: a few hours on 2 cores
    python bench/run.py --quick --models resnet18 --batches 1 --threads 1 --levels 0,2 --no-gemm

Measures, on each thread count:
- the ceilings and PyPTO's SGEMM with build/bench/pto_bench (FMA peak per ISA, memory bandwidth),
  and torch.mm on the same shapes;
- models built in code with random weights (seed 0), batch 1 latency and batch 8 throughput, on
  these engines (--engines):
  - eager: PyTorch eager under torch.inference_mode (the floor);
  - inductor: torch.compile (Inductor, default mode) with torch._inductor.config.freezing, under
    torch.inference_mode; its compile time is reported (cold: a fresh Inductor cache per process);
  - ort: ONNX Runtime (CPU provider, ORT_ENABLE_ALL, intra_op_num_threads=T,
    inter_op_num_threads=1, sequential execution) on the model exported once with
    torch.onnx.export (cached under $PTO_CACHE/bench-onnx or ~/.cache/pypto/bench-onnx), with the
    node count of ORT's optimized graph;
  - pypto: pypto.optimize(model, example_inputs=x, level=L) for each L of --levels, with the
    kernel count and the planned / unplanned peak intermediate memory from fast.stats().
  Every engine's outputs are checked against eager before it is timed.

Every configuration (what x batch x threads x engine [x level]) runs in a process of its own with
PTO_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS set to the thread count,
the engines interleaved (eager, inductor, ort, pypto L0..L3, and again for each --rounds). PyTorch
(eager and Inductor) on 2+ threads runs with OMP_WAIT_POLICY unset and PASSIVE and the better one
counts. Each call is timed on its own after a warm-up; the tables quote medians (p10-p90, the
count, peak RSS and CPU utilisation are in the JSON). A configuration that crashes, times out or
raises is recorded as failed (the reason in the JSON and under the tables) and the run carries on;
one whose outputs disagree with eager is WRONG and not timed. The full results go to bench/results/
(git-ignored), rewritten after every configuration.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {  # name in tests/python/torch_models.py -> (title, kind)
    "resnet18": ("ResNet-18", "image"),
    "resnet50": ("ResNet-50", "image"),
    "mobilenet_v2": ("MobileNetV2", "image"),
    "shufflenet_v2_x0_5": ("ShuffleNetV2 x0.5", "image"),
    "ghostnet_100": ("GhostNet-100", "image"),
    "levit_128s": ("LeViT-128S", "image"),
    "resnext50_32x4d": ("ResNeXt-50 32x4d", "image"),
    "regnet_y_400mf": ("RegNetY-400MF", "image"),
    "convnext_tiny": ("ConvNeXt-T", "image"),
    "bert": ("BERT-base", "text"),
    "gpt2": ("GPT-2 small", "text"),
}
# What a run without --models measures; the small networks above are for --models.
DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "bert", "gpt2"]
ENGINES = ["eager", "inductor", "ort", "pypto"]  # the order they run in (and the table's)
TITLES = {"eager": "eager", "inductor": "Inductor", "ort": "ORT"}
LEVELS = [0, 1, 2, 3]
IMAGE = 224
# The text models' sequence length: --seq, passed to the children (and to the scripts that reuse
# this module's children) through PTO_BENCH_SEQ.
SEQ = int(os.environ.get("PTO_BENCH_SEQ", "128"))


def set_seq(seq: int) -> None:
    """The text models' sequence length from now on, here and in the children started after."""
    global SEQ
    SEQ = seq
    os.environ["PTO_BENCH_SEQ"] = str(seq)


TOLERANCE = 1e-3  # max |engine - eager| / max |eager| on the model's main output
MARK = "@@bench-result@@ "  # a child's result: this, then JSON, on one line of stdout

# Timing protocol: warm-up calls and seconds, then at least `calls` calls and `seconds`, capped.
FULL = dict(warmup_calls=3, warmup_s=1.0, calls=10, seconds=4.0, cap_s=60.0)
QUICK = dict(warmup_calls=1, warmup_s=0.0, calls=3, seconds=0.2, cap_s=20.0)


# ---- measurement (children) ----

def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(fn, protocol: dict) -> dict:
    """Times calls of fn one by one; returns median, p10, p90, count, CPU utilisation."""
    start = time.perf_counter()
    n = 0
    while n < protocol["warmup_calls"] or time.perf_counter() - start < protocol["warmup_s"]:
        fn()
        n += 1
        if time.perf_counter() - start > protocol["cap_s"]:
            break
    times = []
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if len(times) >= protocol["calls"] and t1 - wall0 >= protocol["seconds"]:
            break
        if t1 - wall0 >= protocol["cap_s"]:
            break
    wall = time.perf_counter() - wall0
    return {**summary(times), "cpu_util": (cpu_seconds() - cpu0) / wall if wall > 0 else 0.0}


def quantile(ordered: list[float], p: float) -> float:
    """The p-quantile of sorted values, interpolated linearly."""
    pos = p * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(times: list[float]) -> dict:
    """Median, p10, p90 and count of call times."""
    ordered = sorted(times)
    return {"median": quantile(ordered, 0.5), "p10": quantile(ordered, 0.1),
            "p90": quantile(ordered, 0.9), "count": len(ordered)}


def child_setup(threads: int):
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(REPO / "python"))
    sys.path.insert(0, str(REPO / "tests" / "python"))


def child_torch_mm(args) -> dict:
    import torch

    child_setup(args.threads)
    protocol = QUICK if args.quick else FULL
    out = []
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        a = torch.rand(m, k, generator=g) * 2 - 1
        b = torch.rand(k, n, generator=g) * 2 - 1
        c = torch.empty(m, n)
        print(f"torch.mm {shape} threads {args.threads}", file=sys.stderr)
        with torch.inference_mode():
            r = measure(lambda: torch.mm(a, b, out=c), protocol)
        r.update(m=m, k=k, n=n, gflops=2 * m * n * k / r["median"] / 1e9)
        out.append(r)
    return {"status": "ok", "sgemm": out, "torch_parallel": torch.__config__.parallel_info()}


def build_model(name: str):
    """The zoo model (tests/python/torch_models.py); BERT with position embeddings for SEQ when
    that is longer than its default 512."""
    import torch
    import torch_models

    if name == "bert" and SEQ > 512:
        import transformers

        torch.manual_seed(torch_models.SEED)
        cfg = transformers.BertConfig(max_position_embeddings=SEQ)
        return transformers.BertModel(cfg).eval()
    return torch_models.build(name)


def model_inputs(name: str, batch: int):
    import torch

    torch.manual_seed(1000 + batch)
    if MODELS[name][1] == "image":
        return (torch.randn(batch, 3, IMAGE, IMAGE),)
    return (torch.randint(0, 1000, (batch, SEQ)),)


def onnx_cache_dir() -> Path:
    if os.environ.get("PTO_CACHE"):
        return Path(os.environ["PTO_CACHE"]) / "bench-onnx"
    return Path.home() / ".cache" / "pypto" / "bench-onnx"


def onnx_path(model: str, batch: int) -> Path:
    """The exported model: keyed by model, batch, input size and the torch / transformers /
    torchvision versions (the random weights depend on them)."""
    def version(pkg):
        try:
            return importlib.metadata.version(pkg).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            return "none"

    size = IMAGE if MODELS[model][1] == "image" else SEQ
    lib = "torchvision" if MODELS[model][1] == "image" else "transformers"
    key = f"{model}-b{batch}-s{size}-torch{version('torch')}-{lib}{version(lib)}"
    return onnx_cache_dir() / key / "model.onnx"


def child_export(args) -> dict:
    """Exports the model once to onnx_path (written to a temporary folder, then renamed): the
    TorchScript exporter (dynamo=False) first, the torch.export-based one if it fails."""
    import torch

    child_setup(args.threads)
    import torch_models

    model = build_model(args.model)
    if MODELS[args.model][1] == "text":
        # transformers' forward takes many optional arguments (the TorchScript exporter passes
        # its inputs so that one collides with use_cache) and returns a ModelOutput: export
        # input_ids -> the output's fields, last_hidden_state first.
        class Text(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids):
                return self.inner(input_ids=input_ids).to_tuple()

        model = Text(model).eval()  # a new Module trains by default: dynamo exports that
    x = model_inputs(args.model, args.batch)
    final = onnx_path(args.model, args.batch)
    if final.is_file():
        return {"status": "ok", "path": str(final), "cached": True}
    final.parent.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent.parent))
    tmp.chmod(0o755)
    names = ["input"] if MODELS[args.model][1] == "image" else ["input_ids"]
    errors = []
    try:
        for dynamo in (False, True):
            exporter = "dynamo" if dynamo else "torchscript"
            print(f"export {args.model} batch {args.batch} ({exporter})", file=sys.stderr)
            t0 = time.perf_counter()
            try:
                with torch.no_grad():
                    if dynamo:
                        torch.onnx.export(model, x, str(tmp / "model.onnx"), dynamo=True,
                                          input_names=names)
                    else:
                        torch.onnx.export(model, x, str(tmp / "model.onnx"), dynamo=False,
                                          opset_version=17, input_names=names)
            except Exception as e:  # noqa: BLE001 - any exporter failure: try the other one
                traceback.print_exc()
                errors.append(f"{exporter}: {type(e).__name__}: {e}"[:1000])
                for f in tmp.iterdir():
                    f.unlink()
                continue
            meta = {"status": "ok", "exporter": exporter, "export_s": time.perf_counter() - t0,
                    "torch": torch.__version__, "errors": errors}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                tmp.rename(final.parent)
            except OSError:  # another run exported it meanwhile
                if not final.is_file():
                    raise
            meta["path"] = str(final)
            return meta
        return {"status": "failed", "error": "; ".join(errors)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def setup_eager(args, model, x, result):
    """The reference itself."""
    return (lambda: model(*x)), None


def setup_inductor(args, model, x, result, bf16: bool = False):
    """torch.compile (Inductor, freezing on) of `model`; with bf16, compiled and called under
    torch.autocast("cpu", dtype=torch.bfloat16) (its products on bf16 operands, oneDNN's kernels
    on AMX or AVX512_BF16 where the CPU has them): (the timed call, its first output)."""
    import contextlib

    import torch
    import torch._inductor.config as inductor_config

    import torch_models

    inductor_config.freezing = True
    result["torch"] = torch.__version__
    compiled = torch.compile(model)  # default mode, default backend (Inductor)

    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def run():
        with context():
            return compiled(*x)

    t0 = time.perf_counter()
    with torch.inference_mode():
        got = torch_models.first_tensor(run())
    result["compile_s"] = time.perf_counter() - t0  # capture, lowering, C++ build, first call
    return run, got.float() if bf16 else got


def ort_session(path: str, threads: int, optimized_path: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def setup_ort(args, model, x, result):
    import onnxruntime as ort
    import torch

    result["onnxruntime"] = ort.__version__
    meta = Path(args.onnx).parent / "meta.json"
    if meta.is_file():
        result["exporter"] = json.loads(meta.read_text()).get("exporter")
    t0 = time.perf_counter()
    sess = ort_session(args.onnx, args.threads)
    result["compile_s"] = time.perf_counter() - t0  # session creation: graph optimizations
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(x):
        raise RuntimeError(f"the exported model takes {len(names)} input(s) ({', '.join(names)}), "
                           f"the benchmark gives {len(x)}")
    feed = {n: t.numpy() for n, t in zip(names, x)}
    got = torch.from_numpy(sess.run(None, feed)[0])
    return (lambda: sess.run(None, feed)), got


def ort_optimized_graph(args, result):
    """Saves ORT's optimized graph and counts its nodes (after timing: a session of its own, so
    neither the compile time nor the peak RSS of the measured one includes it)."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="pto-bench-ort-") as d:
        path = os.path.join(d, "optimized.onnx")
        ort_session(args.onnx, args.threads, path)
        graph = onnx.load(path, load_external_data=False).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    result["ort_nodes"] = len(graph.node)
    result["ort_op_types"] = dict(ops.most_common())


def setup_pypto(args, model, x, result):
    import torch

    import pypto
    import torch_models

    pypto.set_num_threads(args.threads)
    t0 = time.perf_counter()
    fast = pypto.optimize(model, example_inputs=x, level=args.level)
    result["compile_s"] = time.perf_counter() - t0
    try:
        result["stats"] = fast.stats()
    except Exception as e:  # noqa: BLE001 - the timing is still worth having
        result["stats_error"] = f"{type(e).__name__}: {e}"
    with torch.inference_mode():
        got = torch_models.first_tensor(fast(*x))
    return (lambda: fast(*x)), got


SETUP = {"eager": setup_eager, "inductor": setup_inductor, "ort": setup_ort,
         "pypto": setup_pypto}


def child_model(args) -> dict:
    import torch

    child_setup(args.threads)
    import torch_models

    what = f"{args.engine}{'' if args.level is None else f' L{args.level}'}"
    result = {"model": args.model, "batch": args.batch, "threads": args.threads,
              "engine": args.engine, "level": args.level}
    policy = os.environ.get("OMP_WAIT_POLICY")
    print(f"{what} {args.model} batch {args.batch} threads {args.threads}"
          f"{f' OMP_WAIT_POLICY={policy}' if policy else ''}", file=sys.stderr)
    model = build_model(args.model)
    x = model_inputs(args.model, args.batch)
    protocol = QUICK if args.quick else FULL
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)  # every child counts: % of peak without eager
    with torch.inference_mode(), counter:
        want = torch_models.first_tensor(model(*x))
    result["flops"] = counter.get_total_flops()
    try:
        run, got = SETUP[args.engine](args, model, x, result)
        if got is not None:
            got = got.detach()
            if got.shape != want.shape or got.dtype != want.dtype:
                result.update(status="wrong", error=f"output {got.dtype}{list(got.shape)}, "
                                                    f"eager {want.dtype}{list(want.shape)}")
                return result
            err = torch_models.relative_error(got, want)
            result["max_rel_err"] = err
            if not err <= TOLERANCE:  # a fast wrong answer is a failure, not a result
                result.update(status="wrong", error=f"max relative error {err:.2e}")
                return result
        with torch.inference_mode():
            result.update(measure(run, protocol))
        result["peak_rss_mib"] = peak_rss_mib()
        result["status"] = "ok"
        if args.engine == "ort":
            try:
                ort_optimized_graph(args, result)
            except Exception as e:  # noqa: BLE001 - the timing stands without it
                result["ort_nodes_error"] = f"{type(e).__name__}: {e}"[:1000]
    except Exception as e:  # noqa: BLE001 - recorded; the driver carries on
        traceback.print_exc()
        result.update(status="failed", error=f"{type(e).__name__}: {e}"[:2000])
    return result


# ---- the driver ----

def child_env(threads: int, wait_policy: str | None = None) -> dict:
    env = dict(os.environ)
    for var in ["PTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"]:
        env[var] = str(threads)
    for var in ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY"]:
        env.pop(var, None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def report_child(result: dict, marker: str = MARK) -> int:
    """A child's last words: its result as one line of JSON after `marker` (run_child reads it)."""
    sys.stdout.flush()
    print(marker + json.dumps(result), flush=True)
    return 0


def run_child(cmd: list[str], env: dict, timeout: float, marker: str | None = MARK) -> dict:
    """Runs one child in a process group of its own; its stderr goes through to ours. Returns
    its JSON (the line after `marker`, or the last line of stdout without one), or
    {"status": "failed", "error": why} when it crashed, timed out or printed no result."""
    tail = collections.deque(maxlen=20)
    out = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace", start_new_session=True) as p:
        def pump_err():
            for line in p.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                tail.append(line.rstrip())

        readers = [threading.Thread(target=pump_err, daemon=True),
                   threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)]
        for r in readers:
            r.start()
        timed_out = False
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)  # the child and what it started (compile workers)
            rc = p.wait()
        for r in readers:
            r.join(timeout=10)
    lines = "".join(out).splitlines()
    result = None
    for line in reversed(lines):
        if marker is None or line.startswith(marker):
            try:
                result = json.loads(line[len(marker or ""):])
            except json.JSONDecodeError:
                pass
            break
    if timed_out:
        why = f"timed out after {timeout:.0f} s"
    elif result is None:
        why = (f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}") + \
              ", no result"
    else:
        if rc != 0:  # crashed on the way out, after its result: the result stands
            result["exit_code"] = rc
        return result
    print(f"FAILED ({why}): {' '.join(cmd)}", file=sys.stderr)
    last = [t for t in tail if t.strip()][-3:]
    return {"status": "failed", "error": why + (": " + " | ".join(last) if last else "")}


def pto_bench(path: Path, threads: int, only: str, quick: bool, timeout: float,
              extra: tuple[str, ...] = ()) -> dict | None:
    """Runs pto_bench (--only `only`, e.g. "fma" or "fma,sgemm") on `threads` threads with the
    children's environment; its JSON, or None when it failed."""
    cmd = [str(path), "--threads", str(threads), "--only", only,
           *(["--quick"] if quick else []), *extra]
    pb = run_child(cmd, child_env(threads), timeout, marker=None)
    return pb if "machine" in pb else None


def self_cmd(args, *extra) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *(["--quick"] if args.quick else []),
            *extra]


def ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok"


def torch_child(args, threads: int, extra: list[str], inductor: bool = False) -> dict:
    """PyTorch (eager, Inductor or torch.mm) with the OpenMP wait policy that serves it best on 2+
    threads. Inductor runs with a fresh cache (its compile time is a cold one) and compiles on the
    child's own thread (TORCHINDUCTOR_COMPILE_THREADS=1: no worker pool beside the timing)."""
    best = None
    for policy in ([None] if threads == 1 else [None, "PASSIVE"]):
        env = child_env(threads, policy)
        cache = None
        if inductor:
            cache = tempfile.mkdtemp(prefix="pto-bench-inductor-")
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        try:
            r = run_child(self_cmd(args, "--threads", str(threads), *extra), env, args.timeout)
        finally:
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
        r["omp_wait_policy"] = policy or "default"
        if best is None or (not ok(best) and ok(r)):
            best = r
        elif not ok(r):
            continue
        elif "sgemm" in r:  # torch.mm: the better policy per shape
            for i, new in enumerate(r["sgemm"]):
                if new["median"] < best["sgemm"][i]["median"]:
                    new["omp_wait_policy"] = r["omp_wait_policy"]
                    best["sgemm"][i] = new
        elif r["median"] < best["median"]:
            best = r
    return best


def median_round(rounds: list[dict]) -> dict | None:
    """The round with the median of the rounds' medians (a failed or wrong round: the first such
    one stands for the lot)."""
    if not rounds:
        return None
    bad = [r for r in rounds if not ok(r)]
    if bad:
        return bad[0]
    return sorted(rounds, key=lambda r: r["median"])[(len(rounds) - 1) // 2]


def config_keys(engines: list[str], levels: list[int]) -> list[str]:
    """eager, inductor, ort, pypto0, pypto1, ...: one process each, in this order."""
    keys = []
    for e in ENGINES:
        if e in engines:
            keys += [f"pypto{lv}" for lv in levels] if e == "pypto" else [e]
    return keys


def key_title(key: str) -> str:
    return f"PyPTO L{key[5:]}" if key.startswith("pypto") else TITLES[key]


def ensure_export(args, model: str, batch: int, threads: int) -> dict:
    path = onnx_path(model, batch)
    if path.is_file():
        meta = path.parent / "meta.json"
        r = json.loads(meta.read_text()) if meta.is_file() else {"status": "ok"}
        r.update(path=str(path), cached=True)
        return r
    print(f"== export {model} batch {batch} to {path}", file=sys.stderr)
    return run_child(self_cmd(args, "--threads", str(threads), "--child", "export", "--model",
                              model, "--batch", str(batch)), child_env(threads), args.timeout)


def run_config(args, key: str, m: str, b: int, t: int, export: dict | None) -> dict:
    extra = ["--child", "model", "--model", m, "--batch", str(b)]
    if key == "eager":
        return torch_child(args, t, [*extra, "--engine", "eager"])
    if key == "inductor":
        return torch_child(args, t, [*extra, "--engine", "inductor"], inductor=True)
    if key == "ort":
        if not ok(export):
            return {"status": "failed", "error": "ONNX export failed: " +
                    str((export or {}).get("error", "?"))}
        return run_child(self_cmd(args, "--threads", str(t), *extra, "--engine", "ort",
                                  "--onnx", export["path"]), child_env(t), args.timeout)
    return run_child(self_cmd(args, "--threads", str(t), *extra, "--engine", "pypto",
                              "--level", key[5:]), child_env(t), args.timeout)


def parse_list(text: str, known: list, what: str, conv=str) -> list:
    try:
        items = [conv(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"bad --{what} '{text}'")
    for s in items:
        if known is not None and s not in known:
            sys.exit(f"unknown {what} '{s}' (known: {', '.join(map(str, known))})")
    if not items:
        sys.exit(f"--{what} is empty")
    return items


def main_driver(args) -> int:
    threads = [int(t) for t in args.threads.split(",")]
    seqs = parse_list(args.seq, None, "seq", int)
    models = parse_list(args.models, list(MODELS), "models") if args.models else (
        ["resnet18", "bert"] if args.quick else DEFAULT_MODELS)
    engines = parse_list(args.engines, ENGINES, "engines")
    levels = parse_list(args.levels, LEVELS, "levels", int) if "pypto" in engines else []
    batches = [1] if args.quick and not args.batches else [int(b) for b in
                                                           (args.batches or "1,8").split(",")]
    keys = config_keys(engines, levels)
    bench_bin = Path(args.pto_bench)
    if not args.no_ceilings and not bench_bin.is_file():
        sys.exit(f"{bench_bin} is missing: build it (scripts/bench.sh does), or --no-ceilings")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
               "argv": sys.argv[1:], "seqs": seqs, "engines": engines, "levels": levels, "keys": keys,
               "pto_bench": {}, "torch_mm": {}, "exports": {}, "models": []}

    def save():
        results["table"] = markdown(results)
        path.write_text(json.dumps(results, indent=1))

    for t in threads if not args.no_ceilings else []:
        print(f"== pto_bench, {t} thread(s)", file=sys.stderr)
        only = "fma,memory" if args.no_gemm else "fma,memory,sgemm"
        pb = pto_bench(bench_bin, t, only, args.quick, args.timeout)
        results["pto_bench"][t] = pb
        if pb and pb.get("sgemm") and "eager" in engines:
            shapes = ",".join(f"{s['m']}x{s['k']}x{s['n']}" for s in pb["sgemm"])
            results["torch_mm"][t] = torch_child(args, t, ["--child", "torch-mm",
                                                           "--shapes", shapes])
        save()
    for m, seq in ((m, s) for m in models for s in (seqs if MODELS[m][1] == "text" else [None])):
        if seq is not None:
            set_seq(seq)
        for b in batches:
            export = None
            if "ort" in engines:
                export = ensure_export(args, m, b, max(threads))
                results["exports"][f"{m}-b{b}" + (f"-s{seq}" if seq else "")] = export
            for t in threads:
                print(f"== {model_title(m, seq)} batch {b} threads {t}: {', '.join(keys)}",
                      file=sys.stderr)
                rounds = {k: [] for k in keys}
                for _ in range(args.rounds):  # engines interleaved: A B C ... A B C ...
                    for k in keys:
                        rounds[k].append(run_config(args, k, m, b, t, export))
                results["models"].append({"model": m, "seq": seq, "batch": b, "threads": t,
                                          "results": {k: median_round(rs)
                                                      for k, rs in rounds.items()},
                                          "rounds": rounds})
                save()
    save()
    print(results["table"])
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


# ---- the tables ----

def fma_entry(pb: dict | None, threads: int) -> dict | None:
    """pto_bench's FMA measurement of the ISA the kernels run with, on `threads` threads."""
    if not pb:
        return None
    isa = pb["machine"]["isa"]
    for f in pb.get("fma", []):
        if f["isa"] == isa and f["threads"] == threads:
            return f
    return None


def fma_peak(pb: dict | None, threads: int) -> float | None:
    """The FMA peak (GFLOP/s) in pto_bench's output, on `threads` threads."""
    f = fma_entry(pb, threads)
    return f["gflops"] if f else None


def best_fma(pbs: list[dict | None], threads: int) -> dict | None:
    """The best of several pto_bench FMA measurements on `threads` threads (on a busy machine
    the load only lowers it)."""
    entries = [f for f in (fma_entry(pb, threads) for pb in pbs) if f]
    return max(entries, key=lambda f: f["gflops"]) if entries else None


def fma_note(f: dict, threads: int) -> str:
    """'1 thread(s): 112.3 GFLOP/s (avx512, CPU util 0.99)'."""
    return (f"{threads} thread(s): {f['gflops']:.1f} GFLOP/s ({f['isa']}, CPU util "
            f"{f['cpu_util']:.2f})")


def peak(results: dict, threads: int) -> float | None:
    return fma_peak(results["pto_bench"].get(threads) or results["pto_bench"].get(str(threads)),
                    threads)


def ceilings_table(results: dict) -> list[str]:
    rows = ["| benchmark | threads | PyPTO | PyTorch | speed-up | % of FMA peak (PyPTO / PyTorch) "
            "| check |",
            "|---|---|---|---|---|---|---|"]
    for t, pb in results["pto_bench"].items():
        if not pb:
            rows.append(f"| pto_bench | {t} | failed | | | | |")
            continue
        for f in pb.get("fma", []):
            rows.append(f"| FMA peak, {f['isa']} | {t} | {f['gflops']:.1f} GFLOP/s | | | | |")
        for mem in pb.get("memory", []):
            mib = mem["array_bytes"] / 2**20
            rows.append(f"| memory {mem['kernel']} ({mib:.0f} MiB arrays) | {t} | "
                        f"{mem['gbps']:.1f} GB/s | | | | |")
    for t, pb in results["pto_bench"].items():
        if not pb:
            continue
        tmm = results["torch_mm"].get(t)
        torch_mm = tmm.get("sgemm", []) if ok(tmm) else []
        p = peak(results, t)
        for i, s in enumerate(pb.get("sgemm", [])):
            name = f"SGEMM {s['m']}x{s['k']}x{s['n']} ({s['label']})"
            if not s["ok"]:
                rows.append(f"| {name} | {t} | WRONG | | | | err {s['max_rel_err']:.1e} |")
                continue
            tm = torch_mm[i] if i < len(torch_mm) else None
            ours = f"{s['gflops']:.1f} GFLOP/s"
            theirs = f"{tm['gflops']:.1f} GFLOP/s" if tm else "-"
            ratio = f"{s['gflops'] / tm['gflops']:.2f}x" if tm else "-"
            frac = f"{100 * s['gflops'] / p:.0f}% / {100 * tm['gflops'] / p:.0f}%" if p and tm \
                else "-"
            rows.append(f"| {name} | {t} | {ours} | {theirs} | {ratio} | {frac} | "
                        f"err {s['max_rel_err']:.1e} |")
    return rows if len(rows) > 2 else []


def model_title(m: str, seq: int | None = None) -> str:
    """'ResNet-50', 'BERT-base (seq 128)' (`seq`: the entry's, else the current one)."""
    return MODELS[m][0] + (f" (seq {seq or SEQ})" if MODELS[m][1] == "text" else "")


def markdown(results: dict) -> str:
    keys = results["keys"]
    levels = results["levels"]
    ref = (2 if 2 in levels else max(levels)) if levels else None  # the level compared
    rk = f"pypto{ref}"
    peers = [k for k in ("eager", "inductor", "ort") if k in keys]
    if ref is not None and ref != 0 and 0 in levels:
        peers.append("pypto0")
    lk = [f"pypto{lv}" for lv in (0, ref) if lv in levels]
    lk = list(dict.fromkeys(lk))

    head = ["model", "batch", "threads", *(key_title(k) for k in keys)]
    if ref is not None:
        head += [f"L{ref} vs {key_title(k).replace('PyPTO ', '')}" for k in peers]
        head += ["kernels " + " / ".join(f"L{k[5:]}" for k in lk) +
                 (" (ORT nodes)" if "ort" in keys else "")]
        head += [f"peak MiB L{ref} planned / unplanned"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    details_head = ["model", "batch", "threads", "compile s", "max rel. error",
                    "% of FMA peak", "CPU util.", "peak RSS MiB"]
    details = ["| " + " | ".join(details_head) + " |", "|" + "---|" * len(details_head)]
    failures = []
    busy = []  # 1-thread runs that did not get their core
    short = {"eager": "eager", "inductor": "Ind", "ort": "ORT"}

    def name(k):
        return short.get(k, f"L{k[5:]}")

    for entry in results["models"]:
        res = entry["results"]
        m, b, t = entry["model"], entry["batch"], entry["threads"]
        unit = "img/s" if MODELS[m][1] == "image" else "seq/s"

        def cell(r):
            if r is None:
                return "-"
            if r.get("status") == "wrong":
                return "WRONG"
            if not ok(r):
                return "failed"
            return f"{r['median'] * 1e3:.2f} ms" if b == 1 else f"{b / r['median']:.1f} {unit}"

        title = model_title(m, entry.get("seq"))
        row = [title, str(b), str(t), *(cell(res.get(k)) for k in keys)]
        if ref is not None:
            mine = res.get(rk)
            for k in peers:
                other = res.get(k)
                row.append(f"{other['median'] / mine['median']:.2f}x"
                           if ok(mine) and ok(other) else "-")
            kern = []
            for k in lk:
                st = (res.get(k) or {}).get("stats") or {}
                kern.append(str(st["kernels"]) if "kernels" in st else "-")
            o = res.get("ort") or {}
            row.append(" / ".join(kern) + (f" ({o.get('ort_nodes', '-')})" if "ort" in keys
                                            else ""))
            st = (mine or {}).get("stats") or {}
            if "peak_bytes" in st and "unplanned_peak_bytes" in st:
                row.append(f"{st['peak_bytes'] / 2**20:.1f} / "
                           f"{st['unplanned_peak_bytes'] / 2**20:.1f}")
            else:
                row.append("-")
        rows.append("| " + " | ".join(row) + " |")

        p = peak(results, t)
        flops = next((r["flops"] for r in res.values() if r and r.get("flops")), None)
        comp, errs, frac, util, rss = [], [], [], [], []
        for k in keys:
            r = res.get(k) or {}
            if "compile_s" in r:
                comp.append(f"{name(k)} {r['compile_s']:.1f}")
            if "max_rel_err" in r:
                errs.append(f"{name(k)} {r['max_rel_err']:.0e}")
            if ok(r):
                if t == 1 and r["cpu_util"] < 0.9:
                    busy.append(f"{title} batch {b} {key_title(k)} ({r['cpu_util']:.2f})")
                if p and flops:
                    frac.append(f"{name(k)} {100 * flops / 1e9 / r['median'] / p:.0f}%")
                util.append(f"{name(k)} {r['cpu_util']:.2f}")
                rss.append(f"{name(k)} {r['peak_rss_mib']:.0f}")
            elif r:
                failures.append(f"- {title}, batch {b}, {t} thread(s), {key_title(k)}: "
                                f"{r.get('status', 'failed')}: "
                                f"{str(r.get('error', '?')).splitlines()[0][:300]}")
        details.append("| " + " | ".join([title, str(b), str(t), ", ".join(comp) or "-",
                                           ", ".join(errs) or "-", ", ".join(frac) or "-",
                                           ", ".join(util) or "-", ", ".join(rss) or "-"]) + " |")
    parts = []
    ceil = ceilings_table(results)
    if ceil:
        parts.append("\n".join(ceil))
    if results["models"]:
        parts.append("\n".join(rows))
        parts.append("\n".join(details))
    if failures:
        parts.append("Failed or wrong:\n" + "\n".join(failures))
    if busy:
        parts.append("CPU utilisation under 0.9 on 1 thread (the machine was busy: the times, "
                     "and the ratios between processes, are not to be trusted): " +
                     ", ".join(busy) + ".")
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="few calls, small arrays, a subset of shapes, models and batches")
    ap.add_argument("--models", default="", help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--batches", default="", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--seq", default=str(SEQ),
                    help="sequence lengths of the text models, comma-separated (default 128; "
                         "BERT's position embeddings grow past 512)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"comma-separated, from {', '.join(ENGINES)} (default: all)")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)),
                    help="PyPTO optimization levels, comma-separated (default 0,1,2,3)")
    ap.add_argument("--no-gemm", action="store_true", help="skip the SGEMM comparison")
    ap.add_argument("--no-ceilings", action="store_true",
                    help="skip pto_bench (FMA peak, memory bandwidth, SGEMM) altogether")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each model configuration, engines interleaved; the table quotes "
                         "the median round (use 3 before claiming a 2-thread win)")
    ap.add_argument("--pto-bench", default=str(REPO / "build" / "bench" / "pto_bench"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child process")
    # A child process: one configuration, its JSON on stdout after MARK.
    ap.add_argument("--child", choices=["torch-mm", "model", "export"], help=argparse.SUPPRESS)
    ap.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--level", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        child = {"torch-mm": child_torch_mm, "model": child_model, "export": child_export}
        return report_child(child[args.child](args))
    return main_driver(args)


if __name__ == "__main__":
    sys.exit(main())
