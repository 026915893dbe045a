//! The keys `#[tier(..)]` knows, and what to say about one it does not.

/// A key of `#[tier(..)]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Key {
    /// `per_second = n` and the other fixed periods.
    Band(NamedPeriod),
    /// `count = n`, the count of a band with `period_secs`.
    Count,
    /// `period_secs = s`, the period of a band with `count`.
    PeriodSecs,
    Burst,
    Unlimited,
    Name,
    Default,
    Shadow,
    /// `concurrent = n`: at most `n` requests of one user in flight.
    Concurrent,
}

/// A period that has its own key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum NamedPeriod {
    Second,
    Minute,
    Hour,
    Day,
    Week,
}

/// Every key, in the order the messages list them.
const KEYS: [(&str, Key); 13] = [
    ("per_second", Key::Band(NamedPeriod::Second)),
    ("per_minute", Key::Band(NamedPeriod::Minute)),
    ("per_hour", Key::Band(NamedPeriod::Hour)),
    ("per_day", Key::Band(NamedPeriod::Day)),
    ("per_week", Key::Band(NamedPeriod::Week)),
    ("count", Key::Count),
    ("period_secs", Key::PeriodSecs),
    ("unlimited", Key::Unlimited),
    ("burst", Key::Burst),
    ("concurrent", Key::Concurrent),
    ("name", Key::Name),
    ("default", Key::Default),
    ("shadow", Key::Shadow),
];

impl Key {
    pub(super) fn from_name(name: &str) -> Option<Key> {
        KEYS.iter().find(|(known, _)| *known == name).map(|&(_, key)| key)
    }
}

impl NamedPeriod {
    /// The `Quota` constructor of this period, which is also its key.
    pub(super) fn constructor(self) -> &'static str {
        match self {
            NamedPeriod::Second => "per_second",
            NamedPeriod::Minute => "per_minute",
            NamedPeriod::Hour => "per_hour",
            NamedPeriod::Day => "per_day",
            NamedPeriod::Week => "per_week",
        }
    }
}

/// Every key, in backticks, for the messages.
pub(super) fn listed() -> String {
    let keys: Vec<String> = KEYS.iter().map(|(name, _)| format!("`{name}`")).collect();
    keys.join(", ")
}

/// The message for an unknown key: the closest known key if one is near
/// enough to be a typo, the way to write any period for another `per_*`,
/// the list of keys otherwise.
pub(super) fn unknown(name: &str) -> String {
    if let Some(known) = closest(name) {
        return format!("unknown key `{name}`; did you mean `{known}`?");
    }
    if name.starts_with("per_") {
        return format!(
            "unknown key `{name}`; for a period without a key of its own, write \
             `count = 100, period_secs = 2_592_000` (100 per 30 days, refilled continuously)"
        );
    }
    format!("unknown key `{name}`; expected one of {}", listed())
}

/// The known key `name` was most likely meant to be: within an edit or two
/// (about one in four characters), or one that `name` begins
/// (`period` -> `period_secs`).
fn closest(name: &str) -> Option<&'static str> {
    let limit = (name.chars().count() / 4).max(1);
    KEYS.iter()
        .map(|&(known, _)| (strsim::damerau_levenshtein(name, known), known))
        .filter(|&(distance, known)| distance <= limit || (name.len() >= 3 && known.starts_with(name)))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, known)| known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_suggestion() {
        let cases = [
            ("per_minut", "per_minute"),
            ("per_hours", "per_hour"),
            ("per_weak", "per_week"),
            ("burts", "burst"),
            ("defualt", "default"),
            ("unlimted", "unlimited"),
            ("period", "period_secs"),
            ("period_sec", "period_secs"),
            ("counts", "count"),
            ("per_sec", "per_second"),
        ];
        for (typo, meant) in cases {
            assert_eq!(closest(typo), Some(meant), "{typo}");
            assert_eq!(
                unknown(typo),
                format!("unknown key `{typo}`; did you mean `{meant}`?")
            );
        }
    }

    #[test]
    fn unrelated_keys_get_the_list() {
        for name in ["colour", "rate", "max", "limit", "x"] {
            assert_eq!(closest(name), None, "{name}");
            assert!(unknown(name).ends_with("`name`, `default`, `shadow`"), "{name}");
        }
    }

    #[test]
    fn another_period_gets_count_and_period_secs() {
        for name in ["per_month", "per_year", "per_fortnight"] {
            assert_eq!(closest(name), None, "{name}");
            assert!(
                unknown(name).contains("`count = 100, period_secs = 2_592_000`"),
                "{name}"
            );
        }
    }

    #[test]
    fn every_key_is_found_by_its_name() {
        for (name, key) in KEYS {
            assert_eq!(Key::from_name(name), Some(key));
            if let Key::Band(period) = key {
                assert_eq!(period.constructor(), name);
            }
        }
        assert_eq!(Key::from_name("per_month"), None);
    }
}
