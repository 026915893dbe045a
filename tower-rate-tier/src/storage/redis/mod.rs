//! GCRA state in Redis (or Valkey), shared by every instance of a service.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_rate_tier::{Quota, RateTier, storage::RedisStorage};
//!
//! let storage = RedisStorage::builder("redis://127.0.0.1:6379")
//!     .prefix("myapp")
//!     .timeout(Duration::from_millis(100))
//!     .connect()
//!     .await?;
//! let tiers = RateTier::builder().tier("free", Quota::per_hour(100)).storage(storage).build();
//! let info = tiers.check("user-1", "free", 1).await?.unwrap();
//! assert_eq!(info.remaining, 99);
//! # Ok(())
//! # }
//! ```
//!
//! # How a decision is made
//!
//! One Lua script call per decision (`EVALSHA`, falling back to `EVAL` after
//! a `NOSCRIPT` reply, and to `EVAL` only where the server refuses
//! `EVALSHA`). The script reads the time with Redis's `TIME` (never a client
//! clock), decides every band of the tier in integer microseconds, and either
//! charges every band or writes nothing. Every write sets an expiry of the
//! time until the band is full again (plus 1 ms), so keys vanish on their own.
//!
//! # Keys
//!
//! `{prefix}:{<hash>}:b0`, `{prefix}:{<hash>}:b1`, ... one key per band, where
//! `<hash>` is the first 128 bits (hex) of SHA-256 over the namespace, tier
//! and user id (HMAC-SHA-256 under a [secret](RedisStorageBuilder::hash_secret)
//! when one is set). User ids are never stored in plain text. All keys of one
//! decision share the `{<hash>}` hash tag, so Redis Cluster puts them in one
//! slot. [`RedisStorage::key_for`] names a key.
//!
//! # Failures
//!
//! Every call is bounded by a [timeout](RedisStorageBuilder::timeout)
//! (default [`DEFAULT_TIMEOUT`], 250 ms). A call that times out fails with
//! [`StorageErrorKind::Timeout`]; an unreachable server fails with
//! [`StorageErrorKind::Unavailable`], fast, without waiting for a reconnect
//! backoff; the `RateTier` reports either as `CheckError::Storage` and the
//! layer applies its `OnStorageError` policy. **A script that timed out on
//! our side may still have run on the server and counted the request.** A
//! failed call starts a reconnect in the background; a decision that meets
//! the refusal such an attempt left behind (the command was not sent) tries
//! once more, so the first decision after Redis is back is served. A
//! cluster connection is
//! made by a task of its own (a slow connect is never cut short by a
//! caller's timeout) and is made again when the runtime that ran it has
//! ended. A malformed stored value is treated as a fresh
//! state, never a panic or a permanent deny. On a Cluster, the driver retries
//! a call once after a redirection (`MOVED`/`ASK`) or a connection error; a
//! retry after a connection error can, like a timeout, count a request that
//! had already been counted.
//!
//! [`RedisStorageBuilder::connect`] fails while Redis is down;
//! [`RedisStorageBuilder::connect_lazy`] returns at once and connects with
//! the first decision, for services that must start during an outage.
//!
//! A connection's driver task runs on the tokio runtime that made it. Use a
//! storage from runtimes that keep running (a server's): a connection made on
//! a runtime that is kept alive but no longer driven (a `block_on` that has
//! returned) stops answering, and decisions through it time out. A runtime
//! that has ended is fine: the next decisions connect again.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::{BandStates, Decision, Storage, StorageError, StorageErrorKind, StorageKey};
use crate::clock::Clock;
use crate::gcra::BandState;
use crate::quota::Quota;

/// The default per-call timeout: 250 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "trt";

const SCRIPT: &str = include_str!("redis.lua");

/// Durations passed to the script are capped here (about 71 years) so that
/// the script's sums stay exact in Lua's doubles.
const MAX_SPAN_US: u64 = 1 << 51;

type KeyBuf = SmallVec<[u8; 64]>;

/// GCRA state in Redis, shared by every process that uses the same server
/// (or cluster) and prefix. See the [module documentation](self).
///
/// Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisStorage {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    keys: KeyCodec,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    sha: Box<str>,
    /// The server refused `EVALSHA`: send the script with every call.
    eval_only: AtomicBool,
}

