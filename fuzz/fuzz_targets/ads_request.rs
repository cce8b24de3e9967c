//! ADS request streams as the server reads them: gRPC framing split across HTTP/2
//! DATA frames at arbitrary points, then the hand-written SotW request decoder and
//! prost's Delta decoder, under a small per-connection byte budget. Nothing may panic;
//! every outcome is a message, the end, or an error.

#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use http_body::Frame;
use libfuzzer_sys::fuzz_target;
use meshfed::ads::frames::{RequestMessage, RequestStream};
use meshfed::ads::transport::ConnControl;
use meshfed::xds::wire::SotwRequest;

/// The body: the first byte picks how the rest is cut into DATA frames.
fn frames(data: &[u8]) -> Vec<Bytes> {
    let Some((&step, rest)) = data.split_first() else {
        return Vec::new();
    };
    let step = usize::from(step).max(1);
    rest.chunks(step).map(Bytes::copy_from_slice).collect()
}

fn read_all<M: RequestMessage>(data: &[u8]) {
    let chunks = frames(data);
    let body = http_body_util::StreamBody::new(futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, tonic::Status>(Frame::data(c))),
    ));
    let control = Arc::new(ConnControl::new(64 * 1024));
    let mut requests = RequestStream::<M>::new(tonic::body::Body::new(body), Some(control.clone()));
    futures::executor::block_on(async {
        while let Ok(Some(_)) = requests.message().await {}
    });
    drop(requests);
    assert_eq!(control.held(), 0, "a finished stream gives its bytes back");
}

fuzz_target!(|data: &[u8]| {
    read_all::<SotwRequest>(data);
    read_all::<DeltaDiscoveryRequest>(data);
    // The decoder alone, on the whole input, and its names and digest.
    let whole = <SotwRequest as prost::Message>::decode(data);
    if let Ok(request) = &whole {
        let _ = request.resource_names.digest();
        for name in request.resource_names.iter() {
            let _ = name.len();
        }
    }
    // The same bytes in pieces read the same: the same request, names and digest, or
    // an error both ways.
    let pieces = SotwRequest::decode_pieces(frames(data));
    let whole = data.split_first().map(|(_, rest)| <SotwRequest as prost::Message>::decode(rest));
    match (&whole, &pieces) {
        (Some(Ok(whole)), Ok(pieces)) => same(pieces, whole),
        (Some(Err(_)), Err(_)) => {}
        (None, Ok(pieces)) => assert_eq!(*pieces, SotwRequest::default()),
        (whole, pieces) => panic!("whole {whole:?}, in pieces {pieces:?}"),
    }
    // With recalled name lists (its own names, those without the first, and those of
    // the input one byte shorter), whole and in pieces read as without.
    let Some((_, rest)) = data.split_first() else {
        return;
    };
    let shorter = <SotwRequest as prost::Message>::decode(&rest[..rest.len().saturating_sub(1)]);
    let whole = whole.and_then(Result::ok);
    let but_first = whole.as_ref().and_then(|w| {
        let mut names = Vec::new();
        for name in w.resource_names.iter().skip(1) {
            prost::encoding::bytes::encode(3, &name.into_owned(), &mut names);
        }
        <SotwRequest as prost::Message>::decode(names.as_slice()).ok()
    });
    let lists: Vec<_> = [whole, but_first, shorter.ok()]
        .into_iter()
        .flatten()
        .filter(|r| !r.resource_names.is_empty())
        .map(|r| r.resource_names.kept())
        .collect();
    if lists.is_empty() {
        return;
    }
    meshfed::xds::wire::recall(lists);
    let again = <SotwRequest as prost::Message>::decode(rest);
    let again_pieces = SotwRequest::decode_pieces(frames(data));
    meshfed::xds::wire::recall(Vec::new());
    let before = <SotwRequest as prost::Message>::decode(rest);
    match (before, again, again_pieces) {
        (Ok(before), Ok(again), Ok(again_pieces)) => {
            same(&again, &before);
            same(&again_pieces, &before);
        }
        (Err(_), Err(_), Err(_)) => {}
        (before, again, again_pieces) => {
            panic!("before {before:?}, recalled {again:?}, recalled in pieces {again_pieces:?}")
        }
    }
});

/// The same request, names and digest.
fn same(a: &SotwRequest, b: &SotwRequest) {
    assert_eq!(a, b);
    assert_eq!(a.resource_names.len(), b.resource_names.len());
    assert_eq!(a.resource_names.digest(), b.resource_names.digest());
    assert!(a.resource_names.iter().eq(b.resource_names.iter()));
}
