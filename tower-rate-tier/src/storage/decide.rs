//! [`decide_bands`]: the GCRA over one key's stored times, for storages
//! that keep the times themselves.

use super::{Amount, BandStates, Decision, MAX_BANDS, Op};
use crate::clock::Nanos;
use crate::gcra::{self, BandDecision};
use crate::quota::Quota;

/// The GCRA over one key's stored times: carries out `op` at `now` on every
/// band, updating `tats` (one per band, `None` for a fresh state) in place,
/// all or nothing. For storages that keep the times themselves.
///
/// When a decision is refused (a charge that does not fit, a requirement
/// that does not hold), nothing is charged, forced or refunded, and every
/// band reports its state unchanged; the only writes left are the clamps of
/// times beyond a band's bound (more than a full refill ahead, plus the
/// band's debt bound: a clock that moved backwards), which bound the
/// lock-out to one refill (and the debt).
///
/// An [`Op::Each`] decides each band by its [`Amount`] with its debt bound
/// (see [`amount`](super::amount)); a band beyond its amounts is peeked.
/// An [`Op::Acquire`] is a charge of its cost here, an [`Op::Release`] a
/// peek: a storage that counts slots does so around this call.
///
/// ```
/// use tower_rate_tier::Quota;
/// use tower_rate_tier::storage::{Op, decide_bands};
///
/// let bands = [Quota::per_second(2)];
/// let mut tats = [None];
/// assert!(decide_bands(&mut tats, 0, &bands, Op::Charge(2)).allowed);
/// let denied = decide_bands(&mut tats, 0, &bands, Op::Charge(1));
/// assert_eq!((denied.allowed, denied.bands[0].retry_after_ns), (false, 500_000_000));
/// decide_bands(&mut tats, 0, &bands, Op::Refund(2));
/// assert_eq!(tats, [None]);
/// ```
#[inline]
pub fn decide_bands(tats: &mut [Option<Nanos>], now: Nanos, bands: &[Quota], op: Op) -> Decision {
    let op = op.on_bands();
    if let ([tat], [quota], Op::Charge(cost)) = (&mut *tats, bands, op) {
        // One band: its decision is the whole decision.
        let d = gcra::decide(*tat, now, quota, cost);
        if d.new_tat.is_some() {
            *tat = d.new_tat;
        }
        return Decision::new(d.allowed, now, d.state.into());
    }
    decide_many(tats, now, bands, op)
}

/// Band `i`'s decision of `amount` with its debt bound `debt`, and its
/// write: `Some(tat)` to store `tat` (`None`: the band is fresh again).
fn decide_one(
    tat: Option<Nanos>,
    now: Nanos,
    quota: &Quota,
    amount: Amount,
    debt: u32,
) -> (BandDecision, Option<Option<Nanos>>) {
    let d = match amount {
        Amount::Charge(cost) => gcra::decide_within(tat, now, quota, cost, debt),
        Amount::Require => gcra::require(tat, now, quota, debt),
        Amount::Force(units) => gcra::force(tat, now, quota, units, debt),
        Amount::Refund(units) => {
            let back = gcra::refund(tat, now, quota, units, debt);
            let state = gcra::decide_within(back, now, quota, 0, debt).state;
            let d = BandDecision {
                allowed: true,
                new_tat: back,
                state,
            };
            return (d, Some(back));
        }
    };
    (d, d.new_tat.map(Some))
}

/// [`decide_bands`] for anything but a charge of one band: each band
/// decided once and written at once; when the decision is refused, every
/// band goes back to its stored time, then takes what a refusal writes (see
/// [`decide_bands`]).
fn decide_many(tats: &mut [Option<Nanos>], now: Nanos, bands: &[Quota], op: Op) -> Decision {
    let n = tats.len().min(bands.len()).min(MAX_BANDS);
    let (tats, bands) = (&mut tats[..n], &bands[..n]);
    let mut stored = [None; MAX_BANDS];
    stored[..n].copy_from_slice(tats);
    let mut states = BandStates::new();
    let mut allowed = true;
    for (i, (tat, quota)) in tats.iter_mut().zip(bands).enumerate() {
        let (amount, debt) = op.band(i);
        let (d, write) = decide_one(*tat, now, quota, amount, debt);
        allowed &= d.allowed;
        if let Some(write) = write {
            *tat = write;
        }
        states.push(d.state);
    }
    if !allowed {
        // A band that refused wrote at most its clamp; every other one
        // (admitting, forced, refunded) reports (and clamps) as a peek.
        for (i, ((tat, quota), state)) in tats.iter_mut().zip(bands).zip(states.iter_mut()).enumerate() {
            if state.retry_after_ns == 0 {
                let peek = gcra::decide_within(stored[i], now, quota, 0, op.band(i).1);
                *state = peek.state;
                *tat = peek.new_tat.or(stored[i]);
            }
        }
    }
    Decision::new(allowed, now, states)
}

