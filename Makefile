# aeon-shell: the two everyday commands are `make demo` and `make test` (see README.md).
.PHONY: demo test build fetch golden-star bench fmt foothold-arm64 docs man completions

demo:          ## fetch + verify the model, build, admit a sliver, run the foothold capstone
	bash scripts/demo.sh

test:          ## every test, on the real models (fetched and cached first)
	bash scripts/test.sh

build:
	cargo build --release --workspace --bins

fetch:         ## the real models into ~/.cache/aeon-shell/models (AEON_MODELS_DIR)
	bash scripts/fetch-model.sh all

golden-star:   ## quality gate then the probe under a lease
	bash scripts/r1/golden-star.sh

bench:         ## decode/prefill tok/s vs llama.cpp and the memory roofline
	bash scripts/bench.sh

foothold-arm64: ## the capstone with aarch64 binaries inside an arm64 rootfs sliver (qemu)
	bash scripts/r1/foothold-arm64.sh

fmt:
	cargo fmt --all

docs:          ## man pages and bash/zsh/fish completions of every binary, from its clap definition
	cargo run --release -q -p aeon-docs -- target/docs
	@echo "man -l target/docs/man/moonshine.1; source target/docs/completions/bash/moonshine.bash"

man completions: docs

include scripts/cross/aarch64.mk
