//! The warning a layer logs when it keys an anonymous client without an
//! address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use http::{Request, Response, StatusCode};
use tower::ServiceExt;
use tower_layer::Layer;

use crate::identity::PeerAddr;
use crate::warnings_for_tests::Warnings;
use crate::{Quota, RateTier, TierLimitLayer};

fn layer() -> TierLimitLayer {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(2))
        .default_tier("free")
        .build();
    TierLimitLayer::new(tiers) // no identifier: every client is anonymous
}

/// Sends anonymous requests through `layer`, with `peer` as their address
/// when given, and returns their statuses and the warnings logged.
fn send(layers: &[&TierLimitLayer], peer: Option<&str>, each: usize) -> (Vec<StatusCode>, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let (subscriber, warnings) = Warnings::of("tower_rate_tier::limit::admit");
    let _subscriber = crate::warnings_for_tests::scoped(subscriber);
    let mut statuses = Vec::new();
    for layer in layers {
        let service = layer.layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
        for _ in 0..each {
            let mut request = Request::new(());
            if let Some(peer) = peer {
                let addr: SocketAddr = peer.parse().expect("an address");
                request.extensions_mut().insert(PeerAddr(addr));
            }
            let response = runtime
                .block_on(service.clone().oneshot(request))
                .expect("infallible");
            statuses.push(response.status());
        }
    }
    (statuses, warnings.load(Ordering::SeqCst))
}

#[test]
fn a_layer_warns_once_when_anonymous_clients_have_no_address() {
    let layer = layer();
    let (statuses, warnings) = send(&[&layer], None, 3);
    // all of them in one bucket of 2: the third is refused
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
    assert_eq!(warnings, 1);
    // the same layer, later: it has warned already
    assert_eq!(send(&[&layer], None, 1).1, 0);
}

#[test]
fn each_layer_warns_for_itself() {
    let first = layer();
    let second = first.clone().on_unknown_tier(crate::OnUnknownTier::Allow);
    assert_eq!(send(&[&first, &second], None, 2).1, 2);
}

#[test]
fn clients_with_an_address_cause_no_warning() {
    let layer = layer();
    let (statuses, warnings) = send(&[&layer], Some("192.0.2.7:4000"), 2);
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK]);
    assert_eq!(warnings, 0);
    // a second address has a bucket of its own
    assert_eq!(send(&[&layer], Some("192.0.2.8:4000"), 1).0, [StatusCode::OK]);
}
