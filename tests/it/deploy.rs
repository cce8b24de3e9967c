//! The Kubernetes manifests under `deploy/` and the `Dockerfile`, checked without a
//! cluster or a container engine: the objects kustomize would apply, the ports and
//! probes the server answers on, a non-root read-only container, RBAC that grants only
//! what the code reads, flags the binary has, and a ConfigMap the server accepts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of `text` (empty documents skipped).
fn documents(path: &Path, text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn kustomization() -> Value {
    let path = root().join("deploy/kustomization.yaml");
    documents(&path, &read(&path)).remove(0)
}

/// Every object of the files kustomization.yaml lists, in order.
fn objects() -> Vec<Value> {
    let dir = root().join("deploy");
    let mut out = Vec::new();
    for file in strings(&kustomization()["resources"]) {
        let path = dir.join(&file);
        out.extend(documents(&path, &read(&path)));
    }
    out
}

/// The one object of `kind`.
fn one(objects: &[Value], kind: &str) -> Value {
    let mut found = objects.iter().filter(|o| o["kind"] == kind);
    let first = found
        .next()
        .unwrap_or_else(|| panic!("no {kind} in deploy/"));
    assert!(found.next().is_none(), "more than one {kind} in deploy/");
    first.clone()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected a list, got {value}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("expected a string, got {v}"))
                .to_string()
        })
        .collect()
}

fn container(deployment: &Value) -> Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container: meshfed");
    containers[0].clone()
}

/// `--flag=value` / `--flag value` arguments of the container, as (flag, value).
fn flags(container: &Value) -> Vec<(String, Option<String>)> {
    let args = strings(&container["args"]);
    assert_eq!(
        args.first().map(String::as_str),
        Some("discovery"),
        "the server is `meshfed discovery`"
    );
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for arg in &args[1..] {
        if let Some(flag) = arg.strip_prefix("--") {
            match flag.split_once('=') {
                Some((name, value)) => out.push((name.to_string(), Some(value.to_string()))),
                None => out.push((flag.to_string(), None)),
            }
        } else {
            let last = out.last_mut().expect("a value before any flag");
            assert!(last.1.is_none(), "{arg:?}: a second value for --{}", last.0);
            last.1 = Some(arg.clone());
        }
    }
    out
}

fn flag<'a>(flags: &'a [(String, Option<String>)], name: &str) -> &'a str {
    flags
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
        .unwrap_or_else(|| panic!("the Deployment does not pass --{name}"))
}

#[test]
fn kustomization_lists_every_manifest_and_the_namespace() {
    let k = kustomization();
    assert_eq!(k["kind"], "Kustomization");
    assert_eq!(k["namespace"], "istio-system");
    let listed: BTreeSet<String> = strings(&k["resources"]).into_iter().collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(root().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| (n.ends_with(".yaml") || n.ends_with(".yml")) && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk, "kustomization.yaml lists every manifest");
}

