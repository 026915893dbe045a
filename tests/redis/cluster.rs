//! Redis Cluster connections: lazy, a dead node, hung links, runtimes that end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tower_rate_tier::storage::RedisStorage;
use tower_rate_tier::{CheckError, Quota};
use tower_rate_tier_tests::redis::{RedisServer, cluster, own_cluster};

use super::{key, tiers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_storage_connects_with_the_first_decision() {
    let Some(cluster) = cluster() else { return };
    let lazy = tiers(
        RedisStorage::cluster(cluster.urls())
            .prefix("trt-cluster-lazy")
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    for expected in [36, 35, 34] {
        let info = lazy.check("lazy", "one", 1).await.unwrap().unwrap();
        assert_eq!(info.remaining, expected);
    }
    // and a cluster that is not there: an error within the timeout, no hang
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    drop(server);
    let gone = tiers(
        RedisStorage::cluster([url])
            .timeout(Duration::from_millis(250))
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    let started = Instant::now();
    assert!(matches!(
        gone.check("x", "one", 1).await,
        Err(CheckError::Storage(_))
    ));
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cluster_node_fails_its_keys_within_the_timeout_and_others_are_served() {
    let Some(mut cluster) = own_cluster() else { return };
    let timeout = Duration::from_millis(250);
    let storage = RedisStorage::cluster(cluster.urls())
        .prefix("trt-node-down")
        .timeout(timeout)
        .connect()
        .await
        .expect("connect to the test cluster");
    let tiers = tiers(storage.clone());
    // 30 users, each with one check counted, spread over the three nodes
    let users: Vec<String> = (0..30).map(|i| format!("user-{i}")).collect();
    for user in &users {
        assert_eq!(tiers.check(user, "one", 1).await.unwrap().unwrap().remaining, 36);
    }
    // which node holds each user's key
    let owner = |user: &str| {
        let key = storage.band_key(key("one", user), &Quota::per_day(37));
        cluster
            .nodes()
            .iter()
            .position(|n| n.cli(&["EXISTS", &key]).trim() == "1")
            .expect("the key is on some node")
    };
    let owners: Vec<usize> = users.iter().map(|u| owner(u)).collect();
    assert!(
        owners.iter().any(|&o| o != 2) && owners.contains(&2),
        "{owners:?}"
    );
    cluster.nodes_mut()[2].kill();
    let killed = Instant::now();
    // within the cluster's node timeout (5 s) the other nodes still serve
    // their slots: their users are counted on; the dead node's users fail
    // fast, every call within the timeout (no hang, no panic)
    for round in 0..2 {
        for (user, &node) in users.iter().zip(&owners) {
            let started = Instant::now();
            let result = tiers.check(user, "one", 1).await;
            let took = started.elapsed();
            assert!(took < timeout + Duration::from_millis(250), "{user}: {took:?}");
            if node == 2 {
                assert!(
                    matches!(result, Err(CheckError::Storage(_))),
                    "{user}: {result:?}"
                );
            } else {
                let info = result.unwrap().unwrap();
                assert_eq!(info.remaining, 35 - round, "{user}");
            }
        }
    }
    // (all of it well inside the node timeout, after which a cluster without
    // replicas refuses every key)
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "{:?}",
        killed.elapsed()
    );
}

/// A TCP proxy to `target`: while `open` is false it accepts connections and
/// never answers (a hung link); once open it forwards, `delay` per chunk each
/// way. Returns its `redis://` URL.
async fn hanging_then_slow_proxy(target: String, open: Arc<AtomicBool>, delay: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        delay: Duration,
    ) {
        let mut buf = vec![0u8; 65536];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            tokio::time::sleep(delay).await;
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let target = target.clone();
            let open = open.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if !open {
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    return drop(client);
                }
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let ((cr, cw), (sr, sw)) = (client.into_split(), server.into_split());
                tokio::join!(pump(cr, sw, delay), pump(sr, cw, delay));
            });
        }
    });
    format!("redis://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_connects_under_steady_traffic_after_a_hang_at_start() {
    // The cluster's seed is behind a link that hangs for 600 ms, then
    // forwards with 3 ms of delay each way; checks arrive one per ms with the
    // default 250 ms timeout. A connection attempt must not be cut short by
    // the check that started it timing out (every later attempt would then
    // get only the gap between two checks).
    let Some(cluster) = cluster() else { return };
    let seed = cluster.urls()[0].trim_start_matches("redis://").to_owned();
    let open = Arc::new(AtomicBool::new(false));
    let url = hanging_then_slow_proxy(seed, open.clone(), Duration::from_millis(3)).await;
    let tiers = tiers(
        RedisStorage::cluster([url])
            .prefix("trt-lazy-hang")
            .connect_lazy()
            .expect("a lazy cluster storage"),
    );
    let started = Instant::now();
    let mut opened = None;
    let first_ok: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    let mut checks = Vec::new();
    let mut i = 0u32;
    while started.elapsed() < Duration::from_millis(2_600) {
        if opened.is_none() && started.elapsed() > Duration::from_millis(600) {
            open.store(true, Ordering::SeqCst);
            opened = Some(Instant::now());
        }
        i += 1;
        let (tiers, first_ok) = (tiers.clone(), first_ok.clone());
        checks.push(tokio::spawn(async move {
            if let Ok(Ok(_)) = tiers.check(&format!("hang-{}", i % 50), "one", 1).await {
                first_ok.lock().unwrap().get_or_insert_with(Instant::now);
            }
        }));
        ticker.tick().await;
    }
    for check in checks {
        check.await.unwrap();
    }
    let opened = opened.expect("the link was opened");
    let first = first_ok
        .lock()
        .unwrap()
        .map(|at| at.saturating_duration_since(opened));
    // the attempt that started during the hang gives up after its own
    // timeout (1 s); the next one connects through the slow link
    assert!(
        first.is_some_and(|d| d < Duration::from_millis(1_500)),
        "first success {first:?} after the link opened"
    );
}

