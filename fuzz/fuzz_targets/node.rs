//! The node of a stream's first request: any bytes that decode as an Envoy `Node`
//! (id, metadata struct, locality) go through the server's node parsing.

#![no_main]

use envoy_types::pb::envoy::config::core::v3::Node;
use libfuzzer_sys::fuzz_target;
use meshfed::model::Proxy;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(node) = Node::decode(data) {
        if let Ok(proxy) = Proxy::from_node(Some(&node)) {
            let _ = proxy.class();
        }
    }
});
