use trt::rate_tiers;

// The longest period `Quota::per_period` takes: no error.
const LONGEST: u64 = u64::MAX / 1_000_000_000;
const TOO_LONG: u64 = LONGEST + 1;

#[rate_tiers]
enum Plan {
    #[tier(count = 1, period_secs = LONGEST)]
    Longest,
    #[tier(count = 1, period_secs = TOO_LONG)]
    TooLong,
}

fn main() {
    let _ = Plan::TooLong.quotas();
}
