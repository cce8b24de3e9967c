//! `meshfed`: the command line.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand};
use meshfed::ads::transport::XdsLimits;
use meshfed::app::{DiscoveryConfig, MockSource, Server};
use meshfed::generate::GeneratorOptions;
use meshfed::generate::eds::EdsOptions;
use meshfed::push::debounce::DebounceConfig;
use meshfed::registries::KINDS;
use meshfed_registry::source::{CommonSettings, RegistrySource};

/// jemalloc rather than glibc's malloc: a push allocates and frees hundreds of
/// kilobytes per proxy in bursts, which glibc's heap keeps after they are freed. With
/// 2,000 Delta sidecars connecting (`meshfed load`, BENCHMARKS.md): RSS 261 -> 193 MiB,
/// server CPU for the initial configs 12.3 -> 8.7 s. (mimalloc was tried before and
/// held more.) Freed pages are purged by jemalloc's background threads (the crate's
/// `background_threads` feature), not by whichever request allocates next.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A multi-registry service-mesh control plane serving Istio-compatible xDS.
#[derive(Parser, Debug)]
#[command(name = "meshfed", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the xDS server (pilot-discovery's `discovery`).
    Discovery(Box<DiscoveryArgs>),
    /// Check Istio config files offline: every error with file:line, object, field and
    /// reason; exits non-zero when anything is invalid.
    Validate(ValidateArgs),
    /// Load a server with simulated proxies and registry churn: runs the separate
    /// `meshfed-load` binary with these arguments (`meshfed load --help` shows its
    /// flags; see the README's "Load testing").
    #[command(disable_help_flag = true)]
    Load(LoadArgs),
    /// Joining a VM to the mesh (`meshfed vm bootstrap`).
    #[command(subcommand)]
    Vm(VmCommand),
    /// Print the Secret (kubeconfig for the reader service account) that lets meshfed
    /// in another cluster read this one, as `istioctl create-remote-secret` does.
    CreateRemoteSecret(meshfed::cli::remote_secret::RemoteSecretArgs),
    /// Run Istio's config analyzers over files, directories or the cluster, as
    /// `istioctl analyze` (codes IST0xxx; exit code 79 on issues at the failure
    /// threshold).
    Analyze(Box<meshfed::cli::analyze::AnalyzeArgs>),
}

/// `meshfed vm ...`.
#[derive(Subcommand, Debug)]
enum VmCommand {
    /// Write the files a VM's istio-agent needs for a WorkloadGroup (cluster.env,
    /// mesh.yaml, root-cert.pem, istio-token, hosts), as `istioctl x workload entry
    /// configure` does.
    Bootstrap(Box<meshfed::cli::vm::BootstrapArgs>),
}

/// `meshfed load ARGS...`: everything goes to `meshfed-load` as given.
#[derive(Args, Debug)]
struct LoadArgs {
    /// The load tool's arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<OsString>,
}

/// Runs `meshfed-load` from next to this executable, else from PATH, with `args`; on
/// Unix it replaces this process (signals and the exit status are the tool's own).
fn load(args: LoadArgs) -> anyhow::Result<std::process::ExitCode> {
    let exe = std::env::current_exe().context("finding the meshfed binary")?;
    let name = format!("meshfed-load{}", std::env::consts::EXE_SUFFIX);
    let beside = exe.parent().map(|dir| dir.join(&name));
    let tool = beside
        .iter()
        .cloned()
        .chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|dir| dir.join(&name)),
        )
        .find(|p| p.is_file());
    let Some(tool) = tool else {
        bail!(
            "`meshfed load` runs the load tool, a separate binary, and there is no {name} in {} \
             nor on PATH. Build it with `cargo build --release -p meshfed-load` (it lands next to \
             meshfed, in target/release)",
            beside.as_deref().and_then(Path::parent).map_or_else(
                || "this binary's directory".into(),
                |d| d.display().to_string()
            )
        );
    };
    let mut command = std::process::Command::new(&tool);
    // Servers the tool starts run from this build.
    command.args(&args.args).env("MESHFED_BINARY", &exe);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        let err = command.exec();
        Err(anyhow::Error::new(err).context(format!("running {}", tool.display())))
    }
    #[cfg(not(unix))]
    {
        let status = command
            .status()
            .with_context(|| format!("running {}", tool.display()))?;
        Ok(match status.code() {
            Some(0) => std::process::ExitCode::SUCCESS,
            Some(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => std::process::ExitCode::FAILURE,
        })
    }
}

/// `meshfed validate -f FILE...` (directories are walked like --configDir; `-` reads
/// stdin).
#[derive(Args, Debug)]
struct ValidateArgs {
    /// Files or directories to check.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// Also fail (exit 1) on objects of kinds meshfed does not read (another group,
    /// or an Istio kind not supported yet), which are otherwise warnings.
    #[arg(long = "strict")]
    strict: bool,
    /// The mesh config the objects are served with (as `discovery --meshConfig`):
    /// Telemetry naming a provider it does not define is warned about. Default:
    /// Istio's default mesh config (built-in providers only).
    #[arg(long = "meshConfig")]
    mesh_config: Option<PathBuf>,
}

