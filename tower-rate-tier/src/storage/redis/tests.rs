//! Unit tests of the storage against a `redis-server` of their own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use super::*;
use crate::clock::FakeClock;
use crate::storage::MemoryStorage;

/// A `redis-server` of this test's own on a free loopback port, killed on
/// drop; `None` (after a loud message) when it is not installed, outside
/// CI. The integration tests (`tests/redis.rs`) have the full harness.
struct Server(Child, u16);

impl Server {
    fn start() -> Option<Server> {
        let port = TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            assert!(std::env::var_os("CI").is_none(), "redis-server is missing in CI");
            let _ = writeln!(std::io::stderr(), "!! SKIPPED: redis-server not found");
            return None;
        };
        let server = Server(child, port);
        for _ in 0..500 {
            let mut pong = [0u8; 7];
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                if s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut pong).is_ok() {
                    return Some(server);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not answer on port {port}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_refund_reports_every_bands_state_after_it() {
    let Some(server) = Server::start() else {
        return;
    };
    let clock = FakeClock::new();
    let redis = RedisStorage::builder(format!("redis://127.0.0.1:{}", server.1))
        .client_clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let memory = MemoryStorage::new();
    let fake: Arc<dyn Clock> = Arc::new(clock.clone());
    let bands = [Quota::per_second(10), Quota::per_minute(100), Quota::unlimited()];
    let key = StorageKey {
        namespace: "",
        tier: "t",
        user: "refund",
    };
    for (op, advance) in [
        (Op::Charge(5), 30),
        (Op::Refund(2), 50),
        (Op::Charge(4), 0),
        (Op::Refund(50), 0),
    ] {
        clock.advance(Duration::from_millis(advance));
        let decided = redis.run(key, &bands, op).await.unwrap();
        let remembered = memory.decide(key, &bands, op, &fake).await.unwrap();
        assert!(remembered.allowed);
        // what the call reports is what the next peek (of either storage) sees
        assert_eq!(
            decided,
            redis.run(key, &bands, Op::Charge(0)).await.unwrap(),
            "{op:?}"
        );
        assert_eq!(
            decided,
            memory.decide(key, &bands, Op::Charge(0), &fake).await.unwrap(),
            "{op:?}"
        );
    }
    // the last refund filled every band: fresh states
    let d = redis.run(key, &bands, Op::Charge(0)).await.unwrap();
    assert_eq!([d.bands[0].remaining, d.bands[1].remaining], [10, 100]);
}

/// The batch script decides each decision on its own: one with bad
/// arguments gets its error, the others their decisions, all at one `TIME`.
#[tokio::test]
async fn one_bad_decision_never_fails_its_batch() {
    let Some(server) = Server::start() else {
        return;
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server.1)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script::BATCH).arg(3).arg("k1").arg("k2").arg("k3");
    cmd.arg(script::BATCH_CONTRACT).arg(3);
    // per_second(1) charged 1; a tolerance below the interval; per_minute(2)
    cmd.arg(1)
        .arg("c")
        .arg("")
        .arg(1_000_000)
        .arg(1_000_000)
        .arg(1_000_000);
    cmd.arg(1).arg("c").arg("").arg(5).arg(1).arg(5);
    cmd.arg(1)
        .arg("c")
        .arg("")
        .arg(30_000_000)
        .arg(60_000_000)
        .arg(30_000_000);
    let reply: redis::Value = cmd.query_async(&mut conn).await.unwrap();
    let redis::Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(items.len(), 3);
    assert_eq!(
        items[1],
        redis::Value::BulkString(b"ERR tower-rate-tier: bad band arguments".to_vec())
    );
    let first = decode(items[0].clone(), 1).unwrap();
    let third = decode(items[2].clone(), 1).unwrap();
    assert!(first.allowed && third.allowed);
    assert_eq!((first.bands[0].remaining, third.bands[0].remaining), (0, 1));
    assert_eq!(first.now, third.now, "one TIME per call");
    // a caller of another contract is refused as a whole
    let mut other = redis::cmd("EVAL");
    other
        .arg(script::BATCH)
        .arg(1)
        .arg("k1")
        .arg("trt-batch-0")
        .arg(1);
    other.arg(1).arg("c").arg("").arg(1).arg(1).arg(1);
    let err = other.query_async::<redis::Value>(&mut conn).await.unwrap_err();
    assert!(err.to_string().contains("unknown batch contract"), "{err}");
}
