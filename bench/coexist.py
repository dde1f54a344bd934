"""PyPTO next to PyTorch: how much slower a PyPTO call runs right after eager PyTorch work (issue 14).

Each configuration runs in a child process of its own, which times three loops, interleaved in
short blocks (a few calls of each, round after round, so that the load of a shared machine falls
on all three alike), every call timed on its own:

  pypto alone   the PyPTO call (a small CNN compiled with pypto.optimize), back to back
  torch alone   the eager torch op (a 512x512 matmul, or --torch-op conv), back to back
  mixed         {torch op, PyPTO call}: each timed on its own

and reports the slowdown of each engine in the mixed loop against the same engine alone (medians,
same process), and the CPU time the whole process spent during each PyPTO call (every thread's:
workers that spin or compete show there even when the machine's load blurs the wall times). The children vary, per thread count (PyPTO and torch both at T threads):

  OMP_WAIT_POLICY   unset (libgomp's workers spin ~300k iterations after a region) or PASSIVE
  PTO_THREADING     own (PyPTO's pool), omp (PyPTO's regions on torch's OpenMP team) or auto
                    (the team, but own threads for a while after a region whose end waited
                    long for a descheduled team thread)
  PTO_SPIN_US       how long PyPTO's idle workers spin before sleeping (own)

so the slowdown can be put down to one runtime's spinning workers or the other's. The peer,
ONNX Runtime (--engines ort; ORT_ENABLE_ALL, T intra-op threads, its own spinning pool), runs
the same loops on the same CNN exported to ONNX, in children of its own, once per distinct
OMP_WAIT_POLICY: what a call slows after the torch op there is not PyPTO's to remove (the op's
data evicting the model's from the caches shows on one thread, where no pools can fight).
--busy N runs N busy loops (processes of their own) beside every child: a machine other work
also holds, where a team thread the OS has descheduled shows as stalls the median hides (the
mean and p99 of the call after the torch op are reported too).

    PY=~/.cache/pypto/venv/bin/python
    PYTHONPATH=$PWD/python nice -n 19 $PY bench/coexist.py               # a few minutes
    PYTHONPATH=$PWD/python $PY bench/coexist.py --threads 2 --configs default,passive --rounds 5
    PYTHONPATH=$PWD/python $PY bench/coexist.py --configs own,omp --engines pypto,ort --repeat 3
    PYTHONPATH=$PWD/python $PY bench/coexist.py --configs own,auto --threads 2 --busy 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "@@coexist@@ "
# name -> environment of the child (None: removed)
CONFIGS = {
    "default": {"OMP_WAIT_POLICY": None, "PTO_THREADING": None},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "PTO_THREADING": None},
    "own": {"OMP_WAIT_POLICY": None, "PTO_THREADING": "own"},
    "own_passive": {"OMP_WAIT_POLICY": "PASSIVE", "PTO_THREADING": "own"},
    "own_nospin": {"OMP_WAIT_POLICY": None, "PTO_THREADING": "own", "PTO_SPIN_US": "0"},
    # the spin before PTO_SPIN_US: 20000 pauses, ~540 us on this Zen 4
    "own_oldspin": {"OMP_WAIT_POLICY": None, "PTO_THREADING": "own", "PTO_SPIN_US": "540"},
    "omp": {"OMP_WAIT_POLICY": None, "PTO_THREADING": "omp"},
    "omp_passive": {"OMP_WAIT_POLICY": "PASSIVE", "PTO_THREADING": "omp"},
    "auto": {"OMP_WAIT_POLICY": None, "PTO_THREADING": "auto"},
    "auto_passive": {"OMP_WAIT_POLICY": "PASSIVE", "PTO_THREADING": "auto"},
}


def compile_engine(engine: str, net, x, threads: int):
    """The small CNN as a callable of x on `engine`: pypto.optimize, or ONNX Runtime (the peer:
    ORT_ENABLE_ALL, `threads` intra-op threads, its default spinning) on the exported file."""
    if engine == "pypto":
        import pypto

        pypto.set_num_threads(threads)
        return pypto.optimize(net, (x,))
    import tempfile

    import torch

    from run import ort_session  # bench/run.py: the peer's settings (BENCHMARKING.md)

    path = os.path.join(tempfile.mkdtemp(prefix="coexist-"), "net.onnx")
    torch.onnx.export(net, (x,), path, input_names=["x"], dynamo=False)
    sess = ort_session(path, threads)
    return lambda t: torch.from_numpy(sess.run(None, {"x": t.numpy()})[0])


def child(args) -> dict:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    x = torch.randn(1, 16, 32, 32)
    with torch.inference_mode():
        want = net(x)
    fast = compile_engine(args.engine, net, x, args.threads)
    got = fast(x)
    err = (got - want).abs().max().item()
    if err > 1e-3 * max(1.0, want.abs().max().item()):
        raise SystemExit(f"{args.engine} differs from eager by {err:.3g}")

    if args.torch_op == "matmul":
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        op = lambda: torch.mm(a, b)  # noqa: E731
    else:
        conv = torch.nn.Conv2d(64, 64, 3, padding=1).eval()
        xc = torch.randn(1, 64, 56, 56)
        op = lambda: conv(xc)  # noqa: E731

    def torch_op():
        with torch.inference_mode():
            op()

    clock, cpu = time.perf_counter, time.process_time  # cpu: every thread of the process
    pto_alone, torch_alone, pto_mixed, torch_mixed = [], [], [], []
    cpu_alone, cpu_mixed = [], []  # CPU seconds of the process during each PyPTO call
    cpu0 = cpu()
    wall0 = clock()
    for r in range(args.rounds + 5):  # rounds 0-4: warm-up
        keep = r >= 5
        for _ in range(args.calls):
            c, t = cpu(), clock()
            fast(x)
            if keep:
                pto_alone.append(clock() - t)
                cpu_alone.append(cpu() - c)
        for _ in range(args.calls):
            t = clock()
            torch_op()
            if keep:
                torch_alone.append(clock() - t)
        for _ in range(args.calls):
            t0 = clock()
            torch_op()
            c, t1 = cpu(), clock()
            fast(x)
            t2, c2 = clock(), cpu()
            if keep:
                torch_mixed.append(t1 - t0)
                pto_mixed.append(t2 - t1)
                cpu_mixed.append(c2 - c)
    util = (cpu() - cpu0) / (clock() - wall0)
    med = lambda v: statistics.median(v) * 1e6  # noqa: E731
    return {"alone_us": med(pto_alone), "mixed_us": med(pto_mixed),
            "mixed_mean_us": statistics.fmean(pto_mixed) * 1e6,
            "mixed_p99_us": statistics.quantiles(pto_mixed, n=100)[98] * 1e6,
            "torch_alone_us": med(torch_alone), "torch_mixed_us": med(torch_mixed),
            "alone_cpu_us": med(cpu_alone), "mixed_cpu_us": med(cpu_mixed),
            "calls": len(pto_alone), "cpu_util": util,
            "threading": threading_mode(args.engine)}


def threading_mode(engine: str) -> str:
    if engine != "pypto":
        return engine
    import pypto

    return pypto._C.threading() if hasattr(pypto._C, "threading") else "own"


def run_config(name: str, threads: int, engine: str, args) -> dict:
    env = dict(os.environ)
    for var in ("OMP_WAIT_POLICY", "PTO_THREADING", "PTO_SPIN_US", "GOMP_SPINCOUNT"):
        env.pop(var, None)
    for k, v in CONFIGS[name].items():
        if v is not None:
            env[k] = v
    for var in ("PTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--engine", engine, "--threads", str(threads),
           "--rounds", str(args.rounds), "--calls", str(args.calls), "--torch-op", args.torch_op]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(MARK)), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"{name} threads={threads} failed:\n{out.stderr[-3000:]}")
    return {"config": name, "threads": threads, "engine": engine, "env": CONFIGS[name],
            **json.loads(line[len(MARK):])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--configs", default="auto,own,omp,own_nospin,auto_passive,own_passive")
    ap.add_argument("--engines", default="pypto,ort",
                    help="pypto, and ort: ONNX Runtime in the same loops, the peer (run under "
                         "the configurations' distinct OMP_WAIT_POLICY values only)")
    ap.add_argument("--engine", default="pypto", help=argparse.SUPPRESS)
    ap.add_argument("--torch-op", choices=["matmul", "conv"], default="matmul")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--calls", type=int, default=5, help="calls per loop per round")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every configuration")
    ap.add_argument("--busy", type=int, default=0,
                    help="busy loops (processes) running beside every child")
    ap.add_argument("--json", help="also write the results here (default bench/results/)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.threads = int(args.threads)
        print(MARK + json.dumps(child(args)), flush=True)
        return
    engines = args.engines.split(",")
    if not set(engines) <= {"pypto", "ort"}:
        raise SystemExit(f"--engines: pypto and/or ort, not {args.engines}")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(CONFIGS)}")
    if args.busy < 0:
        raise SystemExit("--busy: a number of busy loops, >= 0")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        results = measure(args, engines)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    path = args.json or os.path.join(
        ROOT, "bench", "results", f"coexist-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"torch_op": args.torch_op, "rounds": args.rounds, "calls": args.calls,
                   "busy": args.busy, "results": results}, f, indent=1)
    print(f"written to {path}")


def measure(args, engines: list[str]) -> list[dict]:
    results = []
    for _ in range(args.repeat):
        for threads in (int(t) for t in args.threads.split(",")):
            ort_policies = set()  # ORT ignores PTO_*: once per OMP_WAIT_POLICY
            for name in args.configs.split(","):
                for engine in engines:
                    if engine == "ort":
                        policy = CONFIGS[name]["OMP_WAIT_POLICY"]
                        if policy in ort_policies:
                            continue
                        ort_policies.add(policy)
                    results.append(run_config(name, threads, engine, args))
                    r = results[-1]
                    label = name if engine == "pypto" else f"ort/{policy or 'default'}"
                    print(f"{label:14} T={threads} ({r['threading']:5}) "
                          f"{engine:5} {r['alone_us']:8.1f} -> {r['mixed_us']:8.1f} us "
                          f"({r['mixed_us'] / r['alone_us'] - 1:+6.1%}; mean "
                          f"{r['mixed_mean_us']:8.1f}, p99 {r['mixed_p99_us']:8.1f})   "
                          f"torch {args.torch_op} {r['torch_alone_us']:8.1f} -> "
                          f"{r['torch_mixed_us']:8.1f} us "
                          f"({r['torch_mixed_us'] / r['torch_alone_us'] - 1:+6.1%})   "
                          f"cpu {r['alone_cpu_us']:7.1f} -> {r['mixed_cpu_us']:7.1f}"
                          f" us   util {r['cpu_util']:.2f}", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
