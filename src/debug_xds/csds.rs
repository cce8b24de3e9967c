//! What CSDS answers: per connected proxy (those `node_matchers` select by node id),
//! a `ClientConfig` whose `generic_xds_configs` carry, per type, each resource the
//! proxy was sent (from the config-dump builder) with its version, the proxy's answer
//! (`client_status`) and the sync status (`config_status`); a type with no resources
//! has one entry with its status only.

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse, ConfigStatus,
    client_config::GenericXdsConfig,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{NodeMatcher, StringMatcher, string_matcher};
use tonic::Status;

use crate::admin::AdminState;
use crate::admin::config_dump::{TypeDump, type_dumps};
use crate::ads::ConnectionHandle;
use crate::xds::TypeUrl;

/// The types CSDS reports, in the order of Envoy's config dump.
const CSDS_TYPES: [TypeUrl; 4] = [
    TypeUrl::Cluster,
    TypeUrl::Listener,
    TypeUrl::Route,
    TypeUrl::Endpoint,
];

/// The answer to one CSDS request.
pub fn client_status(
    state: &AdminState,
    request: &ClientStatusRequest,
) -> Result<ClientStatusResponse, Status> {
    let matchers = request
        .node_matchers
        .iter()
        .enumerate()
        .map(|(i, m)| NodeIdMatcher::new(i, m))
        .collect::<Result<Vec<_>, Status>>()?;
    let config = state
        .connections
        .all()
        .iter()
        .filter(|c| matchers.is_empty() || matchers.iter().any(|m| m.matches(&c.proxy.node_id)))
        .map(|c| client_config(state, c, request.exclude_resource_contents))
        .collect();
    Ok(ClientStatusResponse { config })
}

/// One proxy's config and status.
fn client_config(state: &AdminState, c: &ConnectionHandle, exclude_contents: bool) -> ClientConfig {
    let mut generic_xds_configs = Vec::new();
    for dump in type_dumps(state, c, &CSDS_TYPES) {
        let entry = GenericXdsConfig {
            type_url: dump.type_url.as_str().to_string(),
            version_info: dump.version().unwrap_or_default().to_string(),
            last_updated: dump.last_sent(),
            config_status: config_status(&dump) as i32,
            client_status: dump.status() as i32,
            ..Default::default()
        };
        if dump.resources.is_empty() {
            generic_xds_configs.push(entry);
            continue;
        }
        for (name, any) in &dump.resources {
            generic_xds_configs.push(GenericXdsConfig {
                name: name.clone(),
                xds_config: (!exclude_contents).then(|| any.clone()),
                ..entry.clone()
            });
        }
    }
    #[allow(deprecated)]
    ClientConfig {
        node: Some(Node {
            id: c.proxy.node_id.clone(),
            metadata: Some(super::node_metadata(c)),
            user_agent_name: c.proxy.user_agent.clone(),
            ..Default::default()
        }),
        generic_xds_configs,
        ..Default::default()
    }
}

/// The sync status of one type: never sent, acknowledged, rejected, or in flight.
fn config_status(dump: &TypeDump) -> ConfigStatus {
    if !dump.watched() || dump.version().is_none() {
        return ConfigStatus::NotSent;
    }
    match dump.status() {
        ClientResourceStatus::Acked => ConfigStatus::Synced,
        ClientResourceStatus::Nacked => ConfigStatus::Error,
        _ => ConfigStatus::Stale,
    }
}

/// A `NodeMatcher` by node id; metadata matchers are refused (not supported).
struct NodeIdMatcher {
    id: Option<Pattern>,
}

enum Pattern {
    Exact(String, bool),
    Prefix(String, bool),
    Suffix(String, bool),
    Contains(String, bool),
    Regex(regex::Regex),
}

