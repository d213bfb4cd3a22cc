"""The workbench: the `edgetrain` command and what it runs beside the compiler (plans on data, C firmware,
sweeps, figures, inspection, the autograd reference, datasets, local-learning training and export)."""
