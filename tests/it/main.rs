//! meshfed's integration tests: the whole control plane in-process, real sockets, real
//! ADS clients.

mod support;

mod admin;
mod analyze;
mod autoregistration;
mod cli;
mod config;
mod config_sources;
mod connections;
mod consul;
mod dashboard;
mod debug_xds;
mod delta;
mod deploy;
mod drain;
mod eureka;
mod federation;
mod gateway_simulation;
mod grpc_security;
mod headless;
mod hostile;
mod interop;
mod jwt;
mod kinds;
mod kube;
mod kube_instances;
mod mcp;
mod mesh;
mod mock_file;
mod multicluster;
mod nacos;
mod nds;
mod pprof;
mod rbac;
mod replace_istiod;
mod sds;
mod secure;
mod serviceentry;
mod sidecar_simulation;
mod sotw;
mod split_horizon;
mod status;
mod telemetry;
mod vm_bridge;
mod webhook;
