//! The MCP-over-xDS types: Istio's `APIGenerator` answers type URLs of the form
//! `<group>/<version>/<kind>` (`networking.istio.io/v1/ServiceEntry`) with
//! `istio.mcp.v1alpha1.Resource` messages, and `core/v1alpha1/MeshConfig` with the
//! mesh config itself.
//!
//! One [`McpType`] per type URL a client may ask for: every declared config kind in
//! every version of its group Istio accepts (the preferred one and its aliases, as
//! `meshfed_registry::config::kinds` declares them), and the mesh config. What a type
//! serves does not depend on the version asked (the body is always the kind's proto,
//! `type.googleapis.com/istio.networking.v1alpha3.ServiceEntry`, as in Istio), only the
//! response's type URL does.

use std::sync::LazyLock;

use meshfed_registry::config::Kind;

/// What an MCP type serves.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum McpKind {
    /// The objects of a config kind (and, for ServiceEntry and WorkloadEntry, the
    /// ones synthesized from the exported registries).
    Config(Kind),
    /// The mesh config in force (`core/v1alpha1/MeshConfig`).
    MeshConfig,
}

/// The type URL of the mesh config (Istio's `gvk.MeshConfig`: the core group is
/// spelled `core`).
pub const MESH_CONFIG_TYPE: &str = "core/v1alpha1/MeshConfig";

/// One MCP type URL: a kind and the version of it asked for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct McpType {
    /// What it serves.
    pub kind: McpKind,
    /// Index of the version in the kind's group versions (0: the preferred one).
    version: u8,
}

/// Every MCP type and its type URL, config kinds first (in [`Kind::ALL`] order, each
/// with its preferred version first), then the mesh config.
static TYPES: LazyLock<Vec<(McpType, String)>> = LazyLock::new(|| {
    let mut out = Vec::new();
    for kind in Kind::ALL {
        for (i, version) in kind.versions().iter().enumerate() {
            out.push((
                McpType {
                    kind: McpKind::Config(kind),
                    version: u8::try_from(i).expect("few versions"),
                },
                format!("{}/{version}/{}", kind.group(), kind.as_str()),
            ));
        }
    }
    out.push((
        McpType {
            kind: McpKind::MeshConfig,
            version: 0,
        },
        MESH_CONFIG_TYPE.to_string(),
    ));
    out
});

impl McpType {
    /// The type of `kind` in its preferred version.
    pub const fn preferred(kind: McpKind) -> McpType {
        McpType { kind, version: 0 }
    }

    /// The type of `type_url`, if it is one this server serves.
    pub fn parse(type_url: &str) -> Option<McpType> {
        TYPES.iter().find(|(_, u)| u == type_url).map(|(t, _)| *t)
    }

    /// Every MCP type, preferred versions and aliases.
    pub fn all() -> impl Iterator<Item = McpType> {
        TYPES.iter().map(|(t, _)| *t)
    }

    /// The type URL (`networking.istio.io/v1alpha3/ServiceEntry`).
    pub fn as_str(self) -> &'static str {
        TYPES
            .iter()
            .find(|(t, _)| *t == self)
            .map(|(_, u)| u.as_str())
            .expect("every McpType is in the table")
    }

    /// The config kind it serves, if any.
    pub fn config_kind(self) -> Option<Kind> {
        match self.kind {
            McpKind::Config(kind) => Some(kind),
            McpKind::MeshConfig => None,
        }
    }
}

impl std::fmt::Display for McpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istios_type_urls_and_aliases_parse() {
        // Istio's gvk names at HEAD (pkg/config/schema/gvk): v1 preferred, the older
        // versions as aliases; the mesh config in the `core` group.
        for (url, kind) in [
            ("networking.istio.io/v1/ServiceEntry", Kind::ServiceEntry),
            (
                "networking.istio.io/v1beta1/ServiceEntry",
                Kind::ServiceEntry,
            ),
            (
                "networking.istio.io/v1alpha3/ServiceEntry",
                Kind::ServiceEntry,
            ),
            (
                "networking.istio.io/v1alpha3/WorkloadEntry",
                Kind::WorkloadEntry,
            ),
            (
                "networking.istio.io/v1/VirtualService",
                Kind::VirtualService,
            ),
            ("networking.istio.io/v1/WorkloadGroup", Kind::WorkloadGroup),
            (
                "security.istio.io/v1/AuthorizationPolicy",
                Kind::AuthorizationPolicy,
            ),
            (
                "security.istio.io/v1beta1/PeerAuthentication",
                Kind::PeerAuthentication,
            ),
            ("telemetry.istio.io/v1alpha1/Telemetry", Kind::Telemetry),
            (
                "networking.istio.io/v1alpha3/EnvoyFilter",
                Kind::EnvoyFilter,
            ),
        ] {
            let t = McpType::parse(url).unwrap_or_else(|| panic!("{url}"));
            assert_eq!(t.config_kind(), Some(kind), "{url}");
            assert_eq!(t.as_str(), url);
        }
        let mesh = McpType::parse(MESH_CONFIG_TYPE).unwrap();
        assert_eq!(mesh.kind, McpKind::MeshConfig);
        for unknown in [
            "networking.istio.io/v1beta1/ProxyConfig",
            "networking.istio.io/v1/EnvoyFilter",
            "networking.istio.io/v2/ServiceEntry",
            "ServiceEntry",
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        ] {
            assert_eq!(McpType::parse(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn every_type_round_trips() {
        for t in McpType::all() {
            assert_eq!(McpType::parse(t.as_str()), Some(t));
        }
        assert_eq!(
            McpType::preferred(McpKind::Config(Kind::ServiceEntry)).as_str(),
            "networking.istio.io/v1/ServiceEntry"
        );
    }
}
