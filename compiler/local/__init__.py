"""Local learning (NeuroFlux, issue 5): AAN-LL heads, per-layer memory lines, the Algorithm 1 partitioner."""
