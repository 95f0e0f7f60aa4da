# Thin wrapper over CMake. Every target first installs what is missing
# (deploy/setup.sh) and builds.
#
#   make demo    train the Fashion-MNIST example and print test accuracy
#   make demo-chaos  the same with a spare worker, killing a worker and the
#                scheduler mid-training
#   make test    build and run the whole test suite
#   make bench   build and run the benchmarks
#   make tsa     build everything with clang's thread-safety analysis
#   make asan    the unit tests under AddressSanitizer + UBSan
#   make tsan    the executor, stream and stage service tests under TSan
#   make fuzz    the libFuzzer targets, each for FUZZ_SECONDS (fuzz/)
BUILD      ?= build
TSA_BUILD  ?= build-tsa
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= $(ASAN_BUILD)
FUZZ_SECONDS ?= 60
BUILD_TYPE ?= Release
CUDA       ?= AUTO
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# GPU tests (ctest label "gpu") run only where a GPU exists.
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
CTEST_GPU := $(if $(HAVE_GPU),,-LE gpu)

.PHONY: all setup configure build test demo demo-chaos demo-lm demo-local bench tsa \
  asan tsan fuzz format clean

all: build

setup:
	@bash deploy/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DPIPETRAIN_CUDA=$(CUDA) $(CMAKE_ARGS) > $(BUILD).configure.log \
	  || (cat $(BUILD).configure.log; exit 1)
	@grep -E "pipetrain:" $(BUILD).configure.log || true

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_GPU)

# A local cluster (scheduler + 3 workers) trains Fashion-MNIST to >= 85%.
demo: build
	@BUILD=$(BUILD) bash deploy/demo.sh examples/fashion_mnist_mlp.job.json 0.85

# The demo cluster with a spare worker: a stage worker is SIGKILLed
# mid-training, later the scheduler (started again on its data directory);
# the job still reaches 85%.
demo-chaos: build
	@BUILD=$(BUILD) bash deploy/demo_chaos.sh \
	  examples/fashion_mnist_mlp.chaos.job.json 0.85

# The character-level Transformer language model on the same local cluster.
demo-lm: build
	@BUILD=$(BUILD) bash deploy/demo.sh examples/char_transformer.job.json 0

# The in-process reference trainer (one stage, no cluster).
demo-local: build
	@$(BUILD)/services/pipetrain-train \
	  --job examples/fashion_mnist_mlp.job.json --min_accuracy 0.85

# bench_wan builds network namespaces (root, /dev/net/tun, `ip netns`);
# PIPETRAIN_SKIP_NETNS=1 skips it where they are not available.
bench: build
	@for b in $(BUILD)/bench/bench_*; do echo "== $$b"; $$b || exit 1; done

# Every project target (tests and benchmarks included, CUDA off) compiled by
# clang with -Wthread-safety -Werror, in its own build directory. -O0 without
# debug info: the analysis runs in the front end, so optimizing only costs
# time.
tsa: setup
	@cmake -S . -B $(TSA_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS_DEBUG=-O0 -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DPIPETRAIN_CUDA=OFF -DPIPETRAIN_BUILD_TESTS=ON -DPIPETRAIN_BUILD_BENCH=ON \
	  -DPIPETRAIN_THREAD_SAFETY=ON $(CMAKE_ARGS) > $(TSA_BUILD).configure.log \
	  || (cat $(TSA_BUILD).configure.log; exit 1)
	@grep -E "pipetrain:" $(TSA_BUILD).configure.log || true
	@cmake --build $(TSA_BUILD) -j $(JOBS)

# The sanitizer builds: clang, CUDA and benchmarks off, each in its own
# build directory. -O1 with line tables: fast enough to run the tests, and
# reports name source lines.
SAN_CMAKE = -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -gline-tables-only" \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DPIPETRAIN_CUDA=OFF -DPIPETRAIN_BUILD_BENCH=OFF

# Every test labelled "unit" under ASan + UBSan (UBSan findings abort the
# test). The multi-process (e2e) and deployment tests are left out: they
# run in `make test`, and the code they reach is covered here in-process;
# so do the tests that train Fashion-MNIST to an accuracy (minutes under
# ASan, the same code paths as the shorter tests).
# The build also carries libFuzzer's coverage instrumentation, so that
# `make fuzz` builds only its own targets in the same directory instead of
# compiling the project a fourth time in CI.
ASAN_CMAKE = $(SAN_CMAKE) -DPIPETRAIN_BUILD_TESTS=ON \
  -DPIPETRAIN_SANITIZE=address,undefined -DPIPETRAIN_FUZZ=ON $(CMAKE_ARGS)
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  GTEST_FILTER='-*LearnsFashionMnist*'
asan: setup
	@cmake -S . -B $(ASAN_BUILD) $(ASAN_CMAKE) > $(ASAN_BUILD).configure.log \
	  || (cat $(ASAN_BUILD).configure.log; exit 1)
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS) \
	  -L unit -LE 'gpu|e2e|deploy'

# The tests of the concurrent parts under ThreadSanitizer: the stage
# mailbox, the stage executor, the stage host, the stream codec and the
# stage service (streams, control queue). Debian's abseil is not
# instrumented, so its Mutex is announced to TSan by a preloaded library
# (sanitizers/tsan_absl_sync.cc); what TSan still cannot see inside gRPC is
# suppressed, each entry with its reason (sanitizers/tsan.supp). The
# tests that train Fashion-MNIST to an accuracy are left out: they run the
# same threads as the others for minutes longer (they run in `make test`).
TSAN_TESTS = pipeline_mailbox_test pipeline_stage_executor_test \
  pipeline_stage_executor_async_test \
  pipeline_stage_host_test services_frame_codec_test \
  services_stage_service_test
tsan: setup
	@cmake -S . -B $(TSAN_BUILD) $(SAN_CMAKE) -DPIPETRAIN_BUILD_TESTS=ON \
	  -DPIPETRAIN_SANITIZE=thread $(CMAKE_ARGS) \
	  > $(TSAN_BUILD).configure.log || (cat $(TSAN_BUILD).configure.log; exit 1)
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target pt_tsan_absl_sync $(TSAN_TESTS)
	@cd $(TSAN_BUILD) && \
	  LD_PRELOAD=$(abspath $(TSAN_BUILD))/sanitizers/libpt_tsan_absl_sync.so \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(abspath sanitizers/tsan.supp)" \
	  GTEST_FILTER='-*LearnsFashionMnist*' \
	  ctest --output-on-failure -j $(JOBS) \
	  -R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))$$'

# The libFuzzer targets (fuzz/README.md) under ASan + UBSan, built in the
# `make asan` directory (only the fuzz targets and what they link), each
# run for FUZZ_SECONDS from its seed corpus; a crash, leak, timeout or
# sanitizer report fails.
fuzz: setup
	@cmake -S . -B $(FUZZ_BUILD) $(ASAN_CMAKE) > $(FUZZ_BUILD).configure.log \
	  || (cat $(FUZZ_BUILD).configure.log; exit 1)
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	@fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

format:
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(BUILD).configure.log $(TSA_BUILD) $(TSA_BUILD).configure.log \
	  $(ASAN_BUILD) $(ASAN_BUILD).configure.log $(TSAN_BUILD) \
	  $(TSAN_BUILD).configure.log
