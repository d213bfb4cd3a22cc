"""Kernels of the ops transformers need (embedding, layer norm, GELU, tanh, softmax, attention, matmul,
slicing, broadcast, copies), on the same aten ops autograd uses, so results match it bit for bit.

An op with several differentiable inputs (attention, matmul) has one backward kernel that returns their
gradients as a tuple; the plan reads each through an ("item", k) view.
"""
from __future__ import annotations

import torch

from .kernel_api import KernelResult, grad_mask, aten


def _fresh(t, *operands):
    """`t`, copied if it shares memory with an operand (a kernel's output must own its memory)."""
    ptr = t.untyped_storage().data_ptr()
    if any(o.untyped_storage().data_ptr() == ptr for o in operands):
        return t.clone()
    return t


# -- embedding ----------------------------------------------------------------------------------------

def embedding(ctx, inputs, params, attrs):
    (ids,) = inputs
    return KernelResult(aten.embedding(params[0], ids, int(attrs["padding_idx"]), False, False))


def embedding_bwd(ctx, inputs, params, attrs):
    """EmbeddingBackward0 on a dense weight: embedding_dense_backward (no gradient for the ids)."""
    gy, ids = inputs
    gw = aten.embedding_dense_backward(gy, ids, params[0].shape[0], int(attrs["padding_idx"]), False)
    return KernelResult(None, grads=[gw])


def arange(ctx, inputs, params, attrs):
    return KernelResult(torch.arange(int(attrs["start"]), int(attrs["end"]), int(attrs["step"]),
                                     dtype=torch.int64, device=ctx.device))


# -- normalisation and activations --------------------------------------------------------------------

def layer_norm(ctx, inputs, params, attrs):
    (x,) = inputs
    out, mean, rstd = aten.native_layer_norm(x, list(attrs["normalized_shape"]), params[0], params[1],
                                             float(attrs["eps"]))
    return KernelResult(out, aux=(mean, rstd))


def layer_norm_bwd(ctx, inputs, params, attrs):
    gy, x = inputs
    if ctx.aux is None:
        raise ValueError("layer_norm_bwd needs the aux (mean, rstd) of its forward node")
    mean, rstd = ctx.aux
    gx, gw, gb = aten.native_layer_norm_backward(gy, x, list(attrs["normalized_shape"]), mean, rstd, params[0],
                                                 params[1], [grad_mask(attrs), True, True])
    return KernelResult(gx, grads=[gw, gb])


def gelu(ctx, inputs, params, attrs):
    return KernelResult(aten.gelu(inputs[0], approximate=attrs["approximate"]))


def gelu_bwd(ctx, inputs, params, attrs):
    gy, x = inputs
    return KernelResult(aten.gelu_backward(gy, x, approximate=attrs["approximate"]))


def tanh(ctx, inputs, params, attrs):
    return KernelResult(aten.tanh(inputs[0]))


def tanh_bwd(ctx, inputs, params, attrs):
    gy, y = inputs
    return KernelResult(aten.tanh_backward(gy, y))


def softmax(ctx, inputs, params, attrs):
    return KernelResult(aten._softmax(inputs[0], int(attrs["dim"]), False))


def softmax_bwd(ctx, inputs, params, attrs):
    gy, y = inputs
    return KernelResult(aten._softmax_backward_data(gy, y, int(attrs["dim"]), y.dtype))


# -- attention and matmul -----------------------------------------------------------------------------

def sdpa(ctx, inputs, params, attrs):
    """F.scaled_dot_product_attention as autograd runs it on CPU (the flash kernel): out, and its logsumexp."""
    q, k, v = inputs
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, bool(attrs["is_causal"]),
                                                                scale=attrs.get("scale"))
    return KernelResult(out, aux=(lse,))


def sdpa_bwd(ctx, inputs, params, attrs):
    gy, q, k, v, out = inputs
    if ctx.aux is None:
        raise ValueError("sdpa_bwd needs the aux (logsumexp) of its forward node")
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        gy, q, k, v, out, ctx.aux[0], 0.0, bool(attrs["is_causal"]), scale=attrs.get("scale"))
    return KernelResult(tuple(grads))


