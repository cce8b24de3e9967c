//! `--meshConfig` and `--networksConfig` files.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = meshfed::mesh::parse_mesh_config(Path::new("mesh.yaml"), text);
        let _ = meshfed::mesh::parse_mesh_networks(Path::new("networks.yaml"), text);
    }
});
