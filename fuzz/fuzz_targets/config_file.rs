//! Istio config files (`--configDir`, `meshfed validate`): multi-document YAML, each
//! object decoded and validated, errors located by line.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = meshfed_registry::config::validate_text(Path::new("config.yaml"), text);
    }
});
