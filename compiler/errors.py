"""User-facing errors: each names the problem and the fix. The CLI prints them without a stack trace."""


class EdgetrainError(Exception):
    """Base class: a message meant for the user."""


class UnsupportedModelError(EdgetrainError):
    """The model uses an op, a construct or a control flow edgetrain cannot compile."""


class ModelSpecError(EdgetrainError):
    """A model was named in a way that cannot be resolved (zoo name, file.py:factory, package.module:attr)."""


class BudgetError(EdgetrainError):
    """A budget is malformed, or no schedule fits it; the message states the smallest feasible budget."""


class ArenaOverflowError(BudgetError):
    """A backend packed the schedule's tensors with gaps that put them `excess_bytes` over the budget (the
    arena's fragmentation): a schedule solved for that much less would fit."""

    def __init__(self, message: str, excess_bytes: int) -> None:
        super().__init__(message)
        self.excess_bytes = excess_bytes


class ScheduleFormatError(EdgetrainError):
    """A schedule file is corrupt, hand-edited or of another format version."""


class ValidationError(EdgetrainError):
    """A schedule breaks a rule of the memory model (operand not resident, budget exceeded, ...)."""


class OverBudgetError(ValidationError):
    """A schedule that is valid so far needs more memory than the budget: how a heuristic fails to fit."""


class InternalError(EdgetrainError):
    """edgetrain broke its own rules (its validator refused a schedule it built): a bug, not the user's input."""

    def __init__(self, what: str, cause: Exception | str):
        super().__init__(f"an edgetrain bug: {what} ({cause}). Please report it with the full command line, the "
                         "model file and this message (edgetrain --debug prints the traceback); meanwhile another "
                         "--scheduler or --budget may avoid it.")


class OutputDirError(EdgetrainError):
    """The output directory cannot be written."""


class TrainSelectionError(EdgetrainError):
    """A `--train` selection is malformed or selects nothing."""


class DeviceFitError(EdgetrainError):
    """The firmware would need more RAM or flash than the target device has; the message gives the figures."""


class Interrupted(EdgetrainError):
    """The user stopped the compile (Ctrl-C) before it had a schedule within the budget: nothing was written."""
