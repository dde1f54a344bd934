"""Process-wide options: ``pypto.set_optimization_options({...})``, the kernel thread count
``pypto.set_num_threads(n)`` and where the threads come from, ``pypto.set_threading(mode)``.

The optimization options are the defaults every later compilation starts from (``optimize``,
``torch.compile``, ``@jit``, ``onnx.load``); an explicit argument such as
``optimize(..., level=1)`` wins. The thread count applies to every run from then on.
"""

from __future__ import annotations

from typing import Any

from . import _C

_DEFAULTS: dict[str, Any] = {
    "graph_optimization_level": 2,  # 0..3, see docs/python.md
    "memory_optimization": True,  # reuse intermediate buffers as soon as they are dead
    # matrix products in bf16 or f16 (fp32 accumulation), everything else fp32: see
    # docs/precision.md; "mixed_precision_dtype" says which ("bf16" or "f16")
    "auto_mixed_precision": False,
    "mixed_precision_dtype": "bf16",
    # what float32 MatMul/Gemm compute in, as torch.set_float32_matmul_precision: "highest"
    # (fp32), "high" (bf16x3: three bf16 products of the operands' heads and tails, where the CPU
    # has AMX-BF16), "medium" (bf16 products); None follows torch's CPU setting (its
    # torch.backends.mkldnn.matmul.fp32_precision, which torch.set_float32_matmul_precision
    # sets) when torch is imported, else "highest" (docs/precision.md)
    "matmul_precision": None,
    # the same for float32 Conv (not depthwise): None follows
    # torch.backends.mkldnn.conv.fp32_precision ("ieee", "tf32", "bf16": "highest", "high",
    # "medium"; torch.set_float32_matmul_precision leaves convolutions alone)
    "conv_precision": None,
    # drop the graph's copy of weights the GEMM/conv kernels hold packed (memory held once)
    "release_packed_weights": True,
    # run independent kernels too small to fill the machine at the same time, one per thread
    "concurrent_kernels": True,
    # compile If/Loop/Scan subgraphs again for each concrete input shape they meet (a few per
    # node) when the model's dims are symbolic, so shape arithmetic folds and every op gets its
    # CPU kernel (docs/architecture.md, "Compiled control flow")
    "specialize_subgraphs": True,
    # take each kernel's knobs from the autotuner's cache (docs/tuning.md); False: the planner's
    "tune_cache": True,
    # the tuning cache file; "": $PTO_TUNE_CACHE, else ~/.cache/pypto/tune/<machine>.json
    "tune_cache_path": "",
}
_TYPES = {"graph_optimization_level": int, "memory_optimization": bool,
          "auto_mixed_precision": bool, "mixed_precision_dtype": str,
          "matmul_precision": (str, type(None)), "conv_precision": (str, type(None)),
          "release_packed_weights": bool,
          "concurrent_kernels": bool, "specialize_subgraphs": bool, "tune_cache": bool, "tune_cache_path": str}
_current = dict(_DEFAULTS)
_MIXED = ("bf16", "f16")  # what mixed precision can round the products' operands to
_MATMUL = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's values


def set_optimization_options(options: dict[str, Any]) -> None:
    """Updates the given keys; an unknown key or a value of the wrong type is an error."""
    if not isinstance(options, dict):
        raise TypeError(f"set_optimization_options expects a dict, got {type(options).__name__}")
    checked = {}
    for key, value in options.items():
        if key not in _DEFAULTS:
            raise ValueError(f"set_optimization_options: unknown option '{key}' "
                             f"(known: {', '.join(sorted(_DEFAULTS))})")
        want = _TYPES[key]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            names = " or ".join("None" if w is type(None) else w.__name__
                                for w in (want if isinstance(want, tuple) else (want,)))
            raise TypeError(f"set_optimization_options: '{key}' must be {names}, "
                            f"got {type(value).__name__}")
        if key == "graph_optimization_level" and not 0 <= value <= 3:
            raise ValueError(f"set_optimization_options: graph_optimization_level must be 0..3, "
                             f"got {value}")
        if key in ("matmul_precision", "conv_precision") and value is not None:
            check_matmul_precision(value, f"set_optimization_options: {key}")
        if key == "mixed_precision_dtype" and value not in _MIXED:
            raise ValueError(f"set_optimization_options: mixed_precision_dtype must be one of "
                             f"{', '.join(map(repr, _MIXED))}, got {value!r}")
        checked[key] = value
    _current.update(checked)


def get_optimization_options() -> dict[str, Any]:
    """A copy of the current options."""
    return dict(_current)


def reset_optimization_options() -> None:
    """Back to the defaults."""
    _current.clear()
    _current.update(_DEFAULTS)


def check_matmul_precision(value: Any, what: str) -> str:
    """`value` if it is one of torch.set_float32_matmul_precision's values, else an error."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if value not in _MATMUL:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, _MATMUL))} (as "
                         f"torch.set_float32_matmul_precision), got {value!r}")
    return value


_TORCH_FP32 = {"ieee": "highest", "tf32": "high", "bf16": "medium"}  # fp32_precision's values


def torch_fp32_precision(op: str) -> str | None:
    """What PyTorch's CPU `op` ("matmul" or "conv") computes float32 in, in
    torch.set_float32_matmul_precision's words, when torch is imported: its
    torch.backends.mkldnn.<op>.fp32_precision (PyTorch 2.9+), whose "none" defers to
    torch.backends.mkldnn.fp32_precision and then torch.backends.fp32_precision; for matmul
    without that API, torch.get_float32_matmul_precision(). None where nothing is set (or torch is
    not imported)."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    backends = getattr(torch, "backends", None)
    mkldnn = getattr(backends, "mkldnn", None)
    chain = (getattr(getattr(mkldnn, op, None), "fp32_precision", None),
             getattr(mkldnn, "fp32_precision", None), getattr(backends, "fp32_precision", None))
    for got in chain:
        if got in _TORCH_FP32:
            return _TORCH_FP32[got]
    if op == "matmul" and not any(isinstance(got, str) for got in chain):
        getter = getattr(torch, "get_float32_matmul_precision", None)  # before PyTorch 2.9
        got = getter() if getter else None
        return got if got in _MATMUL else None
    return None


