//! The config kinds meshfed reads, each declared once.
//!
//! One entry of [`declare_kinds!`] below is everything meshfed knows of a kind: its
//! API group (and so its versions), its Kubernetes kind and plural names, its spec
//! type (generated from `proto/istio`), its validator, what it feeds (the config
//! index, the service registry, or nothing yet) and which resource types read it.
//! From the table come [`Kind`], [`Spec`] (with decoding, serialization and
//! validation dispatch), the mapping of [`ConfigKind`] (the push vocabulary, which names a variant per kind) back to kinds and
//! [`KindInfo`]. The config directory and `meshfed validate` ([`crate::config::decode()`]),
//! the Kubernetes CRD store and its discovery and the fake API server (`plural`,
//! [`KindInfo::group`]), the config index ([`Feeds`]) and `xds::deps` ([`Readers`]) all
//! read it from here.
//!
//! Objects of kinds that are not declared here are not dropped in silence: the file
//! sources report them as ignored (see [`crate::config::ignored`]).

use meshfed_api::extensions::v1alpha1 as ext;
use meshfed_api::networking::v1alpha3 as net;
use meshfed_api::security::v1beta1 as sec;
use meshfed_api::telemetry::v1alpha1 as tel;
use serde::Serialize;
use serde_json::Value;

use crate::config::gateway_api::{self as gw, validate as gwv};
use crate::config::spec_json::decode_spec;
use crate::config::validate::{self as v, FieldError, Validation, Warning};
use crate::events::ConfigKind;

/// An API group and the versions of it that are read (one schema), preferred first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// `networking.istio.io`.
    pub name: &'static str,
    /// `v1`, `v1beta1`, ...: preferred first.
    pub versions: &'static [&'static str],
    /// `<name>/<preferred version>`, written when an object is serialized.
    pub api_version: &'static str,
}

/// `networking.istio.io`, versions `v1`, `v1beta1`, `v1alpha3`.
pub const NETWORKING: Group = Group {
    name: "networking.istio.io",
    versions: &["v1", "v1beta1", "v1alpha3"],
    api_version: "networking.istio.io/v1",
};

/// `security.istio.io`, versions `v1`, `v1beta1`.
pub const SECURITY: Group = Group {
    name: "security.istio.io",
    versions: &["v1", "v1beta1"],
    api_version: "security.istio.io/v1",
};

/// `telemetry.istio.io`, versions `v1`, `v1alpha1`.
pub const TELEMETRY: Group = Group {
    name: "telemetry.istio.io",
    versions: &["v1", "v1alpha1"],
    api_version: "telemetry.istio.io/v1",
};

/// `networking.istio.io` version `v1alpha3` only: the kinds Istio serves in no
/// other version (`EnvoyFilter`). Discovery finds them through [`NETWORKING`],
/// whose versions include `v1alpha3`.
pub const NETWORKING_V1ALPHA3: Group = Group {
    name: "networking.istio.io",
    versions: &["v1alpha3"],
    api_version: "networking.istio.io/v1alpha3",
};

/// `extensions.istio.io`, version `v1alpha1`.
pub const EXTENSIONS: Group = Group {
    name: "extensions.istio.io",
    versions: &["v1alpha1"],
    api_version: "extensions.istio.io/v1alpha1",
};

/// `gateway.networking.k8s.io`, versions `v1`, `v1beta1`, `v1alpha2`: the Kubernetes
/// Gateway API's standard kinds (one schema; `v1alpha2` is read for old objects).
pub const GATEWAY_API: Group = Group {
    name: "gateway.networking.k8s.io",
    versions: &["v1", "v1beta1", "v1alpha2"],
    api_version: "gateway.networking.k8s.io/v1",
};

/// `gateway.networking.k8s.io`, versions `v1alpha2`, `v1alpha3`: the Gateway API's
/// experimental kinds (TCPRoute, TLSRoute).
pub const GATEWAY_API_ALPHA: Group = Group {
    name: "gateway.networking.k8s.io",
    versions: &["v1alpha2", "v1alpha3"],
    api_version: "gateway.networking.k8s.io/v1alpha2",
};

