# Entry points for people and CI. Every target installs what it needs first (idempotent).
#   make run    build the kernels for every target, verify the built binaries against the lock,
#               show this machine's dispatch plan (and load report on a GPU), and decode with
#               tiny-en, the small model trained on Shakespeare in models/tiny-en (on the GPU if
#               there is one, else on the CPU reference engine)
#   make test   the whole test suite (what CI runs), the doc-link check included
#   make docs-check  every relative link and anchor of README.md and docs/ resolves; no source cites a
#               document outside the repository (scripts/check-docs.py, python3 only, no build)
#   make lock   rewrite aot-manifest.lock after an intended kernel or flag change
#   make triton regenerate the Triton modules' committed PTX and metadata (kernels/triton/generated/)
SHELL := /bin/bash
CARGO ?= cargo
RELEASE := target/release
VERIFY := $(RELEASE)/fatbin-verify verify --manifest aot-manifest.toml --lock aot-manifest.lock

.PHONY: setup build verify run test lint lock gpu-bundle clean-cache triton triton-check docs-check examples

setup:
	@bash scripts/setup-toolchain.sh

build: setup
	$(CARGO) build --release --workspace

verify: build
	$(VERIFY) $(RELEASE)/libaot_kernels.rlib $(RELEASE)/qwen-decode \
		$(RELEASE)/libaot_kernels_capi.a $(RELEASE)/libaot_kernels_capi.so

run: verify
	@# Exit status 3 means "no CUDA device here": the plan is still printed, and that is not a failure.
	$(RELEASE)/qwen-decode kernels || [ $$? -eq 3 ]
	@# Thor on JetPack 7 (CUDA 13 images), Orin on JetPack 6 and an H100 on r550 (CUDA 12 images).
	$(RELEASE)/qwen-decode kernels --simulate 11.0 --integrated --driver 13.0
	$(RELEASE)/qwen-decode kernels --simulate 8.7 --integrated --driver 12.6
	$(RELEASE)/qwen-decode kernels --simulate 9.0 --driver 12.4
	$(RELEASE)/qwen-decode run --model tiny-en --prompt $$'HAMLET:\nTo be, or not to be' --max-new-tokens 200

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --no-deps -p aot-kernels -p aot-kernels-capi

docs-check:
	python3 scripts/check-docs.py

test: docs-check setup
	$(CARGO) test --workspace --release
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --no-deps -p aot-kernels -p aot-kernels-capi
	bash scripts/check-examples.sh
	bash scripts/check-cpp-example.sh
	$(MAKE) verify
	$(MAKE) triton-check

# examples/rust-engine, an engine outside the workspace linking the backend by path, and
# examples/cpp-engine, a C++ engine on the C ABI: built, and their no-GPU and argument-error paths
# run (with a GPU, the whole checks).
examples: setup
	bash scripts/check-examples.sh
	bash scripts/check-cpp-example.sh

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