/// Turns a [`StorageKey`] into key names.
struct KeyCodec {
    prefix: Box<str>,
    secret: Option<Hmac<Sha256>>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<ClusterLink>),
}

/// A Redis Cluster connection, made (and made again) by a task of its own:
/// an attempt is never cut short by the call that started it timing out, and
/// a connection whose driver task is gone (its runtime ended) is replaced by
/// the next call.
struct ClusterLink {
    client: ClusterClient,
    /// How long one attempt may take.
    connect_timeout: Duration,
    slot: std::sync::Mutex<Slot>,
    /// Numbers the attempts (and so the connections they make).
    attempts: std::sync::atomic::AtomicU64,
}

/// What an attempt ends with: the connection and its number, or the error.
type Outcome = Option<Result<(u64, ClusterConnection), RedisError>>;

enum Slot {
    Idle,
    /// Attempt `id` runs since `since`; `ended` turns `Some` when it ends.
    Connecting {
        id: u64,
        since: std::time::Instant,
        ended: tokio::sync::watch::Receiver<Outcome>,
    },
    Ready {
        id: u64,
        conn: ClusterConnection,
    },
}

impl ClusterLink {
    fn new(client: ClusterClient, connect_timeout: Duration) -> Self {
        ClusterLink {
            client,
            connect_timeout,
            slot: std::sync::Mutex::new(Slot::Idle),
            attempts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The connection and its number, waiting for an attempt (started now
    /// if none runs).
    async fn connection(self: &Arc<Self>) -> Result<(u64, ClusterConnection), RedisError> {
        let mut ended = {
            let mut slot = self.slot();
            match &*slot {
                Slot::Ready { id, conn } => return Ok((*id, conn.clone())),
                // An attempt whose task is gone (its runtime ended), or that
                // overran its own timeout (its runtime is no longer driven),
                // counts as none.
                Slot::Connecting { since, ended, .. }
                    if ended.has_changed().is_ok()
                        && since.elapsed() <= self.connect_timeout + Duration::from_millis(250) =>
                {
                    ended.clone()
                }
                Slot::Connecting { .. } | Slot::Idle => {
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        return Err(RedisError::from((
                            ErrorKind::Client,
                            "the Redis storage is used outside a tokio runtime",
                        )));
                    };
                    let id = self.attempts.fetch_add(1, Ordering::Relaxed);
                    let (done, ended) = tokio::sync::watch::channel(None);
                    *slot = Slot::Connecting {
                        id,
                        since: std::time::Instant::now(),
                        ended: ended.clone(),
                    };
                    runtime.spawn(Self::attempt(Arc::downgrade(self), id, done));
                    ended
                }
            }
        };
        let outcome = ended.wait_for(Option::is_some).await.ok().and_then(|o| o.clone());
        outcome.unwrap_or_else(|| {
            Err(RedisError::from((
                ErrorKind::Io,
                "could not connect to the Redis Cluster",
            )))
        })
    }

    async fn attempt(link: std::sync::Weak<Self>, id: u64, done: tokio::sync::watch::Sender<Outcome>) {
        let Some((client, timeout)) = link.upgrade().map(|l| (l.client.clone(), l.connect_timeout)) else {
            return;
        };
        let outcome = match tokio::time::timeout(timeout, client.get_async_connection()).await {
            Ok(Ok(conn)) => Ok((id, conn)),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting to the Redis Cluster timed out",
            ))),
        };
        if let Some(link) = link.upgrade() {
            let mut slot = link.slot();
            // Only while this attempt is still the current one.
            if matches!(*slot, Slot::Connecting { id: current, .. } if current == id) {
                *slot = match &outcome {
                    Ok((_, conn)) => Slot::Ready {
                        id,
                        conn: conn.clone(),
                    },
                    Err(_) => Slot::Idle,
                };
            }
        }
        let _ = done.send(Some(outcome));
    }

    /// Drops connection `id` after `error` if it says the connection's driver
    /// task is gone, so that the next call connects again.
    fn check(&self, id: u64, error: &RedisError) {
        if error.is_io_error() && error.to_string().contains("redis_cluster: Unable to") {
            let mut slot = self.slot();
            if matches!(*slot, Slot::Ready { id: current, .. } if current == id) {
                *slot = Slot::Idle;
            }
        }
    }
}

