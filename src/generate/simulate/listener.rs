//! Connections through listeners: which listener Envoy hands a connection to, which
//! filter chain takes it, and where its bytes or requests end up.
//!
//! Listener selection follows a sidecar's capture: outbound traffic is redirected to
//! `virtualOutbound`, which hands it by original destination to the listener bound to
//! exactly that `ip:port`, else to `0.0.0.0:port`, else keeps it (its own chains).
//! Inbound traffic is `virtualInbound`'s; a gateway (no capture) only has its bound
//! listeners.
//!
//! Filter chain matching is Envoy's sieve: for each criterion in order — destination
//! port, destination prefix ranges (longest prefix wins), server names (exact, then the
//! longest wildcard), transport protocol, application protocols — the chains that set
//! the criterion and match it best survive; when none of them matches, the chains that
//! leave it unset survive. One survivor takes the connection, none falls to the
//! default chain (or the connection is closed), several is an invalid listener.
//!
//! What the listener filters detect: with `tls_inspector` the transport protocol is
//! `tls` for a TLS handshake and `raw_buffer` otherwise, and the handshake's SNI and
//! ALPN are known; without it the transport is `raw_buffer` and a TLS client's ALPN is
//! unknown. With `http_inspector`, plaintext HTTP/1.1 reads as ALPN `http/1.1` and
//! HTTP/2 with prior knowledge as `h2c`. A listener filter whose `filter_disabled`
//! predicate matches the destination port does not run.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, FilterChainMatch, Listener, ListenerFilterChainMatchPredicate, filter,
    listener_filter_chain_match_predicate,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use prost::{Message, Name};
use std::net::IpAddr;

use super::{Request, RouteOutcome, SimError, resolve};

/// Name of Envoy's TLS inspector listener filter.
pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Name of Envoy's HTTP inspector listener filter.
pub const HTTP_INSPECTOR: &str = "envoy.filters.listener.http_inspector";

/// The application protocol a client speaks over the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallProtocol {
    /// HTTP/1.1.
    Http,
    /// HTTP/2 (prior knowledge when plaintext).
    Http2,
    /// Opaque bytes.
    Tcp,
}

/// Whether the client opens a TLS session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Plaintext,
    /// TLS originated by the application (SNI and ALPN in its ClientHello).
    Tls,
    /// Mesh mutual TLS from a client sidecar: a client certificate and the Istio
    /// ALPNs (`istio-http/1.1`, `istio-h2`, `istio`).
    Mtls,
}

/// How the connection reaches the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallMode {
    /// An application's outbound connection captured to `virtualOutbound`.
    Outbound,
    /// A connection to the workload captured to `virtualInbound`.
    Inbound,
    /// No capture: only listeners bound to the address (gateways).
    Gateway,
}

/// One connection (and, for HTTP, one request on it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// Destination address (an IP for prefix-range matching).
    pub address: String,
    /// Destination port.
    pub port: u16,
    pub protocol: CallProtocol,
    pub tls: TlsMode,
    /// SNI in the ClientHello (TLS only); defaults to the host.
    pub sni: Option<String>,
    /// ALPN offered in the ClientHello (TLS only); defaults to `http/1.1` for HTTP,
    /// `h2` for HTTP/2 and none for TCP.
    pub alpn: Option<String>,
    /// The `Host` header exactly as sent; without it the authority is `address:port`.
    pub host: Option<String>,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub mode: CallMode,
    /// The certificate a chain must present for the call to count as mTLS: a chain
    /// whose first certificate is this SDS secret and that requires a client
    /// certificate is an mTLS chain (Istio's `MtlsSecretConfigName`, `default`).
    pub mtls_secret: String,
}

impl Call {
    fn new(protocol: CallProtocol, port: u16) -> Call {
        Call {
            address: "1.3.3.7".to_string(),
            port,
            protocol,
            tls: TlsMode::Plaintext,
            sni: None,
            alpn: None,
            host: None,
            path: "/".to_string(),
            headers: Vec::new(),
            mode: CallMode::Outbound,
            mtls_secret: crate::generate::upstream_tls::SDS_DEFAULT.to_string(),
        }
    }

