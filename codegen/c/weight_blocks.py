"""The C statements of a convolution whose frozen weight is paged in from storage block by block.

A frozen weight larger than the RAM left is kept in storage as one page per block of output channels
(compiler/graph/streaming.py chooses the block); the convolution pages each block into its workspace and
computes that block's output channels, sample by sample (a block of channels is contiguous per sample).
Each output channel is computed as the whole convolution computes it: bit-identical.
"""
from __future__ import annotations

from math import prod

from edgetrain.compiler.graph.aten_node import read_rows

from .emitters import EmitError


def emit_blocked_conv(node, offsets: dict[str, int], ctx, params: dict, blocks: dict, paged: dict[str, int],
                      x_shape) -> list[str]:
    """`node` (a forward convolution without groups) with its weight paged in by `blocks[weight]`
    ((page, first row, end row) each) at arena word `paged[weight]`; `x_shape`: its input's shape."""
    if node.op == "aten.convolution_backward.default":
        return _blocked_input_grad(node, offsets, params, blocks, paged, x_shape)
    a = node.attrs["args"]
    if node.op != "aten.convolution.default" or a[8] != 1 or node.inputs[0].view:
        raise EmitError("only a convolution without groups, reading its input as it is, pages its weight by blocks")
    w, b = a[1]["$p"], a[2]["$p"] if a[2] else None
    c0, c1 = read_rows(a[1], params[w]["shape"][0])  # a block of a CNN head computed by channels: its rows only
    if b is not None and read_rows(a[2], params[b]["shape"][0]) != (c0, c1):
        raise EmitError("a convolution whose bias rows differ from its weight's")
    n, c_in, h_in, w_in = x_shape
    _, c_out, h_out, w_out = node.shape
    kh, kw = params[w]["shape"][2:]
    row = prod(params[w]["shape"][1:])
    x, y, ws = offsets[node.inputs[0].name], offsets[node.name], paged[w]
    bias = None if b is None else (f"ET_F({paged[b]})" if b in paged else ctx.pident[b])
    (sh, sw), (ph, pw), (dh, dw) = a[3], a[4], a[5]
    lines = []
    for page, r0, r1 in blocks[w]:
        if not c0 <= r0 < c1:
            continue
        if r1 > c1:
            raise EmitError("a convolution's rows end inside a block of its streamed weight")
        lines.append(f"ET_TRY(et_page_in({page}u, ET_F({ws}), {4 * row * (r1 - r0)}u)); /* output channels {r0}..{r1 - 1} */")
        shape = (f"&(const et_conv2d_shape){{.n = 1, .c_in = {c_in}, .h_in = {h_in}, .w_in = {w_in}, .c_out = {r1 - r0}, "
                 f".h_out = {h_out}, .w_out = {w_out}, .k_h = {kh}, .k_w = {kw}, .stride_h = {sh}, .stride_w = {sw}, "
                 f".pad_h = {ph}, .pad_w = {pw}, .dil_h = {dh}, .dil_w = {dw}, .groups = 1}}")
        for s in range(n):
            # a block of its own: the compound literal's stack slot is reused by the next (patches.py)
            lines.append(f"{{ et_conv2d_forward({shape}, ET_F({x + s * c_in * h_in * w_in}), ET_F({ws}), "
                         f"{'NULL' if bias is None else f'{bias} + {r0}'}, "
                         f"ET_F({y + s * c_out * h_out * w_out + (r0 - c0) * h_out * w_out})); }}")
    return lines


def read_shape(holder, view) -> tuple | None:
    """The shape of what a node reads of `holder`: the holder's tensor, or its first item."""
    if holder.shape is not None or not holder.items:
        return holder.shape
    return holder.items[0].shape if _whole_or_first(view) else None


def _whole_or_first(view) -> bool:
    return [list(v) for v in view] in ([], [["item", 0]])


def _blocked_input_grad(node, offsets: dict[str, int], params: dict, blocks: dict, paged: dict[str, int],
                        gy_shape) -> list[str]:
    """A convolution's backward for its input's gradient alone (a block of a CNN head's: frontend/channel_blocks.py)
    with its weight's rows in one page of the streamed weight: the page in, then the kernel on it."""
    a = node.attrs["args"]
    if a[9] != 1 or list(a[10]) != [True, False, False] or not _whole_or_first(node.inputs[0].view):
        raise EmitError("only a convolution's backward for its input's gradient, without groups, pages its weight")
    w = a[2]["$p"]
    c0, c1 = read_rows(a[2], params[w]["shape"][0])
    pages = [(page, r0, r1) for page, r0, r1 in blocks[w] if c0 <= r0 < c1]
    if len(pages) != 1 or pages[0][1:] != (c0, c1):  # a sum over pages would need an accumulating kernel
        raise EmitError("a convolution's input gradient reads its streamed weight's rows from more than one page")
    page = pages[0][0]
    n, c_out, h_out, w_out = gy_shape
    _, c_in, h_in, w_in = node.items[0].shape if node.items else node.shape
    kh, kw = params[w]["shape"][2:]
    row = prod(params[w]["shape"][1:])
    (sh, sw), (ph, pw), (dh, dw) = a[4], a[5], a[6]
    # the output gradient: a tensor, or the first item of a tuple (which starts where the tuple does)
    gy, gx, ws = offsets[node.inputs[0].name], offsets[node.name], paged[w]
    shape = (f"&(const et_conv2d_shape){{.n = {n}, .c_in = {c_in}, .h_in = {h_in}, .w_in = {w_in}, .c_out = {c_out}, "
             f".h_out = {h_out}, .w_out = {w_out}, .k_h = {kh}, .k_w = {kw}, .stride_h = {sh}, .stride_w = {sw}, "
             f".pad_h = {ph}, .pad_w = {pw}, .dil_h = {dh}, .dil_w = {dw}, .groups = 1}}")
    return [f"ET_TRY(et_page_in({page}u, ET_F({ws}), {4 * row * (c1 - c0)}u)); /* output channels {c0}..{c1 - 1} */",
            f"{{ et_conv2d_backward_input({shape}, ET_F({gy}), ET_F({ws}), ET_F({gx})); }}"]