/// Configures a [`RedisStorage`]; see [`RedisStorage::builder`] and
/// [`RedisStorage::cluster`].
pub struct RedisStorageBuilder {
    urls: Vec<String>,
    cluster: bool,
    prefix: String,
    timeout: Duration,
    secret: Option<Vec<u8>>,
    clock: Option<Arc<dyn Clock>>,
}

impl RedisStorage {
    /// Connects to one Redis server with the defaults (prefix `trt`, timeout
    /// 250 ms): `RedisStorage::connect("redis://127.0.0.1:6379").await?`.
    ///
    /// Fails when the URL is invalid or the server does not answer.
    pub async fn connect(url: &str) -> Result<RedisStorage, StorageError> {
        Self::builder(url).connect().await
    }

    /// Configures a storage on one Redis server (`redis://host:port/db`,
    /// `rediss://` needs a TLS feature of the `redis` crate).
    pub fn builder(url: impl Into<String>) -> RedisStorageBuilder {
        RedisStorageBuilder::new(vec![url.into()], false)
    }

    /// Configures a storage on a Redis Cluster, given some of its nodes.
    pub fn cluster<I>(urls: I) -> RedisStorageBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStorageBuilder::new(urls.into_iter().map(Into::into).collect(), true)
    }

    /// The name of the Redis key that holds band `band` (0-based, in the
    /// tier's order) of `key`. For inspection and tests; the storage never
    /// needs it spelled out.
    pub fn key_for(&self, key: StorageKey<'_>, band: usize) -> String {
        let mut base = self.inner.keys.base_key(key);
        push_band(&mut base, band);
        String::from_utf8_lossy(&base).into_owned()
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.keys.prefix
    }
}

impl RedisStorageBuilder {
    fn new(urls: Vec<String>, cluster: bool) -> Self {
        RedisStorageBuilder {
            urls,
            cluster,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            secret: None,
            clock: None,
        }
    }

    /// The first part of every key (default `trt`). Storages with different
    /// prefixes never share state. It must not contain `{` or `}` (the hash
    /// tag is the storage's own); [`connect`](Self::connect) and
    /// [`connect_lazy`](Self::connect_lazy) refuse it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one call may take, connecting included (default 250 ms; at
    /// least 1 ms). A call that takes longer fails with
    /// [`StorageErrorKind::Timeout`]; the script may still have run and
    /// counted the request.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Hashes user ids with HMAC-SHA-256 under `secret` instead of plain
    /// SHA-256. Plain hashes hide high-entropy ids (API keys), but ids with
    /// little entropy (emails, IP addresses, numeric ids) can be recovered by
    /// hashing every candidate; with a secret kept out of Redis they cannot.
    /// Every instance must use the same secret; changing it starts every
    /// bucket afresh.
    pub fn hash_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Test mode: decide with `clock` (for example a `FakeClock`) instead of
    /// the server's `TIME`. Never use it with several processes: their clocks
    /// disagree. Key expiry still runs on the server's clock, so a clock that
    /// runs far ahead or behind real time only keeps keys longer or shorter.
    pub fn client_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Connects and returns the storage. Fails when a URL is invalid or the
    /// server (any cluster node given) does not answer within the timeout
    /// (at least 1 s for this first connection).
    pub async fn connect(self) -> Result<RedisStorage, StorageError> {
        let keys = KeyCodec::new(self.prefix.clone(), self.secret.as_deref())?;
        let connect_timeout = self.timeout.max(Duration::from_secs(1));
        let conn = if self.cluster {
            let link = Arc::new(ClusterLink::new(self.cluster_client()?, connect_timeout));
            tokio::time::timeout(connect_timeout, link.connection())
                .await
                .map_err(|_| timeout_error(connect_timeout))?
                .map_err(|e| error_from(&e))?;
            Conn::Cluster(link)
        } else {
            let client = self.single_client()?;
            let conn = tokio::time::timeout(
                connect_timeout,
                ConnectionManager::new_with_config(client, self.manager_config()),
            )
            .await
            .map_err(|_| timeout_error(connect_timeout))?
            .map_err(|e| error_from(&e))?;
            Conn::Single(conn)
        };
        Ok(self.storage(keys, conn))
    }

