//! `meshfed vm bootstrap`: the files a VM's istio-agent needs to join the mesh as a
//! member of a WorkloadGroup, as `istioctl x workload entry configure` writes them:
//! `cluster.env`, `mesh.yaml`, `root-cert.pem`, `istio-token` and `hosts`.
//!
//! Inputs come from the Kubernetes API as istioctl reads them (the WorkloadGroup by
//! `--name`/`--namespace`, the `istio[-<rev>]` ConfigMap's mesh config, the cluster id
//! from the injector's values, `istio-ca-root-cert`, a TokenRequest token, the
//! east-west gateway's address), or from files, so that it also works where meshfed
//! runs without Kubernetes: `-f` for the group, `--meshConfig`, `--rootCert`,
//! `--token`, `--clusterID`, `--ingressIP`, and `--offline` to not look for a cluster
//! at all. Everything is read and computed first; the directory is written only when
//! all of it succeeded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use meshfed_api::networking::v1alpha3 as net;
use meshfed_registry::config::{Decoded, decode, validate};
use serde_json::Value;

use super::vm_files::{self, Group, Settings, is_revisioned};

/// The audience of the token a VM presents to the control plane.
pub const TOKEN_AUDIENCE: &str = "istio-ca";

/// `meshfed vm bootstrap` (istioctl's `x workload entry configure` flags).
#[derive(Args, Debug, Clone)]
pub struct BootstrapArgs {
    /// The WorkloadGroup file (YAML); without it the group is read from Kubernetes
    /// by --name and --namespace.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The WorkloadGroup's name (read from Kubernetes).
    #[arg(long = "name")]
    pub name: Option<String>,
    /// The WorkloadGroup's namespace (with --name; with -f, the namespace of a file
    /// that gives none).
    #[arg(short = 'n', long = "namespace")]
    pub namespace: Option<String>,
    /// The directory to write the files into (created if missing).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// The cluster id the VM's proxy reports (ISTIO_META_CLUSTER_ID): the one meshfed
    /// discovery runs with (its --clusterID). Default: the injector's
    /// global.multiCluster.clusterName, which needs Istio's sidecar injector.
    #[arg(long = "clusterID")]
    pub cluster_id: Option<String>,
    /// Lifetime of the requested token, in seconds.
    #[arg(long = "tokenDuration", default_value_t = 3600)]
    pub token_duration: i64,
    /// The Service (`<name>` or `<name>.<namespace>`, default namespace
    /// --istioNamespace) whose LoadBalancer IP the VM reaches the control plane
    /// through, when --ingressIP is not a valid IP.
    #[arg(long = "ingressService", default_value = "istio-eastwestgateway")]
    pub ingress_service: String,
    /// The IP the VM reaches the control plane through (the `hosts` line for
    /// istiod.<ns>.svc).
    #[arg(long = "ingressIP")]
    pub ingress_ip: Option<String>,
    /// Let the VM register itself: the agent sends ISTIO_META_AUTO_REGISTER_GROUP and
    /// the control plane creates its WorkloadEntry from the group.
    #[arg(long = "autoregister")]
    pub autoregister: bool,
    /// Capture the VM's DNS queries (port 53) to the agent (ISTIO_META_DNS_CAPTURE).
    #[arg(long = "capture-dns", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub capture_dns: bool,
    /// The VM's own IP (ISTIO_SVC_IP).
    #[arg(long = "internalIP")]
    pub internal_ip: Option<String>,
    /// The VM's external IP (ISTIO_SVC_IP, and probes rewritten to it).
    #[arg(long = "externalIP")]
    pub external_ip: Option<String>,
    /// The control plane revision: istiod-<rev>.<ns>.svc, ConfigMaps istio-<rev> and
    /// istio-sidecar-injector-<rev>.
    #[arg(short = 'r', long = "revision", default_value = "")]
    pub revision: String,
    /// The control plane's namespace.
    #[arg(short = 'i', long = "istioNamespace", default_value = "istio-system")]
    pub istio_namespace: String,
    /// The kubeconfig (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(short = 'c', long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current one).
    #[arg(long = "context")]
    pub context: Option<String>,
    /// The mesh config (the `mesh` key of the `istio` ConfigMap) from a file instead
    /// of Kubernetes.
    #[arg(long = "meshConfig")]
    pub mesh_config: Option<PathBuf>,
    /// The mesh root certificate (PEM) from a file instead of the istio-ca-root-cert
    /// ConfigMap: meshfed discovery's --rootCertFile, or root-cert.pem of its --caDir.
    #[arg(long = "rootCert")]
    pub root_cert: Option<PathBuf>,
    /// The token to copy into istio-token instead of requesting one from Kubernetes
    /// (outside Kubernetes: a JWT of the --jwtRule issuer meshfed trusts).
    #[arg(long = "token")]
    pub token: Option<PathBuf>,
    /// Use no Kubernetes API even when a kubeconfig is found.
    #[arg(long = "offline")]
    pub offline: bool,
}

