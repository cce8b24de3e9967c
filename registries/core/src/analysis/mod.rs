//! Istio's config analyzers (`istioctl analyze`, `pkg/config/analysis/analyzers`) over
//! what meshfed reads: references to hosts, subsets and gateways that do not exist,
//! VirtualServices that conflict, selectors that select nothing, ports without a
//! protocol name, and the schema validation of every object.
//!
//! [`analyze`] takes [`Inputs`] (config objects, objects that failed to decode, and
//! the Kubernetes Services, pods and namespaces the analyzers look at) and returns
//! [`Message`]s with Istio's codes, names, levels and wording (`msg/messages.yaml`).
//! Nothing here reads files or clusters: [`read`] builds inputs from documents, and
//! `meshfed analyze` (or the server, for `status.validationMessages`) feeds them.

mod analyzers;
pub mod read;
mod selectors;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::config::{ConfigObject, FieldError, Warning};

pub use analyzers::export_scopes;
pub use read::{Document, InputBuilder};

/// How serious a message is (Istio's `diag.Level`), least serious first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Level {
    Info,
    Warning,
    Error,
}

impl Level {
    /// `Error`, `Warning`, `Info`: as istioctl prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "Info",
            Level::Warning => "Warning",
            Level::Error => "Error",
        }
    }

    /// Reads a level name as istioctl's `--failure-threshold` does (any case).
    pub fn parse(text: &str) -> Option<Level> {
        [Level::Info, Level::Warning, Level::Error]
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object a message is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectRef {
    /// `VirtualService`, `Service`, ...
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    /// Where it was read (`path:line`), empty when unknown (a cluster).
    pub source: String,
}

impl ObjectRef {
    /// Istio's friendly name: `VirtualService default/reviews` (`Namespace bar` for a
    /// cluster-scoped object).
    pub fn friendly_name(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One finding, as Istio's `diag.Message`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// `IST0101`.
    pub code: &'static str,
    /// `ReferencedResourceNotFound`.
    pub name: &'static str,
    pub level: Level,
    pub object: ObjectRef,
    /// The message text, from Istio's template.
    pub text: String,
    /// The field concerned (`spec.http[0].route[0].destination.host`), where known.
    pub field: Option<String>,
    /// `https://istio.io/latest/docs/reference/config/analysis/ist0101/`.
    pub documentation_url: String,
}

impl fmt::Display for Message {
    /// As istioctl prints it: `Error [IST0101] (VirtualService default/reviews f.yaml:3)
    /// Referenced host not found: "reviews2"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = if self.object.source.is_empty() {
            String::new()
        } else {
            format!(" {}", self.object.source)
        };
        write!(
            f,
            "{} [{}] ({}{source}) {}",
            self.level,
            self.code,
            self.object.friendly_name(),
            self.text
        )
    }
}

/// Where Istio documents a code.
pub const DOC_PREFIX: &str = "https://istio.io/latest/docs/reference/config/analysis";

/// A message type of Istio's catalog: code, name, level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MessageType {
    pub(crate) code: &'static str,
    pub(crate) name: &'static str,
    pub(crate) level: Level,
}

macro_rules! catalog {
    ($($id:ident = $code:literal $name:literal $level:ident;)*) => {
        $(pub(crate) const $id: MessageType = MessageType { code: $code, name: $name, level: Level::$level };)*
        /// Every message type meshfed reports: (code, name, level).
        pub const CATALOG: &[(&str, &str, Level)] = &[$(($code, $name, Level::$level)),*];
    };
}

catalog! {
    REFERENCED_RESOURCE_NOT_FOUND = "IST0101" "ReferencedResourceNotFound" Error;
    SCHEMA_VALIDATION_ERROR = "IST0106" "SchemaValidationError" Error;
    CONFLICTING_MESH_GATEWAY_VS_HOSTS = "IST0109" "ConflictingMeshGatewayVirtualServiceHosts" Error;
    CONFLICTING_SIDECAR_SELECTORS = "IST0110" "ConflictingSidecarWorkloadSelectors" Error;
    MULTIPLE_SIDECARS_WITHOUT_SELECTORS = "IST0111" "MultipleSidecarsWithoutWorkloadSelectors" Error;
    VS_DESTINATION_PORT_SELECTOR_REQUIRED = "IST0112" "VirtualServiceDestinationPortSelectorRequired" Error;
    PORT_NAME_NOT_UNDER_CONVENTION = "IST0118" "PortNameIsNotUnderNamingConvention" Info;
    NO_MATCHING_WORKLOADS_FOUND = "IST0127" "NoMatchingWorkloadsFound" Warning;
    VS_HOST_NOT_FOUND_IN_GATEWAY = "IST0132" "VirtualServiceHostNotFoundInGateway" Warning;
    SCHEMA_WARNING = "IST0133" "SchemaWarning" Warning;
    EXTERNAL_NAME_INVALID_PORT_NAME = "IST0150" "ExternalNameServiceTypeInvalidPortName" Warning;
    CONFLICTING_TELEMETRY_SELECTORS = "IST0159" "ConflictingTelemetryWorkloadSelectors" Error;
    MULTIPLE_TELEMETRIES_WITHOUT_SELECTORS = "IST0160" "MultipleTelemetriesWithoutWorkloadSelectors" Error;
    GATEWAY_PORT_NOT_DEFINED_ON_SERVICE = "IST0162" "GatewayPortNotDefinedOnService" Warning;
}

