//! Third-party JWTs (Istio's `JWT_RULE`, reference §1.6): workloads outside Kubernetes
//! (VMs, Consul services) present a token from an OIDC issuer the operator trusts;
//! the token's signature is checked against the issuer's JWKS and its `sub`
//! (`system:serviceaccount:<ns>:<sa>`) names the caller.
//!
//! Facts kept from Istio (`security/pkg/server/ca/authenticate/oidc.go`, which
//! verifies through go-oidc):
//!
//! * the keys come from `jwksUri`, else from OIDC discovery
//!   (`<issuer>/.well-known/openid-configuration`, run once at construction; a
//!   failed discovery fails construction, and the document's `issuer` must be the
//!   rule's);
//! * `iss` must equal the rule's issuer; `exp` is required and has no leeway; `nbf`,
//!   when present, has five minutes of leeway;
//! * `sub` must be `system:serviceaccount:<ns>:<sa>`, checked before the audience;
//! * the audience check passes when one of the token's `aud` values is one of the
//!   rule's `audiences`, so **a rule without audiences accepts no token**;
//! * the identity is `spiffe://<trust domain>/ns/<ns>/sa/<sa>`;
//! * only the `authorization: Bearer` token is read (`fromHeaders`, `fromParams`,
//!   ... are Envoy's request-authentication fields; the CA ignores them).
//!
//! Where we differ, on purpose: an inline `jwks` is used (Istio's CA ignores it,
//! the field's doc says it wins over `jwksUri`); `aud` may be a single string
//! (RFC 7519; Istio's claim struct only takes an array); a `sub` must have exactly
//! four non-empty parts (Istio indexes the split without a length check); every
//! asymmetric algorithm is accepted on the `jwksUri` path (go-oidc defaults to
//! RS256 there), never an HMAC one; fetched keys are refreshed on a fixed interval
//! and refetches are rate limited (go-oidc refetches on every miss).

pub(crate) mod keys;

use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, Validation, decode, decode_header};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use self::keys::{ASYMMETRIC, KeySet, discover, http_client, http_url, parse_jwks};
use super::spiffe_identity;
use super::{AuthContext, AuthFuture, AuthResult, Authenticator, Caller, bearer_token};

/// How long a JWKS or discovery fetch may take when the rule sets no `timeout`
/// (Envoy's default for remote JWKS).
const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// `nbf` leeway, as go-oidc allows for clock skew.
const NBF_LEEWAY_SECS: f64 = 300.0;

// === impl JwtRule ===

/// Istio's `JWTRule` (istio/api `security/v1beta1`), as the `JWT_RULE` environment
/// variable holds it: JSON with the proto's camelCase names (the snake_case
/// originals are accepted too, and unknown fields are refused, as Istio's
/// protobuf JSON decoding does). Empty strings mean unset, as in proto3.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JwtRule {
    /// The `iss` every token must carry; also the base of OIDC discovery.
    pub issuer: String,
    /// Accepted `aud` values; a token must carry one of them.
    pub audiences: Vec<String>,
    /// Where the issuer's JWKS is fetched; empty: found by OIDC discovery.
    #[serde(alias = "jwks_uri")]
    pub jwks_uri: String,
    /// An inline JWKS (JSON); when set, `jwks_uri` is ignored.
    pub jwks: String,
    /// Envoy's token locations; not read by the CA (bearer token only).
    #[serde(alias = "from_headers")]
    pub from_headers: Vec<JwtHeader>,
    /// Envoy's query-parameter token locations; not read by the CA.
    #[serde(alias = "from_params")]
    pub from_params: Vec<String>,
    /// Envoy's cookie token locations; not read by the CA.
    #[serde(alias = "from_cookies")]
    pub from_cookies: Vec<String>,
    /// Envoy's payload forwarding; not used by the CA.
    #[serde(alias = "output_payload_to_header")]
    pub output_payload_to_header: String,
    /// Envoy's token forwarding; not used by the CA.
    #[serde(alias = "forward_original_token")]
    pub forward_original_token: bool,
    /// Envoy's claim-to-header copying; not used by the CA.
    #[serde(alias = "output_claim_to_headers")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long a JWKS (or discovery) fetch may take, as a protobuf JSON duration
    /// (`"5s"`, `"1.5s"`); default 5 s.
    pub timeout: Option<String>,
}

