//! meshfed's Istio-compatible configuration API.
//!
//! The types are generated at build time from the project's own `.proto`
//! files (`proto/istio/...`), whose package names, field names and field
//! numbers follow Istio's, so the protobuf wire format and proto3 JSON/YAML
//! are interchangeable with Istio's:
//!
//! - [`mesh::v1alpha1`]: `MeshConfig` (the subset meshfed uses) and
//!   `MeshNetworks`.
//! - [`networking::v1alpha3`]: the `networking.istio.io` kinds
//!   (`VirtualService`, `DestinationRule`, `Gateway`, `ServiceEntry`,
//!   `WorkloadEntry`, `Sidecar`) and their parts.
//! - [`networking::nds::v1`]: the DNS `NameTable` (NDS).
//! - `r#type::v1beta1`: the shared `WorkloadSelector` used by
//!   `DestinationRule`.
//!
//! Every message implements `serde::Serialize`/`Deserialize` in proto3 JSON
//! form: camelCase names are written and both camelCase and the original
//! snake_case names are accepted; enums are strings (`"ISTIO_MUTUAL"`);
//! `google.protobuf.Duration` is a string such as `"5s"` or `"0.5s"`, and,
//! as in Istio, Go's syntax (`"30ms"`, `"5m"`, `"1h30m"`) is accepted too
//! (see [`Duration`]);
//! wrapper types (`BoolValue`, `UInt32Value`) are plain JSON values.
//! Unknown fields are ignored (as Istio does), while an unknown enum name or
//! a malformed duration is an error. YAML callers go through
//! `serde_json::Value` (or any serde YAML deserializer).
//!
//! Maps are `BTreeMap`s so iteration order is stable.

pub mod duration;

pub use duration::Duration;

/// `istio.mesh.v1alpha1`: mesh-wide configuration.
pub mod mesh {
    /// Generated from `istio/mesh/v1alpha1/*.proto`.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/istio.mesh.v1alpha1.rs"));
        include!(concat!(env!("OUT_DIR"), "/istio.mesh.v1alpha1.serde.rs"));
    }
}

/// `istio.networking.v1alpha3`: the `networking.istio.io` kinds.
pub mod networking {
    /// Generated from `istio/networking/v1alpha3/*.proto`.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1alpha3 {
        include!(concat!(env!("OUT_DIR"), "/istio.networking.v1alpha3.rs"));
        include!(concat!(
            env!("OUT_DIR"),
            "/istio.networking.v1alpha3.serde.rs"
        ));
    }

    /// `istio.networking.nds.v1`: the DNS name table istiod sends to agents that
    /// capture DNS (`type.googleapis.com/istio.networking.nds.v1.NameTable`).
    pub mod nds {
        /// Generated from `istio/networking/nds/v1/nds.proto`.
        #[allow(
            missing_docs,
            clippy::all,
            clippy::pedantic,
            clippy::nursery,
            rustdoc::all,
            deprecated
        )]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/istio.networking.nds.v1.rs"));
            include!(concat!(
                env!("OUT_DIR"),
                "/istio.networking.nds.v1.serde.rs"
            ));
        }
    }
}

/// `istio.type.v1beta1`: types shared by several Istio APIs.
pub mod r#type {
    /// Generated from `istio/type/v1beta1/selector.proto`.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/istio.r#type.v1beta1.rs"));
        include!(concat!(env!("OUT_DIR"), "/istio.r#type.v1beta1.serde.rs"));
    }
}

/// `security.istio.io`: PeerAuthentication, RequestAuthentication,
/// AuthorizationPolicy; and `istio.security` itself: the layer-4 `Authorization`
/// ztunnel enforces (from `istio/security/authorization.proto`).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    rustdoc::all,
    deprecated
)]
pub mod security {
    include!(concat!(env!("OUT_DIR"), "/istio.security.rs"));
    include!(concat!(env!("OUT_DIR"), "/istio.security.serde.rs"));

    /// Generated from `istio/security/v1beta1/*.proto` (served as `v1` and
    /// `v1beta1`).
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/istio.security.v1beta1.rs"));
        include!(concat!(env!("OUT_DIR"), "/istio.security.v1beta1.serde.rs"));
    }
}

/// `telemetry.istio.io`: Telemetry.
pub mod telemetry {
    /// Generated from `istio/telemetry/v1alpha1/telemetry.proto` (served as `v1`
    /// and `v1alpha1`).
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/istio.telemetry.v1alpha1.rs"));
        include!(concat!(
            env!("OUT_DIR"),
            "/istio.telemetry.v1alpha1.serde.rs"
        ));
    }
}

/// `extensions.istio.io`: WasmPlugin.
pub mod extensions {
    /// Generated from `istio/extensions/v1alpha1/wasm.proto`.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/istio.extensions.v1alpha1.rs"));
        include!(concat!(
            env!("OUT_DIR"),
            "/istio.extensions.v1alpha1.serde.rs"
        ));
    }
}

/// `istio.mcp.v1alpha1`: the envelope of config served and read over
/// MCP-over-xDS (`Resource`: metadata and the spec as an `Any`).
pub mod mcp {
    /// Generated from `istio/mcp/v1alpha1/resource.proto`.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/istio.mcp.v1alpha1.rs"));
        include!(concat!(env!("OUT_DIR"), "/istio.mcp.v1alpha1.serde.rs"));
    }
}

/// The encoded `google.protobuf.FileDescriptorSet` of every `.proto` file of
/// this crate (with imports and source comments), for reflection-based
/// tooling such as schema dumps or dynamic validation.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/meshfed_api_descriptor.bin"));

