//! DestinationRule validation (Istio's `ValidateDestinationRule`,
//! `validateTrafficPolicy`, `agent.ValidateTLS`, `ValidateLocalityLbSetting`).
//!
//! `simple` and `consistentHash` (and the members of every other one-of group) cannot
//! both be set: that is already a decode error, reported with its field and line.
//!
//! Difference from Istio: a subset without labels is accepted (as in Istio) but warned
//! about, since it selects every endpoint of the host.

use std::collections::BTreeSet;

use meshfed_api::networking::v1alpha3 as net;
use net::client_tls_settings::TlSmode;
use net::load_balancer_settings::consistent_hash_lb::{HashAlgorithm, HashKey};
use net::load_balancer_settings::{ConsistentHashLb, LbPolicy};

use super::common::{
    check_duration, is_dns1123_label, is_ip, validate_export_to, validate_fqdn,
    validate_header_name, validate_labels, validate_percent, validate_port,
    validate_selector_labels, validate_wildcard_domain,
};
use super::{FieldPath, Findings, Validation};

/// Validates a DestinationRule spec in `namespace`.
pub fn validate_destination_rule(namespace: &str, dr: &net::DestinationRule) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    f.check(&spec.field("host"), validate_wildcard_domain(&dr.host));
    if let Some(policy) = &dr.traffic_policy {
        validate_traffic_policy(&mut f, &spec.field("trafficPolicy"), namespace, policy);
    }
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let at = spec.field("subsets").index(i);
        let name = at.field("name");
        if subset.name.is_empty() {
            f.error(&name, "subset name cannot be empty");
        } else if !is_dns1123_label(&subset.name) {
            f.error(&name, format!("subset name is invalid: {}", subset.name));
        } else if !names.insert(subset.name.as_str()) {
            f.error(&name, format!("duplicate subset names: {}", subset.name));
        }
        if subset.labels.is_empty() {
            f.warn(
                &at.field("labels"),
                "subset has no labels: it selects every endpoint of the host",
            );
        }
        validate_labels(&mut f, &at.field("labels"), &subset.labels);
        if let Some(policy) = &subset.traffic_policy {
            validate_traffic_policy(&mut f, &at.field("trafficPolicy"), namespace, policy);
        }
    }
    validate_export_to(
        &mut f,
        &spec.field("exportTo"),
        namespace,
        &dr.export_to,
        false,
    );
    if let Some(selector) = &dr.workload_selector {
        validate_selector_labels(
            &mut f,
            &spec.field("workloadSelector").field("matchLabels"),
            &selector.match_labels,
            "the rule applies to every workload in the namespace",
        );
        let exported_elsewhere = dr.export_to.iter().any(|e| e != "." && e != namespace);
        if exported_elsewhere {
            f.error(
                &spec.field("exportTo"),
                "destination rule with workload selector cannot have exportTo beyond current namespace",
            );
        } else if dr.export_to.len() > 1 {
            f.error(
                &spec.field("exportTo"),
                "destination rule with workload selector cannot have multiple entries in exportTo",
            );
        }
    }
    f.finish()
}

