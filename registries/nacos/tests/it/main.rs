//! The Nacos registry against the fake Nacos server (gRPC with push, HTTP API), over
//! real sockets.

mod support;

mod auth;
mod discovery;
mod large;
mod outage;
