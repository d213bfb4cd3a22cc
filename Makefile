# edgetrain developer entry points. Every target is safe to rerun.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Inside the venv, so a venv deleted by hand also forgets that it was installed.
INSTALL_STAMP := $(VENV)/install.stamp
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist

APT_PACKAGES := gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm

.PHONY: venv data toolchain test demo bench bench-relaxation bench-cortex-m bench-int8-kernels bench-runtime bench-runtime-profile bench-page-handoff bench-host-costs bench-peers bench-llm-slice figures clean distclean

venv: $(INSTALL_STAMP)

# Reinstalls only when the dependencies may have changed.
$(INSTALL_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[test]'
	# torchvision's Linux wheel is built against CUDA torch: beside the CPU torch its compiled detection ops do not
	# load and its import fails registering their meta kernels (transformers and timm import it). Where that
	# happens, the venv starts with those registrations skipped; no model here uses the ops.
	$(PY) -c 'import torchvision' 2>/dev/null || $(PY) -c 'import pathlib, sys, sysconfig; \
	    pathlib.Path(sysconfig.get_paths()["purelib"], "torchvision_cpu_torch.pth").write_text(sys.argv[1] + "\n")' \
	    "import sys, types; $(foreach m,_meta_registrations _autograd_registrations,sys.modules.setdefault('torchvision.$(m)', types.ModuleType('torchvision.$(m)'));)"
	touch $@

# Fashion-MNIST comes from Debian's package (no download code in the project). Installing needs
# root; without it the data-dependent tests skip and say why.
data:
	@if [ -d $(FASHION_MNIST_DIR) ]; then \
		echo "data: Fashion-MNIST present in $(FASHION_MNIST_DIR)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends dataset-fashion-mnist; \
	else \
		echo "data: $(FASHION_MNIST_DIR) missing and not root; skipping (run: sudo apt-get install dataset-fashion-mnist)"; \
	fi

# The Cortex-M toolchain and QEMU for the C runtime's tests (about 880 MB; installed only when missing).
toolchain:
	@if command -v arm-none-eabi-gcc >/dev/null && command -v qemu-system-arm >/dev/null; then \
		echo "toolchain: arm-none-eabi-gcc and qemu-system-arm present"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(APT_PACKAGES); \
	else \
		echo "toolchain: missing and not root; the ARM tests will skip (run: sudo apt-get install $(APT_PACKAGES))"; \
	fi

test: venv data toolchain
	$(PY) -m pytest -q -n 2 tests

demo: venv
	$(VENV)/bin/edgetrain compile resnet18 --target jetson-agx-orin --budget 80% --time-limit 20 --out build/demo
	$(VENV)/bin/edgetrain run build/demo --steps 3 --check
	$(VENV)/bin/edgetrain inspect build/demo

bench: venv
	$(PY) benchmarks/solve.py

bench-relaxation: venv
	$(PY) benchmarks/relaxation.py

bench-cortex-m: venv toolchain
	$(PY) benchmarks/cortex_m.py

# int8 kernels (plain, SMLAD) against float32 on the same shapes, instructions per MAC under QEMU (M4F and M7).
bench-int8-kernels: venv toolchain
	$(PY) benchmarks/int8_kernels.py --json docs/data/int8_kernels.json

bench-runtime: venv
	$(PY) benchmarks/runtime.py

bench-runtime-profile: venv
	$(PY) benchmarks/runtime_profile.py

bench-page-handoff: venv
	$(PY) benchmarks/page_handoff.py

bench-host-costs: venv
	$(PY) benchmarks/host_costs.py

# Real peak and step time of eager, optimizer in backward, checkpointing, torch.compile and edgetrain plans
# (docs/performance.md: "Against torch's own memory savers"); meaningful on a quiet machine only.
bench-peers: venv
	$(PY) benchmarks/peers.py --json build/bench/peers.json --figures build/bench/peers

# Two decoder layers of Llama-3.2-1B's shape (LoRA, AdamW) run for real: eager, Hugging Face's gradient
# checkpointing, plans at store-all, a middle budget and the smallest (docs/llm.md). The base is float32: on a CPU
# without bf16 instructions a bf16 step takes many minutes (LLM_SLICE=llama_1b_slice for the bf16 base, STEPS=0 to
# time each configuration in its memory process instead of alternating).
LLM_SLICE ?= llama_1b_slice_fp32
STEPS ?= 3
bench-llm-slice: venv
	$(PY) benchmarks/peers.py --models $(LLM_SLICE) --optimizer adamw --target jetson-orin-nano --batch-size 1 \
		--threads 2 --methods checkpoint,edgetrain:100%,edgetrain:90%,edgetrain:min --steps $(STEPS) --warmup 1 \
		--mem-steps 3 --time-limit 60 --json docs/data/llm_slice.json

# README's and docs/ figures, redrawn from the benchmark data committed in docs/data/ (no solving, no training).
figures: venv
	$(PY) benchmarks/figures.py

clean:
	rm -rf build .pytest_cache .hypothesis *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
