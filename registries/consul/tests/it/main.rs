//! The Consul registry against the fake Consul HTTP API: catalog and health changes,
//! blocking-query index handling, outages, tokens.

mod blocking;
mod catalog;
mod health;
mod outage;
mod support;
