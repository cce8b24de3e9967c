//! Who is calling (reference §1.6): the authenticators of the secure port, tried in
//! Istio's order — client certificate, third-party JWT (`JWT_RULE`), Kubernetes JWT
//! through a TokenReview — the first that names the caller wins. The same chain
//! admits xDS streams and CreateCertificate calls.
//!
//! The plaintext port has no chain: its calls carry no identity, as 15010 in Istio.

pub mod jwt;
pub mod kube;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use tonic::metadata::MetadataMap;

/// Who a request comes from, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Its identities (SPIFFE URIs), all of which go into a certificate issued to it.
    pub identities: Vec<String>,
    /// Which authenticator named it (`client-cert`, `jwt`, `kube-jwt`).
    pub source: &'static str,
    /// The Kubernetes service account and pod behind a reviewed token (Istio's
    /// `KubernetesInfo`); what certificate impersonation checks.
    pub kube: Option<KubeCaller>,
}

/// The Kubernetes side of a caller authenticated by its service-account token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeCaller {
    /// The cluster it claimed (`clusterid`), `None` for the local one.
    pub cluster: Option<String>,
    pub namespace: String,
    pub service_account: String,
    /// The pod the token is bound to (`authentication.kubernetes.io/pod-name`, `-uid`).
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

/// The TLS side of a connection on the secure port.
#[derive(Clone, Debug, Default)]
pub struct TlsPeer {
    /// The client's chain, leaf first, already verified against the mesh roots during
    /// the handshake; empty when the client sent none.
    pub chain: Vec<CertificateDer<'static>>,
}

/// What an authenticator may look at.
#[derive(Clone, Copy, Debug)]
pub struct AuthContext<'a> {
    /// The call's gRPC metadata (`authorization`, `clusterid`).
    pub metadata: &'a MetadataMap,
    /// The TLS peer; `None` on a plaintext connection.
    pub tls: Option<&'a TlsPeer>,
}

/// What one authenticator concluded.
pub type AuthResult = Result<Option<Caller>, String>;

/// A boxed authentication in flight.
pub type AuthFuture<'a> = Pin<Box<dyn Future<Output = AuthResult> + Send + 'a>>;

/// One way of naming a caller.
pub trait Authenticator: Send + Sync + fmt::Debug {
    /// Short name for logs and errors (`client-cert`, `jwt`, `kube-jwt`).
    fn name(&self) -> &'static str;

    /// `Ok(Some(caller))`: authenticated; `Ok(None)`: this kind of credential is not
    /// present; `Err(why)`: present and refused.
    fn authenticate<'a>(&'a self, ctx: AuthContext<'a>) -> AuthFuture<'a>;
}

/// The authenticators of a port, in order.
#[derive(Clone, Debug, Default)]
pub struct Authenticators {
    chain: Vec<Arc<dyn Authenticator>>,
}

impl Authenticators {
    /// A chain of `chain`, tried in that order.
    pub fn new(chain: Vec<Arc<dyn Authenticator>>) -> Self {
        Authenticators { chain }
    }

    /// The names of the authenticators, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.chain.iter().map(|a| a.name()).collect()
    }

    /// The first caller an authenticator names; else every reason, joined, as
    /// Istio's "authentication failure" message carries them.
    pub async fn authenticate(&self, ctx: AuthContext<'_>) -> Result<Caller, String> {
        let mut reasons = Vec::new();
        for authenticator in &self.chain {
            match authenticator.authenticate(ctx).await {
                Ok(Some(caller)) if !caller.identities.is_empty() => return Ok(caller),
                Ok(_) => {}
                Err(why) => reasons.push(format!("{}: {why}", authenticator.name())),
            }
        }
        if reasons.is_empty() {
            Err("no credential: neither a client certificate nor a bearer token".into())
        } else {
            Err(format!("authentication failure: [{}]", reasons.join("; ")))
        }
    }
}

/// The bearer token of a call: the first `authorization` value that starts with
/// `Bearer ` (Istio's `ExtractBearerToken`).
pub fn bearer_token(metadata: &MetadataMap) -> Option<&str> {
    metadata
        .get_all("authorization")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The cluster a caller says it is in: the `clusterid` metadata, used only when
/// exactly one value is given (Istio's rule).
pub fn claimed_cluster(metadata: &MetadataMap) -> Option<&str> {
    let mut values = metadata.get_all("clusterid").iter();
    match (values.next(), values.next()) {
        (Some(one), None) => one.to_str().ok().filter(|s| !s.is_empty()),
        _ => None,
    }
}

/// `spiffe://<trust domain>/ns/<ns>/sa/<sa>`, with Istio's `@` → `.` in the domain.
pub fn spiffe_identity(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!(
        "spiffe://{}/ns/{namespace}/sa/{service_account}",
        trust_domain.replace('@', ".")
    )
}

/// The parts of a SPIFFE workload identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffeId<'a> {
    pub trust_domain: &'a str,
    pub namespace: &'a str,
    pub service_account: &'a str,
}

/// Parses `spiffe://td/ns/X/sa/Y` (exactly those five segments), as Istio's
/// `ParseIdentity`.
pub fn parse_spiffe(uri: &str) -> Option<SpiffeId<'_>> {
    let rest = uri.strip_prefix("spiffe://")?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [td, "ns", ns, "sa", sa] if !td.is_empty() => Some(SpiffeId {
            trust_domain: td,
            namespace: ns,
            service_account: sa,
        }),
        _ => None,
    }
}

