//! An amount per band: [`Op::Each`](super::Op::Each) carries one
//! [`Amount`] for each band of a decision, with the band's debt bound, so
//! one atomic decision can charge some bands (a request's), only require
//! others (a unit's, such as tokens: at least one unit and no debt), and
//! record usage after the fact in others, possibly into debt.
//!
//! # The debt bound travels with every band
//!
//! Each band of an `Op::Each` carries the debt it may be in, whatever its
//! amount: every operation on a band in debt needs it, not only the one
//! that puts it there. A charge, a requirement or a peek clamps a TAT
//! beyond `now + τ + debt · I` (a clock that went back), a refund starts
//! from that bound, and a forced charge stops at it. A bound carried by the
//! forced charge alone would leave the others clamping at `now + τ`, which
//! would wipe a debt away at the next request. A band given with
//! [`Amounts::with`] (or in any other [`Op`](super::Op)) has a bound of 0:
//! a request band, clamped at `now + τ` as a charge always was.
//!
//! ```
//! use tower_rate_tier::Quota;
//! use tower_rate_tier::storage::{Amount, Amounts, Op, decide_bands};
//!
//! // requests: 10 per second; tokens: 100 per second, up to 100 in debt
//! let bands = [Quota::per_second(10), Quota::per_second(100)];
//! let mut tats = [None, None];
//! // usage recorded after a response: 250 tokens, more than the band holds
//! let record = Amounts::new().with(Amount::Charge(0)).with_debt(Amount::Force(250), 100);
//! let d = decide_bands(&mut tats, 0, &bands, Op::Each(record));
//! assert_eq!((d.bands[1].remaining, d.bands[1].forgiven), (0, 50));
//! assert_eq!(d.bands[1].debt_ns, 1_000_000_000); // 100 tokens of debt
//! // the next request is refused by the tokens while requests have room
//! let admit = Amounts::new().with(Amount::Charge(1)).with_debt(Amount::Require, 100);
//! let d = decide_bands(&mut tats, 0, &bands, Op::Each(admit));
//! assert!(!d.allowed);
//! assert_eq!(d.bands[0].remaining, 10); // nothing charged
//! assert_eq!(d.bands[1].retry_after_ns, 1_010_000_000); // debt + one token
//! ```

/// What a decision does to one band. See [`Op::Each`](super::Op::Each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Amount {
    /// Admit when `n` units fit, and take them, as
    /// [`Op::Charge`](super::Op::Charge) does in every band. `Charge(0)` is
    /// a peek: it always admits (a band in debt included).
    Charge(u32),
    /// Admit only when the band has at least one unit (so is not in debt);
    /// take nothing. A unit band at a request's admission: a peek would
    /// always admit.
    Require,
    /// Take `n` units whatever is left, possibly into debt: the band's TAT
    /// becomes `min(max(TAT, now) + n · I, now + τ + debt · I)`. Never
    /// refuses; the whole units the debt bound did not take are reported in
    /// the band's [`BandState::forgiven`](super::BandState::forgiven).
    Force(u32),
    /// Give `n` units back, as [`Op::Refund`](super::Op::Refund) does in
    /// every band (never below a fresh state).
    Refund(u32),
}

impl Default for Amount {
    /// A peek.
    fn default() -> Self {
        Amount::Charge(0)
    }
}

/// One [`Amount`] per band of a decision, in the decision's band order,
/// each with its debt bound (in units of the band): at most
/// [`MAX_BANDS`](super::MAX_BANDS), kept inline (`Copy`, no allocation).
///
/// A band beyond the amounts given is peeked (`Amount::Charge(0)`); the
/// storages refuse a decision whose number of amounts is not its number of
/// bands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Amounts {
    len: u8,
    amounts: [Amount; super::MAX_BANDS],
    debts: [u32; super::MAX_BANDS],
}

impl Amounts {
    /// No band yet.
    pub const fn new() -> Self {
        Amounts {
            len: 0,
            amounts: [Amount::Charge(0); super::MAX_BANDS],
            debts: [0; super::MAX_BANDS],
        }
    }

    /// The same, and a next band that is never in debt (a request band).
    ///
    /// # Panics
    /// When it holds [`MAX_BANDS`](super::MAX_BANDS) bands already (see
    /// [`Amounts::push`] for a fallible form).
    #[must_use]
    pub const fn with(self, amount: Amount) -> Self {
        self.with_debt(amount, 0)
    }

    /// The same, and a next band that may be in debt of up to `debt` units
    /// (a unit band).
    ///
    /// # Panics
    /// When it holds [`MAX_BANDS`](super::MAX_BANDS) bands already.
    #[must_use]
    pub const fn with_debt(mut self, amount: Amount, debt: u32) -> Self {
        assert!(
            (self.len as usize) < super::MAX_BANDS,
            "an `Amounts` holds at most MAX_BANDS bands"
        );
        self.amounts[self.len as usize] = amount;
        self.debts[self.len as usize] = debt;
        self.len += 1;
        self
    }

    /// Appends a band allowed `debt` units of debt; `false` (and nothing
    /// appended) when it holds [`MAX_BANDS`](super::MAX_BANDS) already.
    pub fn push(&mut self, amount: Amount, debt: u32) -> bool {
        let at = usize::from(self.len);
        if at >= super::MAX_BANDS {
            return false;
        }
        self.amounts[at] = amount;
        self.debts[at] = debt;
        self.len += 1;
        true
    }

    /// The number of bands.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether it holds no band.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Band `i`'s amount and debt bound; a peek never in debt beyond the
    /// bands given.
    pub fn get(&self, i: usize) -> (Amount, u32) {
        if i < self.len() {
            (self.amounts[i], self.debts[i])
        } else {
            (Amount::Charge(0), 0)
        }
    }

    /// Sets the amount of the bands of `range` (those it holds) to
    /// `amount`, keeping their debt bounds.
    pub(crate) fn fill(&mut self, range: std::ops::Range<usize>, amount: Amount) {
        let end = range.end.min(self.len());
        for slot in &mut self.amounts[range.start.min(end)..end] {
            *slot = amount;
        }
    }

    /// Every band's amount and debt bound, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Amount, u32)> + '_ {
        (0..self.len()).map(|i| (self.amounts[i], self.debts[i]))
    }

    /// Whether any band is forced or refunded: a decision that changes the
    /// band whatever its state.
    pub fn moves_regardless(&self) -> bool {
        self.iter()
            .any(|(amount, _)| matches!(amount, Amount::Force(_) | Amount::Refund(_)))
    }

    /// The same bands, each peeked with its debt bound: the state of a
    /// decision without changing it (and without clamping a debt away).
    #[must_use]
    pub fn peek(self) -> Self {
        Amounts {
            amounts: [Amount::Charge(0); super::MAX_BANDS],
            ..self
        }
    }
}
