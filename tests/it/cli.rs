//! The `meshfed` binary itself: `discovery --readyFile` and `load` running the separate
//! `meshfed-load` binary.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::support::{discovery_args, eventually, http_get, wait_for_ready_file};

/// Kills the child when the test ends, passed or not.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn ready_file_names_the_bound_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    std::fs::write(&ready, "left by an earlier run").unwrap();
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(discovery_args(&ready, &[]))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The server removes a stale file at start and writes its own, whole, once it
    // listens.
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    let fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        [
            "grpcAddr",
            "httpAddr",
            "monitoringAddr",
            "pid",
            "secureGrpcAddr"
        ],
        "{json}"
    );
    assert!(
        json["secureGrpcAddr"].is_null(),
        "no CA, no secure port: {json}"
    );
    assert_eq!(json["pid"], child.0.id(), "{json}");
    let addr = |key: &str| -> SocketAddr {
        let a: SocketAddr = json[key].as_str().unwrap().parse().unwrap();
        assert!(a.ip().is_loopback() && a.port() != 0, "{key}: {a}");
        a
    };
    let (grpc, http, monitoring) = (addr("grpcAddr"), addr("httpAddr"), addr("monitoringAddr"));
    assert!(grpc != http && http != monitoring && grpc != monitoring);
    let no_temporary_left = std::fs::read_dir(dir.path()).unwrap().count() == 1;
    assert!(no_temporary_left, "only the ready file in its directory");

    eventually("/ready on httpAddr answers 200", || async {
        (http_get(http, "/ready").await.0 == 200).then_some(())
    })
    .await;
    let (status, metrics) = http_get(monitoring, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("pilot_xds"), "{metrics}");
    tokio::net::TcpStream::connect(grpc)
        .await
        .expect("the ADS port accepts connections");
}

#[tokio::test]
async fn the_secure_port_alone_with_the_ca_and_the_root_written_for_vms() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let ca_dir = dir.path().join("ca");
    let root = dir.path().join("root-cert.pem");
    let mut args = discovery_args(&ready, &[]);
    let grpc = args.iter().position(|a| a == "--grpcAddr").unwrap();
    args[grpc + 1] = "".into();
    let mut child = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
            .args(args)
            .arg("--caDir")
            .arg(&ca_dir)
            .arg("--rootCertFile")
            .arg(&root)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let json = wait_for_ready_file(&mut child.0, &ready).await;
    assert!(json["grpcAddr"].is_null(), "plaintext port off: {json}");
    let secure: SocketAddr = json["secureGrpcAddr"].as_str().unwrap().parse().unwrap();
    tokio::net::TcpStream::connect(secure)
        .await
        .expect("the secure port accepts connections");
    let written = std::fs::read_to_string(&root).unwrap();
    assert_eq!(
        written,
        std::fs::read_to_string(ca_dir.join("ca-cert.pem")).unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o644, "the root is public");
    assert_eq!(mode(&ca_dir.join("ca-key.pem")), 0o600, "the key is not");
}

#[test]
fn serving_files_go_together() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(discovery_args(&dir.path().join("ready.json"), &[]))
        .args(["--tlsCertFile", "/nonexistent/tls.crt"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tlsCertFile, --tlsKeyFile and --caCertFile go together"),
        "{stderr}"
    );
}

/// A directory holding (a hard link to, else a copy of) the `meshfed` binary, so the
/// test chooses what lies next to it.
fn meshfed_alone() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = dir.path().join("meshfed");
    let original = Path::new(env!("CARGO_BIN_EXE_meshfed"));
    if std::fs::hard_link(original, &exe).is_err() {
        std::fs::copy(original, &exe).unwrap();
    }
    (dir, exe)
}

#[test]
fn load_without_the_load_tool_says_how_to_build_it() {
    let (_dir, exe) = meshfed_alone();
    let out = std::process::Command::new(&exe)
        .args(["load", "--scenario", "s.yaml"])
        .env("PATH", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("meshfed-load") && stderr.contains("cargo build --release -p meshfed-load"),
        "{stderr}"
    );
}