    /// Returns the storage at once and connects with the first decision
    /// (for a service that must start while Redis is down). Until Redis
    /// answers, every decision fails like one on a lost connection
    /// ([`StorageErrorKind::Unavailable`] or [`StorageErrorKind::Timeout`],
    /// within the timeout), which the layer answers by its
    /// `OnStorageError` policy; later decisions connect again. A connection
    /// refused for a reason other than the network (a wrong password, a
    /// database that cannot be selected) is a configuration error that a
    /// single-server storage keeps reporting: build it again with the right
    /// URL.
    ///
    /// Fails at once when a URL, the prefix or the secret is invalid, or
    /// when called outside a tokio runtime (the connection's background task
    /// needs one).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_rate_tier::{Quota, RateTier, storage::RedisStorage};
    ///
    /// let storage = RedisStorage::builder("redis://127.0.0.1:6379").connect_lazy()?;
    /// let tiers = RateTier::builder().tier("free", Quota::per_hour(100)).storage(storage).build();
    /// // fails (storage error) while Redis is down, counts once it is up
    /// let _ = tiers.check("user-1", "free", 1).await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_lazy(self) -> Result<RedisStorage, StorageError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StorageError::new(
                StorageErrorKind::Other,
                "RedisStorageBuilder::connect_lazy must be called inside a tokio runtime",
            ));
        }
        let keys = KeyCodec::new(self.prefix.clone(), self.secret.as_deref())?;
        let conn = if self.cluster {
            let connect_timeout = self.timeout.max(Duration::from_secs(1));
            Conn::Cluster(Arc::new(ClusterLink::new(
                self.cluster_client()?,
                connect_timeout,
            )))
        } else {
            let client = self.single_client()?;
            let conn = ConnectionManager::new_lazy_with_config(client, self.manager_config())
                .map_err(|e| error_from(&e))?;
            Conn::Single(conn)
        };
        Ok(self.storage(keys, conn))
    }

    fn cluster_client(&self) -> Result<ClusterClient, StorageError> {
        ClusterClientBuilder::new(self.urls.clone())
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(1)
            .min_retry_wait(5)
            .max_retry_wait(50)
            .build()
            .map_err(|e| error_from(&e))
    }

    fn single_client(&self) -> Result<redis::Client, StorageError> {
        let Some(url) = self.urls.first() else {
            return Err(StorageError::new(StorageErrorKind::Other, "no Redis URL given"));
        };
        redis::Client::open(url.as_str()).map_err(|e| error_from(&e))
    }

    /// Fail fast while the server is down: one connection attempt per
    /// reconnect (bounded by the timeout), no backoff sleeps. The manager
    /// starts a new attempt when a call meets a broken connection.
    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_min_delay(Duration::from_millis(1))
            .set_max_delay(Duration::from_millis(10))
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }

    fn storage(self, keys: KeyCodec, conn: Conn) -> RedisStorage {
        let sha = redis::Script::new(SCRIPT).get_hash().into();
        RedisStorage {
            inner: Arc::new(Inner {
                conn,
                keys,
                timeout: self.timeout,
                clock: self.clock,
                sha,
                eval_only: AtomicBool::new(false),
            }),
        }
    }
}

impl KeyCodec {
    fn new(prefix: String, secret: Option<&[u8]>) -> Result<Self, StorageError> {
        if prefix.contains(['{', '}']) {
            // Cluster would take a brace pair in the prefix as every key's
            // hash tag: all users in one slot.
            return Err(StorageError::new(
                StorageErrorKind::Other,
                "the Redis key prefix must not contain `{` or `}`",
            ));
        }
        let secret = match secret {
            None => None,
            Some(bytes) => Some(
                <Hmac<Sha256> as KeyInit>::new_from_slice(bytes)
                    .map_err(|_| StorageError::new(StorageErrorKind::Other, "the hash secret was refused"))?,
            ),
        };
        Ok(KeyCodec {
            prefix: prefix.into(),
            secret,
        })
    }

