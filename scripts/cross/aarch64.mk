# aarch64 device build. Included from the root Makefile: `include scripts/cross/aarch64.mk`.
#
#   make aarch64          every workspace binary for aarch64-unknown-linux-musl (static,
#                         cargo-zigbuild), copied to target/aarch64-unknown-linux-musl/release,
#                         with a size table
#   make aarch64-smoke    the same, then each binary's --help under qemu-aarch64
#   make aarch64-probe    the aarch64 paris-probe, fat-station and foil-control under qemu-aarch64
#                         on the real model (PASS expected; skipped without the model)
#   make aarch64-kernels  the NEON kernels' spec tests (bit identity with the scalar reference)
#                         under qemu-aarch64, -cpu cortex-a53 and -cpu max
#   make arm-proxy        ARM cost proxies (llvm-mca in-order cycle model of the hot kernel
#                         loops against llama.cpp's; qemu instruction counts per token)
#   make push-r1          adb push binaries, model and qspec to the device; adb forward stations
#                         (PUSH_FLAGS=--dry-run to print the commands only)

AARCH64_BUILD := scripts/cross/build-aarch64.sh
PUSH_FLAGS ?=

.PHONY: aarch64 aarch64-smoke aarch64-probe aarch64-kernels arm-proxy push-r1
aarch64:
	bash $(AARCH64_BUILD)

aarch64-smoke:
	bash $(AARCH64_BUILD) --smoke

aarch64-probe: aarch64
	bash scripts/cross/qemu-probe.sh

aarch64-kernels:
	bash scripts/cross/qemu-kernels.sh

arm-proxy:
	bash scripts/arm-proxy.sh

push-r1:
	bash scripts/r1/push.sh $(PUSH_FLAGS)