/// A header a token may be read from (`JWTHeader`); kept for fidelity, unused here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtHeader {
    /// The header's name.
    pub name: String,
    /// The prefix stripped before the token.
    pub prefix: String,
}

/// A claim copied into a header (`ClaimToHeader`); kept for fidelity, unused here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClaimToHeader {
    /// The header written.
    pub header: String,
    /// The claim read.
    pub claim: String,
}

impl JwtRule {
    /// Parses and checks a `JWT_RULE` value: the JSON must decode, name an issuer,
    /// and give a way to the keys — a usable inline `jwks`, an http(s) `jwksUri`, or
    /// an http(s) issuer to run OIDC discovery against.
    pub fn parse(json: &str) -> Result<JwtRule, String> {
        let rule: JwtRule = serde_json::from_str(json)
            .map_err(|e| format!("JWT_RULE is not a JWTRule JSON object: {e}"))?;
        rule.check()?;
        Ok(rule)
    }

    /// The checks of [`JwtRule::parse`], for a rule built in code.
    fn check(&self) -> Result<(), String> {
        if self.issuer.trim().is_empty() {
            return Err("JWT_RULE has no issuer".into());
        }
        self.fetch_timeout()?;
        if !self.jwks.is_empty() {
            parse_jwks(self.jwks.as_bytes()).map_err(|e| format!("JWT_RULE jwks: {e}"))?;
        } else if !self.jwks_uri.is_empty() {
            http_url(&self.jwks_uri).map_err(|e| format!("JWT_RULE jwksUri: {e}"))?;
        } else if let Err(e) = http_url(&self.issuer) {
            return Err(format!(
                "JWT_RULE gives neither jwks nor jwksUri, and its issuer cannot be used \
                 for OIDC discovery: {e}"
            ));
        }
        Ok(())
    }

    /// The fetch timeout the rule asks for, else the default.
    fn fetch_timeout(&self) -> Result<Duration, String> {
        let Some(text) = self.timeout.as_deref() else {
            return Ok(DEFAULT_FETCH_TIMEOUT);
        };
        text.strip_suffix('s')
            .and_then(|secs| secs.parse::<f64>().ok())
            .filter(|secs| *secs > 0.0)
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| {
                format!("JWT_RULE timeout {text:?} is not a positive duration like \"5s\"")
            })
    }
}

// === impl JwtAuthenticator ===

/// The `JWT_RULE` authenticator (Istio's `JwtAuthenticator`, source `jwt`).
#[derive(Debug)]
pub struct JwtAuthenticator {
    /// The `iss` tokens must carry.
    issuer: String,
    /// Accepted `aud` values; empty accepts no token, as in Istio.
    audiences: Vec<String>,
    /// The trust domain of the identities named.
    trust_domain: String,
    /// Signature algorithms accepted (narrowed by the discovery document).
    algorithms: Vec<Algorithm>,
    /// The issuer's keys.
    keys: KeySet,
}

impl JwtAuthenticator {
    /// An authenticator for `rule`, naming callers in `trust_domain`. Without
    /// `jwks` or `jwksUri`, runs OIDC discovery now, and fails if it fails (as
    /// Istio's constructor does); a `jwksUri` is fetched lazily, on first use.
    pub async fn new(rule: JwtRule, trust_domain: String) -> Result<Self, String> {
        rule.check()?;
        let mut algorithms = ASYMMETRIC.to_vec();
        let keys = if !rule.jwks.is_empty() {
            if !rule.jwks_uri.is_empty() {
                debug!(issuer = %rule.issuer, "JWT_RULE has jwks and jwksUri; using jwks");
            }
            KeySet::inline(parse_jwks(rule.jwks.as_bytes())?)
        } else {
            let client = http_client(rule.fetch_timeout()?)?;
            let url = if rule.jwks_uri.is_empty() {
                let provider = discover(&client, &rule.issuer).await?;
                let advertised: Vec<Algorithm> = provider
                    .id_token_signing_alg_values_supported
                    .iter()
                    .filter_map(|name| Algorithm::from_str(name).ok())
                    .filter(|alg| ASYMMETRIC.contains(alg))
                    .collect();
                if !advertised.is_empty() {
                    algorithms = advertised;
                }
                http_url(&provider.jwks_uri)
                    .map_err(|e| format!("the OIDC discovery of {}: jwks_uri {e}", rule.issuer))?
            } else {
                http_url(&rule.jwks_uri)?
            };
            KeySet::remote(url, client)
        };
        if rule.audiences.is_empty() {
            warn!(
                issuer = %rule.issuer,
                "JWT_RULE lists no audiences: no token will be accepted (Istio's rule)"
            );
        }
        Ok(JwtAuthenticator {
            issuer: rule.issuer,
            audiences: rule.audiences,
            trust_domain,
            algorithms,
            keys,
        })
    }

