//! Patch values as Envoy messages: a value (proto JSON, `@type` for `Any`) becomes the
//! message its `applyTo` names through the compiled-in descriptors
//! ([`crate::xds::ENVOY_DESCRIPTORS`]), and [`merge`] is Istio's `merge.Merge`
//! (`pkg/proto/merge`): `proto.Merge` with a `google.protobuf.Duration` replaced
//! whole rather than merged field by field.

use std::sync::LazyLock;

use meshfed_api::networking::v1alpha3::envoy_filter::ApplyTo;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, Kind as FieldKind, MessageDescriptor,
    ReflectMessage,
};

static POOL: LazyLock<Option<DescriptorPool>> =
    LazyLock::new(|| DescriptorPool::decode(crate::xds::ENVOY_DESCRIPTORS).ok());

/// The full name of the Envoy message a patch of `apply_to` holds.
pub fn message_name(apply_to: ApplyTo) -> Option<&'static str> {
    Some(match apply_to {
        ApplyTo::Listener => "envoy.config.listener.v3.Listener",
        ApplyTo::FilterChain => "envoy.config.listener.v3.FilterChain",
        ApplyTo::NetworkFilter => "envoy.config.listener.v3.Filter",
        ApplyTo::ListenerFilter => "envoy.config.listener.v3.ListenerFilter",
        ApplyTo::HttpFilter => {
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
        }
        ApplyTo::RouteConfiguration => "envoy.config.route.v3.RouteConfiguration",
        ApplyTo::VirtualHost => "envoy.config.route.v3.VirtualHost",
        ApplyTo::HttpRoute => "envoy.config.route.v3.Route",
        ApplyTo::Cluster => "envoy.config.cluster.v3.Cluster",
        ApplyTo::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
        ApplyTo::Invalid => return None,
    })
}

/// The descriptor of a message by full name.
pub fn descriptor(name: &str) -> Result<MessageDescriptor, String> {
    let pool = POOL
        .as_ref()
        .ok_or("the Envoy descriptors are not compiled in")?;
    pool.get_message_by_name(name)
        .ok_or_else(|| format!("unknown Envoy type {name}"))
}

/// Converts a patch value to the message of `apply_to`. `strict` refuses fields the
/// type does not have (Istio's strict pass, whose errors it reports as warnings).
pub fn from_json(
    apply_to: ApplyTo,
    json: &serde_json::Value,
    strict: bool,
) -> Result<DynamicMessage, String> {
    let name = message_name(apply_to).ok_or("missing applyTo")?;
    let desc = descriptor(name)?;
    let options = DeserializeOptions::new().deny_unknown_fields(strict);
    DynamicMessage::deserialize_with_options(desc, json.clone(), &options).map_err(|e| {
        let e = e.to_string();
        if e.contains(".v2.") {
            format!("referenced type unknown (hint: try using the v3 XDS API): {e}")
        } else {
            e
        }
    })
}

/// Checks a patch value for validation (installed into the registry's validator):
/// an error when it does not convert, warnings for unknown fields.
pub fn check(apply_to: ApplyTo, json: &serde_json::Value) -> Result<Vec<String>, String> {
    if apply_to == ApplyTo::Invalid {
        return Ok(Vec::new());
    }
    if POOL
        .as_ref()
        .is_none_or(|p| p.get_message_by_name("google.protobuf.Any").is_none())
    {
        return Ok(vec![
            "not checked against Envoy's types: this build has no Envoy descriptors".into(),
        ]);
    }
    from_json(apply_to, json, false)?;
    Ok(from_json(apply_to, json, true).err().into_iter().collect())
}

/// `src` merged into `dst` (same message type) as Istio's `merge.Merge`: set scalars
/// overwrite, lists append, map entries replace, messages merge recursively except
/// `google.protobuf.Duration`, which is replaced.
pub fn merge(dst: &mut DynamicMessage, src: &DynamicMessage) {
    for (field, value) in src.fields() {
        if field.is_list() {
            if let (Some(out), Some(items)) =
                (dst.get_field_mut(&field).as_list_mut(), value.as_list())
            {
                out.extend(items.iter().cloned());
            }
        } else if field.is_map() {
            if let (Some(out), Some(entries)) =
                (dst.get_field_mut(&field).as_map_mut(), value.as_map())
            {
                for (k, v) in entries {
                    out.insert(k.clone(), v.clone());
                }
            }
        } else if let FieldKind::Message(m) = field.kind() {
            if m.full_name() == "google.protobuf.Duration" || !dst.has_field(&field) {
                dst.set_field(&field, value.clone());
            } else if let (Some(out), Some(v)) = (
                dst.get_field_mut(&field).as_message_mut(),
                value.as_message(),
            ) {
                merge(out, v);
            }
        } else {
            dst.set_field(&field, value.clone());
        }
    }
}

