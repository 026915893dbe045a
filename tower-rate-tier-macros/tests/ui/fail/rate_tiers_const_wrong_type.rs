use trt::rate_tiers;

const FREE_PER_HOUR: u64 = 100;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = FREE_PER_HOUR)]
    Free,
}

fn main() {
    let _ = Plan::Free.quotas();
}
