use trt::rate_tiers;

const PRO_BURST: u32 = 0;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 5_000, burst = PRO_BURST)]
    Pro,
}

fn main() {
    let _ = Plan::Pro.quotas();
}
