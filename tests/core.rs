//! The core as a user sees it: `RateTier::check` on `MemoryStorage`, always on
//! a `FakeClock`, with exact numbers.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::storage::{DecisionSource, MemoryStorage};
use tower_rate_tier::{BuildError, CheckError, IntoQuotas, Quota, RateLimitInfo, RateLimited, RateTier};

const MS: Duration = Duration::from_millis(1);
const NS: Duration = Duration::from_nanos(1);

fn tiers(clock: &FakeClock, quotas: impl IntoQuotas) -> RateTier {
    RateTier::builder()
        .tier("free", quotas)
        .clock(clock.clone())
        .build()
}

fn tiers_on(clock: &FakeClock, storage: &MemoryStorage, quotas: impl IntoQuotas) -> RateTier {
    RateTier::builder()
        .tier("free", quotas)
        .clock(clock.clone())
        .storage(storage.clone())
        .build()
}

/// Polls a future once with a no-op waker: `MemoryStorage` decides
/// synchronously, so `check` is ready at once, inside or outside a runtime.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a check on MemoryStorage did not complete at once"),
    }
}

#[track_caller]
fn admit(t: &RateTier, user: &str, cost: u32) -> RateLimitInfo {
    match ready(t.check(user, "free", cost)) {
        Ok(Ok(info)) => info,
        other => panic!("expected {user} (cost {cost}) to be admitted, got {other:?}"),
    }
}

#[track_caller]
fn deny(t: &RateTier, user: &str, cost: u32) -> RateLimited {
    match ready(t.check(user, "free", cost)) {
        Ok(Err(limited)) => limited,
        other => panic!("expected {user} (cost {cost}) to be denied, got {other:?}"),
    }
}

/// Every band's remaining count in tier `free`, as a peek (cost 0) reports it.
#[track_caller]
fn peek_bands(t: &RateTier, user: &str) -> Vec<u32> {
    peek_bands_in(t, user, "free")
}

#[track_caller]
fn peek_bands_in(t: &RateTier, user: &str, tier: &str) -> Vec<u32> {
    let info = ready(t.check(user, tier, 0)).unwrap().unwrap();
    info.bands().map(|(_, s)| s.remaining).collect()
}

// ---------------------------------------------------------------- one band

#[test]
fn burst_then_deny_then_exact_refill_to_the_nanosecond() {
    let clock = FakeClock::new();
    let t = tiers(&clock, Quota::per_minute(10)); // one every 6 s
    let start = clock.now();
    for i in 0..10u32 {
        let info = admit(&t, "ada", 1);
        assert_eq!((info.limit, info.remaining), (10, 9 - i), "request {i}");
        assert_eq!(info.reset_after, Duration::from_secs(6 * u64::from(i + 1)));
        assert_eq!(info.tier(), "free");
        assert_eq!(info.decided_at(), start);
    }
    let denied = deny(&t, "ada", 1);
    assert_eq!(denied.limit, 10);
    assert_eq!(denied.remaining, 0);
    assert_eq!(denied.retry_after, Duration::from_secs(6));
    assert_eq!(denied.retry_after_secs(), 6);
    assert_eq!(denied.reset_after, Duration::from_secs(60));
    assert_eq!(denied.reset_at_unix_secs(), FakeClock::START_UNIX_SECS + 60);

    clock.advance(Duration::from_secs(6) - NS);
    let early = deny(&t, "ada", 1);
    assert_eq!(early.retry_after, NS);
    assert_eq!(early.retry_after_secs(), 1, "Retry-After is never 0");

    clock.advance(NS);
    let info = admit(&t, "ada", 1);
    assert_eq!((info.remaining, info.reset_after), (0, Duration::from_secs(60)));
    assert_eq!(deny(&t, "ada", 1).retry_after, Duration::from_secs(6));

    // A full refill gives back exactly the burst, not more.
    clock.advance(Duration::from_secs(60));
    let info = admit(&t, "ada", 10);
    assert_eq!(info.remaining, 0);
    deny(&t, "ada", 1);

    // Users do not share buckets.
    assert_eq!(admit(&t, "bob", 1).remaining, 9);
}

