"""Silero VAD per call: PyPTO against ONNX Runtime (issue 14), streaming as a real-time user calls.

The models are not in the repository: they come with the silero-vad wheel (6.2.3 measured),
`pip download --no-deps silero-vad` and unzip it; pass its `silero_vad/data` folder.

Cases (each a chunk of random audio with the state fed back from the previous call):

  16k       silero_vad.onnx, input [1, 512], sr 16000 (the model's If takes the 16 kHz branch)
  8k        silero_vad.onnx, input [1, 256], sr 8000
  16k_op15  silero_vad_16k_op15.onnx (no If: the 16 kHz network at top level), input [1, 512]

For each case and thread count (PyPTO's pool via PTO_NUM_THREADS in a child process per thread
count, ORT's intra_op_num_threads), rounds alternate which engine goes first; in a round each
engine makes --calls calls, each timed on its own; the result is the median over all rounds'
calls (and the minimum), in microseconds, Python call to Python call (numpy in and out).

    PY=~/.cache/pypto/venv/bin/python
    PYTHONPATH=$PWD/python $PY bench/silero_vad.py /path/to/silero_vad/data
    PYTHONPATH=$PWD/python $PY bench/silero_vad.py DATA --threads 1 --rounds 3 --cases 16k
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CASES = {
    "16k": ("silero_vad.onnx", 512, 16000),
    "8k": ("silero_vad.onnx", 256, 8000),
    "16k_op15": ("silero_vad_16k_op15.onnx", 512, 16000),
}


def measure(data: str, case: str, threads: int, rounds: int, calls: int) -> dict:
    import onnxruntime as ort

    import pypto

    file, samples, sr = CASES[case]
    path = os.path.join(data, file)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    exe = pypto.onnx.load(path)
    rng = np.random.default_rng(0)
    chunks = [(rng.standard_normal((1, samples)) * 0.3).astype(np.float32) for _ in range(64)]
    srv = np.array(sr, np.int64)

    def engine(run):
        state = np.zeros((2, 1, 128), np.float32)
        times = []
        outs = []

        def go(n):
            nonlocal state
            for i in range(n):
                t = time.perf_counter()
                out, state = run(chunks[i % len(chunks)], state)
                times.append(time.perf_counter() - t)
                outs.append(float(np.asarray(out).ravel()[0]))

        return go, times, outs

    def pto_run(x, s):
        r = exe(input=x, state=s, sr=srv)
        return r[0], r[1]

    def ort_run(x, s):
        r = sess.run(None, {"input": x, "state": s, "sr": srv})
        return r[0], r[1]

    # The outputs of the same chunk sequence agree (the state fed back through 64 calls).
    check_p, _, outs_p = engine(pto_run)
    check_o, _, outs_o = engine(ort_run)
    check_p(64)
    check_o(64)
    err = max(abs(a - b) for a, b in zip(outs_p, outs_o))
    engines = {"pypto": engine(pto_run), "ort": engine(ort_run)}
    for go, times, _ in engines.values():  # warm-up, not recorded
        go(50)
        times.clear()
    for r in range(rounds):
        order = ["pypto", "ort"] if r % 2 == 0 else ["ort", "pypto"]
        for name in order:
            engines[name][0](calls)
    res = {"case": case, "threads": threads, "max_abs_diff": err}
    for name, (_, times, _) in engines.items():
        res[name] = {"median_us": statistics.median(times) * 1e6, "min_us": min(times) * 1e6}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="the silero_vad/data folder of the silero-vad wheel")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=300, help="calls per engine and round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one thread count, PTO_NUM_THREADS set by the parent
        for case in args.cases:
            print(json.dumps(measure(args.data, case, args.threads[0], args.rounds, args.calls)))
        return
    print(f"load average: {os.getloadavg()}")
    print(f"{'case':10} {'thr':>3} {'pypto p50':>10} {'ort p50':>10} {'ratio':>6} "
          f"{'pypto min':>10} {'ort min':>10} {'max |diff|':>11}")
    for t in args.threads:
        env = dict(os.environ, PTO_NUM_THREADS=str(t))
        cmd = [sys.executable, __file__, args.data, "--child", "--threads", str(t), "--rounds",
               str(args.rounds), "--calls", str(args.calls), "--cases", *args.cases]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            r = json.loads(line)
            p, o = r["pypto"], r["ort"]
            print(f"{r['case']:10} {t:3} {p['median_us']:10.1f} {o['median_us']:10.1f} "
                  f"{p['median_us'] / o['median_us']:6.2f} {p['min_us']:10.1f} {o['min_us']:10.1f} "
                  f"{r['max_abs_diff']:11.2e}")
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
