//! The scenario file: what to simulate (see the [module docs](super) for the format).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::marker::MAX_CHANGES;

/// The most ports a service may have (`portsPerService`).
pub const MAX_PORTS_PER_SERVICE: usize = 2;

/// What kind of xDS client each simulated proxy is.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// An Envoy sidecar: CDS and LDS wildcards, EDS and RDS for what they name.
    #[default]
    Sidecar,
    /// A proxyless gRPC client (`GENERATOR=grpc`): LDS for `host:port` names, then the
    /// RDS, CDS and EDS names it learns.
    Grpc,
    /// A ztunnel (ambient mode): Delta ADS, wildcard subscriptions to the Address and
    /// Authorization types, one per node ([`crate::ztunnel`]).
    Ztunnel,
}

/// Which ADS flavour the proxies speak.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    /// `StreamAggregatedResources` (state of the world).
    #[default]
    Sotw,
    /// `DeltaAggregatedResources`.
    Delta,
    /// Half and half: even-numbered proxies speak SotW, odd-numbered ones Delta.
    Mixed,
}

impl Flavour {
    /// The flavour proxy number `index` speaks: never [`Flavour::Mixed`].
    pub fn of_proxy(self, index: usize) -> Flavour {
        match self {
            Flavour::Mixed if index.is_multiple_of(2) => Flavour::Sotw,
            Flavour::Mixed => Flavour::Delta,
            f => f,
        }
    }
}

/// How much of each resource a simulated proxy decodes and keeps.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Decode {
    /// Each resource's bytes are hashed; the few fields the checks read (EDS names,
    /// endpoint counts, markers, route names) are decoded once per distinct resource
    /// and shared, and proxies holding the same resources share one table of names
    /// and hashes. No per-proxy copy of anything the proxies have in common.
    #[default]
    Lean,
    /// Every proxy decodes every resource it receives itself and keeps its own tables
    /// (what the tool did before `lean`): the check that each proxy's decoding agrees.
    Full,
}

/// Which services a sidecar imports.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SidecarScope {
    /// Every service of the mesh (no Sidecar resource, Istio's default `*/*`).
    #[default]
    Mesh,
    /// Only its own namespace's: the tool writes one `Sidecar` per namespace with
    /// `egress: [{hosts: ["./*"]}]` into the server's config directory, so with N
    /// namespaces each service is watched by about 1/N of the sidecars.
    Namespace,
}

/// Changes made after every proxy has its initial config.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Churn {
    /// Changes per second, all kinds together. 0 = one at a time: each change is
    /// written once every watching proxy has ACKed the previous one (or its
    /// `changeTimeout` ran out) and no proxy has received anything for
    /// [`crate::driver::QUIET_BETWEEN_CHANGES`] (the rest of the push that
    /// carried it, e.g. the EDS and RDS after the CDS that showed an added service, has
    /// been delivered), so each is measured alone.
    pub rate: f64,
    /// Endpoint changes: one endpoint of a random service gets a new port.
    pub endpoint_changes: usize,
    /// Services added (each with `endpointsPerService` endpoints).
    pub service_adds: usize,
    /// Services removed (services added by the churn first, then reserved ones).
    pub service_removes: usize,
    /// VirtualService changes (a full push that touches every sidecar): the route of
    /// a VirtualService for the first service is renamed. They need a server that
    /// reads a config directory (`--configDir`); without one they are skipped.
    pub config_changes: usize,
    /// After the changes, every proxy drops its stream and its connection at once,
    /// then all reconnect at once (a rollout, a control plane restart): the report
    /// gives the time until all have their config again and the failed connections.
    pub reconnect_storm: bool,
    /// ztunnel mode: pod changes (one pod's `version` label gets a new value, so its
    /// Workload's canonical revision changes).
    pub pod_changes: usize,
    /// ztunnel mode: pods added to a random service (a new Workload).
    pub pod_adds: usize,
    /// ztunnel mode: pods removed (added ones first, then original ones).
    pub pod_removes: usize,
}