fn validate(args: ValidateArgs) -> anyhow::Result<std::process::ExitCode> {
    use meshfed_registry::config::{validate_files_in, validate_text};
    let mesh = match &args.mesh_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            for warning in meshfed::mesh::mesh_config_warnings(path, &text) {
                println!("{warning}");
            }
            meshfed::mesh::parse_mesh_config(path, &text)?
        }
        None => meshfed::mesh::default_mesh_config(),
    };
    let mut reports = Vec::new();
    let (stdin, files): (Vec<PathBuf>, Vec<PathBuf>) =
        args.files.into_iter().partition(|p| p.as_os_str() == "-");
    if !stdin.is_empty() {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).context("reading stdin")?;
        reports.push(validate_text(std::path::Path::new("<stdin>"), &text));
    }
    reports.extend(validate_files_in(&files, Some(&mesh)));
    let (mut objects, mut errors, mut ignored) = (0, 0, 0);
    for report in &reports {
        objects += report.objects.len() + report.secrets.len();
        errors += report.errors.len();
        ignored += report.skipped.len();
        for d in report.errors.iter().chain(&report.warnings) {
            println!("{d}");
        }
        for d in &report.skipped {
            println!("warning: {d}; meshfed does not apply it");
        }
    }
    let ignored_note = if ignored == 0 {
        String::new()
    } else {
        format!(", {ignored} ignored (kinds meshfed does not read)")
    };
    println!(
        "{objects} valid object(s), {errors} error(s){ignored_note} in {} file(s)",
        reports.len()
    );
    Ok(if errors == 0 && !(args.strict && ignored > 0) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// Flags keep pilot-discovery's names where they mean the same thing.
#[derive(Args, Debug)]
struct DiscoveryArgs {
    /// Comma separated registries to read services from: Kubernetes, Consul, Mock, Nacos. Default:
    /// Kubernetes when a kubeconfig (--kubeconfig, KUBECONFIG) or in-cluster config is
    /// present, else Mock (the bundled example).
    #[arg(long = "registries", value_delimiter = ',')]
    registries: Option<Vec<String>>,
    /// Every registry kind's own flags (`meshfed::registries::KINDS`).
    #[command(flatten)]
    registry_flags: RegistryFlags,
    /// Istio's system namespace (its `topology.istio.io/network` label is the
    /// cluster's default network).
    #[arg(long = "systemNamespace", default_value = "istio-system")]
    system_namespace: String,
    /// How long after start readiness waits for the remote clusters that the Secrets
    /// name then (Istio's PILOT_REMOTE_CLUSTER_TIMEOUT); a cluster still syncing after
    /// it keeps syncing in the background. Remote clusters added later never affect
    /// readiness.
    #[arg(long = "remoteClusterTimeout", default_value = "30s", value_parser = parse_duration)]
    remote_cluster_timeout: Duration,
    /// With the Kubernetes registry: the ConfigMap in the system namespace whose `mesh`
    /// and `meshNetworks` keys give the mesh settings not set by --meshConfig /
    /// --networksConfig, watched (istiod's `istio` ConfigMap). Empty turns it off.
    #[arg(long = "meshConfigMap", default_value = "istio")]
    mesh_config_map: String,
    /// At shutdown (SIGTERM), the window over which the ADS streams are closed one by
    /// one after /ready turns 503 and the xDS port stops accepting, so proxies move to
    /// other replicas gradually. `0s` closes them all at once.
    #[arg(long = "drainDuration", default_value = "5s", value_parser = parse_duration)]
    drain_duration: Duration,
    /// With the Kubernetes registry: elect a leader among the replicas over the Lease
    /// `meshfed-leader` in the system namespace (client-go's timings: 15 s, renewed
    /// every 2 s, released at shutdown); the leader alone does singleton duties.
    #[arg(long = "leaderElection", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// This replica's identity in the Lease; default `$POD_NAME`, else the host name
    /// and process id.
    #[arg(long = "leaseIdentity", default_value = "")]
    lease_identity: String,
    /// Turns the mesh CA on outside Kubernetes, keeping its self-signed root in this
    /// directory (created on the first start; the key at mode 0600). With the
    /// Kubernetes registry the CA is on without it and keeps its root in Secret
    /// istio-ca-secret of the system namespace (or uses Secret cacerts).
    #[arg(long = "caDir")]
    ca_dir: Option<PathBuf>,
    /// Run the mesh CA (Istio's ENABLE_CA_SERVER). `false` turns it off, and with it
    /// the secure port unless --tlsCertFile is given.
    #[arg(long = "enableCAServer", default_value_t = true, action = clap::ArgAction::Set)]
    enable_ca_server: bool,
    /// A plugged-in CA (Istio's `cacerts`: ca-cert.pem, ca-key.pem, root-cert.pem,
    /// cert-chain.pem), used instead of the self-signed root when its files are there;
    /// needs --caDir.
    #[arg(long = "cacertsDir")]
    cacerts_dir: Option<PathBuf>,
    /// With the Kubernetes registry: also read Istio config (the VirtualService,
    /// DestinationRule, Gateway, ServiceEntry, WorkloadEntry and Sidecar CRDs of
    /// networking.istio.io) from its API server. `false` leaves config to --configDir.
    #[arg(long = "kubeConfigStore", default_value_t = true, action = clap::ArgAction::Set)]
    kube_config_store: bool,
    /// DNS domain suffix of the cluster.
    #[arg(long = "domain", default_value = "cluster.local")]
    domain: String,
    /// The GatewayClass controller name whose Gateway API Gateways meshfed serves;
    /// default `$PILOT_GATEWAY_API_CONTROLLER_NAME`, else `istio.io/gateway-controller`.
    #[arg(long = "gatewayControllerName")]
    gateway_controller_name: Option<String>,
    /// Directory of Istio config files (VirtualService, DestinationRule, Gateway,
    /// Sidecar, ServiceEntry, WorkloadEntry; *.yaml/*.yml/*.json, recursively). Watched:
    /// changes apply live; an invalid object is rejected alone.
    #[arg(long = "configDir")]
    config_dir: Option<PathBuf>,
    /// Size limit in bytes of every watched file (--mockRegistryFile, --configDir
    /// files, --meshConfig, --networksConfig). A larger file is refused (the last good
    /// content stays); only regular files are read.
    #[arg(long = "maxConfigFileSize", default_value_t = meshfed_registry::read::DEFAULT_MAX_FILE_SIZE)]
    max_config_file_size: u64,
    /// This control plane's cluster id.
    #[arg(long = "clusterID", default_value = "Kubernetes")]
    cluster_id: String,
    /// Plaintext xDS (ADS) address. `:PORT` listens on every interface, as in Istio;
    /// empty turns the plaintext port off. Streams here carry no identity and
    /// CreateCertificate refuses every caller.
    #[arg(long = "grpcAddr", default_value = "127.0.0.1:15010", value_parser = parse_optional_addr)]
    grpc_addr: OptionalAddr,
    /// Secure xDS address (Istio's 15012): TLS, ADS with authenticated and authorized
    /// proxies, and the CA's CreateCertificate. Served when there is a mesh CA
    /// (--caDir, or the Kubernetes registry) or serving files (--tlsCertFile); empty
    /// turns it off.
    #[arg(long = "secureGrpcAddr", default_value = "127.0.0.1:15012", value_parser = parse_optional_addr)]
    secure_grpc_addr: OptionalAddr,
    /// The validating admission webhook's HTTPS address (Istio's 15017): `/validate`
    /// answers Kubernetes' AdmissionReviews with `meshfed validate`'s checks, with the
    /// secure port's serving certificate. Served when there is a mesh CA or serving
    /// files; empty turns it off.
    #[arg(long = "httpsAddr", default_value = "127.0.0.1:15017", value_parser = parse_optional_addr)]
    https_addr: OptionalAddr,
    /// The secure port's serving certificate chain (PEM), with --tlsKeyFile and
    /// --caCertFile (all three or none); reloaded when any of them changes. Without
    /// them the mesh CA issues the certificate.
    #[arg(long = "tlsCertFile")]
    tls_cert_file: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    #[arg(long = "tlsKeyFile")]
    tls_key_file: Option<PathBuf>,
    /// Roots (PEM) that client certificates on the secure port may chain to, besides
    /// the mesh CA's.
    #[arg(long = "caCertFile")]
    ca_cert_file: Option<PathBuf>,
    /// Lowest TLS version of the secure port: 1.2 or 1.3.
    #[arg(long = "tlsMinVersion", default_value = "1.2")]
    tls_min_version: meshfed::tls::TlsMinVersion,
    /// Extra DNS names (comma separated) of the CA-issued serving certificate, next to
    /// istiod.<ns>.svc, istiod-remote.<ns>.svc and istio-pilot.<ns>.svc; default
    /// $ISTIOD_CUSTOM_HOST.
    #[arg(long = "istiodCustomHost", value_delimiter = ',')]
    istiod_custom_host: Vec<String>,
    /// The control plane revision: adds istiod-<revision>.<ns>.svc to the serving
    /// certificate unless empty or `default`.
    #[arg(long = "revision", default_value = "")]
    revision: String,
    /// A third-party JWT issuer trusted on the secure port, for workloads outside
    /// Kubernetes (VMs, Consul): Istio's JWT_RULE JSON, e.g.
    /// {"issuer":"https://issuer","jwksUri":"https://issuer/jwks","audiences":["istio-ca"]};
    /// default $JWT_RULE.
    #[arg(long = "jwtRule")]
    jwt_rule: Option<String>,
    /// Audiences a Kubernetes service-account token must carry (Istio's
    /// TOKEN_AUDIENCES), comma separated.
    #[arg(
        long = "tokenAudiences",
        default_value = "istio-ca",
        value_delimiter = ','
    )]
    token_audiences: Vec<String>,
    /// Service accounts (`<namespace>/<name>`, comma separated) that may ask for the
    /// certificates of the workloads on their node (ztunnel's ImpersonatedIdentity;
    /// Istio's CA_TRUSTED_NODE_ACCOUNTS). Default $CA_TRUSTED_NODE_ACCOUNTS, else
    /// istio-system/ztunnel; empty: no one.
    #[arg(long = "caTrustedNodeAccounts")]
    ca_trusted_node_accounts: Option<String>,
    /// Write the mesh root bundle (PEM, mode 0644) to this file, for workloads outside
    /// Kubernetes; with Kubernetes it is also published as the istio-ca-root-cert
    /// ConfigMap of every namespace.
    #[arg(long = "rootCertFile")]
    root_cert_file: Option<PathBuf>,
    /// New xDS streams accepted a second on both ports, burst one; a stream waits up to
    /// a second for its turn, then is refused with RESOURCE_EXHAUSTED (Istio's
    /// PILOT_MAX_REQUESTS_PER_SECOND). 0: Istio's default, min(15 + 5 x cores, 100).
    #[arg(long = "maxRequestsPerSecond", default_value_t = 0.0)]
    max_requests_per_second: f64,
    /// HTTP address for /ready and the debug endpoints.
    #[arg(long = "httpAddr", default_value = "127.0.0.1:8080", value_parser = parse_addr)]
    http_addr: SocketAddr,
    /// Address for /metrics, /version and the debug endpoints.
    #[arg(long = "monitoringAddr", default_value = "127.0.0.1:15014", value_parser = parse_addr)]
    monitoring_addr: SocketAddr,
    /// How long a new connection to an admin port (--httpAddr, --monitoringAddr) may
    /// take to send its first request's headers; `0s`: no limit. istiod's servers set
    /// ReadTimeout 30s, which Go applies to the headers too.
    #[arg(long = "adminReadHeaderTimeout", default_value = "30s", value_parser = parse_duration)]
    admin_read_header_timeout: Duration,
    /// How long an admin connection with no request in flight is kept; `0s`: no limit
    /// (istiod's IdleTimeout: 90s).
    #[arg(long = "adminIdleTimeout", default_value = "90s", value_parser = parse_duration)]
    admin_idle_timeout: Duration,
    /// Most connections held on each admin port, separate from --maxConnections; at the
    /// cap a new connection replaces the longest-idle one, or is closed at accept when
    /// every one is busy. Lowered to an eighth of the open-files limit where that is
    /// smaller. (Go's servers, istiod's, have no cap.)
    #[arg(long = "adminMaxConnections", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    admin_max_connections: u32,
    /// Quiet period before a push (Istio's PILOT_DEBOUNCE_AFTER).
    #[arg(long = "debounceAfter", default_value = "100ms", value_parser = parse_duration)]
    debounce_after: Duration,
    /// Longest a push waits for quiet (Istio's PILOT_DEBOUNCE_MAX).
    #[arg(long = "debounceMax", default_value = "10s", value_parser = parse_duration)]
    debounce_max: Duration,
    /// Debounce endpoint-only updates too (Istio's PILOT_ENABLE_EDS_DEBOUNCE); with
    /// `false` they are pushed at once.
    #[arg(long = "edsDebounce", default_value_t = true, action = clap::ArgAction::Set)]
    eds_debounce: bool,
    /// Pushes generated concurrently (Istio's PILOT_PUSH_THROTTLE). Bounds generation
    /// only: a proxy that does not read holds no slot.
    #[arg(long = "pushThrottle", default_value_t = 100)]
    push_throttle: usize,
    /// How long one xDS response may wait for a proxy that does not read it before the
    /// proxy's connection is closed (Istio's PILOT_XDS_SEND_TIMEOUT); `0s`: no limit.
    #[arg(long = "xdsSendTimeout", default_value = "30s", value_parser = parse_duration)]
    xds_send_timeout: Duration,
    /// Most TCP connections held on the xDS port; beyond it new connections are
    /// closed at accept. `0`: no cap.
    #[arg(long = "maxConnections", default_value_t = 0)]
    max_connections: usize,
    /// How long a connection to the xDS port may stay without opening a gRPC stream
    /// before it is closed; `0s`: no limit.
    #[arg(long = "handshakeTimeout", default_value = "10s", value_parser = parse_duration)]
    handshake_timeout: Duration,
    /// HTTP/2 streams one xDS connection may have open at once
    /// (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long = "maxConcurrentStreams", default_value_t = 100)]
    max_concurrent_streams: u32,
    /// Bytes of unfinished request messages one xDS connection may hold over all its
    /// streams; at least one whole message (4 MiB) is always allowed.
    #[arg(long = "maxConnectionRequestBytes", default_value_t = 16 * 1024 * 1024)]
    max_connection_request_bytes: usize,
    /// After this long an xDS connection is told GOAWAY (and closed 10 s later) so that
    /// proxies reconnect and spread over replicas; `0s`: never (Istio's default; its
    /// Helm chart sets 30m).
    #[arg(long = "keepaliveMaxServerConnectionAge", default_value = "0s", value_parser = parse_duration)]
    max_connection_age: Duration,
    /// How long the WorkloadEntry of an auto-registered workload (a VM) is kept after
    /// its proxy disconnected; default `$PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`, else 10s.
    #[arg(long = "workloadEntryGracePeriod", value_parser = parse_duration)]
    workload_entry_grace_period: Option<Duration>,
    /// Create WorkloadEntries for proxies that connect with
    /// ISTIO_META_AUTO_REGISTER_GROUP; default
    /// `$PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION`, else true.
    #[arg(long = "workloadEntryAutoRegistration", action = clap::ArgAction::Set)]
    workload_entry_auto_registration: Option<bool>,
    /// Take istio-agent health reports into WorkloadEntries' Healthy condition;
    /// default `$PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`, else true.
    #[arg(long = "workloadEntryHealthChecks", action = clap::ArgAction::Set)]
    workload_entry_health_checks: Option<bool>,
    /// With the Kubernetes config store, the leader writes status.conditions
    /// (Reconciled) and status.validationMessages on Istio config objects; default
    /// `$PILOT_ENABLE_STATUS`, else false.
    #[arg(long = "enableStatus", action = clap::ArgAction::Set)]
    enable_status: Option<bool>,
    /// Status API requests per second; default `$PILOT_STATUS_QPS`, else 100.
    #[arg(long = "statusQPS")]
    status_qps: Option<f64>,
    /// Status API requests allowed at once above the rate; default
    /// `$PILOT_STATUS_BURST`, else 500.
    #[arg(long = "statusBurst")]
    status_burst: Option<u32>,
    /// How often statuses are compared and written; default
    /// `$PILOT_STATUS_UPDATE_INTERVAL`, else 500ms.
    #[arg(long = "statusUpdateInterval", value_parser = parse_duration)]
    status_update_interval: Option<Duration>,
    /// Send unhealthy endpoints marked UNHEALTHY instead of dropping them (Istio's
    /// PILOT_SEND_UNHEALTHY_ENDPOINTS).
    #[arg(long = "sendUnhealthyEndpoints", default_value_t = false, action = clap::ArgAction::Set)]
    send_unhealthy: bool,
    /// Give the workloads of each waypoint an allow policy for the waypoint's service
    /// accounts, sent to ztunnel (`<ns>/istio_allow_waypoint_<ns>_<name>`); default
    /// `$DEFAULT_ALLOW_FROM_WAYPOINT`, else false.
    #[arg(long = "defaultAllowFromWaypoint", action = clap::ArgAction::Set)]
    default_allow_from_waypoint: Option<bool>,
    /// Ambient multi-network: scope services by MeshConfig `serviceScopeConfigs` and
    /// send other networks' workloads to ztunnel through their gateways
    /// (split horizon); default `$AMBIENT_ENABLE_MULTI_NETWORK`, else false.
    #[arg(long = "ambientMultiNetwork", action = clap::ArgAction::Set)]
    ambient_multi_network: Option<bool>,
    /// MeshConfig YAML (the `mesh` key of Istio's ConfigMap); Istio's defaults when
    /// absent. Watched: a change reloads and pushes to every proxy.
    #[arg(long = "meshConfig")]
    mesh_config: Option<PathBuf>,
    /// meshNetworks YAML (`networks: {...}`). Watched like --meshConfig.
    #[arg(long = "networksConfig")]
    networks_config: Option<PathBuf>,
    /// Answer debug endpoints for non-loopback callers too.
    #[arg(long = "debugAllowRemote", default_value_t = false)]
    debug_allow_remote: bool,
    /// Log levels in Istio's form `scope:level,...` (e.g. `default:info,ads:debug`);
    /// scopes: default, ads, push, model, registry, kube, consul, mesh, admin, app.
    /// RUST_LOG (tracing syntax) overrides it. Changeable at run time via /logging.
    #[arg(long = "log_output_level", default_value = "default:info")]
    log_output_level: String,
    /// Log as JSON lines.
    #[arg(long = "log_as_json", default_value_t = false)]
    log_as_json: bool,
    /// Once every listener is bound (when `meshfed discovery serving` is logged), write
    /// the bound addresses to this file as JSON, atomically (a temporary file in the
    /// same directory, then a rename): `{"grpcAddr": "127.0.0.1:15010", "httpAddr": ...,
    /// "monitoringAddr": ..., "pid": N, "secureGrpcAddr": ...}` (a port that is off is
    /// null). For tools that start the server on port 0.
    /// A file left by an earlier run is removed at start, and the file is removed on a
    /// clean shutdown. `/ready` on httpAddr says when the registries have synced.
    #[arg(long = "readyFile")]
    ready_file: Option<PathBuf>,
    /// MCP-over-xDS: comma separated registries whose services are served as
    /// synthesized ServiceEntries and WorkloadEntries, by provider name (Consul, Mock,
    /// Nacos, Eureka, Kubernetes = the remote clusters). Default: every registry but
    /// Kubernetes. The local cluster is never exported.
    #[arg(long = "mcpExportRegistries", value_delimiter = ',')]
    mcp_export_registries: Option<Vec<String>>,
    /// MCP-over-xDS: comma separated namespaces whose services are synthesized.
    /// Default: all.
    #[arg(long = "mcpExportNamespaces", value_delimiter = ',')]
    mcp_export_namespaces: Vec<String>,
    /// MCP-over-xDS on the secure port: comma separated identities allowed to read it,
    /// SPIFFE ids or `<namespace>/<service account>` (`<namespace>/*` for any).
    /// Default: `<systemNamespace>/*`. The plaintext port serves every client.
    #[arg(long = "mcpAllowedIdentities", value_delimiter = ',')]
    mcp_allowed_identities: Option<Vec<String>>,
}