/// The files, ready to write.
#[derive(Debug)]
struct Output {
    files: Vec<(&'static str, Vec<u8>, u32)>,
    notes: Vec<String>,
}

/// Runs the command: prints notes on stderr and the result on stdout.
pub fn run(args: BootstrapArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let dir = runtime.block_on(bootstrap(&args))?;
    println!(
        "Configuration generation into directory {} was successful",
        dir.display()
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// Reads the inputs, computes the files and writes them into `--output`; returns the
/// directory. Notes go to stderr.
pub async fn bootstrap(args: &BootstrapArgs) -> anyhow::Result<PathBuf> {
    if args.file.is_none() && (args.name.is_none() || args.namespace.is_none()) {
        bail!(
            "expecting a WorkloadGroup artifact file or the name and namespace of an existing WorkloadGroup"
        );
    }
    let Some(dir) = args.output.clone() else {
        bail!("expecting an output directory");
    };
    if args.internal_ip.is_some() && args.external_ip.is_some() {
        bail!("the flags --internalIP and --externalIP are mutually exclusive");
    }
    let kube = client(args).await?;
    let output = prepare(args, kube.as_ref()).await.map_err(|err| {
        // A cluster found by default but not meant: say how to do without it.
        let from_kube = err
            .downcast_ref::<meshfed_kube::vm_bootstrap::BootstrapKubeError>()
            .is_some();
        if from_kube && args.file.is_some() && args.kubeconfig.is_none() {
            err.context(
                "asking the Kubernetes API of the default kubeconfig; --offline uses the files given only",
            )
        } else {
            err
        }
    })?;
    for note in &output.notes {
        eprintln!("{note}");
    }
    write_files(&dir, &output.files)?;
    Ok(dir)
}

/// The Kubernetes client, unless --offline; a missing kubeconfig is fine unless the
/// group is to be read from Kubernetes or a kubeconfig was named.
async fn client(args: &BootstrapArgs) -> anyhow::Result<Option<meshfed_kube::Client>> {
    if args.offline {
        if args.file.is_none() {
            bail!("--offline: the WorkloadGroup must come from a file (-f)");
        }
        return Ok(None);
    }
    let named = args.kubeconfig.is_some() || args.context.is_some();
    match meshfed_kube::cli_client::cli_client(args.kubeconfig.as_deref(), args.context.as_deref())
        .await
    {
        Ok((client, _server)) => Ok(Some(client)),
        Err(err) if named || args.file.is_none() => {
            bail!("Kubernetes API: {err}")
        }
        Err(err) => {
            eprintln!("No Kubernetes API ({err}): using the files given only.");
            Ok(None)
        }
    }
}

async fn prepare(
    args: &BootstrapArgs,
    kube: Option<&meshfed_kube::Client>,
) -> anyhow::Result<Output> {
    use meshfed_kube::vm_bootstrap as k;
    let mut notes = Vec::new();
    let group = match (&args.file, kube) {
        (Some(path), _) => read_group_file(path, args.namespace.as_deref())?,
        (None, Some(client)) => {
            let (ns, name) = (
                args.namespace.clone().unwrap_or_default(),
                args.name.clone().unwrap_or_default(),
            );
            let value = k::workload_group(client, &ns, &name)
                .await?
                .with_context(|| format!("workloadgroup {name} not found in namespace {ns}"))?;
            group_from_value(
                value,
                &format!("WorkloadGroup {ns}/{name} (Kubernetes)"),
                None,
            )?
        }
        (None, None) => unreachable!("checked by client()"),
    };
    let template = group.spec.template.clone().unwrap_or_default();

    let cluster_id = match (&args.cluster_id, kube) {
        (Some(id), _) => id.clone(),
        (None, Some(client)) => {
            let name = revisioned("istio-sidecar-injector", &args.revision);
            let values = k::config_map_data(client, &args.istio_namespace, &name)
                .await?
                .with_context(|| {
                    format!(
                        "failed to automatically determine the --clusterID: fetch injection template: \
                         configmap {name} not found in namespace {} (meshfed does not inject sidecars: \
                         pass --clusterID, the --clusterID meshfed discovery runs with)",
                        args.istio_namespace
                    )
                })?;
            let text = values.get("values").map(String::as_str).unwrap_or("{}");
            let values: Value = serde_json::from_str(text).with_context(|| {
                format!(
                    "failed to automatically determine the --clusterID: configmap {name}: `values` is not JSON"
                )
            })?;
            values["global"]["multiCluster"]["clusterName"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
        (None, None) => bail!(
            "--clusterID is required without a Kubernetes API (the --clusterID meshfed discovery runs with)"
        ),
    };

    let mesh: Value = match (&args.mesh_config, kube) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--meshConfig {}", path.display()))?;
            parse_mesh(&text).with_context(|| format!("--meshConfig {}", path.display()))?
        }
        (None, Some(client)) => {
            let name = revisioned("istio", &args.revision);
            let data = k::config_map_data(client, &args.istio_namespace, &name)
                .await?
                .with_context(|| {
                    format!(
                        "configmap {name} was not found in namespace {} (or give the mesh config with --meshConfig)",
                        args.istio_namespace
                    )
                })?;
            let text = data.get("mesh").map(String::as_str).unwrap_or_default();
            parse_mesh(text)
                .with_context(|| format!("configmap {}/{name}, key mesh", args.istio_namespace))?
        }
        (None, None) => {
            notes.push("No --meshConfig: mesh.yaml starts from an empty defaultConfig.".into());
            Value::Object(Default::default())
        }
    };

    let settings = Settings {
        mesh,
        cluster_id,
        revision: args.revision.clone(),
        istio_namespace: args.istio_namespace.clone(),
        internal_ip: args.internal_ip.clone(),
        external_ip: args.external_ip.clone(),
        autoregister: args.autoregister,
        capture_dns: args.capture_dns,
    };
    let generated = vm_files::generate(&group, &settings)?;
    notes.extend(generated.notes);

    let root_cert = match (&args.root_cert, kube) {
        (Some(path), _) => {
            std::fs::read(path).with_context(|| format!("--rootCert {}", path.display()))?
        }
        (None, Some(client)) => {
            let name = meshfed_kube::root_cert::ROOT_CERT_CONFIGMAP;
            let data = k::config_map_data(client, &group.namespace, name)
                .await?
                .with_context(|| {
                    format!(
                        "configmap {name} was not found in namespace {} (meshfed publishes it in every \
                         namespace when it runs with the Kubernetes registry; or give --rootCert)",
                        group.namespace
                    )
                })?;
            data.get(meshfed_kube::root_cert::ROOT_CERT_KEY)
                .cloned()
                .unwrap_or_default()
                .into_bytes()
        }
        (None, None) => bail!(
            "root-cert.pem: --rootCert is required without a Kubernetes API (meshfed discovery's \
             --rootCertFile, or root-cert.pem in its --caDir)"
        ),
    };

    let token = match (&args.token, kube) {
        (Some(path), _) => {
            Some(std::fs::read(path).with_context(|| format!("--token {}", path.display()))?)
        }
        (None, Some(client)) => {
            let token = k::request_token(
                client,
                &group.namespace,
                &template.service_account,
                &[TOKEN_AUDIENCE],
                args.token_duration,
            )
            .await?;
            notes.push(format!(
                "Warning: a security token for namespace {:?} and service account {:?} has been generated and stored at {:?}",
                group.namespace,
                template.service_account,
                args.output.clone().unwrap_or_default().join("istio-token").display().to_string()
            ));
            Some(token.into_bytes())
        }
        (None, None) => {
            notes.push(
                "istio-token not written: no Kubernetes API to request a token from. Put a token the \
                 control plane accepts (a JWT of its --jwtRule issuer, audience istio-ca) at istio-token \
                 before starting the agent, or give --token."
                    .into(),
            );
            None
        }
    };

    let ingress_ip = match (&args.ingress_ip, kube) {
        (Some(ip), _) if ip.parse::<std::net::IpAddr>().is_ok() => Some(ip.clone()),
        (_, Some(client)) => {
            let (svc, ns) = match args.ingress_service.split_once('.') {
                Some((svc, ns)) if !ns.contains('.') => (svc.to_string(), ns.to_string()),
                _ => (args.ingress_service.clone(), args.istio_namespace.clone()),
            };
            k::gateway_address(client, &ns, &svc).await.ok().flatten()
        }
        (_, None) => args.ingress_ip.clone(),
    };
    let hosts = vm_files::hosts(ingress_ip.as_deref(), &args.istio_namespace, &args.revision);
    if hosts.is_empty() {
        notes.push(format!(
            "Could not auto-detect IP for {}/{}. Use --ingressIP to manually specify the Gateway address to reach istiod from the VM.",
            vm_files::istiod_host(&args.istio_namespace, &args.revision),
            args.istio_namespace
        ));
    }

    let mut files = vec![
        ("mesh.yaml", generated.mesh_yaml.into_bytes(), 0o644),
        ("cluster.env", generated.cluster_env.into_bytes(), 0o644),
        ("root-cert.pem", root_cert, 0o644),
        ("hosts", hosts.into_bytes(), 0o644),
    ];
    if let Some(token) = token {
        files.push(("istio-token", token, 0o600));
    }
    Ok(Output { files, notes })
}

fn revisioned(name: &str, revision: &str) -> String {
    if is_revisioned(revision) {
        format!("{name}-{revision}")
    } else {
        name.to_string()
    }
}

/// A mesh config document as a JSON object (empty text: `{}`).
fn parse_mesh(text: &str) -> anyhow::Result<Value> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    let value: Value = serde_norway::from_str(text).context("not valid YAML")?;
    match value {
        Value::Object(_) => Ok(value),
        Value::Null => Ok(Value::Object(Default::default())),
        _ => bail!("a mesh config must be a YAML mapping of MeshConfig fields"),
    }
}

/// The one WorkloadGroup of a file.
fn read_group_file(path: &Path, namespace: Option<&str>) -> anyhow::Result<Group> {
    use serde::Deserialize;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut documents = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc)
            .with_context(|| format!("{}: not valid YAML", path.display()))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let value = match documents.len() {
        1 => documents.remove(0),
        0 => bail!("{}: no WorkloadGroup in the file", path.display()),
        n => bail!(
            "{}: {n} documents; expected one WorkloadGroup",
            path.display()
        ),
    };
    group_from_value(value, &path.display().to_string(), namespace)
}

/// A WorkloadGroup object, read and validated as the config stores read it; `what`
/// names it in errors. A document without `apiVersion` is taken as
/// `networking.istio.io/v1` (istioctl reads one), one without a namespace takes
/// `namespace`.
fn group_from_value(
    mut value: Value,
    what: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Group> {
    let Some(map) = value.as_object_mut() else {
        bail!("{what}: expected a WorkloadGroup (a mapping with kind, metadata and spec)");
    };
    match map.get("kind").and_then(Value::as_str) {
        None => {
            map.insert("kind".into(), "WorkloadGroup".into());
        }
        Some("WorkloadGroup") => {}
        Some(other) => bail!("{what}: kind {other:?}: expected a WorkloadGroup"),
    }
    map.entry("apiVersion")
        .or_insert_with(|| "networking.istio.io/v1".into());
    let has_namespace = map
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .is_some_and(|ns| !ns.is_empty());
    if !has_namespace {
        let Some(ns) = namespace else {
            bail!("{what}: metadata.namespace is required (or give --namespace)");
        };
        if !map.get("metadata").is_some_and(Value::is_object) {
            map.insert("metadata".into(), Value::Object(Default::default()));
        }
        map["metadata"]["namespace"] = Value::String(ns.to_string());
    }
    let object = match decode(&value, what) {
        Decoded::Object(object) => object,
        Decoded::Invalid(invalid) => {
            let errors: Vec<String> = invalid.errors.iter().map(|e| e.to_string()).collect();
            bail!(
                "{what}: WorkloadGroup {}/{}: {}",
                invalid.namespace,
                invalid.name,
                errors.join("; ")
            );
        }
        other => bail!("{what}: not a WorkloadGroup ({other:?})"),
    };
    let id = format!("WorkloadGroup {}/{}", object.namespace, object.name);
    match validate(&object) {
        Ok(warnings) => {
            for warning in warnings {
                eprintln!("warning: {what}: {id}: {warning}");
            }
        }
        Err(errors) => {
            let errors: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            bail!("{what}: {id}: {}", errors.join("; "));
        }
    }
    let Some(spec) = object.spec.get::<net::WorkloadGroup>() else {
        bail!("{what}: not a WorkloadGroup");
    };
    let mut spec = spec.clone();
    // istioctl: a template without a service account is `default`'s.
    let template = spec.template.get_or_insert_with(Default::default);
    if template.service_account.is_empty() {
        template.service_account = "default".into();
    }
    Ok(Group {
        name: object.name.clone(),
        namespace: object.namespace.clone(),
        annotations: object
            .annotations
            .clone()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        spec,
    })
}

/// Creates `dir` and writes the files (mode 0644, the token 0600 from its creation on).
fn write_files(dir: &Path, files: &[(&'static str, Vec<u8>, u32)]) -> anyhow::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, bytes, mode) in files {
        let path = dir.join(name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
            options.mode(*mode);
            // An existing file keeps its mode on open: set it first.
            if path.exists() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))
                    .with_context(|| format!("setting the mode of {}", path.display()))?;
            }
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        file.write_all(bytes)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
