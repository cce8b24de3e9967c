//! A run from start to report: write the registry, start (or attach to) the server,
//! ramp the proxies up and wait for their initial configs, make the changes and wait
//! for every watcher to ACK them, then sum up.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::sleep_until;

use super::client::{self, Connection, ProxyConfig, SharedChannels};
use super::gate::Gates;
use super::plan::Plan;
use super::procfs::{self, Machine, ProcessSample};
use super::record::{Percentiles, Recorder};
use super::registry::{ChangeKind, Registry, SIDECAR_FILE, VIRTUAL_SERVICE_FILE, write_atomically};
use super::report::{
    Changes, Convergence, KindFigures, ProcessUsage, Received, ReconnectStorm, ServerInfo, Summary,
};
use super::scenario::{Decode, Mode, Scenario, SidecarScope};
use super::server::{self, ServerUnderLoad};
use super::tls::{ClientTls, TlsOptions};

/// Which server the run loads.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start `binary discovery` on a mock-registry file in a scratch directory.
    Spawn {
        /// The meshfed binary.
        binary: PathBuf,
        /// More flags for `discovery` (e.g. `--debounceAfter=50ms`).
        extra_args: Vec<String>,
    },
    /// A server already running that follows `mock_file`.
    Attach {
        /// Its ADS address.
        grpc: SocketAddr,
        /// The ADS addresses of more replicas of the same control plane (reading the
        /// same files): proxies are spread over all, and move to the next when their
        /// stream fails.
        replicas: Vec<SocketAddr>,
        /// The mock-registry file it follows (the tool rewrites it).
        mock_file: PathBuf,
        /// The config directory it reads (`--configDir`), for config changes and the
        /// Sidecars of `sidecarScope: namespace`.
        config_dir: Option<PathBuf>,
        /// Its process, for memory and CPU.
        pid: Option<u32>,
    },
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The scenario.
    pub scenario: Scenario,
    /// The server.
    pub target: Target,
    /// The server's cluster id (node metadata `CLUSTER_ID`).
    pub cluster_id: String,
    /// Print a progress line on stderr every second.
    pub progress: bool,
    /// Connect to the secure port over TLS with client certificates from this CA (a
    /// spawned server runs its CA there).
    pub tls: Option<TlsOptions>,
}

/// How often the driver looks at the recorder while it waits.
const POLL: Duration = Duration::from_millis(5);

/// With `rate: 0`, how long no proxy may have received anything before the next change
/// is written: the push of the previous change has been delivered in full.
pub const QUIET_BETWEEN_CHANGES: Duration = Duration::from_millis(300);

/// A server the tool attaches to reads its config directory on its own time: after
/// the tool (re)wrote the Sidecars there, how long it waits before the ramp so the
/// proxies connect to a server that applies them (file watch 50 ms + debounce 100 ms
/// by default, and the push of the change).
const ATTACHED_CONFIG_SETTLE: Duration = Duration::from_secs(2);

/// Runs the scenario and returns what was measured.
pub async fn execute(options: RunOptions) -> anyhow::Result<Summary> {
    let scenario = &options.scenario;
    scenario.validate()?;
    if scenario.mode == Mode::Ztunnel {
        bail!("mode: ztunnel runs through `ambient_run::execute`, not the proxies' driver");
    }
    if options.tls.is_some()
        && scenario.connections > 0
        && !scenario.connections.is_multiple_of(scenario.namespaces)
    {
        bail!(
            "over TLS a shared connection carries one identity, so its proxies must share a \
             namespace: give a number of connections that is a multiple of the {} namespaces",
            scenario.namespaces
        );
    }
    procfs::ensure_open_files(open_files_needed(scenario))?;

    let (files, scratch) = match &options.target {
        Target::Spawn { .. } => {
            let dir = server::scratch_dir()?;
            let config_dir = dir.join("config");
            if scenario.needs_config_dir() {
                std::fs::create_dir_all(&config_dir)
                    .with_context(|| format!("creating {}", config_dir.display()))?;
            }
            let files = Files::new(
                scenario,
                dir.join("registry.json"),
                Some(config_dir),
                Some(dir.join("server-ready.json")),
            );
            (files, Some(dir))
        }
        Target::Attach {
            mock_file,
            config_dir,
            ..
        } => {
            if scenario.sidecar_scope != SidecarScope::Mesh && config_dir.is_none() {
                bail!(
                    "sidecarScope: {:?} needs the server's config directory (its --configDir) \
                     given with --config-dir: the tool writes the Sidecars there",
                    scenario.sidecar_scope
                );
            }
            if scenario.churn.config_changes > 0 && config_dir.is_none() {
                eprintln!(
                    "warning: the scenario's {} config changes are skipped: give the server's \
                     --configDir with --config-dir",
                    scenario.churn.config_changes
                );
            }
            let files = Files::new(scenario, mock_file.clone(), config_dir.clone(), None);
            (files, None)
        }
    };
    let _scratch = scratch.map(Scratch);
    run_with_files(&options, &files).await
}

/// The open files a run needs, here and in a server the tool starts (which inherits
/// the limit): one socket per connection (per proxy, or the `connections` shared),
/// and some to spare.
fn open_files_needed(scenario: &Scenario) -> u64 {
    let connections = match scenario.connections {
        0 => scenario.proxies,
        k => k.min(scenario.proxies),
    };
    connections as u64 + 256
}

