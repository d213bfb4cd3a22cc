"""A CNN head computed in blocks of output channels, forward and backward: a rewrite of torch's joint graph.

A fine-tuned CNN often ends  frozen conv -> batch norm (training, its affine trained) -> ReLU/ReLU6 (or none)
-> mean over H,W  and a classifier on the pooled features. torch runs that head on whole tensors: the batch
norm's input, kept for its backward, beside its output, and in the backward that input beside the output's
gradient, none of which a schedule can split (MbV2-w0.35 at 128x128: 1280x4x4 floats, 81,920 B each). Each
channel's training-mode batch norm is its own (statistics over N, H, W of that channel), so the head runs per
block of output channels: the conv with its weight's rows [c0:c1] (frozen: no gradient), the batch norm with
its gamma, beta and running statistics [c0:c1], the activation, the mean; the pooled blocks concatenated into
the features. The backward per block likewise: the mean's and the activation's backward on the features'
gradient [:, c0:c1], `native_batch_norm_backward` (gamma and beta gradients only); the blocks' gradients and
new running statistics concatenated (C floats each). Each block's tensors are graph items of their own, which
the solver keeps, recomputes (a frozen conv needs nothing saved) or pages like any other. The kernels are
eager's own on channel slices: every value is a per-channel computation, so nothing is summed in another order.

Where the conv's input needs a gradient (a layer before the head trains), each block's batch norm backward gives
its input's gradient too, the conv's backward on the block's weight rows (input gradient only) the block's share
of the conv input's gradient, and an add chain sums the shares (the adds over the dying sum where the backend
writes in place). That gradient, and every one before it, is then a sum over the output channels in another
order than torch's one convolution backward: within float32 rounding, not bitwise. The block's gamma and beta
gradients are copied out of the batch norm backward's tuple, which lives as one tensor to its last reader, so
that it dies at the block's conv backward rather than at the concatenation after every block.

A graph that does not have the pattern, exactly, is left as it was.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

from .capture import JointCapture
from .chunked_head import _Emitter, _users, _val

aten = torch.ops.aten

_BN = aten._native_batch_norm_legit_functional.default
_BN_BACK = aten.native_batch_norm_backward.default
_ASSERT = aten._assert_tensor_metadata.default
_ALIAS = {aten.detach.default, aten.alias.default}
_SHAPE = {aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default}


@dataclass
class Head:
    """The matched head: what the rewrite reads, and the nodes whose values it replaces."""

    x: fx.Node  # the conv's input (N, Cin, H', W')
    conv: fx.Node
    bn: fx.Node
    act: fx.Node | None  # hardtanh or relu on the batch norm's output; None: the mean reads it
    mean: fx.Node  # aten.mean.dim over H, W: (N, C) or (N, C, 1, 1)
    grad_features: fx.Node  # the features' gradient the mean's backward expands: (N, C) or (N, C, 1, 1)
    act_back: fx.Node | None
    bn_back: fx.Node
    grads: dict  # 1 -> gamma's gradient node, 2 -> beta's (getitems of the batch norm's backward)
    stats: dict  # 3 -> new running mean, 4 -> new running var (getitems of the batch norm)
    region: set  # every node replaced
    conv_back: fx.Node | None = None  # the conv's input-gradient backward, where its input needs a gradient
    grad_x: fx.Node | None = None  # that input gradient (getitem 0 of conv_back)

    @property
    def channels(self) -> int:
        return int(_val(self.conv).shape[1])


def _placeholder(n, cap: JointCapture, frozen: bool) -> bool:
    """`n` is a parameter placeholder (frozen: one with no gradient)."""
    return isinstance(n, fx.Node) and n.op == "placeholder" and n.name in cap.params \
        and (not frozen or cap.params[n.name] not in cap.grads.values())


def _through_aliases(n: fx.Node, region: set) -> list[fx.Node]:
    """The readers of `n`, seen through detach and alias nodes (which join the region)."""
    out = []
    for u in _users(n):
        if u.target in _ALIAS:
            region.add(u)
            out += _through_aliases(u, region)
        else:
            out.append(u)
    return out


def _getitems(n: fx.Node) -> dict | None:
    items = {u.args[1]: u for u in _users(n) if u.target is operator.getitem}
    return items if len(items) == len(_users(n)) else None


def _hw_mean(n: fx.Node) -> bool:
    if n.target is not aten.mean.dim or n.kwargs.get("dtype") is not None or len(n.args) > 3:
        return False
    dims = n.args[1]
    return _val(n.args[0]).dim() == 4 and dims is not None and sorted(d % 4 for d in dims) == [2, 3]


def _mean_backward(act_back_grad: fx.Node, region: set) -> fx.Node | None:
    """From the activation's (or batch norm's) output gradient back to the features' gradient: div.Scalar of an
    expand over the planes of (N, C) or (N, C, 1, 1), through unsqueezes or views. None if it is not that."""
    n = act_back_grad
    if n.target is not aten.div.Scalar or len(_users(n)) != 1:
        return None
    region.add(n)
    shape = tuple(_val(n).shape)
    if n.args[1] != shape[2] * shape[3]:
        return None
    n = n.args[0]
    if n.target is not aten.expand.default or len(_users(n)) != 1:
        return None
    region.add(n)
    n = n.args[0]
    while n.target in _SHAPE and len(_users(n)) == 1 and _val(n).dim() > 2:
        region.add(n)
        n = n.args[0]
    v = _val(n)
    if v.dim() not in (2, 4) or tuple(v.shape[:2]) != shape[:2] or (v.dim() == 4 and tuple(v.shape[2:]) != (1, 1)):
        return None
    return n


def match(bn: fx.Node, cap: JointCapture) -> Head | None:
    """The head whose training-mode batch norm is `bn`, or None where any part differs from the pattern."""
    if len(bn.args) != 8 or bn.kwargs or bn.args[5] is not True:
        return None
    conv, gamma, beta, rm, rv = bn.args[:5]
    if not (isinstance(conv, fx.Node) and conv.target is aten.convolution.default and len(conv.args) == 9):
        return None
    x, w, b, _, _, _, transposed, _, groups = conv.args
    if transposed or groups != 1 or not _placeholder(w, cap, True) or (b is not None and not _placeholder(b, cap, True)):
        return None
    if not (_placeholder(gamma, cap, False) and _placeholder(beta, cap, False)) or _val(conv).dim() != 4:
        return None
    region = {conv, bn}
    items = _getitems(bn)
    if items is None or set(items) - {0, 1, 2, 3, 4} or 0 not in items:
        return None
    region |= set(items.values())
    out = items[0]
    # The activation and its backward, or the mean reading the batch norm's output directly.
    readers = _through_aliases(out, region)
    act = act_back = None
    fwd = [u for u in readers if u.target in (aten.hardtanh.default, aten.relu.default, aten.mean.dim)]
    if len(fwd) != 1:
        return None
    if fwd[0].target is not aten.mean.dim:
        act = fwd[0]
        region.add(act)
        if act.target is aten.hardtanh.default:  # its backward reads the batch norm's output
            backs = [u for u in readers if u is not act]
            if len(backs) != 1 or backs[0].target is not aten.hardtanh_backward.default \
                    or tuple(backs[0].args[2:]) != tuple(act.args[1:]) or backs[0].args[1] is not out:
                return None
            act_back, after = backs[0], _through_aliases(act, region)
        else:  # relu: its backward (threshold_backward) reads the relu's output
            if len(readers) != 1:
                return None
            after = _through_aliases(act, region)
            backs = [u for u in after if u.target is aten.threshold_backward.default]
            if len(backs) != 1 or backs[0].args[2] != 0 or len(backs[0].args) != 3:
                return None
            act_back = backs[0]
            after = [u for u in after if u is not act_back]
            if _root(act_back.args[1]) is not act:
                return None
        if len(after) != 1 or not _hw_mean(after[0]):
            return None
        mean = after[0]
    else:
        mean = fwd[0]
        if len(readers) != 1:
            return None
    if not _hw_mean(mean) or _root(mean.args[0]) is not (act or out):
        return None
    region.add(mean)
    if act_back is not None:
        region.add(act_back)
        if len(_users(act_back)) != 1:
            return None
    conv_readers = _users(conv)  # the batch norm and its backward
    bn_back = next((u for u in conv_readers if u.target is _BN_BACK), None)
    if len(conv_readers) != 2 or bn not in conv_readers or bn_back is None or len(bn_back.args) != 10 \
            or bn_back.kwargs or (act_back is not None and bn_back.args[0] is not act_back):
        return None
    grad_out = bn_back.args[0] if act_back is None else act_back.args[0]
    g = _mean_backward(grad_out, region)
    if g is None or bn_back.args[1:7] != (conv, gamma, items.get(3, rm), items.get(4, rv), items.get(1),
                                           items.get(2)) or bn_back.args[7] is not True \
            or bn_back.args[8] != bn.args[7] or list(bn_back.args[9]) not in ([False, True, True], [True, True, True]):
        return None
    region.add(bn_back)
    back_items = _getitems(bn_back)
    if back_items is None or set(back_items) - {0, 1, 2}:
        return None
    region |= set(back_items.values())
    conv_back = grad_x = None
    if back_items.get(0) is not None and _users(back_items[0]):  # the gradient flows on into the conv's input
        conv_back, grad_x = _input_backward(back_items[0], h_conv=conv, region=region)
        if conv_back is None:
            return None
    grads = {k: back_items[k] for k in (1, 2) if k in back_items}
    stats = {k: items[k] for k in (3, 4) if k in items}
    kept = {mean, *grads.values(), *stats.values(), grad_x}  # their values are replaced; every other reader is inside
    for n in region:
        if n not in kept and any(u not in region for u in _users(n)):
            return None
    return Head(x=x, conv=conv, bn=bn, act=act, mean=mean, grad_features=g, act_back=act_back, bn_back=bn_back,
                grads=grads, stats=stats, region=region, conv_back=conv_back, grad_x=grad_x)


def _input_backward(grad_y: fx.Node, h_conv: fx.Node, region: set):
    """The conv's backward that reads the batch norm's input gradient `grad_y` for the input's gradient only
    (the weight frozen, the bias frozen or none), and that input gradient; (None, None) if it is not that."""
    users = _users(grad_y)
    if len(users) != 1 or users[0].target is not aten.convolution_backward.default:
        return None, None
    cb = users[0]
    x, w, _, stride, padding, dilation, transposed, out_pad, groups = h_conv.args
    if len(cb.args) != 11 or cb.kwargs or cb.args[0] is not grad_y or cb.args[1] is not x or cb.args[2] is not w \
            or tuple(cb.args[4:10]) != (stride, padding, dilation, transposed, out_pad, groups) \
            or list(cb.args[10]) != [True, False, False]:
        return None, None
    items = _getitems(cb)
    if items is None or 0 not in items or any(_users(items[k]) for k in items if k != 0):
        return None, None
    region.add(cb)
    region |= set(items.values())
    return cb, items[0]


def _root(n):
    while isinstance(n, fx.Node) and n.target in _ALIAS:
        n = n.args[0]
    return n


def find_heads(cap: JointCapture) -> list[Head]:
    """Every head of the pattern in `cap`'s graph."""
    return [h for h in (match(n, cap) for n in cap.gm.graph.nodes if n.target is _BN) if h is not None]


