# The two commands of the README: `make demo` (the main job, on the embedded SQLite store)
# and `make test` (the whole suite, EventStoreDB adapter included, against the wire emulator).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/terret: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(BIN)/terret
	$(BIN)/terret demo

test: $(BIN)/terret
	$(BIN)/python -m pytest

lint: $(BIN)/terret
	$(BIN)/ruff check terret tests bench
	$(BIN)/mypy

bench: $(BIN)/terret
	for script in bench/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) terret-demo.db* terret-demo.views.db*
