use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    // The longest period `Quota::per_period` takes: no error.
    #[tier(count = 1, period_secs = 18_446_744_073)]
    Longest,
    #[tier(count = 1, period_secs = 18_446_744_074)]
    TooLong,
    #[tier(per_hour = 10)]
    #[tier(unit = "tokens", count = 1, period_secs = 18446744073709551615)]
    UnitTooLong,
}

fn main() {}
