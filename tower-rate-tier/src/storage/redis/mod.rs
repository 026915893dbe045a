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
//!     .hash_secret(std::env::var("RATE_LIMIT_KEY_SECRET")?)
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
//! **Batching** (on by default on a single server,
//! [`batching`](RedisStorageBuilder::batching)): a decision asked for while
//! a call of the storage is in flight waits in a queue, and the queue goes
//! out as one call of a batch script (at most
//! [`max_batch`](RedisStorageBuilder::max_batch), default 128, per call)
//! when that call ends, or at once as a second call in flight when the
//! queue holds half of the decisions waiting (at most two calls in flight:
//! Redis has the next batch to run while the client handles the last
//! reply). The batch script decides in order, with one `TIME` per call,
//! each decision exactly as a call of its own would (a charge of one
//! limited band with the single script's arithmetic inline, with one `MGET`
//! for the whole batch; any other decision through the single script's own
//! code); one decision's failure (a command the ACL denies, say) never
//! fails the others. There is no timer: a decision that finds no call in
//! flight is sent at once, so light traffic sees no added latency. The
//! timeout stays per decision (time spent waiting for the batch counts), a
//! decision whose caller has given up is never sent, and a batch that
//! failed or timed out is never sent again. **On a Redis Cluster every
//! decision is its own call** (a batch's keys would span slots; calls are
//! not routed by slot).
//!
//! **Deny cache** (on by default, [`deny_cache`](RedisStorageBuilder::deny_cache)):
//! after Redis denies a key, the key's band states are kept in process, and
//! later requests for it that those states already deny are denied without
//! a round trip, with the `Retry-After` and band states Redis would give
//! (source [`DecisionSource::DenyCache`](super::DecisionSource::DenyCache)).
//! It never admits, never denies what Redis would admit, and is indifferent
//! to clock skew between this process and Redis; a refund made by another
//! instance is not seen until the entry expires. See
//! [`DenyCache`](super::DenyCache) for how and why.
//!
//! # Rolling deploys
//!
//! Instances with different settings (batching on or off, another batch
//! cap, deny cache on or off) share one quota on one server: the keys, the
//! stored values (a band's time of being full again, in integer
//! microseconds) and the expiries are the same whatever the settings. The
//! batch script checks its contract (`trt-batch-2`, its first argument), and
//! a script is known to the server by its SHA-1, so instances running
//! different versions of a script never run each other's. A change to the
//! key layout or the stored values would come with a new key prefix.

