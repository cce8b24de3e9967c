//! The two ADS flavours (state of the world and Delta): their message shapes, how a
//! request moves the connection's state, and how a response is formed from generated
//! resources, so the stream loop of [`super::server`] is written once.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;

use super::Flavour;
use super::connection::{Action, ConnectionState};
use super::debug::DebugResource;
use super::frames::FrameEncode;
use crate::xds::response::{DeltaResponse, SotwResponse};
use crate::xds::wire::SotwRequest;
use crate::xds::{ResourceList, TypeUrl};

/// The two ADS flavours differ only in message shapes and in how a response is
/// formed from generated resources.
pub(super) trait FlavourIo: Send + Sync + 'static {
    type Req: super::frames::RequestMessage + Send + 'static;
    type Resp: Message + Default + FrameEncode + Unpin + Send + 'static;
    const FLAVOUR: Flavour;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn apply(state: &mut ConnectionState, req: &Self::Req) -> Action;
    /// The type, names and nonce of a request answered outside the per-type
    /// conversation (debug and unserved types).
    fn other_request(req: &Self::Req) -> OtherRequest;
    /// The response to such a request.
    fn other_response(
        type_url: &str,
        version: &str,
        nonce: String,
        resources: Vec<DebugResource>,
        control_plane: Bytes,
    ) -> Self::Resp;
    /// Sets `control_plane` on a response.
    fn stamp(response: &mut Self::Resp, control_plane: &Bytes);
    /// Forms the response, if there is something to send.
    fn respond(
        state: &mut ConnectionState,
        type_url: TypeUrl,
        version: &Arc<str>,
        resources: ResourceList,
        partial: bool,
        why: Why,
    ) -> Reply<Self::Resp>;
}

/// A request for a type outside the per-type conversation.
pub(super) struct OtherRequest {
    pub(super) type_url: String,
    pub(super) names: Vec<String>,
    /// The nonce it answers: set on an ACK of an earlier answer.
    pub(super) nonce: String,
}

/// Why one type is being sent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Why {
    /// A direct answer to a request: always sent.
    Answer,
    /// A forced push: sent even when the proxy holds exactly that config (SotW).
    ForcedPush,
    /// A push: skipped when nothing changed for the proxy.
    Push,
}

/// What a push of one type comes to for one connection.
pub(super) enum Reply<R> {
    /// A response to send.
    Send(R),
    /// The proxy already holds exactly this config.
    Unchanged,
    /// Nothing to send (an incremental push that touches none of its names).
    Nothing,
}

#[derive(Default)]
pub(super) struct Sotw;

impl FlavourIo for Sotw {
    type Req = SotwRequest;
    type Resp = SotwResponse;
    const FLAVOUR: Flavour = Flavour::Sotw;

    fn node(req: &SotwRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn apply(state: &mut ConnectionState, req: &SotwRequest) -> Action {
        state.on_sotw_request(req)
    }

    fn other_request(req: &SotwRequest) -> OtherRequest {
        OtherRequest {
            type_url: req.type_url.clone(),
            names: req
                .resource_names
                .iter()
                .map(|n| String::from_utf8_lossy(&n).into_owned())
                .collect(),
            nonce: req.response_nonce.clone(),
        }
    }

    fn other_response(
        type_url: &str,
        version: &str,
        nonce: String,
        resources: Vec<DebugResource>,
        control_plane: Bytes,
    ) -> SotwResponse {
        SotwResponse {
            version_info: version.to_string(),
            resources: resources
                .into_iter()
                .map(|r| r.into_resource(version))
                .collect(),
            type_url: type_url.to_string(),
            nonce,
            control_plane,
        }
    }

    fn stamp(response: &mut SotwResponse, control_plane: &Bytes) {
        response.control_plane = control_plane.clone();
    }

    fn respond(
        state: &mut ConnectionState,
        type_url: TypeUrl,
        version: &Arc<str>,
        resources: ResourceList,
        partial: bool,
        why: Why,
    ) -> Reply<SotwResponse> {
        if partial && resources.is_empty() {
            return Reply::Nothing;
        }
        // A forced push goes out whatever the proxy holds, as in Istio.
        if state.sotw_unchanged(type_url, &resources, partial, why != Why::Push) {
            return Reply::Unchanged;
        }
        let nonce = state.record_sent(type_url, version);
        Reply::Send(SotwResponse {
            version_info: version.to_string(),
            resources,
            type_url: type_url.as_str().to_string(),
            nonce,
            control_plane: Bytes::new(),
        })
    }
}

#[derive(Default)]
pub(super) struct Delta;

impl FlavourIo for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const FLAVOUR: Flavour = Flavour::Delta;

    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn apply(state: &mut ConnectionState, req: &DeltaDiscoveryRequest) -> Action {
        state.on_delta_request(req)
    }

    fn other_request(req: &DeltaDiscoveryRequest) -> OtherRequest {
        OtherRequest {
            type_url: req.type_url.clone(),
            names: req.resource_names_subscribe.clone(),
            nonce: req.response_nonce.clone(),
        }
    }

    fn other_response(
        type_url: &str,
        version: &str,
        nonce: String,
        resources: Vec<DebugResource>,
        control_plane: Bytes,
    ) -> DeltaResponse {
        DeltaResponse {
            system_version_info: version.to_string(),
            resources: resources
                .into_iter()
                .map(|r| r.into_resource(version))
                .collect(),
            type_url: type_url.to_string(),
            nonce,
            removed_resources: Vec::new(),
            control_plane,
        }
    }

    fn stamp(response: &mut DeltaResponse, control_plane: &Bytes) {
        response.control_plane = control_plane.clone();
    }

    fn respond(
        state: &mut ConnectionState,
        type_url: TypeUrl,
        version: &Arc<str>,
        resources: ResourceList,
        partial: bool,
        why: Why,
    ) -> Reply<DeltaResponse> {
        let (changed, removed) = state.delta_diff(type_url, &resources, partial);
        if changed.is_empty() && removed.is_empty() && why != Why::Answer {
            return Reply::Unchanged;
        }
        let nonce = state.record_sent(type_url, version);
        Reply::Send(DeltaResponse {
            system_version_info: version.to_string(),
            resources: changed,
            type_url: type_url.as_str().to_string(),
            nonce,
            removed_resources: removed,
            control_plane: Bytes::new(),
        })
    }
}
