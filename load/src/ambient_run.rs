//! A `mode: ztunnel` run from start to report: write the ambient registry
//! ([`crate::ambient`]), start (or attach to) the server, connect one simulated
//! ztunnel per node ([`crate::ztunnel`]) and wait until every one holds every
//! Workload and Service, then make the pod changes one at a time (or at
//! `churn.rate`) and measure, per change, write -> each ztunnel's ACK of the response
//! that showed it, and the bytes all ztunnels received for it (everything received
//! from its write to the next change's, which with `rate: 0` is that change's push
//! alone).
//!
//! The ztunnels use the plaintext port, or with `--tls-ca-dir` the secure port as
//! ztunnel does (TLS 1.3, ALPN h2), authenticated by a client certificate of the
//! ztunnel service account `spiffe://<trust domain>/ns/istio-system/sa/ztunnel`
//! issued from the server's CA (ztunnel sends a Kubernetes token instead; the server
//! reviews it once per connection, which a run without Kubernetes cannot simulate).

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::sleep_until;

use super::ambient::{AmbientPlan, AmbientRegistry, PodChangeKind};
use super::driver::{Progress, QUIET_BETWEEN_CHANGES, RunOptions, Scratch, Target, usage};
use super::procfs::{self, Machine, ProcessSample};
use super::record::{Percentiles, Recorder};
use super::registry::write_atomically;
use super::report::{Convergence, ProcessUsage, Received, bytes};
use super::scenario::Scenario;
use super::server::{self, ServerUnderLoad};
use super::tls::ClientTls;
use super::ztunnel::{Leftover, TYPES, ZtunnelConfig, run_ztunnel};

/// How often the driver looks at the recorder while it waits.
const POLL: Duration = Duration::from_millis(5);

/// The figures of one kind of pod change.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PodChangeFigures {
    /// Written.
    pub written: usize,
    /// ACKed by every ztunnel watching.
    pub complete: usize,
    /// Mean ztunnels watching per change.
    pub mean_watchers: f64,
    /// Per change: write -> the last ztunnel's ACK.
    pub last_ack: Percentiles,
    /// Per (change, ztunnel): write -> that ztunnel's ACK.
    pub every_ack: Percentiles,
    /// Mean bytes all ztunnels received per change (both types).
    pub bytes_per_change: f64,
    /// The same per watching ztunnel.
    pub bytes_per_ztunnel: f64,
    /// Mean resources (and removals) per watching ztunnel per change.
    pub resources_per_ztunnel: f64,
    /// Mean responses per watching ztunnel per change.
    pub responses_per_ztunnel: f64,
}

/// Everything a ztunnel run measured.
#[derive(Clone, Debug, Serialize)]
pub struct AmbientSummary {
    /// The scenario as run.
    pub scenario: Scenario,
    /// Where it ran.
    pub machine: Machine,
    /// Load averages when the run ended (the machine may be shared).
    pub load_average_at_end: Option<[f64; 3]>,
    /// The server's ADS address.
    pub server: String,
    /// Started by the tool.
    pub spawned: bool,
    /// The ztunnels used the secure port (TLS, the ztunnel service account's
    /// certificate).
    pub tls: bool,
    /// Pods (Workloads) and services in the starting registry, nodes they run on.
    pub pods: usize,
    /// Services.
    pub services: usize,
    /// Nodes.
    pub nodes: usize,
    /// Every ztunnel's initial config.
    pub convergence: Convergence,
    /// Pod changes by kind (`pod_change`, `pod_add`, `pod_remove`).
    pub changes: BTreeMap<&'static str, PodChangeFigures>,
    /// Responses received by all ztunnels, by type (`wds`, `authorization`,
    /// `total`).
    pub received: BTreeMap<&'static str, Received>,
    /// The server's memory and CPU, when it is a local process.
    pub server_usage: Option<ProcessUsage>,
    /// The load tool's.
    pub load_tool: Option<ProcessUsage>,
    /// The server's xDS counters that are not zero at the end (a server the tool
    /// started).
    pub server_counters: BTreeMap<String, f64>,
    /// Resources sent to a ztunnel at the version it already held.
    pub redundant_resources: u64,
    /// Address names the ztunnels were sent that the run never made (a few).
    pub unexpected: Vec<String>,
    /// What unconverged ztunnels missed at the deadline (a few).
    pub missing: Vec<String>,
    /// Failed streams.
    pub stream_failures: usize,
    /// Responses NACKed.
    pub nacks: u64,
    /// The first distinct errors.
    pub errors: Vec<String>,
    /// Every ztunnel converged and every change reached every watching ztunnel.
    pub passed: bool,
}

