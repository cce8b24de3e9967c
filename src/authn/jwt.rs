//! Third-party JWTs (Istio's `JWT_RULE`): placeholder, filled in by the JWT work.