/// The scratch directory of a spawned server, removed when the run ends (also when
/// it is interrupted).
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The files the tool writes and the server follows.
#[derive(Clone, Debug)]
struct Files {
    /// The mock registry.
    mock_file: PathBuf,
    /// The config directory, when the scenario needs one (config changes, Sidecars).
    config_dir: Option<PathBuf>,
    /// The VirtualService of the config changes, when there are some.
    virtual_service: Option<PathBuf>,
    /// The Sidecars, with `sidecarScope: namespace`.
    sidecars: Option<PathBuf>,
    /// Where a spawned server writes its addresses (`--readyFile`).
    ready_file: Option<PathBuf>,
    /// The EnvoyFilters of `envoyFilters`.
    envoy_filters: Option<PathBuf>,
}

impl Files {
    fn new(
        scenario: &Scenario,
        mock_file: PathBuf,
        config_dir: Option<PathBuf>,
        ready_file: Option<PathBuf>,
    ) -> Files {
        let config_dir = config_dir.filter(|_| scenario.needs_config_dir());
        let in_config_dir =
            |wanted: bool, name: &str| Some(config_dir.as_ref()?.join(name)).filter(|_| wanted);
        Files {
            virtual_service: in_config_dir(scenario.churn.config_changes > 0, VIRTUAL_SERVICE_FILE),
            sidecars: in_config_dir(
                scenario.sidecar_scope == SidecarScope::Namespace,
                SIDECAR_FILE,
            ),
            envoy_filters: in_config_dir(
                scenario.envoy_filters.enabled(),
                crate::envoyfilters::ENVOY_FILTER_FILE,
            ),
            config_dir,
            mock_file,
            ready_file,
        }
    }
}

async fn run_with_files(options: &RunOptions, files: &Files) -> anyhow::Result<Summary> {
    let scenario = &options.scenario;
    let mut registry = Registry::new(scenario);
    let kinds = registry.plan(scenario);
    let plan = Arc::new(Plan::new(scenario, &registry, &kinds));
    registry
        .write(&files.mock_file)
        .context("writing the initial mock registry")?;
    if let Some(path) = &files.virtual_service {
        write_atomically(path, registry.virtual_service(None).as_bytes())
            .context("writing the initial VirtualService")?;
    }
    let mut sidecars_changed = false;
    if let Some(path) = &files.envoy_filters {
        let text = crate::envoyfilters::render(&scenario.envoy_filters, scenario.namespaces, 0);
        if std::fs::read_to_string(path).ok().as_deref() != Some(&*text) {
            write_atomically(path, text.as_bytes()).context("writing the EnvoyFilters")?;
            sidecars_changed = true;
        }
    }
    if let Some(path) = &files.sidecars {
        let text = registry.sidecars();
        if std::fs::read_to_string(path).ok().as_deref() != Some(&*text) {
            write_atomically(path, text.as_bytes()).context("writing the Sidecars")?;
            sidecars_changed = true;
        }
    }

    let server = match &options.target {
        Target::Spawn { binary, extra_args } => {
            let ready_file = files
                .ready_file
                .as_deref()
                .context("a spawned server's ready file")?;
            ServerUnderLoad::spawn(
                binary,
                &files.mock_file,
                files.config_dir.as_deref(),
                ready_file,
                options.tls.as_ref().map(|t| t.ca_dir.as_path()),
                extra_args,
            )
            .await?
        }
        Target::Attach {
            grpc,
            replicas,
            pid,
            ..
        } => {
            if let Some(pid) = pid
                && let Ok((soft, _)) = procfs::open_files_limit(Some(*pid))
                && soft < open_files_needed(scenario)
            {
                eprintln!(
                    "warning: the server (pid {pid}) may open only {soft} files, fewer than the \
                     {} proxies' connections need",
                    scenario.proxies
                );
            }
            if sidecars_changed {
                eprintln!(
                    "wrote the Sidecars to {}; waiting {ATTACHED_CONFIG_SETTLE:?} for the server \
                     to apply them",
                    files.sidecars.as_deref().unwrap_or(Path::new("")).display()
                );
                tokio::time::sleep(ATTACHED_CONFIG_SETTLE).await;
            }
            let mut server = ServerUnderLoad::attach(*grpc, *pid)?;
            server.replicas = replicas.clone();
            server
        }
    };
    let tls = match &options.tls {
        None => None,
        Some(tls) => match ClientTls::load(tls.clone()) {
            Ok(tls) => Some(Arc::new(tls)),
            Err(err) => {
                server.stop().await;
                return Err(err);
            }
        },
    };
    let result = load(options, &plan, registry, &kinds, &server, files, tls).await;
    server.stop().await;
    result
}

/// What the progress line shows besides the recorder.
pub(crate) struct Progress {
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) pid: Option<u32>,
    pub(crate) proxies: usize,
    pub(crate) changes: usize,
    pub(crate) started: Instant,
}

