//! One script call per decision, and the EVALSHA fallbacks.

use tower_rate_tier::{Quota, RateTier};
use tower_rate_tier_tests::redis::RedisServer;

use super::{script_only, storage, tiers};

#[tokio::test]
async fn one_script_call_per_decision() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = script_only(&server.url()).await;
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(5))
        .tier("bands", [Quota::per_second(3), Quota::per_day(100)])
        .storage(redis)
        .build();
    // warm up: the first call loads the script
    tiers.check("warm", "free", 1).await.unwrap().unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut decisions = 0;
    for i in 0..40 {
        let (tier, cost) = match i % 4 {
            0 => ("free", 1),
            1 => ("free", 3),
            2 => ("bands", 0),
            _ => ("bands", 2),
        };
        // admitted and denied alike
        let _ = tiers.check(&format!("u{}", i % 3), tier, cost).await.unwrap();
        decisions += 1;
    }
    let calls = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(calls, decisions);
    assert_eq!(
        server.command_calls("eval"),
        0,
        "steady state needs no script upload"
    );
}

#[tokio::test]
async fn script_flush_is_invisible_to_the_caller() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let tiers = tiers(storage(&server.url()).await);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 36);
    server.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 35);
    assert_eq!(tiers.check("f", "one", 1).await.unwrap().unwrap().remaining, 34);
}

#[tokio::test]
async fn evalsha_refused_falls_back_to_eval() {
    let Some(server) = RedisServer::start_with(&["--rename-command", "EVALSHA", ""]) else {
        return;
    };
    let tiers = tiers(storage(&server.url()).await);
    for left in (0..37).rev() {
        assert_eq!(tiers.check("e", "one", 1).await.unwrap().unwrap().remaining, left);
    }
    assert!(tiers.check("e", "one", 1).await.unwrap().is_err());
    assert_eq!(server.command_calls("eval"), 38);
}
