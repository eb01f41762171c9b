# boundloop: `make demo` runs the main job, `make test` runs lint, types and tests.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs pytest bench bench-peers setup src-tree clean

setup: $(STAMP) src-tree

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The package as it installs, for the tools that find modules by path (mypy,
# mkdocstrings): boundloop/'s entries and the top-level workflows/, activities/ and
# worker/, linked under .boundloop/src/boundloop/ (pyproject.toml maps them so for pip;
# an editable install maps them by an import hook these tools cannot see). Made again on
# each use, so a new module shows; never committed.
SRC_TREE := .boundloop/src/boundloop

src-tree:
	@rm -rf $(SRC_TREE) && mkdir -p $(SRC_TREE)
	@for p in boundloop/* workflows activities worker; do \
		case $$p in */__pycache__) ;; *) ln -s ../../../$$p $(SRC_TREE)/ ;; esac; done

demo: $(STAMP)
	$(BIN)/boundloop demo

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP) src-tree
	$(BIN)/mypy
	cd examples/weather_desk && MYPYPATH=../../.boundloop/src ../../$(BIN)/mypy --strict *.py

# The tests run in PYTEST_WORKERS processes (pytest-xdist; each starts its own dev server
# when a test needs one). Most of a test's time is spent waiting on a dev server, a worker
# or a CLI process, so twice the cores keeps them busy; a module whose fixtures are
# module-scoped stays on one process (tests/conftest.py). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 4

pytest: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# The documentation site, strictly: a broken link or a docstring reference fails it.
docs: $(STAMP) src-tree
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint typecheck docs pytest

bench: $(STAMP)
	$(BIN)/python -m bench.run --json bench/results.new.json
	mv bench/results.new.json bench/results.json
	$(BIN)/python -m bench.budget
	$(BIN)/python -m bench.streaming
	$(BIN)/python -m bench.load
	$(BIN)/python -m bench.long_runs
	$(BIN)/python -m bench.long_runs --context summarize

# The peers of `make bench-peers` get a venv of their own: the product's stays as it is.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/peers/requirements.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

# boundloop, bare Temporal and the peers side by side, on one dev server in one run.
bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.run --peers --json bench/results.new.json
	mv bench/results.new.json bench/results.json

clean:
	rm -rf $(VENV) $(PEERS_VENV) .boundloop
