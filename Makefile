# Two commands: `make run` (install + start everything on the embedded default) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8080

# torch: PyPI's Linux wheel is the CUDA build, gigabytes of nvidia-* wheels for a service that embeds on the CPU
# (a GPU worker is the exception: README, scaling). So on Linux torch is installed first, alone, with PyTorch's CPU
# wheel index as an extra source (TORCH_VARIANT=cpu, the default): its `2.13.0+cpu` sorts above PyPI's `2.13.0` and
# wins. TORCH_VARIANT=cuda keeps PyPI's CUDA build; TORCH_VARIANT=cu128 (etc.) takes PyTorch's index for that CUDA.
# A torch already installed at the pin is kept, and a local CPU wheel pip already finds (find-links) satisfies the
# pin too: the extra index only adds a source, so an offline machine still installs.
TORCH_VARIANT   ?= cpu
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/$(TORCH_VARIANT)
ifeq ($(TORCH_VARIANT),cuda)
TORCH_PIP_OPTIONS :=
else ifneq ($(shell uname -s),Linux)
TORCH_PIP_OPTIONS :=
else
TORCH_PIP_OPTIONS := --extra-index-url $(TORCH_INDEX_URL)
endif

.PHONY: run test install install-dev lint bench-memories bench-conversations bench-conversation-search services-stop clean-data torch-pip-options

# Bytecode: an environment with PYTHONDONTWRITEBYTECODE set (this project's machines have it) makes every Python
# process compile every module it imports from source, each time: 23 s instead of 11 s for a test process to start,
# and the suite starts dozens (workers, servers, Celery workers). The commands below cache bytecode under the
# virtualenv (PYTHONPYCACHEPREFIX), so the source tree stays clean and the cache goes with the virtualenv.
BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

run: $(VENV)/.installed
	$(BYTECODE) $(BIN)/python manage.py up --port $(PORT)

# Three pytest-xdist workers, a test file each at a time (module fixtures stay in one process): much of the suite
# waits on servers and workers it starts, so on two cores a third process fills the waits (2,834 tests: 305 s with two,
# 279 s with three, same machine; with tests/file_order.py 211 s with three, 204 s with four; with BYTECODE 201 s).
# TEST_WORKERS=0 runs in this process alone; at most 7 (each takes a database of the test Valkey:
# config/settings/test.py).
TEST_WORKERS ?= 3

test: $(VENV)/.installed-dev
	$(BYTECODE) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# --no-compile: pip would byte-compile every module of every package (torch and transformers hold thousands), more
# than half of a fresh install's time (135 s against 59 s on a 2-core machine); Python compiles the modules a process
# does import on first use, once, and caches them.
PIP_INSTALL := $(BIN)/pip install --quiet --no-compile

# --retries 1 on the torch step: where PyTorch's index cannot be reached (a machine with a local wheel and no route to
# it), pip's default five retries with backoff waited 9 s before taking the local wheel (13.2 s against 4.1 s).
$(VENV)/.installed: $(VENV)/bin/python requirements/base.txt requirements/embeddings.txt requirements/torch.txt
	$(PIP_INSTALL) --retries 1 --no-deps $(TORCH_PIP_OPTIONS) -r requirements/torch.txt
	$(PIP_INSTALL) -r requirements/base.txt
	touch $@

# The pip options the torch step uses (tests/core/test_install.py resolves the requirements with them).
torch-pip-options:
	@echo $(TORCH_PIP_OPTIONS)

$(VENV)/.installed-dev: $(VENV)/.installed requirements/dev.txt requirements/clients.txt clients/python/pyproject.toml
	$(PIP_INSTALL) -r requirements/dev.txt
	touch $@

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

bench-memories: $(VENV)/.installed-dev
	$(BIN)/python bench/memories.py

bench-conversations: $(VENV)/.installed-dev
	$(BIN)/python bench/conversations.py $(BENCH_ARGS)

bench-conversation-search: $(VENV)/.installed-dev
	$(BIN)/python bench/conversation_search.py $(BENCH_ARGS)

services-stop: $(VENV)/.installed
	$(BIN)/python -m apps.runtime.embedded_services stop

clean-data: $(VENV)/.installed
	$(BIN)/python -m apps.runtime.embedded_services reset
