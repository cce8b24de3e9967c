//! Compiles meshfed's own `.proto` files (every one under `istio/`) at build time.
//!
//! protox (a pure-Rust protobuf compiler, so no system `protoc`) parses the
//! files into a descriptor set; prost-build generates the Rust types;
//! pbjson-build generates proto3-JSON serde impls for them. Well-known types
//! (wrappers, ...) come from `pbjson-types` so they have serde support too,
//! except `google.protobuf.Duration`, which maps to the crate's own
//! `Duration` (same wire format, Go-style text form).

use std::{
    env,
    error::Error,
    fs,
    path::{Path, PathBuf},
};

use prost::Message;

/// Every `.proto` file under `dir`, relative to the crate root, sorted (so a new
/// file is compiled without being listed anywhere).
fn protos(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Box<dyn Error>> {
    for entry in fs::read_dir(root.join(dir))? {
        let name = dir.join(entry?.file_name());
        if root.join(&name).is_dir() {
            protos(root, &name, out)?;
        } else if name.extension().is_some_and(|e| e == "proto") {
            out.push(name);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=istio");
    let mut found = Vec::new();
    protos(&root, Path::new("istio"), &mut found)?;
    found.sort();
    for proto in &found {
        println!("cargo:rerun-if-changed={}", proto.display());
    }

    let files: Vec<PathBuf> = found.iter().map(|p| root.join(p)).collect();
    let fds = protox::compile(&files, [&root])?;

    // Keep the encoded descriptor set: pbjson-build reads it, and the crate
    // exports it (FILE_DESCRIPTOR_SET) for reflection-based tooling.
    let descriptor_path = out_dir.join("meshfed_api_descriptor.bin");
    let descriptor_bytes = fds.encode_to_vec();
    fs::write(&descriptor_path, &descriptor_bytes)?;

    prost_build::Config::new()
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        // Durations use the crate's own type, which reads Istio's (Go's)
        // duration syntax such as "30ms" or "5m"; see src/duration.rs.
        .extern_path(".google.protobuf.Duration", "crate::Duration")
        // Sorted maps: labels, headers etc. iterate in a stable order, so
        // generated xDS and debug dumps are deterministic.
        .btree_map(["."])
        .enable_type_names()
        .compile_fds(fds)?;

    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .btree_map(["."])
        // Like Istio, fields this crate does not model (e.g. MeshConfig's
        // defaultConfig) are skipped rather than rejected.
        .ignore_unknown_fields()
        .build(&[".istio"])?;

    Ok(())
}
