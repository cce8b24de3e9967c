//! SDS resource names istiod serves (reference §2): `kubernetes://name`,
//! `kubernetes://ns/name` and `kubernetes-gateway://ns/name`, each with an optional
//! `-cacert` suffix asking for the CA only, and `configmap://ns/name` (a CA read from
//! a ConfigMap's `cacert` or `ca.crt` key; a `-cacert` suffix is dropped).

/// The suffix of a CA-only request.
pub const CA_SUFFIX: &str = "-cacert";

const KUBERNETES: &str = "kubernetes://";
const KUBERNETES_GATEWAY: &str = "kubernetes-gateway://";
const CONFIG_MAP: &str = "configmap://";

/// Which scheme a name used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Scheme {
    /// `kubernetes://`: the proxy's namespace unless named; the proxy's cluster, then
    /// the config cluster.
    Kubernetes,
    /// `kubernetes-gateway://`: namespace required; the config cluster; allowed only
    /// when a Gateway of the proxy references it.
    KubernetesGateway,
    /// `configmap://`: a CA from a ConfigMap; namespace required; the config cluster;
    /// any proxy with a verified identity may read it (a CA is public, and the
    /// ConfigMap is usually in the namespace of the server, not of the client).
    ConfigMap,
}

/// A parsed resource name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretName {
    pub scheme: Scheme,
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's (or ConfigMap's) name without the `-cacert` suffix.
    pub name: String,
    /// Only the CA is asked for (the name ended in `-cacert`, or a ConfigMap).
    pub ca_only: bool,
}

/// Why a name is not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not a scheme istiod serves over ADS (`default`, `ROOTCA`, `file-cert:` come
    /// from the proxy's own agent).
    #[error(
        "unsupported SDS resource name {0:?} (expected kubernetes://, kubernetes-gateway:// or configmap://)"
    )]
    Scheme(String),
    /// The part after the scheme is not `name` or `ns/name`.
    #[error("malformed SDS resource name {0:?} (expected <scheme>[<namespace>/]<name>)")]
    Malformed(String),
    /// `kubernetes-gateway://` or `configmap://` without a namespace.
    #[error("SDS resource name {0:?} needs a namespace (<scheme><namespace>/<name>)")]
    NoNamespace(String),
}

impl SecretName {
    /// Parses `resource`; `proxy_namespace` (the verified identity's) is the
    /// namespace of `kubernetes://name`.
    pub fn parse(resource: &str, proxy_namespace: &str) -> Result<SecretName, NameError> {
        let (scheme, rest) = if let Some(rest) = resource.strip_prefix(KUBERNETES) {
            (Scheme::Kubernetes, rest)
        } else if let Some(rest) = resource.strip_prefix(KUBERNETES_GATEWAY) {
            (Scheme::KubernetesGateway, rest)
        } else if let Some(rest) = resource.strip_prefix(CONFIG_MAP) {
            (Scheme::ConfigMap, rest)
        } else {
            return Err(NameError::Scheme(resource.to_string()));
        };
        let (namespace, name) = match rest.split('/').collect::<Vec<_>>()[..] {
            [name] if scheme == Scheme::Kubernetes => (proxy_namespace, name),
            [_] => return Err(NameError::NoNamespace(resource.to_string())),
            [ns, name] if !ns.is_empty() => (ns, name),
            _ => return Err(NameError::Malformed(resource.to_string())),
        };
        let (name, ca_only) = match name.strip_suffix(CA_SUFFIX) {
            Some(base) => (base, true),
            None => (name, scheme == Scheme::ConfigMap),
        };
        if name.is_empty() || namespace.is_empty() {
            return Err(NameError::Malformed(resource.to_string()));
        }
        Ok(SecretName {
            scheme,
            namespace: namespace.to_string(),
            name: name.to_string(),
            ca_only,
        })
    }

    /// The Secrets to read, in order: for a CA-only request the one literally named
    /// `<name>-cacert`, then `<name>`; else `<name>`. A ConfigMap: `<name>`.
    pub fn candidates(&self) -> Vec<String> {
        if self.ca_only && self.scheme != Scheme::ConfigMap {
            vec![format!("{}{CA_SUFFIX}", self.name), self.name.clone()]
        } else {
            vec![self.name.clone()]
        }
    }

