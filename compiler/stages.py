"""What the compile passes hand each other (compiler/passes.py): one dataclass per stage, in pipeline order."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .graph.ir import OptimizerConfig, TrainingGraph
from .graph.liveness import Liveness
from .scheduling.budget import Anchors, Budget
from .scheduling.schedulers import Scheduled


@dataclass
class CompileOptions:
    model: str
    target: str
    budget: str
    out: str
    scheduler: str = "poet"
    deadline: str | None = None
    batch_size: int = 8
    input_shape: tuple[int, ...] | None = None
    time_limit: float = 60.0
    solver: str = "auto"  # MILP backend: auto (Gurobi with a full license, else HiGHS), highs, gurobi, scipy, cpsat
    loss: str = "cross_entropy"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    seed: int = 0
    model_kwargs: dict = field(default_factory=dict)
    emit: str = "python"  # the backend the plan is generated for (codegen/backends.py): "python" or "c"
    lns: float = 0.0  # share of time_limit for neighbourhood search when its first 20% does not prove the gap
    cuts: float = 0.0  # most share of time_limit for window and memory cuts before the last solve (with lns)
    overlap_paging: bool = True  # Python plans: read ahead, write behind, within the peak (scheduling/overlap.py)
    repeats: str = "auto"  # repeated blocks: auto | flat | reuse (scheduling/repeats.py)
    fuse: bool = False  # `--fuse`: pointwise chains as generated kernels (graph/fuse_chains.py); False: exact plans
    train: str | None = None  # `--train`: which parameters train (compiler/frontend/train_select.py); None: the model's flags
    quantize_frozen: str | None = None  # `--quantize-frozen int8`: the frozen prefix in int8 (graph/quantize.py)
    int8_biases: bool = False  # `--int8-biases`: the int8 region's trained biases by QAS (graph/qas_lower.py)
    calibrate: str = "random"  # `--calibrate`: the batches the int8 prefix's ranges are measured on
    # (input shape, seed, count) -> that many input batches of `calibrate`'s dataset; None: standard normal
    calibration: Callable | None = None
    # a CNN head's output-channel blocks (frontend/channel_blocks.py): 0 as the device needs (compile's choice), 1 none
    head_blocks: int = 0


@dataclass(frozen=True)
class Request:
    """A compile as asked: the options, the parsed budget, the target profile as loaded, the backend chosen
    by --emit (codegen/backend.py), the staging folder every output goes to (output_dir.StagedOutput), and
    the progress callback."""

    opts: CompileOptions
    budget: Budget
    profile: object  # targets.Target, as loaded; the target the plan is solved for is Measured.target
    backend: object  # codegen.backend.Backend
    stage: object
    progress: Callable[[str], None] | None = None
    phases: dict = field(default_factory=dict)  # pass -> seconds it took (passes.run_passes fills it)

    @property
    def work(self) -> str:
        return str(self.stage.path)

    def say(self, message: str) -> None:
        if self.progress:
            self.progress(message)


@dataclass(frozen=True)
class Traced:
    """The model traced into its training graph, lowered for the backend, its frozen weights placed by the
    rule, costed on the profile (`measured_s`: node seconds profiled here, for a measured target)."""

    resolved: object  # frontend.modelspec.Resolved
    model: object  # the torch module, in training mode, holding the initial weights
    graph: TrainingGraph
    measured_s: dict[str, float] | None = None
    int8: dict | None = None  # the int8 prefix made (`--quantize-frozen`): its nodes and its calibration, in words
    head_blocks: str | None = None  # CNN heads computed in output-channel blocks (frontend/channel_blocks.py), in words


@dataclass(frozen=True)
class Measured:
    """`target`: the target the plan is solved for and records: the profile, with its paging figures measured
    at this graph's sizes when the profile is a measured one (the host)."""

    traced: Traced
    target: object


@dataclass(frozen=True)
class Budgeted:
    """The budget in bytes, from the anchors of the traced graph (and the device's RAM for `auto`)."""

    measured: Measured
    liveness: Liveness
    anchor: Anchors
    budget_bytes: int


@dataclass(frozen=True)
class Placed:
    """The graph to schedule: with the frozen weights in storage that the POET MILP chose (`streaming`: what
    the rule and the MILP chose; None when nothing streams), and its liveness and anchors."""

    budgeted: Budgeted
    graph: TrainingGraph
    liveness: Liveness
    anchor: Anchors
    streaming: dict | None = None


@dataclass(frozen=True)
class Selected:
    """What trains (`selection`: compile's summary of the `--train` selection, and the anchors of the same
    model with every parameter trained when some are frozen)."""

    placed: Placed
    selection: dict


@dataclass(frozen=True)
class Rendered:
    """The schedule solved and the plan written: the schedule file's body (its outputs not yet recorded), the
    solve, the deadline it was solved for, and what the backend wrote (codegen.backend.Rendered)."""

    selected: Selected
    body: dict
    result: Scheduled
    deadline_s: float | None
    output: object


@dataclass(frozen=True)
class Compiled:
    """The staging folder complete, schedule.json last (it records every other file's sha256)."""

    rendered: Rendered
