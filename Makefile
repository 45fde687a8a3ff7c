# Two commands: `make run` (set up and start the demo gateway) and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA ?= .gateway
export GATEWAY_DATA_DIR ?= $(DATA)

.PHONY: run test coverage check format bench bench-quick install demo-model clean soak reliability-report chromium engine run-vllm

# vLLM's CPU build in a venv of its own, and a model its CPU kernels accept (backends/local_vllm.py).
ENGINE ?= .engine
ENGINE_STAMP := $(ENGINE)/.installed
export GATEWAY_VLLM_PYTHON ?= $(abspath $(ENGINE))/bin/python

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip==25.3"

$(STAMP): $(PY) pyproject.toml constraints.txt scripts/install_torch.sh
	bash scripts/install_torch.sh $(PY)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m cache.onnx_export  # the embedder's ONNX graphs (float32, int8), next to the packaged model
	touch $(STAMP)

install: $(STAMP)

demo-model: $(STAMP)
	$(PY) -m backends.worker.tiny_model $(GATEWAY_DATA_DIR)/tiny-chat

$(ENGINE_STAMP): scripts/install_engine.sh scripts/install_torch.sh
	bash scripts/install_engine.sh $(ENGINE)
	touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP) $(STAMP)
	$(PY) -m backends.worker.tiny_model --shape vllm $(GATEWAY_DATA_DIR)/tiny-vllm

# The gateway in front of a local vLLM (CPU build) that it starts and stops with itself.
run-vllm: engine
	$(VENV)/bin/gateway serve --config config/local-vllm.yaml

run: demo-model
	@echo 'Starting the demo gateway (Ctrl-C stops it). Its CLI, from this directory in another terminal:'
	@echo '  $(if $(filter-out .gateway,$(GATEWAY_DATA_DIR)),GATEWAY_DATA_DIR=$(GATEWAY_DATA_DIR) )$(VENV)/bin/gateway keys list --config config/demo.yaml'
	@echo '  (or export GATEWAY_CONFIG=config/demo.yaml and leave out --config; see "CLI reference" in README.md)'
	$(VENV)/bin/gateway serve --config config/demo.yaml

check: $(STAMP)
	$(VENV)/bin/ruff format --check gateway cache backends warmpool common tests bench scripts
	$(VENV)/bin/ruff check gateway cache backends warmpool common tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format gateway cache backends warmpool common tests bench scripts
	$(VENV)/bin/ruff check --fix gateway cache backends warmpool common tests bench scripts

# The HTML report's browser test drives Debian's Chromium (no-op when it is there).
chromium:
	bash scripts/install_chromium.sh

# The checks, the browser and the engine's venv are independent: made side by side (the
# installs wait on the network as much as on the cores), each one's output kept together.
# The suite in two processes (pytest-xdist, a module's tests on one of them), then the tests
# marked `serial` alone: those assert wall-clock bounds or run on the real engine, and a
# second test process on the two cores can break them (docs/measurements.md, "The test
# suite in two processes"). Both phases run; either failing fails the target.
# `make test TEST_WORKERS=1` runs everything in one process.
TEST_WORKERS ?= 2
test:
	$(MAKE) -j3 --output-sync=target check chromium engine
ifeq ($(TEST_WORKERS),1)
	$(VENV)/bin/pytest
else
	status=0; \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope -m 'not serial' || status=$$?; \
	$(VENV)/bin/pytest -m serial || status=$$?; \
	exit $$status
endif

# The same suite under coverage, the gateway and worker processes it starts included
# (pyproject.toml [tool.coverage.run]): slower, since every process it starts is measured.
coverage: check chromium engine
	$(VENV)/bin/pytest --cov --cov-report=term:skip-covered

BENCHES := proxy_overhead cache_quality cache_loco error_bound cache_latency cache_latency_component snapshot_write overload weight_load cold_start capacity batch_interference workload_shapes

# Every benchmark prints JSON lines; results also land in bench/results/ (git-ignored).
# A benchmark exits non-zero only when it could not measure: the others still run, and
# the target fails at the end, naming it.
bench: $(STAMP)
	mkdir -p bench/results
	failed=; for b in $(BENCHES); do $(PY) bench/$$b.py | tee bench/results/$$b.jsonl || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed" >&2; exit 1; fi

bench-quick: $(STAMP)
	mkdir -p bench/results
	failed=; for b in $(BENCHES); do $(PY) bench/$$b.py --quick | tee bench/results/$$b.jsonl || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed" >&2; exit 1; fi

# Steady mixed traffic against two replicas; SOAK_ARGS="--duration 3600" or "--quick".
soak: $(STAMP)
	$(PY) bench/soak.py $(SOAK_ARGS)

# The fault suite's cases with bigger bursts, then a short soak: a table and JSON lines.
reliability-report: $(STAMP)
	mkdir -p bench/results
	$(PY) bench/reliability.py $(RELIABILITY_ARGS) | tee bench/results/reliability.jsonl

clean:
	rm -rf $(VENV) $(ENGINE) $(DATA) .pytest_cache .mypy_cache .ruff_cache .coverage