#[cfg(unix)]
#[test]
fn load_runs_the_load_tool_with_every_argument_and_its_exit_status() {
    use std::os::unix::fs::PermissionsExt as _;
    let (dir, exe) = meshfed_alone();
    // A stand-in for meshfed-load: prints what it was given and fails with 3.
    let tool = dir.path().join("meshfed-load");
    std::fs::write(
        &tool,
        "#!/bin/sh\nprintf '%s\\n' \"$@\"\necho \"MESHFED_BINARY=$MESHFED_BINARY\"\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = || {
        std::process::Command::new(&exe)
            .args(["load", "--help", "--scenario", "a b.yaml", "-q"])
            .env("PATH", "")
            .output()
            .unwrap()
    };
    let mut out = run();
    // Another test's fork may still hold the script open for writing for an instant
    // (ETXTBSY); that is the test harness, not meshfed.
    for _ in 0..5 {
        if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            break;
        }
        out = run();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!(
            "--help\n--scenario\na b.yaml\n-q\nMESHFED_BINARY={}\n",
            exe.canonicalize().unwrap().display()
        )
    );
}

// ---------------------------------------------------------------------------
// `meshfed vm bootstrap` and `meshfed create-remote-secret`.

const WORKLOAD_GROUP: &str = "apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata:
  name: ratings-vm
  namespace: bookinfo
spec:
  metadata:
    labels:
      app: ratings
      version: v3
  template:
    serviceAccount: ratings
    network: vm-network
    ports:
      http: 9080
  probe:
    httpGet:
      port: 9080
      path: /health
";

/// Runs `meshfed ARGS...` to its end (without blocking the runtime the fake API
/// servers answer on): exit status, stdout, stderr.
async fn meshfed(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn vm_bootstrap_from_files_without_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("wg.yaml"), WORKLOAD_GROUP).unwrap();
    std::fs::write(path("root.pem"), "ROOT PEM\n").unwrap();
    std::fs::write(path("token"), "a.jwt.token").unwrap();
    std::fs::write(
        path("mesh.yaml"),
        "trustDomain: example.org\ndefaultConfig:\n  discoveryAddress: meshfed.example.org:15012\n  \
         proxyMetadata:\n    FROM_MESH: \"yes\"\n",
    )
    .unwrap();
    let out = path("out");
    let s = |p: &Path| p.display().to_string();
    let (ok, stdout, stderr) = meshfed(&[
        "vm",
        "bootstrap",
        "-f",
        &s(&path("wg.yaml")),
        "-o",
        &s(&out),
        "--offline",
        "--clusterID",
        "c1",
        "--meshConfig",
        &s(&path("mesh.yaml")),
        "--rootCert",
        &s(&path("root.pem")),
        "--token",
        &s(&path("token")),
        "--ingressIP",
        "192.0.2.30",
        "--autoregister",
    ])
    .await;
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "Configuration generation into directory {} was successful",
            out.display()
        )),
        "{stdout}"
    );
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let env = read("cluster.env");
    for line in [
        "CANONICAL_SERVICE='ratings'",
        "CANONICAL_REVISION='v3'",
        "FROM_MESH='yes'",
        "ISTIO_INBOUND_PORTS='9080'",
        "ISTIO_META_AUTO_REGISTER_GROUP='ratings-vm'",
        "ISTIO_META_CLUSTER_ID='c1'",
        "ISTIO_META_NETWORK='vm-network'",
        "ISTIO_NAMESPACE='bookinfo'",
        "SERVICE_ACCOUNT='ratings'",
        "TRUST_DOMAIN='example.org'",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} in\n{env}");
    }
    let mesh = read("mesh.yaml");
    assert!(
        mesh.starts_with("defaultConfig:\n  discoveryAddress: meshfed.example.org:15012\n"),
        "{mesh}"
    );
    assert!(
        mesh.contains("  readinessProbe:\n    httpGet:\n      path: /health\n      port: 9080\n"),
        "{mesh}"
    );
    assert_eq!(read("hosts"), "192.0.2.30 istiod.istio-system.svc\n");
    assert_eq!(read("root-cert.pem"), "ROOT PEM\n");
    assert_eq!(read("istio-token"), "a.jwt.token");
    assert_eq!(
        mode(&out.join("istio-token")),
        0o600,
        "the token is private"
    );
    assert_eq!(mode(&out.join("cluster.env")), 0o644);

    // Without --token (and no Kubernetes): every other file, and why there is no token.
    let out2 = path("out2");
    let (ok, _, stderr) = meshfed(&[
        "vm",
        "bootstrap",
        "-f",
        &s(&path("wg.yaml")),
        "-o",
        &s(&out2),
        "--clusterID",
        "c1",
        "--rootCert",
        &s(&path("root.pem")),
        "--capture-dns=false",
    ])
    .await;
    assert!(ok, "{stderr}");
    let env2 = std::fs::read_to_string(out2.join("cluster.env")).unwrap();
    assert!(!env2.contains("DNS_CAPTURE"), "--capture-dns=false: {env2}");
    assert!(
        env.contains("ISTIO_META_DNS_CAPTURE='true'\n"),
        "on by default: {env}"
    );
    assert!(stderr.contains("No Kubernetes API"), "{stderr}");
    assert!(stderr.contains("istio-token not written"), "{stderr}");
    assert!(stderr.contains("Use --ingressIP"), "{stderr}");
    assert!(!out2.join("istio-token").exists());
    assert_eq!(std::fs::read_to_string(out2.join("hosts")).unwrap(), "");
}

