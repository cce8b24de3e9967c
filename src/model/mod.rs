//! The proxy model, at the bottom of the serving side: who is connected (node id,
//! metadata, node type, generator kind) as generators and the push path see it.
//! Nothing here imports the rest of the crate.

pub mod proxy;

pub use proxy::{
    ClientView, GatewayTopology, Generator, NodeType, Proxy, ProxyClass, WorkloadMemo,
};