def matmul_precision(value: str | None = None, op: str = "matmul") -> str:
    """What float32 MatMul/Gemm (op "matmul") or Conv (op "conv") compute in for one compilation:
    `value` if given, else the matmul_precision (conv_precision) option, else PyTorch's own CPU
    setting when torch is imported (torch_fp32_precision), else "highest"."""
    key = f"{op}_precision"
    if value is not None:
        return check_matmul_precision(value, key)
    if _current[key] is not None:
        return _current[key]
    return torch_fp32_precision(op) or "highest"


def tile_option(tile: Any, what: str = "tile") -> dict[str, list[int]]:
    """Checks a pinned tile and returns it as CompileOptions.tiles wants it: ``(rows, cols)`` or
    ``(cols,)`` (or a bare int) for every tile kernel, or a dict from a kernel's name (one of its
    nodes or its output; a kernel of a control-flow subgraph by its path, ``"loop_0/body/y"``) to
    such a shape. Whether the tile fits is checked at compile time."""
    def shape(v, name):
        if isinstance(v, int) and not isinstance(v, bool):
            v = (v,)
        if not isinstance(v, (tuple, list)) or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in v):
            raise TypeError(f"{what}: the tile for {name} must be (rows, cols) or (cols,) of ints, "
                            f"got {v!r}")
        if len(v) not in (1, 2) or any(d <= 0 for d in v):
            raise ValueError(f"{what}: the tile for {name} must be (rows, cols) or (cols,) of "
                             f"positive sizes, got {tuple(v)}")
        return [int(d) for d in v]

    if tile is None:
        return {}
    if isinstance(tile, dict):
        out = {}
        for k, v in tile.items():
            if not isinstance(k, str):
                raise TypeError(f"{what}: kernel names must be str, got {type(k).__name__}")
            out[k] = shape(v, f"'{k}'")
        return out
    return {"*": shape(tile, "every tile kernel")}


def compile_options(level: int | None = None, tile: Any = None,
                    mixed_precision: bool | str | None = None,
                    matmul: str | None = None, conv: str | None = None) -> _C.CompileOptions:
    """The C++ CompileOptions for one compilation: the current options, `level`, the pinned
    `tile` (see tile_option), `mixed_precision` if given: "bf16" or "f16" products, True (the
    mixed_precision_dtype option's) or False (fp32), and the float32 matmul and conv precisions
    `matmul` and `conv` (see matmul_precision)."""
    if level is None:
        level = _current["graph_optimization_level"]
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be an int 0..3, got {type(level).__name__}")
    if not 0 <= level <= 3:
        raise ValueError(f"level must be 0..3, got {level}")
    o = _C.CompileOptions()
    o.level = level
    o.memory_optimization = _current["memory_optimization"]
    if mixed_precision is None:
        mixed_precision = _current["auto_mixed_precision"]
    o.auto_mixed_precision = bool(mixed_precision)
    o.mixed_precision = (mixed_precision if isinstance(mixed_precision, str)
                         else _current["mixed_precision_dtype"])
    o.matmul_precision = matmul_precision(matmul)
    o.conv_precision = matmul_precision(conv, "conv")
    o.release_packed_weights = _current["release_packed_weights"]
    o.tiles = tile_option(tile)
    o.concurrent_kernels = _current["concurrent_kernels"]
    o.specialize_subgraphs = _current["specialize_subgraphs"]
    o.use_tune_cache = _current["tune_cache"]
    o.tune_cache_path = _current["tune_cache_path"]
    return o


def set_num_threads(n: int | None) -> None:
    """Runs kernels on `n` threads (1..4096), the calling thread included; None restores the
    default (PTO_NUM_THREADS, else the cores this process may use). Not while models run."""
    if n is None:
        _C.set_num_threads(0)
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads expects an int, got {type(n).__name__}")
    if not 1 <= n <= 4096:
        raise ValueError(f"set_num_threads: expected 1..4096 threads, got {n}")
    _C.set_num_threads(n)


def get_num_threads() -> int:
    """The number of threads kernels run on."""
    return _C.num_threads()


_THREADING = ("auto", "own", "omp")


def set_threading(mode: str) -> None:
    """Where the kernel threads come from: "own" (PyPTO's pool), "omp" (the OpenMP team of the
    libgomp PyTorch loaded) or "auto" (the default, or PTO_THREADING: that team while it keeps
    up; a parallel region that ends long after its last task, a team thread descheduled by other
    processes, sends the work to PyPTO's own threads for a while; own threads alone until PyTorch
    is loaded). Same results in every mode. Not while models run."""
    if not isinstance(mode, str):
        raise TypeError(f"set_threading expects a str, got {type(mode).__name__}")
    if mode not in _THREADING:
        raise ValueError(f"set_threading: mode must be one of {', '.join(_THREADING)}, "
                         f"got {mode!r}")
    _C.set_threading(mode)


def get_threading() -> str:
    """The mode in effect: "own", "omp" or "auto" ("own" while "auto" finds no libgomp)."""
    return _C.threading()
