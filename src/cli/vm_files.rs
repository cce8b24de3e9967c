//! The files `meshfed vm bootstrap` writes for a WorkloadGroup, computed from their
//! inputs as `istioctl x workload entry configure` computes them
//! (`istioctl/pkg/workload/workload.go`): `mesh.yaml` (the mesh config's
//! `defaultConfig` with the group's `proxy.istio.io/config` annotations applied, its
//! probe as `readinessProbe` and the workload's metadata in `proxyMetadata`),
//! `cluster.env` (that `proxyMetadata` plus the variables of the VM's traffic capture,
//! one `KEY='value'` line each, sorted) and `hosts`. No IO here.

use std::collections::BTreeMap;

use meshfed_api::networking::v1alpha3 as net;
use serde_json::{Map, Value, json};

/// The annotation whose ProxyConfig YAML overrides the mesh's `defaultConfig`.
pub const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";
/// The istiod port a VM's agent connects to (xDS over TLS and the CA).
pub const ISTIOD_PORT: u16 = 15012;

/// A WorkloadGroup as the files need it.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub name: String,
    pub namespace: String,
    /// The object's own `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    pub spec: net::WorkloadGroup,
}

/// Everything the files depend on besides the group.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The mesh config (the `mesh` key of the `istio` ConfigMap) as a JSON object.
    pub mesh: Value,
    pub cluster_id: String,
    /// The control plane revision (`""` or `default`: none).
    pub revision: String,
    /// The control plane's namespace.
    pub istio_namespace: String,
    /// `--internalIP` / `--externalIP` (at most one).
    pub internal_ip: Option<String>,
    pub external_ip: Option<String>,
    /// `ISTIO_META_AUTO_REGISTER_GROUP`: the agent asks the control plane to create
    /// its WorkloadEntry from the group.
    pub autoregister: bool,
    /// `ISTIO_META_DNS_CAPTURE=true`.
    pub capture_dns: bool,
}

/// The contents of `mesh.yaml` and `cluster.env`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    pub mesh_yaml: String,
    pub cluster_env: String,
    /// Things the user should know (printed on stderr).
    pub notes: Vec<String>,
}

/// Why the files could not be computed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilesError {
    /// A `proxy.istio.io/config` annotation that is not a YAML mapping.
    #[error("WorkloadGroup {group}: annotation {PROXY_CONFIG_ANNOTATION} ({place}): {reason}")]
    ProxyConfigAnnotation {
        group: String,
        place: &'static str,
        reason: String,
    },
    /// A mesh config field of the wrong type.
    #[error("mesh config: {field}: {reason}")]
    Mesh { field: String, reason: String },
}

/// Whether `revision` names a revision (istioctl's `isRevisioned`).
pub fn is_revisioned(revision: &str) -> bool {
    !revision.is_empty() && revision != "default"
}

/// `istiod[-<rev>].<ns>.svc`.
pub fn istiod_host(namespace: &str, revision: &str) -> String {
    if is_revisioned(revision) {
        format!("istiod-{revision}.{namespace}.svc")
    } else {
        format!("istiod.{namespace}.svc")
    }
}

/// `istiod[-<rev>].<ns>.svc:15012`.
pub fn istiod_addr(namespace: &str, revision: &str) -> String {
    format!("{}:{ISTIOD_PORT}", istiod_host(namespace, revision))
}

/// The `hosts` file: `<ip> <istiod host>`, or empty without a valid IP.
pub fn hosts(ip: Option<&str>, namespace: &str, revision: &str) -> String {
    match ip.filter(|ip| ip.parse::<std::net::IpAddr>().is_ok()) {
        Some(ip) => format!("{ip} {}\n", istiod_host(namespace, revision)),
        None => String::new(),
    }
}

/// The canonical service name and revision of `labels` (Istio's
/// `labels.CanonicalService`).
pub fn canonical_service(labels: &BTreeMap<String, String>, workload: &str) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    (
        first(&[
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ])
        .unwrap_or_else(|| workload.to_string()),
        first(&[
            "service.istio.io/canonical-revision",
            "app.kubernetes.io/version",
            "version",
        ])
        .unwrap_or_else(|| "latest".to_string()),
    )
}

