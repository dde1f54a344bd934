"""pypto.save / pypto.load: a compiled model in a file, loaded without compiling again; and
pypto.save_graph, a picture of the compiled graph.

The file format, its checks (format version, checksum, the ISA the kernels were compiled for)
and what is stored are C++'s (include/pto/serialize.h, docs/architecture.md). This module adds
what a torch module needs to be called as before: how its arguments map to graph inputs and how
its outputs are structured (pytree specs), kept as JSON in the file's metadata.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from . import _C
from .runtime import CompiledGraph

_FORMAT_KEY = "pypto"  # the metadata's marker and layout version
_METADATA_VERSION = 1
# Output types a saved torch module may return are rebuilt by name; the module defining one is
# imported on load when it belongs to these packages (any other must be imported by the caller).
_IMPORTABLE = ("transformers", "torchvision", "torch")


def _torch_module_types():
    """OptimizedModule when torch (and so pypto.optimize) is loaded, else None."""
    if "torch" not in sys.modules:
        return None
    from ._optimize import OptimizedModule

    return OptimizedModule


def _compiled_of(model) -> tuple[CompiledGraph, dict]:
    """The CompiledGraph behind `model` and the metadata that rebuilds its calling convention."""
    from .onnx import OnnxModel

    if isinstance(model, CompiledGraph):
        return model, {"kind": "graph"}
    if isinstance(model, OnnxModel):
        return model._compiled, {"kind": "onnx", "path": model.path}
    optimized = _torch_module_types()
    if optimized is not None and isinstance(model, optimized):
        if model._compiled is None:
            raise ValueError("pypto.save: this module has not been compiled yet (optimize it with "
                             "example_inputs, or call it once, first)")
        import torch.utils._pytree as pytree

        cap = model._captured
        for kind, payload in cap.inputs:
            if kind == "const":
                try:
                    json.dumps(payload)
                except TypeError:
                    raise TypeError(f"pypto.save: the module was specialized on an argument of "
                                    f"type {type(payload).__name__}, which cannot be saved")
        orig = getattr(model, "_orig_mod", None)
        meta = {
            "kind": "torch",
            "module": type(orig).__name__ if orig is not None else "Module",
            "in_spec": pytree.treespec_dumps(cap.in_spec),
            "out_spec": pytree.treespec_dumps(cap.out_spec),
            "inputs": [list(x) for x in cap.inputs],
            "dynamic": {k: list(v) for k, v in cap.dynamic.items()},
            "example": model._example,
        }
        if model._dtype is not None:  # optimize(dtype=torch.bfloat16): bf16 in and out
            meta["dtype"] = str(model._dtype).removeprefix("torch.")
        return model._compiled, meta
    raise TypeError("pypto.save expects a module from pypto.optimize, a model from "
                    f"pypto.onnx.load or a CompiledGraph, got {type(model).__name__}")


def save(model, path: str | os.PathLike) -> None:
    """Writes a compiled model to `path`: the optimized graph with its weights, its kernels, the
    compile options and the ISA it was compiled for. ``pypto.load(path)`` gives it back without
    compiling again, and it runs bit for bit as `model` does on this machine."""
    compiled, meta = _compiled_of(model)
    meta[_FORMAT_KEY] = _METADATA_VERSION
    _C.save_executable(compiled._exe, os.fspath(path), json.dumps(meta))


def _wrap(exe) -> CompiledGraph:
    """A CompiledGraph around an Executable that is compiled already."""
    return CompiledGraph._wrap(exe)


def _onnx_model(compiled: CompiledGraph, path: str | None):
    """A pypto.onnx.OnnxModel around a compiled graph (called by input name or position)."""
    from .onnx import OnnxModel

    m = OnnxModel.__new__(OnnxModel)
    m.path = path
    m._compiled = compiled
    return m


def _import_spec_types(spec_json: str) -> None:
    """Imports the packages whose types a pytree spec names (transformers' ModelOutput), so that
    torch can rebuild the spec; only the packages in _IMPORTABLE are imported for the caller."""
    def walk(node):
        if isinstance(node, dict):
            t = node.get("type")
            if isinstance(t, str) and "." in t:
                module = t.rsplit(".", 1)[0]  # transformers registers a type when its module runs
                if module.split(".", 1)[0] in _IMPORTABLE and module not in sys.modules:
                    try:
                        importlib.import_module(module)
                    except ImportError:
                        pass  # treespec_loads then says which type it lacks
            for child in node.get("children_spec", []):
                walk(child)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    walk(json.loads(spec_json))


def load(path: str | os.PathLike):
    """Loads a model saved by ``pypto.save`` (or ``pto compile -o``) without compiling again.

    Returns what was saved: a torch.nn.Module called as the optimized module was (torch tensors
    in, the same output structure out), a pypto.onnx.OnnxModel (also for `pto compile -o`
    files) or a CompiledGraph. ``.compiled.saved_info`` (``.saved_info`` of a CompiledGraph) is
    the file's header: format, PyPTO version, ISA, level. Raises ValueError for
    a file of another format version, a truncated or corrupt one, or one compiled for an ISA
    this CPU (or this process's PTO_ISA) lacks."""
    path = os.fspath(path)
    exe, metadata, info = _C.load_executable(path)
    compiled = _wrap(exe)
    compiled.saved_info = info
    if not metadata:  # pto compile -o: an ONNX model
        return _onnx_model(compiled, None)
    try:
        meta = json.loads(metadata)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the saved model's metadata is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get(_FORMAT_KEY) != _METADATA_VERSION:
        raise ValueError(f"{path}: metadata written by another version of pypto.save")
    if meta.get("kind") == "graph":
        return compiled
    if meta.get("kind") == "onnx":
        return _onnx_model(compiled, meta.get("path"))
    if meta.get("kind") != "torch":
        raise ValueError(f"{path}: unknown kind of saved model {meta.get('kind')!r}")
    import torch.utils._pytree as pytree

    from .frontend import torch_capture

    specs = []
    for key in ("in_spec", "out_spec"):
        _import_spec_types(meta[key])
        try:
            specs.append(pytree.treespec_loads(meta[key]))
        except Exception as e:  # torch raises several kinds for an unknown type
            raise ValueError(f"{path}: cannot rebuild the module's {key.replace('_', ' ')} "
                             f"({e}); import the package that defines its types first") from None
    captured = torch_capture.Captured(
        graph=None, in_spec=specs[0], out_spec=specs[1],
        inputs=[tuple(x) for x in meta["inputs"]],
        dynamic={k: tuple(v) for k, v in meta["dynamic"].items()})
    return _loaded_module(meta, captured, compiled)


def _loaded_module(meta: dict, captured, compiled: CompiledGraph):
    from ._optimize import OptimizedModule

    class LoadedModule(OptimizedModule):
        """A module loaded by pypto.load: called like the optimized module it was saved from.
        The original torch module is not in the file, only its compiled graph."""

        def __init__(self):
            super().__init__(_no_module(), None)
            self._captured, self._compiled = captured, compiled
            self._example = meta.get("example")
            self._name = meta.get("module", "Module")
            if meta.get("dtype") is not None:
                import torch

                self._dtype = getattr(torch, meta["dtype"])

        def _amp_variant(self, args, kwargs, precision=None):
            raise RuntimeError(f"{self._name}: a module loaded by pypto.load cannot be compiled "
                               "again for pypto.amp.autocast (the file holds only its compiled "
                               "graph); save one optimized with dtype=torch.bfloat16 or "
                               "torch.float16 instead")

        def precision_report(self, *args, **kwargs):
            raise RuntimeError(f"{self._name}: precision_report needs the original module (to "
                               "compile it in fp32); a module loaded by pypto.load has only its "
                               "compiled graph")

        def export_graph(self, args, kwargs=None, output_names=None):
            if output_names is not None:
                raise TypeError("output_names needs the original module; a loaded one holds "
                                "only its compiled graph")
            return self._compiled.graph

        def _mismatch(self, args, kwargs) -> str:
            args_spec, kwargs_spec = self._captured.in_spec.children()
            if len(args) != args_spec.num_children:
                return (f"{self._name}: expected {args_spec.num_children} positional "
                        f"argument(s) like the example inputs, got {len(args)}")
            return (f"{self._name}: the arguments do not have the structure of the example "
                    f"inputs the module was saved with")

        def extra_repr(self) -> str:
            return f"loaded {self._name}: {self._compiled!r}"

    return LoadedModule()


def _no_module():
    import torch

    class NoModule(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError("a module loaded by pypto.load has no original module")

    return NoModule()


def _source_graph(model):
    """The graph `model` was compiled from (before any pass), for save_graph(after=...)."""
    from .onnx import OnnxModel

    if isinstance(model, OnnxModel) and model.path and not _C.is_saved_model(model.path):
        return _C.onnx_load(model.path)
    captured = getattr(model, "_captured", None)
    if captured is not None and captured.graph is not None:
        return captured.graph
    raise ValueError("pypto.save_graph(after=...) needs the graph before the passes: an "
                     "optimized module or an ONNX model loaded from its file (a loaded "
                     ".pto model or a CompiledGraph holds only the optimized graph)")


def save_graph(model, path: str | os.PathLike, *, title: str | None = None,
               after: str | None = None) -> str:
    """Draws the compiled graph of `model` (an optimized or loaded module, an ONNX model or a
    CompiledGraph) into `path`, each fused kernel a box around its nodes, edges labelled with
    shapes. A path ending in .dot gets Graphviz's DOT text; .svg, .png or .pdf runs Graphviz's
    `dot`, which must be installed (RuntimeError otherwise). `after="FoldBatchNorm"` draws the
    graph as that pass of the model's level left it instead (no kernels yet; needs an optimized
    module or an ONNX model read from its file). Returns the path."""
    from .onnx import OnnxModel

    compiled = model if isinstance(model, CompiledGraph) else None
    if isinstance(model, OnnxModel):
        compiled = model._compiled
    if compiled is None:
        optimized = _torch_module_types()
        if optimized is None or not isinstance(model, optimized):
            raise TypeError("pypto.save_graph expects a module from pypto.optimize or "
                            "pypto.load, a model from pypto.onnx.load or a CompiledGraph, got "
                            f"{type(model).__name__}")
        compiled = model.compiled
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".dot", ".gv", ".svg", ".png", ".pdf"):
        raise ValueError(f"pypto.save_graph: {path} must end in .svg, .png, .pdf or .dot")
    exe = compiled._exe
    if after is not None:
        dot = _C.graph_dot_after_pass(_source_graph(model), exe.level, after,
                                      f"after {after}" if title is None else title)
    else:
        if title is None:
            title = f"level {exe.level}: {len(exe.steps)} kernels"
        dot = _C.graph_dot(exe, title)
    if ext in (".dot", ".gv"):
        with open(path, "w") as f:
            f.write(dot)
        return path
    tool = shutil.which("dot")
    if tool is None:
        raise RuntimeError(f"pypto.save_graph: drawing {path} needs Graphviz's `dot`, which is "
                           "not on PATH (install graphviz: bash scripts/setup.sh); a path ending "
                           "in .dot writes the DOT text without it")
    with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as f:
        f.write(dot)
    try:
        r = subprocess.run([tool, f"-T{ext[1:]}", f.name, "-o", path], capture_output=True,
                           text=True)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        raise RuntimeError(f"pypto.save_graph: {tool} failed: {r.stderr.strip()}")
    return path


__all__ = ["load", "save", "save_graph"]
