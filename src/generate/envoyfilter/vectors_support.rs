//! Helpers of the ported EnvoyFilter vectors (`super::vectors`): EnvoyFilter objects,
//! proxies, Envoy messages from and to proto JSON, the proto validation check.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed_api::networking::v1alpha3::EnvoyFilter;
use prost_reflect::{DynamicMessage, SerializeOptions};
use serde_json::{Value, json};

use super::value;
use crate::model::Proxy;
use crate::model::proxy::json_to_struct;
use crate::push::config_index::Config;

pub(super) fn ef(ns: &str, name: &str, created: u64, spec: Value) -> Arc<Config<EnvoyFilter>> {
    Arc::new(Config {
        name: name.into(),
        namespace: ns.into(),
        labels: Default::default(),
        annotations: Default::default(),
        creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(created),
        spec: serde_json::from_value(spec).expect("EnvoyFilter spec"),
    })
}

pub(super) fn proxy(kind: &str, ns: &str, meta: Value) -> Proxy {
    let mut m = json!({"LABELS": {}, "CLUSTER_ID": "c1"});
    for (k, v) in meta.as_object().unwrap() {
        m[k] = v.clone();
    }
    let node = envoy_types::pb::envoy::config::core::v3::Node {
        id: format!("{kind}~10.0.0.1~pod.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(json_to_struct(&m)),
        ..Default::default()
    };
    Proxy::from_node(Some(&node)).unwrap()
}

/// A typed Envoy message from its proto JSON.
pub(super) fn msg<M: prost::Message + Default + prost::Name>(json: Value) -> M {
    let desc = value::descriptor(&M::full_name()).unwrap();
    let d = DynamicMessage::deserialize(desc, json).unwrap_or_else(|e| panic!("{e}"));
    value::from_dynamic(&d).unwrap()
}

/// A typed Envoy message as proto JSON (for comparison and failure messages).
pub(super) fn render<M: prost::Message + prost::Name>(m: &M) -> Value {
    let d = value::to_dynamic(m).unwrap();
    d.serialize_with_options(
        serde_json::value::Serializer,
        &SerializeOptions::new().use_proto_field_name(true),
    )
    .unwrap()
}

/// Checks a patched resource as every generated one is checked.
pub(super) fn valid<M: prost::Message + prost::Name>(name: &str, m: &M) {
    crate::xds::pgv::assert_valid(
        name,
        &format!("type.googleapis.com/{}", M::full_name()),
        &m.encode_to_vec(),
    );
}
