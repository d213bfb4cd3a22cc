"""Shared test settings: one torch thread per test process (pytest-xdist runs two on two cores)."""
import torch

torch.set_num_threads(1)
