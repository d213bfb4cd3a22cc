"""Stage 3, local learning (NeuroFlux): a model's locally trained layers, their auxiliary heads, their
measured memory lines, and Algorithm 1's partition into blocks under the budget.

Where every piece of local learning lives (one index; the stages stay in their own folders):

| piece | module |
|---|---|
| CLI: `compile --mode local` options, `train`, `inspect` of a local plan | `compiler/workbench/local_cli.py` |
| driver: model -> heads, memory lines, partition, schedule, plan | `compiler/pipeline_local.py` (`compile_local`) |
| layer split and AAN-LL heads (sized from the model's output classes) | `compiler/local/heads.py` |
| layers and heads as rebuildable specs | `compiler/local/spec.py`, built by `runtime/python/local_layers.py` |
| memory lines (profiler, line fits) | `compiler/local/memory_lines.py`, counted by `runtime/python/local_memory.py` |
| partition into blocks (Algorithm 1) | `compiler/local/partition.py` |
| generated plan | `codegen/local_plan.py`, `codegen/templates/local_plan.py.j2` |
| trainer (Controller/Worker, Algorithm 2) and its cache | `runtime/python/local_trainer.py`, `runtime/python/activation_cache.py` |
| `train`: data, early-exit choice | `compiler/workbench/local_train.py` (data shared with `run`: `workbench/run_data.py`) |
| export of the exit (safetensors, ONNX) | `compiler/workbench/local_export.py` |
| backprop baselines and figures | `compiler/workbench/local_baselines.py`, `compiler/workbench/local_figures.py` |

SGD's defaults (lr, momentum, weight decay) are backprop's: `compile` fills them in for both modes.
"""