impl NodeIdMatcher {
    fn new(index: usize, matcher: &NodeMatcher) -> Result<Self, Status> {
        if !matcher.node_metadatas.is_empty() {
            return Err(Status::invalid_argument(format!(
                "node_matchers[{index}].node_metadatas: not supported; match by node_id"
            )));
        }
        let id = match &matcher.node_id {
            None => None,
            Some(StringMatcher {
                match_pattern,
                ignore_case,
            }) => {
                let fold = |s: &str| {
                    if *ignore_case {
                        s.to_lowercase()
                    } else {
                        s.to_string()
                    }
                };
                use string_matcher::MatchPattern;
                Some(match match_pattern {
                    Some(MatchPattern::Exact(s)) => Pattern::Exact(fold(s), *ignore_case),
                    Some(MatchPattern::Prefix(s)) => Pattern::Prefix(fold(s), *ignore_case),
                    Some(MatchPattern::Suffix(s)) => Pattern::Suffix(fold(s), *ignore_case),
                    Some(MatchPattern::Contains(s)) => Pattern::Contains(fold(s), *ignore_case),
                    Some(MatchPattern::SafeRegex(re)) => {
                        let full = format!("^(?:{})$", re.regex);
                        Pattern::Regex(regex::Regex::new(&full).map_err(|e| {
                            Status::invalid_argument(format!(
                                "node_matchers[{index}].node_id.safe_regex: {e}"
                            ))
                        })?)
                    }
                    Some(MatchPattern::Custom(_)) | None => {
                        return Err(Status::invalid_argument(format!(
                            "node_matchers[{index}].node_id: only exact, prefix, suffix, contains and safe_regex are supported"
                        )));
                    }
                })
            }
        };
        Ok(NodeIdMatcher { id })
    }

    fn matches(&self, node_id: &str) -> bool {
        let fold = |ignore: bool| {
            if ignore {
                node_id.to_lowercase()
            } else {
                node_id.to_string()
            }
        };
        match &self.id {
            None => true,
            Some(Pattern::Exact(s, i)) => fold(*i) == *s,
            Some(Pattern::Prefix(s, i)) => fold(*i).starts_with(s.as_str()),
            Some(Pattern::Suffix(s, i)) => fold(*i).ends_with(s.as_str()),
            Some(Pattern::Contains(s, i)) => fold(*i).contains(s.as_str()),
            Some(Pattern::Regex(re)) => re.is_match(node_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;

    fn matcher(pattern: string_matcher::MatchPattern, ignore_case: bool) -> NodeMatcher {
        NodeMatcher {
            node_id: Some(StringMatcher {
                match_pattern: Some(pattern),
                ignore_case,
            }),
            node_metadatas: Vec::new(),
        }
    }

    #[test]
    fn node_ids_match_as_envoys_string_matcher() {
        use string_matcher::MatchPattern::*;
        let id = "sidecar~10.0.0.1~a-1.ns~ns.svc.cluster.local";
        let cases = [
            (Exact(id.into()), false, true),
            (Exact(id.to_uppercase()), false, false),
            (Exact(id.to_uppercase()), true, true),
            (Prefix("sidecar~".into()), false, true),
            (Prefix("router~".into()), false, false),
            (Suffix("cluster.local".into()), false, true),
            (Contains("a-1.ns".into()), false, true),
            (
                SafeRegex(RegexMatcher {
                    regex: "sidecar~.*~a-\\d\\.ns~.*".into(),
                    ..Default::default()
                }),
                false,
                true,
            ),
            (
                SafeRegex(RegexMatcher {
                    regex: "a-1".into(),
                    ..Default::default()
                }),
                false,
                false,
            ),
        ];
        for (pattern, ignore, want) in cases {
            let m = NodeIdMatcher::new(0, &matcher(pattern.clone(), ignore)).unwrap();
            assert_eq!(m.matches(id), want, "{pattern:?} ignore_case={ignore}");
        }
    }

    #[test]
    fn metadata_matchers_and_bad_regexes_are_refused() {
        let with_metadata = NodeMatcher {
            node_id: None,
            node_metadatas: vec![Default::default()],
        };
        let err = NodeIdMatcher::new(2, &with_metadata).err().unwrap();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("node_matchers[2].node_metadatas"));
        let bad = matcher(
            string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                regex: "(".into(),
                ..Default::default()
            }),
            false,
        );
        let err = NodeIdMatcher::new(0, &bad).err().unwrap();
        assert!(err.message().contains("safe_regex"), "{}", err.message());
    }
}
