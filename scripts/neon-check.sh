#!/usr/bin/env bash
# The aarch64 NEON kernels (crates/kernels/src/simd/neon.rs), cross-built and unit-tested under
# user-mode emulation on an x86-64 machine (no ARM machine needed).
#
#   scripts/neon-check.sh            installs what is missing from Debian's packages (root), then
#                                    cross-builds engram-kernels for aarch64-unknown-linux-gnu and
#                                    runs tests/neon.rs (bitwise = scalar for every format) under
#                                    qemu-aarch64 (a plain main on one thread: in this machine's VM
#                                    qemu-aarch64 hangs on any thread creation, so libtest tests and
#                                    the kernel pool cannot run emulated)
#
# Debian's own Rust (rustc-web / cargo-web, which ship an aarch64 standard library as
# libstd-rust-web-dev:arm64) does the cross build, since rustup cannot fetch a target here.
# Emulated, so timings mean nothing; ~5-10 min on 2 cores. Never needed by tests or CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=aarch64-unknown-linux-gnu
if ! [ -d /usr/lib/rustlib/$target ] || ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  dpkg --add-architecture arm64
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q rustc-web cargo-web "libstd-rust-web-dev:arm64" \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
fi
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/neon}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
# The repository's target-cpu=native is the host's; the cross build targets any ARMv8-A core.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-cpu=generic"
cd "$root"
/usr/bin/cargo --version
/usr/bin/cargo test --release -p engram-kernels --target $target --test neon
