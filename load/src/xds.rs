//! The little of xDS the tool needs besides the Envoy messages themselves: the four
//! resource types it follows and node metadata built from JSON. Copies, so the tool
//! does not depend on the server's internals (and builds without the server).

use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

/// The resource types a simulated proxy follows, in push order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum TypeUrl {
    /// CDS.
    Cluster,
    /// EDS.
    Endpoint,
    /// LDS.
    Listener,
    /// RDS.
    Route,
}

impl TypeUrl {
    /// Every type, in push order.
    pub const ALL: [TypeUrl; 4] = [
        TypeUrl::Cluster,
        TypeUrl::Endpoint,
        TypeUrl::Listener,
        TypeUrl::Route,
    ];

    /// The v3 type URL.
    pub const fn as_str(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            TypeUrl::Endpoint => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            TypeUrl::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            TypeUrl::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        }
    }

    /// Parses a type URL.
    pub fn parse(s: &str) -> Option<TypeUrl> {
        TypeUrl::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Short name in reports (`cds`, `eds`, `lds`, `rds`).
    pub const fn short(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "cds",
            TypeUrl::Endpoint => "eds",
            TypeUrl::Listener => "lds",
            TypeUrl::Route => "rds",
        }
    }

    /// Wildcard types: an empty subscription means "everything".
    pub const fn is_wildcard(self) -> bool {
        matches!(self, TypeUrl::Cluster | TypeUrl::Listener)
    }
}

/// Converts JSON into a protobuf `Struct` (the node metadata). Non-object input gives
/// an empty struct.
pub fn json_to_struct(v: &serde_json::Value) -> Struct {
    let mut out = Struct::default();
    if let serde_json::Value::Object(map) = v {
        out.fields = map
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect();
    }
    out
}

fn json_to_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(_) => Kind::StructValue(json_to_struct(v)),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_urls_round_trip() {
        for t in TypeUrl::ALL {
            assert_eq!(TypeUrl::parse(t.as_str()), Some(t));
        }
        assert_eq!(TypeUrl::parse("type.googleapis.com/other"), None);
    }

    #[test]
    fn type_urls_name_the_envoy_messages() {
        use envoy_types::pb::envoy::config::{cluster, endpoint, listener, route};
        use prost::Name;
        let full = |name: String| format!("type.googleapis.com/{name}");
        assert_eq!(
            TypeUrl::Cluster.as_str(),
            full(cluster::v3::Cluster::full_name())
        );
        assert_eq!(
            TypeUrl::Endpoint.as_str(),
            full(endpoint::v3::ClusterLoadAssignment::full_name())
        );
        assert_eq!(
            TypeUrl::Listener.as_str(),
            full(listener::v3::Listener::full_name())
        );
        assert_eq!(
            TypeUrl::Route.as_str(),
            full(route::v3::RouteConfiguration::full_name())
        );
    }

    #[test]
    fn metadata_from_json() {
        let s = json_to_struct(&serde_json::json!({"NAMESPACE": "a", "N": 2, "L": [true]}));
        assert_eq!(
            s.fields["NAMESPACE"].kind,
            Some(Kind::StringValue("a".into()))
        );
        assert_eq!(s.fields["N"].kind, Some(Kind::NumberValue(2.0)));
        assert!(matches!(s.fields["L"].kind, Some(Kind::ListValue(_))));
    }
}
