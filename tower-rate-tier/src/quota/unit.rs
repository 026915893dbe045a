//! [`Unit`]: what a [`Quota`](super::Quota) counts besides requests.

use std::fmt;

/// The longest unit name, in bytes.
pub const MAX_UNIT_LEN: usize = 24;

/// The unit the IETF RateLimit draft registers for bytes of content
/// (`qu="content-bytes"`); the layer counts it from response bodies.
pub const CONTENT_BYTES: &str = "content-bytes";

/// Named units: what a [`Quota`](super::Quota) counts besides requests.
///
/// A tier counts requests in its bands, and may also count named units in
/// bands of their own (`tokens`, `content-bytes`, `points`):
/// [`RateTierBuilder::tier_unit`](crate::RateTierBuilder::tier_unit). A unit's
/// name appears in storage keys, in the names of `RateLimit-Policy` items and
/// in metric labels, so it is a short token: 1 to [`MAX_UNIT_LEN`] bytes of
/// ASCII lowercase letters, digits, `-` and `_`, starting with a letter.
/// `requests`, `concurrent-requests` and `concurrency` are reserved: a
/// tier's request bands and its concurrency limit count them (and name its
/// `RateLimit-Policy` item `<tier>.concurrency`).
///
/// ```
/// use tower_rate_tier::quota::{Unit, UnitError};
///
/// assert_eq!(Unit::new("tokens").unwrap().as_str(), "tokens");
/// assert_eq!(Unit::new("requests"), Err(UnitError::Reserved("requests".into())));
/// assert!(matches!(Unit::new("Tokens"), Err(UnitError::Invalid(_))));
/// assert!(matches!(Unit::new("a;b"), Err(UnitError::Invalid(_))));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unit {
    /// 0 for requests.
    len: u8,
    bytes: [u8; MAX_UNIT_LEN],
    /// [`Unit::id`], computed once.
    id: u32,
}

/// Why a name is not a unit's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnitError {
    /// Not 1 to [`MAX_UNIT_LEN`] bytes of `a-z`, `0-9`, `-`, `_` starting
    /// with a letter.
    Invalid(String),
    /// `requests`, `concurrent-requests` or `concurrency`.
    Reserved(String),
    /// Two units of one tier whose [ids](Unit::id) are the same (a hash
    /// collision, rare as one in four billion pairs): rename one.
    SameId(String, String),
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitError::Invalid(name) => write!(
                f,
                "`{name}` is not a valid unit name (1 to {MAX_UNIT_LEN} bytes of a-z, 0-9, `-` and `_`, starting with a letter)"
            ),
            UnitError::SameId(one, other) => write!(
                f,
                "the units `{one}` and `{other}` of one tier have the same id (its state would be shared): rename one"
            ),
            UnitError::Reserved(name) => write!(
                f,
                "the unit name `{name}` is reserved (a tier's request bands and its concurrency limit count it)"
            ),
        }
    }
}

impl std::error::Error for UnitError {}

impl Unit {
    /// What request bands count: not a named unit.
    pub const REQUESTS: Unit = Unit {
        len: 0,
        bytes: [0; MAX_UNIT_LEN],
        id: 0,
    };

    /// The unit named `name`, validated.
    pub fn new(name: &str) -> Result<Unit, UnitError> {
        if matches!(name, "requests" | "concurrent-requests" | "concurrency") {
            return Err(UnitError::Reserved(name.to_owned()));
        }
        let valid = (1..=MAX_UNIT_LEN).contains(&name.len())
            && name.as_bytes()[0].is_ascii_lowercase()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !valid {
            return Err(UnitError::Invalid(name.to_owned()));
        }
        let mut bytes = [0; MAX_UNIT_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        // FNV-1a, never 0 (that is requests)
        let mut id: u32 = 0x811c_9dc5;
        for &b in name.as_bytes() {
            id ^= u32::from(b);
            id = id.wrapping_mul(0x0100_0193);
        }
        Ok(Unit {
            len: name.len() as u8,
            bytes,
            id: id.max(1),
        })
    }

    /// The name; `requests` for [`Unit::REQUESTS`].
    pub fn as_str(&self) -> &str {
        if self.len == 0 {
            return "requests";
        }
        // Validated ASCII.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// Whether this unit is named `name` (without checking the name).
    #[inline]
    pub fn is(&self, name: &str) -> bool {
        if self.len == 0 {
            return name == "requests";
        }
        &self.bytes[..usize::from(self.len)] == name.as_bytes()
    }

    /// Whether this is [`Unit::REQUESTS`].
    pub const fn is_requests(&self) -> bool {
        self.len == 0
    }

    /// Whether this is [`CONTENT_BYTES`], which the layer counts.
    pub fn is_content_bytes(&self) -> bool {
        self.is(CONTENT_BYTES)
    }

    /// A 32-bit id of the name (FNV-1a; 0 for requests, never 0 for a
    /// unit), which storages key a unit band's state by.
    #[inline]
    pub const fn id(&self) -> u32 {
        self.id
    }
}

impl Default for Unit {
    fn default() -> Self {
        Unit::REQUESTS
    }
}

impl fmt::Debug for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Unit {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Unit::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_tokens() {
        for good in ["tokens", "content-bytes", "gpu_seconds", "p2", "a"] {
            assert_eq!(Unit::new(good).unwrap().as_str(), good);
        }
        let long = "a".repeat(MAX_UNIT_LEN + 1);
        for bad in [
            "", "1tokens", "-x", "to kens", "to\"kens", "a,b", "a=b", "a:b", "tökens", &long,
        ] {
            assert_eq!(Unit::new(bad), Err(UnitError::Invalid(bad.to_owned())), "{bad:?}");
        }
        assert!(Unit::new(&"a".repeat(MAX_UNIT_LEN)).is_ok());
    }

    #[test]
    fn ids_tell_units_from_requests() {
        assert_eq!(Unit::REQUESTS.id(), 0);
        assert_ne!(Unit::new("tokens").unwrap().id(), 0);
        assert_ne!(
            Unit::new("tokens").unwrap().id(),
            Unit::new("points").unwrap().id()
        );
        assert_eq!(Unit::REQUESTS.as_str(), "requests");
        assert!(Unit::new(CONTENT_BYTES).unwrap().is_content_bytes());
    }
}
