//! The application's own redis-rs connection: a `ConnectionManager` with an
//! ACL user of the fewest permissions the storage needs (and those a
//! concurrency tier adds), one shared with the application, one over TLS
//! with client certificates, and a `ClusterClient`.

use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{ClientTlsConfig, TlsCertificates};
use tower_rate_tier::Quota;
use tower_rate_tier::clock::{Clock, SystemClock};
use tower_rate_tier::storage::{Op, RedisStorage, Slots, Storage, StorageError, StorageErrorKind};
use tower_rate_tier_tests::StorageOps;
use tower_rate_tier_tests::redis::{RedisServer, TlsFiles, cluster, free_port};

use super::{key, tiers};

const TIMEOUT: Duration = Duration::from_millis(250);
/// A TLS handshake in a debug build on a loaded machine can take longer than
/// `TIMEOUT`; the TLS test is about certificates, not time.
const TLS_TIMEOUT: Duration = Duration::from_secs(5);

/// The permissions the module docs list.
const NEEDED: [&str; 7] = ["+evalsha", "+eval", "+time", "+get", "+mget", "+set", "+del"];

/// What a tier with a concurrency limit adds to [`NEEDED`] (its slots).
const SLOT_COMMANDS: [&str; 6] = [
    "+zremrangebyscore",
    "+zcard",
    "+zadd",
    "+zrem",
    "+zrange",
    "+pexpire",
];

/// Creates ACL user `name` (password `pw`) with keys `acl:*` and `grants`.
fn acl_user(server: &RedisServer, name: &str, grants: &[&str]) {
    let mut args = vec![
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        ">pw",
        "~acl:*",
        "resetchannels",
        "-@all",
    ];
    args.extend_from_slice(grants);
    assert_eq!(server.cli(&args), "OK");
}

/// A manager of the application's own, logged in as `user`.
async fn manager(server: &RedisServer, user: &str) -> ConnectionManager {
    let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port());
    let client = redis::Client::open(url).expect("a valid URL");
    ConnectionManager::new_with_config(client, RedisStorage::manager_config(TIMEOUT))
        .await
        .expect("the ACL user logs in")
}

async fn storage_as(server: &RedisServer, user: &str, prefix: &str) -> Result<RedisStorage, StorageError> {
    RedisStorage::with_connection_manager(manager(server, user).await)
        .prefix(prefix)
        .hash_secret("a test secret of no particular length")
        .timeout(TIMEOUT)
        .connect()
        .await
}

/// Everything the storage asks of Redis: one-band and two-band charges
/// (server time), a denial, a refund that fills its bands (deletes their
/// keys), and a script the server has forgotten.
async fn exercise(storage: &RedisStorage, server: &RedisServer, who: &str) -> Result<(), StorageError> {
    let one = [Quota::per_minute(3)];
    let two = [Quota::per_second(5), Quota::per_day(100)];
    let (k1, k2) = (key("free", who), key("pro", who));
    server.cli(&["SCRIPT", "FLUSH"]);
    for left in [2, 1, 0] {
        let d = storage.check(k1, &one, 1).await?;
        assert!(d.allowed && d.bands[0].remaining == left, "{d:?}");
    }
    assert!(!storage.check(k1, &one, 1).await?.allowed);
    let d = storage.check(k2, &two, 2).await?;
    assert_eq!([d.bands[0].remaining, d.bands[1].remaining], [3, 98]);
    storage.give_back(k2, &two, 2).await?;
    let d = storage.check(k2, &two, 0).await?;
    assert_eq!([d.bands[0].remaining, d.bands[1].remaining], [5, 100]);
    server.cli(&["SCRIPT", "FLUSH"]);
    assert!(storage.check(k2, &two, 1).await?.allowed);
    Ok(())
}

