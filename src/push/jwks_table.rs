//! The JWKS documents a snapshot carries for its RequestAuthentications (fetched by
//! [`crate::jwks`], read by [`crate::generate::jwt`]), and who fetches the keys of a
//! rule (`PILOT_JWT_ENABLE_REMOTE_JWKS`). Plain data, so the config index can hold it.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshfed_api::security::v1beta1::JwtRule;

/// The keys of one rule as the control plane fetches them (Istio's `jwtKey`): the
/// issuer, and the `jwksUri` (empty: found by OIDC discovery of the issuer).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JwksKey {
    pub issuer: String,
    pub jwks_uri: String,
}

impl JwksKey {
    /// The key a rule without inline `jwks` is fetched under; `None` for inline keys.
    pub fn of(rule: &JwtRule) -> Option<JwksKey> {
        rule.jwks.is_empty().then(|| JwksKey {
            issuer: rule.issuer.clone(),
            jwks_uri: rule.jwks_uri.clone(),
        })
    }
}

/// Who fetches the keys of a rule with `jwksUri` (Istio's `PILOT_JWT_ENABLE_REMOTE_JWKS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JwksFetchMode {
    /// The control plane fetches and inlines them (`false`, `istiod`; the default).
    #[default]
    Istiod,
    /// Envoy fetches them (`remote_jwks`) through the outbound cluster of the URI's
    /// host, which must be a service of the registry (`true`, `envoy`).
    Envoy,
    /// Envoy fetches them when the URI's host is a service of the registry, the
    /// control plane otherwise (`hybrid`).
    Hybrid,
}

impl JwksFetchMode {
    /// The mode a value of `PILOT_JWT_ENABLE_REMOTE_JWKS` names, as Istio reads it (any
    /// other value is Istio's default); the error says an unknown value was ignored.
    pub fn parse(value: Option<&str>) -> (JwksFetchMode, Option<String>) {
        match value.map(str::to_ascii_lowercase).as_deref() {
            None | Some("" | "false" | "istiod") => (JwksFetchMode::Istiod, None),
            Some("true" | "envoy") => (JwksFetchMode::Envoy, None),
            Some("hybrid") => (JwksFetchMode::Hybrid, None),
            Some(other) => (
                JwksFetchMode::Istiod,
                Some(format!(
                    "PILOT_JWT_ENABLE_REMOTE_JWKS={other} is none of false, istiod, true, envoy, \
                     hybrid: the control plane fetches JWKS (Istio's default)"
                )),
            ),
        }
    }
}

/// The JWKS documents the control plane fetched, by key, and who fetches what: carried
/// in the snapshot's config index so that generation reads them without IO.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwksTable {
    documents: BTreeMap<JwksKey, Arc<str>>,
    mode: JwksFetchMode,
}

impl JwksTable {
    /// A table of these documents, in the default mode (the control plane fetches).
    pub fn new(documents: BTreeMap<JwksKey, Arc<str>>) -> JwksTable {
        JwksTable {
            documents,
            mode: JwksFetchMode::Istiod,
        }
    }

    /// The same table in `mode`.
    pub fn with_mode(mut self, mode: JwksFetchMode) -> JwksTable {
        self.mode = mode;
        self
    }

    /// Who fetches the keys of rules with `jwksUri`.
    pub fn mode(&self) -> JwksFetchMode {
        self.mode
    }

    /// The fetched document of `key`, if any.
    pub fn get(&self, key: &JwksKey) -> Option<&str> {
        self.documents.get(key).map(|d| &**d)
    }

    /// How many documents it holds.
    pub fn len(&self) -> usize {
        self.documents.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }
}