    /// `{prefix}:{<hash>}:b` (the band index follows).
    fn base_key(&self, key: StorageKey<'_>) -> KeyBuf {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest: [u8; 32] = match &self.secret {
            Some(mac) => {
                let mut mac = mac.clone();
                feed(|part| mac.update(part), key);
                mac.finalize().into_bytes().into()
            }
            None => {
                let mut hasher = Sha256::new();
                feed(|part| hasher.update(part), key);
                hasher.finalize().into()
            }
        };
        let mut out = KeyBuf::new();
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(b":{");
        for byte in &digest[..16] {
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        }
        out.extend_from_slice(b"}:b");
        out
    }
}

impl Inner {
    /// Runs the script once within the timeout.
    async fn run(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        refund: bool,
        cost: u32,
    ) -> Result<Vec<i64>, StorageError> {
        let args = self.script_args(key, bands, refund, cost);
        let call = async {
            match self.call(&args).await {
                // A refused connection means the command was not sent: it
                // may be the refusal that an earlier reconnect attempt left
                // behind (during an outage that has ended since), so one
                // more try reconnects now rather than failing this decision.
                Err(e) if e.is_connection_refusal() => self.call(&args).await,
                other => other,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(timeout_error(self.timeout)),
            Ok(Err(e)) => Err(error_from(&e)),
            Ok(Ok(value)) => parse_ints(value),
        }
    }

    /// One script call (EVALSHA, or EVAL when needed).
    async fn call(&self, args: &Args) -> Result<Value, RedisError> {
        let mut conn = self.conn.clone();
        if !self.eval_only.load(Ordering::Relaxed) {
            let reply = conn.query(&self.command(args, true)).await;
            match reply {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {}
                Err(e) if refuses_evalsha(&e) => {
                    tracing::warn!("Redis refuses EVALSHA; sending the rate-limit script with every call");
                    self.eval_only.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        conn.query(&self.command(args, false)).await
    }

    /// Keys and arguments after `EVAL[SHA] script|sha numkeys`.
    fn script_args(&self, key: StorageKey<'_>, bands: &[Quota], refund: bool, cost: u32) -> Args {
        let base = self.keys.base_key(key);
        let mut keys = SmallVec::new();
        for i in 0..bands.len() {
            let mut k = base.clone();
            push_band(&mut k, i);
            keys.push(k);
        }
        let now = self.clock.as_ref().map(|clock| clock.now() / 1_000);
        let mut spans = SmallVec::new();
        for quota in bands {
            if quota.is_unlimited() {
                spans.push([0, 0, 0]);
                continue;
            }
            let interval = quota
                .emission_interval_nanos()
                .div_ceil(1_000)
                .clamp(1, MAX_SPAN_US);
            let tolerance = interval.saturating_mul(u64::from(quota.burst())).min(MAX_SPAN_US);
            let increment = interval.saturating_mul(u64::from(cost)).min(MAX_SPAN_US);
            spans.push([interval, tolerance, increment]);
        }
        Args {
            keys,
            mode: if refund { "r" } else { "c" },
            now,
            spans,
        }
    }

    fn command(&self, args: &Args, by_sha: bool) -> Cmd {
        let keys: usize = args.keys.iter().map(|k| k.len()).sum();
        let size = if by_sha { 48 } else { SCRIPT.len() + 8 } + keys + 24 + 60 * args.spans.len();
        let mut cmd = Cmd::with_capacity(5 + 4 * args.keys.len(), size);
        if by_sha {
            cmd.arg("EVALSHA").arg(&*self.sha);
        } else {
            cmd.arg("EVAL").arg(SCRIPT);
        }
        cmd.arg(args.keys.len());
        for key in &args.keys {
            cmd.arg(&key[..]);
        }
        cmd.arg(args.mode);
        match args.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        for span in &args.spans {
            cmd.arg(span[0]).arg(span[1]).arg(span[2]);
        }
        cmd
    }
}

struct Args {
    keys: SmallVec<[KeyBuf; 2]>,
    mode: &'static str,
    now: Option<u64>,
    spans: SmallVec<[[u64; 3]; 2]>,
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(link) => {
                let (id, mut conn) = link.connection().await?;
                let reply = cmd.query_async(&mut conn).await;
                if let Err(error) = &reply {
                    link.check(id, error);
                }
                reply
            }
        }
    }
}

/// Feeds the unambiguous encoding `[len][namespace][len][tier][user]`.
fn feed(mut update: impl FnMut(&[u8]), key: StorageKey<'_>) {
    update(&(key.namespace.len() as u64).to_le_bytes());
    update(key.namespace.as_bytes());
    update(&(key.tier.len() as u64).to_le_bytes());
    update(key.tier.as_bytes());
    update(key.user.as_bytes());
}

fn push_band(key: &mut KeyBuf, band: usize) {
    let mut digits = [0u8; 20];
    let mut n = band;
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    key.extend_from_slice(&digits[at..]);
}

/// `ERR unknown command 'evalsha'`, a renamed command, or an ACL refusal.
fn refuses_evalsha(e: &RedisError) -> bool {
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return true;
    }
    e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
}

fn timeout_error(after: Duration) -> StorageError {
    StorageError::new(
        StorageErrorKind::Timeout,
        format!("Redis did not answer within {after:?} (the request may still have been counted)"),
    )
}

fn error_from(e: &RedisError) -> StorageError {
    let kind = if e.is_timeout() {
        StorageErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                )
        )
    {
        StorageErrorKind::Unavailable
    } else {
        StorageErrorKind::Other
    };
    StorageError::new(kind, format!("Redis: {e}"))
}