#[test]
fn the_objects_are_the_expected_kinds() {
    let kinds: BTreeSet<String> = objects()
        .iter()
        .map(|o| o["kind"].as_str().expect("kind").to_string())
        .collect();
    let expected: BTreeSet<String> = [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ValidatingWebhookConfiguration",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(kinds, expected);
    for object in objects() {
        let name = &object["metadata"]["name"];
        assert!(name.is_string(), "every object is named: {object}");
        assert!(
            object["metadata"]["namespace"].is_null(),
            "{name}: the namespace comes from kustomization.yaml"
        );
    }
}

#[test]
fn ports_probes_and_service_match_what_the_server_listens_on() {
    let objects = objects();
    let deployment = one(&objects, "Deployment");
    let container = container(&deployment);
    let flags = flags(&container);

    // Every interface, on Istio's ports.
    assert_eq!(flag(&flags, "grpcAddr"), ":15010");
    assert_eq!(flag(&flags, "secureGrpcAddr"), ":15012");
    assert_eq!(flag(&flags, "httpAddr"), ":8080");
    assert_eq!(flag(&flags, "monitoringAddr"), ":15014");

    let ports: BTreeMap<String, i64> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            let name = p["name"].as_str().expect("named port").to_string();
            assert!(
                name.len() <= 15,
                "{name}: port names are at most 15 characters"
            );
            (name, p["containerPort"].as_i64().expect("containerPort"))
        })
        .collect();
    let numbers: BTreeSet<i64> = ports.values().copied().collect();
    for port in [15010, 15012, 8080, 15014] {
        assert!(numbers.contains(&port), "container port {port}");
    }
    // A port by number or by name, as the container's port number.
    let resolve = |target: &Value| match target {
        Value::Number(n) => n.as_i64().filter(|n| numbers.contains(n)),
        Value::String(name) => ports.get(name).copied(),
        _ => None,
    };
    let is_container_port = |target: &Value| resolve(target).is_some();

    let service = one(&objects, "Service");
    assert_eq!(
        service["metadata"]["name"], "istiod",
        "where istiod's proxies look"
    );
    let mut service_ports = BTreeSet::new();
    for port in service["spec"]["ports"].as_array().expect("service ports") {
        let target = if port["targetPort"].is_null() {
            &port["port"]
        } else {
            &port["targetPort"]
        };
        assert!(
            is_container_port(target),
            "service port {port} targets the container"
        );
        service_ports.insert(port["port"].as_i64().unwrap());
    }
    assert!(service_ports.contains(&15010), "plaintext xDS");
    assert!(service_ports.contains(&15012), "xDS over TLS and the CA");
    let selector = service["spec"]["selector"].as_object().expect("selector");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in selector {
        assert_eq!(&labels[key], value, "the Service selects the pods by {key}");
    }
    assert_eq!(labels["app"], "meshfed");
    assert_eq!(labels["istio"], "pilot");

    let readiness = &container["readinessProbe"]["httpGet"];
    assert_eq!(readiness["path"], "/ready");
    assert_eq!(
        resolve(&readiness["port"]),
        Some(8080),
        "/ready is on --httpAddr"
    );
    // /ready is 503 while the registries sync: liveness must not use it.
    let liveness = &container["livenessProbe"];
    assert!(liveness.is_object(), "a liveness probe");
    assert_ne!(liveness["httpGet"]["path"], "/ready");
    if !liveness["httpGet"].is_null() {
        assert!(is_container_port(&liveness["httpGet"]["port"]));
    }
}