/// Runs a ztunnel scenario.
pub async fn execute(options: RunOptions) -> anyhow::Result<AmbientSummary> {
    let scenario = &options.scenario;
    scenario.validate()?;
    procfs::ensure_open_files(scenario.proxies as u64 + 256)?;
    let mut registry = AmbientRegistry::new(scenario);
    let kinds = registry.plan(scenario);
    let plan = Arc::new(AmbientPlan::new(&registry, &kinds));
    let (mock_file, ready_file, scratch) = match &options.target {
        Target::Spawn { .. } => {
            let dir = server::scratch_dir()?;
            (
                dir.join("registry.json"),
                Some(dir.join("server-ready.json")),
                Some(Scratch(dir)),
            )
        }
        Target::Attach {
            mock_file,
            replicas,
            ..
        } => {
            if !replicas.is_empty() {
                bail!("mode: ztunnel loads one server (no replicas)");
            }
            (mock_file.clone(), None, None)
        }
    };
    let _scratch = scratch;
    write_atomically(&mock_file, registry.render().as_bytes())
        .context("writing the initial mock registry")?;
    let server = match &options.target {
        Target::Spawn { binary, extra_args } => {
            let ready = ready_file
                .as_deref()
                .context("a spawned server's ready file")?;
            let ca_dir = options.tls.as_ref().map(|t| t.ca_dir.as_path());
            ServerUnderLoad::spawn(binary, &mock_file, None, ready, ca_dir, extra_args).await?
        }
        Target::Attach { grpc, pid, .. } => ServerUnderLoad::attach(*grpc, *pid)?,
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
    let result = load(
        &options,
        plan,
        &mut registry,
        &kinds,
        &server,
        &mock_file,
        tls,
    )
    .await;
    server.stop().await;
    result
}

fn total(recorder: &Recorder) -> Received {
    let mut r = Received::default();
    for t in TYPES {
        let c = &recorder.types[t.index()];
        r.responses += c.responses.load(Ordering::SeqCst);
        r.resources += c.resources.load(Ordering::SeqCst);
        r.bytes += c.bytes.load(Ordering::SeqCst);
    }
    r
}

async fn load(
    options: &RunOptions,
    plan: Arc<AmbientPlan>,
    registry: &mut AmbientRegistry,
    kinds: &[PodChangeKind],
    server: &ServerUnderLoad,
    mock_file: &std::path::Path,
    tls: Option<Arc<ClientTls>>,
) -> anyhow::Result<AmbientSummary> {
    let scenario = &options.scenario;
    let recorder = Arc::new(Recorder::new(kinds.len(), 0, 1));
    let sample = |when: &str| -> Option<ProcessSample> {
        let pid = server.pid?;
        procfs::sample(Some(pid))
            .map_err(|err| eprintln!("warning: sampling the server {when}: {err:#}"))
            .ok()
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
    let leftovers = Arc::new(Mutex::new(Leftover::default()));
    let (report_tx, report_rx) = watch::channel(0u64);
    let mut ztunnels = JoinSet::new();
    let ramp_start = Instant::now();
    let deadline = ramp_start + scenario.settle_timeout;
    for index in 0..scenario.proxies {
        if scenario.ramp > 0.0 {
            let at = ramp_start + Duration::from_secs_f64(index as f64 / scenario.ramp);
            sleep_until(at.into()).await;
        }
        ztunnels.spawn(run_ztunnel(
            ZtunnelConfig {
                index,
                plan: plan.clone(),
                address: server.grpc,
                tls: tls.clone(),
                cluster_id: options.cluster_id.clone(),
                recorder: recorder.clone(),
                report: report_rx.clone(),
                ztunnels: scenario.proxies,
            },
            leftovers.clone(),
        ));
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
    // The pushes of the initial configs are over before the first change.
    let quiet_until = Instant::now() + scenario.change_timeout;
    while recorder.quiet_for() < QUIET_BETWEEN_CHANGES && Instant::now() < quiet_until {
        tokio::time::sleep(POLL).await;
    }
    let after_convergence = sample("after convergence");
    let tool_after_convergence = procfs::sample(None).ok();

    // --- Pod changes; per change, what all ztunnels received until the next one.
    let mut received_at_write: Vec<Received> = Vec::with_capacity(kinds.len() + 1);
    let churn_start = Instant::now();
    let mut last_write = churn_start;
    for (index, kind) in kinds.iter().enumerate() {
        if scenario.churn.rate > 0.0 {
            let at = churn_start + Duration::from_secs_f64(index as f64 / scenario.churn.rate);
            sleep_until(at.into()).await;
        } else if index > 0 {
            wait_done(&recorder, index - 1, last_write + scenario.change_timeout).await;
        }
        let applied = registry.apply(index, *kind);
        debug_assert_eq!(applied, plan.changes[index], "the plan is the run");
        let watchers = recorder.live_converged.load(Ordering::SeqCst);
        received_at_write.push(total(&recorder));
        last_write = Instant::now();
        recorder.change_written(index, watchers, last_write);
        write_atomically(mock_file, registry.render().as_bytes())
            .with_context(|| format!("writing change {index}"))?;
    }
    if !kinds.is_empty() {
        wait_done(
            &recorder,
            kinds.len() - 1,
            last_write + scenario.change_timeout,
        )
        .await;
        let until = last_write + scenario.change_timeout;
        while !(0..kinds.len()).all(|i| recorder.change_done(i)) && Instant::now() < until {
            tokio::time::sleep(POLL).await;
        }
    }
    received_at_write.push(total(&recorder));
    let at_end = sample("at the end");
    let tool_at_end = procfs::sample(None).ok();

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
    ztunnels.shutdown().await;
    let server_counters = match server.monitoring {
        Some(monitoring) => server::xds_counters(monitoring).await,
        None => BTreeMap::new(),
    };
    let leftover = leftovers.lock().expect("leftovers").clone();
    let changes = change_figures(&recorder, kinds, &received_at_write);
    let mut received = BTreeMap::new();
    for t in TYPES {
        let c = &recorder.types[t.index()];
        received.insert(
            t.short(),
            Received {
                responses: c.responses.load(Ordering::Relaxed),
                resources: c.resources.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
            },
        );
    }
    received.insert("total", total(&recorder));
    let passed = converged == scenario.proxies
        && changes.values().all(|k| k.complete == k.written)
        && leftover.unexpected.is_empty();
    Ok(AmbientSummary {
        scenario: scenario.clone(),
        machine,
        load_average_at_end: procfs::load_average(),
        server: server.grpc.to_string(),
        spawned: server.spawned,
        tls: tls.is_some(),
        pods: plan.initial_count - plan.services,
        services: plan.services,
        nodes: scenario.node_count(),
        convergence: Convergence {
            proxies: scenario.proxies,
            converged,
            ramp_seconds,
            all_converged_seconds,
            per_proxy: Percentiles::of(&recorder.convergence_times()),
        },
        changes,
        received,
        server_usage: usage(before_ramp, after_convergence, at_end),
        load_tool: usage(tool_before_ramp, tool_after_convergence, tool_at_end),
        server_counters,
        redundant_resources: leftover.redundant,
        unexpected: leftover.unexpected,
        missing: recorder.missing_reports(),
        stream_failures: recorder.stream_failures.load(Ordering::Relaxed),
        nacks: recorder.nacks.load(Ordering::Relaxed),
        errors: recorder.errors(),
        passed,
    })
}

/// Waits until change `index` reached every watcher and no ztunnel has received
/// anything for [`QUIET_BETWEEN_CHANGES`], or `until`.
async fn wait_done(recorder: &Recorder, index: usize, until: Instant) {
    while !(recorder.change_done(index) && recorder.quiet_for() >= QUIET_BETWEEN_CHANGES)
        && Instant::now() < until
    {
        tokio::time::sleep(POLL).await;
    }
}

/// The figures per kind; `received[i]` is what all ztunnels had received when change
/// `i` was written (and the last entry at the end).
fn change_figures(
    recorder: &Recorder,
    kinds: &[PodChangeKind],
    received: &[Received],
) -> BTreeMap<&'static str, PodChangeFigures> {
    #[derive(Default)]
    struct Acc {
        figures: PodChangeFigures,
        last: Vec<Duration>,
        every: Vec<Duration>,
        watchers: usize,
        bytes: u64,
        resources: u64,
        responses: u64,
    }
    let mut per_kind: BTreeMap<&'static str, Acc> = BTreeMap::new();
    for (index, kind) in kinds.iter().enumerate() {
        let outcome = recorder.change_outcome(index);
        if !outcome.written {
            continue;
        }
        let acc = per_kind.entry(kind.label()).or_default();
        acc.figures.written += 1;
        if outcome.complete() {
            acc.figures.complete += 1;
        }
        acc.watchers += outcome.watchers;
        if let Some(last) = outcome.last_ack() {
            acc.last.push(last);
        }
        acc.every.extend(outcome.latencies.iter().copied());
        if let (Some(from), Some(to)) = (received.get(index), received.get(index + 1)) {
            acc.bytes += to.bytes - from.bytes;
            acc.resources += to.resources - from.resources;
            acc.responses += to.responses - from.responses;
        }
    }
    per_kind
        .into_iter()
        .map(|(key, acc)| {
            let n = acc.figures.written.max(1) as f64;
            let watchers = acc.watchers.max(1) as f64;
            let figures = PodChangeFigures {
                mean_watchers: acc.watchers as f64 / n,
                last_ack: Percentiles::of(&acc.last),
                every_ack: Percentiles::of(&acc.every),
                bytes_per_change: acc.bytes as f64 / n,
                bytes_per_ztunnel: acc.bytes as f64 / watchers,
                resources_per_ztunnel: acc.resources as f64 / watchers,
                responses_per_ztunnel: acc.responses as f64 / watchers,
                ..acc.figures
            };
            (key, figures)
        })
        .collect()
}

fn ms(p: f64) -> String {
    if p >= 10_000.0 {
        format!("{:.1} s", p / 1e3)
    } else {
        format!("{p:.1} ms")
    }
}

impl AmbientSummary {
    /// One line saying what failed, or that all passed.
    pub fn verdict(&self) -> String {
        let c = &self.convergence;
        let mut problems = Vec::new();
        if c.converged < c.proxies {
            problems.push(format!(
                "{} of {} ztunnels never held every workload and service",
                c.proxies - c.converged,
                c.proxies
            ));
        }
        for (kind, k) in &self.changes {
            if k.complete < k.written {
                problems.push(format!(
                    "{} of {} {kind}s did not reach every ztunnel",
                    k.written - k.complete,
                    k.written
                ));
            }
        }
        if !self.unexpected.is_empty() {
            problems.push(format!(
                "the ztunnels were sent addresses the run never made: {:?}",
                self.unexpected
            ));
        }
        if problems.is_empty() {
            "every ztunnel converged and every pod change reached every ztunnel".into()
        } else {
            problems.join("; ")
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let s = &self.scenario;
        let _ = writeln!(
            out,
            "\nmeshfed load: scenario {} ({} ztunnels (Delta ADS, {}), {} ambient pods \
             = {} services x {} pods over {} nodes, {} namespaces)",
            s.name,
            s.proxies,
            if self.tls {
                "TLS, secure port"
            } else {
                "plaintext"
            },
            self.pods,
            self.services,
            s.endpoints_per_service,
            self.nodes,
            s.namespaces
        );
        let load = |l: Option<[f64; 3]>| {
            l.map(|l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]))
                .unwrap_or_else(|| "?".into())
        };
        let m = &self.machine;
        let _ = writeln!(
            out,
            "machine: {} CPUs, {} RAM; load average {} at the start, {} at the end",
            m.cpus,
            bytes(m.memory_bytes),
            load(m.load_average),
            load(self.load_average_at_end)
        );
        let _ = writeln!(
            out,
            "server: {}{}",
            self.server,
            if self.spawned {
                ", started by the tool"
            } else {
                ""
            }
        );
        let c = &self.convergence;
        let _ = writeln!(
            out,
            "\nztunnels holding every workload and service  {} / {}",
            c.converged, c.proxies
        );
        match c.all_converged_seconds {
            Some(secs) => {
                let _ = writeln!(
                    out,
                    "  all converged after  {secs:.2} s from the ramp start (ramp {:.2} s)",
                    c.ramp_seconds
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  all converged after  never (deadline {:?})",
                    s.settle_timeout
                );
            }
        }
        let p = &c.per_proxy;
        let _ = writeln!(
            out,
            "  per ztunnel          p50 {}, p99 {}, max {}",
            ms(p.p50_ms),
            ms(p.p99_ms),
            ms(p.max_ms)
        );
        if !self.changes.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<11} {:>7} {:>8} {:>8}  {:<26} {:<22} {:>10} {:>11} {:>9}",
                "change",
                "written",
                "complete",
                "ztunnels",
                "write -> last ACK p50/p99",
                "every ACK p50/p99",
                "bytes",
                "per ztunnel",
                "resources"
            );
        }
        for (kind, k) in &self.changes {
            let _ = writeln!(
                out,
                "{kind:<11} {:>7} {:>8} {:>8.0}  {:<26} {:<22} {:>10} {:>11} {:>9.2}",
                k.written,
                k.complete,
                k.mean_watchers,
                format!("{} / {}", ms(k.last_ack.p50_ms), ms(k.last_ack.p99_ms)),
                format!("{} / {}", ms(k.every_ack.p50_ms), ms(k.every_ack.p99_ms)),
                bytes(k.bytes_per_change as u64),
                format!("{:.0} B", k.bytes_per_ztunnel),
                k.resources_per_ztunnel
            );
        }
        let _ = writeln!(out, "\nreceived by all ztunnels");
        for (t, r) in &self.received {
            let _ = writeln!(
                out,
                "  {t:<13} {:>8} responses {:>10} resources {:>10}",
                r.responses,
                r.resources,
                bytes(r.bytes)
            );
        }
        if let Some(u) = &self.server_usage {
            let _ = writeln!(
                out,
                "\nserver: RSS {} before the ramp, {} with every ztunnel converged, {} at the \
                 end, peak {}; CPU {:.2} s ramp + convergence, {:.2} s pod changes",
                bytes(u.before_ramp.rss_bytes),
                bytes(u.after_convergence.rss_bytes),
                bytes(u.at_end.rss_bytes),
                bytes(u.at_end.peak_rss_bytes),
                u.after_convergence.cpu_seconds - u.before_ramp.cpu_seconds,
                u.at_end.cpu_seconds - u.after_convergence.cpu_seconds
            );
        }
        if let Some(u) = &self.load_tool {
            let _ = writeln!(
                out,
                "load tool: RSS {} at the end, CPU {:.2} s",
                bytes(u.at_end.rss_bytes),
                u.at_end.cpu_seconds - u.before_ramp.cpu_seconds
            );
        }
        let _ = writeln!(
            out,
            "resources sent again unchanged {}, stream failures {}, NACKs {}",
            self.redundant_resources, self.stream_failures, self.nacks
        );
        for (name, value) in &self.server_counters {
            let _ = writeln!(out, "  server {name} {value}");
        }
        for m in &self.missing {
            let _ = writeln!(out, "  missing: {m}");
        }
        for e in &self.errors {
            let _ = writeln!(out, "  error: {e}");
        }
        let _ = writeln!(out, "\n{}", self.verdict());
        out
    }
}

