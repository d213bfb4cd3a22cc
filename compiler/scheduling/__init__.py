"""Stage 3, scheduling: budgets, the steps a set of decisions implies and the validator that replays them,
heuristic schedulers and warm starts, the POET MILP with its cuts and phased search, and the MILP solvers."""
