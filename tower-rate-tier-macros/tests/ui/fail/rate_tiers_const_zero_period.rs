use trt::rate_tiers;

const MONTH: u64 = 0;

#[rate_tiers]
enum Plan {
    #[tier(count = 3_000, period_secs = MONTH)]
    Monthly,
}

fn main() {
    let _ = Plan::Monthly.quotas();
}
