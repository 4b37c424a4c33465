# The README's two commands: `make demo` (the main job end to end) and `make test`.
# Both create .venv and install icekeeper into it on first use; the local stack's downloads
# (Kafka jars, Apicurio Registry, Azurite, Spark/Iceberg jars) are cached in .cache/.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo lint test test-unit test-heavy bench soak stack-up stack-down prerequisites clean

demo: $(INSTALLED)
	$(BIN)/icekeeper demo

# Lint first: a long line or an unsorted import fails CI before the suite spends its minutes.
lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

test-unit: $(INSTALLED)
	$(BIN)/python -m pytest -m 'not integration and not spark'

test-heavy: $(INSTALLED)
	$(BIN)/python -m pytest -m heavy

bench: $(INSTALLED)
	$(BIN)/icekeeper bench writer --start-stack --json
	$(BIN)/icekeeper bench bookkeeper --json
	$(BIN)/icekeeper bench reaper --json
	$(BIN)/icekeeper bench e2e --start-stack --json
	$(BIN)/icekeeper bench upsert --start-stack --json

# 90 minutes of the whole pipeline (reaper included): memory and commit latency every 10 minutes,
# which must level off once the bookkeeper's kept history (an hour) is full. Not in `make bench`.
soak: $(INSTALLED)
	$(BIN)/icekeeper bench soak --start-stack --minutes 90 --json

stack-up: $(INSTALLED)
	$(BIN)/icekeeper stack up

stack-down: $(INSTALLED)
	$(BIN)/icekeeper stack down

prerequisites:
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "icekeeper needs Python 3.11, found " + sys.version' \
		|| { echo "set PYTHON=/path/to/python3.11"; exit 1; }
	@command -v java >/dev/null || { echo "Java 17+ is needed (and 21+ for the schema registry)"; exit 1; }
	@command -v mvn >/dev/null || { echo "Maven is needed to fetch Kafka and Spark jars"; exit 1; }
	@command -v npm >/dev/null || { echo "Node.js with npm is needed to install Azurite"; exit 1; }

$(INSTALLED): pyproject.toml | prerequisites
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

clean:
	-$(BIN)/icekeeper stack down
	rm -rf .icekeeper