//! # Keys
//!
//! One key per band: `{prefix}:{<hash>}:w<window>`, for example
//! `trt:{3f2a…}:w3600000` for `Quota::per_hour(100)`. `<hash>` is the
//! first 128 bits (hex) of SHA-256 over the namespace, tier and user id
//! (HMAC-SHA-256 under a [secret](RedisStorageBuilder::hash_secret) when one
//! is set). All keys of one decision share the `{<hash>}` hash tag, so Redis
//! Cluster puts them in one slot. A band's key names its refill window
//! ([`Quota::refill_nanos`], in milliseconds), not its position: the
//! [`BandName`](crate::storage::BandName) every storage keys a band by, with
//! `.1`, `.2` for further bands of one tier with the same window. So bands
//! can be added, removed or reordered without one band reading another's
//! state, and a band whose window stays (`per_hour(100)` raised to
//! `per_hour(200)`) keeps its state. [`RedisStorage::band_key`] names a key.
//!
//! **User ids are pseudonymised, not secret, without a hash secret.** The
//! plain hash is unsalted: anyone who can list the keys (`SCAN`, a backup, a
//! replica, `MONITOR`) and guess the id space gets the ids back by hashing
//! every candidate. For an anonymous client identified by its IPv4 address,
//! a /16 is 65,536 hashes: milliseconds on a laptop; e-mail addresses from a
//! leaked list or numeric ids fall the same way. Set
//! [`hash_secret`](RedisStorageBuilder::hash_secret) (kept out of Redis)
//! whenever ids are guessable; a storage built without one logs a warning.
//!
//! # Your own connection
//!
//! [`RedisStorage::with_connection_manager`] takes a redis-rs
//! [`ConnectionManager`] the application made
//! (TLS certificates, an ACL user, a manager shared with the rest of the
//! application), [`RedisStorage::with_cluster_client`] a
//! [`ClusterClient`]. The storage keeps its
//! guarantees on them: server time, the per-call timeout, `EVALSHA` with the
//! `NOSCRIPT` fallback, reconnects (the manager's own; a cluster connection
//! made again from the client). [`RedisStorage::manager_config`] and
//! [`RedisStorage::cluster_client_builder`] give the settings the storage
//! uses for its own connections (fail fast, no backoff sleeps).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use redis::aio::ConnectionManager;
//! use tower_rate_tier::storage::RedisStorage;
//!
//! let timeout = Duration::from_millis(250);
//! let client = redis::Client::open("redis://limiter:secret-password@10.0.0.5:6379")?;
//! let manager = ConnectionManager::new_with_config(client, RedisStorage::manager_config(timeout)).await?;
//! let storage = RedisStorage::with_connection_manager(manager.clone())
//!     .prefix("myapp")
//!     .hash_secret(std::env::var("RATE_LIMIT_KEY_SECRET")?)
//!     .timeout(timeout)
//!     .connect()
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! An ACL user needs these permissions, and no more (with the default
//! prefix `trt`; give yours):
//!
//! ```text
//! ACL SETUSER limiter on >secret-password resetkeys ~trt:* resetchannels -@all +evalsha +eval +time +get +mget +set +del
//! ```
//!
//! `+eval` runs the script (and loads it after `NOSCRIPT`); `+evalsha` runs it
//! without sending it (without it every call sends the whole script);
//! `+time`, `+get`, `+mget`, `+set` and `+del` are the commands the script
//! itself runs, which Redis checks against the caller's ACL (`+time` is
//! unused with a [client clock](RedisStorageBuilder::client_clock)). Neither
//! `SCRIPT LOAD` nor `PING` is needed.
//!
//! TLS: `rediss://` URLs work once the application enables a TLS feature of
//! the `redis` crate (`tokio-rustls-comp` or `tokio-native-tls-comp`); for
//! client certificates or a private CA build the client with
//! `redis::Client::build_with_tls` and pass a manager made on it.
//! redis-rs's manager reconnects to the address its client names: a client
//! taken from a Sentinel keeps the primary of that moment.
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
//! cluster connection is made by a task of its own (a slow connect is never
//! cut short by a caller's timeout) and is made again when the runtime that
//! ran it has ended. A malformed stored value is treated as a fresh state,
//! never a panic or a permanent deny. On a Cluster, the driver retries a call
//! once after a redirection (`MOVED`/`ASK`) or a connection error; a retry
//! after a connection error can, like a timeout, count a request that had
//! already been counted.
//!
//! An error's message says what was attempted (`Redis charge failed:
//! connection refused`, `loading the rate-limit script into Redis (EVAL)
//! failed: …`, and the node where redis-rs names one) and never contains a
//! key or a user id; the redis-rs error is its
//! [`source`](std::error::Error::source), with the server's reply verbatim.
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
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;

use super::deny_cache::DenyTable;
use super::{Decide, Decision, Op, Storage, StorageError, StorageErrorKind, StorageKey};
use crate::clock::Clock;
use crate::quota::Quota;

mod batch;
mod batch_args;
mod builder;
mod error;
mod keys;
mod link;
mod script;
mod slots;

use batch::Batcher;
pub use builder::RedisStorageBuilder;
use error::{Attempt, redis_error, timeout_error};
use keys::KeyCodec;
use link::Conn;
use script::{Args, SINGLE, Script, decode};

/// The default per-call timeout: 250 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "trt";

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
    script: Script,
    /// The queue of decisions waiting for a batch (single server, batching
    /// on).
    batch: Option<Batcher>,
    deny: Option<Arc<DenyTable>>,
    /// `slots.lua`, for concurrency limits.
    slots_script: Script,
    leases: slots::LeaseIds,
}

