//! Unit tests of the storage against a `redis-server` of their own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use super::script::decode;
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
    // the server's time, no band triples: three full decisions
    cmd.arg(script::BATCH_CONTRACT).arg(3).arg("").arg(0);
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
    let first = decode(items[0].clone(), &[[1_000_000; 3]]).unwrap();
    let third = decode(items[2].clone(), &[[30_000_000, 60_000_000, 30_000_000]]).unwrap();
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

/// Short decisions (a charge of one limited band, decided inline by the
/// batch script): a key asked for twice sees its first charge, a bad band
/// triple fails its decision only, and where the batch's one `MGET` fails
/// (here an ACL without `MGET`) each reads its own key, a key of another
/// type being a fresh state.
#[tokio::test]
async fn short_decisions_fail_alone_and_see_the_batchs_own_writes() {
    let Some(server) = Server::start() else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", server.1);
    let admin = redis::Client::open(url.as_str()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let acl = [
        "SETUSER",
        "limited",
        "on",
        ">pw",
        "resetkeys",
        "~p:*",
        "-@all",
        "+evalsha",
        "+eval",
        "+time",
        "+get",
        "+set",
        "+del",
    ];
    let _: () = redis::cmd("ACL")
        .arg(&acl[..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let limited = redis::Client::open(format!("redis://limited:pw@127.0.0.1:{}", server.1)).unwrap();
    let mut conn = limited.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&["p:h", "f", "v"])
        .query_async(&mut admin)
        .await
        .unwrap();
    // far ahead (a clock that went back): clamped to one full burst, denied
    let _: () = redis::cmd("SET")
        .arg(&["p:b", "8000000000000000"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script::BATCH).arg(6);
    cmd.arg(&["p:a", "p:a", "p:h", "p:b", "p:c", "p:b"]);
    // the server's time; triple s1 per_second(1) with a burst of 3, triple
    // s2 with a tolerance below its interval
    cmd.arg(script::BATCH_CONTRACT).arg(6).arg("").arg(2);
    cmd.arg(&[1_000_000, 3_000_000, 1_000_000, 5, 1, 5]);
    cmd.arg(&["s1", "s1", "s1", "s2"]);
    // a full decision: the same band, through the single script's code
    cmd.arg(1)
        .arg("c")
        .arg("")
        .arg(&[1_000_000, 3_000_000, 1_000_000]);
    cmd.arg("s1");
    let reply: redis::Value = cmd.query_async(&mut conn).await.unwrap();
    let redis::Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(items.len(), 7, "six decisions and their time: {items:?}");
    assert_eq!(items[0], redis::Value::Int(1_000_000), "one second of three used");
    assert_eq!(items[1], redis::Value::Int(2_000_000), "the first charge seen");
    assert_eq!(items[2], redis::Value::Int(1_000_000), "a hash is a fresh state");
    assert_eq!(
        items[3],
        redis::Value::BulkString(b"ERR tower-rate-tier: bad band arguments".to_vec())
    );
    let full = decode(items[4].clone(), &[[1_000_000, 3_000_000, 1_000_000]]).unwrap();
    assert!(full.allowed);
    assert_eq!(full.bands[0].remaining, 2);
    assert_eq!(items[5], redis::Value::Int(-3_000_001), "denied, all three used");
    let redis::Value::Int(now) = items[6] else {
        panic!("{items:?}")
    };
    assert_eq!(full.now, u64::try_from(now).unwrap() * 1_000, "one TIME per call");
    // the key asked for twice holds both charges; the clamp is written back
    for (key, used) in [("p:a", 2_000_000), ("p:b", 3_000_000)] {
        let tat: i64 = redis::cmd("GET").arg(key).query_async(&mut admin).await.unwrap();
        assert_eq!(tat, now + used, "{key}");
    }
}