impl Churn {
    /// Every change of the run.
    pub fn total(&self) -> usize {
        self.endpoint_changes
            + self.service_adds
            + self.service_removes
            + self.config_changes
            + self.pod_changes
            + self.pod_adds
            + self.pod_removes
    }

    /// The pod changes of ztunnel mode, all kinds.
    pub fn pod_total(&self) -> usize {
        self.pod_changes + self.pod_adds + self.pod_removes
    }
}

/// One load scenario.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Scenario {
    /// Name shown in reports.
    pub name: String,
    /// Services in the mock registry.
    pub services: usize,
    /// Ports of each service: 1 (HTTP 8080, or GRPC 8080 for proxyless clients) or 2
    /// (HTTP 8080 and GRPC 7070: two clusters, so two EDS names, per service).
    pub ports_per_service: usize,
    /// Endpoints of each service.
    pub endpoints_per_service: usize,
    /// Namespaces services and proxies are spread over (`load-0`, `load-1`, ...).
    pub namespaces: usize,
    /// Simulated proxies.
    pub proxies: usize,
    /// `sidecar` or `grpc` (proxyless).
    pub mode: Mode,
    /// Services each proxyless client watches.
    pub grpc_services_per_client: usize,
    /// `mesh` or `namespace`: what each sidecar imports (see [`SidecarScope`]).
    pub sidecar_scope: SidecarScope,
    /// `sotw`, `delta` or `mixed` (half each).
    pub flavour: Flavour,
    /// `lean` or `full`: what each proxy decodes and keeps (see [`Decode`]).
    pub decode: Decode,
    /// Proxies connected per second (0 = all at once).
    pub ramp: f64,
    /// HTTP/2 connections shared by the proxies (0 = one connection per proxy).
    pub connections: usize,
    /// Connections that may be in the middle of receiving responses at once (0 = no
    /// limit); see [`crate::gate`].
    pub receiving_connections: usize,
    /// Changes after the initial convergence.
    pub churn: Churn,
    /// How long to wait for every proxy to have its complete initial config, from the
    /// start of the ramp.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub settle_timeout: Duration,
    /// How long a change may take, from its write, to be ACKed by every proxy watching
    /// it; past that it counts as not observed.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub change_timeout: Duration,
    /// Seed of the choice of changed services and endpoints.
    pub seed: u64,
    /// ztunnel mode: the nodes pods are spread over (`node-<n>`, round robin); each
    /// ztunnel `i` runs on `node-<i>`. 0 = one node per ztunnel (`proxies`).
    pub nodes: usize,
    /// EnvoyFilters written into the server's config directory (see [`EnvoyFilters`]).
    pub envoy_filters: EnvoyFilters,
}

/// EnvoyFilters of a run (`envoyFilters`): mesh-wide ones in the root namespace and
/// ones selecting the sidecars of one label group each, written into the server's
/// config directory before the ramp (see [`crate::envoyfilters`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EnvoyFilters {
    /// EnvoyFilters in the root namespace without a workload selector: every
    /// sidecar gets their patches.
    pub mesh_wide: usize,
    /// EnvoyFilters each selecting one label group of sidecars (`workloadSelector`),
    /// in that group's namespace.
    pub selecting: usize,
    /// Label groups: sidecar `i` carries the label `load.meshfed.io/group: g<i %
    /// groups>` (node metadata `LABELS`). 0: as many as `selecting`; a multiple of
    /// `namespaces` (so each group lives in one namespace). Give it without
    /// EnvoyFilters for the baseline of the same labelled sidecars.
    pub groups: usize,
    /// After the churn, one at a time: the first selecting EnvoyFilter is changed and
    /// the proxies that received anything are counted (only its group should).
    pub changes: usize,
}

impl EnvoyFilters {
    /// Whether the scenario writes any or labels the sidecars.
    pub fn enabled(&self) -> bool {
        self.mesh_wide + self.selecting + self.groups + self.changes > 0
    }

