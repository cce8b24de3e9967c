//! Checks across objects, for `meshfed validate`: what each object is fine on its own
//! but does not do with the others (Istio's `istioctl analyze` finds the same):
//!
//! - a VirtualService `gateways` entry naming a Gateway none of the files define
//!   (IST0101, ReferencedResourceNotFound);
//! - a Gateway server no VirtualService binds: HTTP requests to it get 404, and a TCP,
//!   TLS or PASSTHROUGH server gets no listener at all (AUTO_PASSTHROUGH servers route
//!   by SNI and need none);
//! - a Gateway server that loses Istio's merge to an older server of a Gateway with the
//!   same selector (IST0145, ConflictingGateways): another protocol on the same port
//!   and bind, or a TLS host already taken on it. Istio drops such a server, so does
//!   meshfed.
//! - a Sidecar `ingress[].tls` on a port whose PeerAuthentication mode is not DISABLE:
//!   mesh mTLS wins there and the Sidecar's TLS is not used (Istio applies it only on
//!   DISABLE ports). The root namespace is taken to be `istio-system` (the files carry
//!   no mesh config).
//!
//! These are warnings: the objects are valid and are used.

use std::collections::BTreeMap;
use std::path::Path;

use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;
use meshfed_api::networking::v1alpha3::{Gateway, Server, Sidecar, VirtualService};
use meshfed_api::security::v1beta1::PeerAuthentication;

use crate::config::model::{ConfigObject, Spec};
use crate::config::source::{Diagnostic, Severity};
use crate::config::validate::common::hosts_match;
use crate::model::Protocol;

