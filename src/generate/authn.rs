//! The mutual TLS mode a workload's ports accept, from PeerAuthentications, as Istio
//! composes it (`security/authn/policy_applier.go` `ComposePeerAuthentication`,
//! `model/authentication.go`):
//!
//! - Candidates are the PeerAuthentications of the workload's namespace and of the root
//!   namespace whose selector matches the workload's labels. One without selector (or
//!   with empty labels) in the root namespace is the mesh policy, one without selector
//!   elsewhere the namespace policy, one with a selector outside the root namespace the
//!   workload policy; a root-namespace policy with a selector is ignored. Within each
//!   class the oldest wins.
//! - The mode starts PERMISSIVE and is overridden by the mesh, namespace and workload
//!   policies, in that order, by each that sets a mode other than UNSET.
//! - `portLevelMtls` (keyed by the port the workload listens on) comes from the winning
//!   workload policy only; an UNSET port mode inherits the workload's.
//!
//! Clients infer a destination's mode (auto mTLS) from the mesh and namespace policies
//! only ([`inferred_namespace_mode`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_api::security::v1beta1::PeerAuthentication;
use meshfed_api::security::v1beta1::peer_authentication::mutual_tls::Mode as PaMode;

use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;

/// An effective mutual TLS mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MtlsMode {
    /// Plaintext only.
    Disable,
    /// Mutual TLS or plaintext.
    Permissive,
    /// Mutual TLS only.
    Strict,
}

impl MtlsMode {
    fn from_policy(mode: i32) -> Option<MtlsMode> {
        match PaMode::try_from(mode).unwrap_or(PaMode::Unset) {
            PaMode::Unset => None,
            PaMode::Disable => Some(MtlsMode::Disable),
            PaMode::Permissive => Some(MtlsMode::Permissive),
            PaMode::Strict => Some(MtlsMode::Strict),
        }
    }

    /// Istio's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MtlsMode::Disable => "DISABLE",
            MtlsMode::Permissive => "PERMISSIVE",
            MtlsMode::Strict => "STRICT",
        }
    }
}

/// The modes of one workload: the workload-wide mode and per-port overrides.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkloadMtls {
    pub mode: MtlsMode,
    /// Port the workload listens on -> mode, for the ports its policy names.
    pub ports: BTreeMap<u16, MtlsMode>,
}

impl WorkloadMtls {
    /// The mode of traffic to `port`.
    pub fn port_mode(&self, port: u16) -> MtlsMode {
        self.ports.get(&port).copied().unwrap_or(self.mode)
    }
}

/// The mesh, namespace and workload policies for a workload of `namespace` with
/// `labels` (each the oldest of its class).
struct Candidates<'a> {
    mesh: Option<&'a Arc<Config<PeerAuthentication>>>,
    namespace: Option<&'a Arc<Config<PeerAuthentication>>>,
    workload: Option<&'a Arc<Config<PeerAuthentication>>>,
}

fn candidates<'a>(
    snapshot: &'a Snapshot,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Candidates<'a> {
    let root = snapshot.config().root_namespace.as_str();
    let mut out = Candidates {
        mesh: None,
        namespace: None,
        workload: None,
    };
    // Oldest first: the first of each class wins.
    for pa in snapshot.config().peer_authentications() {
        let selector = pa
            .spec
            .selector
            .as_ref()
            .map(|s| &s.match_labels)
            .filter(|l| !l.is_empty());
        match selector {
            None if pa.namespace == root => {
                out.mesh.get_or_insert(pa);
            }
            None if pa.namespace == namespace => {
                out.namespace.get_or_insert(pa);
            }
            Some(sel) if pa.namespace == namespace && pa.namespace != root => {
                let Some(labels) = labels else { continue };
                if sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                    out.workload.get_or_insert(pa);
                }
            }
            _ => {}
        }
    }
    out
}

