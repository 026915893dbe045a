//! The fallback around a primary that fails on demand.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use super::*;
use crate::clock::FakeClock;
use crate::storage::DecisionSource;

/// A primary (in memory) that fails with `kind` for users starting with
/// one of `failing` prefixes; counts the calls it gets.
#[derive(Debug, Clone, Default)]
struct Flaky {
    memory: MemoryStorage,
    failing: Arc<Mutex<Vec<&'static str>>>,
    other_error: Arc<AtomicBool>,
    /// Peeks are answered, charges refused (a server that refuses writes).
    read_only: Arc<AtomicBool>,
    /// Every call waits for ever.
    hang: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn fail(&self, prefixes: &[&'static str]) {
        *self.failing.lock().unwrap() = prefixes.to_vec();
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Storage for Flaky {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            return Decide::pending(std::future::pending());
        }
        if self.read_only.load(Ordering::SeqCst) && op != Op::Charge(0) {
            return Decide::ready(Err(StorageError::new(StorageErrorKind::Other, "READONLY")));
        }
        if self
            .failing
            .lock()
            .unwrap()
            .iter()
            .any(|p| key.user.starts_with(p))
        {
            let kind = if self.other_error.load(Ordering::SeqCst) {
                StorageErrorKind::Other
            } else {
                StorageErrorKind::Unavailable
            };
            return Decide::ready(Err(StorageError::new(kind, "down")));
        }
        self.memory.decide(key, bands, op, clock)
    }
}

fn decide<S: Storage>(
    storage: &S,
    user: &str,
    bands: &[Quota],
    cost: u32,
    clock: &FakeClock,
) -> Result<Decision, StorageError> {
    let key = StorageKey {
        namespace: "",
        tier: "t",
        user,
    };
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    match storage.decide(key, bands, Op::Charge(cost), &clock).into_ready() {
        Ok(result) => result,
        Err(_) => panic!("not ready"),
    }
}

#[test]
fn bands_scale_to_the_share_rounding_bursts_up() {
    let q = scale(&Quota::per_hour(10), 0.25);
    assert_eq!(q.burst(), 3);
    assert_eq!(
        q.emission_interval_nanos(),
        4 * Quota::per_hour(10).emission_interval_nanos()
    );
    assert_eq!(scale(&Quota::per_minute(3), 0.01).burst(), 1);
    assert_eq!(scale(&Quota::per_second(5), 1.0), Quota::per_second(5));
    assert!(scale(&Quota::unlimited(), 0.5).is_unlimited());
    // the refill window stays about the same
    let before = Quota::per_day(1_000).refill_nanos();
    let after = scale(&Quota::per_day(1_000), 1.0 / 3.0).refill_nanos();
    assert!(
        after >= before && after - before < before / 100,
        "{before} {after}"
    );
}

#[test]
fn it_switches_after_consecutive_failures_probes_and_returns() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let switches = Arc::new(Mutex::new(Vec::new()));
    let seen = switches.clone();
    let storage = Fallback::builder(primary.clone())
        .instances(4)
        .failures_to_switch(3)
        .probe_interval(Duration::from_secs(2))
        .on_switch(move |local| seen.lock().unwrap().push(local))
        .build();
    let bands = [Quota::per_minute(40)];
    assert_eq!(
        decide(&storage, "ada", &bands, 1, &clock).unwrap().source,
        DecisionSource::Storage
    );
    primary.fail(&[""]);
    // two failures: answered locally, still trying the primary
    for n in 2..4 {
        let d = decide(&storage, "ada", &bands, 1, &clock).unwrap();
        assert_eq!(d.source, DecisionSource::Fallback);
        assert_eq!(primary.calls(), n);
        assert!(!storage.is_local());
    }
    // the third switches
    decide(&storage, "ada", &bands, 1, &clock).unwrap();
    assert!(storage.is_local());
    assert_eq!(*switches.lock().unwrap(), [true]);
    // from then on, no call until a probe is due; the share is a quarter
    // (burst 10), of which 3 are spent
    let mut admitted = 0;
    for _ in 0..20 {
        let d = decide(&storage, "ada", &bands, 1, &clock).unwrap();
        assert_eq!(d.source, DecisionSource::Fallback);
        admitted += u32::from(d.allowed);
    }
    assert_eq!((admitted, primary.calls()), (7, 4));
    // a probe after the interval: still down, answered locally
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        decide(&storage, "ada", &bands, 1, &clock).unwrap().source,
        DecisionSource::Fallback
    );
    assert_eq!(primary.calls(), 5);
    decide(&storage, "ada", &bands, 1, &clock).unwrap();
    assert_eq!(primary.calls(), 5);
    // back up: the next probe's answer is the primary's, and so are all
    // the later ones
    primary.fail(&[]);
    clock.advance(Duration::from_secs(2));
    let back = decide(&storage, "ada", &bands, 1, &clock).unwrap();
    // (the primary had one charge, refilled since)
    assert_eq!(
        (back.source, back.bands[0].remaining),
        (DecisionSource::Storage, 39)
    );
    assert!(!storage.is_local());
    assert_eq!(*switches.lock().unwrap(), [true, false]);
    // a new outage right after the recovery continues the last one's local
    // state, which "ada" had spent: a flapping primary hands out no fresh
    // share
    primary.fail(&[""]);
    let again = decide(&storage, "ada", &bands, 1, &clock).unwrap();
    assert_eq!(
        (again.source, again.allowed, again.bands[0].remaining),
        (DecisionSource::Fallback, false, 0)
    );
    // one that starts longer than `continue_within` after the last one
    // ended starts from a fresh local state
    primary.fail(&[]);
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        decide(&storage, "ada", &bands, 1, &clock).unwrap().source,
        DecisionSource::Storage
    );
    assert!(!storage.is_local());
    clock.advance(DEFAULT_CONTINUE_WITHIN);
    primary.fail(&[""]);
    let fresh = decide(&storage, "ada", &bands, 1, &clock).unwrap();
    assert_eq!(
        (fresh.source, fresh.bands[0].remaining),
        (DecisionSource::Fallback, 9)
    );
}

