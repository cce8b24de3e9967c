//! `meshfed-load` (also run as `meshfed load`): simulated proxies against a real
//! server, with changes made through a registry the server really reads, measured on
//! the client side. Its own crate and binary: the server does not ship it, and it
//! talks to the server only over ADS, HTTP (`/ready`) and the files the server follows.
//!
//! ```text
//! meshfed-load --scenario examples/scenarios/smoke.yaml [--proxies N]
//!              [--flavour sotw|delta|mixed] [--decode lean|full]
//!              [--server ADDR --mock-file PATH [--config-dir DIR] [--server-pid PID]]
//!              [--server-binary PATH] [--json FILE]
//!              [--tls-ca-dir DIR [--tls-server-name NAME]]
//! meshfed-load csr --tls-ca-dir DIR [--concurrency N] [--duration 20s]
//!              [--key-type ecdsa-p256|rsa2048 [--key-file KEY...]] [--server ADDR]
//! ```
//!
//! `csr` is the CreateCertificate throughput mode ([`csr`]); the rest of this page is
//! the scenario mode.
//!
//! # What a run does
//!
//! 1. Writes the scenario's services to a mock-registry YAML file and starts
//!    `meshfed discovery --mockRegistryFile FILE` on it (the `meshfed` binary found as
//!    [`server_binary`] says, every port 0, addresses read from the file it writes
//!    with `--readyFile`), or uses a running server that follows the file given with
//!    `--mock-file`. The config changes' VirtualService and the Sidecars of
//!    `sidecarScope: namespace` go into the server's config directory (`--configDir`;
//!    `--config-dir` for a running server).
//! 2. Connects N simulated proxies at the ramp rate, each with its own ADS stream over
//!    its own HTTP/2 connection (or over `connections` shared ones; a connection
//!    gathers the frames it writes into fewer system calls, as Envoy's write buffer
//!    does), node id
//!    `sidecar~10.x.y.z~load-<i>.<ns>~<ns>.svc.cluster.local` and metadata `NAMESPACE`,
//!    `CLUSTER_ID` (plus `GENERATOR=grpc` for proxyless clients). A sidecar subscribes
//!    like Envoy: CDS wildcard, EDS for every EDS cluster, then LDS wildcard and RDS for
//!    every route name of its listeners; a proxyless client asks LDS for `host:port` of
//!    its services, then the RDS, CDS and EDS names it learns. Every response is ACKed;
//!    subscriptions follow what CDS and LDS add and remove ([`proxy`]).
//! 3. Waits until every proxy has a complete, consistent config: every subscribed name
//!    received, every service's cluster present (sidecars) and every load assignment
//!    with all of the service's endpoints.
//! 4. Makes the churn by rewriting the file atomically (temporary file + rename): an
//!    endpoint change gives one endpoint of a random service a port of its own
//!    (`20000 + change number`), so a proxy recognises the change in the load
//!    assignment; a service add or remove shows as a cluster appearing or leaving CDS.
//!    A config change rewrites a VirtualService of `svc-0` (in a config directory the
//!    server reads with `--configDir`) whose one HTTP route is named
//!    `load-change-<change number>`, which every proxy seeing `svc-0` finds in its
//!    routes: a change that touches every sidecar. A change counts as observed by a
//!    proxy when the proxy has sent the ACK of the response that carried it. Sidecars
//!    watch every change (with `sidecarScope: namespace`, those of their namespace's
//!    services); a proxyless client watches the endpoint and config changes of its
//!    services (and no added or removed service).
//! 5. Reports (a table on stdout, `--json FILE` for the same as JSON): time until every
//!    proxy had its config, per proxy start -> complete; per kind of change, write ->
//!    last watcher's ACK (p50/p90/p99/max over the changes) and write -> each
//!    watcher's ACK; responses, resources and bytes per type; the server's RSS and CPU
//!    seconds from `/proc/<pid>` (a spawned server, or `--server-pid`). A progress line
//!    goes to stderr every second. The exit status is non-zero when a proxy never
//!    converged or a change did not reach every watcher in time.
//!
//! # Scenario file
//!
//! ```yaml
//! name: smoke                # shown in reports
//! services: 10               # services in the mock registry (svc-<j>.load-<ns>.svc.cluster.local)
//! endpointsPerService: 3     # endpoints per service
//! namespaces: 2              # services and proxies spread over load-0, load-1, ...
//! proxies: 20                # simulated proxies
//! mode: sidecar              # sidecar (Envoy) | grpc (proxyless, GENERATOR=grpc)
//!                            # | ztunnel (ambient: see below, needs flavour: delta)
//! grpcServicesPerClient: 10  # grpc mode: services each client watches
//! sidecarScope: mesh         # mesh | namespace: one Sidecar per namespace (egress ./*)
//!                            # in the server's config directory; sidecars import only
//!                            # their namespace's services
//! portsPerService: 1         # 1 | 2: HTTP 8080 (+ GRPC 7070): one cluster (EDS name) per port
//! flavour: sotw              # sotw | delta | mixed (even-numbered proxies SotW, odd Delta)
//! decode: lean               # lean | full: what each proxy decodes and keeps (below)
//! ramp: 100                  # proxies connected per second (0 = all at once)
//! connections: 0             # shared HTTP/2 connections (0 = one per proxy)
//! churn:
//!   rate: 4                  # changes per second (0 = one at a time, each once the previous is ACKed by all)
//!   endpointChanges: 20      # one endpoint of a random service gets a new port
//!   serviceAdds: 1
//!   serviceRemoves: 1        # added services first, then services set aside for it
//!   configChanges: 0         # a VirtualService route of svc-0 renamed (needs --configDir)
//!   reconnectStorm: false    # then every proxy drops its stream and connection at once
//!                            # and all reconnect at once: time until all have their
//!                            # config again (every subscription answered on the new
//!                            # stream), failed connections (resets, refused). As with
//!                            # Envoy, a Delta proxy keeps what it holds and resumes with
//!                            # its versions in initial_resource_versions; a SotW proxy
//!                            # starts over
//! settleTimeout: 60s         # ramp start -> every proxy complete
//! changeTimeout: 30s         # a change's write -> every watcher ACKed
//! seed: 1                    # which services and endpoints change
//! nodes: 0                   # ztunnel mode: nodes the pods run on (0 = one per ztunnel)
//! envoyFilters:              # EnvoyFilters in the server's config directory (sidecars)
//!   meshWide: 10             # in istio-system: Lua before the router, cluster connect
//!                            # timeout, route configuration / virtual host headers,
//!                            # listener buffer limit (in turn)
//!   selecting: 40            # each selecting one label group of sidecars (a Lua filter
//!                            # and a connect timeout), in the group's namespace
//!   groups: 0                # sidecar i carries load.meshfed.io/group: g<i % groups>
//!                            # (0: as many as selecting; a multiple of namespaces)
//!   changes: 3               # after the churn, the first selecting one rewritten, one
//!                            # at a time: proxies that received anything, server CPU
//! ```
//!
//! Every field is optional (defaults as above; `services: 10`, `proxies: 10`,
//! `endpointsPerService: 3`, `namespaces: 1`, `grpcServicesPerClient: 10`, `ramp: 0`,
//! no churn). Durations are `90s`, `1m30s` or a number of seconds. Bundled scenarios
//! are in `examples/scenarios/`. The rate should leave each change time to be pushed
//! (debounce 100 ms + file watch 50 ms by default) or changes merge into one push;
//! every merged change still counts as observed when its result arrives.
//!
//! # Ambient mode
//!
//! `mode: ztunnel` simulates ztunnels instead ([`ztunnel`], run by [`ambient_run`]):
//! every endpoint of the registry is an ambient pod on one of `nodes` nodes
//! ([`ambient`]), each ztunnel holds the Address and Authorization types over Delta
//! ADS (plaintext, or with `--tls-ca-dir` the secure port, presenting the ztunnel
//! service account's certificate), and the churn is `churn.podChanges` (a pod's `version` label),
//! `podAdds` and `podRemoves`: write -> every ztunnel's ACK, and the bytes sent for
//! each change.
//!
//! # What a proxy keeps
//!
//! Each proxy keeps, per type, the version and nonce of the last response and a table
//! of resource names, a hash of each resource's bytes and the few fields the checks
//! read: a cluster's EDS name, an assignment's endpoint count and newest marker port,
//! a listener's route names, a route table's newest config marker (proxyless: its
//! clusters) ([`tables`]). With `decode: lean` (the default) those fields are decoded
//! once per distinct resource and shared, and proxies that hold the same resources
//! share one table, so what the tool keeps per proxy does not grow with the mesh
//! (5,000 and 10,000 sidecars of a 1,000-service mesh: ~130-150 KiB of RSS per proxy
//! once converged). Responses being received still take their size until they are
//! whole: thousands of proxies waiting for their initial configs at once would hold a
//! partly received response each; `receivingConnections: N` lets only N connections
//! be partway through a response ([`gate`]). `decode: full`
//! has every proxy decode every resource itself and keep its own tables (memory per
//! proxy grows with the resources it holds), a check of the sharing at small scale.
//! Responses are read frame by frame: no receive buffer outlives its message. The
//! report gives the tool's RSS per proxy.
//!
//! # The secure port
//!
//! With `--tls-ca-dir DIR` (the server's `--caDir`; a server the tool starts gets it)
//! the proxies connect to the secure xDS address over TLS (ALPN h2, the server checked
//! against `DIR/root-cert.pem` and `--tls-server-name`), each presenting a client
//! certificate the tool issues from that CA for
//! `spiffe://cluster.local/ns/<its namespace>/sa/default` (one per namespace, made
//! once), with node metadata `SERVICE_ACCOUNT=default`. Streams the server refuses
//! with `RESOURCE_EXHAUSTED` (its new-stream rate limit, `--maxRequestsPerSecond`)
//! are retried as Envoy retries (jittered exponential backoff, 500 ms to 30 s) and
//! counted in the report.
//!
//! Each connection is a socket here and in a spawned server: the tool raises its
//! soft open-files limit to the hard limit when needed (the server inherits it), and
//! otherwise says how to raise it (`ulimit -n`).

