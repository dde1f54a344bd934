"""Writes the ONNX node tests to the cache (once) and runs them through pto_conformance.

    python tests/conformance/run.py --runner build/tests/conformance/pto_conformance [args...]

Extra arguments go to the runner (--filter SUBSTR, --verbose). Without --floor, the floor
recorded in tests/conformance/floor.txt is used: CI fails when the pass count drops below it.
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from write_cases import default_cache, write_all  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runner", required=True)
    p.add_argument("--cache", type=Path, default=default_cache())
    args, rest = p.parse_known_args()
    cases = write_all(args.cache)
    if "--floor" not in rest:
        floor = (Path(__file__).parent / "floor.txt").read_text().split()[0]
        rest += ["--floor", floor]
    if "--tolerances" not in rest:
        rest += ["--tolerances", str(Path(__file__).parent / "tolerances.txt")]
    return subprocess.call([args.runner, str(cases), *rest])


if __name__ == "__main__":
    sys.exit(main())