/// The bytes that, decoded onto the encoding of a message of the same type (protobuf
/// merge: set scalars overwrite, lists append, map entries replace, messages merge
/// recursively), merge `src` into it as [`merge`] does: `src`'s encoding followed by
/// each `google.protobuf.Duration` of a singular path re-encoded with both its fields
/// written, so it replaces the destination's whole instead of field by field.
/// (Durations inside list items and map values come whole with their item.)
///
/// Merging these bytes into a typed message costs one decode; [`merge_into`] costs a
/// round trip through the descriptors.
pub fn merge_bytes(src: &DynamicMessage) -> Vec<u8> {
    fn durations(m: &DynamicMessage, path: &mut Vec<u32>, out: &mut Vec<u8>) {
        for (field, value) in m.fields() {
            if field.is_list() || field.is_map() {
                continue;
            }
            let (FieldKind::Message(desc), Some(inner)) = (field.kind(), value.as_message()) else {
                continue;
            };
            path.push(field.number());
            if desc.full_name() == "google.protobuf.Duration" {
                let seconds = inner
                    .get_field_by_number(1)
                    .and_then(|v| v.as_i64())
                    .unwrap_or(0);
                let nanos = inner
                    .get_field_by_number(2)
                    .and_then(|v| v.as_i32())
                    .unwrap_or(0);
                // seconds = 1, nanos = 2, both varints, written even when zero.
                let mut bytes = Vec::new();
                prost::encoding::encode_key(1, prost::encoding::WireType::Varint, &mut bytes);
                prost::encoding::encode_varint(seconds as u64, &mut bytes);
                prost::encoding::encode_key(2, prost::encoding::WireType::Varint, &mut bytes);
                prost::encoding::encode_varint(i64::from(nanos) as u64, &mut bytes);
                for number in path.iter().rev() {
                    let mut wrapped = Vec::with_capacity(bytes.len() + 6);
                    prost::encoding::encode_key(
                        *number,
                        prost::encoding::WireType::LengthDelimited,
                        &mut wrapped,
                    );
                    prost::encoding::encode_varint(bytes.len() as u64, &mut wrapped);
                    wrapped.extend_from_slice(&bytes);
                    bytes = wrapped;
                }
                out.extend_from_slice(&bytes);
            } else {
                durations(inner, path, out);
            }
            path.pop();
        }
    }
    let mut out = src.encode_to_vec();
    durations(src, &mut Vec::new(), &mut out);
    out
}