fn parse_ints(value: Value) -> Result<Vec<i64>, StorageError> {
    let bad = || {
        StorageError::new(
            StorageErrorKind::Other,
            "unexpected reply from the rate-limit script",
        )
    };
    let Value::Array(items) = value else {
        return Err(bad());
    };
    items
        .into_iter()
        .map(|v| match v {
            Value::Int(i) => Ok(i),
            _ => Err(bad()),
        })
        .collect()
}

fn micros_to_nanos(us: i64) -> u64 {
    u64::try_from(us).unwrap_or(0).saturating_mul(1_000)
}

/// `{allowed, now, (remaining, reset_after, retry_after) per band}`.
fn decode(reply: &[i64], bands: usize) -> Result<Decision, StorageError> {
    if reply.len() != 2 + 3 * bands {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            "unexpected reply length from the rate-limit script",
        ));
    }
    let mut states = BandStates::new();
    for band in reply[2..].chunks_exact(3) {
        states.push(BandState {
            remaining: if band[0] < 0 {
                u32::MAX
            } else {
                u32::try_from(band[0]).unwrap_or(u32::MAX)
            },
            reset_after_ns: micros_to_nanos(band[1]),
            retry_after_ns: micros_to_nanos(band[2]),
        });
    }
    Ok(Decision {
        allowed: reply[0] == 1,
        now: micros_to_nanos(reply[1]),
        bands: states,
    })
}

fn check_bands(bands: &[Quota]) -> Result<(), StorageError> {
    if bands.is_empty() || bands.len() > super::MAX_BANDS {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            "a decision needs 1 to MAX_BANDS bands",
        ));
    }
    Ok(())
}

