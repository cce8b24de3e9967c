//! VirtualService validation (Istio's `ValidateVirtualService`, `validateTLSRoute`,
//! `validateTCPRoute`); the HTTP rules are in [`super::http_route`].
//!
//! Differences from Istio, on purpose:
//! - Destination weights follow the classic Istio rule: each weight is 0..=100 and, when
//!   a route has more than one destination, the weights must add up to 100 (recent
//!   Istio only requires a non-zero total). A single destination may omit its weight.
//! - A rule that follows a rule without `match` (which matches everything) is reported
//!   as unreachable (a warning), as Istio's analyzers do.

use meshfed_api::networking::v1alpha3 as net;

use super::common::{
    host_subset_of, hosts_match, is_ip, validate_export_to, validate_gateway_bound_domain,
    validate_ip_subnet, validate_labels, validate_port, validate_wildcard_domain,
};
use super::http_route::{RouteType, validate_http_route};
use super::route_common::{validate_gateway_names, validate_route_destinations};
use super::{FieldPath, Findings, Validation};

/// The gateway name that means "the sidecars of the mesh".
const MESH_GATEWAY: &str = "mesh";

/// Validates a VirtualService spec in `namespace`.
pub fn validate_virtual_service(namespace: &str, vs: &net::VirtualService) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    let is_delegate = vs.hosts.is_empty();

    if is_delegate {
        f.warn(
            &spec.field("hosts"),
            "no hosts: this VirtualService is only used as a delegate of another VirtualService",
        );
        if !vs.gateways.is_empty() {
            f.error(
                &spec.field("gateways"),
                "delegate virtual service must have no gateways specified",
            );
        }
        if !vs.tls.is_empty() {
            f.error(
                &spec.field("tls"),
                "delegate virtual service must have no tls route specified",
            );
        }
        if !vs.tcp.is_empty() {
            f.error(
                &spec.field("tcp"),
                "delegate virtual service must have no tcp route specified",
            );
        }
    }

    let applies_to_gateway =
        !vs.gateways.is_empty() && !vs.gateways.iter().any(|g| g == MESH_GATEWAY);
    let applies_to_mesh = !applies_to_gateway;
    validate_gateway_names(&mut f, &spec.field("gateways"), &vs.gateways);
    validate_hosts(&mut f, vs, applies_to_gateway, applies_to_mesh);

    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        f.error(
            &spec,
            "http, tcp or tls must be provided in virtual service",
        );
    }
    for (i, http) in vs.http.iter().enumerate() {
        let route_type = if is_delegate {
            RouteType::Delegate
        } else if http.delegate.is_some() {
            RouteType::Root
        } else {
            RouteType::Independent
        };
        validate_http_route(
            &mut f,
            &spec.field("http").index(i),
            http,
            route_type,
            // Istio's `appliesToGateway`: some gateway other than `mesh`.
            vs.gateways.iter().any(|g| g != MESH_GATEWAY),
        );
    }
    for (i, tls) in vs.tls.iter().enumerate() {
        validate_tls_route(
            &mut f,
            &spec.field("tls").index(i),
            tls,
            vs,
            applies_to_gateway,
        );
    }
    for (i, tcp) in vs.tcp.iter().enumerate() {
        validate_tcp_route(&mut f, &spec.field("tcp").index(i), tcp);
    }
    validate_export_to(
        &mut f,
        &spec.field("exportTo"),
        namespace,
        &vs.export_to,
        false,
    );

    let http_matchless: Vec<bool> = vs.http.iter().map(|r| r.r#match.is_empty()).collect();
    warn_unreachable(&mut f, &spec.field("http"), &http_matchless);
    let tls_matchless: Vec<bool> = vs.tls.iter().map(|r| r.r#match.is_empty()).collect();
    warn_unreachable(&mut f, &spec.field("tls"), &tls_matchless);
    let tcp_matchless: Vec<bool> = vs.tcp.iter().map(|r| r.r#match.is_empty()).collect();
    warn_unreachable(&mut f, &spec.field("tcp"), &tcp_matchless);
    f.finish()
}

fn validate_hosts(
    f: &mut Findings,
    vs: &net::VirtualService,
    applies_to_gateway: bool,
    applies_to_mesh: bool,
) {
    let at = FieldPath::spec().field("hosts");
    let sni = vs
        .tls
        .iter()
        .any(|t| t.r#match.iter().any(|m| !m.sni_hosts.is_empty()));
    let mut all_valid = true;
    for (i, host) in vs.hosts.iter().enumerate() {
        let checked = if applies_to_gateway {
            validate_gateway_bound_domain(sni, host)
        } else {
            validate_wildcard_domain(host)
        };
        match checked {
            Err(reason) if !is_ip(host) => {
                f.error(&at.index(i), reason);
                all_valid = false;
            }
            Ok(()) if applies_to_mesh && host == "*" => {
                f.error(
                    &at.index(i),
                    "wildcard host * is not allowed for virtual services bound to the mesh gateway",
                );
                all_valid = false;
            }
            _ => {}
        }
    }
    if all_valid {
        for (j, b) in vs.hosts.iter().enumerate() {
            if let Some(a) = vs.hosts[..j].iter().find(|a| hosts_match(a, b)) {
                f.error(
                    &at.index(j),
                    format!("duplicate hosts in virtual service: {a} & {b}"),
                );
            }
        }
    }
}

/// Rules after one without `match` (which takes every request) can never be used.
fn warn_unreachable(f: &mut Findings, at: &FieldPath, matchless: &[bool]) {
    if let Some(first) = matchless.iter().position(|m| *m) {
        for i in first + 1..matchless.len() {
            f.warn(
                &at.index(i),
                format!(
                    "rule not used: rule #{first} before it has no match and takes every request"
                ),
            );
        }
    }
}

fn validate_tls_route(
    f: &mut Findings,
    at: &FieldPath,
    tls: &net::TlsRoute,
    vs: &net::VirtualService,
    applies_to_gateway: bool,
) {
    if tls.r#match.is_empty() {
        f.error(
            &at.field("match"),
            "TLS route must have at least one match condition",
        );
    }
    for (j, m) in tls.r#match.iter().enumerate() {
        let here = at.field("match").index(j);
        if m.sni_hosts.is_empty() {
            f.error(
                &here.field("sniHosts"),
                "TLS match must have at least one SNI host",
            );
        }
        for (k, sni) in m.sni_hosts.iter().enumerate() {
            validate_sni_host(
                f,
                &here.field("sniHosts").index(k),
                sni,
                vs,
                applies_to_gateway,
            );
        }
        for (k, subnet) in m.destination_subnets.iter().enumerate() {
            f.check(
                &here.field("destinationSubnets").index(k),
                validate_ip_subnet(subnet),
            );
        }
        if m.port != 0 {
            f.check(&here.field("port"), validate_port(m.port));
        }
        validate_labels(f, &here.field("sourceLabels"), &m.source_labels);
        validate_gateway_names(f, &here.field("gateways"), &m.gateways);
    }
    if tls.route.is_empty() {
        f.error(&at.field("route"), "TLS route is required");
    }
    let destinations: Vec<_> = tls
        .route
        .iter()
        .map(|r| (r.destination.as_ref(), r.weight))
        .collect();
    validate_route_destinations(f, &at.field("route"), &destinations);
}

fn validate_sni_host(
    f: &mut Findings,
    at: &FieldPath,
    sni: &str,
    vs: &net::VirtualService,
    applies_to_gateway: bool,
) {
    let checked = if applies_to_gateway {
        validate_gateway_bound_domain(true, sni)
    } else {
        validate_wildcard_domain(sni)
    };
    if let Err(reason) = checked {
        if is_ip(sni) {
            f.warn(
                at,
                format!(
                    "using an IP address ({sni:?}) goes against SNI spec and most clients do not support this"
                ),
            );
        } else {
            f.error(at, reason);
        }
        return;
    }
    if !vs.hosts.iter().any(|h| host_subset_of(sni, h)) {
        f.error(
            at,
            format!(
                "SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]",
                vs.hosts.join(", ")
            ),
        );
    }
}

fn validate_tcp_route(f: &mut Findings, at: &FieldPath, tcp: &net::TcpRoute) {
    for (j, m) in tcp.r#match.iter().enumerate() {
        let here = at.field("match").index(j);
        for (k, subnet) in m.destination_subnets.iter().enumerate() {
            f.check(
                &here.field("destinationSubnets").index(k),
                validate_ip_subnet(subnet),
            );
        }
        if m.port != 0 {
            f.check(&here.field("port"), validate_port(m.port));
        }
        validate_labels(f, &here.field("sourceLabels"), &m.source_labels);
        validate_gateway_names(f, &here.field("gateways"), &m.gateways);
    }
    if tcp.route.is_empty() {
        f.error(&at.field("route"), "TCP route is required");
    }
    let destinations: Vec<_> = tcp
        .route
        .iter()
        .map(|r| (r.destination.as_ref(), r.weight))
        .collect();
    validate_route_destinations(f, &at.field("route"), &destinations);
}
#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_virtual_service("default", &spec::<net::VirtualService>(yaml))
    }

    /// A valid VirtualService with one HTTP rule; tests append to or change it.
    const BASE: &str = "hosts: [reviews]\nhttp:\n- route:\n  - destination: {host: reviews}\n";

    #[test]
    fn a_full_valid_virtual_service_passes() {
        let warnings = assert_ok(&check(
            r#"
hosts: [reviews.prod.svc.cluster.local, "*.example.com"]
gateways: [mesh, istio-system/public]
exportTo: ["."]
http:
- name: canary
  match:
  - uri: {prefix: /api}
    headers: {end-user: {exact: jason}, x-re: {regex: "^a+$"}}
    port: 9080
    sourceLabels: {app: productpage}
  route:
  - destination: {host: reviews.prod.svc.cluster.local, subset: v2, port: {number: 9080}}
    weight: 25
    headers: {request: {set: {x-canary: "true"}}}
  - destination: {host: reviews.prod.svc.cluster.local, subset: v1}
    weight: 75
  timeout: 5s
  retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,gateway-error,503"}
  fault: {abort: {percentage: {value: 1.5}, httpStatus: 503}, delay: {percentage: {value: 10}, fixedDelay: 7s}}
  corsPolicy: {allowOrigins: [{exact: "https://a.example.com"}], allowMethods: [GET], allowHeaders: ["*"], maxAge: 24h}
  rewrite: {uri: /v2}
- match: [{uri: {exact: /old}}]
  redirect: {uri: /new, redirectCode: 308}
- match: [{uri: {exact: /teapot}}]
  directResponse: {status: 418, body: {string: short and stout}}
- route: [{destination: {host: reviews}}]
tcp:
- match: [{port: 27017, destinationSubnets: [10.0.0.0/8]}]
  route: [{destination: {host: mongo.backup.svc.cluster.local, port: {number: 5555}}}]
tls:
- match: [{port: 443, sniHosts: [login.example.com]}]
  route: [{destination: {host: login.prod.svc.cluster.local}, weight: 100}]
"#,
        ));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn hosts() {
        assert_error(
            &check(&BASE.replace("[reviews]", "[\"a..b\"]")),
            "spec.hosts[0]",
            "invalid",
        );
        assert_error(
            &check(&BASE.replace("[reviews]", "[\"*\"]")),
            "spec.hosts[0]",
            "wildcard host * is not allowed",
        );
        assert_error(
            &check(&BASE.replace("[reviews]", "[\"*.com\", a.example.com]")),
            "spec.hosts[1]",
            "duplicate hosts",
        );
        // IPs are allowed, short names too.
        assert_ok(&check(&BASE.replace("[reviews]", "[10.0.0.1, reviews]")));
        // `*` is fine on a gateway.
        assert_ok(&check(&BASE.replace(
            "hosts: [reviews]",
            "hosts: [\"*\"]\ngateways: [istio-system/public]",
        )));
    }

    #[test]
    fn gateways() {
        assert_error(
            &check(&BASE.replace(
                "hosts: [reviews]",
                "hosts: [reviews]\ngateways: [\"ns/Bad_GW\"]",
            )),
            "spec.gateways[0]",
            "invalid value for gateway name",
        );
        assert_error(
            &check(&BASE.replace("hosts: [reviews]", "hosts: [reviews]\ngateways: [\"/gw\"]")),
            "spec.gateways[0]",
            "cannot be empty",
        );
        assert_warning(
            &check(&BASE.replace(
                "hosts: [reviews]",
                "hosts: [reviews]\ngateways: [gw.istio-system]",
            )),
            "spec.gateways[0]",
            "legacy gatewayName format",
        );
    }

    #[test]
    fn something_must_route() {
        assert_error(
            &check("hosts: [a]"),
            "spec",
            "http, tcp or tls must be provided",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{match: [{uri: {prefix: /}}]}]"),
            "spec.http[0]",
            "route, redirect or directResponse is required",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{route: [{weight: 100}]}]"),
            "spec.http[0].route[0].destination",
            "destination is required",
        );
    }

    #[test]
    fn weights() {
        let two = "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a, subset: v1}\n    weight: W1\n  - destination: {host: a, subset: v2}\n    weight: W2\n";
        assert_ok(&check(&two.replace("W1", "30").replace("W2", "70")));
        assert_error(
            &check(&two.replace("W1", "20").replace("W2", "120")),
            "spec.http[0].route[1].weight",
            "not in the range 0..100",
        );
        assert_error(
            &check(&two.replace("W1", "-1").replace("W2", "100")),
            "spec.http[0].route[0].weight",
            "not in the range",
        );
        assert_error(
            &check(&two.replace("W1", "30").replace("W2", "30")),
            "spec.http[0].route",
            "total destination weight 60 != 100",
        );
        // No weights on several destinations: total 0.
        assert_error(
            &check(
                &two.replace("    weight: W1\n", "")
                    .replace("    weight: W2\n", ""),
            ),
            "spec.http[0].route",
            "total destination weight 0 != 100",
        );
        // A single destination may omit it; a partial weight is only a warning.
        assert_ok(&check(BASE));
        assert_warning(
            &check("hosts: [a]\nhttp: [{route: [{destination: {host: a}, weight: 50}]}]"),
            "spec.http[0].route[0].weight",
            "has no effect",
        );
        assert_error(
            &check(
                "hosts: [a]\ntcp: [{route: [{destination: {host: a}, weight: 40}, {destination: {host: b}, weight: 40}]}]",
            ),
            "spec.tcp[0].route",
            "!= 100",
        );
    }

    #[test]
    fn destinations() {
        assert_error(
            &check("hosts: [a]\nhttp: [{route: [{destination: {host: \"*\"}}]}]"),
            "spec.http[0].route[0].destination.host",
            "invalid destination host",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{route: [{destination: {host: \"bad host\"}}]}]"),
            "spec.http[0].route[0].destination.host",
            "invalid",
        );
        assert_error(
            &check(
                "hosts: [a]\nhttp: [{route: [{destination: {host: a, port: {number: 70000}}}]}]",
            ),
            "spec.http[0].route[0].destination.port.number",
            "must be in the range 1..65535",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{route: [{destination: {host: a, subset: v1.0}}]}]"),
            "spec.http[0].route[0].destination.subset",
            "subset name is invalid",
        );
        assert_error(
            &check("hosts: [a]\nhttp: [{route: [{destination: {host: a}}], mirror: {host: \"\"}}]"),
            "spec.http[0].mirror.host",
            "empty domain name",
        );
    }

    #[test]
    fn tls_and_tcp_routes() {
        assert_error(
            &check("hosts: [a.example.com]\ntls: [{route: [{destination: {host: a}}]}]"),
            "spec.tls[0].match",
            "at least one match",
        );
        assert_error(
            &check(
                "hosts: [a.example.com]\ntls: [{match: [{port: 443}], route: [{destination: {host: a}}]}]",
            ),
            "spec.tls[0].match[0].sniHosts",
            "at least one SNI host",
        );
        assert_error(
            &check(
                "hosts: [a.example.com]\ntls: [{match: [{sniHosts: [b.example.com]}], route: [{destination: {host: a}}]}]",
            ),
            "spec.tls[0].match[0].sniHosts[0]",
            "not a compatible subset",
        );
        assert_error(
            &check("hosts: [a.example.com]\ntls: [{match: [{sniHosts: [a.example.com]}]}]"),
            "spec.tls[0].route",
            "TLS route is required",
        );
        assert_error(
            &check(
                "hosts: [a]\ntcp: [{match: [{destinationSubnets: [10.0.0.0/40]}], route: [{destination: {host: a}}]}]",
            ),
            "spec.tcp[0].match[0].destinationSubnets[0]",
            "not a valid CIDR",
        );
        assert_error(
            &check("hosts: [a]\ntcp: [{}]"),
            "spec.tcp[0].route",
            "TCP route is required",
        );
    }

    #[test]
    fn export_to_and_unreachable_rules() {
        assert_error(
            &check(&format!("{BASE}exportTo: [\".\", default]")),
            "spec.exportTo[1]",
            "duplicate entries",
        );
        assert_error(
            &check(&format!("{BASE}exportTo: [\"*\", other]")),
            "spec.exportTo",
            "both public (*)",
        );
        assert_error(
            &check(&format!("{BASE}exportTo: [\"~\"]")),
            "spec.exportTo[0]",
            "invalid exportTo value",
        );
        assert_warning(
            &check(
                "hosts: [a]\nhttp:\n- route: [{destination: {host: a}}]\n- route: [{destination: {host: b}}]\n",
            ),
            "spec.http[1]",
            "rule not used",
        );
    }
}