    /// An outbound plaintext HTTP/1.1 request to `1.3.3.7:port` (Istio's default
    /// address: one the test does not care about).
    pub fn http(port: u16) -> Call {
        Call::new(CallProtocol::Http, port)
    }

    /// An outbound plaintext HTTP/2 request.
    pub fn http2(port: u16) -> Call {
        Call::new(CallProtocol::Http2, port)
    }

    /// An outbound plaintext TCP connection.
    pub fn tcp(port: u16) -> Call {
        Call::new(CallProtocol::Tcp, port)
    }

    /// The destination address.
    pub fn to(mut self, address: &str) -> Call {
        self.address = address.to_string();
        self
    }

    /// The `Host` header (and the default SNI).
    pub fn host(mut self, host: &str) -> Call {
        self.host = Some(host.to_string());
        self
    }

    pub fn path(mut self, path: &str) -> Call {
        self.path = path.to_string();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Over TLS.
    pub fn tls(mut self) -> Call {
        self.tls = TlsMode::Tls;
        self
    }

    /// Over mesh mutual TLS.
    pub fn mtls(mut self) -> Call {
        self.tls = TlsMode::Mtls;
        self
    }

    /// The SDS secret of the chains the call counts as mTLS chains.
    pub fn mtls_secret(mut self, name: &str) -> Call {
        self.mtls_secret = name.to_string();
        self
    }

    pub fn sni(mut self, sni: &str) -> Call {
        self.sni = Some(sni.to_string());
        self
    }

    pub fn alpn(mut self, alpn: &str) -> Call {
        self.alpn = Some(alpn.to_string());
        self
    }

    pub fn mode(mut self, mode: CallMode) -> Call {
        self.mode = mode;
        self
    }

    fn is_tls(&self) -> bool {
        self.tls != TlsMode::Plaintext
    }

    /// The SNI the TLS inspector reports: the one the call names (taken as given even
    /// on a plaintext call, as Istio's simulator takes it, so its vectors carry over),
    /// else the host for a TLS call.
    fn effective_sni(&self) -> Option<&str> {
        match &self.sni {
            Some(sni) => Some(sni),
            None if self.is_tls() => self.host.as_deref(),
            None => None,
        }
    }

    /// The ALPN the ClientHello offers.
    fn offered_alpn(&self) -> Option<&str> {
        if !self.is_tls() {
            return None;
        }
        if let Some(a) = &self.alpn {
            return Some(a);
        }
        if self.tls == TlsMode::Mtls {
            return Some(match self.protocol {
                CallProtocol::Http => "istio-http/1.1",
                CallProtocol::Http2 => "istio-h2",
                CallProtocol::Tcp => "istio",
            });
        }
        match self.protocol {
            CallProtocol::Http => Some("http/1.1"),
            CallProtocol::Http2 => Some("h2"),
            CallProtocol::Tcp => None,
        }
    }
}

/// What the connection was matched to and where it ends up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallResult {
    /// The listener that took the connection.
    pub listener: String,
    /// The filter chain's name (often empty in Istio's outbound listeners).
    pub filter_chain: String,
    /// Index in `filter_chains`; `None` for the listener's default chain.
    pub filter_chain_index: Option<usize>,
    /// The RDS route table, when the chain's HCM uses RDS.
    pub route_config: Option<String>,
    /// The virtual host (HTTP).
    pub virtual_host: Option<String>,
    /// The route's name (HTTP; `None` when the virtual host answered itself).
    pub route: Option<String>,
    /// The `:path` the HTTP filters and routes saw: the request's after the connection
    /// manager's normalization (HTTP).
    pub request_path: Option<String>,
    /// Where the request or connection goes: a connection manager's RBAC filters that
    /// refuse the request answer it with 403.
    pub outcome: RouteOutcome,
}

impl CallResult {
    /// The single cluster the call reaches, if it reaches exactly one.
    pub fn cluster(&self) -> Option<&str> {
        match &self.outcome {
            RouteOutcome::Cluster(c) => Some(c),
            _ => None,
        }
    }
}

/// Simulates `call` through one proxy's listeners, route tables and clusters.
pub fn simulate_call(
    listeners: &[Listener],
    routes: &[RouteConfiguration],
    clusters: &[Cluster],
    call: &Call,
) -> Result<CallResult, SimError> {
    simulate(listeners, routes, Some(clusters), call)
}