pub mod ambient;
pub mod ambient_run;
pub mod client;
pub mod csr;
pub mod driver;
pub mod envoyfilters;
pub mod gate;
pub mod lite;
pub mod marker;
pub mod plan;
pub mod procfs;
pub mod proxy;
pub mod record;
pub mod registry;
pub mod report;
pub mod scenario;
pub mod server;
pub mod tables;
pub mod tls;
pub mod ztunnel;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use driver::{RunOptions, Target};
use scenario::{Decode, Flavour, Mode, Scenario};

/// `meshfed-load` flags; the scenario file holds the rest (see the module docs).
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Scenario YAML (examples/scenarios/*.yaml).
    #[arg(long)]
    pub scenario: PathBuf,
    /// Overrides the scenario's number of proxies.
    #[arg(long)]
    pub proxies: Option<usize>,
    /// Overrides the scenario's ADS flavour.
    #[arg(long, value_enum)]
    pub flavour: Option<Flavour>,
    /// Overrides what each proxy decodes and keeps (`lean`: shared facts and tables;
    /// `full`: every proxy decodes and keeps its own).
    #[arg(long, value_enum)]
    pub decode: Option<Decode>,
    /// Overrides the scenario's proxy kind.
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Overrides the connect ramp (proxies per second, 0 = all at once).
    #[arg(long)]
    pub ramp: Option<f64>,
    /// Overrides the number of shared HTTP/2 connections (0 = one per proxy).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Load a running server at this ADS address instead of starting one (needs
    /// --mock-file: the mock-registry file that server follows).
    /// Several addresses (comma separated) are replicas of one control plane reading
    /// the same files: proxies are spread over them and move to the next one when
    /// their stream fails.
    #[arg(long, value_delimiter = ',')]
    pub server: Vec<SocketAddr>,
    /// With --server: the file the server follows (`--mockRegistryFile`); the tool
    /// overwrites it.
    #[arg(long = "mock-file")]
    pub mock_file: Option<PathBuf>,
    /// With --server: the config directory the server reads (`--configDir`); the
    /// tool writes a VirtualService there for the scenario's config changes, and the
    /// Sidecars of `sidecarScope: namespace` (needed then).
    #[arg(long = "config-dir")]
    pub config_dir: Option<PathBuf>,
    /// With --server: the server's process id, for its memory and CPU.
    #[arg(long = "server-pid")]
    pub server_pid: Option<u32>,
    /// The `meshfed` binary to start the server from (default: `$MESHFED_BINARY`, set
    /// by `meshfed load`, else `meshfed` next to this binary, else on PATH).
    #[arg(long = "server-binary")]
    pub server_binary: Option<PathBuf>,
    /// An extra flag for the server the tool starts (repeatable), e.g.
    /// `--server-arg=--debounceAfter=50ms`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// The new-stream rate (`--maxRequestsPerSecond`) of a server the tool starts,
    /// unless a --server-arg sets it: the server's default (Istio's, 25/s on 2 cores)
    /// would throttle a 500/s ramp to 25 streams a second. 0 passes nothing (servers
    /// built before the flag existed).
    #[arg(long = "server-rate-limit", default_value_t = 1000)]
    pub server_rate_limit: u32,
    /// The server's cluster id, sent as node metadata CLUSTER_ID.
    #[arg(long = "cluster-id", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Connect over TLS to the secure port with client certificates issued from the
    /// CA in this directory (the server's --caDir; a server the tool starts is given
    /// it and its secure address is used; with --server, give the secure address).
    #[arg(long = "tls-ca-dir")]
    pub tls_ca_dir: Option<PathBuf>,
    /// With --tls-ca-dir: the name the server's certificate must carry.
    #[arg(long = "tls-server-name", default_value = tls::DEFAULT_SERVER_NAME)]
    pub tls_server_name: String,
    /// With --tls-ca-dir: the mesh trust domain of the identities.
    #[arg(long = "trust-domain", default_value = "cluster.local")]
    pub trust_domain: String,
}

impl LoadArgs {
    /// The run these flags ask for.
    pub fn options(&self) -> anyhow::Result<RunOptions> {
        let mut scenario = Scenario::load(&self.scenario)?;
        if let Some(n) = self.proxies {
            scenario.proxies = n;
        }
        if let Some(f) = self.flavour {
            scenario.flavour = f;
        }
        if let Some(d) = self.decode {
            scenario.decode = d;
        }
        if let Some(m) = self.mode {
            scenario.mode = m;
        }
        if let Some(r) = self.ramp {
            scenario.ramp = r;
        }
        if let Some(k) = self.connections {
            scenario.connections = k;
        }
        scenario
            .validate()
            .with_context(|| format!("{} with the flags given", self.scenario.display()))?;
        let target = match (self.server.first().copied(), &self.mock_file) {
            (Some(grpc), Some(mock_file)) => Target::Attach {
                grpc,
                replicas: self.server[1..].to_vec(),
                mock_file: mock_file.clone(),
                config_dir: self.config_dir.clone(),
                pid: self.server_pid,
            },
            (None, None) => {
                if self.server_pid.is_some() || self.config_dir.is_some() {
                    bail!(
                        "--server-pid and --config-dir go with --server (the tool knows those \
                         of a server it starts)"
                    );
                }
                let mut extra_args = Vec::new();
                if self.server_rate_limit > 0
                    && !self
                        .server_args
                        .iter()
                        .any(|a| a.starts_with("--maxRequestsPerSecond"))
                {
                    extra_args.push(format!("--maxRequestsPerSecond={}", self.server_rate_limit));
                }
                extra_args.extend(self.server_args.iter().cloned());
                Target::Spawn {
                    binary: server_binary(self.server_binary.as_deref())?,
                    extra_args,
                }
            }
            (Some(_), None) => bail!(
                "--server needs --mock-file: the mock-registry file that server follows \
                 (--mockRegistryFile), which the tool rewrites to make changes"
            ),
            (None, Some(_)) => bail!("--mock-file goes with --server"),
        };
        if (!self.server_args.is_empty() || self.server_binary.is_some())
            && matches!(target, Target::Attach { .. })
        {
            bail!(
                "--server-arg and --server-binary are for a server the tool starts, not one \
                 given with --server"
            );
        }
        Ok(RunOptions {
            scenario,
            target,
            cluster_id: self.cluster_id.clone(),
            progress: !self.quiet,
            tls: self.tls_ca_dir.as_ref().map(|dir| tls::TlsOptions {
                ca_dir: dir.clone(),
                server_name: self.tls_server_name.clone(),
                trust_domain: self.trust_domain.clone(),
            }),
        })
    }
}

/// The environment variable `meshfed load` sets to its own path, so the load tool it
/// runs starts servers from the same build.
pub const MESHFED_BINARY_ENV: &str = "MESHFED_BINARY";

/// The `meshfed` binary a spawned server runs: `flag` (`--server-binary`), else
/// `$MESHFED_BINARY`, else `meshfed` in this executable's directory, else the first
/// `meshfed` on PATH.
pub fn server_binary(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os(MESHFED_BINARY_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let name = format!("meshfed{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(&name)))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(&name))
            .find(|p| p.is_file())
    };
    beside.or_else(on_path).with_context(|| {
        format!(
            "no `{name}` binary next to this one nor on PATH to start the server from: build \
             it with `cargo build --release` (it lands next to meshfed-load in target/release), \
             give --server-binary PATH, or load a running server with --server"
        )
    })
}

/// Waits for Ctrl-C or SIGTERM and names it.
async fn interrupted() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return "Ctrl-C",
                _ = term.recv() => return "SIGTERM",
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    "Ctrl-C"
}

/// Stops jemalloc's heap sampling in this process: the workspace builds jemalloc with
/// it on, for the server's `/debug/pprof/heap`; the tool never reads a heap profile,
/// and each sample costs a backtrace (2-3 % of the tool's CPU in a 20,000-sidecar
/// run). Called first thing by `meshfed-load`.
pub fn stop_heap_sampling() {
    if let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref()
        && let Ok(mut ctl) = ctl.try_lock()
        && ctl.activated()
        && let Err(err) = ctl.deactivate()
    {
        eprintln!("meshfed-load: jemalloc's heap sampling stays on: {err}");
    }
}

/// `meshfed-load`: runs the scenario, prints the report, writes `--json`, and fails
/// when a proxy never converged or a change did not reach every watcher.
pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    let options = args.options()?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    if options.scenario.mode == Mode::Ztunnel {
        let summary = runtime.block_on(async {
            tokio::select! {
                summary = ambient_run::execute(options) => summary,
                signal = interrupted() => bail!("interrupted by {signal}"),
            }
        })?;
        print!("{}", summary.render());
        if let Some(path) = &args.json {
            let json = serde_json::to_string_pretty(&summary)?;
            std::fs::write(path, json + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if !summary.passed {
            bail!("{}", summary.verdict());
        }
        return Ok(());
    }
    // On Ctrl-C or SIGTERM the run is dropped, which stops a server it started and
    // removes its scratch directory.
    let summary = runtime.block_on(async {
        tokio::select! {
            summary = driver::execute(options) => summary,
            signal = interrupted() => bail!("interrupted by {signal}"),
        }
    })?;
    print!("{}", summary.render());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if !summary.passed {
        bail!("{}", summary.verdict());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LoadArgs,
    }

    #[test]
    fn heap_sampling_is_stopped() {
        // The workspace's jemalloc is built with sampling on (.cargo/config.toml).
        let ctl = jemalloc_pprof::PROF_CTL
            .as_ref()
            .expect("jemalloc built with prof");
        stop_heap_sampling();
        assert!(!ctl.try_lock().unwrap().activated());
    }

    fn spawn_args(flags: &[&str]) -> Vec<String> {
        let scenario = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/scenarios/smoke.yaml"
        );
        let mut argv = vec![
            "load",
            "--scenario",
            scenario,
            "--server-binary",
            "/bin/true",
        ];
        argv.extend_from_slice(flags);
        match Cli::parse_from(argv).args.options().unwrap().target {
            Target::Spawn { extra_args, .. } => extra_args,
            Target::Attach { .. } => panic!("a spawned server"),
        }
    }

    #[test]
    fn a_started_server_gets_a_rate_limit_that_does_not_throttle_the_ramp() {
        assert_eq!(spawn_args(&[]), ["--maxRequestsPerSecond=1000"]);
        assert_eq!(
            spawn_args(&["--server-arg=--maxRequestsPerSecond=5"]),
            ["--maxRequestsPerSecond=5"],
            "the user's own value wins"
        );
        assert!(spawn_args(&["--server-rate-limit", "0"]).is_empty());
    }
}