#[test]
fn uneven_period_rounds_the_interval_up() {
    let clock = FakeClock::new();
    let t = tiers(&clock, Quota::per_second(3)); // 333,333,334 ns
    admit(&t, "ada", 3);
    assert_eq!(deny(&t, "ada", 1).retry_after, Duration::from_nanos(333_333_334));
    clock.advance(Duration::from_nanos(333_333_333));
    deny(&t, "ada", 1);
    clock.advance(NS);
    admit(&t, "ada", 1);
    // 7 per minute: 8,571,428,572 ns each (60 s / 7, rounded up).
    let t = tiers(&clock, Quota::per_minute(7));
    admit(&t, "bob", 7);
    clock.advance(Duration::from_nanos(8_571_428_572 - 1));
    deny(&t, "bob", 1);
    clock.advance(NS);
    admit(&t, "bob", 1);
}

#[test]
fn cost_n_charges_n_units() {
    let clock = FakeClock::new();
    let t = tiers(&clock, Quota::per_second(10)); // one every 100 ms
    let info = admit(&t, "ada", 4);
    assert_eq!((info.remaining, info.reset_after), (6, 400 * MS));
    let info = admit(&t, "ada", 6);
    assert_eq!((info.remaining, info.reset_after), (0, 1_000 * MS));
    assert_eq!(deny(&t, "ada", 1).retry_after, 100 * MS);

    clock.advance(300 * MS);
    let denied = deny(&t, "ada", 4);
    assert_eq!((denied.remaining, denied.retry_after), (3, 100 * MS));
    let info = admit(&t, "ada", 3);
    assert_eq!((info.remaining, info.reset_after), (0, 1_000 * MS));
}

#[test]
fn cost_zero_peeks_without_consuming() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let t = tiers_on(&clock, &storage, Quota::per_second(10));

    // A never-seen key: full, and nothing is stored for it.
    let fresh = admit(&t, "ghost", 0);
    assert_eq!(
        (fresh.limit, fresh.remaining, fresh.reset_after),
        (10, 10, Duration::ZERO)
    );
    assert_eq!(storage.len(), 0);

    admit(&t, "ada", 3);
    for _ in 0..5 {
        let peek = admit(&t, "ada", 0);
        assert_eq!((peek.remaining, peek.reset_after), (7, 300 * MS));
    }
    admit(&t, "ada", 7);

    // An exhausted key: the peek is still admitted and reports 0.
    for _ in 0..5 {
        let peek = admit(&t, "ada", 0);
        assert_eq!((peek.remaining, peek.reset_after), (0, 1_000 * MS));
    }
    assert_eq!(deny(&t, "ada", 1).retry_after, 100 * MS);
    clock.advance(100 * MS);
    assert_eq!(admit(&t, "ada", 0).remaining, 1);
    admit(&t, "ada", 1);
    assert_eq!(storage.len(), 1);
}

#[test]
fn refund_gives_units_back_but_never_beyond_a_fresh_state() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let t = tiers_on(&clock, &storage, Quota::per_second(10));

    admit(&t, "ada", 5);
    ready(t.refund("ada", "free", 2)).unwrap();
    assert_eq!(admit(&t, "ada", 0).remaining, 7);

    ready(t.refund("ada", "free", 100)).unwrap();
    assert_eq!(admit(&t, "ada", 0).remaining, 10);
    admit(&t, "ada", 10);
    deny(&t, "ada", 1);

    // Time already refilled part of the bucket: a refund tops it up to the
    // burst, no further.
    clock.advance(500 * MS);
    ready(t.refund("ada", "free", 10)).unwrap();
    admit(&t, "ada", 10);
    assert_eq!(deny(&t, "ada", 1).retry_after, 100 * MS);

    // Refunding a key never seen stores nothing and grants nothing extra.
    ready(t.refund("ghost", "free", 5)).unwrap();
    assert_eq!(storage.len(), 1);
    admit(&t, "ghost", 10);
    deny(&t, "ghost", 1);

    // Every band of a multi-band tier gets the refund.
    let t = tiers(&clock, [Quota::per_second(10), Quota::per_minute(20)]);
    admit(&t, "ada", 8);
    assert_eq!(peek_bands(&t, "ada"), [2, 12]);
    ready(t.refund("ada", "free", 3)).unwrap();
    assert_eq!(peek_bands(&t, "ada"), [5, 15]);
}