/// Istio's xDS authorization: the first identity (`spiffe://td/ns/X/sa/Y`) whose
/// namespace is the node's config namespace and whose service account is the node's
/// (each checked only when the node states it) becomes the proxy's verified
/// identity. The trust domain is not compared, as in Istio.
pub fn authorize_proxy(
    identities: &[String],
    namespace: &str,
    service_account: &str,
) -> Result<String, String> {
    identities
        .iter()
        .find(|id| {
            parse_spiffe(id).is_some_and(|id| {
                (namespace.is_empty() || id.namespace == namespace)
                    && (service_account.is_empty() || id.service_account == service_account)
            })
        })
        .cloned()
        .ok_or_else(|| {
            format!("authorization failed: no identities ({identities:?}) matched {namespace}/{service_account}")
        })
}

/// Client certificates (Istio's `ClientCertAuthenticator`): the identities are the
/// SANs of the leaf of a chain the TLS handshake verified against the mesh roots.
#[derive(Debug, Default)]
pub struct ClientCertAuthenticator;

impl Authenticator for ClientCertAuthenticator {
    fn name(&self) -> &'static str {
        "client-cert"
    }

    fn authenticate<'a>(&'a self, ctx: AuthContext<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            let Some(leaf) = ctx.tls.and_then(|t| t.chain.first()) else {
                return Ok(None);
            };
            let identities = uri_sans(leaf.as_ref())?;
            if identities.is_empty() {
                return Err("the client certificate has no URI SAN".into());
            }
            Ok(Some(Caller {
                identities,
                source: "client-cert",
                kube: None,
            }))
        })
    }
}

/// The URI SANs of a DER certificate.
pub fn uri_sans(der: &[u8]) -> Result<Vec<String>, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name {
                out.push((*uri).to_string());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_identities_parse_with_exactly_five_segments() {
        let id = parse_spiffe("spiffe://cluster.local/ns/a/sa/b").unwrap();
        assert_eq!((id.namespace, id.service_account), ("a", "b"));
        assert!(parse_spiffe("spiffe://cluster.local/ns/a/sa/b/c").is_none());
        assert!(parse_spiffe("spiffe://cluster.local/ns/a").is_none());
        assert!(parse_spiffe("https://cluster.local/ns/a/sa/b").is_none());
        assert_eq!(
            spiffe_identity("td@x", "a", "b"),
            "spiffe://td.x/ns/a/sa/b".to_string()
        );
    }

    #[test]
    fn a_proxy_must_claim_its_identitys_namespace_and_service_account() {
        let ids = vec![
            "spiffe://other.domain/ns/a/sa/b".to_string(),
            "spiffe://td/ns/c/sa/d".to_string(),
        ];
        assert_eq!(authorize_proxy(&ids, "c", "d").unwrap(), ids[1]);
        assert_eq!(
            authorize_proxy(&ids, "a", "").unwrap(),
            ids[0],
            "trust domain not checked"
        );
        let why = authorize_proxy(&ids, "e", "d").unwrap_err();
        assert!(
            why.contains("no identities") && why.contains("e/d"),
            "{why}"
        );
        assert!(authorize_proxy(&ids, "c", "x").is_err());
    }

    #[test]
    fn the_bearer_token_and_the_cluster_follow_istio() {
        let mut md = MetadataMap::new();
        assert_eq!(bearer_token(&md), None);
        md.append("authorization", "Basic xyz".parse().unwrap());
        md.append("authorization", "Bearer tok".parse().unwrap());
        assert_eq!(bearer_token(&md), Some("tok"));
        md.append("clusterid", "c1".parse().unwrap());
        assert_eq!(claimed_cluster(&md), Some("c1"));
        md.append("clusterid", "c2".parse().unwrap());
        assert_eq!(claimed_cluster(&md), None);
    }

    #[derive(Debug)]
    struct Fixed(AuthResult);

    impl Authenticator for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn authenticate<'a>(&'a self, _: AuthContext<'a>) -> AuthFuture<'a> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
    }

    #[tokio::test]
    async fn the_first_caller_wins_and_failures_are_all_named() {
        let md = MetadataMap::new();
        let ctx = AuthContext {
            metadata: &md,
            tls: None,
        };
        let who = Caller {
            identities: vec!["spiffe://td/ns/a/sa/b".into()],
            source: "fixed",
            kube: None,
        };
        let chain = Authenticators::new(vec![
            Arc::new(Fixed(Err("bad token".into()))),
            Arc::new(Fixed(Ok(None))),
            Arc::new(Fixed(Ok(Some(who.clone())))),
        ]);
        assert_eq!(chain.authenticate(ctx).await.unwrap(), who);
        let failing = Authenticators::new(vec![
            Arc::new(Fixed(Err("bad token".into()))),
            Arc::new(Fixed(Err("expired".into()))),
        ]);
        let why = failing.authenticate(ctx).await.unwrap_err();
        assert!(
            why.contains("bad token") && why.contains("expired"),
            "{why}"
        );
        let none = Authenticators::new(vec![Arc::new(Fixed(Ok(None)))]);
        assert!(
            none.authenticate(ctx)
                .await
                .unwrap_err()
                .contains("no credential")
        );
    }
}