    /// The label groups (see [`EnvoyFilters::groups`]); 0 when the sidecars carry no
    /// label.
    pub fn label_groups(&self) -> usize {
        if self.groups > 0 {
            self.groups
        } else {
            self.selecting
        }
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            name: "unnamed".into(),
            services: 10,
            ports_per_service: 1,
            endpoints_per_service: 3,
            namespaces: 1,
            proxies: 10,
            mode: Mode::Sidecar,
            grpc_services_per_client: 10,
            sidecar_scope: SidecarScope::Mesh,
            flavour: Flavour::Sotw,
            decode: Decode::Lean,
            ramp: 0.0,
            connections: 0,
            receiving_connections: 0,
            churn: Churn::default(),
            settle_timeout: Duration::from_secs(60),
            change_timeout: Duration::from_secs(30),
            seed: 1,
            nodes: 0,
            envoy_filters: EnvoyFilters::default(),
        }
    }
}

impl Scenario {
    /// Parses and checks a scenario; `origin` names the file in errors.
    pub fn parse(origin: &str, text: &str) -> anyhow::Result<Scenario> {
        let scenario: Scenario = if text.trim().is_empty() {
            Scenario::default()
        } else {
            serde_norway::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?
        };
        scenario
            .validate()
            .with_context(|| format!("{origin}: invalid scenario"))?;
        Ok(scenario)
    }

