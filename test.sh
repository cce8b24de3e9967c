#!/usr/bin/env bash
# Runs meshfed's whole test suite on a fresh machine: formatting, lints, unit and
# integration tests of every crate. Installs whatever the tests need by itself.
set -euo pipefail
cd "$(dirname "$0")"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

# The interop tests drive real xDS clients nobody here wrote (Python grpcio's proxyless
# gRPC client). They run from a venv in .venv with tests/interop/requirements.txt,
# created on first use and refreshed when the requirements change. A MESHFED_PYTHON
# given by the caller is used as is; MESHFED_SKIP_INTEROP=1 skips those tests.
if [ -z "${MESHFED_PYTHON:-}" ] && [ "${MESHFED_SKIP_INTEROP:-}" != 1 ]; then
    requirements=tests/interop/requirements.txt
    if [ ! -x .venv/bin/python ] || ! cmp -s "$requirements" .venv/requirements.txt; then
        if ! python3 -c 'import venv, ensurepip' 2>/dev/null && command -v apt-get >/dev/null; then
            apt-get install -y -q python3-venv >/dev/null
        fi
        python3 -m venv .venv
        .venv/bin/pip install --quiet --disable-pip-version-check --only-binary=:all: \
            -r "$requirements"
        cp "$requirements" .venv/requirements.txt
    fi
    export MESHFED_PYTHON="$PWD/.venv/bin/python"
fi

cargo test --workspace --locked

# A few seconds of each fuzz target (fuzz/run.sh; MESHFED_FUZZ_SECONDS=0 skips).
if [ "${MESHFED_FUZZ_SECONDS:-5}" != 0 ]; then
    ./fuzz/run.sh
fi
