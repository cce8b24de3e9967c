//! The Kubernetes Gateway API: Istio's golden conversions
//! (`pilot/pkg/config/kube/gateway/testdata`, driven as `conversion_test.go` drives
//! them) run through meshfed's translation, compared object by object (the typed
//! specs and the `internal.istio.io` annotations, not text) and status by status.
//!
//! The vectors are copied as stored in `tests/data/gateway_api/` (`SOURCES.md` names
//! the Istio commit each file was read at). Every golden object either matches or is
//! listed in [`GAPS`] with its reason; a listed one that starts matching fails the
//! test, so the list shrinks as the translation grows.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::*;
use std::sync::Arc;

use meshfed_registry::config::gateway_api::convert::{self, Inputs, Output};
use meshfed_registry::config::{ConfigObject, Decoded, Kind, Spec, decode};
use serde_json::Value;

/// The cases ported (`<case>.yaml` with `<case>.yaml.golden` and, where ported,
/// `<case>.status.yaml.golden`).
const CASES: &[&str] = &[
    "http",
    "grpc",
    "zero",
    "http-grpc-same-host",
    "tcp",
    "empty-backend-refs",
    "redirect-only",
    "reference-grant-multiple-to",
    "route-binding",
    "mesh",
    "serviceentry",
    "route-precedence",
    "tls",
    "weighted",
    "reference-policy-service",
    "reference-policy-tcp",
    "valid-invalid-parent-ref",
    "tls-terminate",
    "gateway-invalid-parameters-ref",
    "isolation",
    "backend-tls-policy",
    "backend-tls-policy-ignored",
    "backend-tls-client-cert",
    "backend-tls-client-cert-refgrant",
    "mix-backend-policy",
    "status",
    "delegated",
    "multi-gateway",
    "frontend-tls-invalid",
    "frontend-tls-refgrant",
];

/// Cases whose `<case>.yaml.golden` is not stored, with what is compared instead:
/// the status golden, and the Istio config taken to be empty (every listener of the
/// input is invalid, and istiod serves no invalid listener, as the other goldens show).
const STATUS_ONLY: &[(&str, &str)] = &[(
    "frontend-tls-refgrant",
    "no config golden stored; each Gateway's only listener references a certificate or CA it may not use",
)];

/// Istio's other cases (`testdata/*.yaml` with a golden), and why they are not in
/// [`CASES`].
const NOT_PORTED: &[(&str, &str)] = &[
    ("listenerset", "kinds meshfed does not read: XListenerSet"),
    (
        "listenerset-cross-namespace",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-same-name-different-ns",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-invalid",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-empty-listeners",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-hostname-conflict",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-https-missing-tls",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-overlapping-port",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "listenerset-protocol-conflict",
        "kinds meshfed does not read: XListenerSet",
    ),
    (
        "backend-lb-policy",
        "kinds meshfed does not read: XBackendTrafficPolicy / BackendPolicy",
    ),
    (
        "backend-traffic-policy-ignored",
        "kinds meshfed does not read: XBackendTrafficPolicy / BackendPolicy",
    ),
    (
        "backendpolicy",
        "kinds meshfed does not read: XBackendTrafficPolicy / BackendPolicy",
    ),
    (
        "reference-policy-inferencepool",
        "kinds meshfed does not read: InferencePool (inference.networking.k8s.io)",
    ),
    (
        "inferencepool-weighted",
        "kinds meshfed does not read: InferencePool (inference.networking.k8s.io)",
    ),
    (
        "mcs",
        "kinds meshfed does not read: ServiceImport (multi-cluster services)",
    ),
    (
        "multicluster-service-status",
        "kinds meshfed does not read: ServiceImport (multi-cluster services)",
    ),
    ("udp", "kinds meshfed does not read: UDPRoute"),
    ("xbackend", "kinds meshfed does not read: XBackend"),
    ("waypoint", "ambient waypoint: not served"),
    ("foreign-waypoint", "ambient waypoint: not served"),
    ("foreign-waypoint-canary", "ambient waypoint: not served"),
    (
        "eastwest",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "eastwest-tlsoption",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "eastwest-labelport",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "eastwest-remote",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "eastwest-namedport",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "east-west-ambient",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "eastwest-ambient",
        "east-west gateway (ambient multi-network): not served",
    ),
    (
        "alias",
        "the stored golden is Istio 1.1x's (singular internal.istio.io/parent annotation, one VirtualService per route): nothing to compare by content; gateway.istio.io/alias-for is not read",
    ),
    ("mismatch", "no golden stored"),
    (
        "multigateway",
        "the stored input and golden are of the service-apis v1alpha1 group (networking.x-k8s.io), which meshfed does not read",
    ),
    (
        "invalid",
        "the stored input (istio/istio 9cc87618) and goldens (fa0ab4aa, 2b6f8d79) are of different Istio versions and the index holds neither at the other's commit; most of its objects are invalid by the API's own rules, which meshfed rejects when reading",
    ),
    (
        "reference-policy-tls",
        "the stored input (istio/istio 0ddd4027) is of Gateway API v1alpha2 (ReferencePolicy, a listener's singular certificateRef), which meshfed does not read, and its golden (29bcc3ca) is Istio 1.1x's",
    ),
    (
        "serviceentry-cross-namespace",
        "kinds meshfed does not read: ListenerSet parents; and ServiceEntry exportTo visibility per gateway namespace",
    ),
    (
        "http-match-order",
        "the stored golden has one VirtualService per route (match-order-0-istio-autogenerated-k8s-gateway): nothing to compare by content",
    ),
    (
        "simple",
        "the stored input is of the service-apis v1alpha1 group (networking.x-k8s.io), which meshfed does not read",
    ),
];

