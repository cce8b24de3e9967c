//! Response messages as the server writes them: each resource is the snapshot's
//! handle ([`Resource`]), so a response waiting in a stream's queue copies none of the
//! resource's bytes, name or version (see [`super::wire`] for the shared `Any`).

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use super::resource::{EncodedResource, Resource, ResourceList};
use super::wire::{put_string, string_len};

/// `envoy.service.discovery.v3.DiscoveryResponse` as the server writes it: each
/// resource is the snapshot's handle (one pointer), not a copy of its `Any`. A
/// response waiting in a stream's queue costs 8 bytes per resource; with 20,000
/// sidecars holding 1,000 clusters each, copied 48-byte `Any`s in queued responses
/// were most of the server's peak memory. Encode only: decode with envoy-types'
/// `DiscoveryResponse`.
#[derive(Clone, Default, Debug)]
pub struct SotwResponse {
    pub version_info: String,
    /// Field 2: each resource's `body`.
    pub resources: ResourceList,
    pub type_url: String,
    pub nonce: String,
    /// `control_plane` (an encoded `envoy.config.core.v3.ControlPlane`, computed
    /// once per server and shared by every response).
    pub control_plane: Bytes,
}

impl Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.version_info, buf);
        for resource in &self.resources {
            encoding::message::encode(2, &resource.body, buf);
        }
        put_string(4, &self.type_url, buf);
        put_string(5, &self.nonce, buf);
        if !self.control_plane.is_empty() {
            encoding::bytes::encode(6, &self.control_plane, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self
                .resources
                .iter()
                .map(|r| encoding::message::encoded_len(2, &r.body))
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
            + bytes_len(6, &self.control_plane)
    }

    fn clear(&mut self) {
        *self = SotwResponse::default();
    }
}

/// The encoded length of `resource` as an `envoy.service.discovery.v3.Resource`
/// (version = 1, the body = 2, name = 3), without its own key and length.
pub fn delta_resource_len(resource: &EncodedResource) -> usize {
    string_len(1, &resource.version)
        + encoding::message::encoded_len(2, &resource.body)
        + string_len(3, &resource.name)
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse` as the server writes it: each
/// resource is the snapshot's handle, whose name, version and body become one
/// `Resource` on the wire, so a queued response copies none of them. Encode only, as
/// [`SotwResponse`].
#[derive(Clone, Default, Debug)]
pub struct DeltaResponse {
    pub system_version_info: String,
    /// Field 2: each as a `Resource` (version, body, name).
    pub resources: Vec<Resource>,
    pub type_url: String,
    pub nonce: String,
    pub removed_resources: Vec<String>,
    /// `control_plane`, as in [`SotwResponse::control_plane`].
    pub control_plane: Bytes,
}

impl Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.system_version_info, buf);
        for resource in &self.resources {
            encoding::encode_key(2, WireType::LengthDelimited, buf);
            encoding::encode_varint(delta_resource_len(resource) as u64, buf);
            put_string(1, &resource.version, buf);
            encoding::message::encode(2, &resource.body, buf);
            put_string(3, &resource.name, buf);
        }
        put_string(4, &self.type_url, buf);
        put_string(5, &self.nonce, buf);
        encoding::string::encode_repeated(6, &self.removed_resources, buf);
        if !self.control_plane.is_empty() {
            encoding::bytes::encode(7, &self.control_plane, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.system_version_info)
            + self
                .resources
                .iter()
                .map(|r| {
                    let len = delta_resource_len(r);
                    encoding::key_len(2) + encoding::encoded_len_varint(len as u64) + len
                })
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
            + encoding::string::encoded_len_repeated(6, &self.removed_resources)
            + bytes_len(7, &self.control_plane)
    }

    fn clear(&mut self) {
        *self = DeltaResponse::default();
    }
}

/// The encoded length of a `bytes` field skipped when empty.
fn bytes_len(tag: u32, value: &Bytes) -> usize {
    if value.is_empty() {
        0
    } else {
        encoding::bytes::encoded_len(tag, value)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };

    use super::*;

    #[test]
    fn decodes_as_envoy_messages() {
        let cluster = Cluster {
            name: "outbound|80||a.ns.svc.cluster.local".into(),
            ..Default::default()
        };
        let resource = EncodedResource::encode(
            crate::xds::TypeUrl::Cluster,
            cluster.name.as_str(),
            &cluster,
        );
        let sotw = SotwResponse {
            version_info: "v1".into(),
            resources: vec![resource.clone()].into(),
            type_url: crate::xds::TypeUrl::Cluster.as_str().into(),
            nonce: "n1".into(),
            control_plane: Bytes::from_static(b"\n\x02cp"),
        };
        let encoded = sotw.encode_to_vec();
        assert_eq!(encoded.len(), sotw.encoded_len());
        let decoded = DiscoveryResponse::decode(encoded.as_slice()).unwrap();
        assert_eq!(decoded.version_info, "v1");
        assert_eq!(decoded.nonce, "n1");
        assert_eq!(decoded.control_plane.unwrap().identifier, "cp");
        assert_eq!(
            decoded.resources[0].type_url,
            crate::xds::TypeUrl::Cluster.as_str()
        );
        assert_eq!(
            Cluster::decode(decoded.resources[0].value.as_slice()).unwrap(),
            cluster
        );

        let delta = DeltaResponse {
            system_version_info: "v2".into(),
            resources: vec![resource.clone()],
            type_url: "t".into(),
            nonce: "n2".into(),
            removed_resources: vec!["gone".into(), String::new()],
            control_plane: Bytes::from_static(b"\n\x02cp"),
        };
        let encoded = delta.encode_to_vec();
        assert_eq!(encoded.len(), delta.encoded_len());
        let decoded = DeltaDiscoveryResponse::decode(encoded.as_slice()).unwrap();
        assert_eq!(decoded.system_version_info, "v2");
        assert_eq!(decoded.resources[0].name, cluster.name);
        assert_eq!(decoded.resources[0].version, &*resource.version);
        assert_eq!(decoded.type_url, "t");
        assert_eq!(decoded.nonce, "n2");
        assert_eq!(
            decoded.removed_resources,
            vec!["gone".to_string(), String::new()]
        );
        assert_eq!(decoded.control_plane.unwrap().identifier, "cp");
        let body = decoded.resources[0].resource.as_ref().unwrap();
        assert_eq!(Cluster::decode(body.value.as_slice()).unwrap(), cluster);
    }
}
