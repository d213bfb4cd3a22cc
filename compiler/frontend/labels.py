"""A model's labels, from the model itself: how many classes its output scores and what a batch of labels
looks like beside it.

The class count is read from the output the model returns on the traced example (shapes only, on fake
tensors), where torch's cross-entropy reads it: dim 1 of a `(B, C, ...)` output (an image classifier's
`(B, C)`, a segmentation net's `(B, C, H, W)`, a sequence classifier over token ids' `(B, C)`), the last dim of
a token model's `(B, T, V)` (`capture.class_dim`). A `num_classes` attribute on the model overrides it (a loss
of the user's own, or fewer classes than the output scores); never more than a cross-entropy output scores.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edgetrain.compiler.errors import UnsupportedModelError

from .capture import class_dim, tensor_field


@dataclass(frozen=True)
class Labels:
    """Example labels of one batch and the class count they are drawn from (None: values, not class ids)."""

    example: torch.Tensor
    num_classes: int | None


def output_classes(out, token_ids: bool) -> tuple[int, tuple[int, ...]]:
    """(classes, labels shape with the batch) of a model output read by cross-entropy."""
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UnsupportedModelError(f"cross-entropy needs (B, C, ...) outputs; the model returns {shape}")
    if class_dim(out.dim(), token_ids) == -1:
        return int(out.shape[-1]), tuple(out.shape[:-1])
    return int(out.shape[1]), (out.shape[0], *out.shape[2:])


def _tensor_output(out):
    """The logits of a model's output: a tensor, an object with `.logits` (Hugging Face) or a tuple led by one."""
    return tensor_field(out, "logits")


def _attribute(resolved, classes: int | None, loss: str) -> int | None:
    """The model's own `num_classes`, where it has one, held against what its output scores."""
    attr = resolved.num_classes
    if attr is None:
        return classes
    if not isinstance(attr, int) or isinstance(attr, bool) or attr < 1:
        raise UnsupportedModelError(f"the model's num_classes attribute is {attr!r}; it must be a whole number "
                                    "of at least 1 (or drop it: the class count is read from the output)")
    if loss == "cross_entropy" and classes is not None and attr > classes:
        raise UnsupportedModelError(f"the model says num_classes = {attr}, but its output scores {classes} "
                                    f"classes; labels {classes}..{attr - 1} would have no score. Give its last "
                                    f"layer {attr} outputs, or drop the attribute")
    return attr


def example_labels(loss: str, seed: int, resolved, model, example: torch.Tensor) -> Labels:
    """Labels shaped as `loss` ("cross_entropy", "mse" or "model"; a user's loss takes cross-entropy's) expects
    them, and their class count: class ids (B, ...) for cross-entropy, the output's shape for mse, the model's
    `labels_shape` for a model that computes its loss (class ids below its `num_classes`, the classes of the
    logits it returns, or its vocabulary)."""
    gen = torch.Generator().manual_seed(seed + 1)
    token_ids = resolved.input_dtype == "int64"
    if loss == "model":
        labels_shape = getattr(resolved.module, "labels_shape", None)
        shape = (example.shape[0], *labels_shape) if labels_shape is not None else tuple(example.shape)
        classes = resolved.num_classes or _returned_classes(model, example, shape, token_ids) or resolved.input_high
        if not classes:
            raise UnsupportedModelError("--loss model: the class count of the labels is unknown (the model returns "
                                        "no logits beside its loss); set num_classes on the model")
        return Labels(torch.randint(0, classes, shape, generator=gen), int(classes))
    out = _tensor_output(output_like(model, example))
    if out is None:
        raise UnsupportedModelError("the model's output is not a tensor; give --loss model and have "
                                    "forward(x, y) return the loss")
    if loss == "mse":
        return Labels(torch.randn(out.shape, generator=gen), None)
    classes, shape = output_classes(out, token_ids)
    classes = _attribute(resolved, classes, loss)
    return Labels(torch.randint(0, classes, shape, generator=gen), classes)


def _returned_classes(model, example, labels_shape, token_ids: bool) -> int | None:
    """The classes of the logits a `--loss model` model returns beside its loss (a Hugging Face output's
    `.logits`), from a forward on fake tensors with class-0 labels; None when it returns none."""
    from .capture import on_fakes

    try:
        with on_fakes(model) as fake, fake, torch.no_grad():
            out = model(fake.from_tensor(example), fake.from_tensor(torch.zeros(labels_shape, dtype=torch.int64)))
    except Exception:  # the capture reports the model's own error
        return None
    logits = getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
        return None
    return output_classes(logits, token_ids)[0]


def output_like(model, example: torch.Tensor):
    """The model's output on `example`, from a forward on fake tensors (shapes only: BERT-base's real forward
    took seconds); a model that fails there runs for real, for its own error or its output."""
    from .capture import on_fakes, user_frame

    try:
        with on_fakes(model) as fake, fake, torch.no_grad():
            return model(fake.from_tensor(example))
    except Exception:
        pass
    saved = {k: b.clone() for k, b in model.named_buffers()}  # a forward in training mode moves BN statistics
    try:
        with torch.no_grad():
            return model(example)
    except Exception as e:
        raise UnsupportedModelError(f"the model cannot take an input of shape {tuple(example.shape)}{user_frame(e)}: "
                                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
                                    "Check --input-shape (C,H,W without the batch)") from None
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])
