//! Status.
