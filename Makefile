# Two commands for a fresh Debian 12 machine: `make run` and `make test`.
# No "Entering directory" lines from a build inside (a build folder configured for make).
MAKEFLAGS += --no-print-directory
# A new build folder is configured for Ninja (scripts/setup.sh installs it): unlike CMake's
# Makefiles, it compiles a target's files while the libraries it links are still being built, so
# both cores stay busy down the module chain (docs/testing.md §6). A folder configured before keeps
# the generator it has.
generator = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
DEMO := $(BUILD)/tests/demo-model

.PHONY: setup setup-test build run test bench asan clean format format-check train train-test train-export install quiet-build

# `make run` and `make install` need only what builds the programs; the tests, benchmarks and
# their oracles (GoogleTest, Chromium, Node.js, ...) come with `make build` / `make test`.
setup:
	@bash scripts/setup.sh

setup-test:
	@bash scripts/setup.sh --test

# Everything: programs, tests and benchmarks.
FULL_FLAGS := -DK3_BUILD_TESTS=ON -DK3_BUILD_BENCH=ON
build: setup-test
	@cmake -S . -B $(BUILD) $(call generator,$(BUILD)) $(CMAKE_FLAGS) $(FULL_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# kimi_k3, coli, k3_synth, k3_repack, k3_bench into $(PREFIX)/bin and the built-in model into
# $(PREFIX)/share/kimi_k3/k3-mini (coli's default model once the source tree is gone).
PREFIX ?= /usr/local
install: setup
	@cmake -S . -B $(BUILD) $(call generator,$(BUILD)) $(CMAKE_FLAGS) $(RUN_FLAGS) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target kimi_k3 coli k3_synth k3_repack $(if $(filter ON,$(BENCH_IN_CACHE)),k3_bench)
	@cmake --install $(BUILD) >/dev/null
	@echo "installed kimi_k3, coli, k3_synth, k3_repack, k3_bench in $(PREFIX)/bin; the built-in model in $(PREFIX)/share/kimi_k3/k3-mini"

# The trained tiny K3 (tools/train/, committed): the model of `make run` and coli's default.
MINI := assets/k3-mini
# The random-weights demo checkpoint (real vocabulary and tokenizer) that the build writes for the
# tests (tests/CMakeLists.txt, k3_test_demo_model); the routing benchmark uses it as the contrast
# to trained routers.
$(DEMO)/config.json: | build
	@cmake --build $(BUILD) --target k3_test_demo_model

# One chat turn, thinking on, in the model's training distribution (tools/train/README.md: the
# synthetic chats); it stops by itself at <|end_of_msg|> (--ngen is only a cap).
# `make run` builds kimi_k3 alone. A fresh build folder is configured without the tests and
# benchmarks (their packages are not installed by `make run`); one that `make build` / `make test`
# configured keeps them. The build's own lines, less make's "Built target" list or Ninja's glob
# re-check and "no work to do" (all that an up-to-date build prints); compile progress and errors
# still show, and the exit status is kept.
BENCH_IN_CACHE = $(shell sed -n 's/^K3_BUILD_BENCH:BOOL=//p' $(BUILD)/CMakeCache.txt 2>/dev/null)
RUN_FLAGS = $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DK3_BUILD_TESTS=OFF -DK3_BUILD_BENCH=OFF)
quiet-build: setup
	@cmake -S . -B $(BUILD) $(call generator,$(BUILD)) $(CMAKE_FLAGS) $(RUN_FLAGS) >/dev/null
	@{ cmake --build $(BUILD) -j $(JOBS) --target kimi_k3 2>&1; echo $$? > $(BUILD)/.build-rc; } | grep -v -e '\] Built target' -e '^ninja: no work to do' -e '\] Re-checking globbed directories'; exit $$(cat $(BUILD)/.build-rc)

run: quiet-build
	@test -f $(MINI)/config.json || { echo "make run: $(MINI)/config.json is missing (the trained tiny K3 ships in the source tree)"; exit 1; }
	@echo "== kimi_k3 --chat on $(MINI): a ~11M-parameter K3-architecture model trained on the Brown corpus (it writes Brown-style English, not answers)"
	@$(BUILD)/apps/kimi_k3 $(MINI) --chat "Continue this passage: The old man walked slowly down the road toward the river. He had not been there since the war." --labels --ngen 256 --temp 0.6 --top-p 0.95 --seed 1

# The test oracles from npm (pinned in tests/node/package-lock.json), installed once.
NODE_TEST_DEPS := tests/node/node_modules/.package-lock.json
$(NODE_TEST_DEPS): tests/node/package-lock.json | setup-test
	@npm ci --prefix tests/node --ignore-scripts --no-audit --no-fund >/dev/null

# The Release build and its tests, then the sanitizer build's tests (scripts/test_passes.sh): the
# sanitizer build compiles beside the other two, in the cores' idle time (docs/testing.md §6). On an
# AVX-512 machine the suites whose outcome depends on the generated text also run with
# K3_ISA=avx2, as on an AVX2-only machine (tests/CMakeLists.txt registers those twins).
test: setup-test $(NODE_TEST_DEPS)
	@cmake -S . -B $(BUILD) $(call generator,$(BUILD)) $(CMAKE_FLAGS) $(FULL_FLAGS) >/dev/null
	@$(CONFIGURE_ASAN)
	@bash scripts/test_passes.sh test $(BUILD) $(JOBS)

