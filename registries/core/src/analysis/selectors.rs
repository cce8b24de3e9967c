//! The analyzers of workload selectors (after Istio's `analyzers/sidecar`,
//! `analyzers/telemetry`, `analyzers/authz` and `analyzers/gateway`): selectors that
//! select no pod, objects that select the same pod, several namespace-wide objects.

use std::collections::{BTreeMap, BTreeSet};

use meshfed_api::networking::v1alpha3 as net;
use meshfed_api::security::v1beta1 as sec;
use meshfed_api::telemetry::v1alpha1 as tel;

use super::analyzers::of_kind;
use super::{
    CONFLICTING_SIDECAR_SELECTORS, CONFLICTING_TELEMETRY_SELECTORS,
    GATEWAY_PORT_NOT_DEFINED_ON_SERVICE, Inputs, MULTIPLE_SIDECARS_WITHOUT_SELECTORS,
    MULTIPLE_TELEMETRIES_WITHOUT_SELECTORS, Message, MessageType, NO_MATCHING_WORKLOADS_FOUND, Pod,
    REFERENCED_RESOURCE_NOT_FOUND, go_list, message, object_ref, quote, selector_string,
};
use crate::config::ConfigObject;

/// Whether `labels` has every `key=value` of `selector` (an empty selector matches
/// everything, as Kubernetes' `SelectorFromSet`).
pub(super) fn matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// One object with a workload selector, for the shared sidecar/telemetry checks.
struct Selecting<'a> {
    obj: &'a ConfigObject,
    /// `None`: namespace-wide (no selector, or an empty one).
    selector: Option<&'a BTreeMap<String, String>>,
    field: &'static str,
}

/// Types of the messages of one family (sidecars or telemetries).
struct Family {
    conflicting: MessageType,
    conflicting_text: &'static str,
    multiple: MessageType,
    multiple_text: &'static str,
}

/// Which findings of [`selecting`] are reported.
#[derive(Clone, Copy)]
struct Parts {
    /// Selectors that select nothing, and pods selected twice.
    selectors: bool,
    /// Several namespace-wide objects in one namespace.
    defaults: bool,
}

fn selecting(
    inputs: &Inputs,
    items: Vec<Selecting<'_>>,
    family: &Family,
    parts: Parts,
    out: &mut Vec<Message>,
) {
    let mut pods_to_objects: BTreeMap<(String, String), Vec<&ConfigObject>> = BTreeMap::new();
    let mut namespace_wide: BTreeMap<String, Vec<&ConfigObject>> = BTreeMap::new();
    for item in &items {
        let Some(selector) = item.selector else {
            namespace_wide
                .entry(item.obj.namespace.clone())
                .or_default()
                .push(item.obj);
            continue;
        };
        let mut found = false;
        for pod in inputs
            .pods
            .iter()
            .filter(|p| p.object.namespace == item.obj.namespace)
        {
            if matches(selector, &pod.labels) {
                found = true;
                pods_to_objects
                    .entry((pod.object.namespace.clone(), pod.object.name.clone()))
                    .or_default()
                    .push(item.obj);
            }
        }
        if !found && parts.selectors {
            out.push(message(
                REFERENCED_RESOURCE_NOT_FOUND,
                object_ref(item.obj),
                format!(
                    "Referenced selector not found: {}",
                    quote(&selector_string(selector))
                ),
                Some(item.field.to_string()),
            ));
        }
    }
    for ((ns, pod), objects) in pods_to_objects {
        if objects.len() < 2 || !parts.selectors {
            continue;
        }
        let names: Vec<String> = objects.iter().map(|o| o.name.clone()).collect();
        for obj in objects {
            out.push(message(
                family.conflicting,
                object_ref(obj),
                family
                    .conflicting_text
                    .replacen("{names}", &go_list(&names), 1)
                    .replacen("{ns}", &quote(&ns), 1)
                    .replacen("{pod}", &quote(&pod), 1),
                None,
            ));
        }
    }
    for (ns, objects) in namespace_wide {
        if objects.len() < 2 || !parts.defaults {
            continue;
        }
        let names: Vec<String> = objects.iter().map(|o| o.name.clone()).collect();
        for obj in objects {
            out.push(message(
                family.multiple,
                object_ref(obj),
                family
                    .multiple_text
                    .replacen("{names}", &go_list(&names), 1)
                    .replacen("{ns}", &quote(&ns), 1),
                None,
            ));
        }
    }
}

