//! The read side every registry adapter offers the aggregate.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::model::{
    ClusterId, Endpoint, NetworkId, ProviderId, Service, ShardKey, WorkloadInstance,
};

/// A gateway through which endpoints of `network` are reached from other networks.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub struct NetworkGateway {
    /// The network behind the gateway.
    pub network: NetworkId,
    /// Cluster the gateway belongs to (empty for meshNetworks `address` gateways).
    pub cluster: ClusterId,
    /// Gateway address.
    pub address: IpAddr,
    /// mTLS port (15443 by default).
    pub port: u16,
    /// Where this gateway was learned from (for `/debug/networkz`).
    pub source: String,
}

/// Who a proxy says it is, for finding the workload it runs as
/// ([`WorkloadLookup::find`]).
#[derive(Clone, Copy, Debug)]
pub struct WorkloadQuery<'a> {
    /// The proxy's IPs (`INSTANCE_IPS`, else the node id's IP field).
    pub ips: &'a [IpAddr],
    /// The node id's third field, `<pod>.<namespace>` on Kubernetes: picks the proxy's
    /// own pod when several share its IP (host-network pods).
    pub id: &'a str,
    /// The proxy's config namespace (metadata `NAMESPACE`).
    pub namespace: &'a str,
    /// The proxy's `CLUSTER_ID`, when it sends one: a Kubernetes registry of another
    /// cluster does not answer (pod IPs are reused across clusters).
    pub cluster: Option<&'a ClusterId>,
}

/// One service registry as the aggregate sees it: synchronous reads of the adapter's
/// in-memory view. The adapter's own writer task keeps that view current and reports
/// changes through its [`crate::UpdateSink`]; reads never wait on that task.
pub trait ServiceRegistry: Send + Sync + fmt::Debug {
    /// The kind of registry.
    fn provider(&self) -> ProviderId;

    /// The cluster this registry reads.
    fn cluster_id(&self) -> &ClusterId;

    /// The shard this registry writes endpoints into.
    fn shard_key(&self) -> ShardKey {
        ShardKey::new(self.provider(), self.cluster_id().clone())
    }

    /// All services, in any order (the aggregate sorts).
    fn services(&self) -> Vec<Arc<Service>>;

    /// True once the initial listing is complete.
    fn has_synced(&self) -> bool;

    /// True while the source cannot be reached and the last known view is served.
    fn is_stale(&self) -> bool {
        false
    }

    /// Gateways this registry knows for multi-network routing.
    fn network_gateways(&self) -> Vec<NetworkGateway> {
        Vec::new()
    }

    /// Where the service `hostname` is reachable from outside its cluster, as text
    /// (load-balancer ingress IPs and hostnames, external IPs): what a Gateway API
    /// Gateway's `status.addresses` reports. None by default.
    fn external_addresses(&self, _hostname: &str) -> Vec<String> {
        Vec::new()
    }

    /// This registry's workloads as they are now, frozen: the returned lookup keeps
    /// answering from the state at this call however the registry changes later, so
    /// that config generated from a snapshot depends on the snapshot, not on when it is
    /// generated. Taking it must be cheap (shared pointers to the published views, no
    /// copying). `None` means the registry has no workloads of its own: for its proxies
    /// the caller falls back to matching IPs against endpoints.
    fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
        None
    }
}

/// A registry's workloads frozen at one moment ([`ServiceRegistry::workloads`]).
pub trait WorkloadLookup: Send + Sync + fmt::Debug {
    /// The workload a proxy runs as, when this registry knows it (Istio's pod lookup
    /// behind `GetProxyServiceTargets` and `GetProxyWorkloadLabels`). `None` means
    /// "not mine" (another registry may know it).
    fn find(&self, query: &WorkloadQuery<'_>) -> Option<WorkloadInstance>;

    /// Every workload this registry knows (pods, WorkloadEntries), whether or not a
    /// service selects it: each as an endpoint carrying its workload record
    /// ([`Endpoint::workload`]) and no service ports, in the frozen state. What the
    /// ambient Address type sends beside the workloads behind services (Istio sends
    /// every pod and WorkloadEntry to ztunnel). Computed on call; callers take it once
    /// per snapshot. Default: none (the registry's workloads are its endpoints).
    fn every_workload(&self) -> Vec<Endpoint> {
        Vec::new()
    }
}