pub mod unknown_fields;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use crate::Duration;
    use crate::mesh::v1alpha1 as mesh;
    use crate::networking::v1alpha3 as net;

    fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("should parse: {e}"))
    }

    fn exact(s: &str) -> Option<net::StringMatch> {
        Some(net::StringMatch {
            match_type: Some(net::string_match::MatchType::Exact(s.into())),
        })
    }

    fn prefix(s: &str) -> Option<net::StringMatch> {
        Some(net::StringMatch {
            match_type: Some(net::string_match::MatchType::Prefix(s.into())),
        })
    }

    #[test]
    fn security_kinds_read_istio_json() {
        use crate::security::v1beta1 as sec;
        let pa: sec::PeerAuthentication = from_json(json!({
            "selector": {"matchLabels": {"app": "finance"}},
            "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "DISABLE"}}
        }));
        assert_eq!(
            pa.mtls.unwrap().mode(),
            sec::peer_authentication::mutual_tls::Mode::Strict
        );
        assert_eq!(
            pa.port_level_mtls[&8080].mode(),
            sec::peer_authentication::mutual_tls::Mode::Disable
        );
        let ap: sec::AuthorizationPolicy = from_json(json!({
            "action": "CUSTOM",
            "provider": {"name": "ext-authz"},
            "rules": [{
                "from": [{"source": {"principals": ["cluster.local/ns/default/sa/sleep"], "notIpBlocks": ["10.0.0.0/8"]}}],
                "to": [{"operation": {"methods": ["GET"], "paths": ["/info*"], "notPorts": ["8080"]}}],
                "when": [{"key": "request.auth.claims[iss]", "values": ["https://accounts.google.com"]}]
            }],
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}]
        }));
        assert_eq!(ap.action(), sec::authorization_policy::Action::Custom);
        let rule = &ap.rules[0];
        assert_eq!(
            rule.from[0].source.as_ref().unwrap().not_ip_blocks,
            vec!["10.0.0.0/8"]
        );
        assert_eq!(
            rule.to[0].operation.as_ref().unwrap().not_ports,
            vec!["8080"]
        );
        assert_eq!(rule.when[0].key, "request.auth.claims[iss]");
        assert_eq!(ap.target_refs[0].kind, "Gateway");
        let ra: sec::RequestAuthentication = from_json(json!({
            "jwtRules": [{
                "issuer": "https://example.com",
                "jwksUri": "https://example.com/.well-known/jwks.json",
                "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}],
                "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                "forwardOriginalToken": true,
                "timeout": "5s"
            }]
        }));
        let rule = &ra.jwt_rules[0];
        assert_eq!(rule.from_headers[0].prefix, "Bearer ");
        assert_eq!(rule.output_claim_to_headers[0].claim, "sub");
        assert!(rule.forward_original_token);
        assert_eq!(rule.timeout.as_ref().unwrap().seconds, 5);
    }

    #[test]
    fn ambient_authorization_reads_istio_json_and_wire() {
        use crate::security as l4;
        use prost::Message;
        // Shaped like istiod's golden output for a converted PeerAuthentication.
        let a: l4::Authorization = from_json(json!({
            "action": "DENY",
            "groups": [{"rules": [
                {"matches": [{"notPrincipals": [{"presence": {}}]}]},
                {"matches": [{"notDestinationPorts": [9090], "serviceAccounts": [{"namespace": "ns", "serviceAccount": "sa"}]}]}
            ]}],
            "name": "converted_peer_authentication_x",
            "scope": "WORKLOAD_SELECTOR"
        }));
        assert_eq!(a.action(), l4::Action::Deny);
        assert_eq!(a.scope(), l4::Scope::WorkloadSelector);
        let rules = &a.groups[0].rules;
        assert_eq!(
            rules[0].matches[0].not_principals[0].match_type,
            Some(l4::string_match::MatchType::Presence(
                pbjson_types::Empty {}
            ))
        );
        assert_eq!(rules[1].matches[0].not_destination_ports, [9090]);
        assert_eq!(
            rules[1].matches[0].service_accounts[0].service_account,
            "sa"
        );
        let out = serde_json::to_value(&a).expect("serializes");
        assert_eq!(
            out["groups"][0]["rules"][1]["matches"][0]["serviceAccounts"][0]["serviceAccount"],
            "sa"
        );
        // Match.service_accounts is field 11 (tag 0x5a), Address.length field 2.
        let m = l4::Match {
            service_accounts: vec![l4::ServiceAccountMatch {
                namespace: "n".into(),
                service_account: "s".into(),
            }],
            ..Default::default()
        };
        assert_eq!(m.encode_to_vec(), [0x5a, 6, 0x0a, 1, b'n', 0x12, 1, b's']);
    }

    #[test]
    fn virtual_service_camel_case() {
        let vs: net::VirtualService = from_json(json!({
            "hosts": ["reviews.prod.svc.cluster.local", "reviews.example.com"],
            "gateways": ["mesh", "istio-system/public"],
            "exportTo": ["."],
            "http": [
                {
                    "name": "v2-canary",
                    "match": [
                        {
                            "name": "jason",
                            "uri": {"prefix": "/api/v2"},
                            "headers": {"end-user": {"exact": "jason"}, "x-present": {}},
                            "queryParams": {"debug": {"regex": "^(1|true)$"}},
                            "withoutHeaders": {"x-skip": {"exact": "1"}},
                            "ignoreUriCase": true,
                            "sourceLabels": {"app": "productpage"},
                            "sourceNamespace": "bookinfo",
                            "port": 9080
                        },
                        {"method": {"exact": "GET"}, "authority": {"prefix": "reviews"}}
                    ],
                    "route": [
                        {
                            "destination": {
                                "host": "reviews.prod.svc.cluster.local",
                                "subset": "v2",
                                "port": {"number": 9080}
                            },
                            "weight": 25,
                            "headers": {"response": {"remove": ["x-internal"]}}
                        },
                        {
                            "destination": {"host": "reviews.prod.svc.cluster.local", "subset": "v1"},
                            "weight": 75
                        }
                    ],
                    "rewrite": {"uri": "/v2", "authority": "reviews-v2"},
                    "timeout": "5s",
                    "retries": {
                        "attempts": 3,
                        "perTryTimeout": "0.5s",
                        "retryOn": "gateway-error,connect-failure,refused-stream",
                        "retryRemoteLocalities": true
                    },
                    "fault": {
                        "delay": {"percentage": {"value": 0.1}, "fixedDelay": "7s"},
                        "abort": {"percentage": {"value": 1.5}, "httpStatus": 503}
                    },
                    "mirror": {"host": "reviews-shadow", "subset": "v3"},
                    "mirrorPercentage": {"value": 12.5},
                    "mirrors": [{"destination": {"host": "audit"}, "percentage": {"value": 1}}],
                    "corsPolicy": {
                        "allowOrigins": [{"exact": "https://example.com"}, {"regex": ".*\\.example\\.org"}],
                        "allowMethods": ["GET", "POST"],
                        "allowHeaders": ["x-foo-bar"],
                        "exposeHeaders": ["x-trace"],
                        "maxAge": "24h",
                        "allowCredentials": false,
                        "unmatchedPreflights": "IGNORE"
                    },
                    "headers": {
                        "request": {"set": {"x-canary": "true"}, "add": {"x-via": "meshfed"}},
                        "response": {"remove": ["server"]}
                    }
                },
                {
                    "match": [{"uri": {"exact": "/old"}}],
                    "redirect": {"uri": "/new", "authority": "new.example.com", "derivePort": "FROM_REQUEST_PORT", "scheme": "https", "redirectCode": 308}
                },
                {
                    "match": [{"uri": {"exact": "/teapot"}}],
                    "directResponse": {"status": 418, "body": {"string": "short and stout"}}
                },
                {
                    "match": [{"uri": {"prefix": "/ratings"}}],
                    "delegate": {"name": "ratings", "namespace": "ratings-ns"}
                }
            ],
            "tcp": [{
                "match": [{"port": 27017, "destinationSubnets": ["10.0.0.0/8"]}],
                "route": [{"destination": {"host": "mongo.backup.svc.cluster.local", "port": {"number": 5555}}}]
            }],
            "tls": [{
                "match": [{"port": 443, "sniHosts": ["login.example.com"]}],
                "route": [{"destination": {"host": "login.prod.svc.cluster.local"}, "weight": 100}]
            }]
        }));

        assert_eq!(
            vs.hosts,
            ["reviews.prod.svc.cluster.local", "reviews.example.com"]
        );
        assert_eq!(vs.gateways, ["mesh", "istio-system/public"]);
        assert_eq!(vs.export_to, ["."]);
        assert_eq!(vs.http.len(), 4);

        let r = &vs.http[0];
        assert_eq!(r.name, "v2-canary");
        let m = &r.r#match[0];
        assert_eq!(m.name, "jason");
        assert_eq!(m.uri, prefix("/api/v2"));
        assert_eq!(m.headers.get("end-user").cloned(), exact("jason"));
        // `{}` means "header present": a StringMatch with no match_type.
        assert_eq!(
            m.headers.get("x-present").cloned(),
            Some(net::StringMatch::default())
        );
        assert_eq!(
            m.query_params["debug"].match_type,
            Some(net::string_match::MatchType::Regex("^(1|true)$".into()))
        );
        assert_eq!(m.without_headers.get("x-skip").cloned(), exact("1"));
        assert!(m.ignore_uri_case);
        assert_eq!(
            m.source_labels.get("app").map(String::as_str),
            Some("productpage")
        );
        assert_eq!(m.source_namespace, "bookinfo");
        assert_eq!(m.port, 9080);
        assert_eq!(r.r#match[1].method, exact("GET"));
        assert_eq!(r.r#match[1].authority, prefix("reviews"));

        let d0 = r.route[0].destination.as_ref().expect("destination");
        assert_eq!(d0.host, "reviews.prod.svc.cluster.local");
        assert_eq!(d0.subset, "v2");
        assert_eq!(d0.port.map(|p| p.number), Some(9080));
        assert_eq!(r.route[0].weight, 25);
        assert_eq!(r.route[1].weight, 75);
        let dest_headers = r.route[0].headers.as_ref().expect("headers");
        assert_eq!(
            dest_headers.response.as_ref().expect("response").remove,
            ["x-internal"]
        );

        let rewrite = r.rewrite.as_ref().expect("rewrite");
        assert_eq!(
            (rewrite.uri.as_str(), rewrite.authority.as_str()),
            ("/v2", "reviews-v2")
        );
        assert_eq!(r.timeout, Some(Duration::new(5, 0)));

        let retries = r.retries.as_ref().expect("retries");
        assert_eq!(retries.attempts, 3);
        assert_eq!(retries.per_try_timeout, Some(Duration::new(0, 500_000_000)));
        assert_eq!(
            retries.retry_on,
            "gateway-error,connect-failure,refused-stream"
        );
        assert_eq!(retries.retry_remote_localities.map(|v| v.value), Some(true));

        let fault = r.fault.as_ref().expect("fault");
        let delay = fault.delay.as_ref().expect("delay");
        assert_eq!(delay.percentage.map(|p| p.value), Some(0.1));
        assert_eq!(
            delay.http_delay_type,
            Some(net::http_fault_injection::delay::HttpDelayType::FixedDelay(
                Duration::new(7, 0)
            ))
        );
        let abort = fault.abort.as_ref().expect("abort");
        assert_eq!(
            abort.error_type,
            Some(net::http_fault_injection::abort::ErrorType::HttpStatus(503))
        );
        assert_eq!(abort.percentage.map(|p| p.value), Some(1.5));

        assert_eq!(
            r.mirror.as_ref().map(|d| d.host.as_str()),
            Some("reviews-shadow")
        );
        assert_eq!(r.mirror_percentage.map(|p| p.value), Some(12.5));
        assert_eq!(
            r.mirrors[0].destination.as_ref().expect("mirror").host,
            "audit"
        );
        assert_eq!(r.mirrors[0].percentage.map(|p| p.value), Some(1.0));

        let cors = r.cors_policy.as_ref().expect("cors");
        assert_eq!(
            cors.allow_origins[0],
            exact("https://example.com").expect("some")
        );
        assert_eq!(cors.allow_methods, ["GET", "POST"]);
        assert_eq!(cors.allow_headers, ["x-foo-bar"]);
        assert_eq!(cors.expose_headers, ["x-trace"]);
        assert_eq!(cors.max_age, Some(Duration::from_secs(86_400)));
        assert_eq!(cors.allow_credentials.map(|v| v.value), Some(false));
        assert_eq!(
            cors.unmatched_preflights(),
            net::cors_policy::UnmatchedPreflights::Ignore
        );

        let headers = r.headers.as_ref().expect("headers");
        let request = headers.request.as_ref().expect("request");
        assert_eq!(
            request.set,
            BTreeMap::from([("x-canary".to_owned(), "true".to_owned())])
        );
        assert_eq!(
            request.add.get("x-via").map(String::as_str),
            Some("meshfed")
        );

        let redirect = vs.http[1].redirect.as_ref().expect("redirect");
        assert_eq!(redirect.uri, "/new");
        assert_eq!(redirect.authority, "new.example.com");
        assert_eq!(redirect.scheme, "https");
        assert_eq!(redirect.redirect_code, 308);
        assert_eq!(
            redirect.redirect_port,
            Some(net::http_redirect::RedirectPort::DerivePort(
                net::http_redirect::RedirectPortSelection::FromRequestPort as i32
            ))
        );

        let direct = vs.http[2]
            .direct_response
            .as_ref()
            .expect("direct response");
        assert_eq!(direct.status, 418);
        assert_eq!(
            direct.body.as_ref().and_then(|b| b.specifier.clone()),
            Some(net::http_body::Specifier::String("short and stout".into()))
        );

        let delegate = vs.http[3].delegate.as_ref().expect("delegate");
        assert_eq!(
            (delegate.name.as_str(), delegate.namespace.as_str()),
            ("ratings", "ratings-ns")
        );

        let tcp = &vs.tcp[0];
        assert_eq!(tcp.r#match[0].port, 27017);
        assert_eq!(tcp.r#match[0].destination_subnets, ["10.0.0.0/8"]);
        let tcp_dest = tcp.route[0].destination.as_ref().expect("destination");
        assert_eq!(tcp_dest.port.map(|p| p.number), Some(5555));

        let tls = &vs.tls[0];
        assert_eq!(tls.r#match[0].sni_hosts, ["login.example.com"]);
        assert_eq!(tls.r#match[0].port, 443);
        assert_eq!(tls.route[0].weight, 100);
    }

    #[test]
    fn virtual_service_snake_case_and_go_durations() {
        let vs: net::VirtualService = from_json(json!({
            "hosts": ["ratings"],
            "export_to": ["*"],
            "http": [{
                "match": [{"uri": {"exact": "/x"}, "ignore_uri_case": true, "source_labels": {"a": "b"}, "query_params": {"q": {"exact": ""}}}],
                "route": [{"destination": {"host": "ratings", "port": {"number": 80}}}],
                "timeout": "1m30s",
                "retries": {"attempts": 2, "per_try_timeout": "250ms", "retry_on": "5xx"},
                "cors_policy": {"allow_origin": ["*"], "max_age": "1h"},
                "mirror_percent": 30,
                "mirror_percentage": {"value": 50}
            }]
        }));
        assert_eq!(vs.export_to, ["*"]);
        let r = &vs.http[0];
        assert!(r.r#match[0].ignore_uri_case);
        assert_eq!(
            r.r#match[0].source_labels.get("a").map(String::as_str),
            Some("b")
        );
        assert_eq!(r.r#match[0].query_params.get("q").cloned(), exact(""));
        assert_eq!(r.timeout, Some(Duration::from_secs(90)));
        let retries = r.retries.as_ref().expect("retries");
        assert_eq!(retries.per_try_timeout, Some(Duration::from_millis(250)));
        assert_eq!(retries.retry_on, "5xx");
        let cors = r.cors_policy.as_ref().expect("cors");
        assert_eq!(cors.allow_origin, ["*"]);
        assert_eq!(cors.max_age, Some(Duration::from_secs(3600)));
        assert_eq!(r.mirror_percent.map(|v| v.value), Some(30));
        assert_eq!(r.mirror_percentage.map(|p| p.value), Some(50.0));
    }

    #[test]
    fn destination_rule() {
        let dr: net::DestinationRule = from_json(json!({
            "host": "reviews.prod.svc.cluster.local",
            "exportTo": ["."],
            "workloadSelector": {"matchLabels": {"app": "productpage"}},
            "trafficPolicy": {
                "loadBalancer": {
                    "simple": "ROUND_ROBIN",
                    "localityLbSetting": {
                        "enabled": true,
                        "distribute": [{"from": "us-west/zone1/*", "to": {"us-west/zone1/*": 80, "us-west/zone2/*": 20}}],
                        "failover": [{"from": "us-east", "to": "eu-west"}],
                        "failoverPriority": ["topology.istio.io/network", "topology.kubernetes.io/region"]
                    },
                    "warmupDurationSecs": "60s"
                },
                "connectionPool": {
                    "tcp": {
                        "maxConnections": 100,
                        "connectTimeout": "30ms",
                        "tcpKeepalive": {"time": "7200s", "interval": "75s", "probes": 9},
                        "idleTimeout": "1h"
                    },
                    "http": {
                        "http1MaxPendingRequests": 1024,
                        "http2MaxRequests": 1000,
                        "maxRequestsPerConnection": 10,
                        "maxRetries": 3,
                        "idleTimeout": "90s",
                        "h2UpgradePolicy": "UPGRADE",
                        "useClientProtocol": true
                    }
                },
                "outlierDetection": {
                    "consecutive5xxErrors": 7,
                    "consecutiveGatewayErrors": 0,
                    "interval": "5m",
                    "baseEjectionTime": "15m",
                    "maxEjectionPercent": 50,
                    "minHealthPercent": 10
                },
                "tls": {"mode": "ISTIO_MUTUAL", "sni": "reviews.example.com"},
                "portLevelSettings": [{
                    "port": {"number": 9080},
                    "loadBalancer": {"consistentHash": {"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": "2048"}}},
                    "tls": {"mode": "MUTUAL", "clientCertificate": "/etc/certs/cert.pem", "privateKey": "/etc/certs/key.pem", "caCertificates": "/etc/certs/ca.pem", "subjectAltNames": ["spiffe://cluster.local/ns/prod/sa/reviews"]}
                }]
            },
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {
                    "name": "v2",
                    "labels": {"version": "v2"},
                    "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpCookie": {"name": "user", "ttl": "0s", "path": "/"}, "maglev": {"tableSize": 65537}}}}
                },
                {"name": "v3", "labels": {"version": "v3"}, "trafficPolicy": {"loadBalancer": {"consistentHash": {"useSourceIp": true}}}},
                {"name": "v4", "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpQueryParameterName": "session"}}}}
            ]
        }));

        use net::load_balancer_settings::consistent_hash_lb::{HashAlgorithm, HashKey};
        use net::load_balancer_settings::{LbPolicy, SimpleLb};

        assert_eq!(dr.host, "reviews.prod.svc.cluster.local");
        assert_eq!(dr.export_to, ["."]);
        let selector = dr.workload_selector.as_ref().expect("selector");
        assert_eq!(
            selector.match_labels.get("app").map(String::as_str),
            Some("productpage")
        );

        let tp = dr.traffic_policy.as_ref().expect("traffic policy");
        let lb = tp.load_balancer.as_ref().expect("lb");
        assert_eq!(
            lb.lb_policy,
            Some(LbPolicy::Simple(SimpleLb::RoundRobin as i32))
        );
        assert_eq!(lb.warmup_duration_secs, Some(Duration::from_secs(60)));
        let locality = lb.locality_lb_setting.as_ref().expect("locality");
        assert_eq!(locality.enabled.map(|v| v.value), Some(true));
        assert_eq!(locality.distribute[0].from, "us-west/zone1/*");
        assert_eq!(locality.distribute[0].to.get("us-west/zone1/*"), Some(&80));
        assert_eq!(locality.distribute[0].to.get("us-west/zone2/*"), Some(&20));
        assert_eq!(
            (
                locality.failover[0].from.as_str(),
                locality.failover[0].to.as_str()
            ),
            ("us-east", "eu-west")
        );
        assert_eq!(locality.failover_priority.len(), 2);

        let pool = tp.connection_pool.as_ref().expect("pool");
        let tcp = pool.tcp.as_ref().expect("tcp");
        assert_eq!(tcp.max_connections, 100);
        assert_eq!(tcp.connect_timeout, Some(Duration::from_millis(30)));
        let keepalive = tcp.tcp_keepalive.as_ref().expect("keepalive");
        assert_eq!(keepalive.time, Some(Duration::from_secs(7200)));
        assert_eq!(keepalive.interval, Some(Duration::from_secs(75)));
        assert_eq!(keepalive.probes, 9);
        assert_eq!(tcp.idle_timeout, Some(Duration::from_secs(3600)));
        let http = pool.http.as_ref().expect("http");
        assert_eq!(http.http1_max_pending_requests, 1024);
        assert_eq!(http.http2_max_requests, 1000);
        assert_eq!(http.max_requests_per_connection, 10);
        assert_eq!(http.max_retries, 3);
        assert_eq!(http.idle_timeout, Some(Duration::from_secs(90)));
        assert_eq!(
            http.h2_upgrade_policy(),
            net::connection_pool_settings::http_settings::H2UpgradePolicy::Upgrade
        );
        assert!(http.use_client_protocol);

        let od = tp.outlier_detection.as_ref().expect("outlier detection");
        assert_eq!(od.consecutive_5xx_errors.map(|v| v.value), Some(7));
        assert_eq!(od.consecutive_gateway_errors.map(|v| v.value), Some(0));
        assert_eq!(od.consecutive_local_origin_failures, None);
        assert_eq!(od.interval, Some(Duration::from_secs(300)));
        assert_eq!(od.base_ejection_time, Some(Duration::from_secs(900)));
        assert_eq!(od.max_ejection_percent, 50);
        assert_eq!(od.min_health_percent, 10);

        let tls = tp.tls.as_ref().expect("tls");
        assert_eq!(tls.mode(), net::client_tls_settings::TlSmode::IstioMutual);
        assert_eq!(tls.sni, "reviews.example.com");

        let port_policy = &tp.port_level_settings[0];
        assert_eq!(port_policy.port.map(|p| p.number), Some(9080));
        let hash = port_policy
            .load_balancer
            .as_ref()
            .and_then(|lb| match &lb.lb_policy {
                Some(LbPolicy::ConsistentHash(h)) => Some(h),
                _ => None,
            })
            .expect("consistent hash");
        assert_eq!(
            hash.hash_key,
            Some(HashKey::HttpHeaderName("x-user".into()))
        );
        assert_eq!(
            hash.hash_algorithm,
            Some(HashAlgorithm::RingHash(
                net::load_balancer_settings::consistent_hash_lb::RingHash {
                    minimum_ring_size: 2048
                }
            ))
        );
        let port_tls = port_policy.tls.as_ref().expect("tls");
        assert_eq!(port_tls.mode(), net::client_tls_settings::TlSmode::Mutual);
        assert_eq!(port_tls.client_certificate, "/etc/certs/cert.pem");
        assert_eq!(port_tls.private_key, "/etc/certs/key.pem");
        assert_eq!(port_tls.ca_certificates, "/etc/certs/ca.pem");
        assert_eq!(port_tls.subject_alt_names.len(), 1);

        assert_eq!(dr.subsets.len(), 4);
        assert_eq!(dr.subsets[0].name, "v1");
        assert_eq!(
            dr.subsets[0].labels.get("version").map(String::as_str),
            Some("v1")
        );
        let subset_hash = |i: usize| match dr.subsets[i]
            .traffic_policy
            .as_ref()
            .and_then(|tp| tp.load_balancer.as_ref())
            .and_then(|lb| lb.lb_policy.clone())
        {
            Some(LbPolicy::ConsistentHash(h)) => h,
            other => panic!("subset {i}: expected consistent hash, got {other:?}"),
        };
        let v2 = subset_hash(1);
        match v2.hash_key {
            Some(HashKey::HttpCookie(cookie)) => {
                assert_eq!(cookie.name, "user");
                assert_eq!(cookie.path, "/");
                assert_eq!(cookie.ttl, Some(Duration::default()));
            }
            other => panic!("expected cookie, got {other:?}"),
        }
        assert_eq!(
            v2.hash_algorithm,
            Some(HashAlgorithm::Maglev(
                net::load_balancer_settings::consistent_hash_lb::MagLev { table_size: 65537 }
            ))
        );
        assert_eq!(subset_hash(2).hash_key, Some(HashKey::UseSourceIp(true)));
        assert_eq!(
            subset_hash(3).hash_key,
            Some(HashKey::HttpQueryParameterName("session".into()))
        );
    }

    #[test]
    fn destination_rule_snake_case_and_legacy_fields() {
        let dr: net::DestinationRule = from_json(json!({
            "host": "db",
            "traffic_policy": {
                "load_balancer": {"simple": "LEAST_CONN", "locality_lb_setting": {"enabled": false}},
                "outlier_detection": {"consecutive_errors": 5, "consecutive_5xx_errors": 3, "base_ejection_time": "30s"},
                "connection_pool": {"http": {"h2_upgrade_policy": "DO_NOT_UPGRADE", "http1_max_pending_requests": 1}},
                "tls": {"mode": "SIMPLE", "insecure_skip_verify": true, "credential_name": "db-cert"}
            }
        }));
        let tp = dr.traffic_policy.expect("traffic policy");
        let lb = tp.load_balancer.expect("lb");
        assert_eq!(
            lb.lb_policy,
            Some(net::load_balancer_settings::LbPolicy::Simple(
                net::load_balancer_settings::SimpleLb::LeastConn as i32
            ))
        );
        assert_eq!(
            lb.locality_lb_setting
                .and_then(|l| l.enabled)
                .map(|v| v.value),
            Some(false)
        );
        let od = tp.outlier_detection.expect("outlier detection");
        assert_eq!(od.consecutive_errors, 5);
        assert_eq!(od.consecutive_5xx_errors.map(|v| v.value), Some(3));
        assert_eq!(od.base_ejection_time, Some(Duration::from_secs(30)));
        let http = tp.connection_pool.and_then(|p| p.http).expect("http");
        assert_eq!(
            http.h2_upgrade_policy(),
            net::connection_pool_settings::http_settings::H2UpgradePolicy::DoNotUpgrade
        );
        assert_eq!(http.http1_max_pending_requests, 1);
        let tls = tp.tls.expect("tls");
        assert_eq!(tls.mode(), net::client_tls_settings::TlSmode::Simple);
        assert_eq!(tls.insecure_skip_verify.map(|v| v.value), Some(true));
        assert_eq!(tls.credential_name, "db-cert");
    }

    #[test]
    fn service_entry() {
        let se: net::ServiceEntry = from_json(json!({
            "hosts": ["api.example.com", "*.vm.internal"],
            "addresses": ["240.0.0.10/32"],
            "ports": [
                {"number": 443, "name": "https", "protocol": "TLS"},
                {"number": 8080, "name": "http", "protocol": "HTTP", "targetPort": 9090}
            ],
            "location": "MESH_INTERNAL",
            "resolution": "DNS",
            "exportTo": ["*"],
            "subjectAltNames": ["spiffe://cluster.local/ns/vm/sa/api"],
            "endpoints": [
                {"address": "10.1.0.5", "ports": {"http": 19090}, "labels": {"app": "api"}, "network": "vm-net", "locality": "us-east1/b", "weight": 3, "serviceAccount": "api"},
                {"address": "api-2.vm.internal"},
                {"network": "remote", "labels": {"app": "api"}}
            ]
        }));
        assert_eq!(se.hosts, ["api.example.com", "*.vm.internal"]);
        assert_eq!(se.addresses, ["240.0.0.10/32"]);
        assert_eq!(se.ports.len(), 2);
        assert_eq!(
            (
                se.ports[0].number,
                se.ports[0].name.as_str(),
                se.ports[0].protocol.as_str()
            ),
            (443, "https", "TLS")
        );
        assert_eq!(se.ports[1].target_port, 9090);
        assert_eq!(se.location(), net::service_entry::Location::MeshInternal);
        assert_eq!(se.resolution(), net::service_entry::Resolution::Dns);
        assert_eq!(se.export_to, ["*"]);
        assert_eq!(se.subject_alt_names.len(), 1);
        let ep = &se.endpoints[0];
        assert_eq!(ep.address, "10.1.0.5");
        assert_eq!(ep.ports.get("http"), Some(&19090));
        assert_eq!(ep.labels.get("app").map(String::as_str), Some("api"));
        assert_eq!(ep.network, "vm-net");
        assert_eq!(ep.locality, "us-east1/b");
        assert_eq!(ep.weight, 3);
        assert_eq!(ep.service_account, "api");
        assert_eq!(se.endpoints[1].address, "api-2.vm.internal");
        assert!(se.endpoints[2].address.is_empty());
        assert_eq!(se.endpoints[2].network, "remote");

        let selected: net::ServiceEntry = from_json(json!({
            "hosts": ["db.vm.internal"],
            "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP"}],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "workload_selector": {"labels": {"app": "db"}}
        }));
        assert_eq!(
            selected.resolution(),
            net::service_entry::Resolution::Static
        );
        assert_eq!(
            selected
                .workload_selector
                .as_ref()
                .and_then(|s| s.labels.get("app"))
                .map(String::as_str),
            Some("db")
        );

        // Defaults: MESH_EXTERNAL / NONE are the zero values.
        let minimal: net::ServiceEntry = from_json(json!({"hosts": ["x.example.com"]}));
        assert_eq!(
            minimal.location(),
            net::service_entry::Location::MeshExternal
        );
        assert_eq!(minimal.resolution(), net::service_entry::Resolution::None);
        let rr: net::ServiceEntry = from_json(
            json!({"hosts": ["x"], "resolution": "DNS_ROUND_ROBIN", "location": "MESH_EXTERNAL"}),
        );
        assert_eq!(
            rr.resolution(),
            net::service_entry::Resolution::DnsRoundRobin
        );
    }

    #[test]
    fn workload_entry() {
        let we: net::WorkloadEntry = from_json(json!({
            "address": "2001:db8::5",
            "labels": {"app": "legacy", "version": "v1"},
            "serviceAccount": "legacy",
            "network": "dc1",
            "ports": {"http": 8080}
        }));
        assert_eq!(we.address, "2001:db8::5");
        assert_eq!(we.labels.len(), 2);
        assert_eq!(we.service_account, "legacy");
        assert_eq!(we.network, "dc1");
        assert_eq!(we.ports.get("http"), Some(&8080));
        assert_eq!(we.weight, 0);
    }

    #[test]
    fn gateway() {
        let gw: net::Gateway = from_json(json!({
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}},
                {
                    "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                    "hosts": ["bookinfo/*.example.com"],
                    "name": "https-bookinfo",
                    "tls": {"mode": "SIMPLE", "credentialName": "bookinfo-cert", "minProtocolVersion": "TLSV1_2", "cipherSuites": ["ECDHE-RSA-AES128-GCM-SHA256"]}
                },
                {"port": {"number": 15443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.local"], "tls": {"mode": "AUTO_PASSTHROUGH"}},
                {"port": {"number": 8443, "name": "mtls", "protocol": "HTTPS"}, "hosts": ["*"], "bind": "10.0.0.1", "tls": {"mode": "ISTIO_MUTUAL"}}
            ]
        }));
        use net::server_tls_settings::{TlSmode, TlsProtocol};
        assert_eq!(
            gw.selector.get("istio").map(String::as_str),
            Some("ingressgateway")
        );
        assert_eq!(gw.servers.len(), 4);
        let s0 = &gw.servers[0];
        let p0 = s0.port.as_ref().expect("port");
        assert_eq!(
            (p0.number, p0.name.as_str(), p0.protocol.as_str()),
            (80, "http", "HTTP")
        );
        assert_eq!(s0.hosts, ["*"]);
        let tls0 = s0.tls.as_ref().expect("tls");
        assert!(tls0.https_redirect);
        assert_eq!(tls0.mode(), TlSmode::Passthrough);
        let s1 = &gw.servers[1];
        assert_eq!(s1.name, "https-bookinfo");
        let tls1 = s1.tls.as_ref().expect("tls");
        assert_eq!(tls1.mode(), TlSmode::Simple);
        assert_eq!(tls1.credential_name, "bookinfo-cert");
        assert_eq!(tls1.min_protocol_version(), TlsProtocol::Tlsv12);
        assert_eq!(tls1.cipher_suites.len(), 1);
        assert_eq!(
            gw.servers[2].tls.as_ref().expect("tls").mode(),
            TlSmode::AutoPassthrough
        );
        assert_eq!(gw.servers[3].bind, "10.0.0.1");
        assert_eq!(
            gw.servers[3].tls.as_ref().expect("tls").mode(),
            TlSmode::IstioMutual
        );
    }

    #[test]
    fn sidecar() {
        let sc: net::Sidecar = from_json(json!({
            "workloadSelector": {"labels": {"app": "ratings"}},
            "ingress": [{
                "port": {"number": 9080, "protocol": "HTTP", "name": "somename"},
                "defaultEndpoint": "127.0.0.1:8080",
                "captureMode": "NONE",
                "tls": {"mode": "SIMPLE", "privateKey": "/etc/k.pem", "serverCertificate": "/etc/c.pem"},
                "connectionPool": {"tcp": {"maxConnections": 100}}
            }],
            "egress": [
                {"port": {"number": 3306, "protocol": "MYSQL", "name": "egressmysql"}, "captureMode": "NONE", "bind": "127.0.0.1", "hosts": ["*/mysql.foo.com"]},
                {"hosts": ["./*", "istio-system/*", "~/*"]}
            ],
            "inboundConnectionPool": {"http": {"http1MaxPendingRequests": 1024}},
            "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY", "egressProxy": {"host": "egress.istio-system.svc.cluster.local", "port": {"number": 443}}}
        }));
        assert_eq!(
            sc.workload_selector
                .as_ref()
                .and_then(|s| s.labels.get("app"))
                .map(String::as_str),
            Some("ratings")
        );
        let ing = &sc.ingress[0];
        assert_eq!(ing.port.as_ref().map(|p| p.number), Some(9080));
        assert_eq!(ing.default_endpoint, "127.0.0.1:8080");
        assert_eq!(ing.capture_mode(), net::CaptureMode::None);
        assert_eq!(
            ing.tls.as_ref().map(|t| t.mode()),
            Some(net::server_tls_settings::TlSmode::Simple)
        );
        assert_eq!(
            ing.connection_pool
                .as_ref()
                .and_then(|p| p.tcp.as_ref())
                .map(|t| t.max_connections),
            Some(100)
        );
        assert_eq!(sc.egress.len(), 2);
        assert_eq!(sc.egress[0].bind, "127.0.0.1");
        assert_eq!(
            sc.egress[0].port.as_ref().map(|p| p.protocol.as_str()),
            Some("MYSQL")
        );
        assert_eq!(sc.egress[0].hosts, ["*/mysql.foo.com"]);
        assert_eq!(sc.egress[1].capture_mode(), net::CaptureMode::Default);
        assert_eq!(sc.egress[1].hosts, ["./*", "istio-system/*", "~/*"]);
        assert_eq!(
            sc.inbound_connection_pool
                .as_ref()
                .and_then(|p| p.http.as_ref())
                .map(|h| h.http1_max_pending_requests),
            Some(1024)
        );
        let otp = sc.outbound_traffic_policy.as_ref().expect("policy");
        assert_eq!(otp.mode(), net::outbound_traffic_policy::Mode::RegistryOnly);
        assert_eq!(
            otp.egress_proxy.as_ref().map(|d| d.host.as_str()),
            Some("egress.istio-system.svc.cluster.local")
        );
    }

    #[test]
    fn mesh_config() {
        // Shaped like the `mesh` key of istiod's ConfigMap, including fields
        // meshfed does not model (defaultConfig, extensionProviders), which
        // are ignored as Istio ignores unknown fields.
        let mc: mesh::MeshConfig = from_json(json!({
            "accessLogFile": "/dev/stdout",
            "accessLogEncoding": "JSON",
            "connectTimeout": "10s",
            "protocolDetectionTimeout": "0s",
            "dnsRefreshRate": "60s",
            "tcpKeepalive": {"time": "300s", "interval": "30s", "probes": 3},
            "enableAutoMtls": true,
            "enablePrometheusMerge": false,
            "enableTracing": true,
            "ingressClass": "istio",
            "ingressService": "istio-ingressgateway",
            "ingressControllerMode": "STRICT",
            "ingressSelector": "ingressgateway",
            "proxyListenPort": 15001,
            "proxyInboundListenPort": 15006,
            "proxyHttpPort": 15080,
            "rootNamespace": "istio-system",
            "trustDomain": "cluster.local",
            "trustDomainAliases": ["old.local"],
            "outboundTrafficPolicy": {"mode": "ALLOW_ANY"},
            "inboundTrafficPolicy": {"mode": "LOCALHOST"},
            "defaultServiceExportTo": ["*"],
            "defaultVirtualServiceExportTo": ["."],
            "defaultDestinationRuleExportTo": ["*", "istio-system"],
            "localityLbSetting": {"enabled": true, "failover": [{"from": "us-east", "to": "us-west"}]},
            "h2UpgradePolicy": "UPGRADE",
            "discoverySelectors": [{"matchLabels": {"env": "prod"}}, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}],
            "pathNormalization": {"normalization": "MERGE_SLASHES"},
            "defaultHttpRetryPolicy": {"attempts": 2, "retryOn": "connect-failure,refused-stream"},
            "meshMTLS": {"minProtocolVersion": "TLSV1_3"},
            "tlsDefaults": {"ecdhCurves": ["P-256"]},
            "serviceSettings": [{"settings": {"clusterLocal": true}, "hosts": ["*.kube-system.svc.cluster.local"]}],
            "outboundClusterStatName": "%SERVICE%",
            "defaultConfig": {"discoveryAddress": "istiod.istio-system.svc:15012", "proxyMetadata": {"A": "b"}, "drainDuration": "45s"},
            "extensionProviders": [{"name": "otel", "opentelemetry": {"service": "otel.svc", "port": 4317}}],
            "defaultProviders": {"tracing": ["otel"]},
            "someFutureField": {"nested": [1, 2, 3]}
        }));
        use mesh::mesh_config::{self as mc_types};
        assert_eq!(mc.access_log_file, "/dev/stdout");
        assert_eq!(mc.access_log_encoding(), mc_types::AccessLogEncoding::Json);
        assert_eq!(mc.connect_timeout, Some(Duration::from_secs(10)));
        assert_eq!(mc.protocol_detection_timeout, Some(Duration::default()));
        assert_eq!(mc.dns_refresh_rate, Some(Duration::from_secs(60)));
        let keepalive = mc.tcp_keepalive.as_ref().expect("keepalive");
        assert_eq!(keepalive.time, Some(Duration::from_secs(300)));
        assert_eq!(keepalive.interval, Some(Duration::from_secs(30)));
        assert_eq!(keepalive.probes, 3);
        assert_eq!(mc.enable_auto_mtls.map(|v| v.value), Some(true));
        assert_eq!(mc.enable_prometheus_merge.map(|v| v.value), Some(false));
        assert!(mc.enable_tracing);
        assert_eq!(mc.ingress_class, "istio");
        assert_eq!(mc.ingress_service, "istio-ingressgateway");
        assert_eq!(
            mc.ingress_controller_mode(),
            mc_types::IngressControllerMode::Strict
        );
        assert_eq!(mc.ingress_selector, "ingressgateway");
        assert_eq!(mc.proxy_listen_port, 15001);
        assert_eq!(mc.proxy_inbound_listen_port, 15006);
        assert_eq!(mc.proxy_http_port, 15080);
        assert_eq!(mc.root_namespace, "istio-system");
        assert_eq!(mc.trust_domain, "cluster.local");
        assert_eq!(mc.trust_domain_aliases, ["old.local"]);
        assert_eq!(
            mc.outbound_traffic_policy.as_ref().map(|p| p.mode()),
            Some(mc_types::outbound_traffic_policy::Mode::AllowAny)
        );
        assert_eq!(
            mc.inbound_traffic_policy.as_ref().map(|p| p.mode()),
            Some(mc_types::inbound_traffic_policy::Mode::Localhost)
        );
        assert_eq!(mc.default_service_export_to, ["*"]);
        assert_eq!(mc.default_virtual_service_export_to, ["."]);
        assert_eq!(mc.default_destination_rule_export_to, ["*", "istio-system"]);
        let locality = mc.locality_lb_setting.as_ref().expect("locality");
        assert_eq!(locality.enabled.map(|v| v.value), Some(true));
        assert_eq!(locality.failover[0].to, "us-west");
        assert_eq!(mc.h2_upgrade_policy(), mc_types::H2UpgradePolicy::Upgrade);
        assert_eq!(mc.discovery_selectors.len(), 2);
        assert_eq!(
            mc.discovery_selectors[0]
                .match_labels
                .get("env")
                .map(String::as_str),
            Some("prod")
        );
        let expr = &mc.discovery_selectors[1].match_expressions[0];
        assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("app", "In"));
        assert_eq!(expr.values, ["a", "b"]);
        assert_eq!(
            mc.path_normalization.as_ref().map(|p| p.normalization()),
            Some(mc_types::proxy_path_normalization::NormalizationType::MergeSlashes)
        );
        let retry = mc.default_http_retry_policy.as_ref().expect("retry");
        assert_eq!(retry.attempts, 2);
        assert_eq!(
            mc.mesh_m_tls.as_ref().map(|t| t.min_protocol_version()),
            Some(mc_types::tls_config::TlsProtocol::Tlsv13)
        );
        assert_eq!(
            mc.tls_defaults.as_ref().map(|t| t.ecdh_curves.clone()),
            Some(vec!["P-256".to_owned()])
        );
        let settings = &mc.service_settings[0];
        assert_eq!(settings.settings.map(|s| s.cluster_local), Some(true));
        assert_eq!(settings.hosts, ["*.kube-system.svc.cluster.local"]);
        assert_eq!(mc.outbound_cluster_stat_name, "%SERVICE%");

        // snake_case works for MeshConfig as well.
        let snake: mesh::MeshConfig = from_json(json!({
            "root_namespace": "mesh-root",
            "enable_auto_mtls": false,
            "connect_timeout": "1.5s",
            "default_service_export_to": ["."],
            "outbound_traffic_policy": {"mode": "REGISTRY_ONLY"},
            "mesh_mTLS": {"min_protocol_version": "TLSV1_2"}
        }));
        assert_eq!(snake.root_namespace, "mesh-root");
        assert_eq!(snake.enable_auto_mtls.map(|v| v.value), Some(false));
        assert_eq!(snake.connect_timeout, Some(Duration::new(1, 500_000_000)));
        assert_eq!(snake.default_service_export_to, ["."]);
        assert_eq!(
            snake.outbound_traffic_policy.map(|p| p.mode()),
            Some(mc_types::outbound_traffic_policy::Mode::RegistryOnly)
        );
        assert_eq!(
            snake.mesh_m_tls.map(|t| t.min_protocol_version()),
            Some(mc_types::tls_config::TlsProtocol::Tlsv12)
        );

        // Unset wrappers stay None so callers can apply Istio's defaults.
        let empty: mesh::MeshConfig = from_json(json!({}));
        assert_eq!(empty.enable_auto_mtls, None);
        assert_eq!(empty.connect_timeout, None);
    }

    #[test]
    fn mesh_networks() {
        let mn: mesh::MeshNetworks = from_json(json!({
            "networks": {
                "network1": {
                    "endpoints": [{"fromRegistry": "cluster1"}, {"fromCidr": "192.168.100.0/22"}],
                    "gateways": [
                        {"registryServiceName": "istio-eastwestgateway.istio-system.svc.cluster.local", "port": 15443},
                        {"address": "192.168.100.1", "port": 15443, "locality": "us-east-1a"}
                    ]
                },
                "network2": {
                    "endpoints": [{"from_registry": "cluster2"}],
                    "gateways": [{"address": "gw.example.com", "port": 15443}]
                }
            }
        }));
        use mesh::network::istio_network_gateway::Gw;
        use mesh::network::network_endpoints::Ne;
        assert_eq!(
            mn.networks.keys().collect::<Vec<_>>(),
            ["network1", "network2"]
        );
        let n1 = &mn.networks["network1"];
        assert_eq!(
            n1.endpoints[0].ne,
            Some(Ne::FromRegistry("cluster1".into()))
        );
        assert_eq!(
            n1.endpoints[1].ne,
            Some(Ne::FromCidr("192.168.100.0/22".into()))
        );
        assert_eq!(
            n1.gateways[0].gw,
            Some(Gw::RegistryServiceName(
                "istio-eastwestgateway.istio-system.svc.cluster.local".into()
            ))
        );
        assert_eq!(n1.gateways[0].port, 15443);
        assert_eq!(n1.gateways[1].gw, Some(Gw::Address("192.168.100.1".into())));
        assert_eq!(n1.gateways[1].locality, "us-east-1a");
        let n2 = &mn.networks["network2"];
        assert_eq!(
            n2.endpoints[0].ne,
            Some(Ne::FromRegistry("cluster2".into()))
        );
        assert_eq!(
            n2.gateways[0].gw,
            Some(Gw::Address("gw.example.com".into()))
        );
    }

    #[test]
    fn bad_values_are_errors() {
        fn err<T: serde::de::DeserializeOwned + std::fmt::Debug>(
            value: serde_json::Value,
        ) -> String {
            serde_json::from_value::<T>(value)
                .expect_err("should be rejected")
                .to_string()
        }

        let e = err::<net::ServiceEntry>(json!({"hosts": ["a"], "resolution": "DYNAMIC"}));
        assert!(e.contains("DYNAMIC"), "{e}");
        let e = err::<net::DestinationRule>(
            json!({"host": "a", "trafficPolicy": {"tls": {"mode": "ISTIO_MTLS"}}}),
        );
        assert!(e.contains("ISTIO_MTLS"), "{e}");
        let e = err::<net::DestinationRule>(
            json!({"host": "a", "trafficPolicy": {"loadBalancer": {"simple": "round_robin"}}}),
        );
        assert!(e.contains("round_robin"), "{e}");
        let e = err::<mesh::MeshConfig>(json!({"outboundTrafficPolicy": {"mode": "ALLOW_ALL"}}));
        assert!(e.contains("ALLOW_ALL"), "{e}");

        for bad in ["5", "five seconds", "5 s", "-", "1e3s", ""] {
            let e = err::<net::VirtualService>(json!({"http": [{"timeout": bad}]}));
            assert!(e.contains("invalid duration"), "{bad:?}: {e}");
        }
        let e = err::<mesh::MeshConfig>(json!({"connectTimeout": 10}));
        assert!(e.contains("duration"), "{e}");

        // Wrong JSON types and conflicting oneof members are rejected too.
        err::<net::VirtualService>(json!({"hosts": "not-a-list"}));
        err::<net::Gateway>(json!({"servers": [{"port": {"number": "eighty"}}]}));
        err::<net::StringMatch>(json!({"exact": "a", "prefix": "b"}));
    }

    #[test]
    fn enums_accept_numbers_and_serialize_as_names() {
        let se: net::ServiceEntry = from_json(json!({"hosts": ["a"], "resolution": 2}));
        assert_eq!(se.resolution(), net::service_entry::Resolution::Dns);
        let out = serde_json::to_value(&se).expect("serializes");
        assert_eq!(out, json!({"hosts": ["a"], "resolution": "DNS"}));
    }

    #[test]
    fn json_round_trip_is_camel_case_and_canonical() {
        let original = json!({
            "host": "reviews",
            "trafficPolicy": {
                "connectionPool": {"tcp": {"connectTimeout": "0.250s", "maxConnections": 10}},
                "outlierDetection": {"consecutive5xxErrors": 2, "interval": "5m"},
                "tls": {"mode": "ISTIO_MUTUAL"}
            },
            "subsets": [{"name": "v1", "labels": {"b": "2", "a": "1"}}]
        });
        let dr: net::DestinationRule = from_json(original);
        let out = serde_json::to_value(&dr).expect("serializes");
        assert_eq!(
            out,
            json!({
                "host": "reviews",
                "trafficPolicy": {
                    "connectionPool": {"tcp": {"maxConnections": 10, "connectTimeout": "0.250s"}},
                    "outlierDetection": {"consecutive5xxErrors": 2, "interval": "300s"},
                    "tls": {"mode": "ISTIO_MUTUAL"}
                },
                "subsets": [{"name": "v1", "labels": {"a": "1", "b": "2"}}]
            })
        );
        let again: net::DestinationRule = from_json(out);
        assert_eq!(again, dr);
    }

    #[test]
    fn protobuf_wire_format_matches_istio_field_numbers() {
        use prost::Message;

        // VirtualService { hosts: ["a"] (1), http: [{ timeout: 5s (6) }] (3), export_to: ["."] (6) }
        let vs = net::VirtualService {
            hosts: vec!["a".into()],
            http: vec![net::HttpRoute {
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            }],
            export_to: vec![".".into()],
            ..Default::default()
        };
        let bytes = vs.encode_to_vec();
        assert_eq!(
            bytes,
            [
                0x0a, 1, b'a', // field 1, length 1, "a"
                0x1a, 4, 0x32, 2, 0x08, 5, // field 3 { field 6 { field 1: 5 } }
                0x32, 1, b'.', // field 6, length 1, "."
            ]
        );
        assert_eq!(net::VirtualService::decode(bytes.as_slice()), Ok(vs));

        // MeshConfig.root_namespace is field 34; enable_auto_mtls is field 43.
        let mc = mesh::MeshConfig {
            root_namespace: "r".into(),
            enable_auto_mtls: Some(true.into()),
            ..Default::default()
        };
        assert_eq!(
            mc.encode_to_vec(),
            [0x92, 0x02, 1, b'r', 0xda, 0x02, 2, 0x08, 1]
        );
    }

    #[test]
    fn descriptor_set_is_exported() {
        use prost::Message;

        let fds = pbjson_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("valid descriptor set");
        let names: Vec<_> = fds.file.iter().map(|f| f.name().to_owned()).collect();
        assert!(names.contains(&"istio/networking/v1alpha3/virtual_service.proto".to_owned()));
        assert!(names.contains(&"istio/mesh/v1alpha1/network.proto".to_owned()));
    }
}

/// `istio.v1.auth`: the mesh CA's certificate service (`IstioCertificateService`).
pub mod auth {
    /// Version 1.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.rs"));
        include!(concat!(env!("OUT_DIR"), "/istio.v1.auth.serde.rs"));
    }
}

/// `istio.workload`: the ambient-mode Address type (workloads and services) ztunnel
/// reads over WDS.
pub mod workload {
    #![allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        rustdoc::all,
        deprecated
    )]
    include!(concat!(env!("OUT_DIR"), "/istio.workload.rs"));
    include!(concat!(env!("OUT_DIR"), "/istio.workload.serde.rs"));
}