const BANDS: [Quota; 1] = [Quota::per_minute(40)];

/// A fallback around `primary` (a share of 1/4) that switched at its first
/// failure, a failure of "ada"'s.
fn switched_at_once(primary: &Flaky, probe_every: Duration, clock: &FakeClock) -> Fallback<Flaky> {
    let storage = Fallback::builder(primary.clone())
        .instances(4)
        .failures_to_switch(1)
        .probe_interval(probe_every)
        .build();
    primary.fail(&[""]);
    decide(&storage, "ada", &BANDS, 1, clock).unwrap();
    assert!(storage.is_local());
    storage
}

/// Moves `clock` on by `by` and decides for "ada" (`cost`), answered
/// locally; then lets a probe that decision sent run.
async fn after(by: Duration, storage: &Fallback<Flaky>, clock: &FakeClock, cost: u32) {
    clock.advance(by);
    let d = decide(storage, "ada", &BANDS, cost, clock).unwrap();
    assert_eq!(d.source, DecisionSource::Fallback);
    tokio::task::yield_now().await;
}

#[tokio::test(flavor = "current_thread")]
async fn in_a_runtime_probes_run_in_the_background_and_no_decision_waits() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let every = Duration::from_secs(2);
    let storage = switched_at_once(&primary, every, &clock);
    assert_eq!(primary.calls(), 1);
    // a probe is due: the decision is answered locally, the probe (a peek)
    // goes to the primary beside it, and fails
    after(every, &storage, &clock, 1).await;
    assert_eq!(primary.calls(), 2);
    assert!(storage.is_local());
    // back up: the decision that makes the next probe due is still answered
    // locally; once the probe has been answered, the next decision is the
    // primary's (which the peek charged nothing), and so are the later ones
    primary.fail(&[]);
    after(every, &storage, &clock, 1).await;
    let back = decide(&storage, "ada", &BANDS, 1, &clock).unwrap();
    assert_eq!(
        (back.source, back.bands[0].remaining, primary.calls()),
        (DecisionSource::Storage, 39, 4)
    );
    assert!(!storage.is_local());
}

#[tokio::test(flavor = "current_thread")]
async fn a_primary_that_answers_peeks_but_refuses_charges_is_not_back() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let every = Duration::from_secs(2);
    let storage = switched_at_once(&primary, every, &clock);
    // the server answers again, but refuses writes: the probe (a peek)
    // passes, the trial charge does not, and is answered locally
    primary.fail(&[]);
    primary.read_only.store(true, Ordering::SeqCst);
    for round in 0..3 {
        after(every, &storage, &clock, 1).await;
        let trial = decide(&storage, "ada", &BANDS, 1, &clock).unwrap();
        assert_eq!(trial.source, DecisionSource::Fallback, "round {round}");
        assert!(storage.is_local());
    }
    // writes accepted again: the next probe and trial bring it back
    primary.read_only.store(false, Ordering::SeqCst);
    after(every, &storage, &clock, 1).await;
    let back = decide(&storage, "ada", &BANDS, 1, &clock).unwrap();
    assert_eq!(back.source, DecisionSource::Storage);
    assert!(!storage.is_local());
}