#[tokio::test]
async fn an_acl_user_with_the_documented_permissions_is_enough_and_each_one_is_needed() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    acl_user(&server, "limiter", &NEEDED);
    let storage = storage_as(&server, "limiter", "acl")
        .await
        .expect("connect as limiter");
    exercise(&storage, &server, "all").await.expect("every operation");
    assert!(server.command_calls("evalsha") >= 6, "decisions go by EVALSHA");
    // the same without each permission in turn
    for missing in NEEDED {
        let grants: Vec<&str> = NEEDED.into_iter().filter(|p| *p != missing).collect();
        let user = format!("no-{}", &missing[1..]);
        acl_user(&server, &user, &grants);
        let storage = storage_as(&server, &user, "acl").await.expect("connect");
        server.cli(&["CONFIG", "RESETSTAT"]);
        let outcome = exercise(&storage, &server, &user).await;
        if missing == "+evalsha" {
            // works, sending the whole script with every call
            outcome.expect("EVAL alone is enough");
            assert_eq!(server.command_calls("evalsha"), 0, "refused, never run");
            assert_eq!(server.command_calls("eval"), 8, "one EVAL per decision");
        } else {
            let err = outcome.expect_err(missing);
            assert_eq!(err.kind(), StorageErrorKind::Other, "{missing}: {err}");
            assert!(err.to_string().contains("ACL"), "{missing}: {err}");
            assert!(!err.to_string().contains("acl:"), "no key in the message: {err}");
            let source = err.source().and_then(|s| s.downcast_ref::<redis::RedisError>());
            assert!(source.is_some(), "{missing}: {err}");
        }
    }
}

#[tokio::test]
async fn a_concurrency_tier_needs_the_slot_commands_and_without_them_charges_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rate = [Quota::per_minute(3)];
    let acquire = Op::Acquire {
        cost: 1,
        slots: Slots {
            limit: 2,
            lease: Duration::from_secs(60),
        },
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let grants: Vec<&str> = NEEDED.into_iter().chain(SLOT_COMMANDS).collect();
    acl_user(&server, "limiter", &grants);
    let storage = storage_as(&server, "limiter", "acl").await.expect("connect");
    let taken = storage.decide(key("free", "ada"), &rate, acquire, &clock).await;
    let taken = taken.expect("an acquire with the documented permissions");
    assert!(taken.allowed && taken.bands[0].remaining == 2, "{taken:?}");
    let release = Op::Release(taken.slots.unwrap().lease.unwrap());
    let released = storage.decide(key("free", "ada"), &rate, release, &clock).await;
    assert_eq!(released.expect("a release").slots.unwrap().in_use, 0);

    // the rate's permissions alone: the acquire fails, and charges nothing
    acl_user(&server, "no-slots", &NEEDED);
    let without = storage_as(&server, "no-slots", "acl").await.expect("connect");
    let err = without
        .decide(key("free", "ada"), &rate, acquire, &clock)
        .await
        .expect_err("the slot commands are needed");
    assert!(err.to_string().contains("ACL"), "{err}");
    let peek = storage.check(key("free", "ada"), &rate, 0).await.unwrap();
    assert_eq!(peek.bands[0].remaining, 2, "the failed acquire charged nothing");
}

