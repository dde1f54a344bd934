"""The programs in examples/ run and pass their own checks, so they never rot.

Each runs as a separate process, the way a new user runs it, with python/ of this clone first on
PYTHONPATH; a non-zero exit code (a failed check or an exception) fails the test.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ["optimize_resnet.py", "jit_lennard_jones.py", "onnx_round_trip.py"]
# Each example takes well under 20 s on a 2-core machine; the margin is for loaded CI machines.
TIMEOUT_S = float(os.environ.get("PTO_EXAMPLE_TIMEOUT", "300"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        p = subprocess.run([sys.executable, str(REPO / "examples" / name)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"examples/{name} timed out after {TIMEOUT_S:.0f} s", pytrace=False)
    if p.returncode != 0:
        pytest.fail(f"examples/{name} exited with {p.returncode}\n--- stdout\n{p.stdout[-3000:]}"
                    f"\n--- stderr\n{p.stderr[-3000:]}", pytrace=False)
    assert p.stdout.rstrip().endswith("OK"), p.stdout


def test_the_main_job_demo_runs():
    """scripts/demo.py (what `bash scripts/demo.sh` runs after setup and build), on a small image:
    its check against eager passes, and the profile it prints accounts for the kernels."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "resnet18",
                        "--image", "96", "--repeat", "3"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "(OK, bound" in p.stdout and "speed-up" in p.stdout, p.stdout
    assert "where the time goes (pypto.profiler over 3 calls" in p.stdout, p.stdout
    assert "ConvBlocked" in p.stdout, p.stdout