#[tokio::test(flavor = "current_thread")]
async fn one_probe_at_a_time_however_long_the_primary_hangs() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let every = Duration::from_millis(100);
    let storage = switched_at_once(&primary, every, &clock);
    primary.hang.store(true, Ordering::SeqCst);
    for _ in 0..9 {
        after(every, &storage, &clock, 0).await;
    }
    // the switch, then one probe that has not ended after nine intervals
    assert_eq!(primary.calls(), 2);
}

#[test]
fn a_probe_whose_task_never_runs_gives_way_to_a_trial() {
    // A runtime entered but never driven: the probe's task never runs.
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let _entered = runtime.enter();
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let every = Duration::from_secs(1);
    let storage = switched_at_once(&primary, every, &clock);
    primary.fail(&[]);
    // the first probe is sent, then nine intervals pass without it
    for _ in 0..10 {
        clock.advance(every);
        let d = decide(&storage, "ada", &BANDS, 1, &clock).unwrap();
        assert_eq!(d.source, DecisionSource::Fallback);
    }
    assert_eq!(primary.calls(), 2);
    // ten intervals after it was sent, the decision then due is the trial
    clock.advance(every);
    let d = decide(&storage, "ada", &BANDS, 1, &clock).unwrap();
    assert_eq!(d.source, DecisionSource::Storage);
    assert!(!storage.is_local());
}

#[test]
fn every_outage_reuses_the_local_scopes_and_its_keys_are_swept() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let storage = Fallback::builder(primary.clone())
        .failures_to_switch(1)
        .probe_interval(Duration::from_secs(1))
        .continue_within(Duration::ZERO)
        .build();
    let bands = [Quota::per_second(10)];
    for _ in 0..20 {
        // an outage, answered locally, then the primary back
        primary.fail(&[""]);
        decide(&storage, "ada", &bands, 1, &clock).unwrap();
        primary.fail(&[]);
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            decide(&storage, "ada", &bands, 1, &clock).unwrap().source,
            DecisionSource::Storage
        );
    }
    let local = &storage.shared.local;
    assert_eq!(local.scope_count(), 1);
    assert_eq!(local.len(), 20);
    clock.advance(Duration::from_secs(10));
    assert_eq!(local.sweep(), 20);
}

#[test]
fn a_success_resets_the_count_and_other_errors_pass_through() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let storage = Fallback::builder(primary.clone()).failures_to_switch(3).build();
    let bands = [Quota::per_minute(40)];
    for _ in 0..5 {
        primary.fail(&[""]);
        decide(&storage, "bob", &bands, 1, &clock).unwrap();
        decide(&storage, "bob", &bands, 1, &clock).unwrap();
        primary.fail(&[]);
        decide(&storage, "bob", &bands, 1, &clock).unwrap();
    }
    assert!(!storage.is_local());
    assert_eq!(primary.calls(), 15);
    primary.fail(&[""]);
    primary.other_error.store(true, Ordering::SeqCst);
    let err = decide(&storage, "bob", &bands, 1, &clock).unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Other);
}

#[test]
fn one_failing_domain_leaves_the_others_on_the_primary() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let switches = Arc::new(AtomicUsize::new(0));
    let seen = switches.clone();
    let storage = Fallback::builder(primary.clone())
        .failures_to_switch(2)
        .domains(|key| u64::from(key.user.as_bytes().first().copied().unwrap_or(0)))
        .on_switch(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
        .build();
    let bands = [Quota::per_minute(40)];
    primary.fail(&["a"]);
    for i in 0..20 {
        let failing = decide(&storage, &format!("a{i}"), &bands, 1, &clock).unwrap();
        let healthy = decide(&storage, &format!("b{i}"), &bands, 1, &clock).unwrap();
        assert_eq!(failing.source, DecisionSource::Fallback);
        assert_eq!(healthy.source, DecisionSource::Storage, "{i}");
    }
    assert!(storage.is_local());
    // the failing domain stopped calling after two failures: 2 + 20 calls
    assert_eq!(primary.calls(), 22);
    assert_eq!(switches.load(Ordering::SeqCst), 1);
}

