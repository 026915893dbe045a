//! The GCRA's arithmetic, band by band.

use super::*;

const S: u64 = 1_000_000_000;

/// Decides and stores as a storage does: whatever `new_tat` says.
fn run(q: &Quota, tat: &mut Option<Nanos>, now: Nanos, cost: u32) -> bool {
    let d = decide(*tat, now, q, cost);
    if let Some(t) = d.new_tat {
        *tat = Some(t);
    }
    d.allowed
}

#[test]
fn burst_then_deny_then_exact_refill() {
    let q = Quota::per_minute(10); // one every 6 s
    let mut tat = None;
    let now = 1_000 * S;
    for i in 0..10 {
        let d = decide(tat, now, &q, 1);
        assert!(d.allowed, "request {i}");
        assert_eq!(d.state.remaining, 9 - i);
        tat = d.new_tat;
    }
    let denied = decide(tat, now, &q, 1);
    assert!(!denied.allowed);
    assert_eq!(denied.state.retry_after_ns, 6 * S);
    assert_eq!(denied.state.reset_after_ns, 60 * S);
    // one nanosecond too early
    assert!(!run(&q, &mut tat, now + 6 * S - 1, 1));
    assert!(run(&q, &mut tat, now + 6 * S, 1));
    assert!(!run(&q, &mut tat, now + 6 * S, 1));
}

#[test]
fn more_quota_is_one_interval_away_at_most() {
    let q = Quota::per_minute(5); // one every 12 s
    let mut tat = None;
    for i in 0..5 {
        let d = decide(tat, 0, &q, 1);
        assert!(d.allowed);
        assert_eq!(d.state.more_after_ns, 12 * S, "request {i}");
        tat = d.new_tat;
    }
    // 5 s later, spent: the next unit is 7 s away, the denial as long
    let d = decide(tat, 5 * S, &q, 1);
    assert!(!d.allowed);
    assert_eq!((d.state.more_after_ns, d.state.retry_after_ns), (7 * S, 7 * S));
    // a cost of 3 fits 31 s later
    assert_eq!(decide(tat, 5 * S, &q, 3).state.retry_after_ns, 31 * S);
    // a full band has nothing more to give
    assert_eq!(decide(None, 0, &q, 0).state.more_after_ns, 0);
    assert_eq!(decide(tat, 60 * S, &q, 0).state.more_after_ns, 0);
    // a peek reports the same
    assert_eq!(decide(tat, 5 * S, &q, 0).state.more_after_ns, 7 * S);
}

#[test]
fn cost_n_and_peek() {
    let q = Quota::per_second(10);
    let mut tat = None;
    assert!(run(&q, &mut tat, 0, 7));
    let peek = decide(tat, 0, &q, 0);
    assert!(peek.allowed);
    assert_eq!(peek.new_tat, None);
    assert_eq!(peek.state.remaining, 3);
    assert!(!run(&q, &mut tat, 0, 4));
    assert!(run(&q, &mut tat, 0, 3));
    // peek of an exhausted band is still allowed and reports 0
    assert_eq!(decide(tat, 0, &q, 0).state.remaining, 0);
    assert!(decide(tat, 0, &q, 0).allowed);
}

#[test]
fn cost_above_burst_never_passes() {
    let q = Quota::per_second(5);
    let d = decide(None, 0, &q, 6);
    assert!(!d.allowed);
    assert_eq!(d.state.remaining, 5);
}

#[test]
fn backwards_clock_is_bounded_by_one_refill() {
    let q = Quota::per_second(10);
    let mut tat = None;
    let now = 10_000 * S;
    for _ in 0..10 {
        assert!(run(&q, &mut tat, now, 1));
    }
    // the clock jumps back an hour: still only one full refill away
    let back = now - 3_600 * S;
    let d = decide(tat, back, &q, 1);
    assert!(!d.allowed);
    assert_eq!(d.state.retry_after_ns, S / 10);
    // the denied request writes the clamped TAT back, nothing more
    assert_eq!(d.new_tat, Some(back + S));
    assert!(!run(&q, &mut tat, back, 1));
    assert!(!run(&q, &mut tat, back + S - 1, 10));
    assert!(run(&q, &mut tat, back + S, 10));
    // a peek clamps too
    let mut tat = Some(now + S);
    let peek = decide(tat, back, &q, 0);
    assert_eq!(
        (peek.allowed, peek.new_tat, peek.state.remaining),
        (true, Some(back + S), 0)
    );
    assert!(run(&q, &mut tat, back, 0));
    assert!(run(&q, &mut tat, back + S, 10));
}

