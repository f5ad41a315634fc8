# aarch64 device build. Included from the root Makefile: `include scripts/cross/aarch64.mk`.
#
#   make aarch64          every workspace binary for aarch64-unknown-linux-musl (static,
#                         cargo-zigbuild), copied to target/aarch64-unknown-linux-musl/release,
#                         with a size table
#   make aarch64-smoke    the same, then each binary's --help under qemu-aarch64
#   make aarch64-probe    the aarch64 paris-probe, fat-station and foil-control under qemu-aarch64
#                         on the real model (PASS expected; skipped without the model)
#   make push-r1          adb push binaries, model and qspec to the device; adb forward stations
#                         (PUSH_FLAGS=--dry-run to print the commands only)

AARCH64_BUILD := scripts/cross/build-aarch64.sh
PUSH_FLAGS ?=

.PHONY: aarch64 aarch64-smoke aarch64-probe push-r1
aarch64:
	bash $(AARCH64_BUILD)

aarch64-smoke:
	bash $(AARCH64_BUILD) --smoke

aarch64-probe: aarch64
	bash scripts/cross/qemu-probe.sh

push-r1:
	bash scripts/r1/push.sh $(PUSH_FLAGS)