/// Like [`simulate_call`] without checking that the cluster reached is one the proxy
/// has (Istio's simulator does not check it, and its gateway vectors route to
/// destinations no registry knows).
pub fn simulate_call_without_cds(
    listeners: &[Listener],
    routes: &[RouteConfiguration],
    call: &Call,
) -> Result<CallResult, SimError> {
    simulate(listeners, routes, None, call)
}

fn simulate(
    listeners: &[Listener],
    routes: &[RouteConfiguration],
    clusters: Option<&[Cluster]>,
    call: &Call,
) -> Result<CallResult, SimError> {
    if call.alpn.is_some() && !call.is_tls() {
        return Err(SimError::InvalidCall(
            "ALPN can only be sent in a TLS handshake".into(),
        ));
    }
    let l = select_listener(listeners, call).ok_or_else(|| {
        SimError::NoListener(format!("{}:{} ({:?})", call.address, call.port, call.mode))
    })?;
    let (index, chain) = match_filter_chain(l, call)?;
    let chain_label = || {
        if chain.name.is_empty() {
            format!(
                "{}#{}",
                l.name,
                index.map_or("default".into(), |i| i.to_string())
            )
        } else {
            chain.name.clone()
        }
    };
    let terminates_tls = chain.transport_socket.is_some();
    if terminates_tls && !call.is_tls() {
        return Err(SimError::TlsError(chain_label()));
    }
    if terminates_tls && requires_mtls(chain, &call.mtls_secret) != (call.tls == TlsMode::Mtls) {
        return Err(SimError::MtlsError(chain_label()));
    }
    let mut result = CallResult {
        listener: l.name.clone(),
        filter_chain: chain.name.clone(),
        filter_chain_index: index,
        route_config: None,
        virtual_host: None,
        route: None,
        request_path: None,
        outcome: RouteOutcome::DirectResponse(0),
    };
    // The status a route answers with when its cluster was not served (Envoy's
    // `cluster_not_found_response_code`; `None`: the default 503, `NC`).
    let mut not_found_status = None;
    match terminal_filter(chain)? {
        Terminal::Hcm(hcm) => {
            if call.is_tls() && !terminates_tls {
                return Err(SimError::ProtocolError(format!(
                    "TLS into the HTTP connection manager of {}",
                    chain_label()
                )));
            }
            if call.protocol == CallProtocol::Tcp {
                return Err(SimError::ProtocolError(format!(
                    "raw TCP into the HTTP connection manager of {}",
                    chain_label()
                )));
            }
            // The connection manager normalizes the path, then its filters (RBAC) run
            // before the router picks the route.
            let mut req = request(call, terminates_tls);
            req.path = super::normalized_path(&hcm, &req.path);
            result.request_path = Some(req.path.clone());
            if let Some(status) = super::rbac_verdict(&hcm, &req, call.port)? {
                result.outcome = RouteOutcome::DirectResponse(status);
                return Ok(result);
            }
            let rc = match hcm.route_specifier.clone() {
                Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) => rc,
                Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
                    result.route_config = Some(rds.route_config_name.clone());
                    routes
                        .iter()
                        .find(|r| r.name == rds.route_config_name)
                        .cloned()
                        .ok_or(SimError::RouteConfigNotFound(rds.route_config_name))?
                }
                _ => {
                    return Err(SimError::Unsupported(format!(
                        "route specifier of {}",
                        chain_label()
                    )));
                }
            };
            let m = resolve(&rc, &req)?;
            not_found_status = m.route.and_then(|r| match &r.action {
                Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(a))
                    if a.cluster_not_found_response_code
                        == envoy_types::pb::envoy::config::route::v3::route_action::ClusterNotFoundResponseCode::InternalServerError as i32 =>
                {
                    Some(500)
                }
                Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(a))
                    if a.cluster_not_found_response_code
                        == envoy_types::pb::envoy::config::route::v3::route_action::ClusterNotFoundResponseCode::NotFound as i32 =>
                {
                    Some(404)
                }
                _ => None,
            });
            result.virtual_host = Some(m.virtual_host.name.clone());
            result.route = m.route.map(|r| r.name.clone());
            result.outcome = m.outcome;
        }
        Terminal::Tcp(tcp) => {
            result.outcome = match tcp.cluster_specifier.clone() {
                Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => RouteOutcome::Cluster(c),
                Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
                    RouteOutcome::WeightedClusters(
                        w.clusters.into_iter().map(|c| (c.name, c.weight)).collect(),
                    )
                }
                None => {
                    return Err(SimError::Unsupported(format!(
                        "TCP proxy without cluster in {}",
                        chain_label()
                    )));
                }
            };
        }
    }
    let named: Vec<&str> = match &result.outcome {
        RouteOutcome::Cluster(c) => vec![c],
        RouteOutcome::WeightedClusters(w) => w.iter().map(|(c, _)| c.as_str()).collect(),
        _ => Vec::new(),
    };
    for c in named {
        if clusters.is_some_and(|clusters| !clusters.iter().any(|k| k.name == c)) {
            if let Some(status) = not_found_status {
                result.outcome = RouteOutcome::DirectResponse(status);
                return Ok(result);
            }
            return Err(SimError::ClusterNotFound(c.to_string()));
        }
    }
    Ok(result)
}

