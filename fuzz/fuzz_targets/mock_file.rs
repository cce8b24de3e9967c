//! Mock registry files (YAML or JSON): parse, convert, and report errors with lines.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = meshfed_registry::mock_file::parse_mock_registry(Path::new("mock.yaml"), text);
    }
});
