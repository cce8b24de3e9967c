//! The Eureka registry against the fake Eureka server.
