//! Compiles `proto/nacos_grpc_service.proto` (Nacos 2.x's Payload envelope and its two
//! gRPC services) with protox (no system `protoc`) and prost-build. Only the messages
//! are generated; the calls are made with tonic's generic client and server.

use std::{env, error::Error, path::PathBuf};

fn main() -> Result<(), Box<dyn Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto");
    let proto = root.join("proto/nacos_grpc_service.proto");
    let fds = protox::compile([&proto], [root.join("proto")])?;
    prost_build::Config::new()
        .btree_map(["."])
        .compile_fds(fds)?;
    Ok(())
}
