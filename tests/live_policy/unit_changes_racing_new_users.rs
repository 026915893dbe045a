//! A unit added to and removed from a tier while its users make their
//! first requests: the memory storage keeps a one-band tier's request band
//! in one map and moves a user to another when the tier gains a unit. A
//! move racing a one-band decision must neither count the band twice nor
//! lose a charge.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tower_rate_tier::storage::MemoryStorage;
use tower_rate_tier::{Quota, RateTier};

/// 5 requests an hour, while another thread adds and removes a unit of
/// tokens as fast as it can: each new user's 8 racing tasks, then 6 more
/// requests, are admitted 5 times at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_new_user_gets_its_request_band_twice_while_a_unit_comes_and_goes() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_hour(5))
        .storage(MemoryStorage::new())
        .build();
    let stop = Arc::new(AtomicBool::new(false));
    let changer = {
        let (tiers, stop) = (tiers.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let unit = flips.is_multiple_of(2).then(|| vec![Quota::per_hour(1_000)]);
                tiers
                    .set_tier_unit("free", "tokens", unit)
                    .expect("the tier exists");
                flips += 1;
            }
            flips
        })
    };
    let mut worst = (0, String::new());
    for round in 0..3_000 {
        let user = format!("u{round}");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (tiers, user) = (tiers.clone(), user.clone());
                tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..3 {
                        admitted +=
                            usize::from(tiers.check(&user, "free", 1).await.expect("decided").is_ok());
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.expect("no panic");
        }
        for _ in 0..6 {
            admitted += usize::from(tiers.check(&user, "free", 1).await.expect("decided").is_ok());
            tokio::task::yield_now().await;
        }
        if admitted > worst.0 {
            worst = (admitted, user);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = changer.join().expect("the changer ran");
    assert!(flips > 0, "the unit never changed");
    assert!(
        worst.0 <= 5,
        "{} was admitted {} requests of a burst of 5",
        worst.1,
        worst.0
    );
}
