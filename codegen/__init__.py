"""Code generation: reads a schedule (never runs a solver) and renders a plan for the target's runtime."""

from .python_plan import render_python_plan, write_weights

__all__ = ["render_python_plan", "write_weights"]