#[test]
fn a_cost_above_the_scaled_burst_takes_the_share_whole_and_its_denials_wait_what_they_say() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    primary.fail(&[""]);
    let storage = Fallback::builder(primary).instances(4).build();
    let bands = [Quota::per_minute(100)];
    // the share's burst is 25: 30 takes the share whole once it is full
    let all = decide(&storage, "cy", &bands, 30, &clock).unwrap();
    assert!(all.allowed);
    assert_eq!(all.bands[0].remaining, 0);
    // then it is denied (the limiter answers 429) and charges nothing, and
    // its wait comes true (a 403, or a 429 for as long as the outage lasts,
    // would be the share's wrong answer)
    let denied = decide(&storage, "cy", &bands, 30, &clock).unwrap();
    assert!(!denied.allowed);
    assert!(denied.bands[0].retry_after_ns > 0);
    clock.advance(Duration::from_nanos(denied.bands[0].retry_after_ns));
    assert!(decide(&storage, "cy", &bands, 30, &clock).unwrap().allowed);
    // a cost above the tier's own burst stays above it: denied, as the
    // primary would
    assert!(!decide(&storage, "dee", &bands, 101, &clock).unwrap().allowed);
}

/// Counts the fallback's warnings and info events.
struct Events(Arc<Mutex<Vec<tracing::Level>>>);

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if meta.module_path() == Some("tower_rate_tier::storage::fallback")
            && *meta.level() <= tracing::Level::INFO
        {
            self.0.lock().unwrap().push(*meta.level());
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn each_switch_is_logged_once() {
    let clock = FakeClock::new();
    let primary = Flaky::default();
    let storage = Fallback::builder(primary.clone())
        .failures_to_switch(2)
        .probe_interval(Duration::from_secs(1))
        .build();
    let bands = [Quota::per_minute(40)];
    let seen = Arc::new(Mutex::new(Vec::new()));
    let scope = crate::warnings_for_tests::scoped(Events(seen.clone()));
    primary.fail(&[""]);
    for _ in 0..10 {
        decide(&storage, "dee", &bands, 1, &clock).unwrap();
    }
    primary.fail(&[]);
    clock.advance(Duration::from_secs(1));
    for _ in 0..10 {
        decide(&storage, "dee", &bands, 1, &clock).unwrap();
    }
    drop(scope);
    assert_eq!(
        *seen.lock().unwrap(),
        [tracing::Level::WARN, tracing::Level::INFO]
    );
}

mod flaps;
mod prepared;

#[test]
fn amounts_per_band_are_answered_locally_with_scaled_bands_and_debt_bounds() {
    use crate::storage::{Amount, Amounts};
    let clock = FakeClock::new();
    let clock_dyn: Arc<dyn Clock> = Arc::new(clock.clone());
    let primary = Flaky::default();
    let storage = Fallback::builder(primary.clone()).instances(2).build();
    primary.fail(&[""]);
    // requests 10/s; tokens 20/s with 10 of debt: locally 5/s, and 10/s
    // with 5 of debt
    let bands = [Quota::per_second(10), Quota::per_second(20)];
    let key = StorageKey {
        namespace: "",
        tier: "t",
        user: "ada",
    };
    let run = |op: Op| match storage.decide(key, &bands, op, &clock_dyn).into_ready() {
        Ok(Ok(d)) => d,
        other => panic!("{other:?}"),
    };
    let force = Op::Each(
        Amounts::new()
            .with(Amount::Charge(0))
            .with_debt(Amount::Force(30), 10),
    );
    let d = run(force);
    assert_eq!(d.source, DecisionSource::Fallback);
    // 10 units and 5 of debt taken, 15 forgiven; the debt is 5 local units
    assert_eq!((d.bands[1].forgiven, d.bands[1].debt_ns), (15, 500_000_000));
    let admit = Op::Each(
        Amounts::new()
            .with(Amount::Charge(1))
            .with_debt(Amount::Require, 10),
    );
    let d = run(admit);
    assert!(!d.allowed);
    assert_eq!(d.bands[0].remaining, 5);
    assert_eq!(d.bands[1].retry_after_ns, 600_000_000);
    clock.advance(Duration::from_millis(600));
    let d = run(admit);
    assert!(d.allowed);
    assert_eq!((d.source, d.bands[0].remaining), (DecisionSource::Fallback, 4));
}
