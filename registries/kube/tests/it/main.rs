//! The Kubernetes registry against a fake API server over real sockets.

mod crd;
mod model;
mod resilience;
mod security;
mod support;
