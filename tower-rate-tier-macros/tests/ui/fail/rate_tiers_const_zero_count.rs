use trt::rate_tiers;

mod limits {
    pub const FREE_PER_HOUR: u32 = 0;
}

#[rate_tiers]
enum Plan {
    #[tier(per_hour = limits::FREE_PER_HOUR)]
    Free,
}

fn main() {
    let _ = Plan::Free.quotas();
}