/// Whether a chain terminating TLS is a mutual TLS chain of `secret`: its first
/// certificate is that SDS secret and it requires a client certificate.
fn requires_mtls(chain: &FilterChain, secret: &str) -> bool {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = chain
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.as_ref())
    else {
        return false;
    };
    let Ok(ctx) = DownstreamTlsContext::decode(any.value.as_slice()) else {
        return false;
    };
    let first = ctx
        .common_tls_context
        .as_ref()
        .and_then(|c| c.tls_certificate_sds_secret_configs.first())
        .map(|s| s.name.as_str());
    first == Some(secret) && ctx.require_client_certificate.is_some_and(|b| b.value)
}

/// The HTTP request the call carries, as the route table sees it.
fn request(call: &Call, tls: bool) -> Request {
    let (host, port) = match &call.host {
        // Port 0: the authority is the Host header exactly as sent.
        Some(h) => (h.clone(), 0),
        None => (call.address.clone(), call.port),
    };
    let mut req = Request::new(&host, port, &call.path);
    req.headers = call.headers.clone();
    req.tls = tls;
    req
}

/// The listener that takes `call`.
pub fn select_listener<'a>(listeners: &'a [Listener], call: &Call) -> Option<&'a Listener> {
    let by_name = |name: &str| listeners.iter().find(|l| l.name == name);
    if call.mode == CallMode::Inbound {
        return by_name("virtualInbound");
    }
    let bound_to = |addr: &str| {
        listeners
            .iter()
            .find(|l| socket_address(l).is_some_and(|(a, p)| a == addr && p == call.port))
    };
    bound_to(&call.address)
        .or_else(|| bound_to("0.0.0.0"))
        .or_else(|| match call.mode {
            CallMode::Outbound => by_name("virtualOutbound"),
            _ => None,
        })
}

fn socket_address(l: &Listener) -> Option<(&str, u16)> {
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(sa) => {
            let port = match sa.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(p)) => p as u16,
                _ => 0,
            };
            Some((sa.address.as_str(), port))
        }
        _ => None,
    }
}

/// Whether the listener runs the named listener filter for this destination port.
fn runs_filter(l: &Listener, name: &str, port: u16) -> bool {
    l.listener_filters
        .iter()
        .filter(|f| f.name == name)
        .any(|f| {
            !f.filter_disabled
                .as_ref()
                .is_some_and(|p| predicate_matches(p, port))
        })
}

fn predicate_matches(p: &ListenerFilterChainMatchPredicate, port: u16) -> bool {
    use listener_filter_chain_match_predicate::Rule;
    match &p.rule {
        Some(Rule::OrMatch(set)) => set.rules.iter().any(|r| predicate_matches(r, port)),
        Some(Rule::AndMatch(set)) => set.rules.iter().all(|r| predicate_matches(r, port)),
        Some(Rule::NotMatch(inner)) => !predicate_matches(inner, port),
        Some(Rule::AnyMatch(any)) => *any,
        Some(Rule::DestinationPortRange(r)) => {
            let port = i32::from(port);
            port >= r.start && port < r.end
        }
        None => false,
    }
}

