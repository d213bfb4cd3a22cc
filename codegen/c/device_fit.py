"""Does the firmware fit the microcontroller? RAM and flash needs from the firmware's figures, and the refusal.

RAM holds the arena (activations, gradients, labels, streamed weights while they are read), the trainable
weights, their optimizer state, the driver's batch buffers (input, labels, logits), the runtime's statics
and the stack. Flash holds the code, the trainable weights' initial values (copied to RAM at reset) and the
frozen weights, which stay const there - but for those streamed from storage when flash is short.
The stack is the target's board's (targets/boards/: its link script's minimum); the code and statics are
estimates measured on the Cortex-M4F build; after a build, `check_elf` holds arm-none-eabi-size's exact
figures against the device.

Pure functions of figures: nothing here solves, builds or reads files.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgetrain.compiler.errors import DeviceFitError  # the user's error, not a solver
from edgetrain.compiler.graph.ir import DTYPE_BYTES, TrainingGraph  # bytes by dtype; the driver's buffers
from edgetrain.compiler.graph.quantize import q8_layers  # a node's int8 quantisations, a tiled prefix's included
from edgetrain.runtime.python.optim import state_names, step_counter_bytes  # the optimizer's state per parameter
from edgetrain.targets import Target
from edgetrain.targets.boards import DEFAULT_BOARD, board_of, load_board

STACK_BYTES = load_board(DEFAULT_BOARD).stack_bytes  # the default board's link script's minimum stack
RUNTIME_STATIC_BYTES = 1024  # runtime and driver statics besides the batch buffers (~0.7 KB measured, mcu_cnn)
# The code a firmware's flash holds (.text less const weights) as base + per step of its schedule: the least line
# above eight Cortex-M4F builds for mps2-an386 (33 to 674 steps: 31.7 to 71.5 KB; tests/test_device_fit.py
# holds it to fresh builds), GhostNet's 62 B a step the steepest.
CODE_BASE_BYTES = 30 * 1024  # runtime, kernels, newlib-nano and driver
CODE_PER_STEP_BYTES = 64  # the straight-line plan's calls, and its tables, per schedule step
CODE_PER_PATCH_CALL_BYTES = 56  # a patch-by-patch node's kernel calls: ~52 B each measured (mcu_mbv2_40, 64 tiles)
# an int8 one's pass zero points and requantisation tables too: ~67 B each measured (MbV2-w0.35 at 128x128, 436 calls)
CODE_PER_Q8_PATCH_CALL_BYTES = 80
# The int8 kernels (q8_*.c: the SMLAD convolutions, conversions, activations), built only into a firmware with int8
# nodes: three Cortex-M4F int8 builds ran 5,084-6,504 B over the float-only estimate (mcu_mbv2_40 whole and tiled, a
# frozen 3-conv backbone with a weight streamed)
CODE_Q8_BYTES = 6656
# int8 bias training's kernels (gradient quantisers, rescale, bias-gradient and input-gradient sums, QAS SGD), built
# only into a firmware with its node: mcu_mbv2_40's QAS build ran 1.9 KB over the estimate with CODE_Q8_BYTES alone
CODE_QAS_BYTES = 3072


@dataclass(frozen=True)
class FirmwareFigures:
    """What a firmware image holds, in bytes (`steps`: schedule steps, which set the plan's code size)."""

    arena_bytes: int = 0
    trainable_bytes: int = 0
    optimizer_bytes: int = 0
    frozen_bytes: int = 0
    io_bytes: int = 0
    steps: int = 0
    streamed_bytes: int = 0  # frozen weights kept in storage (not in flash), paged into the arena when read
    stack_bytes: int = STACK_BYTES  # the board's minimum stack
    patch_calls: int = 0  # kernel calls of float32 patch-by-patch nodes, beyond one per step
    q8_patch_calls: int = 0  # the same of int8 ones
    buffer_bytes: int = 0  # buffers (batch norm's running statistics): RAM, and their initial values in flash
    int8_code_bytes: int = 0  # the int8 kernels' code, linked in where the plan has int8 nodes (`int8_code_bytes`)

    @property
    def reserve_bytes(self) -> int:
        """RAM the firmware needs besides the training state and the arena."""
        return runtime_reserve_bytes(self.io_bytes, self.stack_bytes)

    @property
    def ram_bytes(self) -> int:
        return self.arena_bytes + self.trainable_bytes + self.optimizer_bytes + self.buffer_bytes + self.reserve_bytes

    @property
    def code_bytes(self) -> int:
        return CODE_BASE_BYTES + CODE_PER_STEP_BYTES * self.steps + CODE_PER_PATCH_CALL_BYTES * self.patch_calls \
            + CODE_PER_Q8_PATCH_CALL_BYTES * self.q8_patch_calls + self.int8_code_bytes

    @property
    def flash_bytes(self) -> int:
        return self.code_bytes + self.trainable_bytes + self.buffer_bytes + self.frozen_bytes


@dataclass(frozen=True)
class DeviceFit:
    device: str
    ram_need: int
    flash_need: int
    ram_bytes: int
    flash_bytes: int | None
    message: str | None  # None: it fits

    @property
    def fits(self) -> bool:
        return self.message is None

    def to_json(self) -> dict:
        return {"device": self.device, "ram_need_bytes": self.ram_need, "ram_bytes": self.ram_bytes,
                "flash_need_bytes": self.flash_need, "flash_bytes": self.flash_bytes, "fits": self.fits}


def batch_buffer_bytes(graph: TrainingGraph, input_from_storage: bool = False) -> int:
    """The batch buffers a firmware's driver keeps besides the arena: the input (none when the plan reads it from
    storage patch by patch - its node holds 0 B - or `input_from_storage` says it will), the labels and the
    logits."""
    loss = graph.nodes[graph.loss_stage]
    first = loss.inputs[0].name if loss.inputs else None
    return sum(n.bytes for n in graph.nodes if (n.kind == "input" and not input_from_storage) or n.kind == "labels"
               or n.name == first)


def runtime_reserve_bytes(io_bytes: int = 0, stack_bytes: int = STACK_BYTES) -> int:
    return stack_bytes + RUNTIME_STATIC_BYTES + io_bytes


def board_stack_bytes(target) -> int:
    """The minimum stack of the board `target`'s firmware is built for."""
    return board_of(target).stack_bytes


def applies(target) -> bool:
    """Device limits hold for microcontrollers: the firmware is all that runs there."""
    return target.is_mcu


def device_budget(target, io_bytes: int = 0) -> int | None:
    """`--budget auto`: the RAM a microcontroller's firmware links to (`linked_ram_bytes`) less what the runtime
    keeps, left for the training state and the arena; None elsewhere."""
    if not applies(target):
        return None
    return linked_ram_bytes(target) - runtime_reserve_bytes(io_bytes, board_stack_bytes(target))


def linked_ram_bytes(target) -> int:
    """The RAM a firmware for `target` can use: its profile's, or less where its board's link script gives less
    (a QEMU board linked to a smaller chip's memory map). The one figure the budget, the fit and the size check
    hold a firmware to."""
    return min(target.ram_bytes, board_of(target).ram_bytes)


def linked_flash_bytes(target) -> int | None:
    """The flash a firmware for `target` can fill: its profile's, or less where its board's link script gives less."""
    flash = getattr(target, "flash_bytes", None)
    return None if flash is None else min(flash, board_of(target).flash_bytes)


def board_limit(target) -> str | None:
    """Why a firmware for `target` has less RAM than its profile says, in words; None where it has all of it."""
    board = board_of(target)
    if board.ram_bytes >= target.ram_bytes:
        return None
    return (f"{target.name}'s profile gives {_kb(target.ram_bytes)} of RAM, but its firmware is built for board "
            f"`{board.name}`, whose link script gives the image {_kb(board.ram_bytes)} (the {board.memory_map}'s "
            f"memory map, targets/boards/{board.name}.toml)")


def optimizer_state_bytes(config: dict, trainable_bytes: int, trainable_count: int) -> int:
    return len(state_names(config)) * trainable_bytes + step_counter_bytes(config) * trainable_count


def _kb(n: int) -> str:
    return f"{n} B ({n / 1024:.1f} KB)"


def device_fit(fig: FirmwareFigures, target, what: str = "the firmware") -> DeviceFit:
    """RAM and flash needs of `fig` against `target`; the message says what is over and what would fit."""
    ram, flash = linked_ram_bytes(target), linked_flash_bytes(target)
    over = []
    if fig.ram_bytes > ram:
        parts = [f"arena {fig.arena_bytes} B"] if fig.arena_bytes else []
        parts += [f"trainable weights {fig.trainable_bytes} B", f"optimizer state {fig.optimizer_bytes} B",
                  f"stack, runtime and batch buffers {fig.reserve_bytes} B"]
        room = ram - fig.reserve_bytes - fig.arena_bytes
        per = (fig.trainable_bytes + fig.optimizer_bytes) / fig.trainable_bytes if fig.trainable_bytes else 1.0
        fixes = ["a smaller --batch-size or a lower --budget (a smaller arena of activations)"] if fig.arena_bytes else []
        fixes.append(f"freeze more with --train so that the trainable weights and their optimizer state take at most "
                     f"{room} B (about {int(room / per)} B of trainable weights)" if room > 0 else
                     "a smaller model (the stack, runtime and arena alone fill the RAM)")
        linked = f" ({board_limit(target)})" if ram < target.ram_bytes else ""
        over.append(f"RAM: needs {_kb(fig.ram_bytes)} = {' + '.join(parts)}; the device has {_kb(ram)}{linked}; "
                    f"what would fit: {'; '.join(fixes)}.")
    if flash is not None and fig.flash_bytes > flash:
        streamed = f" (and {fig.streamed_bytes} B streamed from storage)" if fig.streamed_bytes else ""
        over.append(f"Flash: needs {_kb(fig.flash_bytes)} = code about {fig.code_bytes} B + initial trainable "
                    f"weights {fig.trainable_bytes} B + frozen weights {fig.frozen_bytes} B{streamed}; the device has "
                    f"{_kb(flash)}; what would fit: a smaller model or fewer trainable parameters (--train): frozen "
                    "weights beyond the flash are streamed from storage, trainable ones are not.")
    message = f"{what} does not fit {target.name}. {' '.join(over)}" if over else None
    return DeviceFit(device=target.name, ram_need=fig.ram_bytes, flash_need=fig.flash_bytes, ram_bytes=ram,
                     flash_bytes=flash, message=message)


def flash_room_for_frozen(target, trainable_bytes: int, steps: int, buffer_bytes: int = 0,
                          int8_code: int = 0) -> int:
    """Flash left for frozen weights by the code of a `steps`-step plan (`int8_code`: its int8 kernels') and the
    trainable weights' and buffers' initial values."""
    return linked_flash_bytes(target) - FirmwareFigures(trainable_bytes=trainable_bytes, steps=steps,
                                                        buffer_bytes=buffer_bytes, int8_code_bytes=int8_code).flash_bytes


def streamed_of(frozen: dict[str, int], target, trainable_bytes: int, steps: int, ram_room: int,
                rows: dict[str, int] | None = None, buffer_bytes: int = 0) -> list[str]:
    """The frozen weights (name -> bytes) a microcontroller keeps in storage: those beyond its flash
    (compiler/graph/streaming.py's rule); none elsewhere."""
    from edgetrain.compiler.graph.streaming import choose_streamed

    if not applies(target) or target.flash_bytes is None:
        return []
    return choose_streamed(frozen, flash_room_for_frozen(target, trainable_bytes, steps, buffer_bytes), ram_room,
                           target.storage_bytes, target.name, rows)


def check_fit(fig: FirmwareFigures, target, what: str = "the firmware") -> DeviceFit:
    """device_fit, raising DeviceFitError when it does not fit a microcontroller."""
    fit = device_fit(fig, target, what)
    if applies(target) and not fit.fits:
        raise DeviceFitError(f"{fit.message} No firmware was written.")
    return fit


def figures_of_model(model, optimizer, target=None) -> FirmwareFigures:
    """The weights of a torch model as the firmware would hold them (requires_grad: trainable); no arena yet.
    With a microcontroller `target`, frozen weights beyond its flash are counted in storage."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    tb = sum(p.numel() * p.element_size() for p in trainable)
    ob = optimizer_state_bytes(optimizer.to_json(), tb, len(trainable))
    frozen = {k: p.numel() * p.element_size() for k, p in model.named_parameters() if not p.requires_grad}
    bb = sum(b.numel() * b.element_size() for b in model.buffers())
    stack = board_stack_bytes(target) if target is not None else STACK_BYTES
    # Before tracing, any frozen conv weight may turn out to be read by forward convolutions alone: by blocks.
    rows = {k: p[0].numel() * p.element_size() for k, p in model.named_parameters() if not p.requires_grad and p.dim() == 4}
    streamed = streamed_of(frozen, target, tb, 0, linked_ram_bytes(target) - runtime_reserve_bytes(0, stack) - tb - ob
                           - bb, rows, bb) if target is not None else []
    kept = sum(b for k, b in frozen.items() if k not in streamed)
    return FirmwareFigures(trainable_bytes=tb, frozen_bytes=kept, optimizer_bytes=ob,
                           streamed_bytes=sum(frozen.values()) - kept, stack_bytes=stack, buffer_bytes=bb)


def check_model_fits(model, target, optimizer, name: str = "the model") -> None:
    """Refuse, before any tracing, a model whose weights and optimizer state alone overflow the device."""
    if applies(target):
        check_fit(figures_of_model(model, optimizer, target), target,
                  f"{name} (its weights and optimizer state alone)")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def int8_code_bytes(node_attrs) -> int:
    """The int8 kernels' code a firmware links (`node_attrs`: every node's attrs): CODE_Q8_BYTES where any node
    computes in int8 (a tiled int8 prefix included), and CODE_QAS_BYTES more where its int8 biases train."""
    attrs = list(node_attrs)
    if not any(q8_layers(a) or "qas" in a for a in attrs):
        return 0
    return CODE_Q8_BYTES + (CODE_QAS_BYTES if any("qas" in a for a in attrs) else 0)


def q8_table_bytes(node_attrs) -> int:
    """The flash an int8 prefix's requantisation tables take: a Q31 multiplier and a shift (int32 each) per output
    channel of each convolution (`node_attrs`: every node's attrs), and int8 bias training's rescale tables and
    bias scales (graph/qas_lower.py)."""
    attrs = list(node_attrs)
    return sum(8 * len(q["mult"]) for a in attrs for q in q8_layers(a) if "mult" in q) \
        + sum(a["qas"]["table_bytes"] for a in attrs if "qas" in a)


def figures_of_firmware(schedule: dict, manifest: dict) -> FirmwareFigures:
    """The figures of a rendered firmware: its arena and batch buffers (firmware.json), its weights (schedule)."""
    g = schedule["graph"]
    trainable = set(g.get("trainable", g["params"]))
    streamed = {p for n in g["nodes"] for p in n.get("streamed", ())}
    sizes = {k: DTYPE_BYTES[v.get("dtype", "float32")] * _numel(v["shape"]) for k, v in g["params"].items()}
    # an int8 prefix's convolutions: a Q31 multiplier and a shift (int32 each) per output channel, in flash
    tables = q8_table_bytes(n["attrs"] for n in g["nodes"])
    tb = sum(b for k, b in sizes.items() if k in trainable)
    io = batch_buffer_bytes(TrainingGraph.from_json(g))  # x (unless read from storage), int32 labels, logits
    return FirmwareFigures(arena_bytes=manifest["arena_bytes"], trainable_bytes=tb,
                           optimizer_bytes=optimizer_state_bytes(g["optimizer"], tb, len(trainable)),
                           frozen_bytes=tables + sum(b for k, b in sizes.items()
                                                     if k not in trainable and k not in streamed),
                           io_bytes=io, steps=len(schedule["steps"]),
                           streamed_bytes=sum(sizes[k] for k in streamed), patch_calls=manifest.get("patch_calls", 0),
                           q8_patch_calls=manifest.get("q8_patch_calls", 0),
                           int8_code_bytes=int8_code_bytes(n["attrs"] for n in g["nodes"]),
                           stack_bytes=board_stack_bytes(Target(**schedule["target"])),
                           buffer_bytes=sum((8 if v["dtype"] == "int64" else 4) * _numel(v["shape"])
                                            for v in g.get("buffers", {}).values()))


def check_elf(sizes: dict, target) -> str | None:
    """arm-none-eabi-size's text/data/bss of a build against the device: a message when it does not fit."""
    flash_need = sizes["text_bytes"] + sizes["data_bytes"]
    stack = board_stack_bytes(target)
    ram_need = sizes["data_bytes"] + sizes["bss_bytes"] + stack
    ram, flash = linked_ram_bytes(target), linked_flash_bytes(target)
    over = []
    if ram_need > ram:
        over.append(f"RAM: .data {sizes['data_bytes']} B + .bss {sizes['bss_bytes']} B + stack {stack} B = "
                    f"{ram_need} B, over the {ram} B of {target.name}")
    if flash is not None and flash_need > flash:
        over.append(f"flash: .text {sizes['text_bytes']} B + .data {sizes['data_bytes']} B = {flash_need} B, over "
                    f"the {flash} B of {target.name}")
    if not over:
        return None
    return (f"the built firmware does not fit {target.name}: {'; '.join(over)}. Recompile with a lower --budget, "
            "a smaller --batch-size or fewer trainable parameters (--train)")