/// Warnings about how the objects fit together; `file_of` gives each object's file.
pub(crate) fn cross_object_warnings<'a>(
    objects: impl Iterator<Item = (&'a ConfigObject, &'a Path)>,
) -> Vec<Diagnostic> {
    let mut gateways: Vec<(&ConfigObject, &Gateway, &Path)> = Vec::new();
    let mut virtual_services: Vec<(&ConfigObject, &VirtualService, &Path)> = Vec::new();
    let mut sidecars: Vec<(&ConfigObject, &Sidecar, &Path)> = Vec::new();
    let mut peer_auths: Vec<(&ConfigObject, &PeerAuthentication)> = Vec::new();
    for (obj, file) in objects {
        match &obj.spec {
            Spec::Gateway(g) => gateways.push((obj, g, file)),
            Spec::VirtualService(vs) => virtual_services.push((obj, vs, file)),
            Spec::Sidecar(sc) => sidecars.push((obj, sc, file)),
            Spec::PeerAuthentication(pa) => peer_auths.push((obj, pa)),
            _ => {}
        }
    }
    // Istio's merge order: oldest first, then namespace and name.
    gateways.sort_by(|a, b| {
        (a.0.creation_time, &a.0.namespace, &a.0.name).cmp(&(
            b.0.creation_time,
            &b.0.namespace,
            &b.0.name,
        ))
    });
    let mut out = Vec::new();
    let warn = |obj: &ConfigObject, file: &Path, field: String, message: String| Diagnostic {
        severity: Severity::Warning,
        file: file.to_path_buf(),
        line: obj
            .source
            .rsplit_once(':')
            .and_then(|(_, l)| l.parse().ok()),
        kind: obj.kind.to_string(),
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        field,
        message,
    };

    // VirtualServices naming Gateways that do not exist.
    for (obj, vs, file) in &virtual_services {
        for (i, g) in vs.gateways.iter().enumerate() {
            if g == "mesh" {
                continue;
            }
            let (ns, name) = gateway_ref(g, &obj.namespace);
            if !gateways
                .iter()
                .any(|(o, _, _)| o.namespace == ns && o.name == name)
            {
                out.push(warn(
                    obj,
                    file,
                    format!("spec.gateways[{i}]"),
                    format!("Gateway {ns}/{name} is not defined in the files checked"),
                ));
            }
        }
    }

    // Servers without a VirtualService.
    for (obj, gw, file) in &gateways {
        for (i, server) in gw.servers.iter().enumerate() {
            let Some(port) = server.port.as_ref() else {
                continue;
            };
            let protocol = Protocol::parse(&port.protocol);
            let mode = server.tls.as_ref().map(|t| t.mode());
            if mode == Some(TlSmode::AutoPassthrough)
                || (protocol.is_http() && server.tls.as_ref().is_some_and(|t| t.https_redirect))
            {
                continue;
            }
            let terminated_https = protocol == Protocol::Https
                && server.tls.is_some()
                && mode != Some(TlSmode::Passthrough);
            let bound = virtual_services.iter().any(|(vo, vs, _)| {
                let names_it = vs.gateways.iter().any(|g| {
                    let (ns, name) = gateway_ref(g, &vo.namespace);
                    ns == obj.namespace && name == obj.name
                });
                let routes = if protocol.is_http() || terminated_https {
                    !vs.http.is_empty()
                } else if mode == Some(TlSmode::Passthrough) {
                    !vs.tls.is_empty()
                } else {
                    !vs.tcp.is_empty()
                };
                names_it && routes && hosts_meet(server, &obj.namespace, &vo.namespace, &vs.hosts)
            });
            if !bound {
                let what = if protocol.is_http() || terminated_https {
                    "requests to it are answered 404"
                } else {
                    "it gets no listener"
                };
                out.push(warn(
                    obj,
                    file,
                    format!("spec.servers[{i}]"),
                    format!(
                        "no VirtualService with {} routes binds this server (port {}): {what}",
                        if protocol.is_http() || terminated_https {
                            "http"
                        } else if mode == Some(TlSmode::Passthrough) {
                            "tls"
                        } else {
                            "tcp"
                        },
                        port.number
                    ),
                ));
            }
        }
    }

    // Servers that lose the merge of Gateways selecting the same workloads.
    #[derive(Default)]
    struct PortState {
        /// The first server when it is plaintext: its protocol and Gateway.
        plain: Option<(Protocol, String)>,
        /// The Gateway of the first server when it is a TLS server.
        tls: Option<String>,
        /// TLS hosts taken, and by which Gateway.
        tls_hosts: BTreeMap<String, String>,
    }
    // Selector -> (port, bind) -> what holds it.
    type Ports = BTreeMap<(u32, String), PortState>;
    let mut by_selector: BTreeMap<Vec<(String, String)>, Ports> = BTreeMap::new();
    for (obj, gw, file) in &gateways {
        let selector: Vec<(String, String)> = gw
            .selector
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let ports = by_selector.entry(selector).or_default();
        let name = format!("{}/{}", obj.namespace, obj.name);
        for (i, server) in gw.servers.iter().enumerate() {
            let Some(port) = server.port.as_ref() else {
                continue;
            };
            let protocol = Protocol::parse(&port.protocol);
            let state = ports.entry((port.number, server.bind.clone())).or_default();
            let dup = server.tls.as_ref().and_then(|_| {
                server
                    .hosts
                    .iter()
                    .find_map(|h| state.tls_hosts.get(h).map(|g| (h, g)))
            });
            let conflict = if let Some((host, other)) = dup {
                Some(format!(
                    "TLS host {host} on port {} is already served by Gateway {other}",
                    port.number
                ))
            } else if let Some((first, other)) = &state.plain {
                let mergeable = (first.is_http() || *first == protocol) && protocol.is_http();
                (!mergeable).then(|| {
                    format!(
                        "port {} already serves {first} from Gateway {other}",
                        port.number
                    )
                })
            } else if let (Some(other), None) = (&state.tls, &server.tls) {
                Some(format!(
                    "port {} serves TLS from Gateway {other}; a server without TLS settings cannot join it",
                    port.number
                ))
            } else {
                None
            };
            match conflict {
                Some(reason) => out.push(warn(
                    obj,
                    file,
                    format!("spec.servers[{i}]"),
                    format!("this server is dropped, as Istio drops it: {reason}"),
                )),
                None => {
                    if state.plain.is_none() && state.tls.is_none() {
                        if server.tls.is_some() && !protocol.is_http() {
                            state.tls = Some(name.clone());
                        } else {
                            state.plain = Some((protocol, name.clone()));
                        }
                    }
                    if server.tls.is_some() {
                        for h in &server.hosts {
                            state.tls_hosts.insert(h.clone(), name.clone());
                        }
                    }
                }
            }
        }
    }
    for (obj, sidecar, file) in &sidecars {
        for (i, ingress) in sidecar.ingress.iter().enumerate() {
            let Some(port) = ingress.port.as_ref().filter(|_| ingress.tls.is_some()) else {
                continue;
            };
            if !mtls_disabled_on(&peer_auths, obj, sidecar, port.number) {
                out.push(warn(
                    obj,
                    file,
                    format!("spec.ingress[{i}].tls"),
                    format!(
                        "not used: port {} accepts mesh mTLS (no PeerAuthentication of namespace {} or {ROOT_NAMESPACE} sets DISABLE for it), and a Sidecar's TLS applies only where the port's mode is DISABLE",
                        port.number, obj.namespace
                    ),
                ));
            }
        }
    }
    out
}

