//! The keys of a `JWT_RULE` issuer: an inline JWKS, or one fetched from the
//! issuer (its `jwksUri`, or the `jwks_uri` of its OIDC discovery document),
//! cached, refreshed on an interval and refetched when a token names an unknown
//! `kid` — at most once a minute.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use reqwest::Url;
use serde::Deserialize;
use tracing::{debug, warn};

/// The refetch floor: a token naming an unknown `kid` (or a failed fetch) triggers
/// at most one fetch per minute, so bad tokens cannot turn istiod into a load
/// generator against the issuer.
const MIN_REFETCH: Duration = Duration::from_secs(60);
/// Keys older than this are refetched before use (Envoy's default JWKS cache
/// duration); a failed refresh keeps the old keys.
pub(super) const REFRESH: Duration = Duration::from_secs(600);
/// The largest JWKS or discovery document read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// The signature algorithms a JWKS key may verify: asymmetric only. An HMAC
/// "key" in a public key set would let anyone who read the set mint tokens.
pub(super) const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// One verification key of a JWKS.
#[derive(Debug)]
pub(super) struct VerifyingKey {
    kid: Option<String>,
    /// The key's `alg`, when the JWKS pins one.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

/// The keys in hand, and when they were fetched (`None`: inline, or never).
#[derive(Debug, Default)]
pub(super) struct Keys {
    keys: Vec<VerifyingKey>,
    fetched_at: Option<Instant>,
}

impl Keys {
    /// The keys that may verify a token with `kid` and `alg`: with a `kid`, the
    /// keys of that `kid`; without, every key (go-oidc's rule); always of the
    /// algorithm's family and, when the key pins one, its algorithm.
    pub(super) fn matching<'k>(
        &'k self,
        kid: Option<&'k str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'k DecodingKey> + 'k {
        self.keys
            .iter()
            .filter(move |k| kid.is_none() || k.kid.as_deref() == kid)
            .filter(move |k| k.alg.is_none_or(|a| a == alg))
            .filter(move |k| k.key.family() == alg.family())
            .map(|k| &k.key)
    }
}

/// Where the keys come from.
#[derive(Debug)]
enum Source {
    /// The rule's inline `jwks`, never refetched.
    Inline,
    /// Fetched from the issuer's JWKS URL.
    Remote { url: Url, client: reqwest::Client },
}

/// The outcome of the last fetch attempt, behind the single-flight lock.
#[derive(Debug, Default)]
struct FetchState {
    last_attempt: Option<Instant>,
    last_error: Option<String>,
}

/// The issuer's keys: read without locking; fetched by one caller at a time.
#[derive(Debug)]
pub(super) struct KeySet {
    source: Source,
    current: ArcSwap<Keys>,
    fetch: tokio::sync::Mutex<FetchState>,
}

impl KeySet {
    pub(super) fn inline(keys: Vec<VerifyingKey>) -> Self {
        KeySet {
            source: Source::Inline,
            current: ArcSwap::from_pointee(Keys {
                keys,
                fetched_at: None,
            }),
            fetch: Default::default(),
        }
    }

    pub(super) fn remote(url: Url, client: reqwest::Client) -> Self {
        KeySet {
            source: Source::Remote { url, client },
            current: Default::default(),
            fetch: Default::default(),
        }
    }

    /// Keys with at least one candidate for the token, fetching first when the
    /// keys are missing, stale, or lack the token's `kid` — at most once per
    /// [`MIN_REFETCH`]. A fetch that fails leaves the old keys in place; with no
    /// candidate the token is refused (fail closed), naming the fetch error.
    pub(super) async fn for_token(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
        now: Instant,
    ) -> Result<Arc<Keys>, String> {
        let Source::Remote { url, client } = &self.source else {
            let keys = self.current.load_full();
            let found = keys.matching(kid, alg).next().is_some();
            return if found {
                Ok(keys)
            } else {
                Err(no_key(kid, alg, "the rule's inline jwks"))
            };
        };
        let keys = self.current.load_full();
        if !self.is_stale(&keys, now) && keys.matching(kid, alg).next().is_some() {
            return Ok(keys);
        }

        let mut state = self.fetch.lock().await;
        // Another caller may have fetched while this one waited for the lock.
        let mut keys = self.current.load_full();
        let fresh_enough = !self.is_stale(&keys, now) && keys.matching(kid, alg).next().is_some();
        let may_fetch = state
            .last_attempt
            .is_none_or(|at| now.saturating_duration_since(at) >= MIN_REFETCH);
        if !fresh_enough && may_fetch {
            state.last_attempt = Some(now);
            match fetch_jwks(client, url).await {
                Ok(fetched) => {
                    debug!(%url, keys = fetched.len(), "fetched the JWT issuer's keys");
                    state.last_error = None;
                    keys = Arc::new(Keys {
                        keys: fetched,
                        fetched_at: Some(now),
                    });
                    self.current.store(keys.clone());
                }
                Err(e) => {
                    warn!(%url, error = %e, "cannot fetch the JWT issuer's keys");
                    state.last_error = Some(e);
                }
            }
        }
        let found = keys.matching(kid, alg).next().is_some();
        if found {
            return Ok(keys);
        }
        match &state.last_error {
            Some(e) => Err(format!("no key for the token: {e}")),
            None => Err(no_key(kid, alg, url.as_str())),
        }
    }

