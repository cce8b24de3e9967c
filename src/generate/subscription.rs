//! What a connection asks of a type, and how much of it a push needs: the arguments of
//! generation (`generate::generate`), shared with the proxyless gRPC generator.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// What a connection subscribed to for one type.
#[derive(Clone, Copy, Debug)]
pub struct Subscription<'a> {
    /// Everything of the type (CDS/LDS with no names, or Delta `*`).
    pub wildcard: bool,
    /// Explicitly named resources.
    pub names: &'a BTreeSet<String>,
    /// `names` as the connection holds them, interned: connections subscribed to the
    /// same names hold the same set, so a whole answer can be shared by its identity
    /// (`None` where the names are not interned).
    pub interned: Option<&'a Arc<BTreeSet<String>>>,
}

/// How much of a type a push needs.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every subscribed resource.
    All,
    /// Only resources derived from these hostnames (incremental EDS).
    Hostnames(&'a HashSet<&'a str>),
    /// Only these names (incremental EDS through the watch index: the watched names
    /// of the changed hostnames).
    Names(&'a BTreeSet<String>),
}