/// `mesh.yaml` and `cluster.env` for `group`.
pub fn generate(group: &Group, settings: &Settings) -> Result<Files, FilesError> {
    let mut notes = Vec::new();
    let mut default_config = match settings.mesh.get("defaultConfig") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => {
            return Err(FilesError::Mesh {
                field: "defaultConfig".into(),
                reason: format!("expected a mapping, found {other}"),
            });
        }
    };
    if is_revisioned(&settings.revision)
        && default_config
            .get("discoveryAddress")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
    {
        default_config.insert(
            "discoveryAddress".into(),
            json!(istiod_addr(&settings.istio_namespace, &settings.revision)),
        );
    }
    let mut metadata = string_map(
        default_config.get("proxyMetadata"),
        "defaultConfig.proxyMetadata",
    )?;

    let group_id = format!("{}/{}", group.namespace, group.name);
    let spec_meta = group.spec.metadata.clone().unwrap_or_default();
    for (place, annotations) in [
        ("metadata.annotations", &group.annotations),
        ("spec.metadata.annotations", &spec_meta.annotations),
    ] {
        let Some(text) = annotations.get(PROXY_CONFIG_ANNOTATION) else {
            continue;
        };
        let bad = |reason: String| FilesError::ProxyConfigAnnotation {
            group: group_id.clone(),
            place,
            reason,
        };
        let value: Value = if text.trim().is_empty() {
            json!({})
        } else {
            serde_norway::from_str(text).map_err(|e| bad(format!("not valid YAML: {e}")))?
        };
        let Value::Object(overrides) = value else {
            return Err(bad("expected a mapping of ProxyConfig fields".into()));
        };
        merge(&mut default_config, overrides);
        let applied = string_map(default_config.get("proxyMetadata"), "proxyMetadata")
            .map_err(|e| bad(e.to_string()))?;
        metadata.extend(applied);
    }

    let template = group.spec.template.clone().unwrap_or_default();
    let mut labels = spec_meta.labels.clone();
    if !template.labels.is_empty() {
        notes.push(format!(
            "Labels should be set in the metadata. The following WorkloadEntry labels will override metadata labels: {}",
            go_map(&template.labels)
        ));
        labels.extend(template.labels.clone());
    }
    match &group.spec.probe {
        Some(probe) => {
            let value = serde_json::to_value(probe).unwrap_or(Value::Null);
            default_config.insert("readinessProbe".into(), value);
        }
        None => {
            default_config.remove("readinessProbe");
        }
    }

    let (service, revision) = canonical_service(&labels, &group.name);
    let md = &mut metadata;
    md.insert("CANONICAL_SERVICE".into(), service.clone());
    md.insert("CANONICAL_REVISION".into(), revision.clone());
    md.insert("POD_NAMESPACE".into(), group.namespace.clone());
    md.insert("SERVICE_ACCOUNT".into(), template.service_account.clone());
    md.insert(
        "TRUST_DOMAIN".into(),
        settings
            .mesh
            .get("trustDomain")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    );
    md.insert("ISTIO_META_CLUSTER_ID".into(), settings.cluster_id.clone());
    md.insert(
        "ISTIO_META_MESH_ID".into(),
        default_config
            .get("meshId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    );
    md.insert("ISTIO_META_NETWORK".into(), template.network.clone());
    if !template.ports.is_empty() {
        md.insert("ISTIO_META_POD_PORTS".into(), pod_ports(&template.ports));
    }
    md.insert("ISTIO_META_WORKLOAD_NAME".into(), group.name.clone());
    labels.insert("service.istio.io/canonical-name".into(), service);
    labels.insert("service.istio.io/canonical-revision".into(), revision);
    md.insert("ISTIO_METAJSON_LABELS".into(), go_json_object(&labels));
    if settings.capture_dns {
        md.insert("ISTIO_META_DNS_CAPTURE".into(), "true".into());
    }
    if settings.autoregister {
        md.insert("ISTIO_META_AUTO_REGISTER_GROUP".into(), group.name.clone());
    }
    default_config.insert("proxyMetadata".into(), json!(metadata));
    let mesh_yaml = meshfed_kube::go_yaml::to_string(&json!({ "defaultConfig": default_config }));

    // cluster.env: the proxy metadata, then what the VM's capture needs.
    let inbound = if template.ports.is_empty() {
        "*".to_string()
    } else {
        let ports: Vec<String> = template.ports.values().map(u32::to_string).collect();
        ports.join(",")
    };
    // 22 (ssh, so a broken capture does not lock the VM out), 15090 (Prometheus),
    // 15021 (health), and the agent's status port.
    let mut exclude = "22,15090,15021".to_string();
    let status_port = default_config
        .get("statusPort")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if status_port != 15090 && status_port != 15021 {
        if status_port != 0 {
            exclude.push_str(&format!(",{status_port}"));
        } else {
            exclude.push_str(",15020");
        }
    }
    let mut env = metadata;
    env.insert("ISTIO_INBOUND_PORTS".into(), inbound);
    env.insert("ISTIO_NAMESPACE".into(), group.namespace.clone());
    env.insert(
        "ISTIO_SERVICE".into(),
        format!("{}.{}", group.name, group.namespace),
    );
    env.insert("ISTIO_SERVICE_CIDR".into(), "*".into());
    env.insert("ISTIO_LOCAL_EXCLUDE_PORTS".into(), exclude);
    env.insert("SERVICE_ACCOUNT".into(), template.service_account.clone());
    if is_revisioned(&settings.revision) {
        env.insert(
            "CA_ADDR".into(),
            istiod_addr(&settings.istio_namespace, &settings.revision),
        );
    }
    if let Some(ip) = settings.internal_ip.as_ref().filter(|ip| !ip.is_empty()) {
        env.insert("ISTIO_SVC_IP".into(), ip.clone());
    } else if let Some(ip) = settings.external_ip.as_ref().filter(|ip| !ip.is_empty()) {
        env.insert("ISTIO_SVC_IP".into(), ip.clone());
        env.insert(
            "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION".into(),
            "true".into(),
        );
    }
    let mut lines: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", shell_quote(v)))
        .collect();
    lines.sort();
    let cluster_env = lines.join("\n") + "\n";
    Ok(Files {
        mesh_yaml,
        cluster_env,
        notes,
    })
}

/// A map of strings at `field` (absent: empty).
fn string_map(value: Option<&Value>, field: &str) -> Result<BTreeMap<String, String>, FilesError> {
    let bad = |reason: String| FilesError::Mesh {
        field: field.to_string(),
        reason,
    };
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(bad(format!("{k}: expected a string, found {other}"))),
            })
            .collect(),
        Some(other) => Err(bad(format!("expected a mapping, found {other}"))),
    }
}

