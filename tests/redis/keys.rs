//! Key names, expiry, and stored values the storage did not write.

use tower_rate_tier::Quota;
use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::RedisServer;

use super::{key, script_only, storage};

#[tokio::test]
async fn keys_are_hashed_expire_and_share_a_hash_tag() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = RedisStorage::builder(server.url())
        .prefix("myapp")
        .hash_secret("s3cret")
        .connect()
        .await
        .unwrap();
    let bands = [Quota::per_minute(10), Quota::per_day(100)];
    let k = key("pro", "alice@example.com");
    assert!(redis.check(k, &bands, 1).await.unwrap().allowed);
    let keys = server.cli(&["--scan"]);
    let mut names: Vec<&str> = keys.lines().collect();
    names.sort_unstable();
    let mut expected = vec![redis.band_key(k, &bands[0]), redis.band_key(k, &bands[1])];
    expected.sort_unstable();
    assert_eq!(names, expected);
    assert!(!keys.contains("alice") && !keys.contains("pro"), "{keys}");
    let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
    assert_eq!(tag(&expected[0]), tag(&expected[1]));
    assert!(expected[0].starts_with("myapp:{"));
    // expiry = time until the TAT: 6 s for one request of 10/min, 864 s for 100/day
    let pttl = |band| {
        server
            .cli(&["PTTL", &redis.band_key(k, &bands[band])])
            .parse::<i64>()
            .unwrap()
    };
    assert!((5_000..=6_001).contains(&pttl(0)), "{}", pttl(0));
    assert!((863_000..=864_001).contains(&pttl(1)), "{}", pttl(1));
    // a refund keeps an expiry on what it writes, and deletes a full band
    assert!(redis.check(k, &bands, 2).await.unwrap().allowed);
    redis.give_back(k, &bands, 1).await.unwrap();
    assert!((11_000..=12_001).contains(&pttl(0)), "{}", pttl(0));
    redis.give_back(k, &bands, 5).await.unwrap();
    assert_eq!(pttl(0), -2, "a full band has no key");
    let peek = redis.check(k, &bands, 0).await.unwrap();
    assert_eq!(peek.bands[0].remaining, 10);
    // another secret (or none) is another bucket
    let other = RedisStorage::builder(server.url())
        .prefix("myapp")
        .connect()
        .await
        .unwrap();
    assert_ne!(other.band_key(k, &bands[0]), redis.band_key(k, &bands[0]));
}

#[tokio::test]
async fn a_corrupted_value_is_a_fresh_state() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // the script's own reading of what it finds (a deny cache would keep
    // denying: it does not see foreign writes)
    let redis = script_only(&server.url()).await;
    let q = [Quota::per_minute(10)];
    let k = key("t", "corrupt");
    for _ in 0..10 {
        assert!(redis.check(k, &q, 1).await.unwrap().allowed);
    }
    assert!(!redis.check(k, &q, 1).await.unwrap().allowed);
    let name = redis.band_key(k, &q[0]);
    for garbage in [
        &["SET", &name, "garbage"][..],
        &["SET", &name, "12.5"],
        &["SET", &name, "-7"],
        &["SET", &name, "nan"],
    ] {
        server.cli(garbage);
        let d = redis.check(k, &q, 1).await.unwrap();
        assert!(d.allowed, "after {garbage:?}");
        assert_eq!(d.bands[0].remaining, 9, "after {garbage:?}");
    }
    // a key of another type
    server.cli(&["DEL", &name]);
    server.cli(&["LPUSH", &name, "x"]);
    let d = redis.check(k, &q, 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.bands[0].remaining, 9);
    assert_eq!(server.cli(&["TYPE", &name]), "string");
    // a TAT a year ahead: at most one full refill (60 s) of waiting
    let year_ahead = (d.now / 1_000 + 365 * 86_400 * 1_000_000).to_string();
    server.cli(&["SET", &name, &year_ahead]);
    let d = redis.check(k, &q, 1).await.unwrap();
    assert!(!d.allowed);
    assert!(d.bands[0].retry_after_ns <= 6_000_000_000, "{d:?}");
}

#[tokio::test]
async fn bands_keep_their_state_when_a_tier_gains_loses_or_reorders_bands() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = storage(&server.url()).await;
    let k = key("pro", "reorder");
    let (minute, day) = (Quota::per_minute(10), Quota::per_day(100));
    let remaining =
        |d: tower_rate_tier::storage::Decision| -> Vec<u32> { d.bands.iter().map(|s| s.remaining).collect() };
    assert!(redis.check(k, &[minute, day], 3).await.unwrap().allowed);
    // reordered: each band still sees its own state
    let d = redis.check(k, &[day, minute], 0).await.unwrap();
    assert_eq!(remaining(d), vec![97, 7]);
    // a band removed, another added in front
    let d = redis.check(k, &[day], 0).await.unwrap();
    assert_eq!(remaining(d), vec![97]);
    // (an hourly band: its key lives for minutes, so that the scan below
    // finds it however late it runs on a loaded machine; a one-second
    // band's key expires 201 ms after one request)
    let d = redis
        .check(k, &[Quota::per_hour(5), minute, day], 1)
        .await
        .unwrap();
    assert_eq!(remaining(d), vec![4, 6, 96]);
    // the key names say which refill window they hold
    let names = server.cli(&["--scan"]);
    assert!(names.lines().any(|n| n.ends_with("}:w60000")), "{names}");
    assert!(names.lines().any(|n| n.ends_with("}:w86400000")), "{names}");
    assert!(names.lines().any(|n| n.ends_with("}:w3600000")), "{names}");
}

#[tokio::test]
async fn two_bands_with_one_window_keep_two_states() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let redis = storage(&server.url()).await;
    // both refill in 120 s: 20 every 6 s, and 2 every 60 s
    let bands = [
        Quota::per_minute(10).with_burst(20),
        Quota::per_hour(60).with_burst(2),
    ];
    let k = key("t", "same-window");
    let d = redis.check(k, &bands, 2).await.unwrap();
    assert_eq!([d.bands[0].remaining, d.bands[1].remaining], [18, 0]);
    let d = redis.check(k, &bands, 0).await.unwrap();
    assert_eq!([d.bands[0].remaining, d.bands[1].remaining], [18, 0]);
    // the second band of one window is told apart by its place among them
    let names = server.cli(&["--scan"]);
    assert!(names.lines().any(|n| n.ends_with("}:w120000")), "{names}");
    assert!(names.lines().any(|n| n.ends_with("}:w120000.1")), "{names}");
}

#[tokio::test]
async fn an_empty_hash_secret_is_refused() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let err = RedisStorage::builder(server.url())
        .hash_secret("")
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("hash secret is empty"), "{err}");
    let err = RedisStorage::builder(server.url())
        .hash_secret(b"")
        .connect_lazy()
        .unwrap_err();
    assert!(err.to_string().contains("hash secret is empty"), "{err}");
}
