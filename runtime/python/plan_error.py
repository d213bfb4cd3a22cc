"""The runtime's one error for a plan that asks what its state does not allow."""


class PlanError(RuntimeError):
    """The plan asked for something the runtime's state does not allow."""
