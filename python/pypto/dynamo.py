"""torch.compile(model, backend="pypto").

Dynamo hands the backend an FX graph of torch-level ops; AOT autograd turns it into core ATen
ops (torch's decompositions) with parameters as inputs. The graph is then split: maximal pieces
whose ops PyPTO converts are compiled and run by PyPTO, anything else stays with PyTorch. Each
op left to PyTorch is logged once. Results are never silently different: a piece either runs
whole on PyPTO or is not taken from PyTorch at all.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from .frontend import aten_ops  # noqa: F401  (registers the converters)
from .frontend.fx_importer import FxImporter, SymV, V, supported, target_name
from .runtime import CompiledGraph

log = logging.getLogger("pypto")
_stats = {"graphs": 0, "pypto_pieces": 0, "pypto_runs": 0, "fallback_ops": set()}


def stats() -> dict:
    """What the backend did so far: graphs received, pieces compiled by PyPTO, runs of those
    pieces, and the ops left to PyTorch."""
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in _stats.items()}


def _log_fallback(op: str):
    if op not in _stats["fallback_ops"]:
        _stats["fallback_ops"].add(op)
        log.warning("pypto: %s is not supported yet; that part of the graph runs in PyTorch", op)


class PyptoPiece(torch.nn.Module):
    """One partition of the graph, compiled on first call for its input signature."""

    def __init__(self, gm: torch.fx.GraphModule, level: int | None):
        super().__init__()
        self.gm, self.level = gm, level
        self._compiled = {}

    def forward(self, *args):
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("int",)
                    for a in args)
        entry = self._compiled.get(key)
        if entry is None:
            entry = self._compiled[key] = self._compile()
        compiled, single = entry
        _stats["pypto_runs"] += 1
        inputs = [a if isinstance(a, torch.Tensor) else torch.tensor([a], dtype=torch.int64)
                  for a in args]
        outs = compiled.run(inputs)
        return outs[0] if single else tuple(outs)

    def _compile(self):
        imp = FxImporter("torch_compile")
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                imp.add_input(n)
                if not isinstance(imp.env[n], (V, SymV)):
                    raise NotImplementedError(f"[torch.compile] input '{n.name}' is not a tensor")
        result = imp.convert_body(self.gm.graph).args[0]
        single = not isinstance(result, (tuple, list))
        outs = [imp.resolve(r) for r in ([result] if single else result)]
        imp.set_outputs(outs)
        _stats["pypto_pieces"] += 1
        return CompiledGraph(imp.g, self.level), single


class _Support(torch.fx.passes.operator_support.OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        ok = supported(node) and "val" in node.meta
        if not ok:
            _log_fallback(target_name(node.target))
        return ok


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, level=None):
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    _stats["graphs"] += 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if calls and all(supported(n) for n in calls):
        return PyptoPiece(gm, level)
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse("pypto_piece_")
    for name, sub in list(fused.named_children()):
        if name.startswith("pypto_piece_"):
            setattr(fused, name, PyptoPiece(sub, level))
    return fused


def backend(gm: torch.fx.GraphModule, example_inputs, level: int | None = None, **kwargs):
    """The torch.compile backend (registered as "pypto")."""
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    def fw_compiler(fx_gm, inputs):
        return make_boxed_func(_compile_graph(fx_gm, inputs, level))

    def bw_compiler(fx_gm, inputs):  # training runs its backward in PyTorch for now
        return make_boxed_func(fx_gm)

    return aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                        decompositions=core_aten_decompositions())(gm, example_inputs)


def register():
    from torch._dynamo import list_backends, register_backend

    if "pypto" not in list_backends(exclude_tags=()):
        register_backend(name="pypto")(backend)


__all__ = ["backend", "register", "stats"]
