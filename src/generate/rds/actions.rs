//! Route actions and options besides the destination: header operations, redirects,
//! direct responses, mirrors, faults, CORS and the VirtualService's metadata.

use envoy_types::pb::google::protobuf::Duration as PbDuration;
use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, Metadata, RuntimeFractionalPercent, data_source,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, RedirectAction, redirect_action, route, route_action,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as CorsFilterPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Value, value::Kind};
use meshfed_api::networking::v1alpha3::{
    self as istio, HttpRoute, VirtualService, http_body, http_fault_injection, http_redirect,
};
use prost::{Message, Name};

use super::matching::*;
use crate::push::config_index::Config;

/// `istio` filter metadata naming the VirtualService a route came from.
pub(super) fn config_metadata(vs: &Config<VirtualService>) -> Metadata {
    let path = format!(
        "/apis/networking.istio.io/v1alpha3/namespaces/{}/virtual-service/{}",
        vs.namespace, vs.name
    );
    let mut fields = BTreeMap::new();
    fields.insert(
        "config".to_string(),
        Value {
            kind: Some(Kind::StringValue(path)),
        },
    );
    Metadata {
        filter_metadata: crate::generate::proto::stable_map([(
            "istio".to_string(),
            crate::generate::proto::stable_struct(fields),
        )]),
        ..Default::default()
    }
}

#[derive(Default)]
pub(super) struct HeaderOps {
    pub(super) request_add: Vec<HeaderValueOption>,
    pub(super) response_add: Vec<HeaderValueOption>,
    pub(super) request_remove: Vec<String>,
    pub(super) response_remove: Vec<String>,
    /// `:authority`/`host` set or added: becomes a host rewrite.
    pub(super) authority: String,
}

/// Istio's `TranslateHeadersOperations`: `set` overwrites, `add` appends (each sorted
/// by name); pseudo-headers and `host` cannot be changed this way (an authority value
/// becomes a host rewrite instead).
pub(super) fn header_operations(headers: &istio::Headers) -> HeaderOps {
    let empty = istio::headers::HeaderOperations::default();
    let req = headers.request.as_ref().unwrap_or(&empty);
    let resp = headers.response.as_ref().unwrap_or(&empty);
    let (mut request_add, set_authority) = header_options(&req.set, false);
    let (req_add, add_authority) = header_options(&req.add, true);
    request_add.extend(req_add);
    let (mut response_add, _) = header_options(&resp.set, false);
    response_add.extend(header_options(&resp.add, true).0);
    let drop_internal = |keys: &[String]| -> Vec<String> {
        keys.iter()
            .filter(|k| !is_internal_header(k))
            .cloned()
            .collect()
    };
    HeaderOps {
        request_add,
        response_add,
        request_remove: drop_internal(&req.remove),
        response_remove: drop_internal(&resp.remove),
        authority: if set_authority.is_empty() {
            add_authority
        } else {
            set_authority
        },
    }
}

pub(super) fn header_options(
    headers: &BTreeMap<String, String>,
    append: bool,
) -> (Vec<HeaderValueOption>, String) {
    let mut authority = String::new();
    let mut out = Vec::new();
    for (key, value) in headers {
        if key.eq_ignore_ascii_case(":authority") || key.eq_ignore_ascii_case("host") {
            authority = value.clone();
        }
        if is_internal_header(key) {
            continue;
        }
        let action = if append {
            HeaderAppendAction::AppendIfExistsOrAdd
        } else {
            HeaderAppendAction::OverwriteIfExistsOrAdd
        };
        out.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        });
    }
    (out, authority)
}

pub(super) fn is_internal_header(key: &str) -> bool {
    key.starts_with(':') || key.eq_ignore_ascii_case("host")
}

/// Istio's `ApplyRedirect`; `None` for a response code Envoy cannot send.
pub(super) fn redirect_action(
    r: &istio::HttpRedirect,
    port: u16,
    tls: bool,
) -> Option<route::Action> {
    use redirect_action::RedirectResponseCode as Code;
    let mut out = RedirectAction {
        host_redirect: r.authority.clone(),
        path_rewrite_specifier: Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            r.uri.clone(),
        )),
        ..Default::default()
    };
    if !r.scheme.is_empty() {
        out.scheme_rewrite_specifier = Some(
            redirect_action::SchemeRewriteSpecifier::SchemeRedirect(r.scheme.clone()),
        );
    }
    if let Some(rp) = r.redirect_port {
        match rp {
            http_redirect::RedirectPort::DerivePort(d) => {
                if d == http_redirect::RedirectPortSelection::FromRequestPort as i32 {
                    // Routes are built per port, so "the request's port" is this one.
                    out.port_redirect = u32::from(port);
                }
            }
            http_redirect::RedirectPort::Port(p) => out.port_redirect = p,
        }
        let scheme = if !r.scheme.is_empty() {
            r.scheme.as_str()
        } else if tls {
            "https"
        } else {
            "http"
        };
        // No explicit default port for the scheme.
        if (out.port_redirect == 80 && scheme == "http")
            || (out.port_redirect == 443 && scheme == "https")
        {
            out.port_redirect = 0;
        }
    }
    out.response_code = match r.redirect_code {
        0 | 301 => Code::MovedPermanently,
        302 => Code::Found,
        303 => Code::SeeOther,
        307 => Code::TemporaryRedirect,
        308 => Code::PermanentRedirect,
        other => {
            tracing::warn!(code = other, "redirect code not supported; route left out");
            return None;
        }
    } as i32;
    Some(route::Action::Redirect(out))
}

