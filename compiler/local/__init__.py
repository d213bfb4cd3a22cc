"""Stage 3, local learning (NeuroFlux): a model's locally trained layers, their auxiliary heads, their
measured memory lines, and Algorithm 1's partition into blocks under the budget."""