/// `sidecar.SelectorAnalyzer` and `sidecar.DefaultSelectorAnalyzer`: IST0101
/// (selects no pod of its namespace), IST0110 (two select one pod), IST0111 (two
/// without a selector in one namespace).
pub(super) fn sidecars(inputs: &Inputs, out: &mut Vec<Message>) {
    let items = of_kind::<net::Sidecar>(inputs)
        .map(|(obj, s)| Selecting {
            obj,
            selector: s
                .workload_selector
                .as_ref()
                .map(|w| &w.labels)
                .filter(|l| !l.is_empty()),
            field: "spec.workloadSelector",
        })
        .collect();
    let family = Family {
        conflicting: CONFLICTING_SIDECAR_SELECTORS,
        conflicting_text: "The Sidecars {names} in namespace {ns} select the same workload pod {pod}, which can lead to undefined behavior.",
        multiple: MULTIPLE_SIDECARS_WITHOUT_SELECTORS,
        multiple_text: "The Sidecars {names} in namespace {ns} have no workload selector, which can lead to undefined behavior.",
    };
    let both = Parts {
        selectors: true,
        defaults: true,
    };
    selecting(inputs, items, &family, both, out);
}

/// `telemetry.SelectorAnalyzer`: IST0101, IST0159.
pub(super) fn telemetries(inputs: &Inputs, out: &mut Vec<Message>) {
    let parts = Parts {
        selectors: true,
        defaults: false,
    };
    telemetry_findings(inputs, parts, out);
}

/// `telemetry.DefaultSelectorAnalyzer`: IST0160.
pub(super) fn telemetry_defaults(inputs: &Inputs, out: &mut Vec<Message>) {
    let parts = Parts {
        selectors: false,
        defaults: true,
    };
    telemetry_findings(inputs, parts, out);
}

/// Telemetries attached by `targetRef(s)` are left out.
fn telemetry_findings(inputs: &Inputs, parts: Parts, out: &mut Vec<Message>) {
    let items = of_kind::<tel::Telemetry>(inputs)
        .filter(|(_, t)| t.target_ref.is_none() && t.target_refs.is_empty())
        .map(|(obj, t)| Selecting {
            obj,
            selector: t
                .selector
                .as_ref()
                .map(|w| &w.match_labels)
                .filter(|l| !l.is_empty()),
            field: "spec.selector",
        })
        .collect();
    let family = Family {
        conflicting: CONFLICTING_TELEMETRY_SELECTORS,
        conflicting_text: "The Telemetries {names} in namespace {ns} select the same workload pod {pod}, which can lead to undefined behavior.",
        multiple: MULTIPLE_TELEMETRIES_WITHOUT_SELECTORS,
        multiple_text: "The Telemetries {names} in namespace {ns} have no workload selector, which can lead to undefined behavior.",
    };
    selecting(inputs, items, &family, parts, out);
}

fn pods_in<'a>(inputs: &'a Inputs, namespace: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
    inputs
        .pods
        .iter()
        .filter(move |p| p.object.namespace == namespace)
}

/// Istio's `namespaceMatch` of a namespace expression (`prod-*`, `*-test`, `*`).
fn namespace_match(ns: &str, exp: &str) -> bool {
    if exp == "*" {
        return true;
    }
    if let Some(suffix) = exp.strip_prefix('*') {
        return ns.ends_with(suffix);
    }
    if let Some(prefix) = exp.strip_suffix('*') {
        return ns.starts_with(prefix);
    }
    ns.eq_ignore_ascii_case(exp)
}