/// Golden objects meshfed does not reproduce, and why. Keys:
/// `<case>:config:<Kind>/<namespace>/<name>`, `<case>:status:<Kind>/<namespace>/<name>`,
/// `<case>:extra:<Kind>/<namespace>/<name>` (an object meshfed makes that the golden
/// does not have).
const GAPS: &[(&str, &str)] = &[
    (
        "http:config:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~default~cors-wildcard-origin.domain.example",
        "the stored golden is newer than the stored input: HTTPRoute http-route-cors-wildcard-1 is not in the input",
    ),
    (
        "http:config:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~default~cors.domain.example",
        "the stored golden is newer than the stored input: its CORS filter has exposeHeaders, maxAge and a wildcard origin the input's does not",
    ),
    (
        "http:config:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~default~infpool-multi.domain.example",
        "InferencePool backends (inference.networking.k8s.io) are not read",
    ),
    (
        "http:config:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~default~multi-infpool.domain.example",
        "InferencePool backends (inference.networking.k8s.io) are not read",
    ),
    (
        "grpc:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "grpc:status:Gateway/istio-system/gateway",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) does not have and meshfed does not write",
    ),
    (
        "zero:config:Gateway/istio-system/gateway-istio-autogenerated-k8s-gateway-default",
        "the stored golden predates Istio's current names, which meshfed generates",
    ),
    (
        "zero:config:VirtualService/default/http-0-istio-autogenerated-k8s-gateway",
        "the stored golden predates Istio's current names, and its rule of weight-0 backends is a 503 fault; istiod now answers a 500 direct response (conversion.go at 60a4b52f), as meshfed does",
    ),
    (
        "zero:extra:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the current name of the golden's gateway-istio-autogenerated-k8s-gateway-default",
    ),
    (
        "zero:extra:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~tcp",
        "the golden (older) has no Gateway for the TCP listener",
    ),
    (
        "zero:extra:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~default~first.domain.example",
        "the current name of the golden's http-0-istio-autogenerated-k8s-gateway",
    ),
    (
        "zero:extra:VirtualService/default/tcp~tcp~0~istio-autogenerated-k8s-gateway",
        "the golden (older) has no TCP route for a backend of weight 0",
    ),
    (
        "zero:status:Gateway/istio-system/gateway",
        "the stored status golden is older (no Gateway ResolvedRefs condition, which the newest stored status golden, serviceentry-cross-namespace at 33ab1827, has and meshfed writes)",
    ),
    (
        "status:status:Gateway/istio-system/gateway",
        "the stored status golden (istio/istio 0c893552) predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "delegated:status:Gateway/istio-system/gateway",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) does not have and meshfed does not write",
    ),
    (
        "multi-gateway:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~http",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "multi-gateway:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~tcp",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "http-grpc-same-host:status:Gateway/istio-system/gateway",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) does not have and meshfed does not write",
    ),
    (
        "tcp:config:Gateway/istio-system/gateway2~istio-autogenerated-k8s-gateway~default",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tcp:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "empty-backend-refs:status:Gateway/istio-system/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "redirect-only:status:Gateway/istio-system/default",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "reference-grant-multiple-to:status:Gateway/bookinfo-ingress/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~foobar",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~same-namespace",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~scope-route",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-combined-no",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-combined-yes",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-dne-no",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-dne-yes",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-exists-no",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-exists-yes",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-in-no",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-in-yes",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-notin-no",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-expr-notin-yes",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~slctr-labels",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "route-binding:status:Gateway/istio-system/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "mesh:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~passthrough",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~terminate",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~terminate-istio-builtin",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~terminate-istio-mtls",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~terminate-mtls",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~terminate-multi",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "tls:config:VirtualService/default/http-0-istio-autogenerated-k8s-gateway",
        "the stored golden predates VirtualServices merged per listener and host (one VirtualService per route, `<route>-<n>-istio-autogenerated-k8s-gateway`), which meshfed generates",
    ),
    (
        "tls:config:VirtualService/default/tls~tls~0~istio-autogenerated-k8s-gateway",
        "the stored golden predates the input's second Gateway (gateway2): meshfed numbers the route's VirtualServices over both parents, gateway2's first",
    ),
    (
        "tls:extra:Gateway/istio-system/gateway2~istio-autogenerated-k8s-gateway~passthrough",
        "the stored golden predates the input's second Gateway (gateway2), which the newer stored input has",
    ),
    (
        "tls:extra:VirtualService/default/istio-system~gateway~istio-autogenerated-k8s-gateway~terminate~domain.example",
        "the current name of the golden's http-0-istio-autogenerated-k8s-gateway",
    ),
    (
        "tls:extra:VirtualService/default/tls~tls~1~istio-autogenerated-k8s-gateway",
        "the stored golden predates the input's second Gateway (gateway2), which the newer stored input has",
    ),
    (
        "reference-policy-service:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~simple",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "reference-policy-service:status:Gateway/istio-system/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "reference-policy-tcp:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~echo",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "reference-policy-tcp:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~my-svc",
        "the stored golden (istio/istio b4ec6ced) names the service account gateway-istio for a Gateway that names its Service in spec.addresses; the newer goldens (http-grpc-same-host, redirect-only, empty-backend-refs) leave it empty, as meshfed does",
    ),
    (
        "reference-policy-tcp:status:Gateway/istio-system/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "valid-invalid-parent-ref:config:Gateway/istio-system/gateway~istio-autogenerated-k8s-gateway~default",
        "the stored golden predates the internal.istio.io/service-account-name annotation (the newer goldens have it)",
    ),
    (
        "valid-invalid-parent-ref:status:Gateway/istio-system/gateway",
        "the stored status golden predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "isolation:status:Gateway/gateway-conformance-infra/isolation",
        "the stored status golden (istio/istio ec6fe36c) predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "backend-tls-policy:status:Gateway/istio-system/gateway",
        "the stored status golden (istio/istio 00d8b7b1) predates the Gateway ResolvedRefs condition, which the newest stored status golden (serviceentry-cross-namespace, 33ab1827) has and meshfed writes",
    ),
    (
        "backend-tls-client-cert:status:Gateway/istio-system/backend-tls-malformed",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newer stored goldens (backend-tls-client-cert-refgrant, 9f450731) do not have and meshfed does not write; and the translation does not read Secret contents (istiod reports the malformed certificate)",
    ),
    (
        "backend-tls-client-cert:status:Gateway/istio-system/backend-tls-nonexistent",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newer stored goldens (backend-tls-client-cert-refgrant, 9f450731) do not have and meshfed does not write; and the translation does not look Secrets up (istiod reports the missing one)",
    ),
    (
        "backend-tls-client-cert:status:Gateway/istio-system/backend-tls-unsupported-kind",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newer stored goldens (backend-tls-client-cert-refgrant, 9f450731) do not have and meshfed does not write",
    ),
    (
        "backend-tls-client-cert:status:Gateway/istio-system/backend-tls-valid",
        "the stored status golden (istio/istio 176a8474) has an InsecureFrontendValidationMode condition with an empty reason, which the newer stored goldens (backend-tls-client-cert-refgrant, 9f450731) do not have and meshfed does not write",
    ),
    (
        "frontend-tls-refgrant:status:Gateway/istio-system/cacert-exists",
        "the stored status golden (istio/istio 49f36041) has no Gateway ResolvedRefs condition, which the other stored golden of the feature (frontend-tls-invalid, 4c2a6b08) and the newest stored status golden (serviceentry-cross-namespace, 33ab1827) have and meshfed writes; the listener's conditions match",
    ),
    (
        "frontend-tls-refgrant:status:Gateway/istio-system/cacert-missing",
        "the stored status golden (istio/istio 49f36041) has no Gateway ResolvedRefs condition, which the other stored golden of the feature (frontend-tls-invalid, 4c2a6b08) and the newest stored status golden (serviceentry-cross-namespace, 33ab1827) have and meshfed writes; the listener's conditions match",
    ),
    (
        "frontend-tls-refgrant:status:Gateway/istio-system/cert-exists",
        "the stored status golden (istio/istio 49f36041) has no Gateway ResolvedRefs condition, which the other stored golden of the feature (frontend-tls-invalid, 4c2a6b08) and the newest stored status golden (serviceentry-cross-namespace, 33ab1827) have and meshfed writes; the listener's conditions match",
    ),
    (
        "frontend-tls-refgrant:status:Gateway/istio-system/cert-missing",
        "the stored status golden (istio/istio 49f36041) has no Gateway ResolvedRefs condition, which the other stored golden of the feature (frontend-tls-invalid, 4c2a6b08) and the newest stored status golden (serviceentry-cross-namespace, 33ab1827) have and meshfed writes; the listener's conditions match",
    ),
    (
        "mix-backend-policy:config:DestinationRule/default/echo-istio-autogenerated-k8s-gateway",
        "the stored golden predates Istio's current names (echo~istio-autogenerated-k8s-gateway, which meshfed generates) and merges an XBackendTrafficPolicy (loadBalancer, a parent), which meshfed does not read",
    ),
    (
        "mix-backend-policy:extra:DestinationRule/default/echo~istio-autogenerated-k8s-gateway",
        "the current name of the golden's echo-istio-autogenerated-k8s-gateway (without the XBackendTrafficPolicy meshfed does not read)",
    ),
];

