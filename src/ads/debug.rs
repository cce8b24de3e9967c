//! What the ADS server needs to answer istioctl: the `control_plane.identifier` every
//! response carries, the debug type URLs, and the seam ([`DebugSource`]) through
//! which the debug types are answered by the layer that owns the debug pages.
//!
//! Debug types are answered once per request (a request that carries a nonce is an
//! ACK of an earlier answer and gets none), never watched, never pushed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::status::v3::{ClientStatusRequest, ClientStatusResponse};
use prost::Message;

use crate::xds::wire::SharedAny;
use crate::xds::{EncodedResource, Resource};

/// `istio.io/debug`: a debug page by path (`syncz`, `configz`, `config_dump?proxyID=`).
pub const DEBUG_TYPE: &str = "istio.io/debug";
/// `istio.io/debug/syncz`: one `ClientConfig` per connected proxy.
pub const SYNCZ_TYPE: &str = "istio.io/debug/syncz";
/// `istio.io/debug/config_dump`: one proxy's config dump (resource name: its id).
pub const CONFIG_DUMP_TYPE: &str = "istio.io/debug/config_dump";
/// `istio.io/connections`: what `istioctl x version` asks (one `Node` per proxy).
pub const CONNECTIONS_TYPE: &str = "istio.io/connections";
/// `istio.io/connect`: Istio's connection events, answered as the connections.
pub const CONNECT_TYPE: &str = "istio.io/connect";

/// Whether `type_url` is one of Istio's debug types (answered by a [`DebugSource`]).
pub fn is_debug_type(type_url: &str) -> bool {
    type_url == DEBUG_TYPE
        || type_url.starts_with("istio.io/debug/")
        || type_url == CONNECTIONS_TYPE
        || type_url == CONNECT_TYPE
}

/// Who asks for debug data.
#[derive(Clone, Copy, Debug)]
pub struct DebugCaller<'a> {
    /// The verified SPIFFE identity (secure port); `None` on the plaintext port.
    pub identity: Option<&'a str>,
    /// Whether the request came over the secure port.
    pub secure: bool,
}

/// One resource of a debug answer.
#[derive(Clone, Debug)]
pub struct DebugResource {
    /// Resource name (Delta responses carry it; SotW ones only the `Any`).
    pub name: String,
    /// The resource.
    pub any: SharedAny,
}

impl DebugResource {
    /// A resource of encoded `value` with `type_url`.
    pub fn new(name: String, type_url: &'static str, value: Vec<u8>) -> Self {
        DebugResource {
            name,
            any: SharedAny {
                type_url,
                value: value.into(),
            },
        }
    }

    /// As a response's resource, under the answer's `version`.
    pub fn into_resource(self, version: &str) -> Resource {
        Arc::new(EncodedResource {
            name: self.name.into(),
            body: self.any,
            version: version.into(),
            placeholder: false,
        })
    }
}

/// Answers the debug types. Implemented above the admin layer (it reads the debug
/// pages and config dumps); the ADS server holds it once the admin state exists.
pub trait DebugSource: Send + Sync + std::fmt::Debug {
    /// The resources answering `type_url` with `names`, or the error that ends the
    /// stream (istiod ends a debug stream with its generator's error).
    fn answer(
        &self,
        caller: DebugCaller<'_>,
        type_url: &str,
        names: &[String],
    ) -> Result<Vec<DebugResource>, String>;

    /// The CSDS answer to `request` (per matching proxy its config and status), or
    /// the status refusing it.
    fn client_status(
        &self,
        caller: DebugCaller<'_>,
        request: &ClientStatusRequest,
    ) -> Result<ClientStatusResponse, tonic::Status>;
}

/// A nonce for an answer outside the per-type conversation (debug and unserved
/// types), unique for the server's lifetime.
pub fn other_nonce(version: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{version}/x{}", COUNTER.fetch_add(1, Ordering::Relaxed) + 1)
}

/// The component name in `control_plane.identifier`.
pub const COMPONENT: &str = "meshfed";

/// `control_plane.identifier` in istiod's JSON shape (`IstioControlPlaneInstance`:
/// `Component`, `ID`, `Info` with Istio's `BuildInfo` keys), which istioctl's
/// proxy-status and version commands parse. Computed once at start.
#[derive(Clone, Debug)]
pub struct ControlPlaneId {
    identifier: String,
    encoded: Bytes,
}

impl ControlPlaneId {
    /// The identifier of instance `id` at `version`.
    pub fn new(id: &str, version: &str) -> Self {
        let identifier = serde_json::json!({
            "Component": COMPONENT,
            "ID": id,
            "Info": {
                "version": version,
                "revision": "unknown",
                "golang_version": "",
                "status": "Clean",
                "tag": version,
            },
        })
        .to_string();
        let encoded = ControlPlane {
            identifier: identifier.clone(),
        }
        .encode_to_vec()
        .into();
        ControlPlaneId {
            identifier,
            encoded,
        }
    }

    /// This process: `$POD_NAME` (as istiod), else the host name; the crate version.
    pub fn from_environment() -> Self {
        let id = std::env::var("POD_NAME")
            .ok()
            .filter(|p| !p.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_default();
        ControlPlaneId::new(&id, env!("CARGO_PKG_VERSION"))
    }

    /// The JSON identifier.
    pub fn identifier(&self) -> &str {
        &self.identifier
    }

    /// The encoded `ControlPlane` message every response shares.
    pub fn encoded(&self) -> Bytes {
        self.encoded.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_has_istiods_shape() {
        let cp = ControlPlaneId::new("meshfed-0", "1.2.3");
        let json: serde_json::Value = serde_json::from_str(cp.identifier()).unwrap();
        assert_eq!(json["Component"], "meshfed");
        assert_eq!(json["ID"], "meshfed-0");
        assert_eq!(json["Info"]["version"], "1.2.3");
        for key in ["revision", "golang_version", "status", "tag"] {
            assert!(json["Info"].get(key).is_some(), "{key}");
        }
        let decoded = ControlPlane::decode(cp.encoded()).unwrap();
        assert_eq!(decoded.identifier, cp.identifier());
    }

    #[test]
    fn debug_types() {
        for t in [
            DEBUG_TYPE,
            SYNCZ_TYPE,
            CONFIG_DUMP_TYPE,
            CONNECTIONS_TYPE,
            CONNECT_TYPE,
        ] {
            assert!(is_debug_type(t), "{t}");
        }
        assert!(!is_debug_type("istio.io/debugz"));
        assert!(!is_debug_type(crate::xds::TypeUrl::Cluster.as_str()));
    }
}
