"""edgetrain runtime: executes generated training plans. Depends on torch (and safetensors) only."""