/// The services `conversion_test.go` sets up (`<name>.<ns>.svc.domain.suffix`, and
/// two that are not cluster services).
const SERVICES: &[&str] = &[
    "istio-ingressgateway.istio-system",
    "httpbin.default",
    "httpbin-apple.apple",
    "httpbin-banana.banana",
    "httpbin-second.default",
    "httpbin-wildcard.default",
    "foo-svc.default",
    "httpbin-other.default",
    "example.default",
    "echo.default",
    "httpbin.cert",
    "my-svc.service",
    "a-example.allowed-1",
    "a-example.allowed-2",
    "b-example.allowed-1",
    "svc2.allowed-1",
    "svc2.allowed-2",
    "svc1.allowed-1",
    "svc3.allowed-2",
    "svc4.default",
    "httpbin.group-namespace1",
    "httpbin.group-namespace2",
    "httpbin-zero.default",
    "httpbin.istio-system",
    "httpbin-mirror.default",
    "httpbin-foo.default",
    "httpbin-alt.default",
    "istiod.istio-system",
    "echo.istio-system",
    "httpbin-bad.default",
    "echo-1.default",
    "echo-2.default",
    "echo-port.default",
    "not-found.default",
];

const DOMAIN: &str = "domain.suffix";

fn data(name: &str) -> Option<String> {
    std::fs::read_to_string(format!(
        "{}/tests/data/gateway_api/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .ok()
}

fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .filter_map(|d| <Value as serde::Deserialize>::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

/// The input objects meshfed reads. Istio's test reader takes any version of a
/// Gateway API kind (one stored input names `v1beta1alpha2`), so the version is
/// normalized to the kind's before decoding.
pub fn load(text: &str) -> Vec<Arc<ConfigObject>> {
    documents(text)
        .into_iter()
        .filter_map(|mut doc| {
            let group = doc["apiVersion"]
                .as_str()
                .and_then(|a| a.split_once('/'))
                .map(|(g, _)| g.to_string());
            if let (Some(group), Some(kind)) = (group, doc["kind"].as_str())
                && let Some(kind) = Kind::from_group_kind(&group, kind)
                && kind.is_gateway_api()
            {
                doc["apiVersion"] = Value::from(kind.api_version());
            }
            match decode(&doc, "test") {
                Decoded::Object(o) => Some(Arc::new(o)),
                _ => None,
            }
        })
        .collect()
}

/// The namespaces `conversion_test.go` creates: one per namespace of the input's
/// objects, labelled `istio.io/test-name-part: <name up to its first '-'>`.
pub fn namespaces(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    documents(text)
        .iter()
        .filter_map(|d| d["metadata"]["namespace"].as_str())
        .filter(|ns| !ns.is_empty())
        .map(|ns| {
            let part = ns.split('-').next().unwrap_or_default().to_string();
            // Kubernetes labels every namespace with its name.
            let labels = BTreeMap::from([
                ("istio.io/test-name-part".to_string(), part),
                ("kubernetes.io/metadata.name".to_string(), ns.to_string()),
            ]);
            (ns.to_string(), labels)
        })
        .collect()
}

/// The ports `conversion_test.go` gives every service it registers.
const PORTS: &[(&str, u32)] = &[("http", 80), ("tcp", 34000), ("tcp-other", 34001)];

/// The ConfigMaps `conversion_test.go` creates (`<namespace>/<name>` and their keys;
/// the values are not read).
const CONFIG_MAPS: &[(&str, &str)] = &[
    ("default/malformed", "not-ca.crt"),
    ("default/auth-cert", "ca.crt"),
];

/// The Kubernetes Services of an input (`v1 Service` documents): host and ports.
fn kube_services(text: &str) -> BTreeMap<String, Vec<(String, u32)>> {
    documents(text)
        .into_iter()
        .filter(|d| d["apiVersion"] == "v1" && d["kind"] == "Service")
        .map(|d| {
            let host = format!(
                "{}.{}.svc.{DOMAIN}",
                d["metadata"]["name"].as_str().unwrap_or_default(),
                d["metadata"]["namespace"].as_str().unwrap_or("default")
            );
            let ports = d["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_string(),
                        p["port"].as_u64().unwrap_or_default() as u32,
                    )
                })
                .collect();
            (host, ports)
        })
        .collect()
}

/// Translates `objects` as `conversion_test.go` sets the controller up, with the
/// Kubernetes Services of the input text `input`.
pub fn translate(
    objects: &[Arc<ConfigObject>],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    input: &str,
) -> Output {
    let mut services: BTreeMap<String, Vec<(String, u32)>> = SERVICES
        .iter()
        .map(|s| format!("{s}.svc.{DOMAIN}"))
        .chain(["example.com".to_string(), "google.com".to_string()])
        .map(|h| {
            let ports = PORTS.iter().map(|(n, p)| (n.to_string(), *p)).collect();
            (h, ports)
        })
        .collect();
    services.extend(kube_services(input));
    let mut config_maps: BTreeMap<String, BTreeMap<String, String>> = CONFIG_MAPS
        .iter()
        .map(|(name, key)| {
            (
                name.to_string(),
                BTreeMap::from([(key.to_string(), String::new())]),
            )
        })
        .collect();
    // And the input's own (`v1 ConfigMap` documents).
    for d in documents(input)
        .into_iter()
        .filter(|d| d["apiVersion"] == "v1" && d["kind"] == "ConfigMap")
    {
        let name = format!(
            "{}/{}",
            d["metadata"]["namespace"].as_str().unwrap_or("default"),
            d["metadata"]["name"].as_str().unwrap_or_default()
        );
        let data = serde_json::from_value(d["data"].clone()).unwrap_or_default();
        config_maps.insert(name, data);
    }
    convert::convert(&Inputs {
        objects,
        domain: DOMAIN,
        controller: "istio.io/gateway-controller",
        service_exists: &|h| services.contains_key(h),
        namespaces: Some(namespaces),
        service_addresses: &|h| {
            if h == "istio-ingressgateway.istio-system.svc.domain.suffix" {
                vec!["1.2.3.4".to_string()]
            } else {
                Vec::new()
            }
        },
        service_ports: &|h| services.get(h).cloned(),
        config_maps: Some(&config_maps),
    })
}

fn internal_annotations(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    map.iter()
        .filter(|(k, _)| k.starts_with("internal.istio.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `Kind/ns/name` -> (annotations, spec) of the golden's Istio objects.
fn golden_config(text: &str) -> BTreeMap<String, (BTreeMap<String, String>, Value)> {
    documents(text)
        .into_iter()
        .filter_map(|doc| {
            let kind = Kind::from_group_kind("networking.istio.io", doc["kind"].as_str()?)?;
            let spec = Spec::from_value(kind, &doc["spec"]).expect("golden spec decodes");
            let annotations: BTreeMap<String, String> =
                serde_json::from_value(doc["metadata"]["annotations"].clone()).unwrap_or_default();
            let key = format!(
                "{}/{}/{}",
                kind.as_str(),
                doc["metadata"]["namespace"].as_str().unwrap_or_default(),
                doc["metadata"]["name"].as_str().unwrap_or_default()
            );
            Some((
                key,
                (
                    internal_annotations(&annotations),
                    serde_json::to_value(&spec).unwrap(),
                ),
            ))
        })
        .collect()
}

/// A route status with other controllers' `parents` entries reduced to their keys
/// (`controllerName`, `parentRef`): Istio's goldens list them so, as its server-side
/// apply sends them (the API server keeps the owners' fields); meshfed's status writer
/// replaces the status and keeps them whole.
fn others_by_key(mut status: Value) -> Value {
    if let Some(parents) = status.get_mut("parents").and_then(Value::as_array_mut) {
        for p in parents {
            if p["controllerName"] != "istio.io/gateway-controller" {
                *p = serde_json::json!({"controllerName": p["controllerName"], "parentRef": p["parentRef"]});
            }
        }
    }
    status
}

fn without_times(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.remove("lastTransitionTime");
            m.remove("observedGeneration");
            for (_, x) in m.iter_mut() {
                *x = without_times(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_times(x.take());
            }
        }
        _ => {}
    }
    v
}

/// A golden written before Istio's current object names
/// (`<gateway>-istio-autogenerated-k8s-gateway-<listener>`,
/// `<route>-tcp-<n>-istio-autogenerated-k8s-gateway`) with those names spelled the
/// current way (`<gateway>~istio-autogenerated-k8s-gateway~<listener>`,
/// `<route>~tcp~<n>~istio-autogenerated-k8s-gateway`), so its objects are compared
/// with meshfed's by content. Goldens older still (one VirtualService per route, the
/// singular `internal.istio.io/parent` annotation) are left as they are.
fn current_names(golden: &str, objects: &[Arc<ConfigObject>]) -> String {
    if golden.contains("internal.istio.io/parent:") {
        return golden.to_string();
    }
    let mut renames: Vec<(String, String)> = Vec::new();
    for o in objects {
        if let Some(gw) = o
            .spec
            .get::<meshfed_registry::config::gateway_api::GatewaySpec>()
        {
            for l in &gw.listeners {
                renames.push((
                    format!("{}-istio-autogenerated-k8s-gateway-{}", o.name, l.name),
                    format!("{}~istio-autogenerated-k8s-gateway~{}", o.name, l.name),
                ));
            }
        }
        for tag in ["tcp", "tls"] {
            for n in 0..8 {
                renames.push((
                    format!("{}-{tag}-{n}-istio-autogenerated-k8s-gateway", o.name),
                    format!("{}~{tag}~{n}~istio-autogenerated-k8s-gateway", o.name),
                ));
            }
        }
    }
    // Longest first, so a listener whose name extends another's is renamed whole.
    renames.sort_by_key(|(old, _)| std::cmp::Reverse(old.len()));
    let mut text = golden.to_string();
    for (old, new) in renames {
        text = text.replace(&old, &new);
    }
    text
}

/// One compared object: its key and whether it matched (with the difference).
pub struct Compared {
    pub key: String,
    pub result: Result<(), String>,
}

/// Compares a case's translation with its goldens.
pub fn compare_case(case: &str) -> Vec<Compared> {
    let input = data(&format!("{case}.yaml")).expect("input");
    let objects = load(&input);
    let output = translate(&objects, &namespaces(&input), &input);
    let mut out = Vec::new();
    let ours: BTreeMap<String, &ConfigObject> = output
        .objects
        .iter()
        .map(|o| (format!("{}/{}/{}", o.kind.as_str(), o.namespace, o.name), o))
        .collect();
    let golden_text = match STATUS_ONLY.iter().find(|(c, _)| *c == case) {
        Some(_) => String::new(),
        None => data(&format!("{case}.yaml.golden")).expect("golden"),
    };
    let golden = golden_config(&current_names(&golden_text, &objects));
    for (key, (annotations, spec)) in &golden {
        let result = match ours.get(key) {
            None => Err("not generated".to_string()),
            Some(o) => {
                let mine = serde_json::to_value(&o.spec).unwrap();
                let mine_annotations = internal_annotations(&o.annotations);
                if mine != *spec {
                    Err(format!("spec differs:\n golden {spec}\n ours   {mine}"))
                } else if mine_annotations != *annotations {
                    Err(format!(
                        "annotations differ:\n golden {annotations:?}\n ours   {mine_annotations:?}"
                    ))
                } else {
                    Ok(())
                }
            }
        };
        out.push(Compared {
            key: format!("{case}:config:{key}"),
            result,
        });
    }
    for key in ours.keys().filter(|k| !golden.contains_key(*k)) {
        out.push(Compared {
            key: format!("{case}:extra:{key}"),
            result: Err("not in the golden".to_string()),
        });
    }
    if let Some(status) = data(&format!("{case}.status.yaml.golden")) {
        // The status an input object already has (other controllers'), which the
        // status writer merges with the computed one as istiod does.
        let existing: BTreeMap<String, Value> = documents(&input)
            .into_iter()
            .filter(|d| d["status"].is_object())
            .map(|d| {
                let key = format!(
                    "{}/{}/{}",
                    d["kind"].as_str().unwrap_or_default(),
                    d["metadata"]["namespace"].as_str().unwrap_or_default(),
                    d["metadata"]["name"].as_str().unwrap_or_default()
                );
                (key, d["status"].clone())
            })
            .collect();
        let mine: BTreeMap<String, Value> = output
            .status
            .iter()
            .map(|s| {
                let ns = if s.kind == Kind::GatewayClass {
                    ""
                } else {
                    s.namespace.as_str()
                };
                let key = format!("{}/{ns}/{}", s.kind.as_str(), s.name);
                let status = match existing.get(&key) {
                    Some(current) => without_times(
                        meshfed_kube::status::merged_gateway_status(
                            Some(current),
                            &s.status,
                            None,
                            "istio.io/gateway-controller",
                            "fake",
                        )
                        .unwrap_or_else(|| current.clone()),
                    ),
                    None => s.status.clone(),
                };
                (key, status)
            })
            .collect();
        for doc in documents(&status) {
            // GatewayClasses are cluster-scoped (some goldens name a namespace anyway).
            let kind = doc["kind"].as_str().unwrap_or_default();
            let ns = if kind == "GatewayClass" {
                ""
            } else {
                doc["metadata"]["namespace"].as_str().unwrap_or_default()
            };
            let key = format!(
                "{kind}/{ns}/{}",
                doc["metadata"]["name"].as_str().unwrap_or_default()
            );
            let want = others_by_key(without_times(doc["status"].clone()));
            let result = match mine.get(&key).cloned().map(others_by_key) {
                None => Err("no status computed".to_string()),
                Some(got) if got == want => Ok(()),
                Some(got) => Err(format!("status differs:\n golden {want}\n ours   {got}")),
            };
            out.push(Compared {
                key: format!("{case}:status:{key}"),
                result,
            });
        }
    }
    out
}

#[test]
fn istio_golden_conversions_pass_or_are_known_gaps() {
    let gaps: BTreeMap<&str, &str> = GAPS.iter().copied().collect();
    let mut failures = Vec::new();
    let mut seen = BTreeSet::new();
    let (mut total, mut passed) = (0, 0);
    let mut cases_passing = 0;
    for case in CASES {
        let compared = compare_case(case);
        let mut case_ok = true;
        for c in compared {
            seen.insert(c.key.clone());
            let extra = c.key.contains(":extra:");
            if !extra {
                total += 1;
            }
            match (&c.result, gaps.get(c.key.as_str())) {
                (Ok(()), None) => passed += usize::from(!extra),
                (Ok(()), Some(reason)) => failures.push(format!(
                    "{}: passes now, remove it from GAPS ({reason})",
                    c.key
                )),
                (Err(e), None) => {
                    case_ok = false;
                    failures.push(format!("{}: {e}", c.key));
                }
                (Err(_), Some(_)) => case_ok = false,
            }
        }
        cases_passing += usize::from(case_ok);
    }
    for (case, _) in NOT_PORTED.iter().filter(|(c, _)| CASES.contains(c)) {
        failures.push(format!("{case}: both ported and listed in NOT_PORTED"));
    }
    for key in gaps.keys().filter(|k| !seen.contains(**k)) {
        failures.push(format!("{key}: listed in GAPS but not compared"));
    }
    eprintln!(
        "Istio gateway goldens: {} cases ported, {cases_passing} pass whole; {total} golden objects and statuses, {passed} match; {} cases not ported",
        CASES.len(),
        NOT_PORTED.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

const ATTACHES_TO_NOTHING: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: istio
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: shop.example.com
    tls: {certificateRefs: [{name: shop-cert, namespace: certs}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: apps}
spec:
  parentRefs: [{name: gw, namespace: infra}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: cross, namespace: infra}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  rules: [{backendRefs: [{name: api, namespace: apps, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: lost, namespace: apps}
spec:
  parentRefs: [{name: nowhere, namespace: infra}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
";

#[test]
fn validate_reports_routes_attached_to_nothing_and_refs_not_permitted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(&file, ATTACHES_TO_NOTHING).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        // The certificate in another namespace without a ReferenceGrant.
        "Gateway infra/gw: spec.listeners[0].tls.certificateRefs: ResolvedRefs RefNotPermitted: certificateRef shop-cert/certs not accessible to a Gateway in namespace \"infra\" (missing a ReferenceGrant?)",
        // Same namespace only (the default), and the route is in another.
        "HTTPRoute apps/web: spec.parentRefs[0]: Accepted NotAllowedByListeners",
        // No listener of that name; and a backend in another namespace.
        "HTTPRoute infra/cross: spec.parentRefs[0]: Accepted NoMatchingParent: sectionName \"http\" not found",
        "HTTPRoute infra/cross: spec.rules: ResolvedRefs RefNotPermitted: backendRef api/apps not accessible to a HTTPRoute in namespace \"infra\" (missing a ReferenceGrant?)",
        // A Gateway that is not there: no status (istiod writes none), but named.
        "HTTPRoute apps/lost: spec.parentRefs[0]: Gateway infra/nowhere: no Gateway of this controller's classes has that name",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// A Gateway asking for client certificate validation, which meshfed does not do.
const FRONTEND_VALIDATION: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: istio
  addresses: [{type: Hostname, value: ingress}]
  tls:
    frontend:
      default:
        validation:
          caCertificateRefs: [{group: '', kind: ConfigMap, name: client-ca}]
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    tls: {certificateRefs: [{name: cert}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: client-ca, namespace: infra}
data: {ca.crt: x}
";

#[test]
fn validate_reports_frontend_client_certificate_validation_as_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(&file, FRONTEND_VALIDATION).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let expected = "Gateway infra/gw: spec.tls.frontend: Accepted UnsupportedValue: spec.tls.frontend: client certificate validation of port 443 is not supported by meshfed; the listener is not served";
    assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
}

const CONFIG_MAPS_IN_FILES: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: gw-options, namespace: infra}
data: {replicas: \"2\"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-ca, namespace: apps}
data: {not-ca.crt: hello}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: istio
  infrastructure: {parametersRef: {group: '', kind: ConfigMap, name: gw-settings}}
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: web-tls, namespace: apps}
spec:
  targetRefs: [{group: '', kind: Service, name: web}]
  validation:
    caCertificateRefs: [{group: '', kind: ConfigMap, name: web-ca}]
    hostname: web.example.com
";

/// `kind: ConfigMap` objects among the files are what a Gateway's `parametersRef` and
/// a BackendTLSPolicy's CA reference are checked against.
#[test]
fn validate_checks_config_map_references_against_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(&file, CONFIG_MAPS_IN_FILES).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "Gateway infra/gw: spec.infrastructure.parametersRef: Accepted InvalidParameters: parametersRef ConfigMap infra/gw-settings does not exist",
        "BackendTLSPolicy apps/web-tls: spec.targetRefs[0]: Accepted Invalid: Certificate reference invalid: found secret, but didn't have expected keys cacert or ca.crt; found: not-ca.crt",
        "BackendTLSPolicy apps/web-tls: spec.validation.caCertificateRefs: ResolvedRefs InvalidCACertificateRef",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // The ConfigMaps are read, not reported as a kind meshfed does not read.
    assert!(!text.contains("ConfigMap infra/gw-options"), "{text}");
}

// === examples/gateway-api ===

use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route::Action, route_action};
use meshfed::testing::{AdsClient, FakeServer, ProxyConfig, node_with};

fn example() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gateway-api")
}

/// A route as the example test reads it: its name, its header matchers' names and its
/// clusters with their weights.
type RouteSummary = (String, Vec<String>, Vec<(String, u32)>);

/// The routes of the virtual hosts naming `domain`.
fn routes_for(configs: &[RouteConfiguration], domain: &str) -> Vec<RouteSummary> {
    configs
        .iter()
        .flat_map(|c| &c.virtual_hosts)
        .filter(|v| v.domains.iter().any(|d| d == domain))
        .flat_map(|v| &v.routes)
        .map(|r| {
            let prefix = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
                Some(envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier::Prefix(p)) => p.clone(),
                Some(envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier::PathSeparatedPrefix(p)) => p.clone(),
                other => format!("{other:?}"),
            };
            let headers = r.r#match.iter().flat_map(|m| &m.headers).map(|h| h.name.clone()).collect();
            let clusters = match &r.action {
                Some(Action::Route(a)) => match &a.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => vec![(c.clone(), 100)],
                    Some(route_action::ClusterSpecifier::WeightedClusters(w)) => w
                        .clusters
                        .iter()
                        .map(|c| (c.name.clone(), c.weight.map_or(0, |w| w.value)))
                        .collect(),
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            (prefix, headers, clusters)
        })
        .collect()
}

#[test]
fn the_gateway_api_example_validates_clean() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshfed"))
        .args(["validate", "-f"])
        .arg(example().join("config"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("7 valid object(s), 0 error(s)"), "{text}");
    assert!(!text.contains("warning"), "{text}");
}

/// The example served from its mock registry and config directory: the router behind
/// `shop-gateway-istio` gets the HTTPS listener with the other namespace's certificate,
/// the 90/10 split and the gRPC route; a sidecar calling reviews gets the mesh route.
#[tokio::test]
async fn the_gateway_api_example_routes_the_router_and_sidecars() {
    let root = example();
    let server = FakeServer::builder()
        .mock_registry_file(root.join("mock-registry.yaml"))
        .config_dir(root.join("config"))
        .start()
        .await
        .unwrap();
    ready_and_synced(&server).await;
    let configz = get_json(server.bound().http, "/debug/configz").await;
    assert_eq!(configz["rejected"], serde_json::json!([]), "{configz}");
    assert_eq!(
        configz["gatewayApi"]["problems"],
        serde_json::json!([]),
        "{configz}"
    );
    let generated: Vec<String> = configz["gatewayApi"]["generated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap(),
                o["namespace"].as_str().unwrap(),
                o["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        generated,
        [
            "Gateway infra/shop-gateway~istio-autogenerated-k8s-gateway~https",
            "Gateway infra/shop-gateway~istio-autogenerated-k8s-gateway~http",
            "VirtualService shop/infra~shop-gateway~istio-autogenerated-k8s-gateway~http~shop.example.com",
            "VirtualService shop/infra~shop-gateway~istio-autogenerated-k8s-gateway~https~grpc.example.com",
            "VirtualService shop/infra~shop-gateway~istio-autogenerated-k8s-gateway~https~shop.example.com",
            "VirtualService shop/shop~9080~reviews.shop.svc.cluster.local",
        ]
    );

    // The router (its address is the gateway Service's endpoint).
    let mut router = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "router~127.0.2.1~shop-gateway-istio-1.infra~infra.svc.cluster.local",
            serde_json::json!({}),
        ),
    )
    .await
    .unwrap();
    let ProxyConfig {
        listeners, routes, ..
    } = router.fetch_config().await.unwrap();
    let https = listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_8443")
        .expect("the HTTPS listener");
    let tls = format!("{:?}", https.filter_chains[0].transport_socket);
    assert!(tls.contains("tls"), "{tls}");
    let sds = https
        .filter_chains
        .iter()
        .filter_map(|c| c.transport_socket.as_ref())
        .filter_map(|t| match &t.config_type {
            Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(a)) => {
                <envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext as prost::Message>::decode(a.value.as_slice()).ok()
            }
            _ => None,
        })
        .flat_map(|c| c.common_tls_context.into_iter())
        .flat_map(|c| c.tls_certificate_sds_secret_configs.into_iter())
        .map(|s| s.name)
        .collect::<Vec<_>>();
    assert_eq!(sds, ["kubernetes-gateway://certs/shop-cert"]);
    let web = routes_for(&routes, "shop.example.com");
    let split = vec![
        (
            "outbound|8080||web-v1.shop.svc.cluster.local".to_string(),
            90,
        ),
        (
            "outbound|8080||web-v2.shop.svc.cluster.local".to_string(),
            10,
        ),
    ];
    // One route on each listener (HTTP and HTTPS), both split 90/10.
    assert_eq!(web.len(), 2, "{web:?}");
    assert!(
        web.iter()
            .all(|(prefix, _, clusters)| prefix == "/" && *clusters == split),
        "{web:?}"
    );
    let grpc = routes_for(&routes, "grpc.example.com");
    assert_eq!(
        grpc,
        [(
            "/shop.v1.Orders/".to_string(),
            vec![],
            vec![(
                "outbound|9090||orders.shop.svc.cluster.local".to_string(),
                100
            )]
        )]
    );

    // A sidecar calling reviews.
    let mut sidecar = AdsClient::connect(
        server.grpc_addr(),
        node_with(
            "sidecar~127.0.2.40~sleep-1.shop~shop.svc.cluster.local",
            serde_json::json!({"LABELS": {"app": "sleep"}}),
        ),
    )
    .await
    .unwrap();
    let ProxyConfig { routes, .. } = sidecar.fetch_config().await.unwrap();
    let reviews = routes_for(&routes, "reviews.shop.svc.cluster.local");
    assert_eq!(
        reviews
            .iter()
            .map(|(_, h, c)| (h.clone(), c.clone()))
            .collect::<Vec<_>>(),
        [
            (
                vec!["end-user".to_string()],
                vec![(
                    "outbound|9080||reviews-v2.shop.svc.cluster.local".to_string(),
                    100
                )]
            ),
            (
                vec![],
                vec![(
                    "outbound|9080||reviews.shop.svc.cluster.local".to_string(),
                    100
                )]
            ),
        ],
        "{reviews:?}"
    );
}
