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

# LocalStack's core for the tests against it (localstack/README.md): its own venv on Python 3.13,
# made on first use where this machine has one (uv installs the pinned set in seconds; pip takes
# a minute and a half). Without Python 3.13 nothing is installed and those tests skip.
LOCALSTACK_VENV := .localstack-venv
LOCALSTACK_STAMP := $(LOCALSTACK_VENV)/.installed
LOCALSTACK_PYTHON := $(shell localstack/with_localstack.sh --python)
UV_VERSION := 0.13.9

$(LOCALSTACK_STAMP): localstack/requirements.txt
ifeq ($(LOCALSTACK_PYTHON),)
	@echo "no Python 3.13 here (set LOCALSTACK_PYTHON to one): the LocalStack tests will skip"
else
	rm -rf $(LOCALSTACK_VENV)
	$(LOCALSTACK_PYTHON) -m venv $(LOCALSTACK_VENV)
	$(LOCALSTACK_VENV)/bin/pip install --quiet uv==$(UV_VERSION)
	$(LOCALSTACK_VENV)/bin/uv pip install --quiet --python $(LOCALSTACK_VENV)/bin/python --no-deps \
		-r localstack/requirements.txt
	touch $(LOCALSTACK_STAMP)
endif

demo: $(STAMP)
	$(BIN)/moeless demo

# pytest runs beside a LocalStack on 127.0.0.1, stopped at the end (also on failure).
test: $(STAMP) $(CDK_CLI) $(LOCALSTACK_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	LOCALSTACK_VENV=$(LOCALSTACK_VENV) localstack/with_localstack.sh $(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/expert_runtime.py

clean:
	rm -rf $(VENV) $(LOCALSTACK_VENV) .moeless cdk/node_modules cdk/cdk.out cdk/.staging
