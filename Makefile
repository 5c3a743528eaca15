# The two commands a newcomer needs: `make up` (run Chronicle) and `make test` (run the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test lint install browser

# two distributions, both editable: chronicle-sdk (sdk/: chronicle_sdk + events) and chronicle
$(VENV)/.installed: pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ./sdk -e '.[dev]'
	touch $@

install: $(VENV)/.installed

up: install
	@$(BIN)/chronicle up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check events projections services bench chronicle_sdk sdk examples tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# the view's tests drive Debian's chromium; installed with apt-get when missing (Playwright's own
# browser download is not reachable from our machines)
browser: install
	$(BIN)/python -m tests.e2e.browser_support

test: lint browser
	$(BIN)/pytest
