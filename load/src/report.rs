//! The result of a run: a serialisable summary (`--json FILE`) and the table printed
//! at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use super::procfs::{Machine, ProcessSample};
use super::record::Percentiles;
use super::scenario::{Scenario, SidecarScope};
use super::tables::SharedStats;

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The scenario as run (command-line overrides applied).
    pub scenario: Scenario,
    /// Where it ran.
    pub machine: Machine,
    /// The server under load.
    pub server: ServerInfo,
    /// The initial config of every proxy.
    pub convergence: Convergence,
    /// The churn.
    pub changes: Changes,
    /// With `decode: lean`, what the proxies shared once all had converged.
    pub shared_after_convergence: Option<SharedStats>,
    /// The reconnect storm after the churn (`reconnectStorm: true`).
    pub reconnect_storm: Option<ReconnectStorm>,
    /// Responses received by all proxies, by type (`cds`, `eds`, `lds`, `rds`, `total`).
    pub received: BTreeMap<&'static str, Received>,
    /// The server's memory and CPU, when it is a local process.
    pub server_usage: Option<ProcessUsage>,
    /// The load tool's own memory and CPU (it shares the machine with a local server).
    pub load_tool: Option<ProcessUsage>,
    /// Names proxies subscribed to that the server never sent, by type.
    pub unserved: BTreeMap<&'static str, BTreeSet<String>>,
    /// What proxies without a complete config were missing at the deadline (a few).
    pub missing: Vec<String>,
    /// Stream attempts that failed (connect errors, refusals, resets).
    pub stream_failures: usize,
    /// Stream attempts refused with `RESOURCE_EXHAUSTED` (the server's new-stream
    /// rate limit) and retried.
    pub refused_streams: usize,
    /// Responses the proxies could not decode.
    pub nacks: u64,
    /// The first distinct errors.
    pub errors: Vec<String>,
    /// Every proxy converged and every written change reached all its watchers.
    pub passed: bool,
    /// The EnvoyFilter changes after the churn (`envoyFilters.changes`).
    pub envoy_filter_changes: Vec<crate::envoyfilters::EnvoyFilterChange>,
}

/// The server under load.
#[derive(Clone, Debug, Serialize)]
pub struct ServerInfo {
    /// ADS address.
    pub address: String,
    /// Its process, when known.
    pub pid: Option<u32>,
    /// Started by the tool.
    pub spawned: bool,
    /// Over TLS with client certificates (the secure port).
    pub tls: bool,
    /// Its xDS counters that are not zero at the end of the run (a server the tool
    /// started): handshake deadlines, cut connections, refused streams.
    pub counters: BTreeMap<String, f64>,
}

/// Initial convergence.
#[derive(Clone, Debug, Serialize)]
pub struct Convergence {
    /// Proxies run.
    pub proxies: usize,
    /// Proxies that had a complete, consistent config before the deadline.
    pub converged: usize,
    /// Ramp start -> last proxy started.
    pub ramp_seconds: f64,
    /// Ramp start -> every proxy complete (none when some never were).
    pub all_converged_seconds: Option<f64>,
    /// Per proxy: its start -> its config complete.
    pub per_proxy: Percentiles,
}

/// The churn.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Changes {
    /// Changes in the scenario.
    pub planned: usize,
    /// Written to the registry.
    pub written: usize,
    /// Not made (config changes: no config source the tool can drive yet).
    pub skipped: usize,
    /// Written and ACKed by every watcher within the change timeout.
    pub complete: usize,
    /// Written with no proxy watching (proxyless clients watch no added service).
    pub unwatched: usize,
    /// By kind (`endpoint`, `service_add`, `service_remove`).
    pub by_kind: BTreeMap<&'static str, KindFigures>,
}

/// The figures of one kind of change.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindFigures {
    /// Written.
    pub written: usize,
    /// ACKed by every watcher.
    pub complete: usize,
    /// Mean watchers per change.
    pub mean_watchers: f64,
    /// Per change: write -> the first watcher's ACK (the server's reaction before
    /// its fan-out: registry, debounce, snapshot).
    pub first_ack: Percentiles,
    /// Per change: write -> the last watcher's ACK (the convergence time).
    pub last_ack: Percentiles,
    /// Per (change, watcher): write -> that watcher's ACK.
    pub every_ack: Percentiles,
}

/// Every proxy dropping its stream and connection at once, then reconnecting at once.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReconnectStorm {
    /// Proxies run.
    pub proxies: usize,
    /// Streams still up when the proxies were told to reconnect (0 unless dropping
    /// took longer than the tool waits).
    pub not_dropped: usize,
    /// Proxies with their config again (every subscribed name received) by the
    /// deadline (`settleTimeout` from the reconnect).
    pub converged: usize,
    /// Reconnect -> every proxy has its config again (none when some never had).
    pub all_converged_seconds: Option<f64>,
    /// Stream attempts that failed from the reconnect on.
    pub stream_failures: usize,
    /// Of those, the ones whose error says the connection was reset.
    pub connection_resets: usize,
    /// Of those, the ones whose error says the connection was refused.
    pub connections_refused: usize,
    /// Streams refused by the server's rate limit (`RESOURCE_EXHAUSTED`) and retried
    /// with Envoy's backoff (not failures).
    pub refused_streams: usize,
    /// The server's CPU seconds from the drop to the end of the storm.
    pub server_cpu_seconds: Option<f64>,
}

