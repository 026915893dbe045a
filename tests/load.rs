//! Exactness under load on the in-memory storage: 64 tasks on a
//! multi-threaded runtime hammer one shared key and one key each with cost-1
//! checks for a bounded time. The full-length run is
//! `cargo run --release -p tower-rate-tier-tests --example exactness`.

use std::time::Duration;

use tower_rate_tier::clock::{FakeClock, SystemClock};
use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::exactness::{self, Hammer};

const HAMMER: Hammer = Hammer {
    tasks: 64,
    run_for: Duration::from_millis(400),
    min_attempts: 200,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_clock_admits_exactly_the_quota_of_every_key() {
    let (shared, own) = (Quota::per_hour(1_000), Quota::per_hour(50));
    let tiers = exactness::tiers(
        RateTier::builder()
            .clock(FakeClock::new())
            .storage(MemoryStorage::new()),
        shared,
        own,
    );
    let report = exactness::run(&tiers, HAMMER).await;
    println!(
        "frozen clock: {} checks in {:?}; shared key {} of {} admitted",
        report.total_attempts(),
        report.elapsed,
        report.shared.admitted,
        report.shared.attempts
    );
    assert_eq!(report.shared.errors, 0);
    // every quota was tried well past its end ...
    assert!(report.shared.attempts >= 64 * 200);
    assert_eq!(report.shared.admitted, 1_000);
    assert_eq!(report.own.len(), 64);
    for key in &report.own {
        assert!(key.attempts >= 200, "{key:?}");
        // ... and admitted exactly
        assert_eq!((key.admitted, key.errors), (50, 0), "{key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_time_admits_burst_plus_elapsed_over_interval_never_more() {
    // 1 ms per token; a full refill (B · I) takes 500 ms for both tiers.
    let shared = Quota::per_second(1_000).with_burst(500);
    let own = Quota::per_second(100).with_burst(50);
    let tiers = exactness::tiers(
        RateTier::builder()
            .clock(SystemClock)
            .storage(MemoryStorage::new()),
        shared,
        own,
    );
    let report = exactness::run(&tiers, HAMMER).await;
    let rows = exactness::real_time_rows(&report, &shared, &own);
    let worst = rows.iter().map(|r| r.shortfall).max().unwrap_or(0);
    println!(
        "real time: {} checks in {:?}; shared key admitted {} + {} left at the end, bound {} over {:?}; worst shortfall {worst}",
        report.total_attempts(),
        report.elapsed,
        rows[0].admitted,
        rows[0].left,
        rows[0].bound,
        report.shared.span()
    );
    assert!(report.shared.span() >= Duration::from_millis(300));
    // the refill part of the bound is a real part of it
    assert!(rows[0].bound >= 500 + 300, "{rows:?}");
    for row in &rows {
        // never more than B + span / I (nor more tokens than that in all)
        assert!(row.admitted + row.left <= row.bound, "{row:?}");
        // and what was not admitted is still in the bucket, but for what a
        // bucket sitting full loses
        assert!(row.shortfall <= exactness::margin(row.bound), "{row:?}");
    }
    assert_eq!(report.shared.errors, 0);
    assert!(report.own.iter().all(|k| k.errors == 0));
}

/// A clock that, on the first reading made by the thread named `stale`,
/// hands out the time and then stalls that thread (until released, at most
/// 2 s) before returning it: a thread descheduled between reading the clock
/// and deciding, as happens under load.
#[derive(Debug, Clone)]
struct StallingClock {
    time: FakeClock,
    read: std::sync::Arc<std::sync::Barrier>,
    release: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl tower_rate_tier::clock::Clock for StallingClock {
    fn now(&self) -> u64 {
        let now = self.time.now();
        let stale = std::thread::current().name() == Some("stale");
        if stale && !self.stalled.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.read.wait();
            let (lock, cvar) = &*self.release;
            let released = lock.lock().unwrap();
            let _ = cvar
                .wait_timeout_while(released, Duration::from_secs(2), |r| !*r)
                .unwrap();
        }
        now
    }
}

/// A decision made with a clock reading older than the key's last decision
/// (its thread was descheduled in between) must not give back what that
/// later decision charged. The backwards-clock clamp once took such a stale
/// reading for a clock jump and reset the key to `stale + τ`, which let a
/// shared key admit hundreds above `B + span / I` under 64 tasks.
#[test]
fn a_stale_clock_reading_never_refunds_later_charges() {
    for bands in [
        vec![Quota::per_second(100)],
        vec![Quota::per_second(100), Quota::per_hour(10_000)],
    ] {
        let clock = StallingClock {
            time: FakeClock::new(),
            read: std::sync::Arc::new(std::sync::Barrier::new(2)),
            release: Default::default(),
            stalled: Default::default(),
        };
        let tiers = RateTier::builder()
            .tier("t", bands.clone())
            .clock(clock.clone())
            .storage(MemoryStorage::new())
            .build();
        let check = |tiers: &RateTier| {
            let mut f = std::pin::pin!(tiers.check("k", "t", 1));
            match f
                .as_mut()
                .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
            {
                std::task::Poll::Ready(r) => r.unwrap().is_ok(),
                std::task::Poll::Pending => unreachable!("memory storage decides at once"),
            }
        };
        // empty the burst at T
        let admitted = (0..150).filter(|_| check(&tiers)).count();
        assert_eq!(admitted, 100);
        // a request reads T, then stalls
        let stale = {
            let tiers = tiers.clone();
            std::thread::Builder::new()
                .name("stale".into())
                .spawn(move || check(&tiers))
                .unwrap()
        };
        clock.read.wait();
        // meanwhile 500 ms pass and others spend what refilled
        clock.time.advance(Duration::from_millis(500));
        let later = (0..100).filter(|_| check(&tiers)).count();
        assert_eq!(later, 50, "{bands:?}");
        {
            let (lock, cvar) = &*clock.release;
            *lock.lock().unwrap() = true;
            cvar.notify_all();
        }
        assert!(!stale.join().unwrap(), "the stale request found the key empty");
        // B + 500 ms / 10 ms = 150 admitted in the span; nothing more now
        assert!(
            !check(&tiers),
            "a stale reading gave back spent quota ({bands:?})"
        );
    }
}