#[test]
fn the_pods_run_as_non_root_on_a_read_only_filesystem() {
    let objects = objects();
    let deployment = one(&objects, "Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "meshfed");
    assert!(
        !pod["affinity"]["podAntiAffinity"].is_null(),
        "replicas spread over nodes"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 1337);
    let container = container(&deployment);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    let requests = &container["resources"]["requests"];
    assert!(requests["cpu"].is_string() && requests["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());

    let pdb = one(&objects, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let hpa = one(&objects, "HorizontalPodAutoscaler");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    assert_eq!(hpa["spec"]["minReplicas"], spec["replicas"]);
}

/// The arguments name only flags `meshfed discovery` has (read from src/main.rs and
/// the registry crates' flags in their `source` modules).
#[test]
fn the_arguments_are_flags_the_binary_has() {
    let main = [
        "src/main.rs",
        "registries/kube/src/source.rs",
        "registries/consul/src/source.rs",
        "registries/core/src/source/mock.rs",
    ]
    .map(|file| read(&root().join(file)))
    .concat();
    let known: BTreeSet<&str> = main
        .split("long = \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert!(
        known.contains("grpcAddr"),
        "flags parsed from src/main.rs: {known:?}"
    );
    let deployment = one(&objects(), "Deployment");
    for (name, _) in flags(&container(&deployment)) {
        assert!(
            known.contains(name.as_str()),
            "--{name} is not a meshfed flag"
        );
    }
}

/// The `istio` ConfigMap is read through the API (`--meshConfigMap`, default `istio`,
/// not overridden by mesh files), and the server accepts both keys.
#[test]
fn the_istio_config_map_is_read_and_valid() {
    let objects = objects();
    let config_map = one(&objects, "ConfigMap");
    assert_eq!(config_map["metadata"]["name"], "istio");
    let deployment = one(&objects, "Deployment");
    let container = container(&deployment);
    let flags = flags(&container);
    for name in ["meshConfig", "networksConfig", "meshConfigMap"] {
        assert!(
            !flags.iter().any(|(f, _)| f == name),
            "--{name} would replace the ConfigMap"
        );
    }
    let data = &config_map["data"];
    let mesh = data["mesh"].as_str().expect("mesh");
    meshfed::mesh::parse_mesh_config(Path::new("mesh"), mesh).expect("mesh is a valid MeshConfig");
    let networks = data["meshNetworks"].as_str().expect("meshNetworks");
    meshfed::mesh::parse_mesh_networks(Path::new("meshNetworks"), networks)
        .expect("meshNetworks is valid");
}

/// What the RBAC rules may grant: (role kind, API group, resource, verbs) and the code
/// that needs it. A new watcher or write needs a line here and a rule in
/// deploy/rbac.yaml.
const GRANTS: &[(&str, &str, &str, &[&str])] = &[
    // src/autoregistration via registries/kube/src/workload_entry_writer.rs: the
    // WorkloadEntries of auto-registered VMs and their Healthy condition.
    (
        "ClusterRole",
        "networking.istio.io",
        "workloadentries",
        &["create", "update", "delete"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "workloadentries/status",
        &["get", "update"],
    ),
    // registries/kube/src/status (--enableStatus): each Istio kind's status
    // subresource, read and replaced by the leader.
    (
        "ClusterRole",
        "networking.istio.io",
        "virtualservices/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "destinationrules/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "gateways/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "serviceentries/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "sidecars/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "workloadgroups/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "peerauthentications/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "requestauthentications/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "authorizationpolicies/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "telemetry.istio.io",
        "telemetries/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "envoyfilters/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "extensions.istio.io",
        "wasmplugins/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "gateways/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "httproutes/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "grpcroutes/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "tcproutes/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "tlsroutes/status",
        &["get", "update"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "backendtlspolicies/status",
        &["get", "update"],
    ),
    // registries/kube/src/writer.rs `run`: the Kubernetes registry's five watchers
    // (and Namespaces for the config store's label selectors, crd/writer.rs, and for
    // root-cert distribution, root_cert.rs).
    ("ClusterRole", "", "services", &["list", "watch"]),
    ("ClusterRole", "", "pods", &["list", "watch"]),
    ("ClusterRole", "", "nodes", &["list", "watch"]),
    ("ClusterRole", "", "namespaces", &["list", "watch"]),
    (
        "ClusterRole",
        "discovery.k8s.io",
        "endpointslices",
        &["list", "watch"],
    ),
    // registries/kube/src/crd/writer.rs `watch_kind`: the Istio config store.
    (
        "ClusterRole",
        "networking.istio.io",
        "virtualservices",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "destinationrules",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "gateways",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "serviceentries",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "workloadentries",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "sidecars",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "workloadgroups",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "peerauthentications",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "requestauthentications",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "security.istio.io",
        "authorizationpolicies",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "telemetry.istio.io",
        "telemetries",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "networking.istio.io",
        "envoyfilters",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "extensions.istio.io",
        "wasmplugins",
        &["list", "watch"],
    ),
    // The Gateway API kinds, watched by the same store when their CRDs exist.
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "gatewayclasses",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "gateways",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "httproutes",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "grpcroutes",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "referencegrants",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "tcproutes",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "tlsroutes",
        &["list", "watch"],
    ),
    (
        "ClusterRole",
        "gateway.networking.k8s.io",
        "backendtlspolicies",
        &["list", "watch"],
    ),
    // registries/kube/src/token_review.rs: Kubernetes JWT authentication.
    (
        "ClusterRole",
        "authentication.k8s.io",
        "tokenreviews",
        &["create"],
    ),
    // registries/kube/src/secrets.rs: gateway credentials (SDS), each requested Secret
    // followed by name in the gateway's namespace, and the SubjectAccessReview that
    // authorizes the gateway.
    ("ClusterRole", "", "secrets", &["list", "watch"]),
    (
        "ClusterRole",
        "authorization.k8s.io",
        "subjectaccessreviews",
        &["create"],
    ),
    // registries/kube/src/root_cert.rs: istio-ca-root-cert in every namespace;
    // crd/writer.rs: the ConfigMaps Gateway API objects reference, and src/sds: the
    // `configmap://` CAs, each followed by name (list and watch).
    (
        "ClusterRole",
        "",
        "configmaps",
        &["create", "get", "list", "update", "watch"],
    ),
    // registries/kube/src/multicluster.rs: remote-cluster Secrets; ca_secret.rs: the
    // CA's Secrets (read by name, istio-ca-secret created once). System namespace only.
    ("Role", "", "secrets", &["create", "get", "list", "watch"]),
    // registries/kube/src/config_map.rs: the `istio` ConfigMap (mesh settings).
    ("Role", "", "configmaps", &["list", "watch"]),
    // registries/kube/src/webhook_config.rs: the validating webhook's configurations
    // (caBundle, failurePolicy) and the dry-run Gateway of its fail-close check.
    (
        "ClusterRole",
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        &["get", "list", "update", "watch"],
    ),
    ("Role", "networking.istio.io", "gateways", &["create"]),
    // registries/kube/src/lease.rs: the leader-election Leases.
    (
        "Role",
        "coordination.k8s.io",
        "leases",
        &["create", "get", "update"],
    ),
];

#[test]
fn rbac_grants_only_what_the_code_reads_and_writes() {
    let objects = objects();
    let mut granted: BTreeSet<(String, String, String, String)> = BTreeSet::new();
    for role in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        let kind = role["kind"].as_str().unwrap();
        for rule in role["rules"].as_array().expect("rules") {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                if !rule[field].is_null() {
                    for value in strings(&rule[field]) {
                        assert!(!value.contains('*'), "{kind} rule {rule}: no `*`");
                    }
                }
            }
            let verbs: BTreeSet<String> = strings(&rule["verbs"]).into_iter().collect();
            if !rule["nonResourceURLs"].is_null() {
                // crd.rs `discover`: GET of the group's discovery documents.
                assert_eq!(kind, "ClusterRole", "non-resource URLs need a ClusterRole");
                assert_eq!(verbs, BTreeSet::from(["get".to_string()]));
                use meshfed_registry::config::model as m;
                let mut expected = Vec::new();
                for (group, versions) in [
                    (m::GROUP, &m::VERSIONS[..]),
                    (m::SECURITY_GROUP, &m::SECURITY_VERSIONS[..]),
                    (
                        meshfed_registry::config::kinds::TELEMETRY.name,
                        meshfed_registry::config::kinds::TELEMETRY.versions,
                    ),
                    (
                        meshfed_registry::config::kinds::EXTENSIONS.name,
                        meshfed_registry::config::kinds::EXTENSIONS.versions,
                    ),
                    (
                        meshfed_registry::config::kinds::GATEWAY_API.name,
                        meshfed_registry::config::kinds::GATEWAY_API.versions,
                    ),
                    (
                        meshfed_registry::config::kinds::GATEWAY_API_ALPHA.name,
                        meshfed_registry::config::kinds::GATEWAY_API_ALPHA.versions,
                    ),
                ] {
                    expected.push(format!("/apis/{group}"));
                    expected.extend(versions.iter().map(|v| format!("/apis/{group}/{v}")));
                }
                let urls: BTreeSet<String> =
                    strings(&rule["nonResourceURLs"]).into_iter().collect();
                assert_eq!(urls, expected.into_iter().collect::<BTreeSet<_>>());
                continue;
            }
            if !rule["resourceNames"].is_null() {
                // ca_secret.rs: the two CA Secrets, read by name.
                assert_eq!(kind, "Role", "{rule}");
                assert_eq!(strings(&rule["resources"]), ["secrets"], "{rule}");
                assert_eq!(verbs, BTreeSet::from(["get".to_string()]), "{rule}");
                assert_eq!(
                    strings(&rule["resourceNames"]),
                    ["cacerts", "istio-ca-secret"],
                    "{rule}"
                );
            }
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in &verbs {
                        granted.insert((
                            kind.to_string(),
                            group.clone(),
                            resource.clone(),
                            verb.clone(),
                        ));
                    }
                }
            }
        }
    }
    let expected: BTreeSet<(String, String, String, String)> = GRANTS
        .iter()
        .flat_map(|(kind, group, resource, verbs)| {
            verbs.iter().map(move |verb| {
                (
                    kind.to_string(),
                    group.to_string(),
                    resource.to_string(),
                    verb.to_string(),
                )
            })
        })
        .collect();
    let extra: Vec<_> = granted.difference(&expected).collect();
    assert!(extra.is_empty(), "granted, but no code needs it: {extra:?}");
    let missing: Vec<_> = expected.difference(&granted).collect();
    assert!(missing.is_empty(), "not granted: {missing:?}");

    // Both roles are bound to the Deployment's ServiceAccount.
    let account = one(&objects, "ServiceAccount");
    let account = account["metadata"]["name"].as_str().unwrap();
    for (binding, role) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let binding = one(&objects, binding);
        assert_eq!(binding["roleRef"]["kind"], role);
        assert_eq!(
            binding["roleRef"]["name"],
            one(&objects, role)["metadata"]["name"]
        );
        let subjects = binding["subjects"].as_array().expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0]["kind"], "ServiceAccount");
        assert_eq!(subjects[0]["name"], account);
        assert_eq!(subjects[0]["namespace"], "istio-system");
    }
}