#[test]
fn cost_above_burst_is_an_error_and_consumes_nothing() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let t = tiers_on(&clock, &storage, Quota::per_second(5));
    for cost in [6, 1_000, u32::MAX] {
        match ready(t.check("ada", "free", cost)) {
            Err(CheckError::CostExceedsLimit { tier, cost: c, limit }) => {
                assert_eq!((tier.as_str(), c, limit), ("free", cost, 5));
            }
            other => panic!("cost {cost}: expected CostExceedsLimit, got {other:?}"),
        }
    }
    let err = ready(t.check("ada", "free", 6)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a request costing 6 can never pass tier `free`, whose burst is 5"
    );
    assert_eq!(storage.len(), 0);
    admit(&t, "ada", 5); // the full burst is still there

    // A multi-band tier: the smallest burst is the limit.
    let t = tiers(&clock, [Quota::per_second(5), Quota::per_hour(3)]);
    match ready(t.check("bob", "free", 4)) {
        Err(CheckError::CostExceedsLimit {
            limit: 3, cost: 4, ..
        }) => {}
        other => panic!("expected CostExceedsLimit with limit 3, got {other:?}"),
    }
    assert_eq!(peek_bands(&t, "bob"), [5, 3]);
}

#[test]
fn unknown_tier_is_an_error() {
    let clock = FakeClock::new();
    let t = tiers(&clock, Quota::per_second(5));
    match ready(t.check("ada", "gold", 1)) {
        Err(CheckError::UnknownTier(name)) => assert_eq!(name, "gold"),
        other => panic!("expected UnknownTier, got {other:?}"),
    }
    let err = ready(t.check("ada", "gold", 0)).unwrap_err();
    assert_eq!(err.to_string(), "unknown tier `gold`");
    assert!(matches!(
        ready(t.refund("ada", "gold", 1)),
        Err(CheckError::UnknownTier(name)) if name == "gold"
    ));
    // Tier names are exact.
    assert!(matches!(
        ready(t.check("ada", "Free", 1)),
        Err(CheckError::UnknownTier(_))
    ));
    admit(&t, "ada", 5);
}

#[test]
fn unlimited_tier_is_never_limited_and_stores_nothing() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let t = RateTier::builder()
        .tier("free", Quota::per_second(1))
        .tier("enterprise", Quota::unlimited())
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    for i in 0..10_000u32 {
        let cost = if i % 2 == 0 { 1 } else { u32::MAX };
        let info = ready(t.check("ada", "enterprise", cost)).unwrap().unwrap();
        assert!(info.is_unlimited());
        assert_eq!((info.limit, info.remaining), (u32::MAX, u32::MAX));
    }
    assert_eq!(storage.len(), 0);
    // The same user is still limited in another tier.
    ready(t.check("ada", "free", 1)).unwrap().unwrap();
    ready(t.check("ada", "free", 1)).unwrap().unwrap_err();
}

// --------------------------------------------------------------- multi-band