/// `gateway.networking.k8s.io`, versions `v1`, `v1alpha3`: BackendTLSPolicy (GA in
/// `v1`; `v1alpha3` is read on clusters with the older CRD).
pub const GATEWAY_API_POLICY: Group = Group {
    name: "gateway.networking.k8s.io",
    versions: &["v1", "v1alpha3"],
    api_version: "gateway.networking.k8s.io/v1",
};

/// Every group some kind belongs to, in discovery order.
pub const GROUPS: [Group; 7] = [
    NETWORKING,
    SECURITY,
    TELEMETRY,
    EXTENSIONS,
    GATEWAY_API,
    GATEWAY_API_ALPHA,
    GATEWAY_API_POLICY,
];

/// How a spec type is read and written besides its serde form: the Istio kinds are
/// protos; the Gateway API kinds are plain serde types that travel over MCP as a
/// `google.protobuf.Struct` (as istiod sends kinds that are not protos).
pub trait SpecType: Sized + Serialize {
    /// The full name of the message the spec travels as on the wire.
    fn message_name() -> String;
    /// Reads the spec from its JSON form, strictly; errors name the field.
    fn from_json(value: &Value) -> Result<Self, Vec<FieldError>>;
    /// Reads the spec from its wire form.
    fn decode_proto(bytes: &[u8]) -> Result<Self, prost::DecodeError>;
    /// The spec in its wire form.
    fn encode_proto(&self) -> Vec<u8>;
    /// Warnings for the fields set that meshfed does not act on.
    fn unsupported_fields(&self) -> Vec<Warning>;
}

impl<T> SpecType for T
where
    T: prost::Name + prost::Message + Default + serde::de::DeserializeOwned + Serialize,
{
    fn message_name() -> String {
        T::full_name()
    }

    fn from_json(value: &Value) -> Result<Self, Vec<FieldError>> {
        decode_spec(value)
    }

    fn decode_proto(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        T::decode(bytes)
    }

    fn encode_proto(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    fn unsupported_fields(&self) -> Vec<Warning> {
        crate::config::spec_json::unsupported_fields(&T::full_name(), self)
    }
}

/// The Gateway API specs are serde types, not protos: on the wire they are a
/// `google.protobuf.Struct` (as istiod sends kinds that are not protos).
/// The name of the message the Gateway API specs travel as.
const STRUCT: &str = "google.protobuf.Struct";

macro_rules! struct_specs {
    ($($t:ty),* $(,)?) => {$(
        impl SpecType for $t {
            fn message_name() -> String {
                STRUCT.to_string()
            }

            fn from_json(value: &Value) -> Result<Self, Vec<FieldError>> {
                crate::config::spec_json::decode_typed(value).map_err(|e| vec![e])
            }

            // A Struct that decodes but is not a valid spec is reported as a decode
            // error, the only error the wire path carries.
            #[allow(deprecated)]
            fn decode_proto(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
                let body = <pbjson_types::Struct as prost::Message>::decode(bytes)?;
                let value = serde_json::to_value(&body)
                    .map_err(|e| prost::DecodeError::new(e.to_string()))?;
                serde_json::from_value(value).map_err(|e| prost::DecodeError::new(e.to_string()))
            }

            fn encode_proto(&self) -> Vec<u8> {
                let body = serde_json::to_value(self)
                    .ok()
                    .and_then(|v| serde_json::from_value::<pbjson_types::Struct>(v).ok())
                    .unwrap_or_default();
                prost::Message::encode_to_vec(&body)
            }

            fn unsupported_fields(&self) -> Vec<Warning> {
                Vec::new()
            }
        }
    )*};
}

struct_specs!(
    gw::GatewayClassSpec,
    gw::GatewaySpec,
    gw::HttpRouteSpec,
    gw::GrpcRouteSpec,
    gw::ReferenceGrantSpec,
    gw::TcpRouteSpec,
    gw::TlsRouteSpec,
    gw::BackendTlsPolicySpec,
);

/// The kind name of a declaration: its own name when given, else the variant's.
macro_rules! kind_name {
    ($variant:ident) => {
        stringify!($variant)
    };
    ($variant:ident $name:literal) => {
        $name
    };
}

/// What a kind's objects feed on the serving side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Feeds {
    /// The snapshot's config index (the server's `push::config_index::ConfigSet`);
    /// changes push as config.
    ConfigIndex,
    /// The ServiceEntry registry, which pushes the services they change; changes are
    /// not pushed as config.
    ServiceRegistry,
    /// Nothing yet: objects are read, validated and listed (`/debug/configz`) but no
    /// resource depends on them, so their changes push nothing.
    Nothing,
}

