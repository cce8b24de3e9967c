//! The mock registry fed from a watched YAML file: services and endpoints for demos,
//! laptops and tests, without Kubernetes or Consul.
//!
//! # File format
//!
//! ```yaml
//! services:
//! - hostname: echo.default.svc.cluster.local   # required
//!   namespace: default        # optional, default "default"
//!   ports:                    # required (may be empty); names must be unique, numbers too
//!   - {name: grpc, port: 7070, protocol: GRPC}   # protocol optional (absent = sniffed)
//!   addresses: [10.96.0.10]   # optional: the VIP(s) of the service in this registry's cluster
//!   resolution: STATIC        # optional: STATIC (EDS, default) | DNS | DNS_ROUND_ROBIN | NONE (passthrough)
//!   location: MESH_INTERNAL   # optional: MESH_INTERNAL (default) | MESH_EXTERNAL
//!   labels: {app: echo}       # optional
//!   exportTo: ["*"]           # optional: namespaces that may see the service
//!   serviceAccounts: [spiffe://cluster.local/ns/default/sa/echo]   # optional
//!   endpoints:                # optional
//!   - address: 127.0.0.1      # required: an IPv4 or IPv6 address
//!     ports: {grpc: 17070}    # optional: service port name -> target port
//!     labels: {version: v1}   # optional
//!     locality: r1/z1         # optional: region/zone/subzone
//!     network: n1             # optional
//!     weight: 1               # optional, default 1
//!     health: HEALTHY         # optional: HEALTHY (default) | UNHEALTHY | DRAINING | TERMINATING
//!     tlsMode: istio          # optional: disabled | istio; absent: the label below
//!     serviceAccount: spiffe://cluster.local/ns/default/sa/echo   # optional
//! ```
//!
//! - An endpoint's TLS mode is its `tlsMode` field when given; otherwise, as Istio reads
//!   pods and WorkloadEntries, the `security.istio.io/tlsMode` label in its `labels`
//!   (`istio` means istio, any other value or no label means disabled). The explicit
//!   field wins over the label.
//! - An endpoint without `ports` (or with `ports: {}`) serves every service port on the
//!   port's own number.
//! - An empty file, a file of comments, `services:` and `services: []` are all a valid,
//!   empty registry.
//! - The same document may be written as JSON (`{"services": [...]}`), which reads
//!   several times faster than YAML: a file whose first character (after whitespace)
//!   is `{` is parsed as JSON, with the same fields and checks.
//! - Field names are exact (camelCase); an unknown field is an error, so typos do not
//!   pass silently. Port numbers are 1..=65535, protocols are Istio's names (any case:
//!   GRPC, GRPC-Web, HTTP, HTTP_PROXY, HTTP2, HTTPS, TCP, TLS, UDP, Mongo, Redis, MySQL),
//!   addresses are IPs, endpoint port names must name a port of their service, and a
//!   hostname appears at most once per namespace.
//! - Every error names the file, the line and the service and field at fault, e.g.
//!   `mock.yaml:7: services[0] (echo.default.svc.cluster.local): endpoints[1] (127.0.0.2):
//!   port "grpcx" is not a port of the service (its ports: grpc)`.
//! - Every service gets the fixed creation time `UNIX_EPOCH`, so reloading the same file
//!   gives the same merged view. Provider and cluster are set by the registry; VIPs
//!   (`addresses`) are filed under the empty cluster id, which
//!   [`MemoryRegistry::replace_all`](crate::memory::MemoryRegistry::replace_all) moves to the registry's cluster.
//!
//! # Reloading
//!
//! [`run_mock_file`] loads the file, marks the registry synced and then follows every
//! change to the file (see [`crate::watch`]). The file is read under the rules of
//! [`crate::read`]: a regular file only, within a size limit, and only content that
//! did not change while it was read counts. Content that fails to parse is logged
//! with its file:line and the last good content stays in force; a deleted file also
//! keeps the last good content; a failed read is retried with backoff. A file emptied
//! while the registry holds services withdraws them only once it has stayed empty for
//! a settle period ([`DEFAULT_EMPTY_SETTLE`]). [`MockFileStatus`] counts loads,
//! retries and withdrawals for metrics.

mod format;
mod reload;

pub use format::{MockFileError, load_mock_registry, parse_mock_registry};
pub use reload::{DEFAULT_EMPTY_SETTLE, MockFileOptions, MockFileStatus, run_mock_file};
