"""edgetrain compiler: frontend, training-graph IR, passes, solvers, schedule format, validator, CLI."""

__version__ = "0.1.0"