/// The flags of every registry kind (`meshfed::registries::KINDS`), each kind's own
/// `clap::Args`; kept as parsed and read by the kinds `--registries` names.
#[derive(Clone, Debug)]
struct RegistryFlags(ArgMatches);

impl FromArgMatches for RegistryFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(RegistryFlags(matches.clone()))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0 = matches.clone();
        Ok(())
    }
}

impl Args for RegistryFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        KINDS.iter().fold(cmd, |cmd, kind| kind.augment_args(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Writes the `--readyFile` JSON for `bound` to `path` atomically.
fn write_ready_file(path: &Path, bound: &meshfed::app::Bound) -> anyhow::Result<()> {
    let json = serde_json::json!({
        "grpcAddr": bound.grpc.map(|a| a.to_string()),
        "secureGrpcAddr": bound.secure_grpc.map(|a| a.to_string()),
        "httpAddr": bound.http.to_string(),
        "monitoringAddr": bound.monitoring.to_string(),
        "pid": std::process::id(),
    });
    let name = path
        .file_name()
        .with_context(|| format!("--readyFile {}: not a file path", path.display()))?;
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, format!("{json}\n"))
        .with_context(|| format!("--readyFile: writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        format!(
            "--readyFile: renaming {} to {}",
            tmp.display(),
            path.display()
        )
    })
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("{s:?}: bad port"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    s.parse()
        .map_err(|_| format!("{s:?}: expected HOST:PORT, [V6]:PORT or :PORT"))
}

/// An address flag that may be turned off with an empty value.
#[derive(Clone, Copy, Debug)]
struct OptionalAddr(Option<SocketAddr>);

fn parse_optional_addr(s: &str) -> Result<OptionalAddr, String> {
    if s.trim().is_empty() {
        return Ok(OptionalAddr(None));
    }
    parse_addr(s).map(|a| OptionalAddr(Some(a)))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: meshfed_api::Duration = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: must not be negative"))
}

impl DiscoveryArgs {
    /// Config status settings (flags, else Istio's variables), `None` when off.
    fn status_settings(&self) -> anyhow::Result<Option<meshfed_kube::status::StatusSettings>> {
        let on = flag_or_env(self.enable_status, "PILOT_ENABLE_STATUS", parse_go_bool)?;
        if on != Some(true) {
            return Ok(None);
        }
        let defaults = meshfed_kube::status::StatusSettings::default();
        let number = |s: &str| s.parse::<f64>().map_err(|e| e.to_string());
        let count = |s: &str| s.parse::<u32>().map_err(|e| e.to_string());
        let qps = flag_or_env(self.status_qps, "PILOT_STATUS_QPS", number)?.unwrap_or(defaults.qps);
        let burst =
            flag_or_env(self.status_burst, "PILOT_STATUS_BURST", count)?.unwrap_or(defaults.burst);
        let interval = flag_or_env(
            self.status_update_interval,
            "PILOT_STATUS_UPDATE_INTERVAL",
            parse_duration,
        )?
        .unwrap_or(defaults.interval);
        anyhow::ensure!(
            qps > 0.0 && burst > 0 && !interval.is_zero(),
            "--statusQPS, --statusBurst and --statusUpdateInterval must be positive"
        );
        Ok(Some(meshfed_kube::status::StatusSettings {
            qps,
            burst,
            interval,
        }))
    }

    fn secure_settings(&self) -> anyhow::Result<meshfed::app::SecureSettings> {
        let tls_files = match (&self.tls_cert_file, &self.tls_key_file, &self.ca_cert_file) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca_cert)) => Some(meshfed::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca_cert: ca_cert.clone(),
            }),
            _ => bail!(
                "--tlsCertFile, --tlsKeyFile and --caCertFile go together: give all three or none"
            ),
        };
        let custom_hosts = if self.istiod_custom_host.is_empty() {
            std::env::var("ISTIOD_CUSTOM_HOST")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(String::from)
                .collect()
        } else {
            self.istiod_custom_host.clone()
        };
        let jwt_rule = self
            .jwt_rule
            .clone()
            .or_else(|| std::env::var("JWT_RULE").ok())
            .filter(|r| !r.trim().is_empty());
        Ok(meshfed::app::SecureSettings {
            tls_files,
            custom_hosts,
            revision: self.revision.clone(),
            namespace: self.system_namespace.clone(),
            min_version: self.tls_min_version,
            jwt_rule,
            token_audiences: self.token_audiences.clone(),
            root_cert_file: self.root_cert_file.clone(),
            trusted_node_accounts: {
                let (value, source) = match &self.ca_trusted_node_accounts {
                    Some(v) => (v.clone(), "--caTrustedNodeAccounts"),
                    None => match std::env::var("CA_TRUSTED_NODE_ACCOUNTS") {
                        Ok(v) => (v, "$CA_TRUSTED_NODE_ACCOUNTS"),
                        Err(_) => (
                            meshfed::cert_service::DEFAULT_TRUSTED_NODE_ACCOUNTS.to_string(),
                            "the default",
                        ),
                    },
                };
                meshfed::cert_service::parse_trusted_node_accounts(&value)
                    .map_err(|e| anyhow::anyhow!("{source}: {e}"))?
            },
        })
    }

    /// The registries `--registries` names (by default Kubernetes when a kubeconfig is
    /// found, else the mock registry's bundled example), each built from its kind's
    /// flags; a kind not named must not have been given flags.
    fn registry_sources(&self) -> anyhow::Result<Vec<Arc<dyn RegistrySource>>> {
        let flags = &self.registry_flags.0;
        let names = self.registries.clone().unwrap_or_else(|| {
            let detected = KINDS.iter().find(|k| k.detected(flags));
            vec![detected.map_or("Mock", |k| k.name()).to_string()]
        });
        let common = CommonSettings {
            cluster_id: self.cluster_id.as_str().into(),
            system_namespace: self.system_namespace.clone(),
        };
        let mut selected: Vec<&str> = Vec::new();
        let mut sources = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let Some(kind) = meshfed::registries::kind(name) else {
                let supported: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
                bail!(
                    "--registries: unknown or not yet supported registry {name:?} (supported: {})",
                    supported.join(", ")
                );
            };
            sources.push(
                kind.source(flags, &common)
                    .map_err(|e| anyhow::anyhow!(e))?,
            );
            selected.push(kind.name());
        }
        for kind in KINDS.iter().filter(|k| !selected.contains(&k.name())) {
            kind.check_unselected(flags)
                .map_err(|e| anyhow::anyhow!(e))?;
        }
        Ok(sources)
    }

    /// The mesh CA the flags ask for (`kube`: with the Kubernetes registry).
    fn ca_source(&self, kube: bool) -> anyhow::Result<Option<meshfed::app::CaSource>> {
        if self.cacerts_dir.is_some() && self.ca_dir.is_none() && !kube {
            bail!(
                "--cacertsDir needs --caDir or the Kubernetes registry (the mesh CA is off without them)"
            );
        }
        if !self.enable_ca_server && (self.ca_dir.is_some() || self.cacerts_dir.is_some()) {
            bail!("--caDir and --cacertsDir need --enableCAServer=true");
        }
        let ca = match (&self.ca_dir, kube) {
            _ if !self.enable_ca_server => None,
            (Some(dir), _) => Some(meshfed::app::CaSource::Dir {
                cacerts: self.cacerts_dir.clone(),
                self_signed_dir: dir.clone(),
            }),
            (None, true) => Some(meshfed::app::CaSource::Kubernetes {
                cacerts: self.cacerts_dir.clone(),
            }),
            (None, false) => None,
        };
        if self.root_cert_file.is_some() && ca.is_none() {
            bail!("--rootCertFile needs the mesh CA (--caDir, or the Kubernetes registry)");
        }
        Ok(ca)
    }

    fn into_config(self) -> anyhow::Result<DiscoveryConfig> {
        let mut registries = DiscoveryConfig {
            mock: MockSource::None,
            ..DiscoveryConfig::default()
        };
        for source in self.registry_sources()? {
            registries.add_registry(source);
        }
        let DiscoveryConfig {
            mock,
            kubernetes,
            consul,
            registries,
            ..
        } = registries;
        let ca = self.ca_source(kubernetes.is_some())?;
        if self.debounce_max < self.debounce_after {
            bail!(
                "--debounceMax ({:?}) must not be shorter than --debounceAfter ({:?})",
                self.debounce_max,
                self.debounce_after
            );
        }
        let status = self.status_settings()?;
        Ok(DiscoveryConfig {
            grpc_addr: self.grpc_addr.0,
            secure_grpc_addr: self.secure_grpc_addr.0,
            https_addr: self.https_addr.0,
            secure: self.secure_settings()?,
            max_requests_per_second: Some(if self.max_requests_per_second > 0.0 {
                self.max_requests_per_second
            } else {
                meshfed::ads::rate::istio_default_rate(
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                )
            }),
            http_addr: self.http_addr,
            monitoring_addr: self.monitoring_addr,
            cluster_id: self.cluster_id.as_str().into(),
            mock,
            kubernetes,
            kube_config_store: self.kube_config_store,
            consul,
            registries,
            config_dir: self.config_dir,
            debounce: DebounceConfig {
                quiet: self.debounce_after,
                max: self.debounce_max,
                eds_debounce: self.eds_debounce,
            },
            push_throttle: self.push_throttle,
            remote_cluster_timeout: self.remote_cluster_timeout,
            drain_duration: self.drain_duration,
            ca,
            lease: self.leader_election.then(|| meshfed::app::LeaseSettings {
                identity: Some(self.lease_identity.clone()).filter(|i| !i.is_empty()),
                ..Default::default()
            }),
            mesh_config_map: Some(self.mesh_config_map.clone()).filter(|n| !n.is_empty()),
            xds_limits: XdsLimits {
                send_timeout: (!self.xds_send_timeout.is_zero()).then_some(self.xds_send_timeout),
                max_connections: self.max_connections,
                handshake_timeout: (!self.handshake_timeout.is_zero())
                    .then_some(self.handshake_timeout),
                max_concurrent_streams: self.max_concurrent_streams.max(1),
                connection_request_bytes: self.max_connection_request_bytes,
                max_connection_age: (!self.max_connection_age.is_zero())
                    .then_some(self.max_connection_age),
            },
            domain: self.domain,
            gateway_controller_name: flag_or_env(
                self.gateway_controller_name,
                "PILOT_GATEWAY_API_CONTROLLER_NAME",
                |s| Ok(s.to_string()),
            )?
            .unwrap_or_else(|| {
                meshfed_registry::config::gateway_api::DEFAULT_CONTROLLER.to_string()
            }),
            mesh_config: self.mesh_config,
            networks_config: self.networks_config,
            generator: GeneratorOptions {
                eds: EdsOptions {
                    send_unhealthy: self.send_unhealthy,
                    ..Default::default()
                },
                ambient: meshfed::generate::ambient::AmbientOptions {
                    default_allow_from_waypoint: flag_or_env(
                        self.default_allow_from_waypoint,
                        "DEFAULT_ALLOW_FROM_WAYPOINT",
                        parse_go_bool,
                    )?
                    .unwrap_or(false),
                    multi_network: flag_or_env(
                        self.ambient_multi_network,
                        "AMBIENT_ENABLE_MULTI_NETWORK",
                        parse_go_bool,
                    )?
                    .unwrap_or(false),
                    // Read for the life of the process.
                    local_cluster: Box::leak(self.cluster_id.clone().into_boxed_str()),
                },
            },
            debug_open: self.debug_allow_remote,
            max_config_file_size: self.max_config_file_size,
            admin_limits: meshfed::admin::AdminLimits {
                read_header_timeout: (!self.admin_read_header_timeout.is_zero())
                    .then_some(self.admin_read_header_timeout),
                idle_timeout: (!self.admin_idle_timeout.is_zero())
                    .then_some(self.admin_idle_timeout),
                max_connections: self.admin_max_connections as usize,
            },
            workload_entries: meshfed::autoregistration::Settings {
                grace_period: flag_or_env(
                    self.workload_entry_grace_period,
                    "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD",
                    parse_duration,
                )?
                .unwrap_or(meshfed::autoregistration::DEFAULT_GRACE_PERIOD),
                auto_registration: flag_or_env(
                    self.workload_entry_auto_registration,
                    "PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION",
                    parse_go_bool,
                )?
                .unwrap_or(true),
                health_checks: flag_or_env(
                    self.workload_entry_health_checks,
                    "PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS",
                    parse_go_bool,
                )?
                .unwrap_or(true),
                ..Default::default()
            },
            status,
            mcp: meshfed::app::McpSettings {
                export_registries: self.mcp_export_registries,
                export_namespaces: self.mcp_export_namespaces,
                allowed_identities: self.mcp_allowed_identities,
            },
            ..DiscoveryConfig::default()
        })
    }
}