/// What the listener filters learn about the connection.
struct Detected<'a> {
    transport: &'static str,
    sni: Option<&'a str>,
    alpn: Option<&'a str>,
}

fn detect<'a>(l: &Listener, call: &'a Call) -> Detected<'a> {
    let tls_inspector = runs_filter(l, TLS_INSPECTOR, call.port);
    let http_inspector = runs_filter(l, HTTP_INSPECTOR, call.port);
    let mut d = Detected {
        transport: "raw_buffer",
        sni: None,
        alpn: None,
    };
    if tls_inspector {
        d.sni = call.effective_sni();
    }
    if tls_inspector && call.is_tls() {
        d.transport = "tls";
        d.alpn = call.offered_alpn();
    }
    if http_inspector && !call.is_tls() {
        d.alpn = match call.protocol {
            CallProtocol::Http => Some("http/1.1"),
            CallProtocol::Http2 => Some("h2c"),
            CallProtocol::Tcp => None,
        };
    }
    d
}

/// Envoy's filter chain match for `call` on `l`: the chain's index (`None` for the
/// default chain) and the chain.
pub fn match_filter_chain<'a>(
    l: &'a Listener,
    call: &Call,
) -> Result<(Option<usize>, &'a FilterChain), SimError> {
    let d = detect(l, call);
    let dest: Option<IpAddr> = call.address.parse().ok();
    let mut chains: Vec<(usize, &FilterChain)> = l.filter_chains.iter().enumerate().collect();
    let m = |c: &FilterChain| c.filter_chain_match.clone().unwrap_or_default();
    chains = sieve(chains, |c| {
        m(c).destination_port
            .map(|p| (p.value == u32::from(call.port)).then_some(1))
    });
    chains = sieve(chains, |c| {
        let ranges = m(c).prefix_ranges;
        if ranges.is_empty() {
            return None;
        }
        Some(
            ranges
                .iter()
                .filter_map(|r| {
                    let len = r.prefix_len.map_or(0, |v| v.value);
                    let net: IpAddr = r.address_prefix.parse().ok()?;
                    (dest?.is_ipv4() == net.is_ipv4() && in_prefix(dest?, net, len))
                        .then_some(len + 1)
                })
                .max(),
        )
    });
    chains = sieve(chains, |c| server_name_rank(&m(c), d.sni));
    chains = sieve(chains, |c| {
        let t = m(c).transport_protocol;
        (!t.is_empty()).then(|| (t == d.transport).then_some(1))
    });
    chains = sieve(chains, |c| {
        let alpns = m(c).application_protocols;
        (!alpns.is_empty()).then(|| d.alpn.filter(|a| alpns.iter().any(|x| x == a)).map(|_| 1))
    });
    match chains.as_slice() {
        [(i, c)] => Ok((Some(*i), *c)),
        [] => l
            .default_filter_chain
            .as_ref()
            .map(|c| (None, c))
            .ok_or_else(|| SimError::NoFilterChain(l.name.clone())),
        _ => Err(SimError::MultipleFilterChains(l.name.clone())),
    }
}

/// One step of the sieve. `rank` is `None` when the chain leaves the criterion unset,
/// `Some(None)` when it sets it and does not match, `Some(Some(r))` when it matches
/// with specificity `r` (higher is better). The best-ranked matching chains survive;
/// if none matches, those leaving the criterion unset do.
fn sieve(
    chains: Vec<(usize, &FilterChain)>,
    rank: impl Fn(&FilterChain) -> Option<Option<u32>>,
) -> Vec<(usize, &FilterChain)> {
    let ranked: Vec<_> = chains.into_iter().map(|c| (rank(c.1), c)).collect();
    let best = ranked.iter().filter_map(|(r, _)| r.flatten()).max();
    ranked
        .into_iter()
        .filter(|(r, _)| match best {
            Some(b) => *r == Some(Some(b)),
            None => r.is_none(),
        })
        .map(|(_, c)| c)
        .collect()
}