pub(super) fn direct_response_action(d: &istio::HttpDirectResponse) -> route::Action {
    let body = d
        .body
        .as_ref()
        .and_then(|b| b.specifier.as_ref())
        .map(|s| DataSource {
            specifier: Some(match s {
                http_body::Specifier::String(s) => data_source::Specifier::InlineString(s.clone()),
                http_body::Specifier::Bytes(b) => data_source::Specifier::InlineBytes(b.clone()),
            }),
            ..Default::default()
        });
    route::Action::DirectResponse(DirectResponseAction {
        status: d.status,
        body,
        ..Default::default()
    })
}

pub(super) fn percent_of(p: &istio::Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value * 10_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

pub(super) fn integer_percent(p: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: p,
        denominator: DenominatorType::Hundred as i32,
    }
}

/// The mirror fraction of a route's `mirror`: `mirrorPercentage`, else the legacy
/// `mirrorPercent`, else 100 %; an explicit 0 disables mirroring.
pub(super) fn mirror_percent(http: &HttpRoute) -> Option<RuntimeFractionalPercent> {
    let default_value = if let Some(p) = &http.mirror_percentage {
        (p.value > 0.0).then(|| percent_of(p))?
    } else if let Some(p) = &http.mirror_percent {
        (p.value > 0).then(|| integer_percent(p.value))?
    } else {
        integer_percent(100)
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(default_value),
        ..Default::default()
    })
}

pub(super) fn mirror_policy_percent(
    m: &istio::HttpMirrorPolicy,
) -> Option<RuntimeFractionalPercent> {
    let default_value = match &m.percentage {
        Some(p) => (p.value > 0.0).then(|| percent_of(p))?,
        None => integer_percent(100),
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(default_value),
        ..Default::default()
    })
}

pub(super) fn mirror_policy(
    cluster: String,
    fraction: RuntimeFractionalPercent,
) -> route_action::RequestMirrorPolicy {
    route_action::RequestMirrorPolicy {
        cluster,
        runtime_fraction: Some(fraction),
        trace_sampled: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// Istio's `TranslateFault`: fixed delays and HTTP/gRPC aborts (exponential delays and
/// HTTP/2 errors are not supported and dropped); `None` when nothing is left.
pub(super) fn translate_fault(f: &istio::HttpFaultInjection) -> Option<HttpFault> {
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = match d.http_delay_type? {
            http_fault_injection::delay::HttpDelayType::FixedDelay(fixed) => fixed,
            http_fault_injection::delay::HttpDelayType::ExponentialDelay(_) => return None,
        };
        Some(FaultDelay {
            percentage: Some(match &d.percentage {
                Some(p) => percent_of(p),
                None => integer_percent(d.percent.max(0) as u32),
            }),
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(pb_duration(
                &fixed,
            ))),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        let error_type = match a.error_type.as_ref()? {
            http_fault_injection::abort::ErrorType::HttpStatus(s) => {
                fault_abort::ErrorType::HttpStatus(*s as u32)
            }
            http_fault_injection::abort::ErrorType::GrpcStatus(name) => {
                let code = meshfed_registry::config::validate::grpc_status_code(name)?;
                fault_abort::ErrorType::GrpcStatus(code)
            }
            http_fault_injection::abort::ErrorType::Http2Error(_) => return None,
        };
        Some(FaultAbort {
            percentage: a.percentage.as_ref().map(percent_of),
            error_type: Some(error_type),
            ..Default::default()
        })
    });
    (delay.is_some() || abort.is_some()).then(|| HttpFault {
        delay,
        abort,
        ..Default::default()
    })
}

/// Istio's `TranslateCORSPolicy`.
pub(super) fn translate_cors(c: &istio::CorsPolicy) -> CorsFilterPolicy {
    let origins = if !c.allow_origins.is_empty() {
        c.allow_origins
            .iter()
            .filter(|m| m.match_type.is_some())
            .map(string_matcher_of)
            .collect()
    } else {
        c.allow_origin
            .iter()
            .map(|o| StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(o.clone())),
                ..Default::default()
            })
            .collect()
    };
    CorsFilterPolicy {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c.max_age.map(|d| d.seconds.to_string()).unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|b| BoolValue { value: b.value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(integer_percent(100)),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(BoolValue {
            value: c.unmatched_preflights != istio::cors_policy::UnmatchedPreflights::Ignore as i32,
        }),
        ..Default::default()
    }
}

pub(super) fn any<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

pub(super) fn pb_duration(d: &meshfed_api::Duration) -> PbDuration {
    PbDuration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}
