//! Istio's HTTP match requests as Envoy route, header, query and JWT claim matchers.

use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, RouteMatch, header_matcher, query_parameter_matcher,
    route_match,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    MetadataMatcher, RegexMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::google::protobuf::BoolValue;
use meshfed_api::networking::v1alpha3::{HttpMatchRequest, StringMatch, string_match::MatchType};

/// Istio's `TranslateRouteMatch`.
pub(super) fn translate_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut out = RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
        ..Default::default()
    };
    let Some(m) = m else {
        return out;
    };
    // JWT-claim keys match the payload jwt_authn verified (Istio's
    // `translateMetadataMatch`), the others headers.
    use meshfed_registry::config::validate::jwt_routing_claim as claim;
    for (map, invert) in [(&m.headers, false), (&m.without_headers, true)] {
        for (name, sm) in map {
            if let Some(mut matcher) = translate_metadata_match(name, sm) {
                matcher.invert = invert;
                out.dynamic_metadata.push(matcher);
            }
        }
    }
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .filter(|(name, _)| claim(name).is_none())
        .map(|(name, sm)| header_matcher(name, sm))
        .collect();
    for (name, sm) in m
        .without_headers
        .iter()
        .filter(|(name, _)| claim(name).is_none())
    {
        let mut hm = header_matcher(name, sm);
        hm.invert_match = true;
        // treat_missing_header_as_empty conflicts with present_match.
        hm.treat_missing_header_as_empty = !is_present_match(sm);
        headers.push(hm);
    }
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    out.headers = headers;
    if let Some(uri) = m.uri.as_ref().and_then(|u| u.match_type.as_ref()) {
        out.path_specifier = Some(match uri {
            MatchType::Exact(p) => route_match::PathSpecifier::Path(p.clone()),
            MatchType::Prefix(p) => route_match::PathSpecifier::Prefix(p.clone()),
            MatchType::Regex(r) => route_match::PathSpecifier::SafeRegex(regex_matcher(r)),
        });
    }
    out.case_sensitive = Some(BoolValue {
        value: !m.ignore_uri_case,
    });
    for (name, sm) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            out.headers.push(header_matcher(name, sm));
        }
    }
    out.query_parameters = m
        .query_params
        .iter()
        .map(|(name, sm)| QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(if is_present_match(sm) {
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
            } else {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(
                    string_matcher_of(sm),
                )
            }),
        })
        .collect();
    out
}

/// Istio's `translateMetadataMatch`: a header key naming a JWT claim matches the
/// claim in the verified payload; `None` for ordinary header names.
pub(super) fn translate_metadata_match(name: &str, sm: &StringMatch) -> Option<MetadataMatcher> {
    let path = meshfed_registry::config::validate::jwt_routing_claim(name)?;
    Some(jwt_claim_matcher(&path, string_matcher_of(sm), false))
}

/// A route's match on the JWT claim at `path` of the verified payload
/// (`MetadataMatcherForJWTClaims`): the claim is a string matching `m`, or a list
/// with such an element; `invert` for `withoutHeaders`.
pub(super) fn jwt_claim_matcher(path: &[&str], m: StringMatcher, invert: bool) -> MetadataMatcher {
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListMatcher, OrMatcher, ValueMatcher, list_matcher, metadata_matcher, value_matcher,
    };
    let string = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    };
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(string.clone()))),
            },
        ))),
    };
    MetadataMatcher {
        filter: crate::generate::jwt::JWT_FILTER.into(),
        path: std::iter::once(crate::generate::jwt::PAYLOAD_IN_METADATA)
            .chain(path.iter().copied())
            .map(|key| metadata_matcher::PathSegment {
                segment: Some(metadata_matcher::path_segment::Segment::Key(key.into())),
            })
            .collect(),
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, string],
            })),
        }),
        invert,
    }
}

/// An empty match, or the regex `*` (not a regex: Istio reads it as "present").
pub(super) fn is_present_match(sm: &StringMatch) -> bool {
    match &sm.match_type {
        None => true,
        Some(MatchType::Regex(r)) => r == "*",
        Some(_) => false,
    }
}

pub(super) fn header_matcher(name: &str, sm: &StringMatch) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(if is_present_match(sm) {
            header_matcher::HeaderMatchSpecifier::PresentMatch(true)
        } else {
            header_matcher::HeaderMatchSpecifier::StringMatch(string_matcher_of(sm))
        }),
        ..Default::default()
    }
}

pub(super) fn string_matcher_of(sm: &StringMatch) -> StringMatcher {
    let pattern = match sm.match_type.as_ref() {
        Some(MatchType::Exact(s)) => string_matcher::MatchPattern::Exact(s.clone()),
        Some(MatchType::Prefix(s)) => string_matcher::MatchPattern::Prefix(s.clone()),
        Some(MatchType::Regex(r)) => string_matcher::MatchPattern::SafeRegex(regex_matcher(r)),
        None => string_matcher::MatchPattern::Prefix(String::new()),
    };
    StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    }
}

pub(super) fn regex_matcher(regex: &str) -> RegexMatcher {
    RegexMatcher {
        regex: regex.to_string(),
        ..Default::default()
    }
}