/// The root namespace `meshfed validate` assumes (Istio's default).
const ROOT_NAMESPACE: &str = "istio-system";

/// Whether some PeerAuthentication could make `port` DISABLE for the Sidecar's
/// workloads: one of the Sidecar's namespace (without selector, or with a selector the
/// Sidecar's workload selector implies) or the root namespace's mesh policy, setting
/// DISABLE for the port or workload-wide.
fn mtls_disabled_on(
    peer_auths: &[(&ConfigObject, &PeerAuthentication)],
    sidecar_obj: &ConfigObject,
    sidecar: &Sidecar,
    port: u32,
) -> bool {
    use meshfed_api::security::v1beta1::peer_authentication::mutual_tls::Mode;
    let sidecar_labels = sidecar.workload_selector.as_ref().map(|s| &s.labels);
    peer_auths.iter().any(|(obj, pa)| {
        let selector = pa
            .selector
            .as_ref()
            .map(|s| &s.match_labels)
            .filter(|l| !l.is_empty());
        let applies = match selector {
            None => obj.namespace == sidecar_obj.namespace || obj.namespace == ROOT_NAMESPACE,
            Some(sel) => {
                obj.namespace == sidecar_obj.namespace
                    && sidecar_labels.is_some_and(|l| sel.iter().all(|(k, v)| l.get(k) == Some(v)))
            }
        };
        // A port-level mode other than UNSET decides; else the policy's own.
        let mode = pa
            .port_level_mtls
            .get(&port)
            .filter(|m| m.mode != Mode::Unset as i32)
            .or(pa.mtls.as_ref())
            .map(|m| m.mode);
        applies && mode == Some(Mode::Disable as i32)
    })
}

/// `(namespace, name)` of a VirtualService's `gateways` entry: `ns/name`, or a name
/// in the VirtualService's namespace.
fn gateway_ref<'a>(g: &'a str, vs_ns: &'a str) -> (&'a str, &'a str) {
    match g.split_once('/') {
        Some((".", name)) => (vs_ns, name),
        Some((ns, name)) => (ns, name),
        None => (vs_ns, g.split('.').next().unwrap_or(g)),
    }
}

