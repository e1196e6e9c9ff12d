# Two commands: `make run` (install + start everything on the embedded default) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8080

.PHONY: run test install install-dev lint bench-memories bench-conversations bench-conversation-search services-stop clean-data

run: $(VENV)/.installed
	$(BIN)/python manage.py up --port $(PORT)

test: $(VENV)/.installed-dev
	$(BIN)/pytest $(PYTEST_ARGS)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python requirements/base.txt $(wildcard requirements/embeddings.txt)
	$(BIN)/pip install --quiet -r requirements/base.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements/dev.txt requirements/clients.txt clients/python/pyproject.toml
	$(BIN)/pip install --quiet -r requirements/dev.txt
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
	$(BIN)/python -m config.embedded_services stop

clean-data: $(VENV)/.installed
	$(BIN)/python -m config.embedded_services reset
