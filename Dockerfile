# syntax=docker/dockerfile:1
# The meshfed server image: `docker build -t meshfed:dev .` at the repository root.
# deploy/ runs it (see the README's "Running on Kubernetes").

# Build stage: the toolchain matching this repository (Cargo.toml's rust-version is the
# minimum; 1.95 is what the project builds with). ring and jemalloc need a C compiler
# and make, which this image has; the .proto files are compiled in Rust (protox), so
# no protoc.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary is
# copied out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meshfed --bin meshfed \
    && install -D -m 0755 target/release/meshfed /out/meshfed

# Runtime stage: glibc, libgcc and CA certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/meshfed /usr/local/bin/meshfed
# Istio's uid and gid; the Deployment asks for the same.
USER 1337:1337
EXPOSE 15010 8080 15014
ENTRYPOINT ["/usr/local/bin/meshfed"]