#[test]
fn multi_band_is_all_or_nothing_and_reports_the_band_closest_to_denying() {
    let clock = FakeClock::new();
    // A: 5 per second (200 ms); B: 8 per minute (7.5 s).
    let t = tiers(&clock, [Quota::per_second(5), Quota::per_minute(8)]);

    let info = admit(&t, "ada", 3);
    assert_eq!(peek_bands(&t, "ada"), [2, 5]);
    // A (2 left of 5) is closer to denying than B (5 left of 8).
    assert_eq!((info.limit, info.remaining, info.reset_after), (5, 2, 600 * MS));

    // A denies a cost of 3; B would admit it but is not charged either.
    let denied = deny(&t, "ada", 3);
    assert_eq!(
        (denied.limit, denied.remaining, denied.retry_after),
        (5, 2, 200 * MS)
    );
    let states: Vec<_> = denied
        .bands()
        .map(|(q, s)| (q.burst(), s.remaining, s.retry_after_ns))
        .collect();
    assert_eq!(states, [(5, 2, 200_000_000), (8, 5, 0)]);
    assert_eq!(peek_bands(&t, "ada"), [2, 5]);

    // One second later A is full; B has refilled 1 s of 22.5 s used.
    clock.advance(Duration::from_secs(1));
    let info = admit(&t, "ada", 5);
    assert_eq!(peek_bands(&t, "ada"), [0, 0]);
    // Both at 0: the one that takes longer to refill (B, 59 s) is reported.
    assert_eq!((info.limit, info.remaining), (8, 0));
    assert_eq!(info.reset_after, Duration::from_secs(59));

    // Now B denies while A, a second later, would admit: A is not charged.
    clock.advance(Duration::from_secs(1));
    let denied = deny(&t, "ada", 1);
    assert_eq!((denied.limit, denied.retry_after), (8, 5_500 * MS));
    assert_eq!(peek_bands(&t, "ada"), [5, 0]);

    // Both deny: the band that denies longest is reported.
    let t = tiers(&clock, [Quota::per_second(3), Quota::per_minute(2)]);
    admit(&t, "bob", 2); // A: 1 of 3 left; B: 0 of 2
    let denied = deny(&t, "bob", 2);
    assert_eq!((denied.limit, denied.remaining), (2, 0));
    assert_eq!(denied.retry_after, Duration::from_secs(60));
    let retries: Vec<_> = denied.bands().map(|(_, s)| s.retry_after_ns).collect();
    assert_eq!(retries, [333_333_334, 60_000_000_000]);
    assert_eq!(peek_bands(&t, "bob"), [1, 0]);
}

// ------------------------------------------------------------ builder errors

#[track_caller]
fn build_error(builder: tower_rate_tier::RateTierBuilder) -> BuildError {
    match builder.try_build() {
        Ok(t) => panic!("expected a build error, got {t:?}"),
        Err(e) => e,
    }
}

