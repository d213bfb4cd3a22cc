"""Solver-neutral sparse MILP models and thin adapters to solvers."""

from .model import SparseMILP, SolveResult

__all__ = ["SparseMILP", "SolveResult"]
