//! The Kubernetes registry against a fake API server over real sockets.

mod crd;
mod model;
mod resilience;
mod root_cert;
mod security;
mod support;