#[test]
fn an_attempt_stranded_on_an_idle_runtime_does_not_block_the_cluster_link() {
    // The first decision runs on a runtime that is then kept but no longer
    // driven, and leaves a connect attempt there (the seed hangs). Decisions
    // on a driven runtime must not wait on that attempt forever.
    let Some(cluster) = cluster() else { return };
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seed = cluster.urls()[0].trim_start_matches("redis://").to_owned();
    let open = Arc::new(AtomicBool::new(false));
    let url = serving.block_on(hanging_then_slow_proxy(seed, open.clone(), Duration::ZERO));
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tiers = first.block_on(async {
        tiers(
            RedisStorage::cluster([url])
                .prefix("trt-idle-runtime")
                .connect_lazy()
                .unwrap(),
        )
    });
    assert!(first.block_on(tiers.check("idle", "one", 1)).is_err());
    open.store(true, Ordering::SeqCst);
    let served = serving.block_on(async {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            if let Ok(Ok(info)) = tiers.check("idle", "one", 1).await {
                return Some((started.elapsed(), info.remaining));
            }
        }
        None
    });
    // the stranded attempt is given up after its own timeout (1 s)
    assert!(
        served.is_some_and(|(after, remaining)| after < Duration::from_millis(2_500) && remaining == 36),
        "{served:?}"
    );
    drop(first);
}

/// A storage built in one runtime, used there, then used from another
/// runtime after the first has ended (a `static` storage shared by
/// `#[tokio::test]`s, say): at most one failed decision, then counted again.
fn outlives_its_first_runtime(make: impl std::future::Future<Output = RedisStorage>, user: &str) {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let storage = first.block_on(make);
    let tiers = tiers(storage);
    let remaining = |r: tower_rate_tier::CheckResult| r.ok().and_then(Result::ok).map(|i| i.remaining);
    assert_eq!(remaining(first.block_on(tiers.check(user, "one", 1))), Some(36));
    drop(first);
    let second = runtime();
    let results: Vec<Option<u32>> = (0..4)
        .map(|_| remaining(second.block_on(tiers.check(user, "one", 1))))
        .collect();
    let counted: Vec<u32> = results.iter().flatten().copied().collect();
    assert!(counted.len() >= 3, "{results:?}");
    assert_eq!(
        counted,
        (36 - counted.len() as u32..36).rev().collect::<Vec<_>>(),
        "{results:?}"
    );
}

#[test]
fn a_storage_outlives_the_runtime_of_its_first_decisions() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    outlives_its_first_runtime(
        async {
            RedisStorage::builder(url.clone())
                .prefix("rt-a")
                .connect_lazy()
                .unwrap()
        },
        "a",
    );
    outlives_its_first_runtime(
        async {
            RedisStorage::builder(url.clone())
                .prefix("rt-b")
                .connect()
                .await
                .unwrap()
        },
        "b",
    );
    // a manager of the application's own, made on the first runtime
    outlives_its_first_runtime(
        async {
            let client = redis::Client::open(url.clone()).unwrap();
            let config = RedisStorage::manager_config(Duration::from_millis(250));
            let manager = redis::aio::ConnectionManager::new_with_config(client, config)
                .await
                .unwrap();
            RedisStorage::with_connection_manager(manager)
                .prefix("rt-e")
                .connect()
                .await
                .unwrap()
        },
        "e",
    );
    let Some(cluster) = cluster() else { return };
    let urls = cluster.urls();
    // a cluster client of the application's own
    outlives_its_first_runtime(
        async {
            let client = RedisStorage::cluster_client_builder(urls.clone(), Duration::from_millis(250))
                .build()
                .unwrap();
            RedisStorage::with_cluster_client(client)
                .prefix("rt-f")
                .connect()
                .await
                .unwrap()
        },
        "f",
    );
    outlives_its_first_runtime(
        async {
            RedisStorage::cluster(urls.clone())
                .prefix("rt-c")
                .connect_lazy()
                .unwrap()
        },
        "c",
    );
    outlives_its_first_runtime(
        async {
            RedisStorage::cluster(urls.clone())
                .prefix("rt-d")
                .connect()
                .await
                .unwrap()
        },
        "d",
    );
}