/// `auth.AuthorizationPoliciesAnalyzer` (IST0127 for a policy selecting no pod,
/// IST0101 for a source namespace matching no namespace), and the same IST0127 for
/// PeerAuthentication and RequestAuthentication selectors.
pub(super) fn policies(inputs: &Inputs, out: &mut Vec<Message>) {
    let check = |obj: &ConfigObject,
                 selector: Option<&BTreeMap<String, String>>,
                 out: &mut Vec<Message>| {
        let no_match = |labels: String| {
            message(
                NO_MATCHING_WORKLOADS_FOUND,
                object_ref(obj),
                format!(
                    "No matching workloads for this resource with the following labels: {labels}"
                ),
                Some("spec.selector".to_string()),
            )
        };
        if obj.namespace == inputs.root_namespace {
            if let Some(sel) = selector
                && !inputs.pods.iter().any(|p| matches(sel, &p.labels))
            {
                out.push(no_match(selector_string(sel)));
            }
            return;
        }
        match selector {
            None => {
                if pods_in(inputs, &obj.namespace).next().is_none() {
                    out.push(no_match(String::new()));
                }
            }
            Some(sel) => {
                if !pods_in(inputs, &obj.namespace).any(|p| matches(sel, &p.labels)) {
                    out.push(no_match(selector_string(sel)));
                }
            }
        }
    };
    for (obj, ap) in of_kind::<sec::AuthorizationPolicy>(inputs) {
        if ap.target_ref.is_none() && ap.target_refs.is_empty() {
            check(obj, ap.selector.as_ref().map(|s| &s.match_labels), out);
        }
        for (i, rule) in ap.rules.iter().enumerate() {
            for (j, from) in rule.from.iter().enumerate() {
                let Some(source) = &from.source else { continue };
                let listed = source
                    .namespaces
                    .iter()
                    .map(|n| ("namespaces", n))
                    .enumerate()
                    .chain(
                        source
                            .not_namespaces
                            .iter()
                            .map(|n| ("notNamespaces", n))
                            .enumerate(),
                    );
                for (k, (field, ns)) in listed {
                    if !inputs
                        .namespaces
                        .iter()
                        .any(|known| namespace_match(known, ns))
                    {
                        out.push(message(
                            REFERENCED_RESOURCE_NOT_FOUND,
                            object_ref(obj),
                            format!("Referenced namespace not found: {}", quote(ns)),
                            Some(format!("spec.rules[{i}].from[{j}].source.{field}[{k}]")),
                        ));
                    }
                }
            }
        }
    }
    // Istio has no analyzer of these selectors; meshfed reports them as it reports
    // AuthorizationPolicy's, where a selector is set.
    for (obj, pa) in of_kind::<sec::PeerAuthentication>(inputs) {
        if let Some(sel) = pa
            .selector
            .as_ref()
            .map(|s| &s.match_labels)
            .filter(|l| !l.is_empty())
        {
            check(obj, Some(sel), out);
        }
    }
    for (obj, ra) in of_kind::<sec::RequestAuthentication>(inputs) {
        if ra.target_ref.is_some() || !ra.target_refs.is_empty() {
            continue;
        }
        if let Some(sel) = ra
            .selector
            .as_ref()
            .map(|s| &s.match_labels)
            .filter(|l| !l.is_empty())
        {
            check(obj, Some(sel), out);
        }
    }
}

/// `gateway.IngressGatewayPortAnalyzer`: a Gateway whose selector matches no pod
/// (IST0101), and a server port no Service of its pods exposes as a TCP target port
/// (IST0162).
pub(super) fn gateway_workloads(inputs: &Inputs, out: &mut Vec<Message>) {
    for (obj, gw) in of_kind::<net::Gateway>(inputs) {
        let selector = &gw.selector;
        let selected: Vec<&Pod> = inputs
            .pods
            .iter()
            .filter(|p| matches(selector, &p.labels))
            .collect();
        let shown = selector_string(selector);
        if selected.is_empty() {
            out.push(message(
                REFERENCED_RESOURCE_NOT_FOUND,
                object_ref(obj),
                format!("Referenced selector not found: {}", quote(&shown)),
                Some("spec.selector".to_string()),
            ));
            continue;
        }
        let mut ports = BTreeSet::new();
        for pod in &selected {
            for svc in inputs
                .services
                .iter()
                .filter(|s| s.object.namespace == pod.object.namespace)
            {
                let empty = BTreeMap::new();
                if !matches(svc.selector.as_ref().unwrap_or(&empty), &pod.labels) {
                    continue;
                }
                for p in svc.ports.iter().filter(|p| p.protocol == "TCP") {
                    match p.target_port.parse::<u32>() {
                        Ok(tp) if tp != 0 => ports.insert(tp),
                        _ => ports.insert(p.port),
                    };
                }
            }
        }
        for (i, server) in gw.servers.iter().enumerate() {
            if let Some(port) = &server.port
                && !ports.contains(&port.number)
            {
                out.push(message(
                    GATEWAY_PORT_NOT_DEFINED_ON_SERVICE,
                    object_ref(obj),
                    format!(
                        "The gateway is listening on a target port (port {}) that is not defined in the Service \
                         associated with its workload instances (Pod selector {shown}). If you need to access the \
                         gateway port through the gateway Service, it will not be available.",
                        port.number
                    ),
                    Some(format!("spec.servers[{i}].port")),
                ));
            }
        }
    }
}