/// A flag's value, else its Istio environment variable's (a bad value is an error
/// naming the variable).
fn flag_or_env<T>(
    flag: Option<T>,
    env: &str,
    parse: fn(&str) -> Result<T, String>,
) -> anyhow::Result<Option<T>> {
    if flag.is_some() {
        return Ok(flag);
    }
    match std::env::var(env) {
        Ok(value) if !value.is_empty() => parse(&value)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("${env}: {e}")),
        _ => Ok(None),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean")),
    }
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    // EnvoyFilter patch values are checked against Envoy's types wherever config is
    // validated.
    meshfed::generate::envoyfilter::install();
    match cli.command {
        Command::Validate(args) => validate(args),
        Command::Discovery(args) => {
            let logs = meshfed::logging::init(&args.log_output_level, args.log_as_json)
                .map_err(|e| anyhow::anyhow!("--log_output_level: {e}"))?;
            let ready_file = args.ready_file.clone();
            if let Some(path) = &ready_file {
                match std::fs::remove_file(path) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                        return Err(anyhow::Error::new(err)
                            .context(format!("--readyFile: removing {}", path.display())));
                    }
                    _ => {}
                }
            }
            let mut config = args.into_config()?;
            config.log_control = Some(logs);
            // Each proxy is a descriptor: the soft limit (often 1,024) goes up to the
            // hard one, which the operator controls.
            match meshfed::ads::transport::raise_nofile_limit() {
                Some((soft, now)) => tracing::info!(
                    soft_before = soft,
                    soft_now = now,
                    "open-files limit (RLIMIT_NOFILE): the soft limit is raised to the hard one"
                ),
                None => tracing::warn!("cannot read the open-files limit (RLIMIT_NOFILE)"),
            }
            let drain_deadline = config.drain_duration + config.drain_deadline;
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            let result = runtime.block_on(async {
                // Listening before anything starts: a SIGTERM during start-up drains
                // and exits 0 like one that comes later.
                let signals = meshfed::app::ShutdownSignals::listen()
                    .context("listening for SIGTERM and SIGINT")?;
                let server = Server::start(config).await?;
                if let Some(path) = &ready_file {
                    write_ready_file(path, &server.bound())?;
                }
                server.run_until(signals).await;
                if let Some(path) = &ready_file {
                    let _ = std::fs::remove_file(path);
                }
                anyhow::Ok(std::process::ExitCode::SUCCESS)
            });
            // Dropping the runtime would wait for every blocking-pool thread, and a
            // read stuck in the kernel (a hung file system) never returns: end within
            // the drain deadline instead.
            runtime.shutdown_timeout(drain_deadline);
            result
        }
        Command::Load(args) => load(args),
        Command::Vm(VmCommand::Bootstrap(args)) => meshfed::cli::vm::run(*args),
        Command::CreateRemoteSecret(args) => meshfed::cli::remote_secret::run(args),
        Command::Analyze(args) => meshfed::cli::analyze::run(*args),
    }
}
