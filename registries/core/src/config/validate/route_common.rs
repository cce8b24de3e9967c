//! What every route of a VirtualService (HTTP, TLS and TCP) checks alike: `gateways`
//! lists and destinations with their weights.

use meshfed_api::networking::v1alpha3 as net;

use super::common::{is_dns1123_label, validate_fqdn, validate_port, validate_wildcard_domain};
use super::{FieldPath, Findings};

/// `gateways` lists (of the VirtualService and of matches): `namespace/name`, or a
/// legacy name (warned about when it has dots), or `mesh`.
pub(super) fn validate_gateway_names(f: &mut Findings, at: &FieldPath, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let here = at.index(i);
        match name.split_once('/') {
            None => {
                if let Some((first, rest)) = name.split_once('.') {
                    let ns = rest.split('.').next().unwrap_or_default();
                    f.warn(
                        &here,
                        format!(
                            "using legacy gatewayName format {name:?}; prefer the <namespace>/<name> format: \"{ns}/{first}\""
                        ),
                    );
                }
                f.check(&here, validate_fqdn(name));
            }
            Some((ns, gw)) => {
                if ns.is_empty() || gw.is_empty() {
                    f.error(&here, "config namespace and gateway name cannot be empty");
                    continue;
                }
                if !is_dns1123_label(ns) {
                    f.error(&here, format!("invalid value for namespace: {ns:?}"));
                }
                if !is_dns1123_label(gw) {
                    f.error(&here, format!("invalid value for gateway name: {gw:?}"));
                }
            }
        }
    }
}

/// A destination: a host (not `*`), an optional subset name and port.
pub(super) fn validate_destination(f: &mut Findings, at: &FieldPath, d: &net::Destination) {
    let host = at.field("host");
    if d.host == "*" {
        f.error(&host, format!("invalid destination host {}", d.host));
    } else {
        f.check(&host, validate_wildcard_domain(&d.host));
    }
    if !d.subset.is_empty() && !is_dns1123_label(&d.subset) {
        f.error(
            &at.field("subset"),
            format!("subset name is invalid: {}", d.subset),
        );
    }
    if let Some(port) = &d.port {
        f.check(
            &at.field("port").field("number"),
            validate_port(port.number),
        );
    }
}

/// The destinations of one route (HTTP, TLS or TCP) and their weights.
pub(super) fn validate_route_destinations(
    f: &mut Findings,
    at: &FieldPath,
    routes: &[(Option<&net::Destination>, i32)],
) {
    let mut total: i64 = 0;
    for (k, (destination, weight)) in routes.iter().enumerate() {
        let here = at.index(k);
        match destination {
            None => f.error(&here.field("destination"), "destination is required"),
            Some(d) => validate_destination(f, &here.field("destination"), d),
        }
        if !(0..=100).contains(weight) {
            f.error(
                &here.field("weight"),
                format!("weight {weight} is not in the range 0..100"),
            );
        }
        total += i64::from(*weight);
    }
    if routes.len() > 1 && total != 100 {
        f.error(
            at,
            format!(
                "total destination weight {total} != 100 (the weights of several destinations must add up to 100)"
            ),
        );
    }
    if let [(_, weight)] = routes
        && *weight != 0
        && *weight != 100
    {
        f.warn(
            &at.index(0).field("weight"),
            format!(
                "weight {weight} of a single destination has no effect: it gets all the traffic"
            ),
        );
    }
}