fn validate_traffic_policy(
    f: &mut Findings,
    at: &FieldPath,
    namespace: &str,
    policy: &net::TrafficPolicy,
) {
    if policy.outlier_detection.is_none()
        && policy.connection_pool.is_none()
        && policy.load_balancer.is_none()
        && policy.tls.is_none()
        && policy.port_level_settings.is_empty()
        && policy.tunnel.is_none()
        && policy.proxy_protocol.is_none()
    {
        f.error(at, "traffic policy must have at least one field");
        return;
    }
    if policy.tunnel.is_some() && policy.proxy_protocol.is_some() {
        f.error(at, "tunnel and proxyProtocol must not be set together");
    }
    if let Some(outlier) = &policy.outlier_detection {
        validate_outlier_detection(f, &at.field("outlierDetection"), outlier);
    }
    if let Some(pool) = &policy.connection_pool {
        validate_connection_pool(f, &at.field("connectionPool"), pool);
    }
    if let Some(lb) = &policy.load_balancer {
        validate_load_balancer(
            f,
            &at.field("loadBalancer"),
            lb,
            policy.outlier_detection.is_some(),
        );
    }
    if let Some(tls) = &policy.tls {
        validate_client_tls(f, &at.field("tls"), namespace, tls);
    }
    for (i, port_policy) in policy.port_level_settings.iter().enumerate() {
        validate_port_traffic_policy(
            f,
            &at.field("portLevelSettings").index(i),
            namespace,
            port_policy,
        );
    }
    if let Some(tunnel) = &policy.tunnel {
        let here = at.field("tunnel");
        if !tunnel.protocol.is_empty() && tunnel.protocol != "CONNECT" && tunnel.protocol != "POST"
        {
            f.error(
                &here.field("protocol"),
                "tunnel protocol must be \"CONNECT\" or \"POST\"",
            );
        }
        if validate_fqdn(&tunnel.target_host).is_err() && !is_ip(&tunnel.target_host) {
            f.error(
                &here.field("targetHost"),
                format!(
                    "tunnel target host {:?} must be valid FQDN or IP address",
                    tunnel.target_host
                ),
            );
        }
        f.check(&here.field("targetPort"), validate_port(tunnel.target_port));
    }
}

fn validate_port_traffic_policy(
    f: &mut Findings,
    at: &FieldPath,
    namespace: &str,
    policy: &net::traffic_policy::PortTrafficPolicy,
) {
    match &policy.port {
        None => f.error(&at.field("port"), "portTrafficPolicy must have valid port"),
        Some(port) => f.check(
            &at.field("port").field("number"),
            validate_port(port.number),
        ),
    }
    if policy.outlier_detection.is_none()
        && policy.connection_pool.is_none()
        && policy.load_balancer.is_none()
        && policy.tls.is_none()
    {
        f.error(at, "port traffic policy must have at least one field");
        return;
    }
    if let Some(outlier) = &policy.outlier_detection {
        validate_outlier_detection(f, &at.field("outlierDetection"), outlier);
    }
    if let Some(pool) = &policy.connection_pool {
        validate_connection_pool(f, &at.field("connectionPool"), pool);
    }
    if let Some(lb) = &policy.load_balancer {
        validate_load_balancer(
            f,
            &at.field("loadBalancer"),
            lb,
            policy.outlier_detection.is_some(),
        );
    }
    if let Some(tls) = &policy.tls {
        validate_client_tls(f, &at.field("tls"), namespace, tls);
    }
}

fn validate_outlier_detection(f: &mut Findings, at: &FieldPath, outlier: &net::OutlierDetection) {
    check_duration(
        f,
        &at.field("baseEjectionTime"),
        outlier.base_ejection_time.as_ref(),
    );
    check_duration(f, &at.field("interval"), outlier.interval.as_ref());
    if outlier.consecutive_errors != 0 {
        f.warn(
            &at.field("consecutiveErrors"),
            "outlier detection consecutive errors is deprecated, use consecutiveGatewayErrors or \
             consecutive5xxErrors instead",
        );
    }
    if !outlier.split_external_local_origin_errors
        && outlier
            .consecutive_local_origin_failures
            .is_some_and(|v| v.value > 0)
    {
        f.error(
            &at.field("consecutiveLocalOriginFailures"),
            "outlier detection consecutive local origin failures is specified, but split external local \
             origin errors is set to false",
        );
    }
    f.check(
        &at.field("maxEjectionPercent"),
        validate_percent(outlier.max_ejection_percent),
    );
    f.check(
        &at.field("minHealthPercent"),
        validate_percent(outlier.min_health_percent),
    );
}