impl Progress {
    pub(crate) async fn run(self) {
        let tty = std::io::stderr().is_terminal();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last: Option<(Instant, ProcessSample)> = None;
        loop {
            tick.tick().await;
            let r = &self.recorder;
            let mut line = format!(
                "[{:>6.1}s] proxies {} started, {} connected, {} converged of {}",
                self.started.elapsed().as_secs_f64(),
                r.started.load(Ordering::Relaxed),
                r.connected.load(Ordering::Relaxed),
                r.converged.load(Ordering::Relaxed),
                self.proxies
            );
            if self.changes > 0 {
                let (written, done) = r.change_progress();
                line += &format!(
                    " | changes {written} written, {done} done of {}",
                    self.changes
                );
            }
            if let Some(pid) = self.pid
                && let Ok(sample) = procfs::sample(Some(pid))
            {
                let now = Instant::now();
                let cpu = last
                    .map(|(at, prev)| procfs::cpu_share(&prev, &sample, now - at) * 100.0)
                    .unwrap_or(0.0);
                line += &format!(
                    " | server RSS {}, CPU {cpu:.0}%",
                    super::report::bytes(sample.rss_bytes)
                );
                last = Some((now, sample));
            }
            if tty {
                eprint!("\r\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
        }
    }
}

async fn load(
    options: &RunOptions,
    plan: &Arc<Plan>,
    mut registry: Registry,
    kinds: &[ChangeKind],
    server: &ServerUnderLoad,
    files: &Files,
    tls: Option<Arc<ClientTls>>,
) -> anyhow::Result<Summary> {
    let scenario = &options.scenario;
    let recorder = Arc::new(Recorder::new(
        kinds.len(),
        plan.service_count(),
        plan.namespaces,
    ));
    let sample = |when: &str| -> Option<ProcessSample> {
        let pid = server.pid?;
        match procfs::sample(Some(pid)) {
            Ok(s) => Some(s),
            Err(err) => {
                eprintln!("warning: sampling the server {when}: {err:#}");
                None
            }
        }
    };
    let machine = Machine::detect();
    let before_ramp = sample("before the ramp");
    let tool_before_ramp = procfs::sample(None).ok();
    let progress = options.progress.then(|| {
        tokio::spawn(
            Progress {
                recorder: recorder.clone(),
                pid: server.pid,
                proxies: scenario.proxies,
                changes: kinds.len(),
                started: Instant::now(),
            }
            .run(),
        )
    });

    // --- Ramp and initial convergence.
    let shared = Arc::new(SharedChannels::new(if scenario.connections > 0 {
        connect_shared(server.grpc, tls.as_ref(), plan, scenario, false).await?
    } else {
        Vec::new()
    }));
    let gates = Gates::new(scenario.receiving_connections, shared.len());
    let (report_tx, report_rx) = watch::channel(0u64);
    let (storm_tx, storm_rx) = watch::channel(0u64);
    let mut proxies = JoinSet::new();
    let ramp_start = Instant::now();
    let deadline = ramp_start + scenario.settle_timeout;
    for index in 0..scenario.proxies {
        if scenario.ramp > 0.0 {
            sleep_until(
                (ramp_start + Duration::from_secs_f64(index as f64 / scenario.ramp)).into(),
            )
            .await;
        }
        let connection = match shared.is_empty() {
            true => Connection::Own(server.addresses().into()),
            false => Connection::Shared(shared.clone()),
        };
        proxies.spawn(client::run_proxy(ProxyConfig {
            index,
            plan: plan.clone(),
            flavour: scenario.flavour,
            connection,
            window: client::receive_window(match scenario.connections {
                0 => scenario.proxies,
                k => k.min(scenario.proxies),
            }),
            cluster_id: options.cluster_id.clone(),
            recorder: recorder.clone(),
            report: report_rx.clone(),
            storm: storm_rx.clone(),
            tls: tls.clone(),
            gate: gates.for_proxy(index),
        }));
        recorder.started.fetch_add(1, Ordering::Relaxed);
    }
    let ramp_seconds = ramp_start.elapsed().as_secs_f64();
    while recorder.converged.load(Ordering::SeqCst) < scenario.proxies && Instant::now() < deadline
    {
        tokio::time::sleep(POLL).await;
    }
    let converged = recorder.converged.load(Ordering::SeqCst);
    let all_converged_seconds = (converged >= scenario.proxies)
        .then(|| (recorder.last_converged() - ramp_start).as_secs_f64());
    let after_convergence = sample("after convergence");
    let tool_after_convergence = procfs::sample(None).ok();
    let shared_after_convergence = (scenario.decode == Decode::Lean).then(|| plan.shared.stats());

    // --- Churn.
    let churn_start = Instant::now();
    let mut last_write = churn_start;
    for (index, kind) in kinds.iter().enumerate() {
        if scenario.churn.rate > 0.0 {
            let at = churn_start + Duration::from_secs_f64(index as f64 / scenario.churn.rate);
            sleep_until(at.into()).await;
        } else if index > 0 {
            let until = last_write + scenario.change_timeout;
            while !(recorder.change_done(index - 1)
                && recorder.quiet_for() >= QUIET_BETWEEN_CHANGES)
                && Instant::now() < until
            {
                tokio::time::sleep(POLL).await;
            }
        }
        let applied = registry.apply(index, *kind);
        debug_assert_eq!(applied, plan.changes[index], "the plan is the run");
        let (path, text) = if *kind == ChangeKind::Config {
            let Some(path) = files.virtual_service.clone() else {
                recorder.change_skipped(index);
                continue;
            };
            (path, registry.virtual_service(Some(index)))
        } else {
            (files.mock_file.clone(), registry.render())
        };
        let watchers = match (plan.mode, kind, applied.service) {
            // Scoped sidecars see the services (and the VirtualServices) of their own
            // namespace only.
            (Mode::Sidecar, _, Some(s)) if plan.sidecar_scope == SidecarScope::Namespace => {
                recorder.namespace_watchers[plan.service_namespace(s)].load(Ordering::SeqCst)
            }
            (Mode::Sidecar, _, _) => recorder.live_converged.load(Ordering::SeqCst),
            // Proxyless clients watch no added or removed service.
            (Mode::Grpc, ChangeKind::ServiceAdd | ChangeKind::ServiceRemove, _) => 0,
            (Mode::Grpc, _, Some(s)) => recorder.service_watchers[s].load(Ordering::SeqCst),
            (Mode::Grpc, _, None) => 0,
            (Mode::Ztunnel, _, _) => unreachable!("ztunnel runs go through crate::ambient_run"),
        };
        last_write = Instant::now();
        recorder.change_written(index, watchers, last_write);
        write_atomically(&path, text.as_bytes())
            .with_context(|| format!("writing change {index}"))?;
    }
    let until = last_write + scenario.change_timeout;
    while !(0..kinds.len()).all(|i| recorder.change_done(i)) && Instant::now() < until {
        tokio::time::sleep(POLL).await;
    }

    // --- EnvoyFilter changes: each alone, the proxies that receive anything counted.
    let mut envoy_filter_changes = Vec::new();
    if let Some(path) = &files.envoy_filters {
        for generation in 1..=scenario.envoy_filters.changes {
            let quiet_until = Instant::now() + scenario.change_timeout;
            while recorder.quiet_for() < QUIET_BETWEEN_CHANGES && Instant::now() < quiet_until {
                tokio::time::sleep(POLL).await;
            }
            let before = sample("before an EnvoyFilter change");
            recorder.count_pushes();
            let written = Instant::now();
            let text = crate::envoyfilters::render(
                &scenario.envoy_filters,
                scenario.namespaces,
                generation,
            );
            write_atomically(path, text.as_bytes())
                .with_context(|| format!("writing EnvoyFilter change {generation}"))?;
            // Done once something arrived after the write and nothing since for the
            // quiet span, or at the change timeout.
            let until = written + scenario.change_timeout;
            let last_response = |r: &Recorder| Instant::now() - r.quiet_for();
            while !(last_response(&recorder) > written
                && recorder.quiet_for() >= QUIET_BETWEEN_CHANGES)
                && Instant::now() < until
            {
                tokio::time::sleep(POLL).await;
            }
            let after = sample("after an EnvoyFilter change");
            let last = last_response(&recorder);
            envoy_filter_changes.push(crate::envoyfilters::EnvoyFilterChange {
                selected: crate::envoyfilters::selected_by(
                    &scenario.envoy_filters,
                    0,
                    scenario.proxies,
                ),
                pushed: recorder.pushed_proxies(),
                seconds: last.saturating_duration_since(written).as_secs_f64(),
                server_cpu_seconds: before
                    .zip(after)
                    .map(|(b, a)| a.cpu_seconds - b.cpu_seconds),
            });
        }
    }

    // --- Reconnect storm.
    let reconnect_storm = if scenario.churn.reconnect_storm {
        let before = sample("before the reconnect storm");
        let storm = storm(
            &recorder,
            &storm_tx,
            &shared,
            server,
            tls.as_ref(),
            plan,
            scenario,
        )
        .await?;
        let after = sample("after the reconnect storm");
        Some(ReconnectStorm {
            server_cpu_seconds: before
                .zip(after)
                .map(|(b, a)| a.cpu_seconds - b.cpu_seconds),
            ..storm
        })
    } else {
        None
    };
    let at_end = sample("at the end");
    let tool_at_end = procfs::sample(None).ok();

    // Proxies without a complete config say what they miss.
    if converged < scenario.proxies {
        let _ = report_tx.send(1);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if let Some(progress) = progress {
        progress.abort();
        if std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
    proxies.shutdown().await;
    let server_counters = match server.monitoring {
        Some(monitoring) => server::xds_counters(monitoring).await,
        None => BTreeMap::new(),
    };

    let per_proxy = Percentiles::of(&recorder.convergence_times());
    let summary = Summary {
        scenario: scenario.clone(),
        machine,
        server: ServerInfo {
            address: server
                .addresses()
                .iter()
                .map(SocketAddr::to_string)
                .collect::<Vec<_>>()
                .join(","),
            pid: server.pid,
            spawned: server.spawned,
            tls: tls.is_some(),
            counters: server_counters,
        },
        convergence: Convergence {
            proxies: scenario.proxies,
            converged,
            ramp_seconds,
            all_converged_seconds,
            per_proxy,
        },
        changes: changes(&recorder, plan, kinds),
        reconnect_storm,
        shared_after_convergence,
        received: received(&recorder),
        server_usage: usage(before_ramp, after_convergence, at_end),
        load_tool: usage(tool_before_ramp, tool_after_convergence, tool_at_end),
        unserved: recorder.unserved_names(),
        missing: recorder.missing_reports(),
        stream_failures: recorder.stream_failures.load(Ordering::Relaxed),
        refused_streams: recorder.refused.load(Ordering::Relaxed),
        nacks: recorder.nacks.load(Ordering::Relaxed),
        errors: recorder.errors(),
        passed: false,
        envoy_filter_changes,
    };
    let passed = summary.convergence.converged == summary.convergence.proxies
        && summary.changes.complete + summary.changes.unwatched == summary.changes.written
        && summary
            .reconnect_storm
            .as_ref()
            .is_none_or(|s| s.converged == s.proxies);
    Ok(Summary { passed, ..summary })
}

/// Connects the proxies' shared connections (`connections`), all at once; `lazy`:
/// plaintext ones connect on their first stream (a reconnect storm: their connect
/// failures then show as stream failures, retried).
async fn connect_shared(
    address: SocketAddr,
    tls: Option<&Arc<ClientTls>>,
    plan: &Plan,
    scenario: &Scenario,
    lazy: bool,
) -> anyhow::Result<Vec<tonic::transport::Channel>> {
    let count = scenario.connections.min(scenario.proxies);
    let mut connecting = JoinSet::new();
    for c in 0..count {
        let endpoint = client::endpoint(address, client::receive_window(count))?;
        let tls = tls.cloned();
        let namespaces = plan.namespaces;
        connecting.spawn(async move {
            let channel = match &tls {
                None if lazy => Ok(meshfed::testing::plain_connect_lazy(endpoint, address)),
                None => meshfed::testing::plain_connect(endpoint, address)
                    .await
                    .map_err(anyhow::Error::from),
                // Proxy i uses connection i % k, and k is a multiple of the
                // namespaces: connection c carries the proxies of namespace c % n.
                Some(tls) => {
                    let id = client::identity(tls, c, namespaces);
                    tls.connect(endpoint, address, &id).await
                }
            };
            (
                c,
                channel.with_context(|| format!("connecting to {address}")),
            )
        });
    }
    let mut channels: Vec<Option<tonic::transport::Channel>> = vec![None; count];
    while let Some(joined) = connecting.join_next().await {
        let (c, channel) = joined.context("a connecting task")?;
        channels[c] = Some(channel?);
    }
    Ok(channels.into_iter().flatten().collect())
}

/// Drops every proxy's stream and connection at once, then reconnects them all at
/// once; measures the time until every proxy has its config again.
async fn storm(
    recorder: &Recorder,
    storm_tx: &watch::Sender<u64>,
    shared: &SharedChannels,
    server: &ServerUnderLoad,
    tls: Option<&Arc<ClientTls>>,
    plan: &Plan,
    scenario: &Scenario,
) -> anyhow::Result<ReconnectStorm> {
    let count = |c: &std::sync::atomic::AtomicUsize| c.load(Ordering::SeqCst);
    let failures = count(&recorder.stream_failures);
    let resets = count(&recorder.connection_resets);
    let refused_connections = count(&recorder.connections_refused);
    let refused_streams = count(&recorder.refused);
    storm_tx.send_modify(|phase| *phase += 1);
    let dropped = Instant::now();
    while count(&recorder.connected) > 0 && dropped.elapsed() < STORM_DROP_TIMEOUT {
        tokio::time::sleep(POLL).await;
    }
    let still_connected = count(&recorder.connected);
    if !shared.is_empty() {
        shared.replace(connect_shared(server.grpc, tls, plan, scenario, true).await?);
    }
    let go = Instant::now();
    storm_tx.send_modify(|phase| *phase += 1);
    let deadline = go + scenario.settle_timeout;
    while count(&recorder.live_converged) < scenario.proxies && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
    let converged = count(&recorder.live_converged);
    Ok(ReconnectStorm {
        proxies: scenario.proxies,
        not_dropped: still_connected,
        converged,
        all_converged_seconds: (converged >= scenario.proxies).then(|| go.elapsed().as_secs_f64()),
        stream_failures: count(&recorder.stream_failures) - failures,
        connection_resets: count(&recorder.connection_resets) - resets,
        connections_refused: count(&recorder.connections_refused) - refused_connections,
        refused_streams: count(&recorder.refused) - refused_streams,
        server_cpu_seconds: None,
    })
}

/// How long the proxies may take to drop their streams at a reconnect storm.
const STORM_DROP_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn usage(
    before_ramp: Option<ProcessSample>,
    after_convergence: Option<ProcessSample>,
    at_end: Option<ProcessSample>,
) -> Option<ProcessUsage> {
    Some(ProcessUsage {
        before_ramp: before_ramp?,
        after_convergence: after_convergence?,
        at_end: at_end?,
    })
}

fn changes(recorder: &Recorder, plan: &Plan, kinds: &[ChangeKind]) -> Changes {
    let mut out = Changes {
        planned: kinds.len(),
        ..Changes::default()
    };
    // Per kind: figures, last-ACK latencies, every-ACK latencies, total watchers.
    #[derive(Default)]
    struct Acc {
        figures: KindFigures,
        first: Vec<Duration>,
        last: Vec<Duration>,
        every: Vec<Duration>,
        watchers: usize,
    }
    let mut per_kind: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for (index, kind) in kinds.iter().enumerate() {
        let outcome = recorder.change_outcome(index);
        if outcome.skipped {
            out.skipped += 1;
            continue;
        }
        if !outcome.written {
            continue;
        }
        out.written += 1;
        if outcome.watchers == 0 {
            out.unwatched += 1;
        } else if outcome.complete() {
            out.complete += 1;
        }
        debug_assert_eq!(plan.changes[index].kind, *kind);
        let key = match kind {
            ChangeKind::Endpoint => "endpoint",
            ChangeKind::ServiceAdd => "service_add",
            ChangeKind::ServiceRemove => "service_remove",
            ChangeKind::Config => "config",
        };
        let entry = per_kind.entry(key).or_default();
        entry.figures.written += 1;
        if outcome.watchers > 0 && outcome.complete() {
            entry.figures.complete += 1;
        }
        entry.watchers += outcome.watchers;
        if let Some(first) = outcome.first_ack() {
            entry.first.push(first);
        }
        if let Some(last) = outcome.last_ack() {
            entry.last.push(last);
        }
        entry.every.extend(outcome.latencies.iter().copied());
    }
    out.by_kind = per_kind
        .into_iter()
        .map(|(key, acc)| {
            let mut figures = acc.figures;
            figures.mean_watchers = acc.watchers as f64 / figures.written.max(1) as f64;
            figures.first_ack = Percentiles::of(&acc.first);
            figures.last_ack = Percentiles::of(&acc.last);
            figures.every_ack = Percentiles::of(&acc.every);
            (key, figures)
        })
        .collect();
    out
}

fn received(recorder: &Recorder) -> BTreeMap<&'static str, Received> {
    let mut out = BTreeMap::new();
    let mut total = Received::default();
    for type_url in crate::proxy::FOLLOWED {
        let t = &recorder.types[type_url.index()];
        let r = Received {
            responses: t.responses.load(Ordering::Relaxed),
            resources: t.resources.load(Ordering::Relaxed),
            bytes: t.bytes.load(Ordering::Relaxed),
        };
        total.responses += r.responses;
        total.resources += r.resources;
        total.bytes += r.bytes;
        out.insert(type_url.short(), r);
    }
    out.insert("total", total);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Churn, Flavour};
    use meshfed::testing::FakeServer;

    /// A tiny scenario against an in-process server following a mock-registry file
    /// (and a config directory, with `config` or Sidecars).
    async fn tiny(mode: Mode, flavour: Flavour, config: bool) -> Summary {
        tiny_scoped(mode, flavour, config, SidecarScope::Mesh).await
    }

    async fn tiny_scoped(
        mode: Mode,
        flavour: Flavour,
        config: bool,
        sidecar_scope: SidecarScope,
    ) -> Summary {
        let scenario = Scenario {
            name: "tiny".into(),
            services: 4,
            endpoints_per_service: 2,
            namespaces: 2,
            proxies: 6,
            mode,
            grpc_services_per_client: 2,
            sidecar_scope,
            flavour,
            ramp: 0.0,
            connections: if flavour == Flavour::Delta { 2 } else { 0 },
            churn: Churn {
                rate: 0.0,
                endpoint_changes: 4,
                service_adds: 1,
                service_removes: 1,
                config_changes: 1,
                reconnect_storm: false,
                ..Churn::default()
            },
            settle_timeout: Duration::from_secs(10),
            change_timeout: Duration::from_secs(5),
            seed: 7,
            ..Scenario::default()
        };
        let with_config_dir = config || sidecar_scope != SidecarScope::Mesh;
        run_tiny(scenario, with_config_dir).await
    }

    /// Runs `scenario` against an in-process server following a mock-registry file
    /// (and a config directory, `with_config_dir`).
    async fn run_tiny(scenario: Scenario, with_config_dir: bool) -> Summary {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.yaml");
        std::fs::write(&file, "services: []\n").unwrap();
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir).unwrap();
        let server_config_dir = with_config_dir.then(|| config_dir.clone());
        let server = FakeServer::builder()
            .mock_registry_file(&file)
            .configure(|c| c.config_dir = server_config_dir)
            .start()
            .await
            .unwrap();
        let summary = execute(RunOptions {
            scenario,
            target: Target::Attach {
                grpc: server.grpc_addr(),
                replicas: Vec::new(),
                mock_file: file,
                config_dir: with_config_dir.then_some(config_dir),
                pid: None,
            },
            cluster_id: "Kubernetes".into(),
            progress: false,
            tls: None,
        })
        .await
        .unwrap();
        server.shutdown().await;
        summary
    }

    /// 6 sidecars over 2 namespaces, no churn, over TLS against an in-process server
    /// running its CA, with this new-stream rate (none: unlimited).
    async fn tiny_tls(rate: Option<f64>, connections: usize) -> Summary {
        use meshfed::app::CaSource;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.yaml");
        std::fs::write(&file, "services: []\n").unwrap();
        let ca_dir = dir.path().join("ca");
        let server = FakeServer::builder()
            .mock_registry_file(&file)
            .configure(|c| {
                c.ca = Some(CaSource::Dir {
                    cacerts: None,
                    self_signed_dir: ca_dir.clone(),
                });
                c.max_requests_per_second = rate;
            })
            .start()
            .await
            .unwrap();
        let scenario = Scenario {
            name: "tiny-tls".into(),
            services: 4,
            endpoints_per_service: 2,
            namespaces: 2,
            proxies: 6,
            connections,
            settle_timeout: Duration::from_secs(20),
            ..Scenario::default()
        };
        let summary = execute(RunOptions {
            scenario,
            target: Target::Attach {
                grpc: server.secure_grpc_addr(),
                replicas: Vec::new(),
                mock_file: file,
                config_dir: None,
                pid: None,
            },
            cluster_id: "Kubernetes".into(),
            progress: false,
            tls: Some(TlsOptions {
                ca_dir,
                server_name: crate::tls::DEFAULT_SERVER_NAME.into(),
                trust_domain: "cluster.local".into(),
            }),
        })
        .await
        .unwrap();
        server.shutdown().await;
        summary
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sidecars_converge_over_tls_with_client_certificates() {
        let summary = tiny_tls(None, 0).await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert!(summary.server.tls);
        assert_eq!(summary.convergence.converged, 6, "{report}");
        assert_eq!(summary.stream_failures, 0, "{report}");
        assert_eq!(summary.refused_streams, 0, "{report}");
        assert!(report.contains("(TLS, client certificates)"), "{report}");
        // Shared connections: one identity each, so one namespace each.
        let shared = tiny_tls(None, 2).await;
        assert!(shared.passed, "{}", shared.render());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_refused_by_the_rate_limit_are_retried() {
        // One new stream a second, burst one, a second's wait: of 6 streams opened at
        // once, every one after the second is refused with RESOURCE_EXHAUSTED unless it
        // arrives a second after the first (slow as a loaded machine may be, three
        // arrive within that), and they come back until all are in.
        let summary = tiny_tls(Some(1.0), 0).await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.convergence.converged, 6, "{report}");
        assert!(summary.refused_streams > 0, "{report}");
        assert_eq!(
            summary.stream_failures, 0,
            "refusals are not failures: {report}"
        );
        assert!(report.contains("RESOURCE_EXHAUSTED"), "{report}");
    }

    #[test]
    fn shared_connections_need_a_descriptor_each_not_one_per_proxy() {
        let scenario = |proxies, connections| Scenario {
            proxies,
            connections,
            ..Scenario::default()
        };
        assert_eq!(open_files_needed(&scenario(20_000, 2_000)), 2_256);
        assert_eq!(open_files_needed(&scenario(5_000, 0)), 5_256);
        assert_eq!(open_files_needed(&scenario(10, 50)), 266);
    }

    #[test]
    fn receive_windows_share_a_budget() {
        assert_eq!(client::receive_window(1), 16 << 20);
        assert_eq!(client::receive_window(64), 16 << 20);
        assert_eq!(client::receive_window(2_000), 536_870);
        assert_eq!(client::receive_window(20_000), 256 << 10);
        assert!(2_000 * u64::from(client::receive_window(2_000)) <= client::RECEIVE_BUDGET);
    }

    #[test]
    fn refused_backoff_is_envoys() {
        for index in 0..50 {
            assert!(client::refused_backoff(index, 1) < Duration::from_millis(500));
            assert!(client::refused_backoff(index, 3) < Duration::from_secs(2));
            assert!(client::refused_backoff(index, 40) < Duration::from_secs(30));
        }
        let spread: std::collections::BTreeSet<_> =
            (0..50).map(|i| client::refused_backoff(i, 4)).collect();
        assert!(spread.len() > 40, "jittered per proxy");
    }

    #[tokio::test]
    async fn tls_shared_connections_must_follow_namespaces() {
        let scenario = Scenario {
            namespaces: 2,
            proxies: 6,
            connections: 3,
            ..Scenario::default()
        };
        let err = execute(RunOptions {
            scenario,
            target: Target::Attach {
                grpc: "127.0.0.1:1".parse().unwrap(),
                replicas: Vec::new(),
                mock_file: "/nonexistent".into(),
                config_dir: None,
                pid: None,
            },
            cluster_id: "Kubernetes".into(),
            progress: false,
            tls: Some(TlsOptions {
                ca_dir: "/nonexistent".into(),
                server_name: "x".into(),
                trust_domain: "cluster.local".into(),
            }),
        })
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("multiple of the 2 namespaces"),
            "{err}"
        );
    }

    fn check(summary: &Summary) {
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.convergence.converged, 6, "{report}");
        assert!(summary.convergence.all_converged_seconds.is_some());
        let changes = &summary.changes;
        assert_eq!(
            (changes.planned, changes.written, changes.skipped),
            (7, 6, 1),
            "{report}"
        );
        assert_eq!(changes.complete + changes.unwatched, 6, "{report}");
        let endpoint = &changes.by_kind["endpoint"];
        assert_eq!((endpoint.written, endpoint.complete), (4, 4), "{report}");
        assert_eq!(endpoint.last_ack.count, 4);
        assert_eq!(endpoint.first_ack.count, 4);
        assert!(
            endpoint.first_ack.max_ms <= endpoint.last_ack.max_ms,
            "{report}"
        );
        assert!(report.contains("first ACK p50"), "{report}");
        for t in ["cds", "eds", "lds"] {
            assert!(summary.received[t].bytes > 0, "{t}: {report}");
        }
        assert_eq!(summary.nacks, 0, "{report}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sidecars_sotw_converge_and_observe_every_change() {
        let summary = tiny(Mode::Sidecar, Flavour::Sotw, false).await;
        check(&summary);
        let changes = &summary.changes;
        assert_eq!(changes.unwatched, 0, "sidecars watch every change");
        for kind in ["service_add", "service_remove"] {
            let k = &changes.by_kind[kind];
            assert_eq!((k.written, k.complete), (1, 1), "{kind}");
            assert_eq!(k.mean_watchers, 6.0);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_ports_mixed_flavours_and_a_reconnect_storm() {
        // 6 sidecars, alternating SotW and Delta, over 2 shared connections, on 4
        // services of 2 ports each: every sidecar converges on 8 clusters, sees each
        // endpoint change in the HTTP port's assignment, then all drop their streams and
        // connections and reconnect at once and have their config again. Over shared
        // connections, one connection receives at a time.
        for decode in [Decode::Lean, Decode::Full] {
            for connections in [2, 0] {
                let scenario = Scenario {
                    name: "tiny-2ports".into(),
                    services: 4,
                    ports_per_service: 2,
                    endpoints_per_service: 2,
                    namespaces: 2,
                    proxies: 6,
                    flavour: Flavour::Mixed,
                    decode,
                    connections,
                    // Shared connections take turns receiving (one at a time).
                    receiving_connections: connections.min(1),
                    churn: Churn {
                        endpoint_changes: 3,
                        reconnect_storm: true,
                        ..Churn::default()
                    },
                    settle_timeout: Duration::from_secs(10),
                    change_timeout: Duration::from_secs(5),
                    ..Scenario::default()
                };
                let summary = run_tiny(scenario, false).await;
                let report = summary.render();
                assert!(summary.passed, "{decode:?}, {connections}: {report}");
                assert_eq!(summary.convergence.converged, 6, "{report}");
                let endpoint = &summary.changes.by_kind["endpoint"];
                assert_eq!((endpoint.written, endpoint.complete), (3, 3), "{report}");
                assert_eq!(endpoint.mean_watchers, 6.0, "{report}");
                let storm = summary.reconnect_storm.as_ref().expect("a storm");
                assert_eq!((storm.proxies, storm.converged), (6, 6), "{report}");
                assert!(storm.all_converged_seconds.is_some(), "{report}");
                assert_eq!(storm.not_dropped, 0, "{report}");
                assert!(report.contains("reconnect storm"), "{report}");
                assert!(report.contains("x 2 ports"), "{report}");
                // Converged means 8 service clusters each (`ProxyState::gap`), and
                // their 8 assignments: the 3 SotW proxies receive them again after
                // the storm, the 3 Delta ones resume with what they hold.
                assert!(
                    summary.received["eds"].resources >= (2 * 3 + 3) * 8,
                    "{report}"
                );
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sidecars_delta_over_shared_connections() {
        check(&tiny(Mode::Sidecar, Flavour::Delta, false).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxyless_clients_converge_and_observe_their_services() {
        let summary = tiny(Mode::Grpc, Flavour::Sotw, false).await;
        check(&summary);
        assert_eq!(
            summary.changes.unwatched, 2,
            "no client watches added/removed services"
        );
        assert!(summary.received["rds"].resources > 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn virtual_service_changes_reach_every_sidecar() {
        let summary = tiny(Mode::Sidecar, Flavour::Sotw, true).await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.changes.skipped, 0, "{report}");
        let config = &summary.changes.by_kind["config"];
        assert_eq!((config.written, config.complete), (1, 1), "{report}");
        assert_eq!(config.mean_watchers, 6.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn envoy_filter_changes_push_only_the_sidecars_they_select() {
        // 8 sidecars over 2 namespaces in 2 label groups; 5 mesh-wide EnvoyFilters (one
        // of each patch kind) and one per group. Rewriting group 0's EnvoyFilter must
        // reach its 4 sidecars and no other.
        let scenario = Scenario {
            name: "tiny-envoyfilter".into(),
            services: 4,
            endpoints_per_service: 2,
            namespaces: 2,
            proxies: 8,
            settle_timeout: Duration::from_secs(10),
            change_timeout: Duration::from_secs(5),
            envoy_filters: crate::scenario::EnvoyFilters {
                mesh_wide: 5,
                selecting: 2,
                groups: 0,
                changes: 2,
            },
            ..Scenario::default()
        };
        let summary = run_tiny(scenario, true).await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.nacks, 0, "{report}");
        assert_eq!(summary.envoy_filter_changes.len(), 2, "{report}");
        for change in &summary.envoy_filter_changes {
            assert_eq!((change.selected, change.pushed), (4, 4), "{report}");
        }
        assert!(report.contains("EnvoyFilter changes"), "{report}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn namespace_scoped_sidecars_watch_their_namespace() {
        // 6 sidecars over 2 namespaces, each scoped to its own by a Sidecar: every
        // change (to a service, or the VirtualService of svc-0 in load-0) is watched
        // by the 3 sidecars of one namespace.
        let summary =
            tiny_scoped(Mode::Sidecar, Flavour::Sotw, true, SidecarScope::Namespace).await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.convergence.converged, 6, "{report}");
        let changes = &summary.changes;
        assert_eq!(
            (changes.planned, changes.written, changes.skipped),
            (7, 7, 0),
            "{report}"
        );
        assert_eq!(changes.complete, 7, "{report}");
        for kind in ["endpoint", "service_add", "service_remove", "config"] {
            let k = &changes.by_kind[kind];
            assert_eq!(k.written, k.complete, "{kind}: {report}");
            assert_eq!(k.mean_watchers, 3.0, "{kind}: {report}");
        }
        // Converged means each sidecar held the clusters of its namespace's 2 services
        // and none of the other namespace's (`ProxyState::gap`).
        assert_eq!(summary.nacks, 0, "{report}");
    }
}
