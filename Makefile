# Entry points for people and CI. Every target installs what it needs first (idempotent).
#   make run    build the kernels for every target, verify the built binaries against the lock,
#               and show this machine's dispatch plan (and load report on a GPU)
#   make test   the whole test suite (what CI runs)
#   make lock   rewrite aot-manifest.lock after an intended kernel or flag change
#   make triton regenerate the Triton modules' committed PTX and metadata (kernels/triton/generated/)
SHELL := /bin/bash
CARGO ?= cargo
RELEASE := target/release
VERIFY := $(RELEASE)/fatbin-verify verify --manifest aot-manifest.toml --lock aot-manifest.lock

.PHONY: setup build verify run test lint lock gpu-bundle clean-cache triton triton-check

setup:
	@bash scripts/setup-toolchain.sh

build: setup
	$(CARGO) build --release --workspace

verify: build
	$(VERIFY) $(RELEASE)/libaot_kernels.rlib $(RELEASE)/qwen-decode

run: verify
	@# Exit status 3 means "no CUDA device here": the plan is still printed, and that is not a failure.
	$(RELEASE)/qwen-decode kernels || [ $$? -eq 3 ]
	$(RELEASE)/qwen-decode kernels --simulate 11.0 --integrated --driver 13.0
	$(RELEASE)/qwen-decode kernels --simulate 8.7 --integrated --driver 12.8

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: setup
	$(CARGO) test --workspace --release
	$(MAKE) verify
	$(MAKE) triton-check

# Regenerating the Triton modules reproduces the committed PTX byte for byte (installs triton==3.6.0
# into .triton-venv/; no GPU needed).
triton-check: setup
	bash scripts/triton-gen.sh --check

triton: setup
	bash scripts/triton-gen.sh
	@echo "kernels/triton/generated/ rewritten; run \`make lock\` if images changed, review and commit both"

lock: setup
	AOT_UPDATE_LOCK=1 $(CARGO) build --release
	@echo "aot-manifest.lock rewritten; review \`git diff aot-manifest.lock\` and commit it"

gpu-bundle: setup
	bash scripts/gpu-bundle.sh