/// Connection pool limits: counts are non-negative, durations valid. Shared with the
/// Sidecar's inbound pools.
pub(crate) fn validate_connection_pool(
    f: &mut Findings,
    at: &FieldPath,
    pool: &net::ConnectionPoolSettings,
) {
    use net::connection_pool_settings::http_settings::H2UpgradePolicy;
    if pool.http.is_none() && pool.tcp.is_none() {
        f.error(at, "connection pool must have at least one field");
        return;
    }
    if let Some(http) = &pool.http {
        let here = at.field("http");
        let counts = [
            ("http1MaxPendingRequests", http.http1_max_pending_requests),
            ("http2MaxRequests", http.http2_max_requests),
            ("maxRequestsPerConnection", http.max_requests_per_connection),
            ("maxRetries", http.max_retries),
            ("maxConcurrentStreams", http.max_concurrent_streams),
        ];
        for (field, value) in counts {
            if value < 0 {
                f.error(
                    &here.field(field),
                    format!("{field} must be non-negative (it is {value})"),
                );
            }
        }
        check_duration(f, &here.field("idleTimeout"), http.idle_timeout.as_ref());
        if http.h2_upgrade_policy() == H2UpgradePolicy::Upgrade && http.use_client_protocol {
            f.error(
                &here.field("useClientProtocol"),
                "use client protocol must not be true when H2UpgradePolicy is UPGRADE",
            );
        }
    }
    if let Some(tcp) = &pool.tcp {
        let here = at.field("tcp");
        if tcp.max_connections < 0 {
            f.error(
                &here.field("maxConnections"),
                format!(
                    "maxConnections must be non-negative (it is {})",
                    tcp.max_connections
                ),
            );
        }
        check_duration(
            f,
            &here.field("connectTimeout"),
            tcp.connect_timeout.as_ref(),
        );
        check_duration(
            f,
            &here.field("maxConnectionDuration"),
            tcp.max_connection_duration.as_ref(),
        );
        check_duration(f, &here.field("idleTimeout"), tcp.idle_timeout.as_ref());
        if let Some(keepalive) = &tcp.tcp_keepalive {
            let ka = here.field("tcpKeepalive");
            check_duration(f, &ka.field("time"), keepalive.time.as_ref());
            check_duration(f, &ka.field("interval"), keepalive.interval.as_ref());
        }
    }
}

fn validate_load_balancer(
    f: &mut Findings,
    at: &FieldPath,
    lb: &net::LoadBalancerSettings,
    has_outlier_detection: bool,
) {
    if let Some(LbPolicy::ConsistentHash(hash)) = &lb.lb_policy {
        validate_consistent_hash(f, &at.field("consistentHash"), hash);
    }
    if let Some(locality) = &lb.locality_lb_setting {
        validate_locality_lb(
            f,
            &at.field("localityLbSetting"),
            locality,
            has_outlier_detection,
        );
    }
    check_duration(
        f,
        &at.field("warmupDurationSecs"),
        lb.warmup_duration_secs.as_ref(),
    );
}

fn validate_consistent_hash(f: &mut Findings, at: &FieldPath, hash: &ConsistentHashLb) {
    match &hash.hash_key {
        None => f.error(
            at,
            "consistentHash needs exactly one hash key: httpHeaderName, httpCookie, useSourceIp or \
             httpQueryParameterName",
        ),
        Some(HashKey::HttpCookie(cookie)) if cookie.name.is_empty() => f.error(
            &at.field("httpCookie").field("name"),
            "name required for HttpCookie",
        ),
        Some(HashKey::HttpCookie(cookie)) => {
            check_duration(f, &at.field("httpCookie").field("ttl"), cookie.ttl.as_ref());
        }
        Some(HashKey::HttpHeaderName(name)) => {
            f.check(&at.field("httpHeaderName"), validate_header_name(name));
        }
        Some(HashKey::HttpQueryParameterName(name)) if name.is_empty() => f.error(
            &at.field("httpQueryParameterName"),
            "query parameter name cannot be empty",
        ),
        Some(HashKey::UseSourceIp(false)) => f.error(
            &at.field("useSourceIp"),
            "useSourceIp: false selects no hash key; set it to true or use another key",
        ),
        Some(_) => {}
    }
    if hash.minimum_ring_size != 0 {
        f.warn(
            &at.field("minimumRingSize"),
            "consistent hash MinimumRingSize is deprecated, use ConsistentHashLB's RingHash configuration instead",
        );
        if hash.hash_algorithm.is_some() {
            f.error(
                &at.field("minimumRingSize"),
                "only one of MinimumRingSize or Maglev/Ringhash can be specified",
            );
        }
    }
    if let Some(HashAlgorithm::Maglev(maglev)) = &hash.hash_algorithm {
        let here = at.field("maglev").field("tableSize");
        let size = maglev.table_size;
        if size == 0 {
            f.error(&here, "tableSize must be set for maglev");
        } else if size >= 5_000_011 {
            f.error(&here, "tableSize must be less than 5000011 for maglev");
        } else if !is_prime(size) {
            f.error(&here, "tableSize must be a prime number for maglev");
        }
    }
}

