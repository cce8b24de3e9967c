//! The EnvoyFilters of `envoyFilters` (see [`EnvoyFilters`]): an Istio config file in
//! the server's config directory with realistic patches (a Lua filter inserted before
//! the router, a cluster's connect timeout merged, route configuration and virtual
//! host headers, a listener buffer limit), the label every sidecar carries to be
//! selected, and the changes of one selecting EnvoyFilter after the churn.

use std::fmt::Write as _;

use serde::Serialize;

use super::registry::namespace_name;
use super::scenario::EnvoyFilters;

/// The file of the EnvoyFilters in the server's config directory.
pub const ENVOY_FILTER_FILE: &str = "load-envoy-filters.yaml";

/// The label the selecting EnvoyFilters match (node metadata `LABELS`).
pub const GROUP_LABEL: &str = "load.meshfed.io/group";

/// Istio's default root namespace, where the mesh-wide EnvoyFilters live.
pub const ROOT_NAMESPACE: &str = "istio-system";

/// The label group of sidecar `index` (`None`: sidecars carry no label).
pub fn group_of(ef: &EnvoyFilters, index: usize) -> Option<String> {
    let groups = ef.label_groups();
    (groups > 0).then(|| format!("g{}", index % groups))
}

/// The sidecars (of `proxies`) selected by selecting EnvoyFilter `k`: those of its
/// label group.
pub fn selected_by(ef: &EnvoyFilters, k: usize, proxies: usize) -> usize {
    let groups = ef.label_groups().max(1);
    let group = k % groups;
    (0..proxies).filter(|i| i % groups == group).count()
}

/// The config file: `mesh_wide` EnvoyFilters in the root namespace, then the
/// selecting ones, each in its group's namespace; `generation` is the number of
/// changes made so far to the first selecting one (its Lua code names it).
pub fn render(ef: &EnvoyFilters, namespaces: usize, generation: usize) -> String {
    let mut out = String::from(
        "# Written by `meshfed load` (envoyFilters); the first selecting EnvoyFilter is\n\
         # rewritten on every EnvoyFilter change.\n",
    );
    for j in 0..ef.mesh_wide {
        let (apply_to, matcher, operation, value) = mesh_wide_patch(j);
        let _ = write!(
            out,
            "---\napiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\n\
             metadata:\n  name: load-mesh-{j}\n  namespace: {ROOT_NAMESPACE}\n\
             spec:\n  configPatches:\n  - applyTo: {apply_to}\n    match:\n{matcher}\
             \x20   patch:\n      operation: {operation}\n      value:\n{value}"
        );
    }
    let groups = ef.label_groups().max(1);
    for k in 0..ef.selecting {
        let group = k % groups;
        let ns = namespace_name(group % namespaces);
        let generation = if k == 0 { generation } else { 0 };
        let _ = write!(
            out,
            "---\napiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\n\
             metadata:\n  name: load-group-{k}\n  namespace: {ns}\n\
             spec:\n  workloadSelector:\n    labels:\n      {GROUP_LABEL}: g{group}\n\
             \x20 configPatches:\n\
             \x20 - applyTo: HTTP_FILTER\n    match:\n{router}\
             \x20   patch:\n      operation: INSERT_BEFORE\n      value:\n{lua}\
             \x20 - applyTo: CLUSTER\n    match:\n      context: SIDECAR_OUTBOUND\n\
             \x20   patch:\n      operation: MERGE\n      value:\n        connect_timeout: {timeout}s\n",
            router = ROUTER_MATCH,
            lua = lua(
                &format!("load.group.{k}"),
                "x-load-group",
                &format!("{k}.{generation}")
            ),
            timeout = 1 + k % 5,
        );
    }
    out
}

/// The `match` of the HTTP filter patches: the router of every outbound HTTP
/// connection manager.
const ROUTER_MATCH: &str = "      context: SIDECAR_OUTBOUND\n      listener:\n        filterChain:\n\
     \x20         filter:\n            name: envoy.filters.network.http_connection_manager\n\
     \x20           subFilter:\n              name: envoy.filters.http.router\n";

/// A Lua HTTP filter adding header `header: value` to every request.
fn lua(name: &str, header: &str, value: &str) -> String {
    format!(
        "        name: {name}\n        typed_config:\n\
         \x20         \"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n\
         \x20         default_source_code:\n            inline_string: |\n\
         \x20             function envoy_on_request(handle)\n\
         \x20               handle:headers():add(\"{header}\", \"{value}\")\n\
         \x20             end\n"
    )
}