/// A Kubernetes Service port, as the analyzers need it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub port: u32,
    /// `TCP` (the default), `UDP`, `SCTP`.
    pub protocol: String,
    pub app_protocol: Option<String>,
    /// As written (`8080`, `http`), empty when not given.
    pub target_port: String,
}

/// A Kubernetes Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Service {
    pub object: ObjectRef,
    /// `ClusterIP`, `ExternalName`, ... (empty: ClusterIP).
    pub service_type: String,
    /// `None` when the Service has no selector.
    pub selector: Option<BTreeMap<String, String>>,
    pub ports: Vec<ServicePort>,
    /// `networking.istio.io/exportTo`, split at commas.
    pub export_to: Vec<String>,
}

/// A service as a registry holds it: its fully qualified host, its ports, and the
/// namespaces it is visible in (`*`: every namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryHost {
    pub hostname: String,
    pub ports: Vec<u32>,
    pub visible_in: Vec<String>,
}

/// A pod (only its labels matter).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod {
    pub object: ObjectRef,
    pub labels: BTreeMap<String, String>,
}

/// What is analyzed.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// The valid config objects, with the warnings their validation gave.
    pub configs: Vec<(ConfigObject, Vec<Warning>)>,
    /// Objects of a kind meshfed reads that failed decoding or validation.
    pub invalid: Vec<(ObjectRef, Vec<FieldError>)>,
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    /// Namespaces known to exist (from Namespace objects, and every namespace an
    /// object was read in).
    pub namespaces: Vec<String>,
    /// Services that registries hold beyond the Kubernetes Services above (Consul,
    /// mock, ServiceEntry-derived, remote clusters; the server passes every merged
    /// service here): a destination naming one of them is found.
    pub registry_hosts: Vec<RegistryHost>,
    /// The mesh's root namespace (`istio-system`).
    pub root_namespace: String,
    /// The cluster's DNS domain (`cluster.local`).
    pub domain: String,
}

impl Inputs {
    /// Empty inputs with Istio's defaults (root namespace `istio-system`, domain
    /// `cluster.local`).
    pub fn new() -> Inputs {
        Inputs {
            root_namespace: "istio-system".into(),
            domain: "cluster.local".into(),
            ..Inputs::default()
        }
    }
}

/// An analyzer: its name (Istio's, `virtualservice.DestinationHostAnalyzer`) and
/// what it reports.
pub type Analyzer = (&'static str, fn(&Inputs, &mut Vec<Message>));

/// Every analyzer, by Istio's name. `sidecar.SelectorAnalyzer` also reports
/// namespace-wide Sidecars in conflict (IST0111), as Istio's does at HEAD.
pub const ANALYZERS: &[Analyzer] = &[
    ("schema.ValidationAnalyzer", analyzers::schema),
    (
        "virtualservice.DestinationHostAnalyzer",
        analyzers::destination_hosts,
    ),
    (
        "virtualservice.DestinationRuleAnalyzer",
        analyzers::destination_subsets,
    ),
    ("virtualservice.GatewayAnalyzer", analyzers::gateways),
    (
        "virtualservice.ConflictingMeshGatewayHostsAnalyzer",
        analyzers::conflicting_mesh_gateway_hosts,
    ),
    ("service.PortNameAnalyzer", analyzers::port_names),
    ("sidecar.SelectorAnalyzer", selectors::sidecars),
    ("telemetry.SelectorAnalyzer", selectors::telemetries),
    (
        "telemetry.DefaultSelectorAnalyzer",
        selectors::telemetry_defaults,
    ),
    ("auth.AuthorizationPoliciesAnalyzer", selectors::policies),
    (
        "gateway.IngressGatewayPortAnalyzer",
        selectors::gateway_workloads,
    ),
];

/// Runs every analyzer; messages in a stable order (object, then code).
pub fn analyze(inputs: &Inputs) -> Vec<Message> {
    analyze_with(inputs, |_| true)
}

/// Runs the analyzers whose name `wanted` accepts.
pub fn analyze_with(inputs: &Inputs, wanted: impl Fn(&str) -> bool) -> Vec<Message> {
    let mut out = Vec::new();
    for (name, run) in ANALYZERS {
        if wanted(name) {
            run(inputs, &mut out);
        }
    }
    out.sort_by(|a, b| {
        (&a.object.kind, &a.object.namespace, &a.object.name, a.code).cmp(&(
            &b.object.kind,
            &b.object.namespace,
            &b.object.name,
            b.code,
        ))
    });
    out
}

/// Builds a message of type `t` about `object`.
pub(crate) fn message(
    t: MessageType,
    object: ObjectRef,
    text: String,
    field: Option<String>,
) -> Message {
    Message {
        code: t.code,
        name: t.name,
        level: t.level,
        object,
        text,
        field,
        documentation_url: format!("{DOC_PREFIX}/{}/", t.code.to_ascii_lowercase()),
    }
}

/// The reference to a config object.
pub(crate) fn object_ref(obj: &ConfigObject) -> ObjectRef {
    ObjectRef {
        kind: obj.kind.as_str().to_string(),
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        source: obj.source.clone(),
    }
}

/// Go's `%q` of a string (enough for host names and labels).
pub(crate) fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// Go's `%v` of a string slice: `[a b]`.
pub(crate) fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// A label selector as Kubernetes prints it: `app=a,version=v1` (sorted keys).
pub(crate) fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
