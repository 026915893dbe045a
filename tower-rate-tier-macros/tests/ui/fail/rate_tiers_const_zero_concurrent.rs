use trt::rate_tiers;

const FREE_STREAMS: u32 = 0;

#[rate_tiers]
enum Plan {
    #[tier(per_minute = 20, concurrent = FREE_STREAMS)]
    Free,
}

fn main() {
    let _ = Plan::Free.quotas();
}