/// The settings [`RedisStorage::from_parts`] takes besides the connection.
struct Settings {
    keys: KeyCodec,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    /// `Some(cap)`: batching on, at most `cap` decisions per call.
    max_batch: Option<usize>,
    /// `Some(capacity)`: the deny cache on.
    deny_cache: Option<usize>,
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
        RedisStorageBuilder::url(url.into())
    }

    /// Configures a storage on a Redis Cluster, given some of its nodes.
    pub fn cluster<I>(urls: I) -> RedisStorageBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisStorageBuilder::cluster_urls(urls.into_iter().map(Into::into).collect())
    }

    /// Configures a storage on one server through the application's own
    /// [`ConnectionManager`] (its TLS, ACL user and settings; clones of it
    /// share one connection with the application). Make it with
    /// [`RedisStorage::manager_config`] to keep the storage's fail-fast
    /// behaviour. See [Your own connection](self#your-own-connection).
    pub fn with_connection_manager(manager: ConnectionManager) -> RedisStorageBuilder {
        RedisStorageBuilder::manager(manager)
    }

    /// Configures a storage on a Redis Cluster through the application's own
    /// [`ClusterClient`] (its TLS, ACL user and settings; start from
    /// [`RedisStorage::cluster_client_builder`]). The storage takes the
    /// client rather than a connection because a cluster connection cannot
    /// be revived once the runtime that drove it has ended; the client makes
    /// a new one. See [Your own connection](self#your-own-connection).
    pub fn with_cluster_client(client: ClusterClient) -> RedisStorageBuilder {
        RedisStorageBuilder::cluster_client(client)
    }

    /// The name of the Redis key that holds the band with quota `band` of
    /// `key` (see [Keys](self#keys)). For inspection and tests; the storage
    /// never needs it spelled out.
    pub fn band_key(&self, key: StorageKey<'_>, band: &Quota) -> String {
        String::from_utf8_lossy(&self.inner.keys.band_key(key, band)).into_owned()
    }

    /// The name band `band` (0-based, in the tier's order) of `key` had when
    /// keys named a band by its position. The storage no longer reads or
    /// writes such keys (they expire on their own); use
    /// [`band_key`](Self::band_key) for the key a band uses.
    #[deprecated(note = "keys name a band by its quota now; use `RedisStorage::band_key`")]
    pub fn key_for(&self, key: StorageKey<'_>, band: usize) -> String {
        let mut name = self.inner.keys.base_key(key);
        keys::push_index(&mut name, band);
        String::from_utf8_lossy(&name).into_owned()
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.keys.prefix
    }

    /// Whether decisions are batched (batching on, and a single server).
    pub fn is_batching(&self) -> bool {
        self.inner.batch.is_some()
    }

    /// The cap on decisions per batch, when batching.
    pub fn max_batch(&self) -> Option<usize> {
        self.inner.batch.as_ref().map(Batcher::max)
    }

    /// Whether the deny cache is on.
    pub fn has_deny_cache(&self) -> bool {
        self.inner.deny.is_some()
    }

    /// Which part of Redis `key` lives on, for
    /// [`FallbackBuilder::domains`](super::FallbackBuilder::domains): 0 for
    /// every key on a single server; on a Cluster, a number for the key's
    /// hash slot (so that one unreachable node sends only its own slots'
    /// keys to a fallback).
    pub fn failure_domain(&self, key: StorageKey<'_>) -> u64 {
        use std::hash::BuildHasher;
        match self.inner.conn {
            Conn::Single(_) => 0,
            Conn::Cluster(_) => {
                let base = self.inner.keys.base_key(key);
                let slot = redis::cluster_routing::Slot::for_key(&base[..]);
                foldhash::fast::FixedState::default().hash_one(slot)
            }
        }
    }

    fn from_parts(conn: Conn, settings: Settings) -> Self {
        let batch = match conn {
            Conn::Single(_) => settings.max_batch.map(Batcher::new),
            Conn::Cluster(_) => None,
        };
        RedisStorage {
            inner: Arc::new(Inner {
                conn,
                keys: settings.keys,
                timeout: settings.timeout,
                clock: settings.clock,
                script: Script::new(SINGLE),
                batch,
                deny: settings
                    .deny_cache
                    .map(|capacity| Arc::new(DenyTable::new(capacity))),
                slots_script: slots::script(),
                leases: slots::LeaseIds::new(),
            }),
        }
    }

    /// Decides `op` for every band of `key` in one script call, within the
    /// timeout. The decision of a refund is every band's state after it.
    #[cfg(test)]
    pub(crate) async fn run(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
    ) -> Result<Decision, StorageError> {
        check_bands(bands)?;
        self.inner.clone().call(self.inner.args(key, bands, op)).await
    }
}