/// The modes of a workload of `namespace` with `labels`.
pub fn workload_mtls(
    snapshot: &Snapshot,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> WorkloadMtls {
    let c = candidates(snapshot, namespace, Some(labels));
    let mut mode = MtlsMode::Permissive;
    for pa in [c.mesh, c.namespace, c.workload].into_iter().flatten() {
        if let Some(m) = pa
            .spec
            .mtls
            .as_ref()
            .and_then(|m| MtlsMode::from_policy(m.mode))
        {
            mode = m;
        }
    }
    let ports = c
        .workload
        .map(|pa| {
            pa.spec
                .port_level_mtls
                .iter()
                .filter_map(|(port, m)| {
                    let port = u16::try_from(*port).ok()?;
                    Some((port, MtlsMode::from_policy(m.mode).unwrap_or(mode)))
                })
                .collect()
        })
        .unwrap_or_default();
    WorkloadMtls { mode, ports }
}

/// The mode clients assume for the workloads of `namespace` (Istio's
/// `BestEffortInferServiceMTLSMode`): the namespace policy's, else the mesh
/// policy's, else PERMISSIVE. Workload policies are not looked at. Clusters ask it for
/// every service, so the modes of all namespaces are read from the policies once per
/// snapshot.
pub fn inferred_namespace_mode(snapshot: &Snapshot, namespace: &str) -> MtlsMode {
    /// Mesh-wide and per-namespace modes set by policies (their own type, for
    /// `Snapshot::derived`).
    struct Inferred {
        mesh: Option<MtlsMode>,
        namespaces: std::collections::HashMap<String, MtlsMode>,
    }
    let inferred = snapshot.derived(|snapshot| {
        let mode_of = |pa: &Arc<Config<PeerAuthentication>>| {
            pa.spec
                .mtls
                .as_ref()
                .and_then(|m| MtlsMode::from_policy(m.mode))
        };
        let mesh = candidates(snapshot, "", None).mesh.and_then(mode_of);
        // The namespace policy of each namespace: its oldest without selector (the
        // policies are oldest first), as `candidates` picks it.
        let root = snapshot.config().root_namespace.as_str();
        let mut seen = std::collections::HashSet::new();
        let mut namespaces = std::collections::HashMap::new();
        for pa in snapshot.config().peer_authentications() {
            let selects = pa
                .spec
                .selector
                .as_ref()
                .is_some_and(|s| !s.match_labels.is_empty());
            if selects || pa.namespace == root || !seen.insert(pa.namespace.as_str()) {
                continue;
            }
            if let Some(mode) = mode_of(pa) {
                namespaces.insert(pa.namespace.clone(), mode);
            }
        }
        Inferred { mesh, namespaces }
    });
    inferred
        .namespaces
        .get(namespace)
        .copied()
        .or(inferred.mesh)
        .unwrap_or(MtlsMode::Permissive)
}

/// The security policies with a workload selector that no endpoint of the snapshot
/// carries (Istio's analyzer warning IST0127, "no matching workloads"): in the
/// policy's namespace, or in any namespace for a policy of the root namespace. Each
/// entry is `Kind namespace/name: labels`. Such a policy applies to nothing until a
/// workload with those labels appears.
pub fn policies_selecting_nothing(snapshot: &Snapshot) -> Vec<String> {
    let root = snapshot.config().root_namespace.as_str();
    let selected = |ns: &str, selector: &BTreeMap<String, String>| {
        snapshot.services().all().iter().any(|svc| {
            (ns == root || svc.namespace.as_str() == ns)
                && snapshot.shards(&svc.key()).is_some_and(|shards| {
                    shards
                        .iter()
                        .any(|(_, ep)| selector.iter().all(|(k, v)| ep.labels.get(k) == Some(v)))
                })
        })
    };
    let mut out = Vec::new();
    let mut check =
        |kind: &str, ns: &str, name: &str, selector: Option<&BTreeMap<String, String>>| {
            let Some(selector) = selector.filter(|s| !s.is_empty()) else {
                return;
            };
            if !selected(ns, selector) {
                let labels: Vec<String> =
                    selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push(format!("{kind} {ns}/{name}: {}", labels.join(",")));
            }
        };
    let config = snapshot.config();
    for p in config.peer_authentications() {
        let sel = p.spec.selector.as_ref().map(|s| &s.match_labels);
        check("PeerAuthentication", &p.namespace, &p.name, sel);
    }
    for p in config.request_authentications() {
        let sel = p.spec.selector.as_ref().map(|s| &s.match_labels);
        check("RequestAuthentication", &p.namespace, &p.name, sel);
    }
    for p in config.authorization_policies() {
        let sel = p.spec.selector.as_ref().map(|s| &s.match_labels);
        check("AuthorizationPolicy", &p.namespace, &p.name, sel);
    }
    out.sort();
    out
}

/// Cipher suites of inbound mesh mTLS unless `meshMTLS.cipherSuites` names others
/// (Istio's `SupportedCiphers`).
pub const INBOUND_MTLS_CIPHERS: [&str; 6] = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];

