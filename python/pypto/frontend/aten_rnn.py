"""Converters of torch's recurrent layers (nn.LSTM, nn.GRU, nn.RNN: aten.lstm.input,
aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input) into ONNX LSTM, GRU and RNN nodes, one
per layer, which the CPU kernels run whole (src/backend/cpu/recurrent.cpp) instead of the steps
unrolled into MatMuls and gates. torch.export keeps these ops when PyPTO asks
(torch_capture.KEEP_WHOLE).

Per layer, the weights of both directions are stacked into W [D, G*H, I], R [D, G*H, H] and
B [D, 2*G*H] with the gates reordered from torch's (LSTM i f g o, GRU r z n) to ONNX's (i o f c,
z r h) by Split + Concat, which FoldConstants turns into initializers; GRU takes
linear_before_reset=1 (torch applies the reset gate after the hidden product). The layers run in
ONNX's layout 0; a batch_first input and output are transposed around them. LSTMs with
proj_size stay decomposed (ONNX's LSTM has no projection: rnn_decomposed)."""

from __future__ import annotations

import torch

from .fx_importer import V, converter

aten = torch.ops.aten

# torch's gate chunks in ONNX's order.
_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}

RNN_OPS = (aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input)


def _per_direction(has_biases: bool) -> int:
    return 4 if has_biases else 2  # w_ih, w_hh (, b_ih, b_hh)


def rnn_decomposed(node: torch.fx.Node) -> bool:
    """Whether a recurrent node has a form these converters do not take (LSTM proj_size: a
    w_hr per direction), so torch's decomposition should unroll it instead."""
    params, has_biases, layers, bidirectional = (node.args[2], node.args[3], node.args[4],
                                                 node.args[7])
    return len(params) != layers * (2 if bidirectional else 1) * _per_direction(has_biases)


def _reorder(ctx, w: V, cell: str) -> int:
    """w's gate chunks along dim 0 in ONNX's order."""
    order = _ORDER[cell]
    if len(order) == 1:
        return w.id
    parts = ctx.op("Split", [w], {"axis": 0, "num_outputs": len(order)}, num_outputs=len(order))
    return ctx.op("Concat", [parts[i] for i in order], {"axis": 0})


def _stack(ctx, per_dir: list[int]) -> int:
    """[D, ...] from one tensor per direction."""
    zero = ctx.ints([0])
    return ctx.op("Concat", [ctx.op("Unsqueeze", [t, zero]) for t in per_dir], {"axis": 0})


def _convert(cell: str, activation: str | None = None):
    def convert(ctx, node, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                batch_first):
        if rnn_decomposed(node):
            ctx.unsupported("an LSTM with proj_size (ONNX's LSTM has no projection)")
        if train and dropout:
            ctx.unsupported("dropout between layers in training mode (call .eval())")
        dirs = 2 if bidirectional else 1
        per = _per_direction(has_biases)
        h0 = hx[0] if cell == "LSTM" else hx
        c0 = hx[1] if cell == "LSTM" else None
        hidden = params[1].shape[1]
        attrs = {"hidden_size": int(hidden),
                 "direction": "bidirectional" if bidirectional else "forward"}
        if cell == "GRU":
            attrs["linear_before_reset"] = 1
        if activation:
            attrs["activations"] = [activation] * dirs
        seq = ctx.op("Transpose", [x], {"perm": [1, 0, 2]}) if batch_first else x.id
        last_h, last_c = [], []
        for layer in range(num_layers):
            ps = [params[(layer * dirs + d) * per:(layer * dirs + d + 1) * per]
                  for d in range(dirs)]
            w = _stack(ctx, [_reorder(ctx, p[0], cell) for p in ps])
            r = _stack(ctx, [_reorder(ctx, p[1], cell) for p in ps])
            b = None
            if has_biases:
                b = _stack(ctx, [ctx.op("Concat", [_reorder(ctx, p[2], cell),
                                                   _reorder(ctx, p[3], cell)], {"axis": 0})
                                 for p in ps])
            rows = [ctx.ints([layer * dirs]), ctx.ints([(layer + 1) * dirs]), ctx.ints([0])]
            inputs = [seq, w, r, b, None, ctx.op("Slice", [h0, *rows])]
            if cell == "LSTM":
                inputs += [ctx.op("Slice", [c0, *rows])]
            outs = ctx.op(cell, inputs, attrs, num_outputs=3 if cell == "LSTM" else 2)
            y = outs[0]  # [S, D, B, H]
            if dirs == 1:
                seq = ctx.op("Squeeze", [y, ctx.ints([1])])
            else:
                seq = ctx.op("Reshape", [ctx.op("Transpose", [y], {"perm": [0, 2, 1, 3]}),
                                         ctx.ints([0, 0, -1])])
            last_h.append(outs[1])
            if cell == "LSTM":
                last_c.append(outs[2])
        if batch_first:
            seq = ctx.op("Transpose", [seq], {"perm": [1, 0, 2]})
        results = [seq, ctx.op("Concat", last_h, {"axis": 0}) if num_layers > 1 else last_h[0]]
        if cell == "LSTM":
            results.append(ctx.op("Concat", last_c, {"axis": 0}) if num_layers > 1 else last_c[0])
        vals = node.meta["val"]
        return [V(t, v.dtype, v.shape) for t, v in zip(results, vals)]

    return convert


converter(aten.lstm.input)(_convert("LSTM"))
converter(aten.gru.input)(_convert("GRU"))
converter(aten.rnn_tanh.input)(_convert("RNN"))
converter(aten.rnn_relu.input)(_convert("RNN", "Relu"))
