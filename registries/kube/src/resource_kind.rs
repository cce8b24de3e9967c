//! [`ResourceKind`]: the kinds of Kubernetes object a registry watches, shared by the
//! object store (`state`), the watchers (`writer`) and the counters (`registry`).

use std::fmt;

/// The kinds of object the registry watches.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum ResourceKind {
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Pod.
    Pod,
    /// `v1` Node.
    Node,
    /// `v1` Namespace.
    Namespace,
}

impl ResourceKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ResourceKind; 5] = [
        ResourceKind::Service,
        ResourceKind::EndpointSlice,
        ResourceKind::Pod,
        ResourceKind::Node,
        ResourceKind::Namespace,
    ];

    /// The Kubernetes kind name (also the `type` label of Istio's
    /// `pilot_k8s_reg_events`).
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Service => "Services",
            ResourceKind::EndpointSlice => "EndpointSlice",
            ResourceKind::Pod => "Pods",
            ResourceKind::Node => "Nodes",
            ResourceKind::Namespace => "Namespaces",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