impl Inner {
    /// The script's keys and arguments for `op` on every band of `key`.
    fn args(&self, key: StorageKey<'_>, bands: &[Quota], op: Op) -> (Args, Attempt) {
        let now = self.clock.as_ref().map(|clock| clock.now() / 1_000);
        let attempt = match op.on_bands() {
            Op::Charge(0) => Attempt::Peek,
            Op::Refund(_) => Attempt::Refund,
            _ => Attempt::Charge,
        };
        (Args::new(&self.keys, key, bands, op, now), attempt)
    }

    /// One script call within the timeout.
    async fn call(self: Arc<Self>, (args, attempt): (Args, Attempt)) -> Result<Decision, StorageError> {
        let call = async {
            match self.script.call(&self.conn, &args, attempt).await {
                // A refused connection means the command was not sent: it
                // may be the refusal that an earlier reconnect attempt left
                // behind (during an outage that has ended since), so one
                // more try reconnects now rather than failing this decision.
                Err((_, e)) if e.is_connection_refusal() => {
                    self.script.call(&self.conn, &args, attempt).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(timeout_error(attempt, self.timeout)),
            Ok(Err((attempt, e))) => Err(redis_error(attempt, e)),
            Ok(Ok(value)) => decode(value, &args.spans),
        }
    }
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

impl RedisStorage {
    /// One decision by Redis: the key names and arguments are made now (the
    /// future owns them), and sent at once or with the next batch.
    fn send(&self, key: StorageKey<'_>, bands: &[Quota], op: Op) -> Decide {
        if let Op::Acquire { .. } | Op::Release(_) = op {
            return slots::send(&self.inner, key, bands, op);
        }
        let args = self.inner.args(key, bands, op);
        match &self.inner.batch {
            Some(batcher) => batch::submit(&self.inner, batcher, args),
            None => Decide::pending(self.inner.clone().call(args)),
        }
    }
}

impl Storage for RedisStorage {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if let Err(e) = check_bands(bands) {
            return Decide::ready(Err(e));
        }
        match &self.inner.deny {
            // Anchored on the clock the decisions are made with: the
            // limiter's, or this storage's own in test mode.
            Some(table) => {
                let now = self.inner.clock.as_ref().unwrap_or(clock).now();
                table.guard(key, bands, op, now, || self.send(key, bands, op))
            }
            None => self.send(key, bands, op),
        }
    }
}

impl fmt::Debug for RedisStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisStorage")
            .field("mode", &inner.conn.mode())
            .field("prefix", &inner.keys.prefix)
            .field("timeout", &inner.timeout)
            .field("hash_secret", &inner.keys.has_secret())
            .field("client_clock", &inner.clock.is_some())
            .field("max_batch", &self.max_batch())
            .field("deny_cache", &inner.deny.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
