//! Parsing tier names into a `#[rate_tiers]` enum.

use std::fmt;

/// The error of `FromStr` for a `#[rate_tiers]` enum: the name is not one of
/// its tiers.
///
/// ```
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