    /// Remote keys never fetched, or older than the refresh interval.
    fn is_stale(&self, keys: &Keys, now: Instant) -> bool {
        keys.fetched_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REFRESH)
    }
}

fn no_key(kid: Option<&str>, alg: Algorithm, place: &str) -> String {
    match kid {
        Some(kid) => format!("unknown kid {kid:?}: no {alg:?} key of that kid in {place}"),
        None => format!("no {alg:?} key in {place}"),
    }
}

/// The verification keys of a JWKS document. Keys that cannot verify a JWS here
/// (encryption keys, symmetric keys, unknown types or algorithms) are skipped,
/// so one exotic key does not hide the rest; a set with none left is an error.
pub(super) fn parse_jwks(document: &[u8]) -> Result<Vec<VerifyingKey>, String> {
    #[derive(Deserialize)]
    struct RawSet {
        keys: Vec<serde_json::Value>,
    }
    let raw: RawSet =
        serde_json::from_slice(document).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut out = Vec::new();
    for value in raw.keys {
        match verifying_key(value) {
            Ok(key) => out.push(key),
            Err(why) => debug!(%why, "skipping a JWKS key"),
        }
    }
    if out.is_empty() {
        return Err("the JWKS holds no usable signature key".into());
    }
    Ok(out)
}

fn verifying_key(value: serde_json::Value) -> Result<VerifyingKey, String> {
    let jwk: Jwk = serde_json::from_value(value).map_err(|e| e.to_string())?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Err("an encryption key".into());
    }
    if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
        return Err("a symmetric key".into());
    }
    let alg = match jwk.common.key_algorithm {
        Some(alg) => {
            let alg = Algorithm::from_str(&alg.to_string())
                .map_err(|_| format!("algorithm {alg} is not a signature algorithm"))?;
            if !ASYMMETRIC.contains(&alg) {
                return Err(format!("algorithm {alg:?} is not accepted"));
            }
            Some(alg)
        }
        None => None,
    };
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
    Ok(VerifyingKey {
        kid: jwk.common.key_id,
        alg,
        key,
    })
}

// === fetching ===

/// The part of an OIDC provider's metadata used here.
#[derive(Deserialize)]
pub(super) struct ProviderMetadata {
    issuer: String,
    pub(super) jwks_uri: String,
    #[serde(default)]
    pub(super) id_token_signing_alg_values_supported: Vec<String>,
}

pub(crate) fn http_client(timeout: Duration) -> Result<reqwest::Client, String> {
    // reqwest is built without a crypto provider of its own; ring is the one in
    // the build, and reqwest panics when none is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .user_agent(concat!("meshfed/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the JWKS HTTP client: {e}"))
}

/// OIDC discovery: `<issuer>/.well-known/openid-configuration`, whose `issuer`
/// must be the rule's (go-oidc's check).
pub(super) async fn discover(
    client: &reqwest::Client,
    issuer: &str,
) -> Result<ProviderMetadata, String> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let url = http_url(&url)?;
    let document = get(client, &url)
        .await
        .map_err(|e| format!("the OIDC discovery of {issuer} failed: {e}"))?;
    let provider: ProviderMetadata = serde_json::from_slice(&document).map_err(|e| {
        format!("the OIDC discovery of {issuer}: {url} is not provider metadata: {e}")
    })?;
    if provider.issuer != issuer {
        return Err(format!(
            "the OIDC discovery of {issuer}: the provider names issuer {:?}",
            provider.issuer
        ));
    }
    Ok(provider)
}

async fn fetch_jwks(client: &reqwest::Client, url: &Url) -> Result<Vec<VerifyingKey>, String> {
    let document = get(client, url).await?;
    parse_jwks(&document).map_err(|e| format!("{url}: {e}"))
}

/// A GET that must succeed with a body of bounded size.
pub(crate) async fn get(client: &reqwest::Client, url: &Url) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET {url}: status {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?
    {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!("GET {url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `text` as an http or https URL.
pub(crate) fn http_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(format!("{text:?} has scheme {other}, not http or https")),
    }
}