/// Whether a VirtualService in `vs_ns` with `hosts` may bind one of the server's hosts.
fn hosts_meet(server: &Server, gw_ns: &str, vs_ns: &str, hosts: &[String]) -> bool {
    server.hosts.iter().any(|h| {
        let host = match h.split_once('/') {
            Some(("*", host)) => host,
            Some((".", host)) if vs_ns == gw_ns => host,
            Some((ns, host)) if ns == vs_ns => host,
            Some(_) => return false,
            None => h.as_str(),
        };
        hosts.iter().any(|v| {
            // A short name is a service of the VirtualService's namespace.
            let full;
            let v = if v.contains('.') || v.contains('*') {
                v.as_str()
            } else {
                full = format!("{v}.{vs_ns}.svc.cluster.local");
                full.as_str()
            };
            hosts_match(host, v)
        })
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::validate_text;

    fn warnings(yaml: &str) -> Vec<String> {
        let report = validate_text(Path::new("gw.yaml"), yaml);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.warnings.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn sidecar_ingress_tls_on_a_port_with_mesh_mtls_is_warned_about() {
        let sidecar = "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: sc, namespace: default}
spec:
  workloadSelector: {labels: {app: foo}}
  ingress:
  - port: {number: 9080, protocol: HTTPS, name: https}
    defaultEndpoint: 127.0.0.1:9080
    tls: {mode: SIMPLE, serverCertificate: c.pem, privateKey: k.pem}
";
        let w = warnings(sidecar);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("spec.ingress[0].tls: not used: port 9080 accepts mesh mTLS"),
            "{w:?}"
        );
        let pa = |ns: &str, selector: &str, mode: &str, port_mode: &str| {
            let ports = if selector.is_empty() {
                String::new()
            } else {
                format!("  portLevelMtls:\n    9080: {{mode: {port_mode}}}\n")
            };
            format!(
                "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: pa, namespace: {ns}}}\nspec:\n{selector}  mtls: {{mode: {mode}}}\n{ports}"
            )
        };
        let foo = "  selector: {matchLabels: {app: foo}}\n";
        // The port (or the workload, or the mesh) DISABLE: used.
        assert!(
            warnings(&(sidecar.to_string() + &pa("default", foo, "STRICT", "DISABLE"))).is_empty()
        );
        assert!(
            warnings(&(sidecar.to_string() + &pa("default", foo, "DISABLE", "UNSET"))).is_empty()
        );
        assert!(
            warnings(&(sidecar.to_string() + &pa("istio-system", "", "DISABLE", "UNSET")))
                .is_empty()
        );
        // Overridden for the port, another workload, another namespace: not used.
        assert_eq!(
            warnings(&(sidecar.to_string() + &pa("default", foo, "DISABLE", "STRICT"))).len(),
            1
        );
        let bar = "  selector: {matchLabels: {app: bar}}\n";
        assert_eq!(
            warnings(&(sidecar.to_string() + &pa("default", bar, "DISABLE", "DISABLE"))).len(),
            1
        );
        assert_eq!(
            warnings(&(sidecar.to_string() + &pa("prod", "", "DISABLE", "DISABLE"))).len(),
            1
        );
    }

    const GATEWAY: &str = "apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [\"*.example.com\"]
  - port: {number: 31400, name: tcp, protocol: TCP}
    hosts: [\"*\"]
  - port: {number: 15443, name: tls, protocol: TLS}
    hosts: [\"*.local\"]
    tls: {mode: AUTO_PASSTHROUGH}
";

    #[test]
    fn servers_no_virtual_service_binds_are_named() {
        let w = warnings(GATEWAY);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("gw.yaml:1: Gateway istio-system/gw: spec.servers[0]: no VirtualService with http routes binds this server (port 80): requests to it are answered 404"), "{w:?}");
        assert!(w[1].contains("spec.servers[1]: no VirtualService with tcp routes binds this server (port 31400): it gets no listener"), "{w:?}");

        // Bound by host and gateway: quiet. A VirtualService of another namespace
        // binds too, the gateway named as `ns/name`.
        let bound = format!(
            "{GATEWAY}---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: default}}
spec:
  hosts: [shop.example.com]
  gateways: [istio-system/gw]
  http:
  - route: [{{destination: {{host: shop}}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: raw, namespace: istio-system}}
spec:
  hosts: [\"*\"]
  gateways: [gw]
  tcp:
  - route: [{{destination: {{host: db.default.svc.cluster.local}}}}]
"
        );
        assert_eq!(warnings(&bound), Vec::<String>::new());
    }

    #[test]
    fn a_virtual_service_naming_a_missing_gateway_is_warned_about() {
        let w = warnings(
            "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: default}
spec:
  hosts: [shop.example.com]
  gateways: [mesh, ingress]
  http:
  - route: [{destination: {host: shop}}]
",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("spec.gateways[1]: Gateway default/ingress is not defined"),
            "{w:?}"
        );
    }

    #[test]
    fn servers_that_lose_the_merge_are_warned_about() {
        let two = |first: &str, second: &str| {
            format!(
                "apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: alpha, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - {first}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: beta, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - {second}
"
            )
        };
        let tcp = "{port: {number: 80, name: tcp, protocol: TCP}, hosts: [foo.bar]}";
        let http = "{port: {number: 80, name: http, protocol: HTTP}, hosts: [foo.bar]}";
        let w = warnings(&two(tcp, http));
        assert!(
            w.iter().any(|w| w.contains("Gateway default/beta: spec.servers[0]: this server is dropped, as Istio drops it: port 80 already serves TCP from Gateway default/alpha")),
            "{w:?}"
        );
        let tls = |name: &str| {
            format!(
                "{{port: {{number: 443, name: {name}, protocol: HTTPS}}, hosts: [a.example.com], tls: {{mode: SIMPLE, credentialName: c}}}}"
            )
        };
        let w = warnings(&two(&tls("one"), &tls("two")));
        assert!(
            w.iter().any(|w| w.contains("beta: spec.servers[0]: this server is dropped, as Istio drops it: TLS host a.example.com on port 443 is already served by Gateway default/alpha")),
            "{w:?}"
        );
        // Two HTTP servers merge.
        let w = warnings(&two(http, http));
        assert!(!w.iter().any(|w| w.contains("dropped")), "{w:?}");
    }
}