#[test]
fn the_dockerfile_builds_in_one_stage_and_runs_as_non_root_in_another() {
    let text = read(&root().join("Dockerfile"));
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let stages = lines.iter().filter(|l| l.starts_with("FROM ")).count();
    assert!(stages >= 2, "multi-stage");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cargo build --release --locked")),
        "a locked release build"
    );
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the runtime stage");
    let uid = user.trim().split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "USER {user}: not root");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ENTRYPOINT") && l.contains("meshfed")),
        "the entrypoint is meshfed"
    );
}

/// What `kubectl kustomize deploy/` renders is what the other tests read, with the
/// kustomization's namespace set on every namespaced object and the image pinned.
/// Skipped (with a line saying so) where kubectl is not installed.
#[test]
fn kubectl_kustomize_renders_the_same_objects_in_the_namespace() {
    let rendered = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("deploy"))
        .output()
    {
        Ok(output) if output.status.success() => String::from_utf8(output.stdout).unwrap(),
        Ok(output) => panic!(
            "kubectl kustomize deploy/ failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(err) => {
            eprintln!("kubectl not found ({err}): rendering not checked");
            return;
        }
    };
    let rendered = documents(Path::new("kubectl kustomize deploy/"), &rendered);
    let key = |o: &Value| {
        (
            o["kind"].as_str().unwrap_or_default().to_string(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    let mut ours: Vec<_> = objects().iter().map(key).collect();
    let mut theirs: Vec<_> = rendered.iter().map(key).collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    let namespace = kustomization()["namespace"].as_str().unwrap().to_string();
    for object in &rendered {
        let kind = object["kind"].as_str().unwrap();
        if matches!(
            kind,
            "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "ValidatingWebhookConfiguration"
        ) {
            continue;
        }
        assert_eq!(
            object["metadata"]["namespace"].as_str(),
            Some(namespace.as_str()),
            "{kind} {}",
            object["metadata"]["name"]
        );
    }
    let deployment = one(&rendered, "Deployment");
    let image = container(&deployment)["image"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(image.starts_with("meshfed:"), "{image}");
}

/// deploy/webhook.yaml as Istio's charts write the validator: every CREATE and UPDATE
/// of the Istio groups to the `istiod` Service's /validate, fail-open until meshfed
/// switches it, no side effects, AdmissionReview v1, labelled for the revision meshfed
/// patches; and the Service's 443 reaches --httpsAddr.
#[test]
fn the_validating_webhook_reaches_https_addr_as_istio_configures_it() {
    let objects = objects();
    let configs: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .collect();
    let names: BTreeSet<&str> = configs
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["istio-validator-istio-system", "istiod-default-validator"])
    );
    let mut selectors = BTreeSet::new();
    for config in &configs {
        assert_eq!(config["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(
            config["metadata"]["labels"]["istio.io/rev"], "default",
            "selected by meshfed's patcher (istio.io/rev=<revision>)"
        );
        for hook in config["webhooks"].as_array().expect("webhooks") {
            let service = &hook["clientConfig"]["service"];
            assert_eq!(service["name"], "istiod", "{hook}");
            assert_eq!(service["namespace"], kustomization()["namespace"], "{hook}");
            assert_eq!(service["path"], "/validate", "{hook}");
            assert!(
                service["port"].is_null() || service["port"] == 443,
                "{hook}"
            );
            assert!(
                hook["clientConfig"]["caBundle"].is_null(),
                "meshfed fills caBundle"
            );
            assert_eq!(hook["failurePolicy"], "Ignore", "fail-open until ready");
            assert_eq!(hook["sideEffects"], "None", "dry runs are allowed");
            assert_eq!(strings(&hook["admissionReviewVersions"]), ["v1"]);
            let rules = hook["rules"].as_array().expect("rules");
            assert_eq!(rules.len(), 1);
            assert_eq!(strings(&rules[0]["operations"]), ["CREATE", "UPDATE"]);
            let groups: BTreeSet<String> = strings(&rules[0]["apiGroups"]).into_iter().collect();
            // The Gateway API kinds are validated by their CRDs' own rules in the
            // API server, as with istiod.
            for kind in meshfed_registry::config::Kind::ALL
                .into_iter()
                .filter(|k| !k.is_gateway_api())
            {
                assert!(groups.contains(kind.group()), "{kind:?} is validated");
            }
            assert!(groups.contains("extensions.istio.io"));
            assert_eq!(strings(&rules[0]["resources"]), ["*"]);
            let expression = &hook["objectSelector"]["matchExpressions"][0];
            assert_eq!(expression["key"], "istio.io/rev");
            selectors.insert(expression["operator"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(
        selectors,
        BTreeSet::from(["DoesNotExist".to_string(), "In".to_string()]),
        "unlabelled objects and this revision's are both validated"
    );
    let deployment = one(&objects, "Deployment");
    let container = container(&deployment);
    assert_eq!(flag(&flags(&container), "httpsAddr"), ":15017");
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["containerPort"] == 15017)
        .expect("container port 15017");
    let service = one(&objects, "Service");
    let https = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == 443)
        .expect("Service port 443 (the webhook's default)");
    assert!(
        https["targetPort"] == 15017 || https["targetPort"] == port["name"],
        "{https}"
    );
}
