"""pypto.profiler: where the time of optimized modules and ONNX models goes (docs/profiling.md).

    with pypto.profiler.profile(record_shapes=True, profile_memory=True) as prof:
        fast(x)
    print(prof.key_averages().table(sort_by="self_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")     # Perfetto / chrome://tracing
    prof.export_timeline("timeline.svg")       # a picture: a row per thread, a box per tile task

Every call of a compiled model (pypto.optimize, pypto.onnx.load, pypto.jit, torch.compile with the
pypto backend) made while the profile is open, on any thread, is recorded by the C++ runtime: the
call, each kernel step (the fusion rule, the nodes it covers, shapes, FLOPs, memory) and each tile
task of each kernel on the thread that ran it. The recording and the reports are C++
(src/runtime/profiler*.cpp, shared with `pto profile`); this module is the PyTorch-style surface.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from typing import Any

from . import _C
from . import runtime as _runtime

__all__ = ["AdvancedProfiler", "EventList", "FunctionEventAvg", "ProfilerActivity", "profile",
           "record_function"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames of these files are the machinery between a user's call and the run, not its call site.
_SKIPPED = (_PACKAGE_DIR + os.sep, os.sep + os.path.join("torch", "nn", "modules") + os.sep,
            os.sep + os.path.join("torch", "_dynamo") + os.sep, "<frozen ")


def _call_site(depth: int = 8) -> str:
    """The Python stack of the current call, innermost first, as 'file:line in function' lines,
    leaving out PyPTO's and torch's module-call frames."""
    lines = []
    frame = sys._getframe(1)
    while frame is not None and len(lines) < depth:
        path = frame.f_code.co_filename
        if not any(s in path for s in _SKIPPED):
            lines.append(f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(lines)


def _record_stack() -> None:
    _C.profiler_set_call_stack(_call_site())


class FunctionEventAvg:
    """One row of key_averages: a kernel (its calls over the profile), a model call or a
    record_function range. Times are in microseconds, as in torch.profiler."""

    def __init__(self, d: dict):
        self.kind: str = d["kind"]                   # "kernel", "call", "range"
        self.key: str = d["name"]                    # the fusion rule or op; "call <model>"
        self.source_ops: list[str] = [s for s in d["sources"].split(", ") if s]
        self.input_shapes: str = d["shapes"]         # group_by_input_shape only
        self.backend: str = d["backend"]
        self.count: int = d["calls"]
        self.self_cpu_time_total: float = d["self_ns"] / 1e3
        self.cpu_time_total: float = d["total_ns"] / 1e3
        self.flops: float = d["flops"]               # over all calls; 0 when not known
        self.self_cpu_memory_usage: int = d["alloc_bytes"]
        self.tasks: int = d["tasks"]                 # tile tasks over all calls

    @property
    def cpu_time(self) -> float:
        """Average time per call (µs)."""
        return self.cpu_time_total / self.count if self.count else 0.0

    self_time_total = property(lambda self: self.self_cpu_time_total)
    time_total = property(lambda self: self.cpu_time_total)

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key!r} kind={self.kind} count={self.count} "
                f"self={self.self_cpu_time_total:.3f}us total={self.cpu_time_total:.3f}us>")


class EventList(list):
    """The rows of key_averages (FunctionEventAvg), with table()."""

    def __init__(self, rows, profile: "_C.Profile", group_by_input_shape: bool):
        super().__init__(rows)
        self._profile = profile
        self._group = group_by_input_shape

    def table(self, sort_by: str = "self_time_total", row_limit: int = 100) -> str:
        """The rows as PyTorch's profiler prints them: Name, Self %, Self total, Total, Avg,
        Calls, (Input Shapes), (Alloc), GFLOP/s, % of the FMA peak of the pool's threads, Source
        ops. sort_by: self_time_total (self_cpu_time_total), cpu_time_total (time_total),
        cpu_time (the average), calls (count), flops, gflops, alloc (self_cpu_memory_usage) or
        name; row_limit <= 0 prints every row."""
        from .device import device_info

        if not isinstance(sort_by, str):
            raise TypeError(f"sort_by must be a str, got {type(sort_by).__name__}")
        if isinstance(row_limit, bool) or not isinstance(row_limit, int):
            raise TypeError(f"row_limit must be an int, got {type(row_limit).__name__}")
        peak = device_info()["fma"]["gflops_per_core"] * self._profile.pool_threads
        return self._profile.table(self._group, sort_by, row_limit, peak)

    def __str__(self):
        return self.table()


class ProfilerActivity(enum.Enum):
    """What a profile records, as torch.profiler.ProfilerActivity names it. PyPTO runs models on
    the CPU cores, so CPU is the one activity there is; CUDA and NPU (the names other profilers'
    users write) are refused by profile(activities=...) with the reason, not ignored."""

    CPU = "cpu"
    CUDA = "cuda"
    NPU = "npu"


def _activities(activities) -> None:
    """Checks profile(activities=...): CPU (PyPTO's or torch.profiler's) is what is recorded."""
    if activities is None:
        return
    if isinstance(activities, (str, ProfilerActivity)) or not hasattr(activities, "__iter__"):
        raise TypeError("profile: activities must be a list such as [ProfilerActivity.CPU], got "
                        f"{activities!r}")
    for a in activities:
        name = getattr(a, "name", a if isinstance(a, str) else None)
        if not isinstance(name, str):
            raise TypeError(f"profile: activities holds {a!r}; use pypto.profiler.ProfilerActivity"
                            ".CPU (torch.profiler.ProfilerActivity.CPU is accepted too)")
        if name.upper() != "CPU":
            raise ValueError(f"profile: activity {name.upper()} cannot be recorded: PyPTO runs "
                             "models on the CPU cores (no CUDA or NPU backend yet), so "
                             "ProfilerActivity.CPU is the only activity; drop the others")


class profile:
    """Records every compiled-model call made while it is open (a context manager).

    record_shapes: input and output shapes of each kernel (the trace's args, and
        key_averages(group_by_input_shape=True)).
    profile_memory: the bytes each kernel allocates in the memory plan, and a "memory" counter
        track (planned live bytes, arena top) in the trace.
    with_stack: the Python call site of each model call (file:line in function, innermost
        first): key_averages gives each call site its own "call" row, the trace's call slices
        carry the stack.
    activities: as torch.profiler's, a list of ProfilerActivity; PyPTO records CPU work only,
        so anything but [ProfilerActivity.CPU] (or torch.profiler's CPU) is a ValueError.
    """

    def __init__(self, *, activities=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False):
        _activities(activities)
        for name, v in (("record_shapes", record_shapes), ("profile_memory", profile_memory),
                        ("with_stack", with_stack)):
            if not isinstance(v, bool):
                raise TypeError(f"profile: {name} must be a bool, got {type(v).__name__}")
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self._profile: _C.Profile | None = None
        self._running = False

    def __enter__(self) -> "profile":
        if self._profile is not None or self._running:
            raise RuntimeError("profile: this profile object was already used; make a new one")
        _C.profiler_start(self.record_shapes, self.profile_memory)
        self._running = True
        if self.with_stack:
            _runtime._call_hook = _record_stack
        return self

    def __exit__(self, *exc) -> None:
        if self.with_stack:
            _runtime._call_hook = None
        self._running = False
        self._profile = _C.profiler_stop()

    @property
    def profile(self) -> "_C.Profile":
        """The raw recording (events, models, threads); after the with-block."""
        if self._profile is None:
            raise RuntimeError("profile: nothing recorded yet (use it as `with profile() as p:`; "
                               "results are ready after the block)")
        return self._profile

    def key_averages(self, group_by_input_shape: bool = False) -> EventList:
        """One row per kernel of each model (and per model call and record_function range),
        summed over its calls; with group_by_input_shape=True (needs record_shapes=True) one
        row per kernel and input shapes."""
        if group_by_input_shape and not self.record_shapes:
            raise ValueError("key_averages(group_by_input_shape=True) needs "
                             "profile(record_shapes=True)")
        p = self.profile
        rows = [FunctionEventAvg(d) for d in p.key_averages(group_by_input_shape)]
        return EventList(rows, p, group_by_input_shape)

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Writes a Trace Event Format JSON file for Perfetto (ui.perfetto.dev) or
        chrome://tracing: a track per thread (kernels and tile tasks), data dependencies as flow
        arrows, and with profile_memory a memory counter."""
        self.profile.write_chrome_trace(os.fspath(path))

    def export_timeline(self, path: str | os.PathLike, width: int = 1400) -> None:
        """Writes an SVG picture: a row per thread, a box per tile task colored by kernel, a
        legend of the kernels that took the most time, a time axis."""
        self.profile.write_timeline_svg(os.fspath(path), width)


# The name some guides use for a profile with shapes, memory and stacks: the same object.
AdvancedProfiler = profile


class record_function:
    """A named range in the profile, as a context manager or a decorator:

        with pypto.profiler.record_function("preprocess"): ...
        @pypto.profiler.record_function("step")
        def step(): ...

    Its row in key_averages has the range's self time (less the model calls inside it)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise TypeError("record_function: name must be a non-empty str")
        self.name = name

    def __enter__(self):
        _C.profiler_begin_range(self.name)
        return self

    def __exit__(self, *exc):
        _C.profiler_end_range()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any):
            with record_function(self.name):
                return fn(*args, **kwargs)

        return wrapped