#[tokio::test]
async fn vm_bootstrap_refuses_bad_input_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let s = |p: &Path| p.display().to_string();
    std::fs::write(path("wg.yaml"), WORKLOAD_GROUP).unwrap();
    std::fs::write(path("root.pem"), "ROOT").unwrap();
    std::fs::write(
        path("no-template.yaml"),
        "kind: WorkloadGroup\nmetadata: {name: g, namespace: ns}\nspec: {}\n",
    )
    .unwrap();
    std::fs::write(
        path("bad-port.yaml"),
        "kind: WorkloadGroup\nmetadata: {name: g, namespace: ns}\nspec:\n  template: {}\n  probe:\n    httpGet: {port: 70000}\n",
    )
    .unwrap();
    std::fs::write(
        path("service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
    )
    .unwrap();
    std::fs::write(
        path("no-ns.yaml"),
        "kind: WorkloadGroup\nmetadata: {name: g}\nspec: {template: {}}\n",
    )
    .unwrap();
    let wg = s(&path("wg.yaml"));
    let root = s(&path("root.pem"));
    let out = s(&path("out"));
    let offline = |file: String| {
        vec![
            "vm".to_string(),
            "bootstrap".into(),
            "-f".into(),
            file,
            "-o".into(),
            out.clone(),
            "--offline".into(),
            "--clusterID".into(),
            "c1".into(),
            "--rootCert".into(),
            root.clone(),
        ]
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "vm".into(),
                "bootstrap".into(),
                "--name".into(),
                "g".into(),
                "-o".into(),
                out.clone(),
            ],
            "expecting a WorkloadGroup artifact file or the name and namespace of an existing WorkloadGroup",
        ),
        (
            vec!["vm".into(), "bootstrap".into(), "-f".into(), wg.clone()],
            "expecting an output directory",
        ),
        (
            [
                offline(wg.clone()),
                vec![
                    "--internalIP".into(),
                    "10.0.0.1".into(),
                    "--externalIP".into(),
                    "10.0.0.2".into(),
                ],
            ]
            .concat(),
            "the flags --internalIP and --externalIP are mutually exclusive",
        ),
        (
            vec![
                "vm".into(),
                "bootstrap".into(),
                "-f".into(),
                wg.clone(),
                "-o".into(),
                out.clone(),
                "--offline".into(),
                "--rootCert".into(),
                root.clone(),
            ],
            "--clusterID is required without a Kubernetes API",
        ),
        (
            vec![
                "vm".into(),
                "bootstrap".into(),
                "-f".into(),
                wg.clone(),
                "-o".into(),
                out.clone(),
                "--offline".into(),
                "--clusterID".into(),
                "c1".into(),
            ],
            "--rootCert is required without a Kubernetes API",
        ),
        (
            vec![
                "vm".into(),
                "bootstrap".into(),
                "--name".into(),
                "g".into(),
                "-n".into(),
                "ns".into(),
                "-o".into(),
                out.clone(),
                "--offline".into(),
            ],
            "--offline: the WorkloadGroup must come from a file",
        ),
        (
            offline(s(&path("no-template.yaml"))),
            "WorkloadGroup ns/g: spec.template: template is required",
        ),
        (
            offline(s(&path("bad-port.yaml"))),
            "WorkloadGroup ns/g: spec.probe.httpGet.port",
        ),
        (
            offline(s(&path("service.yaml"))),
            "kind \"Service\": expected a WorkloadGroup",
        ),
        (
            offline(s(&path("no-ns.yaml"))),
            "metadata.namespace is required (or give --namespace)",
        ),
        (offline(s(&path("missing.yaml"))), "missing.yaml"),
        (
            [
                offline(wg.clone()),
                vec!["--meshConfig".into(), s(&path("nope.yaml"))],
            ]
            .concat(),
            "--meshConfig",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = meshfed(&args).await;
        assert!(!ok, "{args:?} succeeded: {stdout}");
        assert!(
            stderr.contains(want),
            "{args:?}: want {want:?} in\n{stderr}"
        );
        assert!(!path("out").exists(), "{args:?} wrote files");
    }
    // A namespace from the flag completes a file that gives none.
    let mut args = offline(s(&path("no-ns.yaml")));
    args.extend(["-n".to_string(), "from-flag".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, stderr) = meshfed(&args).await;
    assert!(ok, "{stderr}");
    let env = std::fs::read_to_string(path("out").join("cluster.env")).unwrap();
    assert!(env.contains("ISTIO_NAMESPACE='from-flag'\n"), "{env}");
    assert!(
        env.contains("SERVICE_ACCOUNT='default'\n"),
        "the default account: {env}"
    );
}