    /// Whether a change of Secret `namespace/name` can change this resource (it is
    /// one of [`SecretName::candidates`], or the base of a `-cacert` twin).
    pub fn reads(&self, namespace: &str, name: &str) -> bool {
        namespace == self.namespace
            && (name == self.name
                || name
                    .strip_suffix(CA_SUFFIX)
                    .is_some_and(|base| base == self.name))
    }
}

/// The resource name a Gateway `credentialName` stands for (istiod's rule): names with
/// a scheme are kept, others get `kubernetes://`.
pub fn from_credential_name(credential_name: &str) -> String {
    if credential_name.contains("://") {
        credential_name.to_string()
    } else {
        format!("{KUBERNETES}{credential_name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str) -> Result<SecretName, NameError> {
        SecretName::parse(name, "proxy-ns")
    }

    #[test]
    fn kubernetes_names_default_to_the_proxy_namespace() {
        let n = parse("kubernetes://cert").unwrap();
        assert_eq!(
            (n.scheme, n.namespace.as_str(), n.name.as_str(), n.ca_only),
            (Scheme::Kubernetes, "proxy-ns", "cert", false)
        );
        let n = parse("kubernetes://other/cert").unwrap();
        assert_eq!((n.namespace.as_str(), n.name.as_str()), ("other", "cert"));
    }

    #[test]
    fn cacert_suffix_asks_for_the_ca_of_the_twin_then_the_base() {
        let n = parse("kubernetes://cert-cacert").unwrap();
        assert!(n.ca_only);
        assert_eq!(n.name, "cert");
        assert_eq!(n.candidates(), vec!["cert-cacert", "cert"]);
        assert!(n.reads("proxy-ns", "cert") && n.reads("proxy-ns", "cert-cacert"));
        assert!(!n.reads("other", "cert") && !n.reads("proxy-ns", "cert2"));
        let plain = parse("kubernetes://cert").unwrap();
        assert_eq!(plain.candidates(), vec!["cert"]);
        assert!(plain.reads("proxy-ns", "cert-cacert"));
    }

    #[test]
    fn gateway_names_need_a_namespace() {
        let n = parse("kubernetes-gateway://ns/cert").unwrap();
        assert_eq!(n.scheme, Scheme::KubernetesGateway);
        assert_eq!(n.namespace, "ns");
        assert!(matches!(
            parse("kubernetes-gateway://cert"),
            Err(NameError::NoNamespace(_))
        ));
    }

    #[test]
    fn config_map_names_need_a_namespace_and_always_ask_for_a_ca() {
        for resource in ["configmap://ns/root", "configmap://ns/root-cacert"] {
            let n = parse(resource).unwrap();
            assert_eq!(
                (n.scheme, n.namespace.as_str(), n.name.as_str(), n.ca_only),
                (Scheme::ConfigMap, "ns", "root", true),
                "{resource}"
            );
            assert_eq!(n.candidates(), vec!["root"]);
            assert!(n.reads("ns", "root") && !n.reads("proxy-ns", "root"));
        }
        assert!(matches!(
            parse("configmap://root"),
            Err(NameError::NoNamespace(_))
        ));
        assert!(matches!(
            parse("configmap:///root"),
            Err(NameError::Malformed(_))
        ));
    }

    #[test]
    fn other_and_malformed_names_are_errors() {
        for name in ["default", "ROOTCA", "file-cert:a~b", "sds://x"] {
            assert!(matches!(parse(name), Err(NameError::Scheme(_))), "{name}");
        }
        for name in [
            "kubernetes://",
            "kubernetes://a/b/c",
            "kubernetes:///x",
            "kubernetes://ns/",
            "kubernetes://-cacert",
        ] {
            assert!(
                matches!(parse(name), Err(NameError::Malformed(_))),
                "{name}"
            );
        }
    }

    #[test]
    fn credential_names_get_the_kubernetes_scheme() {
        assert_eq!(from_credential_name("cert"), "kubernetes://cert");
        assert_eq!(
            from_credential_name("kubernetes-gateway://ns/c"),
            "kubernetes-gateway://ns/c"
        );
    }
}