def matmul(ctx, inputs, params, attrs):
    a, b = inputs
    return KernelResult(_fresh(aten.matmul(a, b), a, b))


def _like(operand, grad):
    """`grad` in `operand`'s memory layout (empty_like keeps a permuted layout), so the plan's views that
    take it back to the operand's base tensor stay views; the kernel's own result is scratch."""
    out = torch.empty_like(operand)
    out.copy_(grad)
    return out


def matmul_bwd(ctx, inputs, params, attrs):
    """torch.matmul of two equal-rank operands is mm (2-D) or bmm over the flattened batch dims; these are
    autograd's MmBackward0/BmmBackward0 formulas on the operands matmul reshaped."""
    gy, a, b = inputs
    if a.dim() == 2:
        ga, gb = gy.mm(b.t()), a.t().mm(gy)
    else:
        a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
        g3 = gy.reshape(-1, *gy.shape[-2:])
        ga, gb = g3.bmm(b3.transpose(1, 2)).view(a.shape), a3.transpose(1, 2).bmm(g3).view(b.shape)
    return KernelResult((_like(a, ga), _like(b, gb)), scratch=[ga, gb])


def scale(ctx, inputs, params, attrs):
    """x * c (or x / c): a scalar multiple, as aten.mul/div with a wrapped number."""
    (x,) = inputs
    c = float(attrs["value"])
    return KernelResult(x / c if attrs["divide"] else x * c)


def scale_bwd(ctx, inputs, params, attrs):
    (gy,) = inputs
    c = float(attrs["value"])
    return KernelResult(gy / c if attrs["divide"] else gy * c)


# -- slicing, broadcasting, copies --------------------------------------------------------------------

def _index(spec) -> tuple:
    return tuple(slice(None) if e[0] == "all" else int(e[1]) if e[0] == "int" else slice(int(e[1]), int(e[2]))
                 for e in spec)


def slice_op(ctx, inputs, params, attrs):
    """x[index] (ints and unit-step slices), copied into its own memory."""
    return KernelResult(inputs[0][_index(attrs["index"])].clone(memory_format=torch.contiguous_format))


def slice_bwd(ctx, inputs, params, attrs):
    """select_backward / slice_backward: zeros of the input's shape with the gradient written in place."""
    (gy,) = inputs
    gx = gy.new_zeros(attrs["input_shape"])
    gx[_index(attrs["index"])] = gy
    return KernelResult(gx)


def expand(ctx, inputs, params, attrs):
    """A broadcast operand made a tensor of its own (the other operand of the add reads it at full shape)."""
    return KernelResult(inputs[0].expand(tuple(attrs["shape"])).clone(memory_format=torch.contiguous_format))


def expand_bwd(ctx, inputs, params, attrs):
    """at::sum_to, as autograd reduces a broadcast operand's gradient."""
    (gy,) = inputs
    return KernelResult(gy.sum_to_size(tuple(attrs["input_shape"])))


def _chain(t, chain):
    for v in chain:
        if v[0] == "reshape":
            t = t.reshape(tuple(v[1]))
        elif v[0] == "permute":
            t = t.permute(*[int(d) for d in v[1]])
        else:
            raise ValueError(f"copy: unsupported view {v!r}")
    return t


def copy(ctx, inputs, params, attrs):
    """Where torch copies (`.contiguous()` or a reshape of a permuted tensor): the views, then a copy."""
    x = inputs[0]
    return KernelResult(_fresh(_chain(x, attrs["view"]).contiguous(), x))


def copy_bwd(ctx, inputs, params, attrs):
    """The gradient seen back through the views (reshape copying where autograd's does), contiguous."""
    (gy,) = inputs
    gx = _chain(gy, attrs["grad_view"]).contiguous()
    return KernelResult(_fresh(gx, gy))


TRANSFORMER_KERNELS = {f.__name__: f for f in (
    embedding, embedding_bwd, arange, layer_norm, layer_norm_bwd, gelu, gelu_bwd, tanh, tanh_bwd, softmax,
    softmax_bwd, sdpa, sdpa_bwd, matmul, matmul_bwd, scale, scale_bwd, slice_bwd, expand, expand_bwd, copy,
    copy_bwd,
)}
TRANSFORMER_KERNELS["slice"] = slice_op