/// Envoy's primality check for Maglev table sizes.
fn is_prime(x: u64) -> bool {
    if x != 0 && x < 4 {
        return true;
    }
    if x & 1 == 0 {
        return false;
    }
    let mut factor = 3;
    while factor * factor <= x {
        if x.is_multiple_of(factor) {
            return false;
        }
        factor += 2;
    }
    true
}

pub(crate) fn validate_locality_lb(
    f: &mut Findings,
    at: &FieldPath,
    lb: &net::LocalityLoadBalancerSetting,
    has_outlier_detection: bool,
) {
    if !lb.distribute.is_empty() && !lb.failover.is_empty() {
        f.error(
            at,
            "can not simultaneously specify 'distribute' and 'failover'",
        );
        return;
    }
    const TOPOLOGY_LABELS: &[&str] = &[
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "topology.istio.io/subzone",
    ];
    if !lb.failover.is_empty()
        && let Some(label) = lb
            .failover_priority
            .iter()
            .find(|l| TOPOLOGY_LABELS.contains(&l.as_str()))
    {
        f.error(
            &at.field("failoverPriority"),
            format!("can not simultaneously set 'failover' and topology label '{label}' in 'failover_priority'"),
        );
        return;
    }
    for (i, distribute) in lb.distribute.iter().enumerate() {
        let here = at.field("distribute").index(i);
        let mut total: u64 = 0;
        for (locality, weight) in &distribute.to {
            if !(1..=100).contains(weight) {
                f.error(
                    &here.field("to").key(locality),
                    "locality weight must be in range [1, 100]",
                );
            }
            total += u64::from(*weight);
        }
        if total != 100 {
            f.error(
                &here.field("to"),
                format!("total locality weight {total} != 100"),
            );
        }
        if let Err(reason) = validate_localities(distribute.to.keys().map(String::as_str)) {
            f.error(&here.field("to"), reason);
        }
    }
    if let Err(reason) = validate_localities(lb.distribute.iter().map(|d| d.from.as_str())) {
        f.error(&at.field("distribute"), reason);
    }
    if (!lb.failover.is_empty() || !lb.failover_priority.is_empty()) && !has_outlier_detection {
        f.warn(at, "outlier detection policy must be provided for failover");
    }
    for (i, failover) in lb.failover.iter().enumerate() {
        let here = at.field("failover").index(i);
        if failover.from == failover.to {
            f.error(
                &here,
                "locality lb failover settings must specify different regions",
            );
        }
        if failover.from.contains('/') || failover.to.contains('/') {
            f.error(&here, "locality lb failover only specify region");
        }
        if failover.from.contains('*') || failover.to.contains('*') {
            f.error(
                &here,
                "locality lb failover region should not contain '*' wildcard",
            );
        }
    }
}

/// Localities `region[/zone[/subzone]]`, at most one trailing `*`, none overlapping.
fn validate_localities<'a>(localities: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut seen: Vec<Vec<&str>> = Vec::new();
    for locality in localities {
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            return Err(format!(
                "locality {locality} wildcard '*' number can not exceed 1 and must be in the end"
            ));
        }
        let parts: Vec<&str> = locality.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "locality {locality} must not contain empty region/zone/subzone info"
            ));
        }
        // Two localities overlap when one is a prefix of the other or either is `*`.
        let overlaps = |other: &Vec<&str>| {
            let n = parts.len().min(other.len());
            other.first() == Some(&"*")
                || parts.first() == Some(&"*")
                || parts[..n]
                    .iter()
                    .zip(&other[..n])
                    .all(|(a, b)| a == b || *a == "*" || *b == "*")
        };
        if seen.iter().any(overlaps) {
            return Err(format!(
                "locality {locality} overlap with previous specified ones"
            ));
        }
        seen.push(parts);
    }
    Ok(())
}