/// The server side of mesh mTLS on an inbound chain (Istio's `BuildInboundTLS`): the
/// agent's workload certificate (`default`) and root (`ROOTCA`) over SDS, a client
/// certificate required and accepted when its URI SAN is in the mesh trust domain or
/// one of its aliases, TLS 1.2 (1.3 with `meshMTLS.minProtocolVersion: TLSV1_3`) to
/// 1.3. TCP chains offer `istio-peer-exchange` before `h2`, `http/1.1` so peers can
/// exchange metadata; HTTP chains offer `h2`, `http/1.1` only (`istio` must never be
/// negotiated: it only selects the chain).
pub fn inbound_mtls_context(
    mesh: &meshfed_api::mesh::v1alpha1::MeshConfig,
    tcp: bool,
) -> envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher, TlsParameters,
        subject_alt_name_matcher, tls_parameters,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
    use meshfed_api::mesh::v1alpha1::mesh_config::tls_config::TlsProtocol;

    use crate::generate::upstream_tls::{SDS_DEFAULT, SDS_ROOT, agent_sds, combined_validation};

    let alpn: &[&str] = if tcp {
        &["istio-peer-exchange", "h2", "http/1.1"]
    } else {
        &["h2", "http/1.1"]
    };
    let mesh_mtls = mesh.mesh_m_tls.as_ref();
    let min = match mesh_mtls.map(|t| TlsProtocol::try_from(t.min_protocol_version)) {
        Some(Ok(TlsProtocol::Tlsv13)) => tls_parameters::TlsProtocol::TlSv13,
        _ => tls_parameters::TlsProtocol::TlSv12,
    };
    let ciphers: Vec<String> = match mesh_mtls {
        Some(t) if !t.cipher_suites.is_empty() => t.cipher_suites.clone(),
        _ => INBOUND_MTLS_CIPHERS.iter().map(|c| c.to_string()).collect(),
    };
    let trust_domain = if mesh.trust_domain.is_empty() {
        "cluster.local"
    } else {
        mesh.trust_domain.as_str()
    };
    let domains = crate::generate::authz::trust_domain::TrustDomains::new(
        trust_domain,
        &mesh.trust_domain_aliases,
    );
    let sans = domains
        .domains()
        .iter()
        .map(|td| SubjectAltNameMatcher {
            san_type: subject_alt_name_matcher::SanType::Uri as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Prefix(format!(
                    "spiffe://{td}/"
                ))),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: min as i32,
                tls_maximum_protocol_version: tls_parameters::TlsProtocol::TlSv13 as i32,
                cipher_suites: ciphers,
                ..Default::default()
            }),
            alpn_protocols: alpn.iter().map(|a| a.to_string()).collect(),
            tls_certificate_sds_secret_configs: vec![agent_sds(SDS_DEFAULT, true)],
            validation_context_type: Some(combined_validation(
                sans,
                None,
                agent_sds(SDS_ROOT, true),
            )),
            ..Default::default()
        }),
        require_client_certificate: Some(envoy_types::pb::google::protobuf::BoolValue {
            value: true,
        }),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::{Duration, SystemTime};

    use meshfed_api::security::v1beta1::peer_authentication::MutualTls;
    use meshfed_api::r#type::v1beta1::WorkloadSelector;

    use super::*;
    use crate::generate::lds::tests::{default_mesh, snapshot as build};
    use crate::push::config_index::ConfigSet;

    pub(crate) fn pa(
        ns: &str,
        name: &str,
        age: u64,
        selector: &[(&str, &str)],
        mode: PaMode,
        ports: &[(u32, PaMode)],
    ) -> Config<PeerAuthentication> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(1000 - age),
            spec: PeerAuthentication {
                selector: (!selector.is_empty()).then(|| WorkloadSelector {
                    match_labels: selector
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
                mtls: Some(MutualTls { mode: mode as i32 }),
                port_level_mtls: ports
                    .iter()
                    .map(|(p, m)| (*p, MutualTls { mode: *m as i32 }))
                    .collect(),
            },
        }
    }

    fn snapshot(policies: Vec<Config<PeerAuthentication>>) -> Snapshot {
        let set = ConfigSet {
            peer_authentications: policies,
            ..Default::default()
        };
        build(vec![], set, default_mesh())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn modes_compose_mesh_namespace_workload_and_port() {
        let app = labels(&[("app", "a")]);
        // Nothing: PERMISSIVE.
        let s = snapshot(vec![]);
        assert_eq!(workload_mtls(&s, "foo", &app).mode, MtlsMode::Permissive);

        let s = snapshot(vec![
            pa("istio-system", "mesh", 5, &[], PaMode::Strict, &[]),
            // A newer mesh policy loses to the older one.
            pa("istio-system", "mesh2", 1, &[], PaMode::Disable, &[]),
            // Root namespace policies with a selector are ignored.
            pa(
                "istio-system",
                "rootsel",
                5,
                &[("app", "a")],
                PaMode::Disable,
                &[],
            ),
            pa("foo", "ns", 5, &[], PaMode::Unset, &[]),
            pa(
                "foo",
                "wl",
                5,
                &[("app", "a")],
                PaMode::Permissive,
                &[(8080, PaMode::Disable), (9090, PaMode::Unset)],
            ),
            pa("bar", "ns", 5, &[], PaMode::Disable, &[]),
        ]);
        let w = workload_mtls(&s, "foo", &app);
        assert_eq!(w.mode, MtlsMode::Permissive, "the workload policy wins");
        assert_eq!(w.port_mode(8080), MtlsMode::Disable);
        assert_eq!(w.port_mode(9090), MtlsMode::Permissive, "UNSET inherits");
        assert_eq!(w.port_mode(80), MtlsMode::Permissive);
        // Another workload of foo: namespace UNSET, so the mesh's STRICT.
        let other = workload_mtls(&s, "foo", &labels(&[("app", "b")]));
        assert_eq!(other.mode, MtlsMode::Strict);
        assert!(other.ports.is_empty());
        assert_eq!(workload_mtls(&s, "bar", &app).mode, MtlsMode::Disable);
        assert_eq!(workload_mtls(&s, "baz", &app).mode, MtlsMode::Strict);

        // Clients look at namespace then mesh policies only.
        assert_eq!(inferred_namespace_mode(&s, "foo"), MtlsMode::Strict);
        assert_eq!(inferred_namespace_mode(&s, "bar"), MtlsMode::Disable);
        assert_eq!(inferred_namespace_mode(&s, "baz"), MtlsMode::Strict);
    }

    #[test]
    fn clients_skip_auto_mtls_to_namespaces_whose_policy_disables_it() {
        use crate::generate::lds::tests::{proxy, service};
        use meshfed_registry::Protocol;
        use prost::Message;

        let services = vec![
            service(
                "a.legacy.svc.cluster.local",
                "legacy",
                "10.0.0.1",
                &[("http", 80, Protocol::Http)],
            ),
            service(
                "b.default.svc.cluster.local",
                "default",
                "10.0.0.2",
                &[("http", 80, Protocol::Http)],
            ),
        ];
        let set = ConfigSet {
            peer_authentications: vec![pa("legacy", "default", 0, &[], PaMode::Disable, &[])],
            ..Default::default()
        };
        let snap = build(services, set, default_mesh());
        let client = proxy(
            "sidecar~10.0.9.1~c.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let cluster = |host: &str| {
            let svc = snap
                .services()
                .all()
                .iter()
                .find(|s| s.hostname.as_str() == host)
                .unwrap()
                .clone();
            let port = svc.ports[0].clone();
            let r = crate::generate::cds::cached_outbound(
                &snap,
                &crate::generate::cds::ClientFacts::of(&client),
                &svc,
                &port,
                "",
            )
            .unwrap();
            envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(r.body.value.clone())
                .unwrap()
        };
        assert!(
            cluster("a.legacy.svc.cluster.local")
                .transport_socket_matches
                .is_empty()
        );
        assert_eq!(
            cluster("b.default.svc.cluster.local")
                .transport_socket_matches
                .len(),
            2
        );
    }

    #[test]
    fn policies_whose_selector_matches_no_endpoint_are_listed() {
        use crate::generate::lds::tests::service;
        use meshfed_registry::{Endpoint, Protocol};

        let mut ep = Endpoint::new("10.1.0.1".parse().unwrap());
        ep.labels.insert("app".into(), "a".into());
        let services = vec![(
            service(
                "a.foo.svc.cluster.local",
                "foo",
                "10.0.0.1",
                &[("http", 80, Protocol::Http)],
            ),
            vec![ep],
        )];
        let set = ConfigSet {
            peer_authentications: vec![
                pa("foo", "matches", 0, &[("app", "a")], PaMode::Strict, &[]),
                pa("foo", "nothing", 0, &[("app", "zzz")], PaMode::Strict, &[]),
                pa(
                    "bar",
                    "other-namespace",
                    0,
                    &[("app", "a")],
                    PaMode::Strict,
                    &[],
                ),
                pa("foo", "namespace-wide", 0, &[], PaMode::Strict, &[]),
            ],
            ..Default::default()
        };
        let snap = crate::generate::lds::tests::snapshot_with(services, set, default_mesh());
        assert_eq!(
            policies_selecting_nothing(&snap),
            vec![
                "PeerAuthentication bar/other-namespace: app=a".to_string(),
                "PeerAuthentication foo/nothing: app=zzz".to_string(),
            ]
        );
    }
}