def block_spans(channels: int, blocks: int) -> list[tuple[int, int]]:
    """`blocks` spans of output channels, as even as they come (the first ones one wider)."""
    blocks = max(1, min(blocks, channels))
    step, extra = divmod(channels, blocks)
    spans, c0 = [], 0
    for k in range(blocks):
        c1 = c0 + step + (1 if k < extra else 0)
        spans.append((c0, c1))
        c0 = c1
    return spans


def block_heads(cap: JointCapture, blocks: int) -> JointCapture:
    """A copy of `cap` with every head of the pattern computed in `blocks` blocks of output channels (`cap` is
    left as it was; the copy names the new gradient and running-statistics nodes). `cap` itself for `blocks` <= 1
    or where the pattern is not there."""
    if blocks <= 1 or not find_heads(cap):
        return cap
    cap = _copied(cap)
    for head in find_heads(cap):
        cap = _rewrite(cap, head, block_spans(head.channels, blocks))
    return cap


def _bias_sizes(sizes, channels: int):
    """A block's bias sizes for its conv's backward: its own channels where the whole conv's named a bias."""
    return sizes if not sizes or list(sizes) == [0] else [channels]


def _copied(cap: JointCapture) -> JointCapture:
    """`cap` with a graph of its own (the same node names, their traced values shared)."""
    graph = fx.Graph()
    out = graph.graph_copy(cap.gm.graph, {})
    graph.output(out)
    return replace(cap, gm=fx.GraphModule(cap.gm, graph))


