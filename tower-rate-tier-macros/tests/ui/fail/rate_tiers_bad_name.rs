use trt::rate_tiers;

#[rate_tiers]
enum Plan {
    #[tier(per_hour = 100, name = "")]
    Free,
    #[tier(per_hour = 200, name = pro)]
    Pro,
    #[tier(per_hour = 300, name = "team\u{1f}own")]
    Team,
}

fn main() {}
