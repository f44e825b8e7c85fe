# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CDK_CLI := cdk/node_modules/.bin/cdk

.PHONY: setup demo test lint bench clean

setup: $(STAMP) $(CDK_CLI)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[package,local,serve,predict,simulate,deploy,dev]'
	touch $(STAMP)

# The pinned CDK CLI (npm, local to cdk/); only `moeless deploy` and one smoke test use it.
$(CDK_CLI): cdk/package.json cdk/package-lock.json
	npm ci --prefix cdk --no-audit --no-fund --silent
	touch $(CDK_CLI)

demo: $(STAMP)
	$(BIN)/moeless demo

test: $(STAMP) $(CDK_CLI)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/expert_runtime.py

clean:
	rm -rf $(VENV) .moeless cdk/node_modules cdk/cdk.out cdk/.staging