#[cfg(test)]
mod tests {
    use super::super::Amounts;
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_denied_charge_writes_nothing_but_clamps() {
        let bands = [Quota::per_second(1), Quota::per_second(10)];
        let mut tats = [None, None];
        assert!(decide_bands(&mut tats, 0, &bands, Op::Charge(1)).allowed);
        let before = tats;
        let denied = decide_bands(&mut tats, 0, &bands, Op::Charge(1));
        assert!(!denied.allowed);
        assert_eq!(tats, before);
        assert_eq!(denied.bands[1].remaining, 9);
        assert_eq!(denied.bands[1].retry_after_ns, 0);
    }

    /// requests 10/s; tokens 100/s with up to 100 in debt; a daily cap of
    /// 1,000 tokens never in debt
    fn llm() -> [Quota; 3] {
        [
            Quota::per_second(10),
            Quota::per_second(100),
            Quota::per_day(1_000),
        ]
    }

    fn admit(cost: u32) -> Op {
        Op::Each(
            Amounts::new()
                .with(Amount::Charge(cost))
                .with_debt(Amount::Require, 100)
                .with(Amount::Require),
        )
    }

    fn record(units: u32) -> Op {
        Op::Each(
            Amounts::new()
                .with(Amount::Charge(0))
                .with_debt(Amount::Force(units), 100)
                .with(Amount::Force(units)),
        )
    }

    #[test]
    fn each_is_all_or_nothing_with_mixed_amounts() {
        let bands = llm();
        let mut tats = [None; 3];
        assert!(decide_bands(&mut tats, 0, &bands, admit(1)).allowed);
        // only the request band was charged
        assert_eq!(tats[1..], [None, None]);
        let d = decide_bands(&mut tats, 0, &bands, record(150));
        assert!(d.allowed);
        assert_eq!((d.bands[1].debt_ns, d.bands[1].forgiven), (S / 2, 0));
        // the daily band has no debt bound: 1,000 fit, 150 taken
        assert_eq!((d.bands[2].remaining, d.bands[2].forgiven), (850, 0));
        let before = tats;
        // refused by the tokens in debt: the request band is not charged,
        // and a force or refund in the same refused decision is not applied
        let refused = Op::Each(
            Amounts::new()
                .with(Amount::Charge(1))
                .with_debt(Amount::Require, 100)
                .with(Amount::Force(10)),
        );
        let d = decide_bands(&mut tats, 0, &bands, refused);
        assert!(!d.allowed);
        assert_eq!(tats, before);
        assert_eq!(d.bands[0].remaining, 9);
        assert_eq!(d.bands[1].retry_after_ns, S / 2 + S / 100);
        assert_eq!((d.bands[2].remaining, d.bands[2].retry_after_ns), (850, 0));
        let refund_refused = Op::Each(
            Amounts::new()
                .with(Amount::Charge(20))
                .with_debt(Amount::Refund(50), 100)
                .with(Amount::Refund(50)),
        );
        assert!(!decide_bands(&mut tats, 0, &bands, refund_refused).allowed);
        assert_eq!(tats, before);
        // a refund within an admitted decision starts from the debt
        let refund = Op::Each(
            Amounts::new()
                .with(Amount::Charge(0))
                .with_debt(Amount::Refund(50), 100)
                .with(Amount::Refund(50)),
        );
        let d = decide_bands(&mut tats, 0, &bands, refund);
        assert_eq!((d.bands[1].remaining, d.bands[1].debt_ns), (0, 0));
        assert_eq!(d.bands[2].remaining, 900);
        // a peek of the same bands (with their bounds) clamps nothing away
        let d = decide_bands(&mut tats, 0, &bands, record(150));
        let after = tats;
        assert_eq!((d.bands[1].debt_ns, d.bands[1].forgiven), (S, 50));
        assert_eq!(d.bands[1].more_after_ns, S + S / 100);
        decide_bands(&mut tats, 0, &bands, record(0).peek());
        assert_eq!(tats, after);
        // repaid at the band's rate: one token back after the debt
        assert!(!decide_bands(&mut tats, S + S / 100 - 1, &bands, admit(1)).allowed);
        assert!(decide_bands(&mut tats, S + S / 100, &bands, admit(1)).allowed);
    }

    #[test]
    fn uniform_ops_are_each_amount_alike() {
        let bands = [Quota::per_second(3), Quota::per_minute(5)];
        let mut a = [None, None];
        let mut b = [None, None];
        let steps = [
            (Op::Charge(2), 0),
            (Op::Charge(2), 0),
            (Op::Refund(1), S / 3),
            (Op::Charge(0), S),
        ];
        for (op, now) in steps {
            let (amount, _) = op.band(0);
            let each = Op::Each(Amounts::new().with(amount).with(amount));
            assert_eq!(
                decide_bands(&mut a, now, &bands, op),
                decide_bands(&mut b, now, &bands, each)
            );
            assert_eq!(a, b);
        }
    }
}
