"""What PyPTO runs on."""

from __future__ import annotations

from typing import Any

from . import _C


def device_info() -> dict[str, Any]:
    """The machine as the tiling planner sees it: cores, ISA in use and extensions, cache sizes,
    memory. Raises if PTO_ISA names an ISA this machine lacks."""
    return _C.device_info()


def is_available() -> bool:
    """Whether PyPTO can run here: the extension loaded and the CPU has a usable ISA."""
    try:
        return bool(_C.device_info()["isa"])
    except Exception:  # PTO_ISA names an ISA this CPU lacks
        return False
