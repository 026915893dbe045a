//! What the local limiter charged is given back to its local state whenever
//! the key's failure domain has one: before the switch (the primary's first
//! failures are answered locally too), and after the primary is back (the
//! state a new outage within `continue_within` continues).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{DecisionSource, Fallback};
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::flaky::Flaky;

use super::{back_on_primary, llm, tokens_left, world};

/// The primary's first failure (of 3 to switch) is answered locally; the
/// refund of that charge lands there, and the failures that switch the
/// fallback continue that state, whole again.
#[tokio::test]
async fn a_refund_of_a_charge_answered_before_the_switch_lands_in_its_local_state() {
    let primary = Flaky::default();
    let down = primary.down.clone();
    let storage = Fallback::builder(primary).instances(1).build(); // 3 failures to switch
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(4))
        .clock(FakeClock::new())
        .storage(storage.clone())
        .build();
    down.store(true, Ordering::SeqCst);
    let charged = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    assert_eq!(charged.source(), DecisionSource::Fallback);
    assert_eq!(charged.remaining, 3);
    assert!(!storage.is_local(), "one failure of three: not switched yet");
    tiers
        .refund_decided("ada", "free", 1, charged.source())
        .await
        .unwrap();
    let mut left = Vec::new();
    for _ in 0..3 {
        left.push(tiers.check("ada", "free", 0).await.unwrap().unwrap().remaining);
    }
    assert!(storage.is_local());
    assert_eq!(left, [4, 4, 4], "the refund of the local charge was lost");
}

/// A reservation taken locally and settled (nothing used) after the primary
/// is back: the primary gets nothing (it never charged it), and the next
/// outage, which continues the local state, does not count it either.
#[tokio::test]
async fn a_local_reservation_settled_after_the_outage_is_not_counted_by_the_next() {
    let world = world();
    let tiers = llm(&world);
    world.down.store(true, Ordering::SeqCst);
    let reserved = tiers.reserve("ada", "llm", "tokens", 800).await.unwrap().unwrap();
    assert_eq!(reserved.source(), DecisionSource::Fallback);
    back_on_primary(&world, &tiers, "llm").await;
    tiers
        .settle_decided("ada", "llm", "tokens", 800, 0, reserved.source())
        .await
        .unwrap();
    assert_eq!(
        tokens_left(&tiers, "ada").await,
        1_000,
        "the primary never charged it"
    );
    // down again a second later: the same spell's local state
    world.clock.advance(Duration::from_secs(1));
    world.down.store(true, Ordering::SeqCst);
    let again = tiers.reserve("ada", "llm", "tokens", 500).await.unwrap();
    let again = again.expect("ada used no token: 500 of 1,000 fit");
    assert_eq!(again.source(), DecisionSource::Fallback);
}