    /// Verifies `token` with `now` as the clock of the key cache (the token's own
    /// times are checked against the wall clock).
    async fn verify(&self, token: &str, now: Instant) -> Result<Caller, String> {
        let header = decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        let alg = header.alg;
        if !self.algorithms.contains(&alg) {
            return Err(format!("the token's algorithm {alg:?} is not accepted"));
        }
        let kid = header.kid.as_deref();
        let keys = self.keys.for_token(kid, alg, now).await?;

        let mut validation = Validation::new(alg);
        validation.leeway = 0;
        validation.validate_aud = false;
        validation.validate_nbf = false;
        let mut last = None;
        let mut claims = None;
        for key in keys.matching(kid, alg) {
            match decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) if is_key_mismatch(&e) => last = Some(e),
                Err(e) => return Err(describe(&e)),
            }
        }
        let Some(claims) = claims else {
            return Err(last.map_or_else(
                || "no key of the issuer fits the token".into(),
                |e| describe(&e),
            ));
        };
        self.caller(claims)
    }

    /// The claim checks after the signature, in Istio's order: issuer and times
    /// (go-oidc), then `sub`, then the audience.
    fn caller(&self, claims: Claims) -> Result<Caller, String> {
        match claims.iss.as_deref() {
            Some(iss) if iss == self.issuer => {}
            Some(iss) => return Err(format!("issuer {iss:?} is not {:?}", self.issuer)),
            None => return Err("the token has no iss claim".into()),
        }
        if let Some(nbf) = claims.nbf
            && nbf > unix_now() + NBF_LEEWAY_SECS
        {
            return Err(format!("the token is not valid before {nbf}"));
        }
        let sub = claims.sub.unwrap_or_default();
        let (namespace, service_account) = service_account(&sub)
            .ok_or_else(|| format!("malformed sub {sub:?}: not system:serviceaccount:<ns>:<sa>"))?;
        let aud = claims.aud.map(Audience::into_vec).unwrap_or_default();
        if !aud.iter().any(|a| self.audiences.contains(a)) {
            return Err(format!(
                "wrong audience {aud:?}: none of {:?}",
                self.audiences
            ));
        }
        Ok(Caller {
            identities: vec![spiffe_identity(
                &self.trust_domain,
                namespace,
                service_account,
            )],
            source: "jwt",
            kube: None,
        })
    }
}

impl Authenticator for JwtAuthenticator {
    fn name(&self) -> &'static str {
        "jwt"
    }

    fn authenticate<'a>(&'a self, ctx: AuthContext<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            let Some(token) = bearer_token(ctx.metadata) else {
                return Ok(None);
            };
            let verdict: AuthResult = self.verify(token, Instant::now()).await.map(Some);
            if let Err(why) = &verdict {
                debug!(issuer = %self.issuer, %why, "JWT refused");
            }
            verdict
        })
    }
}

/// `system:serviceaccount:<ns>:<sa>` → `(ns, sa)`.
fn service_account(sub: &str) -> Option<(&str, &str)> {
    let mut parts = sub.split(':');
    match (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next(),
    ) {
        ("system", "serviceaccount", ns, sa, None) if !ns.is_empty() && !sa.is_empty() => {
            Some((ns, sa))
        }
        _ => None,
    }
}

/// The claims read after the signature is checked.
#[derive(Deserialize)]
struct Claims {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<Audience>,
    nbf: Option<f64>,
}

