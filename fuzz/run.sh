#!/usr/bin/env bash
# Runs every fuzz target for a few seconds (MESHFED_FUZZ_SECONDS, default 5) starting
# from the committed corpus in fuzz/corpus/<target>. New inputs go to a scratch
# directory, so the committed corpus only changes when someone merges them in on
# purpose (`cargo fuzz cmin`). A crash fails the run and leaves its input in
# fuzz/artifacts/<target>/.
#
# Needs cargo-fuzz (installed here from crates.io if missing). Builds without a
# sanitizer (`-s none`), which works on the stable toolchain; for a long local run with
# AddressSanitizer use `cargo +nightly fuzz run <target>`.
set -euo pipefail
cd "$(dirname "$0")"

seconds="${MESHFED_FUZZ_SECONDS:-5}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi

targets=(ads_request node mock_file config_file mesh_config)
cargo fuzz build -s none --release
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    echo "fuzzing $target for ${seconds}s"
    if ! cargo fuzz run -s none --release "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$seconds" >"$scratch/$target.log" 2>&1; then
        tail -n 40 "$scratch/$target.log" >&2
        echo "fuzz target $target failed; the input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^Done' "$scratch/$target.log" || true
done
