# Thin wrapper over CMake. Every target first installs what is missing
# (deploy/setup.sh) and builds.
#
#   make demo    train the Fashion-MNIST example and print test accuracy
#   make test    build and run the whole test suite
#   make bench   build and run the benchmarks
#   make tsa     build everything with clang's thread-safety analysis
BUILD      ?= build
TSA_BUILD  ?= build-tsa
BUILD_TYPE ?= Release
CUDA       ?= AUTO
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# GPU tests (ctest label "gpu") run only where a GPU exists.
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
CTEST_GPU := $(if $(HAVE_GPU),,-LE gpu)

.PHONY: all setup configure build test demo demo-lm demo-local bench tsa format clean

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

# The character-level Transformer language model on the same local cluster.
demo-lm: build
	@BUILD=$(BUILD) bash deploy/demo.sh examples/char_transformer.job.json 0

# The in-process reference trainer (one stage, no cluster).
demo-local: build
	@$(BUILD)/services/pipetrain-train \
	  --job examples/fashion_mnist_mlp.job.json --min_accuracy 0.85

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

format:
	@git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD) $(BUILD).configure.log $(TSA_BUILD) $(TSA_BUILD).configure.log