#[test]
fn extremes_do_not_overflow() {
    let q = Quota::per_day(1).with_burst(u32::MAX);
    let d = decide(Some(u64::MAX), u64::MAX, &q, u32::MAX);
    assert!(d.allowed);
    assert_eq!(d.new_tat, Some(u64::MAX));
    let d = decide(Some(u64::MAX), u64::MAX - 5, &Quota::per_second(1), u32::MAX);
    assert!(!d.allowed);
    // 5 ns used, u32::MAX seconds asked, 1 s of tolerance
    assert_eq!(d.state.retry_after_ns, 5 + (u64::from(u32::MAX) - 1) * S);
    let q = Quota::per_second(u32::MAX);
    assert!(decide(None, u64::MAX, &q, u32::MAX).allowed);
    // a TAT far in the future is clamped to one refill before refunding
    assert_eq!(refund(Some(u64::MAX), 0, &q, u32::MAX, 0), None);
    assert_eq!(refund(Some(u64::MAX), 0, &q, 1, 0), Some(u64::from(u32::MAX) - 1));
}

#[test]
fn refund_never_below_fresh() {
    let q = Quota::per_second(10);
    let mut tat = None;
    assert!(run(&q, &mut tat, 0, 5));
    let back = refund(tat, 0, &q, 2, 0);
    assert_eq!(decide(back, 0, &q, 0).state.remaining, 7);
    assert_eq!(refund(back, 0, &q, 50, 0), None);
    assert_eq!(refund(None, 0, &q, 1, 0), None);
}

#[test]
fn require_takes_nothing_and_needs_one_unit() {
    let q = Quota::per_second(2); // one every 0.5 s
    let mut tat = None;
    let d = require(tat, 0, &q, 0);
    assert_eq!((d.allowed, d.new_tat, d.state.remaining), (true, None, 2));
    assert!(run(&q, &mut tat, 0, 2));
    let d = require(tat, 0, &q, 0);
    assert!(!d.allowed);
    assert_eq!((d.state.retry_after_ns, d.new_tat), (S / 2, None));
    // where a peek admits
    assert!(decide(tat, 0, &q, 0).allowed);
    assert!(require(tat, S / 2, &q, 0).allowed);
}

#[test]
fn force_goes_into_bounded_debt_and_forgives_the_rest() {
    let q = Quota::per_second(10); // I = 0.1 s, τ = 1 s
    let mut tat = None;
    // 25 units, 10 of debt allowed: 20 taken, 5 forgiven
    let d = force(tat, 0, &q, 25, 10);
    assert!(d.allowed);
    assert_eq!(d.new_tat, Some(2 * S));
    assert_eq!((d.state.remaining, d.state.forgiven, d.state.debt_ns), (0, 5, S));
    assert_eq!(d.state.reset_after_ns, 2 * S);
    // in debt: one unit again after the debt is repaid and one interval
    assert_eq!(d.state.more_after_ns, S + S / 10);
    tat = d.new_tat;
    // without a debt bound a force stops at the tolerance
    let d = force(None, 0, &q, 25, 0);
    assert_eq!((d.new_tat, d.state.forgiven, d.state.debt_ns), (Some(S), 15, 0));
    // a unit charged in part counts as charged: 0.05 s of room, 3 forced
    let d = force(Some(2 * S - S / 20), 0, &q, 3, 10);
    assert_eq!((d.new_tat, d.state.forgiven), (Some(2 * S), 2));
    // a band in debt refuses charges and requirements, with the wait until
    // it can pay
    let d = decide_within(tat, 0, &q, 1, 10);
    assert_eq!(
        (d.allowed, d.state.retry_after_ns, d.new_tat),
        (false, S + S / 10, None)
    );
    let d = require(tat, S / 2, &q, 10);
    assert_eq!((d.allowed, d.state.retry_after_ns), (false, S / 2 + S / 10));
    assert!(require(tat, S + S / 10, &q, 10).allowed);
    // a peek admits and reports the debt
    let d = decide_within(tat, S / 2, &q, 0, 10);
    assert_eq!((d.allowed, d.state.remaining, d.state.debt_ns), (true, 0, S / 2));
    assert_eq!(d.state.more_after_ns, S / 2 + S / 10);
}