/// Client TLS settings (Istio's `agent.ValidateTLS`) of a rule in `namespace`: a
/// `configmap://` credential names a ConfigMap of that namespace (SDS serves such a CA
/// to every proxy, so a rule may not point at another namespace's).
fn validate_client_tls(
    f: &mut Findings,
    at: &FieldPath,
    namespace: &str,
    tls: &net::ClientTlsSettings,
) {
    if let Some(rest) = tls.credential_name.strip_prefix("configmap://") {
        match rest.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                if ns != namespace || namespace.is_empty() {
                    f.error(
                        &at.field("credentialName"),
                        format!("invalid configmap:// credentialName: namespace must match the configuration namespace {namespace:?}"),
                    );
                }
            }
            _ => f.error(
                &at.field("credentialName"),
                format!(
                    "invalid configmap:// credentialName: invalid resource name {:?}. Expected namespace and name",
                    tls.credential_name
                ),
            ),
        }
    }
    let mode = tls.mode();
    if tls.insecure_skip_verify.is_some_and(|v| v.value) {
        if mode == TlSmode::Simple
            && (!tls.ca_certificates.is_empty()
                || !tls.credential_name.is_empty()
                || !tls.subject_alt_names.is_empty())
        {
            f.error(
                &at.field("insecureSkipVerify"),
                "cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is set true",
            );
        }
        if mode == TlSmode::Mutual
            && (!tls.ca_certificates.is_empty() || !tls.subject_alt_names.is_empty())
        {
            f.error(
                &at.field("insecureSkipVerify"),
                "cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true",
            );
        }
    }
    if matches!(mode, TlSmode::Simple | TlSmode::Mutual) && !tls.credential_name.is_empty() {
        if !tls.client_certificate.is_empty()
            || !tls.ca_certificates.is_empty()
            || !tls.private_key.is_empty()
            || !tls.ca_crl.is_empty()
        {
            f.error(
                &at.field("credentialName"),
                "cannot specify client certificates or CA certificate or CA CRL If credentialName is set",
            );
        }
        return;
    }
    if mode == TlSmode::Mutual {
        if tls.client_certificate.is_empty() {
            f.error(
                &at.field("clientCertificate"),
                "client certificate required for mutual tls (or set credentialName)",
            );
        }
        if tls.private_key.is_empty() {
            f.error(
                &at.field("privateKey"),
                "private key required for mutual tls (or set credentialName)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, assert_warning, spec};
    use super::*;

    fn check(yaml: &str) -> Validation {
        validate_destination_rule("default", &spec::<net::DestinationRule>(yaml))
    }

    fn policy(p: &str) -> Validation {
        check(&format!("host: reviews\ntrafficPolicy: {p}\n"))
    }

    #[test]
    fn a_full_valid_destination_rule_passes() {
        let warnings = assert_ok(&check(
            r#"
host: reviews.prod.svc.cluster.local
trafficPolicy:
  loadBalancer:
    consistentHash: {httpCookie: {name: user, ttl: 0.5s}, maglev: {tableSize: 65537}}
    localityLbSetting: {distribute: [{from: us-west/zone1/*, to: {"us-west/zone1/*": 80, "us-west/zone2/*": 20}}]}
  connectionPool:
    tcp: {maxConnections: 100, connectTimeout: 30ms, tcpKeepalive: {time: 7200s, interval: 75s}}
    http: {http2MaxRequests: 1000, maxRequestsPerConnection: 10}
  outlierDetection: {consecutive5xxErrors: 7, interval: 5m, baseEjectionTime: 15m, maxEjectionPercent: 50}
  tls: {mode: MUTUAL, clientCertificate: /etc/certs/cert.pem, privateKey: /etc/certs/key.pem}
  portLevelSettings:
  - port: {number: 80}
    loadBalancer: {simple: LEAST_REQUEST}
subsets:
- name: v1
  labels: {version: v1}
- name: v2
  labels: {version: v2}
  trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}
"#,
        ));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn config_map_credentials_name_a_config_map_of_the_rule_namespace() {
        assert_ok(&policy(
            "{tls: {mode: SIMPLE, credentialName: 'configmap://default/ca'}}",
        ));
        assert_error(
            &policy("{tls: {mode: SIMPLE, credentialName: 'configmap://other/ca'}}"),
            "spec.trafficPolicy.tls.credentialName",
            "namespace must match the configuration namespace \"default\"",
        );
        assert_error(
            &policy("{tls: {mode: SIMPLE, credentialName: 'configmap://ca'}}"),
            "spec.trafficPolicy.tls.credentialName",
            "Expected namespace and name",
        );
        assert_error(
            &policy(
                "{portLevelSettings: [{port: {number: 443}, tls: {mode: SIMPLE, credentialName: 'configmap://other/ca'}}]}",
            ),
            "spec.trafficPolicy.portLevelSettings[0].tls.credentialName",
            "namespace must match",
        );
    }

    #[test]
    fn host() {
        assert_error(&check("host: \"\""), "spec.host", "empty domain name");
        assert_error(&check("host: \"a b\""), "spec.host", "invalid");
    }

    #[test]
    fn subsets() {
        assert_error(
            &check("host: a\nsubsets: [{labels: {v: a}}]"),
            "spec.subsets[0].name",
            "cannot be empty",
        );
        assert_error(
            &check("host: a\nsubsets: [{name: v1, labels: {v: a}}, {name: v1, labels: {v: b}}]"),
            "spec.subsets[1].name",
            "duplicate subset names",
        );
        assert_error(
            &check("host: a\nsubsets: [{name: V_1, labels: {v: a}}]"),
            "spec.subsets[0].name",
            "subset name is invalid",
        );
        assert_error(
            &check("host: a\nsubsets: [{name: v1, labels: {\"bad key\": a}}]"),
            "spec.subsets[0].labels[bad key]",
            "invalid label key",
        );
        assert_warning(
            &check("host: a\nsubsets: [{name: v1}]"),
            "spec.subsets[0].labels",
            "selects every endpoint",
        );
        assert_error(
            &check("host: a\nsubsets: [{name: v1, labels: {v: a}, trafficPolicy: {}}]"),
            "spec.subsets[0].trafficPolicy",
            "at least one field",
        );
    }

    #[test]
    fn load_balancer() {
        assert_error(
            &policy("{loadBalancer: {consistentHash: {}}}"),
            "spec.trafficPolicy.loadBalancer.consistentHash",
            "exactly one hash key",
        );
        assert_error(
            &policy("{loadBalancer: {consistentHash: {httpCookie: {ttl: 1s}}}}"),
            "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.name",
            "name required",
        );
        assert_error(
            &policy(
                "{loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 1000}}}}",
            ),
            "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize",
            "prime",
        );
        assert_error(
            &policy(
                "{loadBalancer: {consistentHash: {useSourceIp: true, minimumRingSize: 1024, ringHash: {minimumRingSize: 1024}}}}",
            ),
            "spec.trafficPolicy.loadBalancer.consistentHash.minimumRingSize",
            "only one of",
        );
        assert_error(
            &policy(
                "{loadBalancer: {simple: RANDOM, localityLbSetting: {distribute: [{from: a/*, to: {b/*: 60}}]}}}",
            ),
            "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to",
            "total locality weight 60 != 100",
        );
        assert_error(
            &policy(
                "{loadBalancer: {localityLbSetting: {failover: [{from: us-east, to: us-east}]}}, outlierDetection: {interval: 1s}}",
            ),
            "spec.trafficPolicy.loadBalancer.localityLbSetting.failover[0]",
            "different regions",
        );
        assert_error(
            &policy(
                "{loadBalancer: {localityLbSetting: {failover: [{from: a, to: b}], distribute: [{from: a, to: {b: 100}}]}}}",
            ),
            "spec.trafficPolicy.loadBalancer.localityLbSetting",
            "simultaneously",
        );
    }

    #[test]
    fn outlier_detection_and_connection_pool() {
        assert_error(
            &policy("{outlierDetection: {maxEjectionPercent: 150}}"),
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
            "not in range 0..100",
        );
        assert_error(
            &policy("{outlierDetection: {minHealthPercent: -1}}"),
            "spec.trafficPolicy.outlierDetection.minHealthPercent",
            "not in range 0..100",
        );
        assert_error(
            &policy("{outlierDetection: {interval: 0s}}"),
            "spec.trafficPolicy.outlierDetection.interval",
            "at least 1ms",
        );
        assert_error(
            &policy("{outlierDetection: {consecutiveLocalOriginFailures: 3}}"),
            "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures",
            "split external local origin errors",
        );
        assert_warning(
            &policy("{outlierDetection: {consecutiveErrors: 3}}"),
            "spec.trafficPolicy.outlierDetection.consecutiveErrors",
            "deprecated",
        );
        assert_error(
            &policy("{connectionPool: {tcp: {maxConnections: -1}}}"),
            "spec.trafficPolicy.connectionPool.tcp.maxConnections",
            "non-negative",
        );
        assert_error(
            &policy("{connectionPool: {http: {http1MaxPendingRequests: -5}}}"),
            "spec.trafficPolicy.connectionPool.http.http1MaxPendingRequests",
            "non-negative",
        );
        assert_error(
            &policy(
                "{connectionPool: {http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true}}}",
            ),
            "spec.trafficPolicy.connectionPool.http.useClientProtocol",
            "UPGRADE",
        );
        assert_error(
            &policy("{connectionPool: {}}"),
            "spec.trafficPolicy.connectionPool",
            "at least one field",
        );
    }

    #[test]
    fn tls() {
        assert_error(
            &policy("{tls: {mode: MUTUAL, privateKey: /k.pem}}"),
            "spec.trafficPolicy.tls.clientCertificate",
            "client certificate required",
        );
        assert_error(
            &policy("{tls: {mode: MUTUAL, clientCertificate: /c.pem}}"),
            "spec.trafficPolicy.tls.privateKey",
            "private key required",
        );
        assert_ok(&policy(
            "{tls: {mode: MUTUAL, credentialName: client-cert}}",
        ));
        assert_error(
            &policy("{tls: {mode: SIMPLE, credentialName: c, caCertificates: /ca.pem}}"),
            "spec.trafficPolicy.tls.credentialName",
            "If credentialName is set",
        );
        assert_error(
            &policy("{tls: {mode: SIMPLE, insecureSkipVerify: true, subjectAltNames: [a]}}"),
            "spec.trafficPolicy.tls.insecureSkipVerify",
            "InsecureSkipVerify",
        );
    }

    #[test]
    fn port_level_settings_and_tunnel() {
        assert_error(
            &policy("{portLevelSettings: [{loadBalancer: {simple: RANDOM}}]}"),
            "spec.trafficPolicy.portLevelSettings[0].port",
            "must have valid port",
        );
        assert_error(
            &policy("{portLevelSettings: [{port: {number: 0}, loadBalancer: {simple: RANDOM}}]}"),
            "spec.trafficPolicy.portLevelSettings[0].port.number",
            "1..65535",
        );
        assert_error(
            &policy("{portLevelSettings: [{port: {number: 80}}]}"),
            "spec.trafficPolicy.portLevelSettings[0]",
            "at least one field",
        );
        assert_error(
            &policy("{tunnel: {protocol: GET, targetHost: a.example.com, targetPort: 80}}"),
            "spec.trafficPolicy.tunnel.protocol",
            "CONNECT",
        );
        assert_error(
            &policy("{tunnel: {targetHost: a.example.com, targetPort: 80}, proxyProtocol: {}}"),
            "spec.trafficPolicy",
            "tunnel and proxyProtocol",
        );
    }

    #[test]
    fn workload_selector_and_export_to() {
        assert_error(
            &check("host: a\nworkloadSelector: {matchLabels: {app: \"*\"}}"),
            "spec.workloadSelector.matchLabels[app]",
            "wildcard is not supported",
        );
        assert_error(
            &check("host: a\nworkloadSelector: {matchLabels: {app: a}}\nexportTo: [\"*\"]"),
            "spec.exportTo",
            "beyond current namespace",
        );
        assert_ok(&check(
            "host: a\nworkloadSelector: {matchLabels: {app: a}}\nexportTo: [\".\"]",
        ));
    }
}