/// A typed message as a dynamic one.
pub fn to_dynamic<M: Message + prost::Name>(m: &M) -> Result<DynamicMessage, String> {
    let desc = descriptor(&M::full_name())?;
    DynamicMessage::decode(desc, m.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

/// A dynamic message as a typed one.
pub fn from_dynamic<M: Message + Default>(d: &DynamicMessage) -> Result<M, String> {
    M::decode(d.encode_to_vec().as_slice()).map_err(|e| e.to_string())
}

/// `src` merged into the typed `dst` (see [`merge`]).
pub fn merge_into<M: Message + Default + prost::Name>(
    dst: &mut M,
    src: &DynamicMessage,
) -> Result<(), String> {
    let mut d = to_dynamic(dst)?;
    if d.descriptor() != src.descriptor() {
        return Err(format!(
            "cannot merge {} into {}",
            src.descriptor().full_name(),
            d.descriptor().full_name()
        ));
    }
    merge(&mut d, src);
    *dst = from_dynamic(&d)?;
    Ok(())
}

/// Istio's `MergeAnyWithAny`: both `Any`s decoded with their types, `src` merged into
/// `dst`, re-encoded; an error when a type is unknown or the two differ.
pub fn merge_any(
    dst: &envoy_types::pb::google::protobuf::Any,
    src: &envoy_types::pb::google::protobuf::Any,
) -> Result<envoy_types::pb::google::protobuf::Any, String> {
    let name = |url: &str| url.rsplit('/').next().unwrap_or_default().to_string();
    let (dn, sn) = (name(&dst.type_url), name(&src.type_url));
    if dn != sn {
        return Err(format!("cannot merge {sn} into {dn}"));
    }
    let desc = descriptor(&dn)?;
    let mut d =
        DynamicMessage::decode(desc.clone(), dst.value.as_slice()).map_err(|e| e.to_string())?;
    let s = DynamicMessage::decode(desc, src.value.as_slice()).map_err(|e| e.to_string())?;
    merge(&mut d, &s);
    Ok(envoy_types::pb::google::protobuf::Any {
        type_url: dst.type_url.clone(),
        value: d.encode_to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merging_the_merge_bytes_is_merge() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        let dst = json!({"name": "a", "connect_timeout": "1.5s",
            "common_lb_config": {"update_merge_window": "2.5s", "healthy_panic_threshold": {"value": 40}},
            "dns_refresh_rate": "7s", "metadata": {"filter_metadata": {"x": {"a": 1}}},
            "outlier_detection": {"interval": "3.25s", "consecutive_5xx": 4},
            "load_assignment": {"cluster_name": "a", "endpoints": [{"lb_endpoints": []}]}});
        for src in [
            json!({"connect_timeout": "2s"}),
            json!({"connect_timeout": "0.25s", "name": "b"}),
            json!({"common_lb_config": {"update_merge_window": "4s"}}),
            json!({"outlier_detection": {"interval": "1s"}, "dns_refresh_rate": "0s"}),
            json!({"metadata": {"filter_metadata": {"y": {"b": 2}, "x": {"c": 3}}}}),
            json!({"load_assignment": {"endpoints": [{"priority": 1}]}, "alt_stat_name": "s"}),
            json!({"lb_policy": "RING_HASH", "round_robin_lb_config": {}}),
        ] {
            let d = from_json(ApplyTo::Cluster, &dst, true).unwrap();
            let s = from_json(ApplyTo::Cluster, &src, true).unwrap();
            let mut want: Cluster = from_dynamic(&d).unwrap();
            merge_into(&mut want, &s).unwrap();
            let mut got: Cluster = from_dynamic(&d).unwrap();
            got.merge(merge_bytes(&s).as_slice()).unwrap();
            assert_eq!(got, want, "{src}");
        }
    }

    #[test]
    fn durations_are_replaced_and_lists_appended() {
        let mut dst = from_json(
            ApplyTo::Cluster,
            &json!({"name": "a", "connect_timeout": "1.5s", "filters": [{"name": "x"}]}),
            true,
        )
        .unwrap();
        let src = from_json(
            ApplyTo::Cluster,
            &json!({"connectTimeout": "2s", "filters": [{"name": "y"}]}),
            true,
        )
        .unwrap();
        merge(&mut dst, &src);
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster = from_dynamic(&dst).unwrap();
        let t = c.connect_timeout.unwrap();
        assert_eq!((t.seconds, t.nanos), (2, 0));
        assert_eq!(c.filters.len(), 2);
        assert_eq!(c.name, "a");
    }

    #[test]
    fn unknown_types_and_fields() {
        let bad = json!({"name": "f", "typed_config": {"@type": "type.googleapis.com/envoy.config.filter.http.lua.v2.Lua"}});
        assert!(
            check(ApplyTo::HttpFilter, &bad)
                .unwrap_err()
                .contains("v3 XDS API")
        );
        let w = check(ApplyTo::Cluster, &json!({"name": "a", "hosts": []})).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn filters_envoy_filters_commonly_carry_decode() {
        let filter = |type_url: &str, config: serde_json::Value| {
            let mut typed = config;
            typed["@type"] = json!(format!("type.googleapis.com/{type_url}"));
            json!({"name": "f", "typed_config": typed})
        };
        for (apply_to, type_url, config) in [
            (
                ApplyTo::HttpFilter,
                "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                json!({"grpc_service": {"envoy_grpc": {"cluster_name": "ext-proc"}}}),
            ),
            (
                ApplyTo::HttpFilter,
                "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                json!({}),
            ),
            (
                ApplyTo::HttpFilter,
                "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
                json!({"providers": {}}),
            ),
            (
                ApplyTo::HttpFilter,
                "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                json!({"stat_prefix": "http_local_rate_limiter",
                    "token_bucket": {"max_tokens": 10, "tokens_per_fill": 10, "fill_interval": "60s"},
                    "filter_enabled": {"runtime_key": "local_rate_limit_enabled",
                        "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
                    "descriptors": [{"entries": [{"key": "path", "value": "/"}],
                        "token_bucket": {"max_tokens": 5, "fill_interval": "60s"}}]}),
            ),
            (
                ApplyTo::HttpFilter,
                "envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                json!({"domain": "prod", "rate_limit_service": {"grpc_service":
                    {"envoy_grpc": {"cluster_name": "rate-limit"}}, "transport_api_version": "V3"}}),
            ),
            (
                ApplyTo::NetworkFilter,
                "envoy.extensions.filters.network.redis_proxy.v3.RedisProxy",
                json!({"stat_prefix": "redis", "settings": {"op_timeout": "5s"},
                    "prefix_routes": {"catch_all_route": {"cluster": "redis"}}}),
            ),
            (
                ApplyTo::NetworkFilter,
                "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit",
                json!({"stat_prefix": "rl", "token_bucket": {"max_tokens": 10, "fill_interval": "1s"}}),
            ),
        ] {
            let warnings = check(apply_to, &filter(type_url, config))
                .unwrap_or_else(|e| panic!("{type_url}: {e}"));
            assert!(warnings.is_empty(), "{type_url}: {warnings:?}");
        }
    }
}
