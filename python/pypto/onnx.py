"""ONNX models in and out.

    exe = pypto.onnx.load("model.onnx")      # compiled; exe(x) or exe(input_ids=..., ...)
    pypto.onnx.export(fast, (x,), "out.onnx")  # a module or an optimized module to ONNX
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from . import _C
from . import options as _options
from .runtime import CompiledGraph, PrecisionReport, output_errors


class OnnxModel:
    """A compiled ONNX model. Call with arrays positionally (graph-input order) or by input name;
    returns one array, or a tuple for several outputs, of the kind given (torch or numpy)."""

    def __init__(self, graph: _C.Graph, level: int | None = None, path: str | None = None, *,
                 precision: str | None = None, _consume: bool = False,
                 _bytes: bytes | None = None):
        self.path = path
        self._bytes = _bytes  # a model loaded from bytes: what precision_report compiles again
        self._level = level
        self._precision = precision
        mixed = None if precision is None else _PRECISIONS[precision]
        self._compiled = CompiledGraph(graph, level, mixed_precision=mixed, _consume=_consume)
        self._f32: OnnxModel | None = None  # precision_report's baseline

    @property
    def input_names(self) -> list[str]:
        return list(self._compiled.input_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._compiled.output_names)

    @property
    def graph(self) -> _C.Graph:
        return self._compiled.graph

    def stats(self, *shapes) -> dict:
        """Kernel count and planned memory (see CompiledGraph.stats); with symbolic input
        dimensions, pass one shape per input (or arrays) or it reports the last run's plan."""
        return self._compiled.stats(list(shapes) if shapes else None)

    def __call__(self, *args: Any, **kwargs: Any):
        names = self._compiled.input_names
        if not kwargs and len(args) == len(names):  # every input, positionally
            inputs = args
        else:
            inputs = self._by_name(names, args, kwargs)
        like = "torch"
        for x in inputs:  # a loop, not any(): no generator per call
            if isinstance(x, np.ndarray) or (type(x) is list and x and
                                             isinstance(x[0], np.ndarray)):  # a sequence
                like = "numpy"
                break
        outs = self._compiled.run(inputs, like=like)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def _by_name(names: list[str], args: tuple, kwargs: dict) -> list:
        """The inputs in graph order from positional and keyword arguments."""
        if len(args) > len(names):
            raise TypeError(f"the model takes {len(names)} input(s) ({', '.join(names)}), "
                            f"got {len(args)} positional")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"the model has no input '{k}' (inputs: {', '.join(names)})")
            if k in given:
                raise TypeError(f"input '{k}' given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing input(s): {', '.join(missing)}")
        return [given[n] for n in names]

    def precision_report(self, *args: Any, **kwargs: Any) -> PrecisionReport:
        """The error of this reduced-precision compile against a float32 compile of the same
        file, on these inputs (as for calling the model): per output, the max and mean relative
        error. For a model loaded with precision="bf16" or "f16" (or under the
        auto_mixed_precision option)."""
        precision = self._precision
        if precision is None:
            opts = _options.get_optimization_options()
            precision = opts["mixed_precision_dtype"] if opts["auto_mixed_precision"] else "f32"
        if precision == "f32":
            raise ValueError("precision_report: this model was compiled in float32 (load it with "
                             "precision='bf16' or 'f16' to see what they cost)")
        if self.path is None and self._bytes is None:
            raise ValueError("precision_report: the model has no file to compile in float32")
        if not args and not kwargs:
            raise TypeError("precision_report: pass the inputs to compare on")
        if self._f32 is None:
            self._f32 = load(self.path if self.path is not None else self._bytes, self._level,
                             precision="f32")
        got = self(*args, **kwargs)
        want = self._f32(*args, **kwargs)
        if len(self.output_names) == 1:
            got, want = (got,), (want,)
        how = _C.device_info()["precision"][precision]["how"]
        return PrecisionReport(precision, output_errors(self.output_names, got, want), how)

    def __repr__(self):
        return f"pypto.onnx.OnnxModel({self.path or '<bytes>'}: {self._compiled!r})"


# precision= of load: what the matrix products compute in (the auto_mixed_precision option).
_PRECISIONS = {"f32": False, "bf16": "bf16", "f16": "f16"}


def load(model: str | os.PathLike | bytes | Any, level: int | None = None, *,
         precision: str | None = None) -> OnnxModel:
    """Loads and compiles an ONNX model: a file path, the serialized bytes, or an
    onnx.ModelProto (as onnxruntime.InferenceSession takes them; weights in external data files
    need the path). precision: "f32", or "bf16" / "f16" for matrix products on operands rounded
    to it with fp32 accumulation (as pto --precision); None: the auto_mixed_precision option's
    choice."""
    if precision is not None and precision not in _PRECISIONS:
        raise ValueError(f"pypto.onnx.load: precision must be one of {sorted(_PRECISIONS)}, got "
                         f"{precision!r}")
    if hasattr(model, "SerializeToString") and not isinstance(model, (str, bytes)):  # ModelProto
        model = model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        # Kept only where precision_report may compile it again in float32 (a reduced-precision
        # compile): a float32 model does not hold its weights twice.
        reduced = precision in ("bf16", "f16") or (
            precision is None and _options.get_optimization_options()["auto_mixed_precision"])
        # The graph is ours alone: compiling may free each weight as soon as its kernel packed it.
        return OnnxModel(_C.onnx_load_bytes(data, "<bytes>"), level, None, precision=precision,
                         _consume=True, _bytes=data if reduced else None)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError("pypto.onnx.load: expected a file path, bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pypto.onnx.load: no such file: {path}")
    return OnnxModel(_C.onnx_load(path), level, path, precision=precision, _consume=True)


def export(model: Any, args: Any, path: str | os.PathLike, *,
           output_names: list[str] | None = None, **optimize_kwargs) -> None:
    """Writes an ONNX file of `model`: an OptimizedModule, an OnnxModel, a CompiledGraph or a
    torch.nn.Module (captured first with pypto.optimize's importer). Outputs of a module are
    named "output" (one) or "output_<i>", or `output_names`; inputs keep their names."""
    path = os.fspath(path)
    graph = _graph_of(model, args, output_names, optimize_kwargs)
    _C.onnx_save(graph, path)


def _graph_of(model, args, output_names, optimize_kwargs) -> _C.Graph:
    if isinstance(model, (OnnxModel, CompiledGraph)):
        if output_names is not None:
            raise TypeError("pypto.onnx.export: output_names applies to a torch.nn.Module or an "
                            f"OptimizedModule; a {type(model).__name__} keeps its graph's names")
        return model.graph
    torch = sys.modules.get("torch")  # a torch module exists only once torch is loaded
    if torch is not None and isinstance(model, torch.nn.Module):
        from ._optimize import OptimizedModule, optimize

        if args is not None and not isinstance(args, tuple):
            args = (args,)
        if not isinstance(model, OptimizedModule):
            model = optimize(model, None, **optimize_kwargs)
        return model.export_graph(args, None, output_names)
    raise TypeError(f"pypto.onnx.export: cannot export a {type(model).__name__}; pass a "
                    "torch.nn.Module, an OptimizedModule or an OnnxModel")