/// A configuration, the error it gives, and a part of that error's message.
type BadConfiguration = (fn() -> tower_rate_tier::RateTierBuilder, BuildError, &'static str);

fn every_bad_configuration() -> Vec<BadConfiguration> {
    vec![
        (
            || RateTier::builder(),
            BuildError::NoTiers,
            "no tiers configured: add at least one with `.tier(name, quota)`",
        ),
        (
            || {
                RateTier::builder()
                    .tier("free", Quota::per_minute(1))
                    .tier("pro", Quota::per_minute(5))
                    .tier("free", Quota::per_minute(2))
            },
            BuildError::DuplicateTier("free".into()),
            "tier `free` is configured more than once",
        ),
        (
            || {
                RateTier::builder()
                    .tier("free", Quota::per_minute(1))
                    .default_tier("gold")
            },
            BuildError::UnknownDefaultTier("gold".into()),
            "the default tier `gold` is not a configured tier",
        ),
        (
            || RateTier::builder().tier("pro", [Quota::per_second(1), Quota::unlimited()]),
            BuildError::UnlimitedWithBands("pro".into()),
            "tier `pro` mixes `Quota::unlimited()` with limited bands",
        ),
        (
            || RateTier::builder().tier("pro", Vec::<Quota>::new()),
            BuildError::NoBands("pro".into()),
            "tier `pro` has no quota",
        ),
        (
            || RateTier::builder().tier("pro", [Quota::per_second(1); 5]),
            BuildError::TooManyBands("pro".into()),
            "tier `pro` has more than 4 bands",
        ),
        (
            || RateTier::builder().tier("", Quota::per_second(1)),
            BuildError::InvalidName(String::new()),
            "`` is not a valid tier name or namespace (1 to 255 bytes; the namespace may be empty)",
        ),
        (
            // the character that separates a tier's name from its own-quota
            // state's: a tier named so would share that state
            || RateTier::builder().tier("free\u{1f}own", Quota::per_second(1)),
            BuildError::InvalidName("free\u{1f}own".into()),
            "a tier name may not hold the character U+001F",
        ),
        (
            || RateTier::builder().tier("x".repeat(256), Quota::per_second(1)),
            BuildError::InvalidName("x".repeat(256)),
            "is not a valid tier name or namespace",
        ),
        (
            || {
                RateTier::builder()
                    .tier("free", Quota::per_second(1))
                    .namespace("n".repeat(256))
            },
            BuildError::InvalidName("n".repeat(256)),
            "is not a valid tier name or namespace",
        ),
    ]
}

#[test]
fn every_build_error_is_typed_and_named() {
    for (builder, expected, message) in every_bad_configuration() {
        let err = build_error(builder());
        assert_eq!(err, expected);
        assert!(err.to_string().contains(message), "{err}");
    }
}

#[test]
fn build_panics_with_the_build_error_message() {
    for (builder, expected, _) in every_bad_configuration() {
        let panic = catch_unwind(AssertUnwindSafe(|| builder().build()))
            .expect_err("build() of a bad configuration must panic");
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert_eq!(msg, format!("invalid rate-tier configuration: {expected}"));
    }
}

#[test]
fn limits_of_valid_configurations_build() {
    let t = RateTier::builder()
        .tier("x".repeat(255), [Quota::per_second(1); 4])
        .tier("e", [Quota::unlimited(), Quota::unlimited()])
        .namespace("n".repeat(255))
        .default_tier("e")
        .try_build()
        .unwrap();
    assert_eq!(t.quotas(&"x".repeat(255)).as_deref().map(<[Quota]>::len), Some(4));
    assert_eq!(t.quotas("e").as_deref(), Some(&[Quota::unlimited()][..]));
    assert_eq!(t.default_tier().as_deref(), Some("e"));
}

// ------------------------------------------------------------ backwards clock

#[test]
fn a_backwards_clock_never_locks_out_for_longer_than_one_full_refill() {
    let clock = FakeClock::new();
    clock.advance(Duration::from_secs(86_400));
    let t = tiers(&clock, Quota::per_second(10)); // refill: 1 s
    admit(&t, "ada", 10);

    // The clock is stepped back an hour.
    clock.rewind(Duration::from_secs(3_600));
    let denied = deny(&t, "ada", 1);
    assert_eq!(denied.retry_after, 100 * MS);
    assert_eq!(denied.reset_after, Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    admit(&t, "ada", 10);
    deny(&t, "ada", 1);

    // With a day-long refill, the lock-out is one day, not a day and an hour.
    let t = tiers(&clock, Quota::per_day(1));
    admit(&t, "bob", 1);
    clock.rewind(Duration::from_secs(3_600));
    let denied = deny(&t, "bob", 1);
    assert_eq!(denied.retry_after, Duration::from_secs(86_400));
    clock.advance(Duration::from_secs(86_400) - NS);
    deny(&t, "bob", 1);
    clock.advance(NS);
    admit(&t, "bob", 1);

    // Forward and back again: a partly used bucket keeps what it had, at most.
    let t = tiers(&clock, Quota::per_minute(6)); // 10 s each
    admit(&t, "cy", 2); // 20 s used
    clock.rewind(Duration::from_secs(30)); // now 50 s used: 1 left
    assert_eq!(admit(&t, "cy", 0).remaining, 1);
    clock.advance(Duration::from_secs(60));
    assert_eq!(admit(&t, "cy", 0).remaining, 6);
}

// ------------------------------------------------------- GC and the key cap

#[test]
fn sweep_removes_exactly_the_expired_keys() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let t = RateTier::builder()
        .tier("free", Quota::per_second(10))
        .tier("pro", [Quota::per_second(10), Quota::per_minute(60)])
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    admit(&t, "full", 10); // expires after 1 s
    admit(&t, "one", 1); // after 100 ms
    ready(t.check("multi", "pro", 1)).unwrap().unwrap(); // after 1 s (the minute band)
    assert_eq!(storage.len(), 3);

    clock.advance(100 * MS - NS);
    assert_eq!(storage.sweep(), 0);
    clock.advance(NS);
    assert_eq!(storage.sweep(), 1);
    assert_eq!(storage.len(), 2);

    clock.advance(900 * MS - NS);
    assert_eq!(storage.sweep(), 0);
    clock.advance(NS);
    assert_eq!(storage.sweep(), 2);
    assert!(storage.is_empty());
    // A swept key starts fresh, exactly as it would have anyway.
    assert_eq!(admit(&t, "full", 0).remaining, 10);
}

#[test]
fn forty_tiers_on_one_storage_keep_apart_and_are_swept() {
    // Many tiers (and so many scopes) on one storage: every tier counts
    // its own users, and a sweep reaches every one of them.
    let clock = FakeClock::new();
    let storage = MemoryStorage::new();
    let mut builder = RateTier::builder().clock(clock.clone()).storage(storage.clone());
    for i in 0..40u32 {
        builder = builder.tier(format!("t{i}"), Quota::per_second(i + 1));
    }
    let t = builder.build();
    for i in 0..40u32 {
        let tier = format!("t{i}");
        for _ in 0..=i {
            ready(t.check("ada", &tier, 1)).unwrap().unwrap();
        }
        let denied = ready(t.check("ada", &tier, 1)).unwrap().unwrap_err();
        assert_eq!(denied.limit, i + 1, "tier {tier}");
    }
    assert_eq!(storage.len(), 40);
    // every key is full again within 1 s and a few ns (intervals round up)
    clock.advance(1_001 * MS);
    assert_eq!(storage.sweep(), 40);
    assert!(storage.is_empty());
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn background_gc_removes_expired_keys_and_stops_with_the_storage() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder()
        .gc_interval(Duration::from_millis(20))
        .build();
    let t = tiers_on(&clock, &storage, Quota::per_minute(60));
    for i in 0..100 {
        t.check(&format!("user-{i}"), "free", 1 + i % 5)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(storage.len(), 100);
    let metrics = tokio::runtime::Handle::current().metrics();
    assert_eq!(metrics.num_alive_tasks(), 1, "one GC task");

    // Live keys survive several GC passes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(storage.len(), 100);

    clock.advance(Duration::from_secs(4)); // keys of cost <= 4 expire
    wait_until("the GC removed 80 keys", || storage.len() == 20).await;
    clock.advance(Duration::from_secs(1));
    wait_until("the GC removed every key", || storage.is_empty()).await;

    drop(t);
    drop(storage);
    wait_until("the GC task ended", || metrics.num_alive_tasks() == 0).await;
}

#[test]
fn key_cap_shares_one_bucket_between_new_keys_keeps_existing_ones_exact_and_reclaims_expired_first() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder().max_keys(3).build();
    let t = RateTier::builder()
        .tier("free", Quota::per_second(10)) // 100 ms each, 1 s refill
        .tier("pro", [Quota::per_second(10), Quota::per_minute(600)])
        .clock(clock.clone())
        .storage(storage.clone())
        .build();
    // at the cap, a new key is decided in its tier's overflow bucket
    let full = |user: &str, tier: &str| match ready(t.check(user, tier, 1)) {
        Ok(Ok(info)) => assert_eq!(info.source(), DecisionSource::Overflow, "{user}"),
        other => panic!("expected {user} to be decided in the overflow bucket, got {other:?}"),
    };

    admit(&t, "a", 10); // expires at +1 s
    admit(&t, "b", 3); // expires at +300 ms
    clock.advance(500 * MS);
    ready(t.check("c", "pro", 10)).unwrap().unwrap(); // expires at +1.5 s
    assert_eq!(storage.len(), 3);

    // At the cap, the expired key ("b") is reclaimed first: "d" gets in.
    admit(&t, "d", 10); // expires at +1.5 s
    assert_eq!(storage.len(), 3);
    // Nothing else has expired: new keys share their tier's overflow bucket,
    // single- and multi-band, one quota for all of them.
    full("e", "free");
    full("e", "pro");
    for user in ["x", "y", "z"] {
        full(user, "free");
    }
    assert_eq!(storage.len(), 3);
    // four of the overflow bucket's ten units are spent
    let shared = ready(t.check("w", "free", 7)).unwrap().unwrap_err();
    assert_eq!((shared.remaining, shared.source()), (6, DecisionSource::Overflow));
    // existing keys are decided in their own buckets
    assert_eq!(admit(&t, "a", 0).source(), DecisionSource::Storage);
    // A peek on a new key stores nothing and works at the cap.
    assert_eq!(admit(&t, "e", 0).remaining, 10);

    // Existing keys keep their exact quotas at the cap.
    assert_eq!(admit(&t, "a", 0).remaining, 5);
    admit(&t, "a", 5);
    assert_eq!(deny(&t, "a", 1).retry_after, 100 * MS);
    assert_eq!(peek_bands_in(&t, "c", "pro"), [0, 590]);
    ready(t.check("c", "pro", 1)).unwrap().unwrap_err();
    deny(&t, "d", 1);
    // A refused key was not charged or stored.
    assert_eq!(admit(&t, "e", 0).remaining, 10);

    // Once the clock passes their expiry, the old keys make room.
    clock.advance(Duration::from_secs(1));
    let info = admit(&t, "e", 4);
    assert_eq!(info.remaining, 6);
    assert_eq!(storage.len(), 1);
    for user in ["f", "g"] {
        admit(&t, user, 1);
    }
    full("h", "free");
    assert_eq!(storage.len(), 3);
}

#[test]
fn key_cap_after_a_backwards_clock_still_reclaims_expired_keys() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder().max_keys(2).build();
    let t = tiers_on(&clock, &storage, Quota::per_second(10));
    admit(&t, "a", 10);
    admit(&t, "b", 10);
    assert_eq!(admit(&t, "c", 1).source(), DecisionSource::Overflow);

    // The clock is stepped back 10 s; both users come back: they are limited
    // for one full refill (1 s), not 11 s.
    clock.rewind(Duration::from_secs(10));
    assert_eq!(deny(&t, "a", 1).retry_after, 100 * MS);
    assert_eq!(admit(&t, "b", 0).remaining, 0);
    clock.advance(Duration::from_secs(1));
    // Their keys have expired in the new timeline: "c" takes a slot.
    assert_eq!(admit(&t, "c", 1).remaining, 9);
    assert_eq!(storage.len(), 1);
    admit(&t, "a", 10);
}

