//! Blocking queries: each loop holds its own index, the server holds idle queries,
//! an index going backwards resets to 0, and an index that never moves cannot make a
//! loop spin.

use std::time::Duration;

use meshfed_consul::fake::{CheckStatus, FakeConsul, Instance, RecordedRequest};

use crate::support::{Harness, config, key};

const CATALOG: &str = "/v1/catalog/services";
const WEB: &str = "/v1/health/service/web";
const API: &str = "/v1/health/service/api";

/// web at indexes 2 and 3, api at 4: the catalog's index is 4, web's 3, api's 4.
async fn catalog() -> FakeConsul {
    let consul = FakeConsul::start().await.unwrap();
    consul.register(Instance::new("web", "web-1", "10.0.0.1", 80));
    consul.register(Instance::new("web", "web-2", "10.0.0.2", 80));
    consul.register(Instance::new("api", "api-1", "10.0.1.1", 90));
    assert_eq!(consul.index(), 4);
    consul
}

fn indexes(requests: &[RecordedRequest]) -> Vec<Option<u64>> {
    requests.iter().map(RecordedRequest::index).collect()
}

#[tokio::test]
async fn idle_loops_are_held_by_the_server_each_with_its_own_index() {
    let (h, _) = Harness::synced(catalog().await).await;
    h.idle(3).await;
    // First a plain read, then a blocking query from the index it returned.
    assert_eq!(indexes(&h.consul.requests_to(CATALOG)), vec![None, Some(4)]);
    assert_eq!(indexes(&h.consul.requests_to(WEB)), vec![None, Some(3)]);
    assert_eq!(indexes(&h.consul.requests_to(API)), vec![None, Some(4)]);
    let held = h.consul.requests_to(WEB).pop().unwrap();
    assert_eq!(held.wait(), Some("60000ms"));

    // A health change wakes only web's loop, which answers once and blocks again
    // from the new index; nobody polls.
    h.consul.set_health("web-1", CheckStatus::Critical);
    h.until("web's next query", |h| {
        (h.consul.requests_to(WEB).len() == 3).then_some(())
    })
    .await;
    h.idle(3).await;
    assert_eq!(
        indexes(&h.consul.requests_to(WEB)),
        vec![None, Some(3), Some(5)]
    );
    assert_eq!(h.consul.requests_to(CATALOG).len(), 2);
    assert_eq!(h.consul.requests_to(API).len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn an_index_going_backwards_resets_to_zero_and_later_changes_are_seen() {
    let (h, _) = Harness::synced(catalog().await).await;
    h.idle(3).await;

    // A snapshot restore: every index is now 2 and held queries answer at once.
    h.consul.set_index(2);
    h.until("three resets", |h| {
        (h.registry.stats().index_resets() == 3).then_some(())
    })
    .await;
    h.idle(3).await;
    // Held at 4, answered with 2: re-read without an index, then block from 2.
    assert_eq!(
        indexes(&h.consul.requests_to(CATALOG)),
        vec![None, Some(4), None, Some(2)]
    );
    assert_eq!(
        indexes(&h.consul.requests_to(WEB)),
        vec![None, Some(3), None, Some(2)]
    );

    // The next write gets index 3: a loop still holding 3 or 4 would not see it.
    assert_eq!(
        h.consul
            .register(Instance::new("web", "web-3", "10.0.0.3", 80)),
        3
    );
    h.until("the new instance", |h| {
        (h.endpoints(&key("web")).len() == 3).then_some(())
    })
    .await;
    assert!(h.registry.stats().errors() == 0);
    h.stop().await;
}

#[tokio::test]
async fn an_index_that_does_not_move_cannot_make_a_loop_spin() {
    let consul = catalog().await;
    let mut c = config(&consul);
    c.min_query_interval = Duration::from_millis(50);
    let mut h = Harness::start(consul, c).await;
    h.wait_synced().await;
    h.idle(3).await;
    let before = h.consul.requests_to(CATALOG).len();

    // The server now answers every query at once with the same index.
    h.consul.set_blocking(false);
    let requests = h
        .until("seven more catalog queries", |h| {
            let r = h.consul.requests_to(CATALOG);
            (r.len() >= before + 7).then_some(r)
        })
        .await;
    // Six intervals of at least 50 ms between query starts. Arrival times jitter with
    // scheduling, so allow half; a loop without the limit sends these within
    // milliseconds.
    let span = requests[before + 6].at - requests[before].at;
    assert!(
        span >= Duration::from_millis(150),
        "7 queries within {span:?}"
    );
    // Unchanged answers are not re-applied.
    assert!(h.pending().is_empty());
    h.stop().await;
}
