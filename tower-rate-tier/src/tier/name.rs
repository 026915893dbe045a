//! Naming tiers: [`IntoTierName`], the [`TierTable`] a `#[rate_tiers]` enum
//! implements, and the error of parsing a name into such an enum.

use std::borrow::Cow;
use std::fmt;

use crate::quota::Quota;

/// A table of tiers, as `#[rate_tiers]` generates it for an enum.
///
/// [`RateTierBuilder::tiers`](crate::RateTierBuilder::tiers) adds every tier of a table (and its default
/// tier), and [`TierIdentity::new`](crate::TierIdentity::new) accepts a
/// table's values as tier names.
pub trait TierTable: Copy + Send + Sync + 'static {
    /// Every tier, in declaration order.
    fn all() -> &'static [Self];
    /// This tier's name.
    fn tier_name(self) -> &'static str;
    /// This tier's bands (empty for an unlimited tier is not allowed: an
    /// unlimited tier is `[Quota::unlimited()]`).
    fn tier_quotas(self) -> &'static [Quota];
    /// The default tier, if the table names one.
    fn default_tier() -> Option<Self>;

    /// Whether this tier is dark-launched (`#[tier(.., shadow)]`): its
    /// requests are decided and reported, never refused. See
    /// [`RateTierBuilder::shadow_tier`](crate::RateTierBuilder::shadow_tier).
    fn tier_shadow(self) -> bool {
        false
    }

    /// The most requests of one user of this tier in flight at once
    /// (`#[tier(.., concurrent = n)]`); `None` for no such limit. See
    /// [`RateTierBuilder::tier_concurrency`](crate::RateTierBuilder::tier_concurrency).
    fn tier_concurrency(self) -> Option<u32> {
        None
    }

    /// This tier's bands of named units (`#[tier(unit = "tokens", ..)]`),
    /// each unit with its bands; empty for a tier that counts requests
    /// only. See
    /// [`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit).
    fn tier_units(self) -> &'static [(&'static str, &'static [Quota])] {
        &[]
    }

    /// This tier's place in [`all`](Self::all).
    fn tier_index(self) -> usize {
        let name = self.tier_name();
        Self::all()
            .iter()
            .position(|t| std::ptr::eq(t.tier_name(), name))
            .unwrap_or(usize::MAX)
    }
}

/// Anything that names a tier: `&str`, `String`, or a [`TierTable`] value.
pub trait IntoTierName {
    /// The name.
    fn into_tier_name(self) -> Cow<'static, str>;

    /// The name, and where the tier is likely to stand in a limiter's
    /// table (a [`TierTable`] value's place in its enum); `None` by
    /// default.
    fn into_tier_ref(self) -> (Cow<'static, str>, Option<u16>)
    where
        Self: Sized,
    {
        (self.into_tier_name(), None)
    }
}

impl IntoTierName for &str {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self.to_owned())
    }
}

impl IntoTierName for String {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self)
    }
}

impl IntoTierName for &String {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Owned(self.clone())
    }
}

impl IntoTierName for Cow<'static, str> {
    fn into_tier_name(self) -> Cow<'static, str> {
        self
    }
}

impl<T: TierTable> IntoTierName for T {
    fn into_tier_name(self) -> Cow<'static, str> {
        Cow::Borrowed(self.tier_name())
    }

    fn into_tier_ref(self) -> (Cow<'static, str>, Option<u16>) {
        let hint = u16::try_from(self.tier_index()).ok();
        (Cow::Borrowed(self.tier_name()), hint)
    }
}

/// The error of `FromStr` for a `#[rate_tiers]` enum: the name is not one of
/// its tiers.
///
/// ```
/// # #[cfg(feature = "macros")]
/// # fn main() {
/// use tower_rate_tier::rate_tiers;
///
/// #[rate_tiers]
/// enum Plan {
///     #[tier(per_minute = 10)]
///     Free,
///     #[tier(per_minute = 100)]
///     Pro,
/// }
///
/// let error = "gold".parse::<Plan>().unwrap_err();
/// assert_eq!(error.name(), "gold");
/// assert_eq!(error.known(), ["free", "pro"]);
/// assert_eq!(error.to_string(), "unknown tier `gold` (known tiers: `free`, `pro`)");
/// # }
/// # #[cfg(not(feature = "macros"))]
/// # fn main() {}
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseTierError {
    name: String,
    known: &'static [&'static str],
}

impl ParseTierError {
    /// What `#[rate_tiers]` expansions build; not public API.
    #[doc(hidden)]
    pub fn new(name: &str, known: &'static [&'static str]) -> Self {
        ParseTierError {
            name: name.to_owned(),
            known,
        }
    }

    /// The name that was not found.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of the enum's tiers, in declaration order.
    pub fn known(&self) -> &'static [&'static str] {
        self.known
    }
}

impl fmt::Display for ParseTierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown tier `{}` (known tiers: ", self.name)?;
        for (i, known) in self.known.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{known}`")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for ParseTierError {}