# Parsers, kernels and the text front end again under AddressSanitizer + UndefinedBehaviorSanitizer
# (the npm differential fuzz drives the sanitized coli too), and the Vulkan tier's host side on
# lavapipe (scripts/test_passes.sh lists the suites).
# Debug info is line tables only (-g1): the sanitizers' reports keep every frame, inlined ones
# included, with its file and line, and GCC no longer tracks the location of every variable
# through -O1 code, which took two thirds of the SIMD kernels' compile (docs/testing.md §6).
# `make asan ASAN_DEBUG_FLAGS=-g` builds it with full debug info.
ASAN_DEBUG_FLAGS ?= -g1
CONFIGURE_ASAN = cmake -S . -B $(BUILD)-asan $(call generator,$(BUILD)-asan) -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="$(ASAN_DEBUG_FLAGS)" -DK3_SANITIZE=ON -DK3_BUILD_BENCH=OFF >/dev/null
asan: setup-test $(NODE_TEST_DEPS)
	@$(CONFIGURE_ASAN)
	@bash scripts/test_passes.sh asan $(BUILD) $(JOBS)

# Benchmarks (timings, never assertions on them): kernel GB/s vs a DRAM probe, then decode tok/s
# on a slice checkpoint (written once, ~9 GB, into $(BUILD)/bench-slice; with the released
# per-layer dimensions it is also where the last decode step is checked against a one-shot
# prefill, a check too heavy for `make test`), experts streamed from disk against the drive's
# O_DIRECT rate (a ~17 GB slice with 128 experts per layer, written once into
# $(BUILD)/bench-slice-stream), the repacked container against its snapshot (cold load, repack
# GB/s vs the drive, drive bytes per expert read; a 9.4 GB slice in $(BUILD)/bench-slice-container),
# the routing statistics of the trained tiny K3 on held-out text against the random-weights demo
# checkpoint, then tokenizer MB/s beside npm tiktoken on the same multilingual corpus. The ggml
# peer comes from npm when it can be installed; without it the bench still runs and says the peer
# is unavailable.
bench: build $(DEMO)/config.json
	@if [ ! -d bench/node_modules/@node-llama-cpp/linux-x64 ] || [ ! -d bench/node_modules/tiktoken ]; then \
	  npm ci --prefix bench --ignore-scripts --no-audit --no-fund > $(BUILD)/bench-npm.log 2>&1 \
	    || echo "bench: npm ci failed (see $(BUILD)/bench-npm.log): the ggml peer will be unavailable"; \
	fi
	@$(BUILD)/bench/k3_bench kernels
	@$(BUILD)/bench/k3_bench decode --dir $(BUILD)/bench-slice
	@$(BUILD)/bench/k3_bench stream --dir $(BUILD)/bench-slice-stream
	@$(BUILD)/bench/k3_bench container --dir $(BUILD)/bench-slice-container
	@$(BUILD)/bench/k3_bench load $(MINI) --cold
	@$(BUILD)/bench/k3_bench routing --model $(MINI) --ids tests/data/k3-mini/heldout_text.u32 --contrast $(DEMO)
	@node bench/tokenizer_bench.mjs $(BUILD)/bench/k3_tokenizer_bench tests/data/k3-release

# The trained tiny K3 in assets/k3-mini (tools/train/README.md). Not part of `make test`: it
# needs Debian's torch (scripts/setup.sh --train) and ~1.5 h on 2 cores. `make train` resumes
# from $(TRAIN_WORK)/ckpt.pt when one is there; `make train-export` rewrites assets/k3-mini and
# tests/data/k3-mini from it (then re-measure the gate: k3_bench quality --write-bounds).
TRAIN_DATA := $(BUILD)/train-data
TRAIN_WORK := $(BUILD)/train-run
TRAIN_ARGS ?= --steps 340 --batch 32 --chat-rows 12 --warmup 60 --eval-every 100 --ckpt-every 10
# jemalloc that keeps freed pages: with glibc's allocator every step re-faults GBs of logits
# and activations (half the CPU time went to the kernel).
TRAIN_ENV := MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2

$(TRAIN_DATA)/meta.json: | build
	@bash scripts/setup.sh --train
	@npm ci --prefix tools/train --ignore-scripts --no-audit --no-fund >/dev/null
	@/usr/bin/python3 tools/train/prepare_data.py --out $(TRAIN_DATA) --coli $(BUILD)/apps/coli

train: $(TRAIN_DATA)/meta.json
	@$(TRAIN_ENV) /usr/bin/python3 tools/train/train.py --data $(TRAIN_DATA) --work $(TRAIN_WORK) $(TRAIN_ARGS)

# The training tool's own tests (torch; not in `make test`).
train-test:
	@bash scripts/setup.sh --train
	@/usr/bin/python3 tools/train/test_train.py

train-export:
	@/usr/bin/python3 tools/train/export.py --work $(TRAIN_WORK) --out assets/k3-mini
	@/usr/bin/python3 tools/train/make_fixtures.py --model assets/k3-mini --data $(TRAIN_DATA) --out tests/data/k3-mini

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.h')

# Check mode over the files changed since HEAD (CI checks every file: Style.ClangFormat).
format-check:
	@bash scripts/check_format.sh --changed

clean:
	@rm -rf $(BUILD) $(BUILD)-asan