// ------------------------------------------------------- runtime independence

#[test]
fn build_outside_a_runtime_then_check_anywhere() {
    let clock = FakeClock::new();
    let storage = MemoryStorage::builder()
        .gc_interval(Duration::from_millis(20))
        .build();
    // Neither build nor check needs a runtime.
    let t = tiers_on(&clock, &storage, Quota::per_second(10));
    assert_eq!(admit(&t, "ada", 1).remaining, 9);

    // In a first runtime, the GC starts with the first check.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let info = t.check("ada", "free", 1).await.unwrap().unwrap();
        assert_eq!(info.remaining, 8);
        clock.advance(Duration::from_secs(1));
        wait_until("the GC swept", || storage.is_empty()).await;
    });
    drop(rt);

    // A runtime that went away does not leave the storage without GC.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(t.check("bob", "free", 1).await.unwrap().unwrap().remaining, 9);
        assert_eq!(storage.len(), 1);
        clock.advance(Duration::from_secs(1));
        wait_until("the GC swept in the second runtime", || storage.is_empty()).await;
    });
}

// -------------------------------------------------------------- concurrency

/// 8 tasks on 8 worker threads, 10,000 checks each, on one key with a frozen
/// clock. Returns the `remaining` value of every admitted check.
fn hammer(t: &RateTier) -> Vec<u32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let t = t.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut admitted = Vec::new();
                    for _ in 0..10_000 {
                        match t.check("hot", "free", 1).await {
                            Ok(Ok(info)) => admitted.push(info.remaining),
                            Ok(Err(_)) => {}
                            Err(e) => panic!("check failed: {e}"),
                        }
                    }
                    admitted
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all.sort_unstable();
        all
    })
}

#[test]
fn eight_threads_on_one_key_admit_exactly_the_burst() {
    let clock = FakeClock::new();
    let t = tiers(&clock, Quota::per_hour(1_000));
    let admitted = hammer(&t);
    // Exactly the burst, and each admitted check saw a distinct state.
    assert_eq!(admitted, (0..1_000).collect::<Vec<u32>>());
    assert_eq!(admit(&t, "hot", 0).remaining, 0);
}

#[test]
fn eight_threads_on_one_multi_band_key_admit_exactly_the_smallest_burst() {
    let clock = FakeClock::new();
    let t = tiers(&clock, [Quota::per_minute(600), Quota::per_hour(250)]);
    let admitted = hammer(&t);
    assert_eq!(admitted, (0..250).collect::<Vec<u32>>());
    // The 79,750 denied checks charged neither band.
    assert_eq!(peek_bands(&t, "hot"), [350, 0]);
}