#[cfg(test)]
mod tests {
    use meshfed::testing::FakeServer;

    use super::*;
    use crate::scenario::{Churn, Flavour, Mode};

    /// 20 ambient pods (4 services x 5) over 2 nodes, 2 ztunnels, a pod change, an
    /// add and a remove, against an in-process server following the mock file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ztunnels_converge_and_see_every_pod_change() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.json");
        std::fs::write(&file, "services: []\n").unwrap();
        let server = FakeServer::builder()
            .mock_registry_file(&file)
            .start()
            .await
            .unwrap();
        let scenario = Scenario {
            name: "tiny-ambient".into(),
            mode: Mode::Ztunnel,
            flavour: Flavour::Delta,
            services: 4,
            endpoints_per_service: 5,
            namespaces: 2,
            proxies: 2,
            churn: Churn {
                pod_changes: 3,
                pod_adds: 1,
                pod_removes: 1,
                ..Churn::default()
            },
            settle_timeout: Duration::from_secs(20),
            change_timeout: Duration::from_secs(10),
            ..Scenario::default()
        };
        let summary = execute(RunOptions {
            scenario,
            target: Target::Attach {
                grpc: server.grpc_addr(),
                replicas: Vec::new(),
                mock_file: file,
                config_dir: None,
                pid: None,
            },
            cluster_id: "Kubernetes".into(),
            progress: false,
            tls: None,
        })
        .await
        .unwrap();
        server.shutdown().await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!((summary.pods, summary.services, summary.nodes), (20, 4, 2));
        assert_eq!(summary.convergence.converged, 2, "{report}");
        let change = &summary.changes["pod_change"];
        assert_eq!((change.written, change.complete), (3, 3), "{report}");
        assert_eq!(change.mean_watchers, 2.0, "{report}");
        assert!(change.bytes_per_ztunnel > 0.0, "{report}");
        assert_eq!(
            change.resources_per_ztunnel, 1.0,
            "a pod change reaches each ztunnel as one Workload: {report}"
        );
        for kind in ["pod_add", "pod_remove"] {
            let k = &summary.changes[kind];
            assert_eq!((k.written, k.complete), (1, 1), "{kind}: {report}");
        }
        assert_eq!(summary.nacks, 0, "{report}");
        assert!(summary.received["wds"].resources >= 2 * 24, "{report}");
        assert!(summary.received["authorization"].responses >= 2, "{report}");
        assert!(report.contains("ztunnels holding every workload and service  2 / 2"));
    }

    /// The same tiny run over TLS to the secure port of a server running its CA, the
    /// ztunnels presenting the ztunnel service account's certificate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ztunnels_converge_over_the_secure_port() {
        use meshfed::app::CaSource;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("registry.json");
        std::fs::write(&file, "services: []\n").unwrap();
        let ca_dir = dir.path().join("ca");
        let server = FakeServer::builder()
            .mock_registry_file(&file)
            .configure(|c| {
                c.ca = Some(CaSource::Dir {
                    cacerts: None,
                    self_signed_dir: ca_dir.clone(),
                });
            })
            .start()
            .await
            .unwrap();
        let scenario = Scenario {
            name: "tiny-ambient-tls".into(),
            mode: Mode::Ztunnel,
            flavour: Flavour::Delta,
            services: 4,
            endpoints_per_service: 5,
            namespaces: 2,
            proxies: 2,
            churn: Churn {
                pod_changes: 2,
                ..Churn::default()
            },
            settle_timeout: Duration::from_secs(20),
            change_timeout: Duration::from_secs(10),
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
            tls: Some(crate::tls::TlsOptions {
                ca_dir,
                server_name: crate::tls::DEFAULT_SERVER_NAME.into(),
                trust_domain: "cluster.local".into(),
            }),
        })
        .await
        .unwrap();
        server.shutdown().await;
        let report = summary.render();
        assert!(summary.passed, "{report}");
        assert_eq!(summary.convergence.converged, 2, "{report}");
        assert_eq!(summary.stream_failures, 0, "{report}");
        let change = &summary.changes["pod_change"];
        assert_eq!((change.written, change.complete), (2, 2), "{report}");
        assert_eq!(change.resources_per_ztunnel, 1.0, "{report}");
        assert!(
            summary.tls && report.contains("TLS, secure port"),
            "{report}"
        );
    }
}