/// `aud`: one string or an array (RFC 7519 §4.1.3).
#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn into_vec(self) -> Vec<String> {
        match self {
            Audience::One(one) => vec![one],
            Audience::Many(many) => many,
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Errors that mean "this key did not verify the token", so the next candidate
/// key may.
fn is_key_mismatch(e: &jsonwebtoken::errors::Error) -> bool {
    use jsonwebtoken::errors::ErrorKind as K;
    matches!(
        e.kind(),
        K::InvalidSignature
            | K::InvalidAlgorithm
            | K::InvalidKeyFormat
            | K::InvalidRsaKey(_)
            | K::InvalidEcdsaKey
            | K::InvalidEddsaKey
    )
}

/// A refusal reason for a decoding error.
fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => "bad signature: no key of the issuer verifies the token".into(),
        K::ExpiredSignature => "the token has expired".into(),
        K::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        K::InvalidClaimFormat(claim) => format!("the token's {claim} claim is malformed"),
        K::InvalidToken | K::Base64(_) | K::Json(_) | K::Utf8(_) => {
            format!("malformed token: {e}")
        }
        _ => format!("the token does not verify: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::keys::REFRESH;
    use super::test_issuer::Issuer;
    use super::*;
    use jsonwebtoken::jwk::Jwk;

    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::{Value, json};
    use tonic::metadata::MetadataMap;

    /// A fixed 2048-bit RSA key (PKCS#1) for RS256 tokens: test only, generated
    /// for these tests with `openssl genrsa`.
    const RSA_PEM: &str = "\
-----BEGIN RSA PRIVATE KEY-----\n\
MIIEoQIBAAKCAQEApJz7nccqHUCBKzVv4lmbKt9PY6oTFppJ77niBB/GztxZXjjA\n\
ylNPw6/27xIR4GfV54mBblis4epqANqdyDZok+bFt3jLnyV1TVwvVCenpBKSbKqu\n\
sIczkr+q3jMGnKNwmqJCgcuUnNcIzOQ+98TinMLBV5MqyZpv56rDEnavEF1zeg6w\n\
DlYwdSCTgypoxNXiXjWqQ8LB6m0Kj4RykpOe7SWpe7bFLHV9ry14QlP9DNlPQi2T\n\
hhe6PXImoKWqE3xL4ZwwSxIxlb14NQ751UUOtpgrxsAKeDiKXO/fUKCpn8VsOH7Y\n\
47BypNxw3jv8tQvN76QbIi1wv5Pnxk3ZrVTb/QIDAQABAoH/CsU6sVgWqVNPIESe\n\
zXCPdn6l8x9toEz4CXdgEmUB3QcN0dxkwNgyn9sjjQDhqo0gscWNcmra5O0xglzL\n\
dg4ZSZQP27FLoV4SDr25Wwg9L78HVZTVWTd/aFqiE2fDRvxqobN8JoHrd1eae81z\n\
UULQkPEtNU2rvwUbzUye9tZNHgTkWEVvJIXj7MTcEAZeo+6TdVy2gzvunqMOc3Rw\n\
CAcOpvXPkUglOZCzo2oc+xBC9Po3FjvuuQIbkgPXEtoNYaiFupsPi158GVEIQYNG\n\
Bl9KpwbHPzNDzOnWArAj96GY4Q8EpmvXBlhnPIHI5D7aJQfB2end9fMz29d5ZlQ2\n\
PoQhAoGBAN2XLp2ur3Bvytdo44IIze+H4Cr4Jx8lQYl476zoFNj+PbgdOCdT9YF2\n\
ClsYG9FHph9+/2Zkb3T3l3LzFk2+oKF34B8oxtx0qEvDExXRnXaCwn/dE/jAeUtv\n\
UP3UKW8aP/UpihG2e9pnm9vMMpnKw8axPXez5eA6OmZe4czFzDTdAoGBAL4szIZR\n\
BcSjYKuSfW3C4kDuNE+JjTJgxXgaOsXghQ+alHLbKx+nbgDA6cbivgU/oy7HxrdY\n\
DjTJtdxaY2gM3SKVoLb1hDM7C4cKIaZN2D/x1rrW5TQYXaNvKfI3W38jnfXHSP1+\n\
bwH52RiIBaletINSt1zBUIf7HuyFLTXQ8cGhAoGAGy19tC1Gqz2q3TyqGrrFt0ks\n\
/1gsRC+nmBrTGpvkYrDcFQbQalJr3BMENiQA1Ww6PcavwHk1Cl2Ln7ec1rA4t1Ui\n\
ke/IZCWStqgYYSayb2SeQlx1JJ9GwS/H+TnaUxwfGAyeOInvKtxmS1ECK8aouGfo\n\
qBPSb+v0WbXtb9Yas6kCgYEAp8+UMjmwo1GfbgZ307ESQUVwt3ajN38ZAN/0WMPD\n\
5n7621b2eJofgV65axyNnMgI0LDMcuCquH39khHYgepH/8qU5J1FKIfDpkeUZdFv\n\
Lw3R81DJM+0EQ8FF/ExI2qmtK0HM8JLulYnIvdLZXBkLpI4K6zhSPYukQAVMXZ6g\n\
lcECgYACzobf1dIXwJmTysuep4naUIXlSOWoJyf7cbB4seri/oghRac8D3+W89nI\n\
k6f20uiffsZ75F3UPx4EA3dm+dnR8nein6kihphkEhNEfdoB6odQIyWOQRfcXhZZ\n\
n7o+j1Cb29fRPnInctCk+sfUKKoDZslM3T0mRYq+vbWuUi7Bew==\n\
-----END RSA PRIVATE KEY-----\n\
";

    const TD: &str = "example.org";
    const AUD: &str = "istio-ca";

    /// A signing key and its public JWK.
    struct Signer {
        kid: String,
        alg: Algorithm,
        key: EncodingKey,
        jwk: Jwk,
    }

    impl Signer {
        fn new(kid: &str, alg: Algorithm, key: EncodingKey) -> Signer {
            let mut jwk = Jwk::from_encoding_key(&key, alg).unwrap();
            jwk.common.key_id = Some(kid.into());
            Signer {
                kid: kid.into(),
                alg,
                key,
                jwk,
            }
        }

        fn rsa(kid: &str) -> Signer {
            let der = pem::parse(RSA_PEM).unwrap();
            let key = EncodingKey::from_rsa_der(der.contents());
            Signer::new(kid, Algorithm::RS256, key)
        }

        /// A fresh P-256 key.
        fn ec(kid: &str) -> Signer {
            let pkcs8 = rcgen::KeyPair::generate().unwrap().serialize_der();
            let key = EncodingKey::from_ec_der(&pkcs8);
            Signer::new(kid, Algorithm::ES256, key)
        }

        /// A token of these claims, under this key's `kid`.
        fn mint(&self, claims: &Value) -> String {
            self.mint_as(&self.kid, claims)
        }

        fn mint_as(&self, kid: &str, claims: &Value) -> String {
            let mut header = Header::new(self.alg);
            header.kid = Some(kid.into());
            encode(&header, claims, &self.key).unwrap()
        }
    }

    fn jwks(signers: &[&Signer]) -> String {
        let keys: Vec<&Jwk> = signers.iter().map(|s| &s.jwk).collect();
        json!({ "keys": keys }).to_string()
    }

    fn now() -> i64 {
        unix_now() as i64
    }

    /// Claims of a good token of `issuer` for `bar/foo`.
    fn claims(issuer: &str) -> Value {
        json!({
            "iss": issuer,
            "sub": "system:serviceaccount:bar:foo",
            "aud": [AUD],
            "exp": now() + 3600,
        })
    }

    fn with(mut claims: Value, key: &str, value: Value) -> Value {
        claims[key] = value;
        claims
    }

    /// The JWT rule of a loopback issuer, for audience [`AUD`].
    fn rule(issuer: &Issuer) -> JwtRule {
        JwtRule {
            issuer: issuer.url.clone(),
            jwks_uri: format!("{}/keys", issuer.url),
            audiences: vec![AUD.into()],
            ..Default::default()
        }
    }

    async fn authenticate(authn: &JwtAuthenticator, token: Option<&str>) -> AuthResult {
        let mut metadata = MetadataMap::new();
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            metadata.insert("authorization", value);
        }
        let ctx = AuthContext {
            metadata: &metadata,
            tls: None,
        };
        authn.authenticate(ctx).await
    }

    async fn identity(authn: &JwtAuthenticator, token: &str) -> String {
        let caller = authenticate(authn, Some(token)).await.unwrap().unwrap();
        assert_eq!(caller.source, "jwt");
        assert_eq!(caller.identities.len(), 1);
        caller.identities[0].clone()
    }

    async fn refusal(authn: &JwtAuthenticator, token: &str) -> String {
        authenticate(authn, Some(token)).await.unwrap_err()
    }

    #[test]
    fn rules_parse_as_istio_reads_jwt_rule() {
        let rule = JwtRule::parse(
            r#"{"issuer":"https://i.example","jwksUri":"https://i.example/k","audiences":["a"]}"#,
        )
        .unwrap();
        assert_eq!(rule.jwks_uri, "https://i.example/k");
        assert_eq!(rule.audiences, vec!["a".to_string()]);
        // The proto's original names decode too (Istio's own test uses them).
        let snake =
            JwtRule::parse(r#"{"issuer":"https://i.example","jwks_uri":"https://i.example/k"}"#)
                .unwrap();
        assert_eq!(snake.jwks_uri, "https://i.example/k");
        // Discovery is the way to the keys when only an http(s) issuer is given.
        assert!(JwtRule::parse(r#"{"issuer":"https://i.example"}"#).is_ok());

        let refused = |json: &str| JwtRule::parse(json).unwrap_err();
        assert!(refused("{").contains("not a JWTRule JSON"));
        assert!(refused(r#"{"issuer":"x","jwksUrl":"y"}"#).contains("unknown field"));
        assert!(refused(r#"{"jwksUri":"https://i.example/k"}"#).contains("no issuer"));
        assert!(refused(r#"{"issuer":"foo"}"#).contains("OIDC discovery"));
        assert!(refused(r#"{"issuer":"foo","jwksUri":"ftp://x/k"}"#).contains("jwksUri"));
        assert!(refused(r#"{"issuer":"foo","jwks":"{\"keys\":[]}"}"#).contains("no usable"));
        assert!(refused(r#"{"issuer":"https://i","timeout":"soon"}"#).contains("timeout"));
        let timed = JwtRule::parse(r#"{"issuer":"https://i","timeout":"1.5s"}"#).unwrap();
        assert_eq!(timed.fetch_timeout().unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn subjects_name_a_service_account_in_exactly_four_parts() {
        let sa = service_account;
        assert_eq!(sa("system:serviceaccount:bar:foo"), Some(("bar", "foo")));
        assert_eq!(sa("system:serviceaccount:bar"), None);
        assert_eq!(sa("system:serviceaccount:bar:foo:x"), None);
        assert_eq!(sa("system:serviceaccount::foo"), None);
        assert_eq!(sa("system:serviceaccounts:bar:foo"), None);
        assert_eq!(sa("bar:foo"), None);
        assert_eq!(sa(""), None);
    }

    #[tokio::test]
    async fn an_inline_jwks_verifies_rs256_tokens() {
        let key = Signer::rsa("rsa-1");
        let rule = JwtRule {
            issuer: "https://issuer.example".into(),
            jwks: jwks(&[&key]),
            // Ignored when jwks is given.
            jwks_uri: "https://unreachable.invalid/keys".into(),
            audiences: vec![AUD.into()],
            ..Default::default()
        };
        let authn = JwtAuthenticator::new(rule, "td@x".into()).await.unwrap();
        assert_eq!(authn.name(), "jwt");
        let token = key.mint(&claims("https://issuer.example"));
        assert_eq!(
            identity(&authn, &token).await,
            "spiffe://td.x/ns/bar/sa/foo"
        );
        // A single-string aud is an audience too.
        let one = key.mint(&with(claims("https://issuer.example"), "aud", json!(AUD)));
        assert_eq!(identity(&authn, &one).await, "spiffe://td.x/ns/bar/sa/foo");
        let why = refusal(
            &authn,
            &key.mint_as("rsa-2", &claims("https://issuer.example")),
        )
        .await;
        assert!(why.contains("unknown kid \"rsa-2\""), "{why}");
        assert_eq!(authenticate(&authn, None).await, Ok(None));
    }

    #[tokio::test]
    async fn tokens_are_refused_with_the_reason() {
        let key = Signer::ec("ec-1");
        let issuer = Issuer::serve(jwks(&[&key])).await;
        let authn = JwtAuthenticator::new(rule(&issuer), TD.into())
            .await
            .unwrap();
        let good = claims(&issuer.url);

        assert_eq!(
            identity(&authn, &key.mint(&good)).await,
            "spiffe://example.org/ns/bar/sa/foo"
        );
        assert_eq!(authenticate(&authn, None).await, Ok(None));

        let cases = [
            (with(good.clone(), "exp", json!(now() - 10)), "expired"),
            (
                with(good.clone(), "iss", json!("https://other.example")),
                "issuer",
            ),
            (
                with(good.clone(), "aud", json!(["other"])),
                "wrong audience",
            ),
            (
                with(good.clone(), "nbf", json!(now() + 3600)),
                "not valid before",
            ),
            (with(good.clone(), "sub", json!("bar:foo")), "malformed sub"),
            (
                with(good.clone(), "sub", json!("system:serviceaccount:bar")),
                "malformed sub",
            ),
        ];
        for (claims, reason) in cases {
            let why = refusal(&authn, &key.mint(&claims)).await;
            assert!(why.contains(reason), "{reason}: {why}");
        }
        let mut no_exp = good.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert!(refusal(&authn, &key.mint(&no_exp)).await.contains("no exp"));
        // nbf within go-oidc's five minutes of skew is fine.
        let skewed = with(good.clone(), "nbf", json!(now() + 60));
        assert!(authenticate(&authn, Some(&key.mint(&skewed))).await.is_ok());

        // Another key under the published kid: a bad signature.
        let forger = Signer::ec("ec-1");
        let why = refusal(&authn, &forger.mint(&good)).await;
        assert!(why.contains("bad signature"), "{why}");
        // A symmetric algorithm is never accepted from a public key set.
        let hmac = encode(
            &Header::new(Algorithm::HS256),
            &good,
            &EncodingKey::from_secret(b"s"),
        )
        .unwrap();
        assert!(refusal(&authn, &hmac).await.contains("not accepted"));
        assert!(
            refusal(&authn, "not.a.jwt")
                .await
                .contains("malformed token")
        );
        // All of that came from one fetch.
        assert_eq!(issuer.fetches(), 1);
    }

    #[tokio::test]
    async fn a_rule_without_audiences_accepts_no_token() {
        let key = Signer::ec("ec-1");
        let issuer = Issuer::serve(jwks(&[&key])).await;
        let rule = JwtRule {
            audiences: vec![],
            ..rule(&issuer)
        };
        let authn = JwtAuthenticator::new(rule, TD.into()).await.unwrap();
        let why = refusal(&authn, &key.mint(&claims(&issuer.url))).await;
        assert!(why.contains("wrong audience"), "{why}");
    }

    #[tokio::test]
    async fn oidc_discovery_finds_the_keys() {
        let (rsa, ec) = (Signer::rsa("rsa-1"), Signer::ec("ec-1"));
        let issuer = Issuer::serve(jwks(&[&rsa, &ec])).await;
        let rule = JwtRule {
            jwks_uri: String::new(),
            ..rule(&issuer)
        };
        let authn = JwtAuthenticator::new(rule.clone(), TD.into())
            .await
            .unwrap();
        for key in [&rsa, &ec] {
            let token = key.mint(&claims(&issuer.url));
            assert_eq!(
                identity(&authn, &token).await,
                "spiffe://example.org/ns/bar/sa/foo"
            );
        }

        // The provider must name the rule's issuer (a trailing slash differs).
        let slash = JwtRule {
            issuer: format!("{}/", issuer.url),
            ..rule
        };
        let why = JwtAuthenticator::new(slash, TD.into()).await.unwrap_err();
        assert!(why.contains("names issuer"), "{why}");
        // Discovery that cannot reach the issuer fails construction, as in Istio.
        let down = JwtRule {
            issuer: format!("http://{}", closed_port().await),
            ..Default::default()
        };
        let why = JwtAuthenticator::new(down, TD.into()).await.unwrap_err();
        assert!(why.contains("OIDC discovery"), "{why}");
    }

    #[tokio::test]
    async fn an_unknown_kid_refetches_at_most_once_a_minute() {
        let (old, new) = (Signer::ec("old"), Signer::ec("new"));
        let issuer = Issuer::serve(jwks(&[&old])).await;
        let authn = JwtAuthenticator::new(rule(&issuer), TD.into())
            .await
            .unwrap();
        let t0 = Instant::now();
        let (old_token, new_token) = (
            old.mint(&claims(&issuer.url)),
            new.mint(&claims(&issuer.url)),
        );
        assert!(authn.verify(&old_token, t0).await.is_ok());
        assert_eq!(issuer.fetches(), 1);

        // The issuer rotates; a token under the new kid arrives within the minute
        // of the last fetch: no refetch, refused.
        issuer.rotate(jwks(&[&new]));
        let why = authn
            .verify(&new_token, t0 + Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(why.contains("unknown kid \"new\""), "{why}");
        assert_eq!(issuer.fetches(), 1);

        // A minute on, the unknown kid refetches and the new key verifies.
        let t1 = t0 + Duration::from_secs(61);
        assert!(authn.verify(&new_token, t1).await.is_ok());
        assert_eq!(issuer.fetches(), 2);
        // The old key is gone from the refetched set.
        let why = authn
            .verify(&old_token, t1 + Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(why.contains("unknown kid \"old\""), "{why}");
        assert_eq!(issuer.fetches(), 2);
    }

    #[tokio::test]
    async fn keys_are_refreshed_on_an_interval_and_kept_when_the_refresh_fails() {
        let key = Signer::ec("ec-1");
        let issuer = Issuer::serve(jwks(&[&key])).await;
        let authn = JwtAuthenticator::new(rule(&issuer), TD.into())
            .await
            .unwrap();
        let token = key.mint(&claims(&issuer.url));
        let t0 = Instant::now();
        assert!(authn.verify(&token, t0).await.is_ok());
        assert!(authn.verify(&token, t0 + REFRESH / 2).await.is_ok());
        assert_eq!(issuer.fetches(), 1);
        assert!(authn.verify(&token, t0 + REFRESH).await.is_ok());
        assert_eq!(issuer.fetches(), 2);

        // A refresh that fetches garbage keeps the keys in hand.
        issuer.rotate("not json".into());
        assert!(authn.verify(&token, t0 + REFRESH * 2).await.is_ok());
        assert_eq!(issuer.fetches(), 3);
    }

    #[tokio::test]
    async fn an_unreachable_jwks_fails_closed() {
        let key = Signer::ec("ec-1");
        let url = format!("http://{}", closed_port().await);
        let rule = JwtRule {
            issuer: url.clone(),
            jwks_uri: format!("{url}/keys"),
            audiences: vec![AUD.into()],
            ..Default::default()
        };
        let authn = JwtAuthenticator::new(rule, TD.into()).await.unwrap();
        let token = key.mint(&claims(&url));
        let why = refusal(&authn, &token).await;
        assert!(
            why.contains("no key for the token") && why.contains("/keys"),
            "{why}"
        );
        // Within the minute, the failure is repeated without another attempt.
        let again = refusal(&authn, &token).await;
        assert_eq!(again, why);
    }

    /// A loopback address nothing listens on.
    async fn closed_port() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }
}

/// A loopback OIDC issuer for tests: `/keys` serves a swappable JWKS (fetches
/// counted) and `/.well-known/openid-configuration` points at it.
#[cfg(test)]
pub(crate) mod test_issuer {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::routing::get as route_get;

    pub(crate) struct Issuer {
        pub(crate) url: String,
        jwks: Arc<Mutex<String>>,
        fetches: Arc<AtomicUsize>,
    }

    impl Issuer {
        pub(crate) async fn serve(jwks: String) -> Issuer {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let shared = Arc::new(Mutex::new(jwks));
            let fetches = Arc::new(AtomicUsize::new(0));
            let discovery = serde_json::json!({
                "issuer": url,
                "jwks_uri": format!("{url}/keys"),
                "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            })
            .to_string();
            let (keys, count) = (shared.clone(), fetches.clone());
            let app = Router::new()
                .route(
                    "/keys",
                    route_get(move || {
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = keys.lock().unwrap().clone();
                        async move { body }
                    }),
                )
                .route(
                    "/.well-known/openid-configuration",
                    route_get(move || async move { discovery }),
                );
            tokio::spawn(async move { axum::serve(listener, app).await });
            Issuer {
                url,
                jwks: shared,
                fetches,
            }
        }

        /// Serves `jwks` from now on.
        pub(crate) fn rotate(&self, jwks: String) {
            *self.jwks.lock().unwrap() = jwks;
        }

        /// How many times `/keys` was fetched.
        pub(crate) fn fetches(&self) -> usize {
            self.fetches.load(Ordering::SeqCst)
        }
    }
}
