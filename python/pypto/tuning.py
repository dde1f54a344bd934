"""The autotuner: ``pypto.tuning.auto_tune(module)`` times alternatives to the planner's tile
shapes and GEMM blocking for each kernel of a compiled model on this machine, stores the winners
in the tuning cache (docs/tuning.md) and recompiles the model with them. Later compilations of
the same model read the cache on their own (the ``tune_cache`` optimization option, on by
default; ``pto run/bench/compile --no-tune-cache`` or ``PTO_TUNE_CACHE=off`` turn it off).

    fast = pypto.optimize(model, example_inputs=(x,))
    report = pypto.tuning.auto_tune(fast, level="fast")
"""

from __future__ import annotations

from typing import Any, Sequence

from . import _C
from . import options as _options
from .runtime import CompiledGraph, to_boundary

_LEVELS = ("fast", "normal", "exhaustive")


def _graph_and_inputs(module: Any, example_inputs: Any) -> tuple[CompiledGraph, list]:
    """The CompiledGraph to tune and its graph inputs as arrays."""
    if isinstance(module, CompiledGraph):
        if example_inputs is None:
            raise ValueError("auto_tune: a CompiledGraph needs example_inputs (one array per "
                             "graph input)")
        inputs = list(example_inputs)
        if len(inputs) != len(module.input_names):
            raise TypeError(f"auto_tune: expected {len(module.input_names)} input(s) "
                            f"({', '.join(module.input_names)}), got {len(inputs)}")
        return module, inputs
    if hasattr(module, "_ensure_compiled") and hasattr(module, "_graph_inputs"):  # optimize()
        if example_inputs is not None:
            args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            kwargs = {}
        elif module._example_args is not None:
            args, kwargs = module._example_args
        else:
            raise ValueError("auto_tune: the module has no example inputs and has not been "
                             "called yet; pass example_inputs")
        module._ensure_compiled(args, kwargs)
        return module._compiled, list(module._graph_inputs(args, kwargs))
    raise TypeError(f"auto_tune expects a pypto.optimize() module or a CompiledGraph, got "
                    f"{type(module).__name__}")


def _from_tune_config(config, level, num_trials, early_stop):
    """(level, num_trials, early_stop) with auto_tune's tune_config dict applied."""
    if not isinstance(config, dict):
        raise TypeError(f"auto_tune: tune_config must be a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - {"level", "num_trials", "early_stop"})
    if unknown:
        raise ValueError(f"auto_tune: unknown tune_config key(s) {', '.join(map(repr, unknown))} "
                         "(known: level, num_trials, early_stop)")
    given = {"level": (level, "normal"), "num_trials": (num_trials, None),
             "early_stop": (early_stop, True)}
    for key, value in config.items():
        arg, default = given[key]
        if arg != default and arg != value:
            raise ValueError(f"auto_tune: {key} given twice ({key}={arg!r} and "
                             f"tune_config['{key}']={value!r})")
    return (config.get("level", level), config.get("num_trials", num_trials),
            config.get("early_stop", early_stop))


def auto_tune(module: Any, level: str = "normal", num_trials: int | None = None,
              early_stop: bool = True, example_inputs: Any = None,
              cache: str | None = None, for_load: bool = False, *,
              tune_config: dict | None = None) -> dict:
    """Tunes `module` (what ``pypto.optimize`` returned, or a ``CompiledGraph``) on
    `example_inputs` (the module's arguments, or one array per graph input of a CompiledGraph;
    default: the module's example or first-call inputs), stores the winners in the tuning cache
    (`cache`: a file; default: the ``tune_cache_path`` option, else $PTO_TUNE_CACHE, else
    ~/.cache/pypto/tune/<machine>.json) and recompiles the module with them, in place.

    level: "fast" (kernels taking 80% of the time, 8 candidates each), "normal" (kernels taking
    at least 1%, 32 candidates, and shape classes: on several threads, the small convs on the
    calling thread, tried together) or "exhaustive". num_trials: at most this many candidates timed
    in all. early_stop: a kernel stops after 6 candidates without improvement. for_load: on
    several threads, try knobs that take threads from a kernel (conv.threads) even when the pool
    probe finds other processes holding the cores; the winners then suit this load only.

    Returns a dict: ``kernels`` (per kernel: name, knobs, planner_seconds, tuned_seconds,
    trials, from_cache, from_class), ``classes`` (the shape classes tried: name, knobs, steps,
    ratio, won), ``pool_speedup`` and ``contended`` (the pool probe: the threads' speed-up over
    one; 0 on one thread), ``model_checks`` (the check's (planner, tuned) medians),
    ``model_planner_seconds`` and ``model_tuned_seconds`` (0 when nothing beat the planner), ``kept`` (False: the model was not faster with the winners, which were
    dropped), ``trials``, ``seconds`` and ``cache``.

    tune_config: the same three settings as one dict, as some guides write it
    (``{"level": "exhaustive", "num_trials": 1000, "early_stop": True}``); a setting given both
    ways with different values is a ValueError."""
    if tune_config is not None:
        level, num_trials, early_stop = _from_tune_config(tune_config, level, num_trials,
                                                          early_stop)
    if level not in _LEVELS:
        raise ValueError(f"auto_tune: level must be one of {', '.join(_LEVELS)}, got {level!r}")
    if num_trials is not None and (isinstance(num_trials, bool) or not isinstance(num_trials, int)
                                   or num_trials < 1):
        raise ValueError(f"auto_tune: num_trials must be a positive int, got {num_trials!r}")
    compiled, inputs = _graph_and_inputs(module, example_inputs)
    path = cache if cache is not None else _options.get_optimization_options()["tune_cache_path"]
    arrays = [to_boundary(x, f"input '{n}'") for x, n in zip(inputs, compiled.input_names)]
    report = _C.tune(compiled._exe, arrays, level, num_trials or 0, bool(early_stop), str(path),
                     True, bool(for_load))
    # Recompiled in place from the optimized graph, reading the cache just written.
    opts = compiled._exe.options
    opts.use_tune_cache = True
    opts.tune_cache_path = report["cache"]
    compiled._exe = _C.compile(compiled._exe.graph_with_weights(), opts)
    report["tuned_kernels"] = compiled._exe.stats(None)["tuned_kernels"]
    return report
