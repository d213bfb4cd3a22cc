"""A language model's head and cross-entropy in chunks of positions: a rewrite of torch's joint graph.

torch differentiates `cross_entropy(hidden @ W.T, labels)` as whole tensors: the (positions, vocabulary) logits,
their log-softmax and its gradient exist at once (525 MB each at 1024 x 128,256 in float32). Here the head's
`mm`, its dtype cast, `_log_softmax` and `nll_loss_forward` run per chunk of rows, and so do their backward ops
(`nll_loss_backward`, `_log_softmax_backward_data`, the two `mm`s): each chunk's log-softmax is a tensor of its
own, which the solver keeps or recomputes like any other. The kernels are eager's own, on row slices; what
changes is the order of two sums: the loss (chunk sums, then the division by the count torch's kernel makes) and
the head's weight gradient (accumulated chunk by chunk with `addmm`). A tied embedding's gradient is scattered
into that same accumulator (`index_put` with accumulate), not made as a second (vocabulary, hidden) tensor by
`embedding_dense_backward` and summed.

A graph that does not have the pattern, exactly, is left as it was.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import torch
import torch.fx as fx

from .capture import JointCapture

aten = torch.ops.aten

# A chunk's logits are at most this many times the hidden states the head reads: small beside a layer's
# activations, few enough chunks that the graph stays small (16 at Llama-3's 128,256 over hidden 2048).
CHUNK_TO_HIDDEN = 4

_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default}
_DETACH = {aten.detach.default, aten.alias.default}
_CAST = aten._to_copy.default
_ASSERT = aten._assert_tensor_metadata.default


@dataclass
class _Head:
    """The matched pattern: the nodes the rewrite reads and those whose values it replaces."""

    hidden: fx.Node  # (R, H), the head's input rows
    weight_t: fx.Node  # (H, V), the head's transposed weight as the forward mm reads it
    weight_back: fx.Node | None  # (V, H), what the input-gradient mm reads
    target: fx.Node  # (R,) labels
    tangent: fx.Node  # the loss's gradient seed
    first_backward: fx.Node  # nll_loss_backward: where the chunks' backward goes
    reduction: int
    ignore_index: int
    fwd_cast: dict | None  # _to_copy kwargs between the logits and the log-softmax
    bwd_cast: dict | None  # _to_copy kwargs between the log-softmax gradient and the mms
    grad_dtype: torch.dtype  # _log_softmax_backward_data's input dtype argument
    loss: fx.Node  # getitem 0 of nll_loss_forward
    grad_hidden: fx.Node | None  # mm(G, weight_back)
    grad_weight: fx.Node | None  # mm(t(G), hidden), (V, H)
    region: set  # every node replaced


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _users(n: fx.Node) -> list[fx.Node]:
    return [u for u in n.users if u.target is not _ASSERT]


def _cast_kwargs(n: fx.Node) -> dict | None:
    """A `_to_copy` that changes the dtype and nothing else (device and a strided layout may be restated): its
    kwargs."""
    if n.target is not _CAST or set(n.kwargs) - {"dtype", "layout", "device"} or "dtype" not in n.kwargs \
            or n.kwargs.get("layout", torch.strided) is not torch.strided:
        return None
    return dict(n.kwargs)


def _back_to_mm(n: fx.Node, region: set):
    """From the log-softmax's input back to the head's `mm` through views and at most one cast."""
    cast = None
    while n.target in _VIEWS or n.target is _CAST:
        if len(_users(n)) != 1:
            return None, None
        if n.target is _CAST:
            if cast is not None or _cast_kwargs(n) is None:
                return None, None
            cast = _cast_kwargs(n)
        region.add(n)
        n = n.args[0]
    if n.target is not aten.mm.default or len(_users(n)) != 1:
        return None, None
    region.add(n)
    return n, cast


def _on_to_grad(n: fx.Node, region: set):
    """From the log-softmax gradient on through single-reader views and at most one cast, to the (R, V) tensor
    the two backward mms read."""
    cast = None
    while len(_users(n)) == 1 and (_users(n)[0].target in _VIEWS or _users(n)[0].target is _CAST):
        nxt = _users(n)[0]
        if nxt.target is _CAST:
            if cast is not None or _cast_kwargs(nxt) is None:
                return None, None
            cast = _cast_kwargs(nxt)
        region.add(nxt)
        n = nxt
    return n, cast


def _match(nll: fx.Node) -> _Head | None:
    if len(nll.args) != 5 or nll.kwargs:
        return None
    lsm, target, weight, reduction, ignore = nll.args
    if weight is not None or reduction not in (1, 2) or not isinstance(lsm, fx.Node) \
            or lsm.target is not aten._log_softmax.default or lsm.args[1:] != (1, False) or _val(lsm).dim() != 2:
        return None
    x = lsm.args[0]
    rows, vocab = _val(lsm).shape
    region = {lsm, nll}
    mm, fwd_cast = _back_to_mm(x, region)
    if mm is None or tuple(_val(mm).shape) != (rows, vocab):
        return None
    hidden, weight_t = mm.args
    # Readers of the log-softmax: the loss, its backward, and detaches leading to the softmax backward.
    nll_back = lsm_back = None
    todo = list(_users(lsm))
    while todo:
        u = todo.pop()
        region.add(u)
        if u is nll:
            continue
        if u.target in _DETACH:
            todo += _users(u)
        elif u.target is aten.nll_loss_backward.default and nll_back is None:
            nll_back = u
        elif u.target is aten._log_softmax_backward_data.default and lsm_back is None:
            lsm_back = u
        else:
            return None
    if nll_back is None or lsm_back is None or lsm_back.args[0] is not nll_back or len(_users(nll_back)) != 1:
        return None
    getitems = {u.args[1]: u for u in _users(nll) if u.target is operator.getitem}
    if len(getitems) != len(_users(nll)) or 0 not in getitems:
        return None
    loss = getitems[0]
    if 1 in getitems:
        if any(u is not nll_back for u in _users(getitems[1])):
            return None
        region.add(getitems[1])
    if nll_back.args[1:6] != (lsm, target, None, reduction, ignore) or nll_back.args[6] is not getitems.get(1):
        return None
    region |= {loss}
    grad, bwd_cast = _on_to_grad(lsm_back, region)
    if grad is None or tuple(_val(grad).shape) != (rows, vocab):
        return None
    grad_hidden = grad_weight = weight_back = None
    for u in _users(grad):
        region.add(u)
        if u.target is aten.mm.default and u.args[0] is grad and grad_hidden is None:
            grad_hidden, weight_back = u, u.args[1]
        elif u.target is aten.t.default and len(_users(u)) == 1 and grad_weight is None:
            gw = _users(u)[0]
            if gw.target is not aten.mm.default or gw.args != (u, hidden):
                return None
            grad_weight = gw
            region.add(gw)
        else:
            return None
    if weight_back is not None and not _defined_before(weight_back, nll_back):
        return None
    for n in region:  # nothing outside reads what the rewrite removes, but the values it replaces
        if n in (loss, grad_hidden, grad_weight):
            continue
        if any(u not in region for u in _users(n)):
            return None
    return _Head(hidden=hidden, weight_t=weight_t, weight_back=weight_back, target=target, tangent=nll_back.args[0],
                 first_backward=nll_back,
                 reduction=reduction, ignore_index=ignore, fwd_cast=fwd_cast, bwd_cast=bwd_cast,
                 grad_dtype=lsm_back.args[3], loss=loss, grad_hidden=grad_hidden, grad_weight=grad_weight,
                 region=region)


def _defined_before(n: fx.Node, at: fx.Node) -> bool:
    """`n` is, or can be moved to be, defined before `at`: it is, or it is a view (the input gradient's transposed
    weight) of a node that is."""
    order = {m: i for i, m in enumerate(at.graph.nodes)}
    if order[n] < order[at]:
        return True
    return (n.target is aten.t.default or n.target in _VIEWS) and isinstance(n.args[0], fx.Node) \
        and order[n.args[0]] < order[at] and all(not isinstance(a, fx.Node) for a in n.args[1:])


class _Emitter:
    """Adds aten calls to the graph with their fake values (what the training graph reads shapes from)."""

    def __init__(self, gm: fx.GraphModule, mode) -> None:
        self.graph, self.mode = gm.graph, mode

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        vals = fx.node.map_arg((args, kwargs), _val)
        with self.mode:
            out = target(*vals[0], **vals[1])
        n = self.graph.call_function(target, args, kwargs)
        n.meta["val"] = out
        return n


def chunk_count(rows: int, vocab: int, hidden: int) -> int:
    """Chunks of rows such that a chunk's logits are at most CHUNK_TO_HIDDEN times the head's input."""
    return max(1, min(rows, math.ceil(vocab / (CHUNK_TO_HIDDEN * hidden))))


def _tied_embedding_add(head: _Head) -> tuple[fx.Node, fx.Node] | None:
    """The `add` that sums the head's weight gradient (seen through an even number of transposes) with a dense
    embedding gradient (no padding index, no frequency scaling), and that embedding_dense_backward."""
    n, flips = head.grad_weight, 0
    while len(_users(n)) == 1 and _users(n)[0].target is aten.t.default:
        n, flips = _users(n)[0], flips + 1
    if flips % 2 or len(_users(n)) != 1 or _users(n)[0].target is not aten.add.Tensor:
        return None
    add = _users(n)[0]
    other = add.args[1] if add.args[0] is n else add.args[0]
    if len(add.args) != 2 or add.kwargs or not isinstance(other, fx.Node) \
            or other.target is not aten.embedding_dense_backward.default or len(_users(other)) != 1 \
            or tuple(other.args[3:5]) != (-1, False) or _val(other).dtype != _val(add).dtype:
        return None
    return add, other


def chunk_lm_head(cap: JointCapture) -> JointCapture:
    """`cap` with its language-model head and cross-entropy chunked over positions (the graph is changed in place;
    the capture returned names the new loss and gradient nodes). Unchanged when the pattern is not there or one
    chunk would do."""
    gm = cap.gm
    for nll in [n for n in gm.graph.nodes if n.target is aten.nll_loss_forward.default]:
        head = _match(nll)
        if head is None:
            continue
        rows, hid = _val(head.hidden).shape
        chunks = chunk_count(rows, _val(head.weight_t).shape[1], hid)
        if chunks > 1:
            cap = _rewrite(cap, head, math.ceil(rows / chunks))
    return cap


def _rewrite(cap: JointCapture, h: _Head, step: int) -> JointCapture:
    from torch._guards import detect_fake_mode

    gm, graph = cap.gm, cap.gm.graph
    emit = _Emitter(gm, detect_fake_mode([_val(h.hidden)]))
    rows = _val(h.hidden).shape[0]
    spans = [(r, min(r + step, rows)) for r in range(0, rows, step)]
    # Forward, where torch computed the loss.
    with graph.inserting_before(h.loss):
        lsms, targets, total, count = [], [], None, None
        for r0, r1 in spans:
            rows_c = emit(aten.slice.Tensor, h.hidden, 0, r0, r1)
            x = emit(aten.mm.default, rows_c, h.weight_t)
            if h.fwd_cast is not None:
                x = emit(_CAST, x, **h.fwd_cast)
            lsm = emit(aten._log_softmax.default, x, 1, False)
            tgt = emit(aten.slice.Tensor, h.target, 0, r0, r1)
            out = emit(aten.nll_loss_forward.default, lsm, tgt, None, 2, h.ignore_index)
            s, w = emit(operator.getitem, out, 0), emit(operator.getitem, out, 1)
            total = s if total is None else emit(aten.add.Tensor, total, s)
            count = w if count is None else emit(aten.add.Tensor, count, w)
            lsms.append((rows_c, lsm))
            targets.append(tgt)
        loss = emit(aten.div.Tensor, total, count) if h.reduction == 1 else total
    # Backward, chunk by chunk where torch's began; the tangent reads the new loss.
    h.loss.replace_all_uses_with(loss)
    order = {n: i for i, n in enumerate(graph.nodes)}
    if h.weight_back is not None and order[h.weight_back] > order[h.first_backward]:
        h.first_backward.prepend(h.weight_back)  # a view of the weight, needed by every chunk's input gradient
    with graph.inserting_before(h.first_backward):
        parts, acc = [], None
        for (rows_c, lsm), tgt in zip(lsms, targets):
            g = emit(aten.nll_loss_backward.default, h.tangent, lsm, tgt, None, h.reduction, h.ignore_index, count)
            g = emit(aten._log_softmax_backward_data.default, g, lsm, 1, h.grad_dtype)
            if h.bwd_cast is not None:
                g = emit(_CAST, g, **h.bwd_cast)
            if h.grad_hidden is not None:
                parts.append(emit(aten.mm.default, g, h.weight_back))
            if h.grad_weight is not None:
                gt = emit(aten.t.default, g)
                acc = emit(aten.mm.default, gt, rows_c) if acc is None else emit(aten.addmm.default, acc, gt, rows_c)
        grad_hidden = emit(aten.cat.default, parts, 0) if parts else None
    renamed = {}
    if grad_hidden is not None:
        h.grad_hidden.replace_all_uses_with(grad_hidden)
    if h.grad_weight is not None:
        tied = _tied_embedding_add(h)
        h.grad_weight.replace_all_uses_with(acc)
        if tied is not None:
            add, dense = tied
            grad_out, ids = dense.args[:2]
            with graph.inserting_before(add):
                idx = emit(aten.view.default, ids, [-1])
                vals = emit(aten.view.default, grad_out, [-1, _val(grad_out).shape[-1]])
                done = emit(aten.index_put.default, acc, [idx], vals, True)
                if tuple(_val(done).shape) != tuple(_val(add).shape):
                    done = emit(aten.view.default, done, list(_val(add).shape))
            add.replace_all_uses_with(done)
            renamed[add.name] = done.name
    for n in list(graph.nodes):  # shape asserts on the removed tensors go with them
        if n.target is _ASSERT and isinstance(n.args[0], fx.Node) and n.args[0] in h.region:
            graph.erase_node(n)
    graph.eliminate_dead_code()
    gm.recompile()
    grads = {renamed.get(k, k): p for k, p in cap.grads.items()}
    return replace(cap, loss=loss.name if cap.loss == h.loss.name else cap.loss, grads=grads)