/// A family of xDS resources, named here without knowing xDS (`xds::deps` maps each
/// resource type onto one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    Clusters,
    Endpoints,
    Listeners,
    Routes,
    /// The DNS name table (NDS).
    NameTable,
    /// Gateway credentials (SDS).
    Secrets,
    /// Extension configs (ECDS): the WasmPlugins' filters.
    ExtensionConfigs,
}

impl Reader {
    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which resource families may read a kind's objects: for every proxy, and (no more
/// than that) for sidecars. Conservative: a family is left out only where no
/// generator of it reads the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readers {
    all: u8,
    sidecars: u8,
}

impl Readers {
    /// Read by nothing.
    pub const NONE: Readers = Readers {
        all: 0,
        sidecars: 0,
    };

    /// Every family but Secrets (gateway credentials read Secrets and Gateways only).
    pub const DEFAULT: Readers = Readers::NONE
        .with(Reader::Clusters)
        .with(Reader::Endpoints)
        .with(Reader::Listeners)
        .with(Reader::Routes)
        .with(Reader::NameTable);

    /// These readers and `reader`.
    pub const fn with(self, reader: Reader) -> Readers {
        Readers {
            all: self.all | reader.bit(),
            sidecars: self.sidecars | reader.bit(),
        }
    }

    /// These readers but `reader`.
    pub const fn without(self, reader: Reader) -> Readers {
        Readers {
            all: self.all & !reader.bit(),
            sidecars: self.sidecars & !reader.bit(),
        }
    }

    /// These readers, of which sidecars only `only`.
    pub const fn sidecars_only(self, only: &[Reader]) -> Readers {
        let mut sidecars = 0;
        let mut i = 0;
        while i < only.len() {
            sidecars |= only[i].bit();
            i += 1;
        }
        Readers {
            all: self.all,
            sidecars: self.sidecars & sidecars,
        }
    }

    /// Whether `reader` reads the kind for a sidecar (`sidecar`) or any other proxy.
    pub const fn reads(self, sidecar: bool, reader: Reader) -> bool {
        let set = if sidecar { self.sidecars } else { self.all };
        set & reader.bit() != 0
    }
}

/// Everything declared about one kind.
#[derive(Clone, Copy, Debug)]
pub struct KindInfo {
    /// The Kubernetes kind name (`VirtualService`).
    pub kind: &'static str,
    /// A name unique among the kinds (the [`Kind`] variant's: `KubernetesGateway` for
    /// the Gateway API's `Gateway`), for metric labels.
    pub label: &'static str,
    /// Its API group and versions.
    pub group: Group,
    /// The plural resource name (`virtualservices`): the CRD's collection.
    pub plural: &'static str,
    /// The push key kind of its objects.
    pub config_kind: ConfigKind,
    /// What its objects feed.
    pub feeds: Feeds,
    /// Which resource families read it.
    pub readers: Readers,
}

/// A spec type of a declared kind.
pub trait KindSpec: Sized {
    /// Its kind.
    const KIND: Kind;

    /// The spec, if `spec` is of this kind.
    fn of(spec: &Spec) -> Option<&Self>;
}

