"""ONNX Runtime as bench/generate.py's peer: a transformers decoder exported with its KV cache as
inputs and outputs, and the greedy loop generate() runs, on an InferenceSession (and the same
file and loop on pypto.onnx.load: PyPTO's ONNX path against ONNX Runtime).

The export wraps the model in a module whose forward takes input_ids [B, S], attention_mask
[B, P + S], position_ids [B, S] and the past keys and values of each layer ([B, kv heads, P, head
dim]), builds transformers' DynamicCache from them and returns the last position's logits and the
new keys and values: one graph for the prompt (P = 0: empty past tensors) and every step (S = 1),
exported once by torch.onnx.export (TorchScript exporter, opset 17; dynamic batch, sequence, past
and total lengths, traced at B = 2, S = 3, P = 5 so that no size is taken for a constant).

The loop binds each step's present keys and values (OrtValues) as the next step's past ones, so
the cache never goes through numpy; only the logits come out. As generate() with min_new_tokens =
max_new_tokens does, the end-of-text token is masked (-inf) before the argmax. The session is
bench/run.py's (ORT_ENABLE_ALL, intra_op_num_threads = T, inter_op_num_threads = 1, sequential).
On PyPTO each step's present keys and values (numpy arrays PyPTO wrote) are the next step's past.
"""

from __future__ import annotations

import os

import numpy as np
import torch


def version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _geometry(config) -> tuple[int, int, int]:
    """Layers, K/V heads and head size of a decoder's cache."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv, head_dim


class _DecoderWithPast(torch.nn.Module):
    def __init__(self, model, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1])
                                             for i in range(self.layers)])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1)
        new = out.cache if "cache" in out else out.past_key_values
        flat = [t for layer in new.layers for t in (layer.keys, layer.values)]
        return (out.logits[:, -1, :], *flat)


def export_decoder(model, path: str, dynamo: bool = False) -> tuple[list[str], list[str]]:
    """Writes `model` with its cache as inputs and outputs to `path`; its input and output names.
    dynamo: torch.export's exporter (dynamic_shapes) instead of the TorchScript one."""
    layers, kv, head_dim = _geometry(model.config)
    # eval() on the wrapper too: the exporter restores the wrapper's training flag afterwards,
    # which a fresh module has on, and that would put the model in training mode (dropout).
    wrapper = _DecoderWithPast(model, layers).eval()
    g = torch.Generator().manual_seed(1234)
    b, s, p = 2, 3, 5
    ids = torch.randint(0, model.config.vocab_size, (b, s), generator=g)
    mask = torch.ones(b, p + s, dtype=torch.long)
    pos = torch.arange(p, p + s).unsqueeze(0).expand(b, s).contiguous()
    past = [torch.randn(b, kv, p, head_dim, generator=g) for _ in range(2 * layers)]
    names = [f"{i // 2}_{'kv'[i % 2]}" for i in range(2 * layers)]
    inputs = ["input_ids", "attention_mask", "position_ids"] + [f"past_{n}" for n in names]
    outputs = ["logits"] + [f"present_{n}" for n in names]
    with torch.no_grad():
        if dynamo:
            from torch.export import Dim

            batch, seq = Dim("batch", max=64), Dim("seq", max=4096)
            total, length = Dim("total", max=8192), Dim("past", max=8192)
            shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
                      tuple({0: batch, 2: length} for _ in past))
            torch.onnx.export(wrapper, (ids, mask, pos, *past), path, input_names=inputs,
                              output_names=outputs, dynamic_shapes=shapes, dynamo=True,
                              opset_version=18, verbose=False)
        else:
            axes = {"input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "total"},
                    "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"}}
            axes.update({n: {0: "batch", 2: "past"} for n in inputs[3:]})
            axes.update({n: {0: "batch", 2: "total"} for n in outputs[1:]})
            torch.onnx.export(wrapper, (ids, mask, pos, *past), path, input_names=inputs,
                              output_names=outputs, dynamic_axes=axes, dynamo=False,
                              opset_version=17)
    model.eval()
    return inputs, outputs


def _greedy(model, ids: torch.Tensor, names: list[str], step):
    """run(new): greedy generation of `new` tokens after the prompt `ids` [1, S], as (tokens,
    scores), the scores being the masked logits of each step ([1, vocab] tensors) as
    generate(output_scores=True) gives them. step(feeds) runs the exported decoder on feeds (its
    input names -> arrays, or the previous step's present values as they came out) and returns
    (logits as a numpy array, the present keys and values)."""
    _, kv, head_dim = _geometry(model.config)
    eos = model.generation_config.eos_token_id
    eos = [e for e in ([eos] if isinstance(eos, int) else list(eos or []))
           if e < model.config.vocab_size]  # as generate() does: ids past the vocabulary are none
    prompt = ids.numpy().astype(np.int64)
    batch, length = prompt.shape
    empty = np.zeros((batch, kv, 0, head_dim), dtype=np.float32)

    def run(new: int):
        tokens, scores = [], []
        step_ids, past = prompt, [empty] * (len(names) - 3)
        for i in range(new):
            seen = length + i - step_ids.shape[1]  # positions already in the cache
            feeds = {"input_ids": step_ids,
                     "attention_mask": np.ones((batch, seen + step_ids.shape[1]), dtype=np.int64),
                     "position_ids": np.arange(seen, seen + step_ids.shape[1],
                                               dtype=np.int64)[None].repeat(batch, 0)}
            feeds.update(zip(names[3:], past))
            logits, past = step(feeds)
            logits = logits.copy()
            logits[:, eos] = -np.inf  # min_new_tokens = new: generate() masks it every step
            nxt = logits.argmax(-1).astype(np.int64)
            tokens.append(int(nxt[0]))
            scores.append(torch.from_numpy(logits))
            step_ids = nxt.reshape(batch, 1)
        return tokens, scores

    return run


def ort_generator(model, ids: torch.Tensor, threads: int, workdir: str, dynamo: bool = False):
    """Exports `model` to workdir and returns _greedy's run(new) on ONNX Runtime: each step's
    present keys and values stay OrtValues bound as the next step's past (no copy)."""
    from run import ort_session  # bench/run.py: the peer's settings (BENCHMARKING.md)

    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "decoder.onnx")
    inputs, outputs = export_decoder(model, path, dynamo)
    session = ort_session(path, threads)
    io = session.io_binding()

    def step(feeds):
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                io.bind_cpu_input(name, value)
            else:
                io.bind_ortvalue_input(name, value)  # the previous step's present: no copy
        for name in outputs:
            io.bind_output(name, "cpu")
        session.run_with_iobinding(io)
        out = io.get_outputs()
        return out[0].numpy(), out[1:]

    return _greedy(model, ids, inputs, step)


def pypto_onnx_generator(model, ids: torch.Tensor, threads: int, workdir: str,
                         dynamo: bool = False):
    """The same exported file and loop on PyPTO (pypto.onnx.load, T threads): the ONNX path
    against ONNX Runtime on one file, without generate()'s and Dynamo's per-token Python."""
    import pypto

    pypto.set_num_threads(threads)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "decoder.onnx")
    inputs, _ = export_decoder(model, path, dynamo)
    exe = pypto.onnx.load(path)

    def step(feeds):
        out = exe(*(feeds[n] for n in inputs))
        return np.asarray(out[0]), list(out[1:])

    return _greedy(model, ids, inputs, step)
