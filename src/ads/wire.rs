//! Response messages with shared resource bytes.
//!
//! envoy-types' `DiscoveryResponse` holds each resource as an `Any` with an owned
//! `Vec<u8>`, so sending one encoded cluster to 2,000 proxies would copy it 2,000 times
//! before encoding. These types are wire-identical (same field numbers) but hold the
//! encoded resource as [`Bytes`], so every connection shares the bytes the snapshot's
//! resource cache produced once. Requests still use envoy-types' messages.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// A `google.protobuf.Any` whose value is shared, reference-counted bytes.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct SharedAny {
    /// `type.googleapis.com/...`.
    pub type_url: &'static str,
    /// The encoded message.
    pub value: Bytes,
}

impl Message for SharedAny {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.type_url.is_empty() {
            encoding::encode_key(1, WireType::LengthDelimited, buf);
            encoding::encode_varint(self.type_url.len() as u64, buf);
            buf.put_slice(self.type_url.as_bytes());
        }
        if !self.value.is_empty() {
            encoding::bytes::encode(2, &self.value, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Only ever decoded in tests; the type URL is not kept (it is static here).
        match tag {
            2 => encoding::bytes::merge(wire_type, &mut self.value, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let url = if self.type_url.is_empty() {
            0
        } else {
            encoding::key_len(1)
                + encoding::encoded_len_varint(self.type_url.len() as u64)
                + self.type_url.len()
        };
        let value = if self.value.is_empty() {
            0
        } else {
            encoding::bytes::encoded_len(2, &self.value)
        };
        url + value
    }

    fn clear(&mut self) {
        self.value.clear();
    }
}

/// `envoy.service.discovery.v3.DiscoveryResponse` with shared resources.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<SharedAny>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.DiscoveryRequest` as the server reads it: resource
/// names stay slices of the received bytes (a string and a bytes field are the same
/// on the wire), so the common ACK that repeats a thousand names costs no allocation
/// per name and no UTF-8 check; names are only turned into strings when they changed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwRequest {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<envoy_types::pb::google::rpc::Status>,
}

impl From<envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest> for SotwRequest {
    fn from(req: envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest) -> Self {
        SotwRequest {
            version_info: req.version_info,
            node: req.node,
            resource_names: req
                .resource_names
                .into_iter()
                .map(|n| Bytes::from(n.into_bytes()))
                .collect(),
            type_url: req.type_url,
            response_nonce: req.response_nonce,
            error_detail: req.error_detail,
        }
    }
}

/// `envoy.service.discovery.v3.Resource` with a shared body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<SharedAny>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse` with shared resources.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<DeltaResource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    };

    #[test]
    fn reads_envoy_requests_with_names_as_slices() {
        let request = DiscoveryRequest {
            version_info: "v1".into(),
            node: Some(Node {
                id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: vec!["outbound|80||a.ns.svc.cluster.local".into(), "b".into()],
            type_url: crate::ads::TypeUrl::Endpoint.as_str().into(),
            response_nonce: "n1".into(),
            error_detail: Some(envoy_types::pb::google::rpc::Status {
                code: 3,
                message: "bad".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        let wire = Bytes::from(request.encode_to_vec());
        let read = SotwRequest::decode(wire.clone()).unwrap();
        assert_eq!(read, SotwRequest::from(request));
        // Decoding from Bytes shares the received buffer instead of copying names.
        let name = &read.resource_names[0];
        let start = wire.as_ptr() as usize;
        assert!((start..start + wire.len()).contains(&(name.as_ptr() as usize)));
    }

    use super::*;

    #[test]
    fn decodes_as_envoy_messages() {
        let cluster = Cluster {
            name: "outbound|80||a.ns.svc.cluster.local".into(),
            ..Default::default()
        };
        let any = SharedAny {
            type_url: crate::ads::TypeUrl::Cluster.as_str(),
            value: cluster.encode_to_vec().into(),
        };
        let sotw = SotwResponse {
            version_info: "v1".into(),
            resources: vec![any.clone()],
            type_url: crate::ads::TypeUrl::Cluster.as_str().into(),
            nonce: "n1".into(),
        };
        let decoded = DiscoveryResponse::decode(sotw.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.version_info, "v1");
        assert_eq!(decoded.nonce, "n1");
        assert_eq!(
            decoded.resources[0].type_url,
            crate::ads::TypeUrl::Cluster.as_str()
        );
        assert_eq!(
            Cluster::decode(decoded.resources[0].value.as_slice()).unwrap(),
            cluster
        );

        let delta = DeltaResponse {
            system_version_info: "v2".into(),
            resources: vec![DeltaResource {
                version: "h".into(),
                resource: Some(any),
                name: cluster.name.clone(),
            }],
            type_url: "t".into(),
            nonce: "n2".into(),
            removed_resources: vec!["gone".into()],
        };
        let decoded = DeltaDiscoveryResponse::decode(delta.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.resources[0].name, cluster.name);
        assert_eq!(decoded.removed_resources, vec!["gone".to_string()]);
        let body = decoded.resources[0].resource.as_ref().unwrap();
        assert_eq!(Cluster::decode(body.value.as_slice()).unwrap(), cluster);
    }
}