/// Mesh-wide EnvoyFilter `j`'s one patch (apply-to, match, operation, value), by `j
/// % 5`: a Lua filter before the router, a cluster's connect timeout, a route
/// configuration's request header, a virtual host's response header, a listener's
/// buffer limit.
fn mesh_wide_patch(j: usize) -> (&'static str, String, &'static str, String) {
    let outbound = "      context: SIDECAR_OUTBOUND\n".to_string();
    match j % 5 {
        0 => (
            "HTTP_FILTER",
            ROUTER_MATCH.to_string(),
            "INSERT_BEFORE",
            lua(&format!("load.mesh.{j}"), "x-load-mesh", &j.to_string()),
        ),
        1 => (
            "CLUSTER",
            outbound,
            "MERGE",
            format!("        connect_timeout: {}s\n", 5 + j),
        ),
        2 => (
            "ROUTE_CONFIGURATION",
            outbound,
            "MERGE",
            format!(
                "        request_headers_to_add:\n        - header:\n            key: x-load-rc-{j}\n\
                 \x20           value: \"{j}\"\n"
            ),
        ),
        3 => (
            "VIRTUAL_HOST",
            outbound,
            "MERGE",
            format!(
                "        response_headers_to_add:\n        - header:\n            key: x-load-vh-{j}\n\
                 \x20           value: \"{j}\"\n"
            ),
        ),
        _ => (
            "LISTENER",
            outbound,
            "MERGE",
            format!("        per_connection_buffer_limit_bytes: {}\n", 32768 + j),
        ),
    }
}

/// One EnvoyFilter change after the churn: what it pushed and cost.
#[derive(Clone, Debug, Serialize)]
pub struct EnvoyFilterChange {
    /// Sidecars the changed EnvoyFilter selects (the proxies that should be pushed).
    pub selected: usize,
    /// Proxies that received any response from the write until the pushes went quiet.
    pub pushed: usize,
    /// From the write until the last response (seconds).
    pub seconds: f64,
    /// The server's CPU over the same span (seconds), when it is a local process.
    pub server_cpu_seconds: Option<f64>,
}

/// The report lines of the EnvoyFilter changes.
pub fn render_changes(changes: &[EnvoyFilterChange], out: &mut String) {
    if changes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nEnvoyFilter changes (one selecting EnvoyFilter rewritten, one at a time)"
    );
    let _ = writeln!(
        out,
        "  {:<4} {:>8} {:>8} {:>12} {:>12}",
        "#", "selected", "pushed", "last resp s", "server CPU s"
    );
    for (i, c) in changes.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:<4} {:>8} {:>8} {:>12.3} {:>12}",
            i,
            c.selected,
            c.pushed,
            c.seconds,
            c.server_cpu_seconds
                .map_or_else(|| "-".to_string(), |s| format!("{s:.3}"))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters() -> EnvoyFilters {
        EnvoyFilters {
            mesh_wide: 5,
            selecting: 4,
            groups: 0,
            changes: 1,
        }
    }

    #[test]
    fn renders_envoy_filters_in_their_groups_namespaces() {
        let text = render(&filters(), 2, 3);
        let docs: Vec<serde_norway::Value> = text
            .split("\n---\n")
            .skip(1)
            .map(|d| serde_norway::from_str(d).unwrap_or_else(|e| panic!("{e}\n{d}")))
            .collect();
        assert_eq!(docs.len(), 9);
        let apply_to: Vec<&str> = docs[..5]
            .iter()
            .map(|d| d["spec"]["configPatches"][0]["applyTo"].as_str().unwrap())
            .collect();
        assert_eq!(
            apply_to,
            [
                "HTTP_FILTER",
                "CLUSTER",
                "ROUTE_CONFIGURATION",
                "VIRTUAL_HOST",
                "LISTENER"
            ]
        );
        assert!(
            docs[..5]
                .iter()
                .all(|d| d["metadata"]["namespace"] == ROOT_NAMESPACE)
        );
        let group3 = &docs[8];
        assert_eq!(group3["metadata"]["namespace"], "load-1");
        assert_eq!(
            group3["spec"]["workloadSelector"]["labels"][GROUP_LABEL],
            "g3"
        );
        let code = |d: &serde_norway::Value| {
            d["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]["default_source_code"]
                ["inline_string"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(code(&docs[5]).contains("\"0.3\""), "{}", code(&docs[5]));
        assert!(code(&docs[6]).contains("\"1.0\""));
        assert_ne!(
            render(&filters(), 2, 4),
            text,
            "a change rewrites the first"
        );
    }

    #[test]
    fn groups_select_every_groups_th_sidecar() {
        let ef = filters();
        assert_eq!(group_of(&ef, 6).as_deref(), Some("g2"));
        assert_eq!(selected_by(&ef, 0, 10), 3);
        assert_eq!(selected_by(&ef, 3, 10), 2);
        assert_eq!(group_of(&EnvoyFilters::default(), 1), None);
    }
}
