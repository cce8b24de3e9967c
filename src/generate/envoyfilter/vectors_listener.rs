//! Ported vectors; see `super::vectors`.

pub(super) fn all() -> Vec<(&'static str, String, Result<(), String>)> {
    Vec::new()
}