/// `overrides` applied onto `base` as Istio applies ProxyConfig YAML onto a message:
/// mappings merge key by key, anything else is replaced.
fn merge(base: &mut Map<String, Value>, overrides: Map<String, Value>) {
    for (key, value) in overrides {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(inner)), Value::Object(more)) => merge(inner, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// `ISTIO_META_POD_PORTS`: the template's ports as container ports, by name (Istio's
/// `model.PodPort` JSON).
fn pod_ports(ports: &BTreeMap<String, u32>) -> String {
    let items: Vec<String> = ports
        .iter()
        .map(|(name, port)| {
            format!(
                "{{\"name\":{},\"containerPort\":{port},\"protocol\":\"\"}}",
                go_json_string(name)
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// A string map as Go's `encoding/json` writes it (keys sorted, HTML characters
/// escaped).
pub fn go_json_object(map: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{}:{}", go_json_string(k), go_json_string(v)))
        .collect();
    format!("{{{}}}", items.join(","))
}

/// A JSON string as Go's `encoding/json` writes it.
pub fn go_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A map as Go's `%s` prints it (`map[a:b c:d]`).
fn go_map(map: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", items.join(" "))
}

/// A value as istioctl quotes it in `cluster.env` (its `shellescape.Quote`): `''`
/// when empty, else in single quotes (an inner `'` as `'"'"'`) unless every
/// character is one of `\ w @ % + = : , . / -`, which its pattern lets through
/// unquoted.
pub fn shell_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    if s.chars().all(|c| "\\w@%+=:,./-".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\"'\"'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(yaml: &str) -> Group {
        let value: Value = serde_norway::from_str(yaml).unwrap();
        let spec: net::WorkloadGroup = serde_json::from_value(value["spec"].clone()).unwrap();
        Group {
            name: value["metadata"]["name"].as_str().unwrap().into(),
            namespace: value["metadata"]["namespace"].as_str().unwrap().into(),
            annotations: BTreeMap::new(),
            spec,
        }
    }

    fn settings(mesh: &str, revision: &str) -> Settings {
        Settings {
            mesh: serde_norway::from_str(mesh).unwrap(),
            cluster_id: "Kubernetes".into(),
            revision: revision.into(),
            istio_namespace: "istio-system".into(),
            internal_ip: Some("10.10.10.10".into()),
            external_ip: None,
            autoregister: false,
            capture_dns: true,
        }
    }

    /// istioctl's testdata/vmconfig/ipv4 (revision rev-1, a mesh config with
    /// proxyMetadata, a proxy.istio.io/config annotation in spec.metadata, a probe).
    /// Istio's golden cluster.env also has `IDENTITY_PATH_PREFIX=''`, which no stored
    /// version of workload.go writes; the line is left out here.
    #[test]
    fn istioctl_vmconfig_ipv4() {
        let g = group(
            "kind: WorkloadGroup\nmetadata:\n  name: foo\n  namespace: bar\nspec:\n  metadata:\n    annotations:\n      \
             proxy.istio.io/config: |-\n        proxyMetadata:\n          PROXY_CONFIG_ANNOT_VALUE: bar\n    labels: {}\n  \
             template:\n    ports: {}\n    serviceAccount: vm-serviceaccount\n  probe:\n    httpGet:\n      port: 8080\n",
        );
        let mesh = "defaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"false\"\n    \
                    PROXY_CONFIG_ANNOT_VALUE: \"foo\"\n    CLUSTER_MESH_CONFIG_VALUE: \"foo\"\n";
        let files = generate(&g, &settings(mesh, "rev-1")).unwrap();
        assert_eq!(
            files.cluster_env,
            "CANONICAL_REVISION='latest'\n\
             CANONICAL_SERVICE='foo'\n\
             CA_ADDR='istiod-rev-1.istio-system.svc:15012'\n\
             CLUSTER_MESH_CONFIG_VALUE='foo'\n\
             ISTIO_INBOUND_PORTS='*'\n\
             ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'\n\
             ISTIO_METAJSON_LABELS='{\"service.istio.io/canonical-name\":\"foo\",\"service.istio.io/canonical-revision\":\"latest\"}'\n\
             ISTIO_META_CLUSTER_ID='Kubernetes'\n\
             ISTIO_META_DNS_CAPTURE='true'\n\
             ISTIO_META_MESH_ID=''\n\
             ISTIO_META_NETWORK=''\n\
             ISTIO_META_WORKLOAD_NAME='foo'\n\
             ISTIO_NAMESPACE='bar'\n\
             ISTIO_SERVICE='foo.bar'\n\
             ISTIO_SERVICE_CIDR='*'\n\
             ISTIO_SVC_IP='10.10.10.10'\n\
             POD_NAMESPACE='bar'\n\
             PROXY_CONFIG_ANNOT_VALUE='bar'\n\
             SERVICE_ACCOUNT='vm-serviceaccount'\n\
             TRUST_DOMAIN=''\n"
        );
        assert_eq!(
            files.mesh_yaml,
            "defaultConfig:\n  \
               discoveryAddress: istiod-rev-1.istio-system.svc:15012\n  \
               proxyMetadata:\n    \
                 CANONICAL_REVISION: latest\n    \
                 CANONICAL_SERVICE: foo\n    \
                 CLUSTER_MESH_CONFIG_VALUE: foo\n    \
                 ISTIO_META_CLUSTER_ID: Kubernetes\n    \
                 ISTIO_META_DNS_CAPTURE: \"true\"\n    \
                 ISTIO_META_MESH_ID: \"\"\n    \
                 ISTIO_META_NETWORK: \"\"\n    \
                 ISTIO_META_WORKLOAD_NAME: foo\n    \
                 ISTIO_METAJSON_LABELS: '{\"service.istio.io/canonical-name\":\"foo\",\"service.istio.io/canonical-revision\":\"latest\"}'\n    \
                 POD_NAMESPACE: bar\n    \
                 PROXY_CONFIG_ANNOT_VALUE: bar\n    \
                 SERVICE_ACCOUNT: vm-serviceaccount\n    \
                 TRUST_DOMAIN: \"\"\n  \
               readinessProbe:\n    \
                 httpGet:\n      \
                   port: 8080\n"
        );
        assert_eq!(
            hosts(Some("10.10.10.11"), "istio-system", "rev-1"),
            "10.10.10.11 istiod-rev-1.istio-system.svc\n"
        );
        // ipv6: the same files but the addresses.
        let mut v6 = settings(mesh, "rev-1");
        v6.internal_ip = Some("fd00:10:96::1".into());
        let files = generate(&g, &v6).unwrap();
        assert!(files.cluster_env.contains("ISTIO_SVC_IP='fd00:10:96::1'\n"));
        assert_eq!(
            hosts(Some("fd00:10:96::2"), "istio-system", "rev-1"),
            "fd00:10:96::2 istiod-rev-1.istio-system.svc\n"
        );
    }

    /// istioctl's testdata/vmconfig-nil-proxy-metadata: `defaultConfig: {}`, no
    /// revision.
    #[test]
    fn istioctl_vmconfig_nil_proxy_metadata() {
        let g = group(
            "kind: WorkloadGroup\nmetadata:\n  name: foo\n  namespace: bar\nspec:\n  metadata:\n    annotations: {}\n    \
             labels: {}\n  template:\n    ports: {}\n    serviceAccount: vm-serviceaccount\n  probe:\n    httpGet:\n      port: 8080\n",
        );
        let files = generate(&g, &settings("defaultConfig: {}", "")).unwrap();
        assert_eq!(
            files.cluster_env,
            "CANONICAL_REVISION='latest'\n\
             CANONICAL_SERVICE='foo'\n\
             ISTIO_INBOUND_PORTS='*'\n\
             ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'\n\
             ISTIO_METAJSON_LABELS='{\"service.istio.io/canonical-name\":\"foo\",\"service.istio.io/canonical-revision\":\"latest\"}'\n\
             ISTIO_META_CLUSTER_ID='Kubernetes'\n\
             ISTIO_META_DNS_CAPTURE='true'\n\
             ISTIO_META_MESH_ID=''\n\
             ISTIO_META_NETWORK=''\n\
             ISTIO_META_WORKLOAD_NAME='foo'\n\
             ISTIO_NAMESPACE='bar'\n\
             ISTIO_SERVICE='foo.bar'\n\
             ISTIO_SERVICE_CIDR='*'\n\
             ISTIO_SVC_IP='10.10.10.10'\n\
             POD_NAMESPACE='bar'\n\
             SERVICE_ACCOUNT='vm-serviceaccount'\n\
             TRUST_DOMAIN=''\n"
        );
        assert_eq!(
            files.mesh_yaml,
            "defaultConfig:\n  \
               proxyMetadata:\n    \
                 CANONICAL_REVISION: latest\n    \
                 CANONICAL_SERVICE: foo\n    \
                 ISTIO_META_CLUSTER_ID: Kubernetes\n    \
                 ISTIO_META_DNS_CAPTURE: \"true\"\n    \
                 ISTIO_META_MESH_ID: \"\"\n    \
                 ISTIO_META_NETWORK: \"\"\n    \
                 ISTIO_META_WORKLOAD_NAME: foo\n    \
                 ISTIO_METAJSON_LABELS: '{\"service.istio.io/canonical-name\":\"foo\",\"service.istio.io/canonical-revision\":\"latest\"}'\n    \
                 POD_NAMESPACE: bar\n    \
                 SERVICE_ACCOUNT: vm-serviceaccount\n    \
                 TRUST_DOMAIN: \"\"\n  \
               readinessProbe:\n    \
                 httpGet:\n      \
                   port: 8080\n"
        );
        assert_eq!(hosts(None, "istio-system", ""), "");
        assert_eq!(hosts(Some("not-an-ip"), "istio-system", ""), "");
    }

    #[test]
    fn ports_labels_network_autoregistration_and_external_ip() {
        let g = group(
            "metadata:\n  name: ratings-vm\n  namespace: bookinfo\nspec:\n  metadata:\n    labels:\n      app: ratings\n      \
             version: v3\n  template:\n    serviceAccount: ratings\n    network: vm-net\n    ports:\n      http: 9080\n      \
             grpc: 3550\n    labels:\n      version: v4\n",
        );
        let mut s = settings(
            "trustDomain: example.org\ndefaultConfig:\n  meshId: m1\n  statusPort: 15030\n",
            "",
        );
        s.internal_ip = None;
        s.external_ip = Some("203.0.113.9".into());
        s.autoregister = true;
        s.capture_dns = false;
        let files = generate(&g, &s).unwrap();
        let env = &files.cluster_env;
        for line in [
            "CANONICAL_SERVICE='ratings'\n",
            "CANONICAL_REVISION='v4'\n",
            "ISTIO_INBOUND_PORTS='3550,9080'\n",
            "ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15030'\n",
            "ISTIO_META_AUTO_REGISTER_GROUP='ratings-vm'\n",
            "ISTIO_META_NETWORK='vm-net'\n",
            "ISTIO_META_MESH_ID='m1'\n",
            "ISTIO_META_POD_PORTS='[{\"name\":\"grpc\",\"containerPort\":3550,\"protocol\":\"\"},{\"name\":\"http\",\"containerPort\":9080,\"protocol\":\"\"}]'\n",
            "ISTIO_METAJSON_LABELS='{\"app\":\"ratings\",\"service.istio.io/canonical-name\":\"ratings\",\"service.istio.io/canonical-revision\":\"v4\",\"version\":\"v4\"}'\n",
            "ISTIO_SVC_IP='203.0.113.9'\n",
            "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION='true'\n",
            "TRUST_DOMAIN='example.org'\n",
        ] {
            assert!(env.contains(line), "{line} in\n{env}");
        }
        assert!(!env.contains("DNS_CAPTURE"), "{env}");
        assert!(
            !files.mesh_yaml.contains("readinessProbe"),
            "{}",
            files.mesh_yaml
        );
        assert_eq!(files.notes.len(), 1, "template labels are noted");
    }

    /// istioctl's TestWorkloadEntryToPodPortsMeta.
    #[test]
    fn pod_ports_metadata() {
        let ports = [("HTTP".to_string(), 80), ("HTTPS".to_string(), 443)].into();
        assert_eq!(
            pod_ports(&ports),
            r#"[{"name":"HTTP","containerPort":80,"protocol":""},{"name":"HTTPS","containerPort":443,"protocol":""}]"#
        );
    }

    #[test]
    fn quoting_and_bad_annotations() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("w@%+=:,./-"), "w@%+=:,./-");
        assert_eq!(shell_quote("it's"), "'it'\"'\"'s'");
        assert_eq!(
            go_json_string("a<b>&\"c\""),
            "\"a\\u003cb\\u003e\\u0026\\\"c\\\"\""
        );
        let mut g = group("metadata:\n  name: g\n  namespace: ns\nspec:\n  template: {}\n");
        g.annotations
            .insert(PROXY_CONFIG_ANNOTATION.into(), "- not a mapping".into());
        let err = generate(&g, &settings("{}", "")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "WorkloadGroup ns/g: annotation proxy.istio.io/config (metadata.annotations): expected a mapping of ProxyConfig fields"
        );
        let err = generate(
            &g,
            &settings("defaultConfig:\n  proxyMetadata:\n    A: 1\n", ""),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("defaultConfig.proxyMetadata: A: expected a string"),
            "{err}"
        );
    }
}
