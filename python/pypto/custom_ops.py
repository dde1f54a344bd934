"""pypto.custom_op: a user op with a traced Python body.

    @pypto.custom_op("mylib::swish")
    def swish(x):
        return x * torch.sigmoid(x)

registers ``torch.ops.mylib.swish`` with torch (eager runs the body), so captured graphs
(torch.export, torch.compile) show it as ONE op; PyPTO's importer then traces the body into ATen
ops and compiles it with the rest of the graph. The schema is read from the signature:
parameters are Tensors unless annotated int/float/bool, the result is one Tensor unless the
return annotation is a tuple; pass ``schema="(Tensor x, float a) -> Tensor"`` to spell it out.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from typing import Any, Callable

import torch

_BODIES: dict[Any, Callable] = {}  # OpOverload -> body
_LIBS: list = []  # keep the torch.library registrations alive

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*$")
_SCALARS = {int: "int", float: "float", bool: "bool"}


def _schema(fn: Callable) -> str:
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn) if getattr(fn, "__annotations__", None) else {}
    params = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"custom_op: {fn.__name__} has *{p.name}; give each argument a name "
                            "or pass schema=")
        ty = _SCALARS.get(hints.get(p.name), "Tensor")
        default = ""
        if p.default is not p.empty:
            if ty == "Tensor":
                raise TypeError(f"custom_op: argument '{p.name}' of {fn.__name__} has a default "
                                "but no int/float/bool annotation")
            default = f"={p.default!r}"
        params.append(f"{ty} {p.name}{default}")
    ret = hints.get("return")
    n_out = len(typing.get_args(ret)) if typing.get_origin(ret) is tuple else 1
    out = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({', '.join(params)}) -> {out}"


class CustomOp:
    """A registered custom op: call it like the function; ``.op`` is the torch op."""

    def __init__(self, name: str, op, body: Callable):
        self.name, self.op, self.body = name, op, body
        functools.update_wrapper(self, body)

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)

    def __repr__(self):
        return f"pypto.custom_op('{self.name}')"


def custom_op(name: str, *, schema: str | None = None) -> Callable[[Callable], CustomOp]:
    """Decorator registering `name` ("namespace::op") with the decorated function as its body."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"custom_op: name must look like 'namespace::op', got {name!r}")
    ns, op_name = name.split("::")

    def register(fn: Callable) -> CustomOp:
        if not callable(fn):
            raise TypeError(f"custom_op('{name}') decorates a function, got {type(fn).__name__}")
        if hasattr(getattr(torch.ops, ns), op_name):
            raise ValueError(f"custom_op: '{name}' is already registered with torch")
        lib = torch.library.Library(ns, "FRAGMENT")
        lib.define(op_name + (schema or _schema(fn)))
        # CompositeExplicitAutograd: eager runs the body, but tracing keeps the op whole.
        lib.impl(op_name, fn, "CompositeExplicitAutograd")
        _LIBS.append(lib)
        torch.library.register_fake(name, fn, lib=lib)
        packet = getattr(getattr(torch.ops, ns), op_name)
        _BODIES[packet.default] = fn
        return CustomOp(name, packet, fn)

    return register


def lookup(target) -> Callable | None:
    """The body of a PyPTO custom op, or None when `target` is not one."""
    return _BODIES.get(target)


def inline(imp, node: torch.fx.Node, body: Callable, args, kwargs):
    """Traces `body` into core ATen ops on the node's input types and converts it in place."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from .frontend.fx_importer import V, SymV

    def example(a, meta):
        if isinstance(a, V):
            shape = [int(s) if not isinstance(s, torch.SymInt) else s.node.hint for s in a.shape]
            return torch.zeros(shape, dtype=a.dtype)
        if isinstance(a, SymV):
            return int(meta) if not isinstance(meta, torch.SymInt) else meta.node.hint
        return a

    metas = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    ex_args = [example(a, m) for a, m in zip(args, metas)]
    gm = make_fx(body, decomposition_table=core_aten_decompositions(),
                 tracing_mode="symbolic")(*ex_args, **kwargs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outer = imp.node
    try:
        for p, a in zip(placeholders, args):
            imp.env[p] = a
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = imp.resolve(n.args[0])
                break
            imp.convert(n)
    except NotImplementedError as e:
        raise NotImplementedError(f"[{node.target}] custom op body: {e}") from e
    finally:
        imp.node = outer
    return result
