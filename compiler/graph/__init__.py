"""Stage 2, the training graph: the IR, the op table, forward nodes from the trace, the lowering to a
training DAG (loss, backward, optimizer updates), each node's time and energy, and every tensor's liveness."""
