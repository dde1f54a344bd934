"""Shared fixtures for the Python tests.

The CLI tests run the built `pto` program: $PTO_BIN, or build/pto in the clone (scripts/test.sh
builds it first). The package tests import pypto from python/ in the clone, whose extension the
same build writes there. A missing program or extension is a test failure, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import export_models

REPO = Path(__file__).resolve().parents[2]
# The in-tree package (python/pypto, with the extension the build wrote next to it) is what the
# tests test, ahead of any installed copy.
sys.path.insert(0, str(REPO / "python"))
# A hang must fail the run, not eat CI's time limit. The reference interpreter needs well under a
# minute for the largest test model; this leaves room for slow, shared machines.
# Compiles in the tests (and the `pto` processes they start) ignore the user's tuning cache, so
# results do not depend on what was tuned on this machine; tuning tests name their own cache file.
os.environ["PTO_TUNE_CACHE"] = "off"
RUN_TIMEOUT_S = float(os.environ.get("PTO_RUN_TIMEOUT", "900"))


def pytest_configure(config):
    # The exporter logs torch tracing at DEBUG; a failing test's report should not drown in it.
    if config.getoption("log_level") is None and not config.getini("log_level"):
        config.option.log_level = "WARNING"


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


@pytest.fixture(scope="session")
def pto_bin() -> Path:
    path = Path(os.environ.get("PTO_BIN") or REPO / "build" / "pto")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"the pto program is not at {path}: build it (bash scripts/test.sh does) "
                    "or point PTO_BIN at it", pytrace=False)
    return path


@pytest.fixture
def pto_run(pto_bin):
    """pto_run(model, inputs, output_names, workdir) -> {output name: array}, via `pto run`."""

    def run(model: Path, inputs: dict[str, np.ndarray], output_names, workdir: Path):
        in_dir, out_dir = workdir / "inputs", workdir / "outputs"
        in_dir.mkdir(parents=True)
        cmd = [str(pto_bin), "run", str(model)]
        for name, array in inputs.items():
            f = export_models.output_file(in_dir, name)
            np.save(f, array)
            cmd += ["--input", f"{name}={f}"]
        cmd += ["--output-dir", str(out_dir)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timed out after {RUN_TIMEOUT_S:.0f} s: {' '.join(cmd)}", pytrace=False)
        if p.returncode != 0:
            pytest.fail(f"exit code {p.returncode}: {' '.join(cmd)}\n"
                        f"--- stdout\n{_tail(p.stdout)}\n--- stderr\n{_tail(p.stderr)}",
                        pytrace=False)
        got = {}
        for name in output_names:
            f = export_models.output_file(out_dir, name)
            if not f.is_file():
                present = sorted(x.name for x in out_dir.iterdir()) if out_dir.is_dir() else []
                pytest.fail(f"`pto run` wrote no {f.name} for output '{name}' (found {present})",
                            pytrace=False)
            got[name] = np.load(f)
        return got

    return run