/// Declares the kinds; see the module doc. Each entry: the kind's name (also its
/// [`Kind`], [`Spec`] and [`ConfigKind`] variant), then its spec type, group, plural,
/// validator (`fn(namespace, &spec) -> Validation`), what it feeds and its readers.
macro_rules! declare_kinds {
    (
        kinds {
            $(
                $(#[$doc:meta])*
                $variant:ident $(as $name:literal)? {
                    spec: $spec:ty,
                    group: $group:expr,
                    plural: $plural:literal,
                    validate: $validate:expr,
                    feeds: $feeds:expr,
                    readers: $readers:expr $(,)?
                }
            ),* $(,)?
        }
    ) => {
        /// The config kinds meshfed reads. The order is the order of
        /// [`ConfigStore::all`] (kind, then namespace, then name).
        ///
        /// [`ConfigStore::all`]: crate::config::ConfigStore::all
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
        pub enum Kind {
            $( $(#[$doc])* $variant, )*
        }

        const COUNT: usize = [$(stringify!($variant)),*].len();

        const KINDS: [KindInfo; COUNT] = [$(
            KindInfo {
                kind: kind_name!($variant $($name)?),
                label: stringify!($variant),
                group: $group,
                plural: $plural,
                config_kind: ConfigKind::$variant,
                feeds: $feeds,
                readers: $readers,
            }
        ),*];

        impl Kind {
            /// Every kind, in order.
            pub const ALL: [Kind; COUNT] = [$(Kind::$variant),*];

            /// The full name of the spec's proto message
            /// (`istio.networking.v1alpha3.VirtualService`).
            pub fn message_name(self) -> String {
                match self {
                    $( Kind::$variant => <$spec as SpecType>::message_name(), )*
                }
            }
        }

        impl ConfigKind {
            /// The config kind this key kind names objects of, if any.
            pub const fn object_kind(self) -> Option<Kind> {
                match self {
                    $( ConfigKind::$variant => Some(Kind::$variant), )*
                    _ => None,
                }
            }
        }

        /// The typed spec of a config object.
        // Specs live behind `Arc` in the stores; boxing the large variants would only
        // add an indirection to every read.
        #[allow(clippy::large_enum_variant)]
        #[derive(Clone, Debug, PartialEq)]
        pub enum Spec {
            $( $variant($spec), )*
        }

        impl Spec {
            /// The kind this spec belongs to.
            pub fn kind(&self) -> Kind {
                match self {
                    $( Spec::$variant(_) => Kind::$variant, )*
                }
            }

            /// Reads the spec of a `kind` object from its proto3 JSON form, strictly
            /// (an unknown field is an error; see [`crate::config::spec_json`]). A
            /// missing or null spec is the empty message. Errors name the field
            /// (`spec.http[0].timeout`, `spec.trafficPolcy`).
            pub fn from_value(kind: Kind, value: &Value) -> Result<Spec, Vec<FieldError>> {
                let empty = Value::Object(serde_json::Map::new());
                let value = if value.is_null() { &empty } else { value };
                Ok(match kind {
                    $( Kind::$variant => Spec::$variant(<$spec as SpecType>::from_json(value)?), )*
                })
            }

            /// Reads the spec of a `kind` object from its protobuf wire form (the
            /// body of an MCP `Resource`).
            pub fn decode_proto(kind: Kind, bytes: &[u8]) -> Result<Spec, prost::DecodeError> {
                Ok(match kind {
                    $( Kind::$variant => Spec::$variant(<$spec as SpecType>::decode_proto(bytes)?), )*
                })
            }

            /// The spec in its wire form (the body of an MCP `Resource`).
            pub fn encode_proto(&self) -> Vec<u8> {
                match self {
                    $( Spec::$variant(spec) => SpecType::encode_proto(spec), )*
                }
            }

            /// Validates the spec with the rules of its kind; `namespace` is the
            /// object's.
            pub(crate) fn validate_spec(&self, namespace: &str) -> Validation {
                match self {
                    $( Spec::$variant(spec) => {
                        let validate: fn(&str, &$spec) -> Validation = $validate;
                        validate(namespace, spec)
                    } )*
                }
            }

            /// Warnings for the fields of Istio's API set in the spec that meshfed
            /// does not act on ([`crate::config::spec_json::NOT_ACTED_ON`]).
            pub fn unsupported_fields(&self) -> Vec<crate::config::validate::Warning> {
                match self {
                    $( Spec::$variant(spec) => SpecType::unsupported_fields(spec), )*
                }
            }
        }

        impl Serialize for Spec {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self {
                    $( Spec::$variant(v) => v.serialize(s), )*
                }
            }
        }

        $(
            impl From<$spec> for Spec {
                fn from(spec: $spec) -> Spec {
                    Spec::$variant(spec)
                }
            }

            impl KindSpec for $spec {
                const KIND: Kind = Kind::$variant;

                fn of(spec: &Spec) -> Option<&Self> {
                    match spec {
                        Spec::$variant(s) => Some(s),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
            }
        )*
    };
}

declare_kinds! {
    kinds {
        /// Routing rules for hosts (sidecars and gateways).
        VirtualService {
            spec: net::VirtualService,
            group: NETWORKING,
            plural: "virtualservices",
            validate: |ns, s| v::validate_virtual_service(ns, s),
            feeds: Feeds::ConfigIndex,
            // Sidecars' clusters and endpoints never look at VirtualServices; the
            // name table does not either (as Istio's `ndsNeedsPush`).
            readers: Readers::DEFAULT
                .without(Reader::NameTable)
                .sidecars_only(&[Reader::Listeners, Reader::Routes]),
        },
        /// Traffic policy for a host.
        DestinationRule {
            spec: net::DestinationRule,
            group: NETWORKING,
            plural: "destinationrules",
            validate: |ns, s| v::validate_destination_rule(ns, s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::DEFAULT.without(Reader::NameTable),
        },
        /// The servers of a gateway proxy.
        Gateway {
            spec: net::Gateway,
            group: NETWORKING,
            plural: "gateways",
            validate: |_, s| v::validate_gateway(s),
            feeds: Feeds::ConfigIndex,
            // Gateways authorize `kubernetes-gateway://` credential names (SDS).
            readers: Readers::DEFAULT
                .without(Reader::NameTable)
                .with(Reader::Secrets),
        },
        /// A ServiceEntry object; as a push key, also "a service (from any registry)
        /// changed": clusters and listeners may change.
        ServiceEntry {
            spec: net::ServiceEntry,
            group: NETWORKING,
            plural: "serviceentries",
            validate: |ns, s| v::validate_service_entry(ns, s),
            feeds: Feeds::ServiceRegistry,
            readers: Readers::DEFAULT,
        },
        /// A workload outside Kubernetes (a VM).
        WorkloadEntry {
            spec: net::WorkloadEntry,
            group: NETWORKING,
            plural: "workloadentries",
            validate: |_, s| v::validate_workload_entry(s),
            feeds: Feeds::ServiceRegistry,
            // Its addresses reach the name table as service endpoint changes.
            readers: Readers::DEFAULT.without(Reader::NameTable),
        },
        /// The scope of sidecars' config.
        Sidecar {
            spec: net::Sidecar,
            group: NETWORKING,
            plural: "sidecars",
            validate: |ns, s| v::validate_sidecar(ns, s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::DEFAULT,
        },
        /// mTLS modes (PeerAuthentication reaches clusters through auto mTLS).
        PeerAuthentication {
            spec: sec::PeerAuthentication,
            group: SECURITY,
            plural: "peerauthentications",
            validate: |_, s| v::validate_peer_authentication(s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::DEFAULT,
        },
        /// JWT validation.
        RequestAuthentication {
            spec: sec::RequestAuthentication,
            group: SECURITY,
            plural: "requestauthentications",
            validate: |_, s| v::validate_request_authentication(s),
            feeds: Feeds::ConfigIndex,
            // As Istio (`skippedCdsConfigs`, `skippedEdsConfigs`): listeners and
            // routes only, never clusters or endpoints.
            readers: Readers::DEFAULT
                .without(Reader::Clusters)
                .without(Reader::Endpoints),
        },
        /// Access control.
        AuthorizationPolicy {
            spec: sec::AuthorizationPolicy,
            group: SECURITY,
            plural: "authorizationpolicies",
            validate: |_, s| v::validate_authorization_policy(s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::DEFAULT
                .without(Reader::Clusters)
                .without(Reader::Endpoints),
        },
        /// The template and readiness probe of workloads that register themselves
        /// (VMs): read by the WorkloadEntry controller when a proxy connects with
        /// `AUTO_REGISTER_GROUP` (`meshfed::autoregistration`); pushes nothing.
        WorkloadGroup {
            spec: net::WorkloadGroup,
            group: NETWORKING,
            plural: "workloadgroups",
            validate: |_, s| v::service_entry::validate_workload_group(s),
            feeds: Feeds::Nothing,
            readers: Readers::NONE,
        },
        /// Metrics, access logging and tracing of workloads: read by the connection
        /// managers and TCP proxies of listeners only.
        Telemetry {
            spec: tel::Telemetry,
            group: TELEMETRY,
            plural: "telemetries",
            validate: |_, s| v::validate_telemetry(s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::NONE.with(Reader::Listeners),
        },
        /// A class of Gateway API Gateways and the controller that serves it.
        GatewayClass {
            spec: gw::GatewayClassSpec,
            group: GATEWAY_API,
            plural: "gatewayclasses",
            validate: |_, s| gwv::validate_gateway_class(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// A Gateway API Gateway: translated to Istio Gateways
        /// ([`crate::config::gateway_api::convert`]).
        KubernetesGateway as "Gateway" {
            spec: gw::GatewaySpec,
            group: GATEWAY_API,
            plural: "gateways",
            validate: |_, s| gwv::validate_gateway(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// HTTP routes of Gateway API Gateways or of Services (mesh).
        HTTPRoute {
            spec: gw::HttpRouteSpec,
            group: GATEWAY_API,
            plural: "httproutes",
            validate: |_, s| gwv::validate_http_route(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// gRPC routes of Gateway API Gateways or of Services (mesh).
        GRPCRoute {
            spec: gw::GrpcRouteSpec,
            group: GATEWAY_API,
            plural: "grpcroutes",
            validate: |_, s| gwv::validate_grpc_route(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// Who may refer to objects of another namespace.
        ReferenceGrant {
            spec: gw::ReferenceGrantSpec,
            group: GATEWAY_API,
            plural: "referencegrants",
            validate: |_, s| gwv::validate_reference_grant(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// TCP routes of Gateway API Gateways.
        TCPRoute {
            spec: gw::TcpRouteSpec,
            group: GATEWAY_API_ALPHA,
            plural: "tcproutes",
            validate: |_, s| gwv::validate_tcp_route(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// TLS (SNI) routes of Gateway API Gateways.
        TLSRoute {
            spec: gw::TlsRouteSpec,
            group: GATEWAY_API_ALPHA,
            plural: "tlsroutes",
            validate: |_, s| gwv::validate_tls_route(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// TLS to the Services and ServiceEntries it targets: translated to
        /// DestinationRules (`<service>~istio-autogenerated-k8s-gateway`).
        BackendTLSPolicy {
            spec: gw::BackendTlsPolicySpec,
            group: GATEWAY_API_POLICY,
            plural: "backendtlspolicies",
            validate: |_, s| gwv::validate_backend_tls_policy(s),
            feeds: Feeds::ConfigIndex,
            readers: GATEWAY_API_READERS,
        },
        /// Patches to the clusters, listeners and routes generated for the proxies it
        /// selects (`meshfed::generate::envoyfilter`).
        EnvoyFilter {
            spec: net::EnvoyFilter,
            group: NETWORKING_V1ALPHA3,
            plural: "envoyfilters",
            validate: |_, s| v::validate_envoy_filter(s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::NONE
                .with(Reader::Clusters)
                .with(Reader::Listeners)
                .with(Reader::Routes)
                .with(Reader::ExtensionConfigs),
        },
        /// A WebAssembly filter of the workloads it selects: served as an extension
        /// config (ECDS) that the listeners' filter lists reference by name.
        WasmPlugin {
            spec: ext::WasmPlugin,
            group: EXTENSIONS,
            plural: "wasmplugins",
            validate: |_, s| v::validate_wasm_plugin(s),
            feeds: Feeds::ConfigIndex,
            readers: Readers::NONE
                .with(Reader::Listeners)
                .with(Reader::ExtensionConfigs),
        },
    }
}

/// The Gateway API kinds become Istio Gateways and VirtualServices (which every
/// family but the name table reads) and authorize `kubernetes-gateway://` credential
/// names (SDS).
const GATEWAY_API_READERS: Readers = Readers::DEFAULT
    .without(Reader::NameTable)
    .with(Reader::Secrets);

impl Kind {
    /// Everything declared about the kind.
    pub const fn info(self) -> &'static KindInfo {
        &KINDS[self as usize]
    }

    /// The kind's API group.
    pub fn group(self) -> &'static str {
        self.info().group.name
    }

    /// The versions of the kind's group that are read, preferred first.
    pub fn versions(self) -> &'static [&'static str] {
        self.info().group.versions
    }

    /// `<group>/<preferred version>`, written when an object is serialized.
    pub fn api_version(self) -> &'static str {
        self.info().group.api_version
    }

    /// A `security.istio.io` kind.
    pub fn is_security(self) -> bool {
        self.info().group == SECURITY
    }

    /// The Kubernetes kind name (`VirtualService`).
    pub fn as_str(self) -> &'static str {
        self.info().kind
    }

    /// A name unique among the kinds, for metric labels (`KubernetesGateway` for the
    /// Gateway API's `Gateway`; the kind name otherwise).
    pub fn label(self) -> &'static str {
        self.info().label
    }

    /// The plural resource name (`virtualservices`).
    pub fn plural(self) -> &'static str {
        self.info().plural
    }

    /// The kind of a Kubernetes kind name (exact spelling). `Gateway` is Istio's; use
    /// [`Kind::from_group_kind`] where the group is known.
    pub fn from_name(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// The kind of a group and Kubernetes kind name (exact spelling).
    pub fn from_group_kind(group: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group() == group)
    }

    /// A `gateway.networking.k8s.io` kind.
    pub fn is_gateway_api(self) -> bool {
        self.group() == GATEWAY_API.name
    }

    /// The version named in MCP type URLs (`<group>/<version>/<kind>`): the one of the
    /// kind's proto package, or the preferred version for the kinds that are not protos.
    pub fn mcp_version(self) -> String {
        if self.is_gateway_api() {
            return self.versions()[0].to_string();
        }
        let message = self.message_name();
        message.rsplit('.').nth(1).unwrap_or_default().to_string()
    }

    /// The [`ConfigKind`] of push keys for objects of this kind.
    pub fn config_kind(self) -> ConfigKind {
        self.info().config_kind
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Spec {
    /// The spec as a `T`, if it is one.
    pub fn get<T: KindSpec>(&self) -> Option<&T> {
        T::of(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            let info = kind.info();
            assert_eq!(kind as usize, i);
            assert!(format!("{kind:?}").ends_with(info.kind), "{kind:?}");
            assert_eq!(info.label, format!("{kind:?}"));
            assert_eq!(Kind::from_group_kind(kind.group(), info.kind), Some(kind));
            assert_eq!(info.config_kind.object_kind(), Some(kind));
            assert_eq!(
                Kind::from_group_kind(info.group.name, info.kind),
                Some(kind)
            );
            // Discovery walks GROUPS: every kind's versions are among its group's.
            assert!(
                GROUPS.iter().any(|g| g.name == info.group.name
                    && info.group.versions.iter().all(|v| g.versions.contains(v))),
                "{kind}"
            );
            assert!(
                info.plural.chars().all(|c| c.is_ascii_lowercase()),
                "{kind}"
            );
            assert!(info.group.api_version.ends_with(info.group.versions[0]));
        }
        for other in [
            ConfigKind::Endpoints,
            ConfigKind::MeshConfig,
            ConfigKind::MeshNetworks,
            ConfigKind::Workload,
            ConfigKind::Secret,
        ] {
            assert_eq!(other.object_kind(), None);
        }
    }

    #[test]
    fn readers_narrow_sidecars_only_where_declared() {
        let vs = Kind::VirtualService.info().readers;
        assert!(vs.reads(false, Reader::Clusters) && !vs.reads(true, Reader::Clusters));
        assert!(vs.reads(true, Reader::Routes) && vs.reads(true, Reader::Listeners));
        assert!(!vs.reads(false, Reader::NameTable) && !vs.reads(false, Reader::Secrets));
        let gw = Kind::Gateway.info().readers;
        assert!(gw.reads(true, Reader::Secrets) && gw.reads(true, Reader::Clusters));
        assert!(!Readers::NONE.reads(false, Reader::Routes));
    }

    #[test]
    fn specs_are_found_by_type() {
        let spec = Spec::from(net::Gateway::default());
        assert!(spec.get::<net::Gateway>().is_some());
        assert!(spec.get::<net::Sidecar>().is_none());
        assert_eq!(<net::Gateway as KindSpec>::KIND, Kind::Gateway);
    }
}
