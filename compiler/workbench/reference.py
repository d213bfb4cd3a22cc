"""The exactness reference: the user's model trained by plain PyTorch autograd from the same weights and data.

Every random draw (an nn.Dropout's, an F.dropout call's, the dropout inside attention, a drop-path's bernoulli_)
draws what the runtime draws (same seed, step and key, frontend/random_keys.py: torch's generator for a Python
plan, the C runtime's hashed mask for firmware), and the parameters the schedule lists as trainable are the ones
with requires_grad (so a `--train` selection holds), the only changes to the model;
everything else is the model as the user wrote it, with its loss and the torch.optim optimizer the plan's updates
match.
"""
from __future__ import annotations


from contextlib import nullcontext

import torch
import torch.nn as nn
from safetensors.torch import load_file

from edgetrain.compiler.errors import EdgetrainError
from edgetrain.compiler.frontend.capture import as_export, load_loss, objective, portable_kernels
from edgetrain.compiler.frontend.random_keys import KeyedRandom
from edgetrain.compiler.frontend.modelspec import resolve
from edgetrain.runtime.python.optimizers import unit_of
from edgetrain.targets import Target


def _assign_meta(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Each meta parameter and buffer replaced by the file's tensor, under every name it has (a tied one too);
    a parameter keeps its requires_grad. load_state_dict(assign=True) skips non-persistent buffers."""
    made: dict[int, torch.Tensor] = {}
    for kind, items in (("param", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for k, t in list(items):
            if not t.is_meta:
                continue
            if id(t) not in made:
                value = tensors[f"{kind}/{k}"]
                made[id(t)] = nn.Parameter(value, requires_grad=t.requires_grad) if kind == "param" else value
            owner, _, leaf = k.rpartition(".")
            mod = model.get_submodule(owner)
            (mod._parameters if kind == "param" else mod._buffers)[leaf] = made[id(t)]


def load_weights(model: nn.Module, path: str, floats: str | None = None) -> None:
    """The plan's initial weights into the model; a tensor on the meta device (its values were in a source file,
    frontend/meta_weights.py) takes the file's tensor in its place. `floats`: a file whose tensors take the place of
    the weights file's (a Python plan's int8 prefix: the float values of the parameters it holds as integers)."""
    tensors = load_file(path)
    if floats is not None:
        tensors.update(load_file(floats))
    meta = {k for k, p in model.named_parameters() if p.is_meta} | {k for k, b in model.named_buffers() if b.is_meta}
    _assign_meta(model, tensors)
    with torch.no_grad():
        for k, p in model.named_parameters():
            if k not in meta:
                p.copy_(tensors[f"param/{k}"])
        for k, b in model.named_buffers():
            if k not in meta:
                b.copy_(tensors[f"buffer/{k}"])


def _draws(schedule: dict) -> dict[str, str]:
    """The plan's random nodes: key -> node (a node of several outputs once)."""
    return {n["attrs"]["seed_key"]: n["name"].split(".")[0] for n in schedule["graph"]["nodes"]
            if "seed_key" in n.get("attrs", {})}


def _refusal(schedule: dict, node: str, why: str) -> str:
    at = next((n.get("source") for n in schedule["graph"]["nodes"] if n["name"] == node), None)
    op = next(n["op"] for n in schedule["graph"]["nodes"] if n["name"] == node)
    return (f"--check: the plan's random op `{op}` (node {node}{f', {at}' if at else ''}) {why}, so no eager run "
            "can draw what it draws. Train without that randomness to compare (model.eval() before compiling, or "
            "its probability 0: e.g. attn_pdrop=0 / attention_probs_dropout_prob=0 in a Hugging Face config), or "
            "run without --check")


def check_draws(schedule: dict) -> None:
    """Refuse, before any training, a check whose reference cannot draw a random node's numbers: the capture's
    eager forward did not pair its draws with the graph's, and the node kept its own name as its key."""
    for key, node in _draws(schedule).items():
        if key == node:
            raise EdgetrainError(_refusal(schedule, node, "was not matched to a draw of the model's eager forward"))


def make_optimizer(params, config: dict) -> torch.optim.Optimizer:
    """The torch.optim optimizer a plan's update matches (single-tensor arithmetic, foreach=False): its unit's
    class with the unit's settings, which are that class's keyword arguments."""
    unit = unit_of(config)
    return getattr(torch.optim, unit.torch_class)(params, **unit.settings(config), foreach=False)


def _as(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)


def train_reference(schedule: dict, weights_path: str, batches: list[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device, first_step: int = 0, feed=None,
                    dtype: torch.dtype | None = None, floats: str | None = None,
                    watch=None) -> tuple[nn.Module, list[float]]:
    """The model trained by autograd on `batches`; `feed(model)`, where given, returns what is called with each
    batch's input before its step (an int8 prefix's reference hands its head the integer prefix's output);
    `dtype`: the eager run's floats where given (float64: what float32 rounding is measured against); else the
    model's own; `floats`: load_weights'; `watch`: a dispatch mode active over each step's forward
    (check_rules.NearBounds). A plan that holds its convolution weights channels-last is trained
    against eager with its weights laid out alike."""
    check_draws(schedule)
    spec = schedule["model"]
    torch.manual_seed(schedule["seed"])
    model = resolve(spec["spec"], **spec["kwargs"]).module
    load_weights(model, weights_path, floats)
    model.to(device=device, dtype=dtype).train()
    if schedule["graph"].get("memory_format") == "channels_last":
        # eager in the plan's layout: its convolutions then run the kernels the plan runs, summing in their order
        model.to(memory_format=torch.channels_last)
    clock = [schedule["seed"], first_step, {}]
    keyed, drawn = _draws(schedule), []
    graph = schedule["graph"]
    if "trainable" in graph:  # the schedule's choice (the model's flags or --train) decides what trains
        trainable = set(graph["trainable"])
        for name, p in model.named_parameters():
            p.requires_grad_(name in trainable)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], graph["optimizer"])
    loss = spec["loss"]
    user_fn = load_loss(loss) if loss not in ("cross_entropy", "mse", "model") else None
    fn = objective(loss if user_fn is None else "cross_entropy", graph.get("input_dtype") == "int64", user_fn)
    gpu = Target(**schedule["target"]).gpu
    losses = []
    before = feed(model) if feed is not None else (lambda x: None)
    for k, (x, y) in enumerate(batches):
        before(x)
        clock[1], clock[2] = first_step + k, {}
        opt.zero_grad(set_to_none=True)
        # C firmware hashes its masks; a GPU plan's attention is the kernel its graph was traced with; library code
        # takes the path it took in the trace
        with KeyedRandom(model, drawn, clock=clock, hashed=schedule.get("backend") == "c"), portable_kernels(gpu), \
                as_export(graph.get("exported", False)), (watch if watch is not None else nullcontext()):
            value = fn(model, _as(x, device, dtype), _as(y, device, dtype))
        missing = [node for key, node in keyed.items() if key not in drawn]
        if missing:  # the eager forward drew other numbers than the plan: its steps would not compare
            raise EdgetrainError(_refusal(schedule, missing[0], "has no like draw in the model's eager forward"))
        drawn.clear()
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
    return model, losses
