//! Kubernetes JWTs checked by a TokenReview: placeholder, filled in by the TokenReview work.
