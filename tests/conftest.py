"""Shared test settings: one torch thread per test process (pytest-xdist runs two on two cores); torchvision
importable beside the CPU torch (tests/torchvision_ops.py), before anything imports transformers or timm."""
import torch

from torchvision_ops import import_torchvision_without_ops

torch.set_num_threads(1)
import_torchvision_without_ops()