    /// Reads and parses a scenario file.
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the scenario {}", path.display()))?;
        Scenario::parse(&path.display().to_string(), &text)
    }

    /// Checks the numbers fit together.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.services == 0 {
            bail!("services must be at least 1");
        }
        if self.namespaces == 0 {
            bail!("namespaces must be at least 1");
        }
        if !(1..=MAX_PORTS_PER_SERVICE).contains(&self.ports_per_service) {
            bail!(
                "portsPerService must be 1 or {MAX_PORTS_PER_SERVICE} (HTTP, and GRPC), not {}",
                self.ports_per_service
            );
        }
        if self.proxies == 0 {
            bail!("proxies must be at least 1");
        }
        if !(self.ramp.is_finite() && self.ramp >= 0.0) {
            bail!("ramp must be a number of proxies per second >= 0 (0 = all at once)");
        }
        if !(self.churn.rate.is_finite() && self.churn.rate >= 0.0) {
            bail!("churn.rate must be a number of changes per second >= 0");
        }
        if self.churn.total() > MAX_CHANGES {
            bail!(
                "at most {MAX_CHANGES} changes per run (each endpoint change needs its own marker port); this scenario has {}",
                self.churn.total()
            );
        }
        let removable = self.churn.service_adds + self.reserved_services();
        if self.churn.service_removes > removable {
            bail!(
                "churn.serviceRemoves ({}) is more than the services that can be removed ({removable})",
                self.churn.service_removes
            );
        }
        if self.reserved_services() >= self.services {
            bail!(
                "churn.serviceRemoves needs {} of the {} services set aside for removal, leaving none to watch and change",
                self.reserved_services(),
                self.services
            );
        }
        if self.churn.endpoint_changes > 0 && self.endpoints_per_service == 0 {
            bail!("churn.endpointChanges needs endpointsPerService >= 1");
        }
        if self.mode == Mode::Ztunnel {
            self.validate_ztunnel()?;
        } else {
            if self.churn.pod_total() > 0 {
                bail!("churn.podChanges, podAdds and podRemoves are for mode: ztunnel");
            }
            if self.nodes > 0 {
                bail!("nodes is for mode: ztunnel (the nodes pods run on)");
            }
        }
        let ef = &self.envoy_filters;
        if ef.enabled() {
            if self.mode != Mode::Sidecar {
                bail!("envoyFilters are for sidecars (mode: sidecar)");
            }
            let groups = ef.label_groups();
            if ef.selecting > 0 && groups == 0 {
                bail!("envoyFilters.groups must be at least 1");
            }
            if groups > 0 && !groups.is_multiple_of(self.namespaces) {
                bail!(
                    "envoyFilters.groups ({groups}) must be a multiple of namespaces ({}): each \
                     group's sidecars share a namespace",
                    self.namespaces
                );
            }
            if ef.changes > 0 && ef.selecting == 0 {
                bail!("envoyFilters.changes needs a selecting EnvoyFilter to change");
            }
        }
        if self.mode == Mode::Grpc {
            if self.sidecar_scope != SidecarScope::Mesh {
                bail!("sidecarScope is for sidecars (mode: sidecar), not proxyless clients");
            }
            if self.ports_per_service != 1 {
                bail!(
                    "portsPerService is for sidecars (mode: sidecar); proxyless clients watch \
                     one port per service"
                );
            }
            if self.grpc_services_per_client == 0 {
                bail!("grpcServicesPerClient must be at least 1 in grpc mode");
            }
            if self.grpc_services_per_client > self.watchable_services() {
                bail!(
                    "grpcServicesPerClient ({}) is more than the services clients can watch ({})",
                    self.grpc_services_per_client,
                    self.watchable_services()
                );
            }
        }
        Ok(())
    }

    /// The checks of `mode: ztunnel`: what the sidecar modes have that ztunnels do
    /// not use is refused rather than ignored.
    fn validate_ztunnel(&self) -> anyhow::Result<()> {
        let c = &self.churn;
        if c.endpoint_changes + c.service_adds + c.service_removes + c.config_changes > 0
            || c.reconnect_storm
        {
            bail!(
                "mode: ztunnel makes pod changes (churn.podChanges, podAdds, podRemoves), not \
                 endpoint, service or config changes nor a reconnect storm"
            );
        }
        if self.sidecar_scope != SidecarScope::Mesh || self.ports_per_service != 1 {
            bail!("sidecarScope and portsPerService are for sidecars, not mode: ztunnel");
        }
        if self.connections > 0 || self.receiving_connections > 0 {
            bail!(
                "mode: ztunnel gives each ztunnel its own connection (connections and \
                 receivingConnections are for sidecars)"
            );
        }
        if self.flavour != Flavour::Delta {
            bail!("mode: ztunnel speaks Delta ADS only: give flavour: delta");
        }
        if self.decode != Decode::Lean {
            bail!("decode is for sidecars and proxyless clients, not mode: ztunnel");
        }
        if self.endpoints_per_service == 0 {
            bail!("mode: ztunnel needs endpointsPerService >= 1 (the pods)");
        }
        let pods = self.services * self.endpoints_per_service;
        if c.pod_removes > pods + c.pod_adds {
            bail!(
                "churn.podRemoves ({}) is more than the pods that can be removed ({})",
                c.pod_removes,
                pods + c.pod_adds
            );
        }
        if c.pod_changes > 0 && c.pod_removes >= pods + c.pod_adds {
            bail!("churn.podChanges needs a pod left after the removals");
        }
        Ok(())
    }

    /// ztunnel mode: the nodes pods run on.
    pub fn node_count(&self) -> usize {
        if self.nodes > 0 {
            self.nodes
        } else {
            self.proxies
        }
    }

    /// Whether the server needs a config directory: for config changes or Sidecars.
    pub fn needs_config_dir(&self) -> bool {
        self.churn.config_changes > 0
            || self.sidecar_scope != SidecarScope::Mesh
            || self.envoy_filters.enabled()
    }

    /// Original services set aside so that removals that outnumber additions have
    /// something to remove; they are never watched by proxyless clients nor changed by
    /// endpoint churn.
    pub fn reserved_services(&self) -> usize {
        self.churn
            .service_removes
            .saturating_sub(self.churn.service_adds)
    }

    /// Services that are watched and changed (the original ones minus the reserved).
    pub fn watchable_services(&self) -> usize {
        self.services - self.reserved_services().min(self.services)
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Seconds(f64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Seconds(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s)),
        Raw::Seconds(s) => Err(serde::de::Error::custom(format!(
            "{s}: a duration must not be negative"
        ))),
        Raw::Text(text) => {
            let d: meshfed_api::Duration = text
                .parse()
                .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))?;
            Duration::try_from(d).map_err(|_| {
                serde::de::Error::custom(format!("{text:?}: a duration must not be negative"))
            })
        }
    }
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}s", d.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_field() {
        let text = "name: t\nservices: 5\nendpointsPerService: 2\nnamespaces: 3\nproxies: 7\nmode: grpc\n\
                    grpcServicesPerClient: 4\nsidecarScope: mesh\nflavour: delta\ndecode: full\nportsPerService: 1\nramp: 50\nconnections: 2\nreceivingConnections: 3\n\
                    churn: {rate: 5, endpointChanges: 10, serviceAdds: 2, serviceRemoves: 3, configChanges: 1, reconnectStorm: true}\n\
                    settleTimeout: 1m30s\nchangeTimeout: 5s\nseed: 9\n";
        let s = Scenario::parse("t.yaml", text).unwrap();
        assert_eq!(
            s,
            Scenario {
                name: "t".into(),
                services: 5,
                ports_per_service: 1,
                endpoints_per_service: 2,
                namespaces: 3,
                proxies: 7,
                mode: Mode::Grpc,
                grpc_services_per_client: 4,
                sidecar_scope: SidecarScope::Mesh,
                flavour: Flavour::Delta,
                decode: Decode::Full,
                ramp: 50.0,
                connections: 2,
                receiving_connections: 3,
                churn: Churn {
                    rate: 5.0,
                    endpoint_changes: 10,
                    service_adds: 2,
                    service_removes: 3,
                    config_changes: 1,
                    reconnect_storm: true,
                    pod_changes: 0,
                    pod_adds: 0,
                    pod_removes: 0,
                },
                settle_timeout: Duration::from_secs(90),
                change_timeout: Duration::from_secs(5),
                seed: 9,
                nodes: 0,
                envoy_filters: EnvoyFilters::default(),
            }
        );
        assert_eq!(s.reserved_services(), 1);
        assert_eq!(s.watchable_services(), 4);
        assert_eq!(s.churn.total(), 16);
    }

    #[test]
    fn defaults_and_numeric_durations() {
        let s = Scenario::parse("t.yaml", "").unwrap();
        assert_eq!(s, Scenario::default());
        let s = Scenario::parse("t.yaml", "proxies: 3\nsettleTimeout: 2.5\n").unwrap();
        assert_eq!(s.proxies, 3);
        assert_eq!(s.settle_timeout, Duration::from_millis(2500));
        assert_eq!(s.services, 10, "unset fields keep their defaults");
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let err = Scenario::parse("t.yaml", "proxy: 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.yaml: ") && err.contains("unknown field `proxy`"),
            "{err}"
        );
        let err = Scenario::parse("t.yaml", "mode: envoy\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `envoy`"), "{err}");
        let err = Scenario::parse("t.yaml", "settleTimeout: soon\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"soon\""), "{err}");
        let err = format!(
            "{:#}",
            Scenario::parse("t.yaml", "services: 2\nchurn: {serviceRemoves: 2}\n").unwrap_err()
        );
        assert!(err.contains("set aside for removal"), "{err}");
        let err = format!(
            "{:#}",
            Scenario::parse(
                "t.yaml",
                "mode: grpc\nservices: 3\ngrpcServicesPerClient: 4\n"
            )
            .unwrap_err()
        );
        assert!(err.contains("grpcServicesPerClient (4)"), "{err}");
        let err = format!(
            "{:#}",
            Scenario::parse("t.yaml", "churn: {endpointChanges: 50000}\n").unwrap_err()
        );
        assert!(err.contains("marker port"), "{err}");
        let err = format!(
            "{:#}",
            Scenario::parse("t.yaml", "mode: grpc\nsidecarScope: namespace\n").unwrap_err()
        );
        assert!(err.contains("sidecarScope is for sidecars"), "{err}");
        let err = Scenario::parse("t.yaml", "sidecarScope: cluster\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `cluster`"), "{err}");
    }

    #[test]
    fn two_ports_mixed_flavours_and_decode_modes() {
        let s = Scenario::parse("t.yaml", "portsPerService: 2\nflavour: mixed\n").unwrap();
        assert_eq!(s.ports_per_service, 2);
        assert_eq!(s.decode, Decode::Lean, "lean unless asked");
        assert_eq!(
            (0..4).map(|i| s.flavour.of_proxy(i)).collect::<Vec<_>>(),
            [Flavour::Sotw, Flavour::Delta, Flavour::Sotw, Flavour::Delta]
        );
        assert_eq!(Flavour::Delta.of_proxy(0), Flavour::Delta);
        assert_eq!(
            Scenario::parse("t.yaml", "decode: full\n").unwrap().decode,
            Decode::Full
        );
        for bad in ["portsPerService: 0\n", "portsPerService: 3\n"] {
            let err = format!("{:#}", Scenario::parse("t.yaml", bad).unwrap_err());
            assert!(err.contains("portsPerService must be 1 or 2"), "{err}");
        }
        let err = format!(
            "{:#}",
            Scenario::parse("t.yaml", "mode: grpc\nportsPerService: 2\n").unwrap_err()
        );
        assert!(err.contains("portsPerService is for sidecars"), "{err}");
        let err = Scenario::parse("t.yaml", "decode: partial\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `partial`"), "{err}");
    }

    #[test]
    fn ztunnel_mode_has_nodes_and_pod_changes() {
        let text = "mode: ztunnel\nflavour: delta\nservices: 1000\nendpointsPerService: 10\n\
                    proxies: 100\nnodes: 50\nchurn: {podChanges: 20, podAdds: 2, podRemoves: 3}\n";
        let s = Scenario::parse("t.yaml", text).unwrap();
        assert_eq!(s.mode, Mode::Ztunnel);
        assert_eq!(s.nodes, 50);
        assert_eq!(s.node_count(), 50);
        assert_eq!(
            (s.churn.pod_changes, s.churn.pod_adds, s.churn.pod_removes),
            (20, 2, 3)
        );
        assert_eq!((s.churn.pod_total(), s.churn.total()), (25, 25));
        let one_per_ztunnel = Scenario::parse("t.yaml", "mode: ztunnel\nflavour: delta\n").unwrap();
        assert_eq!(one_per_ztunnel.node_count(), one_per_ztunnel.proxies);
        for (bad, says) in [
            ("mode: ztunnel\n", "Delta ADS only"),
            ("mode: ztunnel\nflavour: mixed\n", "Delta ADS only"),
            (
                "mode: ztunnel\nflavour: delta\nchurn: {endpointChanges: 1}\n",
                "makes pod changes",
            ),
            (
                "mode: ztunnel\nflavour: delta\nchurn: {reconnectStorm: true}\n",
                "makes pod changes",
            ),
            (
                "mode: ztunnel\nflavour: delta\nconnections: 2\n",
                "its own connection",
            ),
            (
                "mode: ztunnel\nflavour: delta\nportsPerService: 2\n",
                "for sidecars",
            ),
            (
                "mode: ztunnel\nflavour: delta\ndecode: full\n",
                "decode is for",
            ),
            (
                "mode: ztunnel\nflavour: delta\nendpointsPerService: 0\n",
                "endpointsPerService >= 1",
            ),
            (
                "mode: ztunnel\nflavour: delta\nservices: 1\nendpointsPerService: 2\nchurn: {podRemoves: 3}\n",
                "podRemoves (3)",
            ),
            (
                "mode: ztunnel\nflavour: delta\nservices: 1\nendpointsPerService: 2\nchurn: {podRemoves: 2, podChanges: 1}\n",
                "a pod left",
            ),
            ("churn: {podChanges: 1}\n", "are for mode: ztunnel"),
            ("nodes: 3\n", "nodes is for mode: ztunnel"),
        ] {
            let err = format!("{:#}", Scenario::parse("t.yaml", bad).unwrap_err());
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn sidecar_scope_needs_a_config_directory() {
        let s = Scenario::parse("t.yaml", "sidecarScope: namespace\n").unwrap();
        assert_eq!(s.sidecar_scope, SidecarScope::Namespace);
        assert!(s.needs_config_dir());
        assert!(!Scenario::default().needs_config_dir());
    }

    #[test]
    fn envoy_filters_label_groups_within_namespaces() {
        let s = Scenario::parse(
            "t.yaml",
            "namespaces: 3\nenvoyFilters: {meshWide: 2, selecting: 6, groups: 3, changes: 1}\n",
        )
        .unwrap();
        assert_eq!(
            s.envoy_filters,
            EnvoyFilters {
                mesh_wide: 2,
                selecting: 6,
                groups: 3,
                changes: 1
            }
        );
        assert!(s.needs_config_dir());
        let s = Scenario::parse("t.yaml", "namespaces: 2\nenvoyFilters: {selecting: 4}\n").unwrap();
        assert_eq!(
            s.envoy_filters.label_groups(),
            4,
            "one group per selecting filter"
        );
        for (bad, wanted) in [
            (
                "namespaces: 3\nenvoyFilters: {selecting: 4}\n",
                "multiple of namespaces",
            ),
            (
                "envoyFilters: {meshWide: 1, changes: 1}\n",
                "needs a selecting",
            ),
            ("mode: grpc\nenvoyFilters: {meshWide: 1}\n", "for sidecars"),
        ] {
            let err = format!("{:#}", Scenario::parse("t.yaml", bad).unwrap_err());
            assert!(err.contains(wanted), "{bad}: {err}");
        }
    }

    #[test]
    fn bundled_scenarios_parse() {
        for (name, text) in [
            (
                "smoke.yaml",
                include_str!("../../examples/scenarios/smoke.yaml"),
            ),
            (
                "idle-connections.yaml",
                include_str!("../../examples/scenarios/idle-connections.yaml"),
            ),
            (
                "istio-reference.yaml",
                include_str!("../../examples/scenarios/istio-reference.yaml"),
            ),
            (
                "proxyless-10k.yaml",
                include_str!("../../examples/scenarios/proxyless-10k.yaml"),
            ),
            (
                "endpoint-churn-500.yaml",
                include_str!("../../examples/scenarios/endpoint-churn-500.yaml"),
            ),
            (
                "endpoint-churn-scoped.yaml",
                include_str!("../../examples/scenarios/endpoint-churn-scoped.yaml"),
            ),
            (
                "endpoint-churn-2ports-2000.yaml",
                include_str!("../../examples/scenarios/endpoint-churn-2ports-2000.yaml"),
            ),
            (
                "scale-5000.yaml",
                include_str!("../../examples/scenarios/scale-5000.yaml"),
            ),
            (
                "scale-10000.yaml",
                include_str!("../../examples/scenarios/scale-10000.yaml"),
            ),
            (
                "scale-20000.yaml",
                include_str!("../../examples/scenarios/scale-20000.yaml"),
            ),
            (
                "scale-5000-scoped.yaml",
                include_str!("../../examples/scenarios/scale-5000-scoped.yaml"),
            ),
            (
                "scale-10000-scoped.yaml",
                include_str!("../../examples/scenarios/scale-10000-scoped.yaml"),
            ),
            (
                "scale-20000-scoped.yaml",
                include_str!("../../examples/scenarios/scale-20000-scoped.yaml"),
            ),
            (
                "ambient-10k.yaml",
                include_str!("../../examples/scenarios/ambient-10k.yaml"),
            ),
            (
                "istio-reference-envoyfilter.yaml",
                include_str!("../../examples/scenarios/istio-reference-envoyfilter.yaml"),
            ),
        ] {
            Scenario::parse(name, text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        let ambient = Scenario::parse(
            "ambient-10k.yaml",
            include_str!("../../examples/scenarios/ambient-10k.yaml"),
        )
        .unwrap();
        assert_eq!(
            (
                ambient.mode,
                ambient.services * ambient.endpoints_per_service,
                ambient.proxies,
                ambient.node_count(),
                ambient.churn.pod_changes
            ),
            (Mode::Ztunnel, 10_000, 100, 100, 30)
        );
        let smoke = Scenario::parse(
            "smoke.yaml",
            include_str!("../../examples/scenarios/smoke.yaml"),
        )
        .unwrap();
        assert_eq!(
            (
                smoke.services,
                smoke.endpoints_per_service,
                smoke.proxies,
                smoke.churn.endpoint_changes
            ),
            (10, 3, 20, 20)
        );
        let with_filters = Scenario::parse(
            "istio-reference-envoyfilter.yaml",
            include_str!("../../examples/scenarios/istio-reference-envoyfilter.yaml"),
        )
        .unwrap();
        let reference = Scenario::parse(
            "istio-reference.yaml",
            include_str!("../../examples/scenarios/istio-reference.yaml"),
        )
        .unwrap();
        assert_eq!(
            Scenario {
                name: reference.name.clone(),
                envoy_filters: EnvoyFilters::default(),
                ..with_filters.clone()
            },
            reference,
            "istio-reference with EnvoyFilters"
        );
        assert_eq!(
            (
                with_filters.envoy_filters.mesh_wide,
                with_filters.envoy_filters.selecting,
                with_filters.envoy_filters.label_groups()
            ),
            (10, 40, 40)
        );
        let scoped = Scenario::parse(
            "endpoint-churn-scoped.yaml",
            include_str!("../../examples/scenarios/endpoint-churn-scoped.yaml"),
        )
        .unwrap();
        let unscoped = Scenario::parse(
            "endpoint-churn-500.yaml",
            include_str!("../../examples/scenarios/endpoint-churn-500.yaml"),
        )
        .unwrap();
        assert_eq!(scoped.sidecar_scope, SidecarScope::Namespace);
        assert_eq!(
            Scenario {
                name: unscoped.name.clone(),
                sidecar_scope: SidecarScope::Mesh,
                ..scoped
            },
            unscoped,
            "the scoped scenario is endpoint-churn-500 with Sidecars"
        );
        let two = Scenario::parse(
            "endpoint-churn-2ports-2000.yaml",
            include_str!("../../examples/scenarios/endpoint-churn-2ports-2000.yaml"),
        )
        .unwrap();
        assert_eq!(
            (
                two.services,
                two.ports_per_service,
                two.endpoints_per_service,
                two.proxies,
                two.flavour,
                two.sidecar_scope,
                two.ramp,
                two.churn.rate,
                two.churn.endpoint_changes,
                two.churn.total()
            ),
            (
                1000,
                2,
                10,
                2000,
                Flavour::Sotw,
                SidecarScope::Mesh,
                500.0,
                0.0,
                5,
                5
            )
        );
        for (text, proxies, connections, scope) in [
            (
                include_str!("../../examples/scenarios/scale-5000.yaml"),
                5000,
                0,
                SidecarScope::Mesh,
            ),
            (
                include_str!("../../examples/scenarios/scale-10000.yaml"),
                10000,
                0,
                SidecarScope::Mesh,
            ),
            (
                include_str!("../../examples/scenarios/scale-20000.yaml"),
                20000,
                2000,
                SidecarScope::Mesh,
            ),
            (
                include_str!("../../examples/scenarios/scale-5000-scoped.yaml"),
                5000,
                0,
                SidecarScope::Namespace,
            ),
            (
                include_str!("../../examples/scenarios/scale-10000-scoped.yaml"),
                10000,
                0,
                SidecarScope::Namespace,
            ),
            (
                include_str!("../../examples/scenarios/scale-20000-scoped.yaml"),
                20000,
                2000,
                SidecarScope::Namespace,
            ),
        ] {
            let s = Scenario::parse("scale", text).unwrap();
            assert_eq!(
                (
                    s.proxies,
                    s.connections,
                    s.sidecar_scope,
                    s.flavour,
                    s.services,
                    s.endpoints_per_service
                ),
                (proxies, connections, scope, Flavour::Mixed, 1000, 10)
            );
            assert!(s.churn.reconnect_storm && s.churn.config_changes == 1 && s.needs_config_dir());
        }
    }
}
