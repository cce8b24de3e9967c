//! Translation to Istio config.
