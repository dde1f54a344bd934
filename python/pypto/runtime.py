"""CompiledGraph: a compiled Tensor Graph called with torch tensors or numpy arrays.

Inputs go to C++ through DLPack without a copy (strided views included) and outputs come back
the same way, as the caller's kind of array. Checks that need Python types (a non-tensor
argument, a CUDA tensor) happen here; shape and dtype checks happen in C++, at the boundary of
the Executable, with messages that name the input.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import _C
from . import options as _options

# Called before each run while a pypto.profiler.profile(with_stack=True) is open (it records the
# caller's stack); None otherwise.
_call_hook = None


def _torch():
    """torch if this program has imported it, else None: an object can only be a torch tensor
    once torch is loaded, and an ONNX-only program never pays for importing it."""
    return sys.modules.get("torch")


def to_boundary(x: Any, what: str):
    """An object C++ can take through DLPack, or TypeError/ValueError naming `what`."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError(f"{what} is on {x.device}; PyPTO runs on the CPU (use .cpu())")
        if x.is_conj() or x.is_neg():
            x = x.resolve_conj().resolve_neg()
        return x.detach() if x.requires_grad else x
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    raise TypeError(f"{what} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _to_c(x: Any, what: str):
    """to_boundary(x), as the cheapest object for _C to import: a numpy array as it is, a torch
    tensor as a DLPack capsule (torch.utils.dlpack.to_dlpack is one C call; the tensor's own
    __dlpack__ method is Python code). A sequence (a list of arrays) and an empty optional
    (None) go as a list of such objects and as None."""
    if type(x) is np.ndarray and x.dtype.isnative:
        return x
    if x is None:  # an empty optional
        return x
    if isinstance(x, (list, tuple)):  # a sequence
        return [_to_c(e, f"{what} element {i}") for i, e in enumerate(x)]
    x = to_boundary(x, what)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        try:
            return torch.utils.dlpack.to_dlpack(x)
        except RuntimeError:  # a layout DLPack cannot carry: _C's own error names the input
            return x
    return x


def _to_torch(a):
    """An output of _C as a torch tensor sharing its memory: a numpy array through the buffer it
    is (torch.from_numpy), a bf16 one through DLPack."""
    import torch

    if type(a) is np.ndarray:
        return torch.from_numpy(a)
    if a is None or type(a) is list:  # an empty optional, a sequence
        return a if a is None else [_to_torch(e) for e in a]
    return torch.from_dlpack(a)


def _to_numpy(a):
    if type(a) is np.ndarray or a is None:  # None: an empty optional
        return a
    return [_to_numpy(e) for e in a] if type(a) is list else np.from_dlpack(a)


class CompiledGraph:
    """A Tensor Graph compiled by ``_C.compile``; ``run`` takes one array per graph input."""

    def __init__(self, graph: _C.Graph, level: int | None = None, *, tile: Any = None,
                 mixed_precision: bool | str | None = None, matmul_precision: str | None = None,
                 conv_precision: str | None = None, _consume: bool = False,
                 _progress: str = "compiling"):
        # _consume: the caller hands the graph over (pypto.onnx.load): its weights can be freed
        # as the kernels pack them, and `graph` is left empty. tile: pinned tile shapes
        # (options.tile_option). mixed_precision: "bf16" or "f16"
        # products, True/False (None: the options' values). matmul_precision, conv_precision:
        # "highest", "high" or "medium" (None: options.matmul_precision).
        # _progress: the label of the progress bar a terminal shows.
        self._set_executable(_C.compile(
            graph, _options.compile_options(level, tile, mixed_precision, matmul_precision,
                                            conv_precision),
            _consume, _progress))

    @classmethod
    def _wrap(cls, exe: _C.Executable) -> CompiledGraph:
        """A CompiledGraph around an Executable that is compiled already."""
        cg = cls.__new__(cls)
        cg._set_executable(exe)
        return cg

    def _set_executable(self, exe: _C.Executable) -> None:
        self._exe = exe
        g = exe.graph
        self.input_names = [g.value_name(v) for v in g.inputs]
        self.input_types = [g.type(v) for v in g.inputs]
        self.output_names = [g.value_name(v) for v in g.outputs]
        # Outputs _C returns as numpy arrays (no bf16): run(like="numpy") hands them on as they are.
        self._numpy_out = all(g.type(v)[0] not in ("bf16", "undefined") for v in g.outputs)

    @property
    def graph(self) -> _C.Graph:
        """The optimized Tensor Graph, complete: weights the kernels hold packed (released from
        the compiled graph so they are not in memory twice) are rebuilt from their packing."""
        return self._exe.graph_with_weights()

    @property
    def level(self) -> int:
        return self._exe.level

    @property
    def options(self) -> _C.CompileOptions:
        """A copy of the CompileOptions it was compiled with."""
        return self._exe.options

    @property
    def node_backends(self) -> list[tuple[str, str]]:
        """(op, "cpu" or "reference") for every node, in execution order: which ran on a CPU
        backend kernel and which fell back to the reference interpreter's. A control-flow node
        (If, Loop, Scan) is followed by the nodes of its compiled subgraphs, named
        "node/attribute/op" ("loop_0/body/MatMul"), nested ones recursively."""
        return list(self._exe.node_backends)

    @property
    def memory_stats(self) -> dict:
        """The memory pool's counters: reserved/in-use/peak bytes, system allocations, pool hits.
        After the first run, runs with the same shapes add no system allocations."""
        return self._exe.memory_stats

    def stats(self, inputs: Sequence[Any] | None = None) -> dict:
        """What compiling made: ``kernels`` (plan steps), ``fused_kernels``, ``nodes`` (after the
        graph passes), ``nodes_in``, ``peak_bytes`` (the planned arena for intermediates),
        ``unplanned_peak_bytes`` (every intermediate in its own buffer), ``live_peak_bytes``,
        ``stages`` (groups of kernels that run at the same time) and ``staged_kernels``; the
        kernels of control-flow subgraphs (If, Loop, Scan bodies, recursively) as
        ``subgraph_kernels``, ``subgraph_fused_kernels`` and ``subgraph_peak_bytes`` (the most
        arena memory they plan at once), their packed weights and tuned kernels in
        ``packed_weight_bytes`` and ``tuned_kernels``.
        With symbolic shapes the memory numbers are for ``inputs`` (arrays or shapes), else for
        the last run."""
        shapes = None
        if inputs is not None:
            shapes = [list(x) if isinstance(x, (tuple, list)) else list(x.shape) for x in inputs]
        return self._exe.stats(shapes)

    @property
    def steps(self) -> list[dict]:
        """The plan, one dict per kernel: backend, fusion rule, op of its last node, names of the
        nodes it covers."""
        return self._exe.steps

    def describe_step(self, i: int) -> str:
        """Step i's kernel as its backend describes it: a tile program, the algorithm a kernel
        chose at compile time (ConvBlocked: "direct", "direct/bf16 pairs" or "winograd
        F(4x4,3x3)"; DwPwConvBlocked with bf16 1x1 convs: "bf16-pairs 1x1 convs"), or ''."""
        return self._exe.describe_step(i)

    def describe_tiles(self) -> str:
        """Every kernel as ``pto compile --dump-tiles`` prints it: backend, fusion rule and nodes,
        and for a tile kernel its program and tiling plan (tile shape, tiles, working set against
        the cache budget and level, tasks)."""
        lines = []
        for i, s in enumerate(self._exe.steps):
            lines.append(f"kernel {i} [{s['backend']}] {s['rule'] or s['op']}: "
                         + " ".join(s["nodes"]))
            d = self._exe.describe_step(i)
            if d:
                lines.append(d.rstrip("\n"))
        return "\n".join(lines) + "\n"

    @property
    def pass_report(self) -> list[dict]:
        """One dict per graph pass that ran: name, seconds, nodes before/after, rules fired."""
        return self._exe.pass_report

    def run(self, inputs: Sequence[Any], *, like: str = "torch") -> list:
        """Runs on arrays (torch or numpy); returns torch tensors (like="torch") or numpy arrays."""
        if len(inputs) != len(self.input_names):
            raise TypeError(f"expected {len(self.input_names)} input(s) "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        if _call_hook is not None:
            _call_hook()
        # One call: _C takes numpy arrays as they are and passes anything else through _to_c.
        outs = self._exe.run(inputs, _to_c)
        if like == "numpy":
            return outs if self._numpy_out else [_to_numpy(o) for o in outs]
        return [_to_torch(o) for o in outs]

    def run_values(self, inputs: Sequence[Any]) -> list[tuple[int, str, Any]]:
        """Runs once keeping every value a kernel wrote: (step index, value name, torch tensor)
        in execution order. Values inside a fused kernel are never materialized and are absent
        (pypto.debug.compare_layers uses this)."""
        arrays = [to_boundary(x, f"input '{n}'") for x, n in zip(inputs, self.input_names)]
        return [(s, n, _to_torch(a)) for s, n, a in self._exe.run_values(arrays)]

    def profile(self, inputs: Sequence[Any]) -> list[tuple[str, str, float]]:
        """Runs once; returns (node name, op, seconds) per node, in execution order."""
        arrays = [to_boundary(x, f"input '{n}'") for x, n in zip(inputs, self.input_names)]
        return self._exe.profile(arrays)

    def __repr__(self):
        ins = ", ".join(f"{n}: {dt}{list(s) if s is not None else '[*]'}"
                        for n, (dt, s) in zip(self.input_names, self.input_types))
        return f"CompiledGraph({ins}) -> {len(self.output_names)} output(s), level {self.level}"


@dataclass
class OutputError:
    output: str
    max_rel_error: float   # max |reduced - fp32| / max |fp32|
    mean_rel_error: float  # mean |reduced - fp32| / mean |fp32|


@dataclass
class PrecisionReport:
    """What reduced precision costs on one set of inputs (OptimizedModule.precision_report)."""
    precision: str
    outputs: list[OutputError]
    how: str = ""  # how this machine computes it: "VDPBF16PS (avx512_bf16)", fp32 FMA on rounded

    @property
    def max_rel_error(self) -> float:
        return max((o.max_rel_error for o in self.outputs), default=0.0)

    def __str__(self) -> str:
        w = max([len(o.output) for o in self.outputs] + [6])
        lines = [f"{self.precision} against fp32 ({self.how}), relative error per output:",
                 f"  {'output':<{w}}  {'max':>9}  {'mean':>9}"]
        lines += [f"  {o.output:<{w}}  {o.max_rel_error:9.2e}  {o.mean_rel_error:9.2e}"
                  for o in self.outputs]
        return "\n".join(lines)


def output_errors(names: Sequence[str], got: Sequence[Any], want: Sequence[Any]) -> list:
    """Per floating-point output, the relative error of `got` against `want` (arrays or
    tensors), as PrecisionReport lists it."""
    rows = []
    for name, g, w in zip(names, got, want):
        g, w = _as_float64(g), _as_float64(w)
        if g is None or w is None:
            continue
        d = np.abs(g - w)
        wa = np.abs(w)
        rows.append(OutputError(name, float(d.max(initial=0) / max(wa.max(initial=0), 1e-30)),
                                float(d.mean() / max(wa.mean(), 1e-30)) if d.size else 0.0))
    return rows


def _as_float64(x):
    """x as a float64 numpy array, or None when it is not floating point."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().double().numpy() if x.is_floating_point() else None
    x = np.asarray(x)
    return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else None