#[async_trait::async_trait]
impl Storage for RedisStorage {
    async fn check(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<Decision, StorageError> {
        check_bands(bands)?;
        let reply = self.inner.run(key, bands, false, cost).await?;
        decode(&reply, bands.len())
    }

    async fn refund(&self, key: StorageKey<'_>, bands: &[Quota], cost: u32) -> Result<(), StorageError> {
        check_bands(bands)?;
        if cost == 0 || bands.iter().all(Quota::is_unlimited) {
            return Ok(());
        }
        self.inner.run(key, bands, true, cost).await.map(drop)
    }
}

impl fmt::Debug for RedisStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisStorage")
            .field(
                "mode",
                &match inner.conn {
                    Conn::Single(_) => "single",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &inner.keys.prefix)
            .field("timeout", &inner.timeout)
            .field("hash_secret", &inner.keys.secret.is_some())
            .field("client_clock", &inner.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RedisStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStorageBuilder")
            .field("urls", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("hash_secret", &self.secret.is_some())
            .field("client_clock", &self.clock.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(codec: &KeyCodec, namespace: &str, tier: &str, user: &str, band: usize) -> String {
        let mut k = codec.base_key(StorageKey {
            namespace,
            tier,
            user,
        });
        push_band(&mut k, band);
        String::from_utf8(k.to_vec()).unwrap()
    }

    #[test]
    fn keys_share_a_hash_tag_and_hide_the_user() {
        let codec = KeyCodec::new("trt".into(), None).unwrap();
        let b0 = key(&codec, "", "free", "alice@example.com", 0);
        let b1 = key(&codec, "", "free", "alice@example.com", 1);
        assert!(b0.starts_with("trt:{") && b0.ends_with("}:b0"), "{b0}");
        assert_eq!(b0.len(), "trt:{".len() + 32 + "}:b0".len());
        assert_eq!(b0[..b0.len() - 1], b1[..b1.len() - 1]);
        assert!(!b0.contains("alice") && !b0.contains("free"));
        // the Cluster hash tag is the part between the first `{` and `}`
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        assert_eq!(tag(&b0), tag(&b1));
    }

    #[test]
    fn distinct_keys_never_collide_across_separators() {
        let codec = KeyCodec::new("trt".into(), None).unwrap();
        let a = key(&codec, "", "a:b", "c", 0);
        let b = key(&codec, "", "a", "b:c", 0);
        let c = key(&codec, "a", "b", "c", 0);
        let d = key(&codec, "", "ab", "c", 0);
        assert!(a != b && a != c && a != d && b != c && b != d && c != d);
    }

    #[test]
    fn a_secret_changes_every_key() {
        let plain = KeyCodec::new("trt".into(), None).unwrap();
        let one = KeyCodec::new("trt".into(), Some(b"one")).unwrap();
        let one_again = KeyCodec::new("trt".into(), Some(b"one")).unwrap();
        let two = KeyCodec::new("trt".into(), Some(b"two")).unwrap();
        let k = |c: &KeyCodec| key(c, "", "free", "203.0.113.7", 0);
        assert_eq!(k(&one), k(&one_again));
        assert_ne!(k(&one), k(&plain));
        assert_ne!(k(&one), k(&two));
        // the plain hash is SHA-256 of the documented encoding
        let mut h = Sha256::new();
        feed(
            |p| h.update(p),
            StorageKey {
                namespace: "",
                tier: "free",
                user: "203.0.113.7",
            },
        );
        let digest: [u8; 32] = h.finalize().into();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(k(&plain), format!("trt:{{{hex}}}:b0"));
    }

    #[test]
    fn a_prefix_with_braces_is_refused() {
        assert!(KeyCodec::new("app{x}".into(), None).is_err());
        assert!(KeyCodec::new("app:v2".into(), None).is_ok());
    }

    #[test]
    fn band_suffixes() {
        for (band, text) in [(0, "0"), (7, "7"), (10, "10"), (123, "123")] {
            let mut k = KeyBuf::new();
            push_band(&mut k, band);
            assert_eq!(&k[..], text.as_bytes());
        }
    }

    #[test]
    fn replies_decode() {
        let d = decode(&[1, 1_700_000_000_000_000, 4, 1_500, 0, -1, 0, 0], 2).unwrap();
        assert!(d.allowed);
        assert_eq!(d.now, 1_700_000_000_000_000_000);
        assert_eq!(d.bands[0].remaining, 4);
        assert_eq!(d.bands[0].reset_after_ns, 1_500_000);
        assert_eq!(d.bands[1].remaining, u32::MAX);
        assert!(decode(&[1, 2, 3], 1).is_err());
        assert!(parse_ints(Value::Nil).is_err());
    }

    #[test]
    fn evalsha_refusals_are_recognised() {
        let unknown = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "unknown command 'EVALSHA', with args beginning with:".to_owned(),
        ));
        assert!(refuses_evalsha(&unknown));
        let other = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "tower-rate-tier: bad script arguments".to_owned(),
        ));
        assert!(!refuses_evalsha(&other));
    }
}