/// Received responses of one type.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Received {
    /// Responses.
    pub responses: u64,
    /// Resources in them.
    pub resources: u64,
    /// Encoded bytes.
    pub bytes: u64,
}

/// A process's resource use through the run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ProcessUsage {
    /// Before the first proxy connected.
    pub before_ramp: ProcessSample,
    /// When every proxy had converged (or at the convergence deadline).
    pub after_convergence: ProcessSample,
    /// After the churn.
    pub at_end: ProcessSample,
}

impl Summary {
    /// One line saying what failed, or that all passed.
    pub fn verdict(&self) -> String {
        let c = &self.convergence;
        let mut problems = Vec::new();
        if c.converged < c.proxies {
            problems.push(format!(
                "{} of {} proxies never had a complete config",
                c.proxies - c.converged,
                c.proxies
            ));
        }
        let ch = &self.changes;
        if ch.complete + ch.unwatched < ch.written {
            problems.push(format!(
                "{} of {} changes did not reach every watching proxy",
                ch.written - ch.complete - ch.unwatched,
                ch.written
            ));
        }
        if let Some(st) = &self.reconnect_storm
            && st.converged < st.proxies
        {
            problems.push(format!(
                "{} of {} proxies did not have their config again after the reconnect storm",
                st.proxies - st.converged,
                st.proxies
            ));
        }
        if problems.is_empty() {
            "every proxy converged and every change reached every watcher".into()
        } else {
            problems.join("; ")
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let s = &self.scenario;
        let _ = writeln!(
            out,
            "\nmeshfed load: scenario {} ({} x {:?} {:?}, {} services x {} endpoints x {} port{}, {} namespaces{})",
            s.name,
            s.proxies,
            s.mode,
            s.flavour,
            s.services,
            s.endpoints_per_service,
            s.ports_per_service,
            if s.ports_per_service == 1 { "" } else { "s" },
            s.namespaces,
            match s.sidecar_scope {
                SidecarScope::Mesh => "",
                SidecarScope::Namespace => ", sidecars scoped to their namespace",
            }
        );
        let m = &self.machine;
        let _ = writeln!(
            out,
            "machine: {} CPUs, {} RAM, {} (kernel {}){}",
            m.cpus,
            bytes(m.memory_bytes),
            if m.cpu_model.is_empty() {
                "?"
            } else {
                &m.cpu_model
            },
            m.kernel,
            m.load_average
                .map(|l| format!(
                    ", load average {:.2} {:.2} {:.2} at the start",
                    l[0], l[1], l[2]
                ))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "server: {}{}{}{}",
            self.server.address,
            if self.server.tls {
                " (TLS, client certificates)"
            } else {
                ""
            },
            self.server
                .pid
                .map(|p| format!(", pid {p}"))
                .unwrap_or_default(),
            if self.server.spawned {
                ", started by the tool"
            } else {
                ""
            }
        );

        let c = &self.convergence;
        let _ = writeln!(out, "\ninitial config");
        let _ = writeln!(
            out,
            "  proxies with a complete config  {} / {}",
            c.converged, c.proxies
        );
        match c.all_converged_seconds {
            Some(secs) => {
                let _ = writeln!(
                    out,
                    "  all complete after              {secs:.2} s from the ramp start (ramp {:.2} s)",
                    c.ramp_seconds
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  all complete after              never (deadline {:?})",
                    s.settle_timeout
                );
            }
        }
        let _ = writeln!(
            out,
            "  per proxy (start -> complete)   {}",
            percentiles(&c.per_proxy)
        );

        let ch = &self.changes;
        let _ = writeln!(
            out,
            "\nchanges: {} planned, {} written, {} complete, {} unwatched, {} skipped",
            ch.planned, ch.written, ch.complete, ch.unwatched, ch.skipped
        );
        if !ch.by_kind.is_empty() {
            let _ = writeln!(
                out,
                "  {:<15} {:>7} {:>9} {:>9}  {:<36}  {:<19}  first ACK p50",
                "kind",
                "written",
                "complete",
                "watchers",
                "write -> last ACK p50 / p99 / max",
                "every ACK p50 / p99"
            );
            for (kind, k) in &ch.by_kind {
                let _ = writeln!(
                    out,
                    "  {:<15} {:>7} {:>9} {:>9.0}  {:<36}  {:<19}  {}",
                    kind,
                    k.written,
                    k.complete,
                    k.mean_watchers,
                    format!(
                        "{} / {} / {}",
                        ms(k.last_ack.p50_ms),
                        ms(k.last_ack.p99_ms),
                        ms(k.last_ack.max_ms)
                    ),
                    format!("{} / {}", ms(k.every_ack.p50_ms), ms(k.every_ack.p99_ms)),
                    ms(k.first_ack.p50_ms)
                );
            }
        }

        if let Some(st) = &self.reconnect_storm {
            let _ = writeln!(
                out,
                "\nreconnect storm (every proxy dropped, then all reconnected at once)"
            );
            let _ = writeln!(
                out,
                "  proxies with their config again {} / {}{}",
                st.converged,
                st.proxies,
                match st.all_converged_seconds {
                    Some(secs) => format!(", all after {secs:.2} s"),
                    None => format!(", not all within {:?}", s.settle_timeout),
                }
            );
            let _ = writeln!(
                out,
                "  failed stream attempts          {} ({} connection resets, {} connections refused); \
                 {} streams refused by the rate limit and retried",
                st.stream_failures,
                st.connection_resets,
                st.connections_refused,
                st.refused_streams
            );
            if st.not_dropped > 0 {
                let _ = writeln!(out, "  streams not dropped in time     {}", st.not_dropped);
            }
            if let Some(cpu) = st.server_cpu_seconds {
                let _ = writeln!(out, "  server CPU                      {cpu:.2} s");
            }
        }

        crate::envoyfilters::render_changes(&self.envoy_filter_changes, &mut out);
        let _ = writeln!(out, "\nreceived by all proxies");
        let _ = writeln!(
            out,
            "  {:<6} {:>10} {:>12} {:>12}",
            "type", "responses", "resources", "bytes"
        );
        for (t, r) in &self.received {
            let _ = writeln!(
                out,
                "  {:<6} {:>10} {:>12} {:>12}",
                t,
                r.responses,
                r.resources,
                bytes(r.bytes)
            );
        }

        for (what, usage) in [
            ("server process", &self.server_usage),
            ("load tool process", &self.load_tool),
        ] {
            let Some(u) = usage else { continue };
            let _ = writeln!(out, "\n{what}");
            let _ = writeln!(
                out,
                "  RSS       {} before the ramp, {} with every proxy connected, {} at the end (peak {})",
                bytes(u.before_ramp.rss_bytes),
                bytes(u.after_convergence.rss_bytes),
                bytes(u.at_end.rss_bytes),
                bytes(u.at_end.peak_rss_bytes)
            );
            let _ = writeln!(
                out,
                "  CPU       {:.2} s for the initial configs, {:.2} s for the churn, {:.2} s in all",
                u.after_convergence.cpu_seconds - u.before_ramp.cpu_seconds,
                u.at_end.cpu_seconds - u.after_convergence.cpu_seconds,
                u.at_end.cpu_seconds
            );
            if what == "load tool process" {
                let _ = writeln!(
                    out,
                    "  per proxy {} with every proxy connected, {} at the peak (RSS over the \
                     RSS before the ramp, / {} proxies; decode: {:?})",
                    bytes(
                        u.after_convergence
                            .rss_bytes
                            .saturating_sub(u.before_ramp.rss_bytes)
                            / c.proxies.max(1) as u64
                    ),
                    bytes(
                        u.at_end
                            .peak_rss_bytes
                            .saturating_sub(u.before_ramp.rss_bytes)
                            / c.proxies.max(1) as u64
                    ),
                    c.proxies,
                    s.decode
                );
                if let Some(st) = &self.shared_after_convergence {
                    let _ = writeln!(
                        out,
                        "  shared    {} distinct tables ({} entries) held by the {} proxies, \
                         {} distinct resources decoded (after convergence)",
                        st.tables, st.entries, c.proxies, st.resources
                    );
                }
            }
        }
        if self.refused_streams > 0 {
            let _ = writeln!(
                out,
                "\nstreams refused by the server's rate limit (RESOURCE_EXHAUSTED) and retried: {}",
                self.refused_streams
            );
        }
        if !self.server.counters.is_empty() {
            let _ = writeln!(out, "\nserver xDS counters (non-zero, end of run)");
            for (name, value) in &self.server.counters {
                let _ = writeln!(out, "  {name} {value}");
            }
        }
        if self.stream_failures > 0 || self.nacks > 0 {
            let _ = writeln!(
                out,
                "\nstream failures: {}, NACKs: {}",
                self.stream_failures, self.nacks
            );
        }
        for (t, names) in &self.unserved {
            let _ = writeln!(
                out,
                "note: the server never sent these subscribed {t} names: {}",
                names.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        for m in &self.missing {
            let _ = writeln!(out, "incomplete: {m}");
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        let _ = writeln!(
            out,
            "\n{}: {}",
            if self.passed { "PASS" } else { "FAIL" },
            self.verdict()
        );
        out
    }
}

fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn percentiles(p: &Percentiles) -> String {
    format!(
        "p50 {}, p90 {}, p99 {}, max {} (n={})",
        ms(p.p50_ms),
        ms(p.p90_ms),
        ms(p.p99_ms),
        ms(p.max_ms),
        p.count
    )
}

/// Bytes in B/KiB/MiB/GiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(250 * 1024 * 1024), "250.0 MiB");
        assert_eq!(ms(12.345), "12.3 ms");
        assert_eq!(ms(250.0), "250 ms");
        assert_eq!(ms(15_000.0), "15.0 s");
    }
}
