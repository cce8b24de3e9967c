//! The Grafana dashboard under deploy/grafana queries only metrics meshfed exports.

use std::collections::BTreeSet;

use meshfed::app::CaSource;
use meshfed::testing::{AdsClient, FakeServer, node};
use meshfed::xds::TypeUrl;

use crate::support::http_get;

const DASHBOARD: &str = include_str!("../../deploy/grafana/meshfed-control-plane.json");

/// PromQL words that look like metric names but are not.
const PROMQL: &[&str] = &[
    "sum",
    "max",
    "min",
    "count",
    "rate",
    "increase",
    "histogram_quantile",
    "time",
    "by",
    "le",
    "type",
    "label_values",
];

/// The metric names a PromQL expression selects: every name directly before `{`, or
/// the first argument of `label_values(`.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let bytes = expr.as_bytes();
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    for (i, _) in expr.match_indices('{') {
        let start = (0..i).rev().take_while(|&j| is_name(bytes[j])).last();
        if let Some(start) = start {
            into.insert(expr[start..i].to_string());
        }
    }
    if let Some(rest) = expr.strip_prefix("label_values(") {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        into.insert(name);
    }
}

fn queried_metrics() -> BTreeSet<String> {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut names = BTreeSet::new();
    let mut exprs = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            metric_names(target["expr"].as_str().unwrap(), &mut names);
            exprs += 1;
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"].as_str() {
            metric_names(query, &mut names);
        }
    }
    assert!(exprs > 20, "{exprs} queries");
    for word in PROMQL {
        assert!(!names.contains(*word), "{word} taken for a metric");
    }
    names
}

#[test]
fn names_are_read_from_selectors() {
    let mut names = BTreeSet::new();
    metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(a_b_bucket{job=~\"$job\"}[5m]))) - c{x=\"y\"}",
        &mut names,
    );
    metric_names("label_values(pilot_services, job)", &mut names);
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["a_b_bucket", "c", "pilot_services"]
    );
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = FakeServer::builder()
        .embedded_mock_registry()
        .configure(|c| {
            c.ca = Some(CaSource::Dir {
                cacerts: None,
                self_signed_dir: ca_dir.clone(),
            });
        })
        .start()
        .await
        .unwrap();
    server.sync().await;

    // A proxy connects, is sent clusters and rejects them: the per-type families
    // (pushes, push time, config size, rejects) have samples.
    let mut client = AdsClient::connect(
        server.grpc_addr(),
        node("sidecar~10.0.0.1~app-1.default~default.svc.cluster.local"),
    )
    .await
    .unwrap();
    client.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    let response = client.recv().await.unwrap();
    client
        .nack(&response, "rejected for the test")
        .await
        .unwrap();

    // A stream with a malformed node is refused: `meshfed_xds_request_errors`.
    let mut bad = AdsClient::connect(server.grpc_addr(), node("app-1.default"))
        .await
        .unwrap();
    bad.subscribe(TypeUrl::Cluster, &[]).await.unwrap();
    bad.recv_error().await.unwrap();

    let names = queried_metrics();
    let (status, metrics) = http_get(server.bound().monitoring, "/metrics").await;
    assert_eq!(status, 200);
    // A sample's name, or a family a collector declares with no sample yet (its
    // `# TYPE` line; counters are sampled with `_total`).
    let mut exported: BTreeSet<String> = BTreeSet::new();
    for line in metrics.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split(' ');
            let (name, kind) = (words.next().unwrap(), words.next().unwrap_or(""));
            exported.insert(match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            });
        } else if !line.starts_with('#') {
            exported.extend(line.split(['{', ' ']).next().map(str::to_string));
        }
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not have: {missing:?}\n{metrics}"
    );
}
