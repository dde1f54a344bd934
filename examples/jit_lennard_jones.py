"""@pypto.jit: a Python function over tensors, compiled once and run by PyPTO.

The Lennard-Jones pair potential from docs/python.md, over a million distances. The first call
captures and compiles the function; later calls with the same shape and dtype reuse it. The
result is checked against the same function run eagerly by PyTorch; numpy arrays work too.

Run from the root of a clone, after building the extension (see docs/python.md):

    PYTHONPATH=python python examples/jit_lennard_jones.py

Exits non-zero if PyPTO's result differs from PyTorch's by more than 1e-6 (relative).
"""

import sys
import time

import numpy as np
import torch

import pypto


@pypto.jit
def lj_potential(r):
    s6 = (3.4 / r) ** 6
    return 4 * 0.1 * (s6 * s6 - s6)


def main() -> int:
    torch.manual_seed(0)
    r = torch.rand(1 << 20) + 1.0  # distances in [1, 2)

    t0 = time.perf_counter()
    e = lj_potential(r)  # first call: capture + compile + run
    t1 = time.perf_counter()
    e = lj_potential(r)  # same shape and dtype: the compiled graph is reused
    t2 = time.perf_counter()
    want = lj_potential.__wrapped__(r)  # the undecorated function, run by PyTorch
    print(f"first call (capture + compile + run) {1e3 * (t1 - t0):.0f} ms, "
          f"second call {1e3 * (t2 - t1):.0f} ms")

    err = ((e - want).abs().max() / want.abs().max()).item()
    e_np = lj_potential(r.numpy())  # numpy in, numpy out; same shape and dtype: no recompile
    err_np = float(np.abs(e_np - want.numpy()).max() / np.abs(want.numpy()).max())
    print(f"energy range [{e.min().item():.4g}, {e.max().item():.4g}], "
          f"max relative error vs eager: torch {err:.1e}, numpy {err_np:.1e}; "
          f"compiled signatures: {lj_potential.cache_size}")
    ok = (err <= 1e-6 and err_np <= 1e-6 and isinstance(e_np, np.ndarray)
          and lj_potential.cache_size == 1)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