mod with_kubernetes {
    use std::time::Duration;

    use meshfed::app::{KubeSettings, KubeSource, RemoteSecretSettings};
    use meshfed::testing::FakeServer;
    use meshfed_kube::fake_api::{CustomResource, FakeApiServer, RbacPolicy, objects};
    use serde::Deserialize;
    use serde_json::json;

    use super::meshfed;
    use crate::support::{describe, eventually, get_json};

    fn kubeconfig_file(api: &FakeApiServer, dir: &std::path::Path, name: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, api.kubeconfig()).unwrap();
        path.display().to_string()
    }

    /// istioctl's flow against a cluster: the group by name, the mesh config from the
    /// `istio` ConfigMap, the root from `istio-ca-root-cert`, a TokenRequest token for
    /// the group's account with audience istio-ca, the east-west gateway's IP.
    #[tokio::test]
    async fn vm_bootstrap_reads_the_cluster_as_istioctl_does() {
        let api = FakeApiServer::start().await.unwrap();
        api.install_crd(CustomResource::new(
            "networking.istio.io",
            "WorkloadGroup",
            "workloadgroups",
            &["v1"],
        ));
        let group: serde_json::Value = serde_norway::from_str(super::WORKLOAD_GROUP).unwrap();
        api.apply_custom(&group);
        api.apply(&objects::config_map(
            "istio-system",
            "istio",
            &[(
                "mesh",
                "trustDomain: cluster.local\ndefaultConfig:\n  proxyMetadata:\n    FROM_CM: x\n",
            )],
        ));
        api.apply(&objects::config_map(
            "bookinfo",
            "istio-ca-root-cert",
            &[("root-cert.pem", "PUBLISHED ROOT\n")],
        ));
        api.apply(&objects::service_account("bookinfo", "ratings"));
        api.apply(&objects::load_balancer(
            "istio-system",
            "istio-eastwestgateway",
            "10.96.0.99",
            &[("tls", 15443)],
            "192.0.2.44",
        ));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = kubeconfig_file(&api, dir.path(), "kubeconfig");
        let out = dir.path().join("out");
        let out_s = out.display().to_string();
        let base = [
            "vm",
            "bootstrap",
            "--name",
            "ratings-vm",
            "-n",
            "bookinfo",
            "-o",
            &out_s,
            "--kubeconfig",
            &kubeconfig,
            "--tokenDuration",
            "7200",
        ];

        // No injector ConfigMap (meshfed injects nothing): the cluster id must be given.
        let (ok, _, stderr) = meshfed(&base).await;
        assert!(!ok);
        assert!(
            stderr.contains("failed to automatically determine the --clusterID"),
            "{stderr}"
        );

        let (ok, stdout, stderr) = meshfed(&[&base[..], &["--clusterID", "c1"]].concat()).await;
        assert!(ok, "{stdout}{stderr}");
        assert!(
            stderr.contains(
                "a security token for namespace \"bookinfo\" and service account \"ratings\""
            ),
            "{stderr}"
        );
        let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
        assert_eq!(read("root-cert.pem"), "PUBLISHED ROOT\n");
        assert_eq!(read("hosts"), "192.0.2.44 istiod.istio-system.svc\n");
        assert!(read("cluster.env").contains("FROM_CM='x'\n"));
        assert!(read("cluster.env").contains("TRUST_DOMAIN='cluster.local'\n"));
        // The token is the API server's, for the group's account and audience istio-ca.
        let token = read("istio-token");
        let account = meshfed_kube::review_token(&api.client(), &token, &["istio-ca".to_string()])
            .await
            .expect("a token the API server reviews for istio-ca");
        assert_eq!(
            (account.namespace.as_str(), account.service_account.as_str()),
            ("bookinfo", "ratings")
        );
        let request = api
            .requests()
            .into_iter()
            .find(|r| r.method == "POST" && r.path.ends_with("/serviceaccounts/ratings/token"))
            .expect("a TokenRequest");
        assert_eq!(
            request.path,
            "/api/v1/namespaces/bookinfo/serviceaccounts/ratings/token"
        );

        // A group that does not exist, and one whose account does not.
        let missing = [
            "vm",
            "bootstrap",
            "--name",
            "nope",
            "-n",
            "bookinfo",
            "-o",
            &out_s,
            "--kubeconfig",
            &kubeconfig,
            "--clusterID",
            "c1",
        ];
        let (ok, _, stderr) = meshfed(&missing).await;
        assert!(!ok);
        assert!(
            stderr.contains("workloadgroup nope not found in namespace bookinfo"),
            "{stderr}"
        );
        let mut orphan = group.clone();
        orphan["metadata"]["name"] = json!("orphan");
        orphan["spec"]["template"]["serviceAccount"] = json!("ghost");
        api.apply_custom(&orphan);
        let (ok, _, stderr) = meshfed(&[
            "vm",
            "bootstrap",
            "--name",
            "orphan",
            "-n",
            "bookinfo",
            "-o",
            &out_s,
            "--kubeconfig",
            &kubeconfig,
            "--clusterID",
            "c1",
        ])
        .await;
        assert!(!ok);
        assert!(
            stderr.contains(
                "could not create a token under service account ghost in namespace bookinfo"
            ),
            "{stderr}"
        );
    }

    /// The reader role of deploy/remote, as the fake API server enforces it.
    fn reader_policy() -> RbacPolicy {
        let objects: Vec<serde_json::Value> =
            serde_norway::Deserializer::from_str(meshfed::cli::remote_secret::READER_MANIFEST)
                .map(|doc| serde_json::Value::deserialize(doc).unwrap())
                .collect();
        RbacPolicy::from_roles(&objects, "istio-system").expect("deploy/remote/reader.yaml")
    }

    /// The remote cluster `c2` gets no reader yet: the command creates the service
    /// account, its role and a token Secret; the Secret it prints, applied in `c1`,
    /// makes meshfed read `c2` as the reader, with the role of deploy/remote enforced
    /// (nothing refused, every grant used).
    #[tokio::test]
    async fn create_remote_secret_round_trips_through_the_secret_controller() {
        let c2 = FakeApiServer::start().await.unwrap();
        let mut kube_system = objects::namespace("kube-system", &[]);
        kube_system.metadata.uid = Some("54643f96-eca0-11e9-bb97-42010a80000a".into());
        c2.apply(&kube_system);
        c2.apply(&objects::node("node-1", "r1", "z1"));
        c2.apply(&objects::service(
            "default",
            "reviews",
            "10.97.0.7",
            &[("http", 80)],
        ));
        c2.apply(&objects::pod(
            "default",
            "reviews-1",
            "reviews",
            "10.2.0.1",
            "node-1",
        ));
        c2.apply(&objects::slice(
            "default",
            "reviews-abc",
            "reviews",
            &[("http", 9080)],
            &[("10.2.0.1", "reviews-1")],
        ));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = kubeconfig_file(&c2, dir.path(), "c2");

        let (ok, bad, stderr) = meshfed(&[
            "create-remote-secret",
            "--name",
            "C2",
            "--kubeconfig",
            &kubeconfig,
        ])
        .await;
        assert!(!ok, "{bad}");
        assert!(
            stderr.contains("C2 is not a valid DNS 1123 label"),
            "{stderr}"
        );
        let (ok, _, stderr) = meshfed(&[
            "create-remote-secret",
            "--kubeconfig",
            &kubeconfig,
            "--create-service-account=false",
        ])
        .await;
        assert!(!ok);
        assert!(
            stderr.contains("could not get access token to read resources from local kube-apiserver: failed retrieving service account istio-reader-service-account.istio-system"),
            "{stderr}"
        );

        // The name defaults to kube-system's UID.
        let (ok, yaml, stderr) =
            meshfed(&["create-remote-secret", "--kubeconfig", &kubeconfig]).await;
        assert!(ok, "{stderr}");
        assert!(
            stderr.contains("created ServiceAccount istio-reader-service-account"),
            "{stderr}"
        );
        assert!(
            stderr.contains(
                "created Secret istio-system/istio-reader-service-account-istio-remote-secret-token"
            ),
            "{stderr}"
        );
        assert!(
            stderr.contains("warn: server in Kubeconfig is http://127.0.0.1:"),
            "{stderr}"
        );
        assert!(
            yaml.starts_with(
                "# This file is autogenerated, do not edit.\napiVersion: v1\nkind: Secret\n"
            ),
            "{yaml}"
        );
        assert!(
            yaml.contains("  name: istio-remote-secret-54643f96-eca0-11e9-bb97-42010a80000a\n"),
            "{yaml}"
        );
        // The second run finds the token Secret the first created.
        let (ok, yaml, stderr) = meshfed(&[
            "create-remote-secret",
            "--name",
            "c2",
            "--kubeconfig",
            &kubeconfig,
        ])
        .await;
        assert!(ok, "{stderr}");
        assert!(!stderr.contains("created"), "{stderr}");
        let documents: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&yaml)
            .map(|d| serde_json::Value::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(documents.len(), 1, "{yaml}");
        let secret: objects::Secret = serde_json::from_value(documents[0].clone()).unwrap();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("istio-remote-secret-c2")
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("istio-system"));
        assert_eq!(
            secret.metadata.annotations.as_ref().unwrap()["networking.istio.io/cluster"],
            "c2"
        );
        let kubeconfig_text = &secret.string_data.as_ref().unwrap()["c2"];
        assert!(
            kubeconfig_text.contains(&format!("server: {}\n", c2.url())),
            "{kubeconfig_text}"
        );

        // From here on c2 answers the reader only what deploy/remote grants.
        let policy = reader_policy();
        c2.enforce(policy.clone());
        let c1 = FakeApiServer::start().await.unwrap();
        c1.apply(&objects::namespace("istio-system", &[]));
        c1.apply(&secret);
        let client = c1.client();
        let server = FakeServer::builder()
            .cluster_id("c1")
            .configure(move |c| {
                c.kubernetes = Some(KubeSettings {
                    source: KubeSource::Client(client),
                    namespaces: meshfed_kube::NamespaceFilter::All,
                    system_namespace: "istio-system".into(),
                    remote_secrets: RemoteSecretSettings::default(),
                });
            })
            .start()
            .await
            .unwrap();
        let http = server.bound().http;
        eventually("c2 read through the secret", || async move {
            let r = get_json(http, "/debug/registryz").await;
            r["registries"]
                .as_array()?
                .iter()
                .any(|r| r["registry"] == "Kubernetes/c2" && r["synced"] == true)
                .then_some(())
        })
        .await;
        let reader = "system:serviceaccount:istio-system:istio-reader-service-account";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let unused = loop {
            let unused = policy.unused_grants(&c2.requests_by(reader));
            if unused.is_empty() || tokio::time::Instant::now() >= deadline {
                break unused;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let denied = c2.denied_requests();
        assert!(
            denied.is_empty(),
            "c2 refused the reader:\n{}",
            describe(&denied)
        );
        assert!(
            unused.is_empty(),
            "deploy/remote/reader.yaml grants what meshfed never asked for: {unused:?}"
        );
        assert!(
            c2.requests_by(reader).len() >= 5,
            "meshfed read c2 as the reader: {}",
            describe(&c2.requests())
        );
        server.shutdown().await;
    }
}

/// A kubeconfig found by default (here one whose API server is not there) is used as
/// istioctl uses it; when asking it fails, the error says how to do without it.
#[tokio::test]
async fn vm_bootstrap_names_offline_when_the_default_cluster_fails() {
    let home = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    std::fs::create_dir(home.path().join(".kube")).unwrap();
    std::fs::write(
        home.path().join(".kube/config"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster: {{server: http://{closed}}}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: gone\n  context: {{cluster: gone, user: u}}\n\
             current-context: gone\n"
        ),
    )
    .unwrap();
    let wg = home.path().join("wg.yaml");
    std::fs::write(&wg, WORKLOAD_GROUP).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["vm", "bootstrap", "-f"])
        .arg(&wg)
        .arg("-o")
        .arg(home.path().join("out"))
        .args(["--clusterID", "c1"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--offline uses the files given only"),
        "{stderr}"
    );
    assert!(
        stderr.contains("reading ConfigMap istio-system/istio"),
        "{stderr}"
    );
    assert!(!home.path().join("out").exists());
}