#[tokio::test]
async fn keys_outside_the_users_pattern_are_refused_with_a_clear_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    acl_user(&server, "limiter", &NEEDED);
    let storage = storage_as(&server, "limiter", "other").await.expect("connect");
    let err = storage
        .check(key("free", "alice@example.com"), &[Quota::per_minute(3)], 1)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rate-limit storage failed: Redis charge failed: permission denied by the server's ACL \
         (NOPERM this user has no permissions to access one of the keys used as arguments): \
         see the module docs for the permissions the storage needs"
    );
    let source = err.source().and_then(|s| s.downcast_ref::<redis::RedisError>());
    assert_eq!(
        source.map(redis::RedisError::kind),
        Some(redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_shared_with_the_application_recovers_after_a_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let shared = manager(&server, "default").await;
    let tiers = tiers(
        RedisStorage::with_connection_manager(shared.clone())
            .prefix("shared")
            .timeout(TIMEOUT)
            .connect()
            .await
            .unwrap(),
    );
    let mut app = shared.clone();
    let _: () = redis::cmd("SET")
        .arg("app:greeting")
        .arg("hi")
        .query_async(&mut app)
        .await
        .unwrap();
    assert_eq!(tiers.check("s", "one", 1).await.unwrap().unwrap().remaining, 36);
    let mut server = tokio::task::spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        assert!(tiers.check("s", "one", 1).await.is_err());
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(250));
    }
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let restarted = Instant::now();
    let info = loop {
        if let Ok(Ok(info)) = tiers.check("s", "one", 1).await {
            break info;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(2),
            "no decision within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // the restarted server is empty; the application's clone works too
    assert_eq!(info.remaining, 36);
    let _: () = redis::cmd("SET")
        .arg("app:greeting")
        .arg("hi")
        .query_async(&mut app)
        .await
        .unwrap();
    drop(server);
}

#[tokio::test]
async fn connect_checks_that_the_server_answers() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // a user who may not PING is still a server that answers
    acl_user(&server, "limiter", &NEEDED);
    assert!(storage_as(&server, "limiter", "acl").await.is_ok());
    let lazy = redis::Client::open(server.url()).unwrap();
    let lazy = ConnectionManager::new_lazy_with_config(lazy, RedisStorage::manager_config(TIMEOUT)).unwrap();
    drop(server);
    let err = RedisStorage::with_connection_manager(lazy.clone())
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StorageErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("connecting to Redis failed"), "{err}");
    // built lazily, it fails per decision instead
    let storage = RedisStorage::with_connection_manager(lazy)
        .connect_lazy()
        .unwrap();
    assert!(
        storage
            .check(key("t", "u"), &[Quota::per_minute(1)], 1)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_cluster_client_decides_on_the_cluster() {
    let Some(cluster) = cluster() else { return };
    let client = RedisStorage::cluster_client_builder(cluster.urls(), TIMEOUT)
        .build()
        .expect("a cluster client");
    let tiers = tiers(
        RedisStorage::with_cluster_client(client)
            .prefix("own-cluster")
            .connect()
            .await
            .expect("connect to the test cluster"),
    );
    for user in 0..20 {
        let user = format!("u{user}");
        assert_eq!(tiers.check(&user, "one", 1).await.unwrap().unwrap().remaining, 36);
        let info = tiers.check(&user, "bands", 3).await.unwrap().unwrap();
        let remaining: Vec<u32> = info.bands().map(|(_, s)| s.remaining).collect();
        assert_eq!(remaining, vec![20, 997]);
    }
}

#[tokio::test]
async fn an_own_manager_over_tls_with_client_certificates() {
    let Some(tls) = TlsFiles::make() else {
        return;
    };
    let tls_port = free_port();
    let args = tls.server_args(tls_port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(server) = RedisServer::start_with(&args) else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let certificates = |client: bool| TlsCertificates {
        client_tls: client.then(|| ClientTlsConfig {
            client_cert: tls.read("client.crt"),
            client_key: tls.read("client.key"),
        }),
        root_cert: Some(tls.read("ca.crt")),
    };
    let client = redis::Client::build_with_tls(url.as_str(), certificates(true)).unwrap();
    let manager = ConnectionManager::new_with_config(client, RedisStorage::manager_config(TLS_TIMEOUT))
        .await
        .expect("a TLS connection with a client certificate");
    let tiers = tiers(
        RedisStorage::with_connection_manager(manager)
            .prefix("tls")
            .timeout(TLS_TIMEOUT)
            .connect()
            .await
            .unwrap(),
    );
    for left in [36, 35, 34] {
        assert_eq!(tiers.check("t", "one", 1).await.unwrap().unwrap().remaining, left);
    }
    // the server holds the decisions' key
    assert!(server.cli(&["--scan"]).starts_with("tls:{"));
    // without a client certificate, or without TLS, the port refuses
    let anonymous = redis::Client::build_with_tls(url.as_str(), certificates(false)).unwrap();
    assert!(
        ConnectionManager::new_with_config(anonymous, RedisStorage::manager_config(TLS_TIMEOUT))
            .await
            .is_err()
    );
    let plain = redis::Client::open(format!("redis://127.0.0.1:{tls_port}")).unwrap();
    assert!(
        ConnectionManager::new_with_config(plain, RedisStorage::manager_config(TLS_TIMEOUT))
            .await
            .is_err()
    );
}