def _rewrite(cap: JointCapture, h: Head, spans: list[tuple[int, int]]) -> JointCapture:
    from torch._guards import detect_fake_mode

    gm, graph = cap.gm, cap.gm.graph
    emit = _Emitter(gm, detect_fake_mode([_val(h.conv)]))
    _, w, b, stride, padding, dilation, transposed, out_pad, groups = h.conv.args
    _, gamma, beta, rm, rv, training, momentum, eps = h.bn.args
    sources, made = dict(cap.sources), []

    def sliced(p, c0, c1):
        return None if p is None else emit(aten.slice.Tensor, p, 0, c0, c1)

    def said(node, like):
        if like.name in cap.sources:
            sources[node.name] = cap.sources[like.name]
        return node

    with graph.inserting_before(h.mean):  # forward, where the mean was: every block's conv, norm, act, mean
        blocks = []
        for c0, c1 in spans:
            y = said(emit(aten.convolution.default, h.x, sliced(w, c0, c1), sliced(b, c0, c1), stride, padding,
                          dilation, transposed, out_pad, groups), h.conv)
            norm = said(emit(_BN, y, sliced(gamma, c0, c1), sliced(beta, c0, c1), sliced(rm, c0, c1),
                             sliced(rv, c0, c1), training, momentum, eps), h.bn)
            items = {k: emit(operator.getitem, norm, k) for k in range(5)}
            a = items[0]
            if h.act is not None:
                a = said(emit(h.act.target, a, *h.act.args[1:]), h.act)
            pooled = said(emit(aten.mean.dim, a, *h.mean.args[1:], **h.mean.kwargs), h.mean)
            blocks.append((y, items, a, pooled))
            made.append(pooled)
        features = said(emit(aten.cat.default, [p for *_, p in blocks], 1), h.mean)
        stats = {k: emit(aten.cat.default, [items[k] for _, items, _, _ in blocks]) for k in h.stats}
    h.mean.replace_all_uses_with(features)
    g, shape = h.grad_features, tuple(_val(h.conv).shape)
    with graph.inserting_before(h.bn_back):  # backward, block by block, where the batch norm's was
        grads, grad_x = {k: [] for k in h.grads}, None
        for (c0, c1), (y, items, a, _) in zip(spans, blocks):
            gb = emit(aten.slice.Tensor, g, 1, c0, c1)
            while _val(gb).dim() < 4:
                gb = emit(aten.unsqueeze.default, gb, _val(gb).dim())
            gb = emit(aten.expand.default, gb, [shape[0], c1 - c0, *shape[2:]])
            gb = emit(aten.div.Scalar, gb, shape[2] * shape[3])
            if h.act_back is not None:
                read = items[0] if h.act.target is aten.hardtanh.default else a
                gb = emit(h.act_back.target, gb, read, *h.act_back.args[2:])
            # training mode reads the saved statistics, not the running ones: those of the block's slice
            back = emit(_BN_BACK, gb, y, sliced(gamma, c0, c1), sliced(rm, c0, c1), sliced(rv, c0, c1), items[1],
                        items[2], True,
                        h.bn_back.args[8], [h.grad_x is not None, True, True])
            for k in grads:
                g_k = emit(operator.getitem, back, k)
                # copied out where the tuple holds the input's gradient too: a tuple lives as one tensor, to its
                # last reader, and the parameters' gradients are read at the cat after every block
                grads[k].append(g_k if h.grad_x is None else emit(aten.clone.default, g_k))
            if h.grad_x is not None:  # this block's share of the input's gradient, summed over the blocks
                cb = h.conv_back
                part = emit(operator.getitem, emit(aten.convolution_backward.default, emit(operator.getitem, back, 0),
                                                   h.x, sliced(w, c0, c1), _bias_sizes(cb.args[3], c1 - c0),
                                                   *cb.args[4:10], [True, False, False]), 0)
                grad_x = part if grad_x is None else emit(aten.add.Tensor, grad_x, part)
        grad_cats = {k: emit(aten.cat.default, parts) for k, parts in grads.items()}
    if h.grad_x is not None:
        h.grad_x.replace_all_uses_with(grad_x)
    renamed = {}
    for k, node in h.grads.items():
        node.replace_all_uses_with(grad_cats[k])
        renamed[node.name] = grad_cats[k].name
    for k, node in h.stats.items():
        node.replace_all_uses_with(stats[k])
        renamed[node.name] = stats[k].name
    for n in list(graph.nodes):  # shape asserts on the removed tensors go with them
        if n.target is _ASSERT and isinstance(n.args[0], fx.Node) and n.args[0] in h.region:
            graph.erase_node(n)
    graph.eliminate_dead_code()
    gm.recompile()
    return replace(cap, grads={renamed.get(k, k): p for k, p in cap.grads.items()},
                   buffer_updates={renamed.get(k, k): v for k, v in cap.buffer_updates.items()}, sources=sources)