fn in_prefix(ip: IpAddr, net: IpAddr, len: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len.min(32))
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len.min(128))
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// Server names: an exact name beats any wildcard, a longer `*.suffix` beats a
/// shorter one.
fn server_name_rank(m: &FilterChainMatch, sni: Option<&str>) -> Option<Option<u32>> {
    if m.server_names.is_empty() {
        return None;
    }
    let Some(sni) = sni.map(str::to_ascii_lowercase) else {
        return Some(None);
    };
    Some(
        m.server_names
            .iter()
            .filter_map(|name| {
                let name = name.to_ascii_lowercase();
                if name == sni {
                    Some(u32::MAX)
                } else if let Some(suffix) = name.strip_prefix('*') {
                    (sni.len() > suffix.len() && sni.ends_with(suffix))
                        .then_some(suffix.len() as u32)
                } else {
                    None
                }
            })
            .max(),
    )
}

enum Terminal {
    Hcm(Box<HttpConnectionManager>),
    Tcp(Box<TcpProxy>),
}

/// The chain's terminal network filter (HCM or TCP proxy).
fn terminal_filter(chain: &FilterChain) -> Result<Terminal, SimError> {
    for f in chain.filters.iter().rev() {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        if any.type_url == HttpConnectionManager::type_url() {
            let hcm = HttpConnectionManager::decode(any.value.as_slice())
                .map_err(|e| SimError::Unsupported(format!("undecodable HCM: {e}")))?;
            return Ok(Terminal::Hcm(Box::new(hcm)));
        }
        if any.type_url == TcpProxy::type_url() {
            let tcp = TcpProxy::decode(any.value.as_slice())
                .map_err(|e| SimError::Unsupported(format!("undecodable TCP proxy: {e}")))?;
            return Ok(Terminal::Tcp(Box::new(tcp)));
        }
    }
    Err(SimError::Unsupported(format!(
        "filter chain {:?} has no HTTP connection manager or TCP proxy",
        chain.name
    )))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::{Address, CidrRange, SocketAddress};
    use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
    use envoy_types::pb::envoy::config::listener::v3::{Filter, ListenerFilter};
    use envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, RouteMatch, VirtualHost, route, route_action, route_match,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds;
    use envoy_types::pb::envoy::r#type::v3::Int32Range;
    use envoy_types::pb::google::protobuf::{Any, UInt32Value};

    use super::*;

    fn any<M: Message + Name>(m: &M) -> Any {
        Any {
            type_url: M::type_url(),
            value: m.encode_to_vec(),
        }
    }

    fn tcp_to(cluster: &str) -> Filter {
        let tcp = TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        };
        Filter {
            name: "envoy.filters.network.tcp_proxy".into(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&tcp))),
        }
    }

    fn hcm_rds(name: &str) -> Filter {
        let hcm = HttpConnectionManager {
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                route_config_name: name.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        Filter {
            name: "envoy.filters.network.http_connection_manager".into(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
        }
    }

    fn chain(name: &str, m: FilterChainMatch, f: Filter) -> FilterChain {
        FilterChain {
            name: name.into(),
            filter_chain_match: Some(m),
            filters: vec![f],
            ..Default::default()
        }
    }

    fn listener(name: &str, addr: &str, port: u32, chains: Vec<FilterChain>) -> Listener {
        Listener {
            name: name.into(),
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: addr.into(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                    ..Default::default()
                })),
            }),
            filter_chains: chains,
            ..Default::default()
        }
    }

    fn inspectors(mut l: Listener) -> Listener {
        for name in [TLS_INSPECTOR, HTTP_INSPECTOR] {
            l.listener_filters.push(ListenerFilter {
                name: name.into(),
                ..Default::default()
            });
        }
        l
    }

    fn cidr(prefix: &str, len: u32) -> CidrRange {
        CidrRange {
            address_prefix: prefix.into(),
            prefix_len: Some(UInt32Value { value: len }),
        }
    }

    fn clusters(names: &[&str]) -> Vec<Cluster> {
        names
            .iter()
            .map(|n| Cluster {
                name: n.to_string(),
                ..Default::default()
            })
            .collect()
    }

    fn cluster_of(ls: &[Listener], call: &Call) -> String {
        let all = clusters(&["a", "b", "c", "d", "pass", "block", "http"]);
        let routes = vec![RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![VirtualHost {
                name: "all".into(),
                domains: vec!["*".into()],
                routes: vec![Route {
                    name: "default".into(),
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            "http".into(),
                        )),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }];
        match simulate_call(ls, &routes, &all, call) {
            Ok(r) => r.cluster().unwrap_or("?").to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    fn virtual_outbound() -> Listener {
        let mut l = listener(
            "virtualOutbound",
            "0.0.0.0",
            15001,
            vec![chain(
                "virtualOutbound-blackhole",
                FilterChainMatch {
                    destination_port: Some(UInt32Value { value: 15001 }),
                    ..Default::default()
                },
                tcp_to("block"),
            )],
        );
        l.default_filter_chain = Some(FilterChain {
            name: "virtualOutbound-catchall-tcp".into(),
            filters: vec![tcp_to("pass")],
            ..Default::default()
        });
        l
    }

    #[test]
    fn listeners_are_chosen_by_exact_address_then_wildcard_then_virtual_outbound() {
        let ls = vec![
            virtual_outbound(),
            listener(
                "10.0.0.1_3306",
                "10.0.0.1",
                3306,
                vec![chain("", FilterChainMatch::default(), tcp_to("a"))],
            ),
            listener(
                "0.0.0.0_3306",
                "0.0.0.0",
                3306,
                vec![chain("", FilterChainMatch::default(), tcp_to("b"))],
            ),
        ];
        assert_eq!(cluster_of(&ls, &Call::tcp(3306).to("10.0.0.1")), "a");
        assert_eq!(cluster_of(&ls, &Call::tcp(3306).to("10.0.0.2")), "b");
        assert_eq!(cluster_of(&ls, &Call::tcp(5432).to("10.0.0.2")), "pass");
        assert_eq!(cluster_of(&ls, &Call::tcp(15001)), "block", "loop guard");
        let gw = Call::tcp(5432).mode(CallMode::Gateway);
        assert!(cluster_of(&ls, &gw).starts_with("error: no listener"));
    }

    #[test]
    fn longest_prefix_wins_and_unset_ranges_are_the_fallback() {
        let ranged = |len, c| {
            chain(
                "",
                FilterChainMatch {
                    prefix_ranges: vec![cidr("10.0.0.0", len)],
                    ..Default::default()
                },
                tcp_to(c),
            )
        };
        let ls = vec![listener(
            "0.0.0.0_9000",
            "0.0.0.0",
            9000,
            vec![
                ranged(8, "a"),
                ranged(24, "b"),
                chain("", FilterChainMatch::default(), tcp_to("c")),
            ],
        )];
        assert_eq!(cluster_of(&ls, &Call::tcp(9000).to("10.0.0.9")), "b");
        assert_eq!(cluster_of(&ls, &Call::tcp(9000).to("10.1.0.9")), "a");
        assert_eq!(cluster_of(&ls, &Call::tcp(9000).to("11.0.0.1")), "c");
    }

    #[test]
    fn server_names_exact_then_longest_wildcard_and_tls_needs_the_inspector() {
        let sni = |names: &[&str], c| {
            chain(
                "",
                FilterChainMatch {
                    server_names: names.iter().map(|n| n.to_string()).collect(),
                    ..Default::default()
                },
                tcp_to(c),
            )
        };
        let chains = vec![
            sni(&["*.example.com"], "a"),
            sni(&["*.api.example.com"], "b"),
            sni(&["x.api.example.com"], "c"),
        ];
        let mut l = listener("0.0.0.0_443", "0.0.0.0", 443, chains);
        l.default_filter_chain = Some(FilterChain {
            filters: vec![tcp_to("pass")],
            ..Default::default()
        });
        let plain = vec![l.clone()];
        let ls = vec![inspectors(l)];
        let call = |h: &str| Call::tcp(443).tls().host(h);
        assert_eq!(cluster_of(&ls, &call("x.api.example.com")), "c");
        assert_eq!(cluster_of(&ls, &call("y.api.example.com")), "b");
        assert_eq!(cluster_of(&ls, &call("www.example.com")), "a");
        assert_eq!(cluster_of(&ls, &call("example.com")), "pass");
        assert_eq!(cluster_of(&ls, &Call::tcp(443)), "pass", "no SNI");
        // Without the TLS inspector the SNI is never read.
        assert_eq!(cluster_of(&plain, &call("x.api.example.com")), "pass");
    }

    #[test]
    fn sniffed_listener_separates_http_tls_and_tcp() {
        let http = chain(
            "",
            FilterChainMatch {
                transport_protocol: "raw_buffer".into(),
                application_protocols: vec!["http/1.1".into(), "h2c".into()],
                ..Default::default()
            },
            hcm_rds("80"),
        );
        let mut l = listener("0.0.0.0_80", "0.0.0.0", 80, vec![http]);
        l.default_filter_chain = Some(FilterChain {
            name: "PassthroughFilterChain".into(),
            filters: vec![tcp_to("pass")],
            ..Default::default()
        });
        let sniffed = vec![inspectors(l.clone())];
        assert_eq!(cluster_of(&sniffed, &Call::http(80)), "http");
        assert_eq!(cluster_of(&sniffed, &Call::http2(80)), "http");
        assert_eq!(cluster_of(&sniffed, &Call::tcp(80)), "pass");
        assert_eq!(cluster_of(&sniffed, &Call::http(80).tls()), "pass");
        assert_eq!(
            cluster_of(&sniffed, &Call::http(80).tls().alpn("h2c")),
            "pass"
        );
        // Without the HTTP inspector nothing reads as HTTP.
        assert_eq!(cluster_of(&[l], &Call::http(80)), "pass");
        // A bare HCM chain takes everything, and chokes on what is not HTTP.
        let bare = vec![listener(
            "0.0.0.0_80",
            "0.0.0.0",
            80,
            vec![chain("", FilterChainMatch::default(), hcm_rds("80"))],
        )];
        assert_eq!(cluster_of(&bare, &Call::http(80)), "http");
        assert!(cluster_of(&bare, &Call::tcp(80)).starts_with("error: protocol error"));
        assert!(cluster_of(&bare, &Call::http(80).tls()).starts_with("error: protocol error"));
        assert!(cluster_of(&bare, &Call::http(80).alpn("h2")).starts_with("error: invalid call"));
    }

    #[test]
    fn ties_are_an_error_and_no_match_without_default_closes() {
        let port = |p| FilterChainMatch {
            destination_port: Some(UInt32Value { value: p }),
            ..Default::default()
        };
        let ls = vec![listener(
            "virtualInbound",
            "0.0.0.0",
            15006,
            vec![
                chain("a1", port(80), tcp_to("a")),
                chain("a2", port(80), tcp_to("b")),
                chain("c", port(81), tcp_to("c")),
            ],
        )];
        let inbound = |p| Call::tcp(p).mode(CallMode::Inbound);
        assert!(cluster_of(&ls, &inbound(80)).starts_with("error: multiple"));
        assert_eq!(cluster_of(&ls, &inbound(81)), "c");
        assert!(cluster_of(&ls, &inbound(82)).starts_with("error: no filter chain"));
    }

    #[test]
    fn disabled_listener_filters_and_tls_termination() {
        let tls_chain = FilterChain {
            name: "tls".into(),
            filter_chain_match: Some(FilterChainMatch {
                transport_protocol: "tls".into(),
                ..Default::default()
            }),
            filters: vec![tcp_to("a")],
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(Any::default())),
            }),
            ..Default::default()
        };
        let mut l = listener("l", "0.0.0.0", 9000, vec![tls_chain]);
        l.default_filter_chain = Some(FilterChain {
            filters: vec![tcp_to("pass")],
            ..Default::default()
        });
        l.listener_filters.push(ListenerFilter {
            name: TLS_INSPECTOR.into(),
            filter_disabled: Some(ListenerFilterChainMatchPredicate {
                rule: Some(
                    listener_filter_chain_match_predicate::Rule::DestinationPortRange(Int32Range {
                        start: 9000,
                        end: 9001,
                    }),
                ),
            }),
            ..Default::default()
        });
        let ls = vec![l.clone()];
        assert_eq!(
            cluster_of(&ls, &Call::tcp(9000).tls()),
            "pass",
            "inspector off on 9000"
        );
        l.listener_filters.clear();
        let ls = vec![inspectors(l)];
        assert_eq!(cluster_of(&ls, &Call::tcp(9000).tls()), "a");
        let r = simulate_call(&ls, &[], &clusters(&["a"]), &Call::tcp(9000).tls()).unwrap();
        assert_eq!(
            (r.filter_chain.as_str(), r.filter_chain_index),
            ("tls", Some(0))
        );
    }
}