#[test]
fn a_debt_is_not_clamped_away_by_later_decisions_on_its_band() {
    let q = Quota::per_second(10);
    let tat = force(None, 0, &q, 20, 10).new_tat;
    assert_eq!(tat, Some(2 * S));
    // with its bound, a charge, a requirement or a peek writes nothing
    for d in [
        decide_within(tat, 0, &q, 1, 10),
        require(tat, 0, &q, 10),
        decide_within(tat, 0, &q, 0, 10),
    ] {
        assert_eq!(d.new_tat, None);
        assert_eq!(d.state.debt_ns, S);
    }
    // a refund starts from the debt
    assert_eq!(refund(tat, 0, &q, 5, 10), Some(2 * S - S / 2));
    // a TAT beyond the debt bound (a clock that went back) is clamped to it
    let d = require(Some(5 * S), 0, &q, 10);
    assert_eq!((d.new_tat, d.state.debt_ns), (Some(2 * S), S));
    // a request band (no debt bound) keeps its clamp at one refill
    let d = decide(tat, 0, &q, 0);
    assert_eq!((d.new_tat, d.state.debt_ns), (Some(S), 0));
    // a force of 0 changes nothing
    assert_eq!(force(tat, 0, &q, 0, 10).new_tat, None);
}

#[test]
fn debt_extremes_do_not_overflow() {
    let q = Quota::per_day(1).with_burst(u32::MAX);
    let d = force(Some(u64::MAX), u64::MAX, &q, u32::MAX, u32::MAX);
    assert!(d.allowed);
    assert_eq!(d.new_tat, Some(u64::MAX));
    let d = force(None, 0, &Quota::per_second(1), u32::MAX, u32::MAX);
    assert_eq!(d.state.forgiven, 0);
    assert_eq!(
        force(None, 0, &Quota::unlimited(), 5, 5),
        decide(None, 0, &Quota::unlimited(), 5)
    );
}

/// The `u64` and `u128` runs of the algorithm, on the same input.
fn both_widths(
    tat: Option<Nanos>,
    now: Nanos,
    q: &Quota,
    take: Take,
    debt: u32,
) -> (BandDecision, BandDecision) {
    (
        band_in::<u64>(tat, now, q, take, debt),
        band_in::<u128>(tat, now, q, take, debt),
    )
}

#[test]
fn a_band_whose_furthest_time_passes_u64_is_decided_in_u128() {
    // a year-long interval, a burst near u32::MAX, a time near the end of u64
    let q = Quota::per_period(1, std::time::Duration::from_secs(365 * 86_400)).with_burst(u32::MAX);
    let now = u64::MAX - S;
    assert!(!fits_u64(now, &q, Take::Charge(1), 0));
    let d = decide(None, now, &q, 1);
    assert!(d.allowed);
    assert_eq!(d.state.remaining, u32::MAX - 1);
    // the TAT saturates rather than wrapping
    assert_eq!(d.new_tat, Some(u64::MAX));
    // a band decided in u64 right below the limit answers as in u128
    let q = Quota::per_second(10);
    let now = u64::MAX - 3 * S;
    assert!(fits_u64(now, &q, Take::Charge(2), 0));
    let (narrow, wide) = both_widths(None, now, &q, Take::Charge(2), 0);
    assert_eq!(narrow, wide);
    assert_eq!(narrow.new_tat, Some(now + 2 * S / 10));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 2_000, failure_persistence: None, ..Default::default() })]

    /// Wherever the furthest time a decision can reach fits in `u64` (when
    /// `band` computes in `u64`), both widths give the same decision: the
    /// clamp of a TAT from the future, debt, forced charges and peeks
    /// included.
    #[test]
    fn u64_decides_as_u128_wherever_it_fits(
        count in 1..=10_000u32,
        period_ns in 1..=10_000_000_000_000u64,
        burst in 1..=1_000_000u32,
        debt in proptest::prop_oneof![proptest::strategy::Just(0u32), 0..=1_000_000u32],
        now in 0..=u64::MAX / 2,
        // none, a time within reach of `now` (a band partly used, or in
        // debt), or any time (mostly far ahead: the clamp)
        tat_kind in 0..3u8,
        ahead in 0..=20_000_000_000_000u64,
        anywhere in proptest::prelude::any::<u64>(),
        take in 0..3u8,
        amount in 0..=2_000_000u32,
    ) {
        let q = Quota::per_period(count, std::time::Duration::from_nanos(period_ns)).with_burst(burst);
        let tat = match tat_kind {
            0 => None,
            1 => Some(now + ahead),
            _ => Some(anywhere),
        };
        let take = match take {
            0 => Take::Charge(amount),
            1 => Take::Require,
            _ => Take::Force(amount),
        };
        if fits_u64(now, &q, take, debt) {
            let (narrow, wide) = both_widths(tat, now, &q, take, debt);
            proptest::prop_assert_eq!(narrow, wide);
        }
    }
}
