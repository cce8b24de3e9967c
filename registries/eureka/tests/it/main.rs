//! The Eureka registry against the fake Eureka server: full fetch, deltas and the
//! reconcile hash code, outages, credentials, large catalogs.

mod bench;
mod fetch;
mod outage;
mod support;
