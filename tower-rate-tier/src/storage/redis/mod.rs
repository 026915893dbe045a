//! GCRA state in Redis (or Valkey), shared by every instance of a service.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_rate_tier::{Quota, RateTier, storage::RedisStorage};
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
//! A tier with a concurrency limit takes a slot and charges the bands in one
//! call (never batched), and gives the slot back in another; a decision with
//! an amount per band ([`Op::Each`]: `each.lua`) is one call, batched too.
//!
//! **Batching** (on by default,
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
//! failed or timed out is never sent again. On a Redis Cluster the same
//! holds per primary (see [Redis Cluster](self#redis-cluster)).
//!
//! **Deny cache** (on by default, [`deny_cache`](RedisStorageBuilder::deny_cache)):
//! after Redis denies a key, the key's band states are kept in process, and
//! later requests for it that those states already deny are denied without
//! a round trip, with the `Retry-After` and band states Redis would give
//! (source [`DecisionSource::DenyCache`](super::DecisionSource::DenyCache)).
//! It never admits, never denies what Redis would admit, and is indifferent
//! to clock skew (it counts time with the limiter's clock: a `FakeClock`
//! keeps a denial until advanced); another instance's refund is not seen
//! until the entry expires. See [`DenyCache`](super::DenyCache) for why.
//!
//! # Redis Cluster
//!
//! [`RedisStorage::cluster`] (or [`RedisStorage::with_cluster_client`])
//! keeps every key of one decision in one hash slot (see [Keys](self#keys)),
//! so a decision of its own is one script call routed by its keys.
//!
//! **Batched per primary**: the storage reads which primary serves which
//! slot (`CLUSTER SLOTS`, when it starts and again after a slot has moved
//! or a node failed, at most every 100 ms), and a decision waits in the
//! queue of the primary that serves its key. Each queue batches as a single
//! server does: a decision that finds no call of its node in flight is sent
//! at once, others go out together in the order asked, at most two calls
//! in flight per node. A batch holds keys of many slots, which a
//! call cannot declare (Redis refuses declared keys of different slots with
//! `CROSSSLOT`), so the batch script takes its keys as arguments and
//! carries the flag `#!lua flags=allow-cross-slot-keys`. **This needs Redis
//! 7.0 or later** (or Valkey 7.2 or later). An older server refuses the
//! script (it cannot read its first line); the storage then logs one
//! warning and sends every decision on its own, as with
//! [`batching(false)`](RedisStorageBuilder::batching): nothing fails and
//! nothing is counted twice, since the refused script never ran.
//!
//! **Resharding and failover**: a node refuses a key it does not serve, and the
//! batch script passes that refusal on for that decision alone; the storage
//! sends such a decision again on its own, routed by its keys (the driver
//! follows `MOVED` and `ASK`, and the storage follows a redirection or a
//! `TRYAGAIN` that the driver's own retry met again, within the timeout), and
//! reads the slot map again. Nothing refused was counted, so a move neither
//! loses a charge nor counts one twice. A decision sent again after its key
//! moved is decided after the other decisions of its batch. A node that fails
//! fails the calls of its own queue only: the other primaries' batches go on.
//! A `READONLY` answer (a demoted primary) or a call with no answer in
//! time makes it connect again (once a second at most). Give a
//! [`Fallback`](super::Fallback) over the storage its
//! [`failure_domain`](RedisStorage::failure_domain) (a domain per slot):
//! only the failed node's keys are answered locally.
//!
//! Measured against [`batching(false)`](RedisStorageBuilder::batching) on
//! a local 3-master cluster on a busy machine (BENCHMARKS.md,
//! `cargo bench -p redis-compare --bench cluster_compare`): 1.3 to 2.0
//! times the throughput at 64 concurrent callers (median 1.7 over seven
//! runs), on par for a lone caller (its decisions go out at once), no gain
//! at 16 (about 5 callers per node make batches of 2).
//!
//! # Rolling deploys
//!
//! Instances with different settings (batching on or off, another batch
//! cap, deny cache on or off) share one quota on one server: the keys, the
//! stored values (a band's time of being full again, in integer
//! microseconds) and the expiries are the same whatever the settings. The
//! batch script checks its contract (`trt-batch-3`, its first argument), and
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
//! without sending it (without it every call sends the whole script); `+time`,
//! `+get`, `+mget`, `+set` and `+del` are the commands the script itself runs,
//! which Redis checks against the caller's ACL (`+time` is unused with a [client
//! clock](RedisStorageBuilder::client_clock)); a tier with a concurrency limit
//! adds its slots' `+zremrangebyscore +zcard +zadd +zrem +zrange +pexpire`
//! (grant all six). Neither `SCRIPT LOAD` nor `PING` is needed. On a Cluster the
//! user also needs `+cluster|slots`, which redis-rs's cluster driver already
//! reads; the storage reads it too, for its batches (without it every decision
//! is its own call).
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
//! [`StorageErrorKind::Timeout`](super::StorageErrorKind::Timeout); an
//! unreachable server fails with
//! [`StorageErrorKind::Unavailable`](super::StorageErrorKind::Unavailable),
//! fast, without waiting for a reconnect backoff; the `RateTier` reports
//! either as `CheckError::Storage` and the layer applies its
//! `OnStorageError` policy. **A script that timed out on our side may still
//! have run on the server and counted the request.** A failed call starts a
//! reconnect in the background. A decision that meets the refusal it left,
//! or a connection dropped while idle (Redis restarted; a server `timeout`
//! or a NAT closed it), tries once more, so the first decision after Redis
//! is back is served (one whose connection drops in flight may apply twice).
//! A cluster connection is made by a task of its own (a slow connect is
//! never cut short by a caller's timeout), again after its runtime ended. A malformed stored value is treated as a fresh state,
//! never a panic or a permanent deny. On a Cluster, the driver retries a call
//! once after a redirection (`MOVED`/`ASK`) or a connection error, and the
//! storage sends a decision again after a redirection (which never ran)
//! within the timeout; a retry after a connection error can, like a
//! timeout, count a request that had already been counted.
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
//! A connection's driver task runs on the tokio runtime that made it: use a
//! storage from runtimes that keep running. One made on a runtime kept alive
//! but not driven (a `block_on` that returned) times out; after a runtime
//! ended, the next decisions connect again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;

use super::deny_cache::{DenyTable, encode};
use super::{Decide, Op, Storage, StorageError, StorageKey};
use crate::clock::Clock;
use crate::quota::Quota;

mod batch;
mod batch_args;
mod builder;
mod call;
mod error;
mod keys;
mod link;
mod nodes;
mod script;
mod slots;

use batch::Batcher;
pub use builder::RedisStorageBuilder;
use call::check_bands;
use keys::KeyCodec;
use link::Conn;
use nodes::Nodes;
use script::{SINGLE, Script};

/// The default per-call timeout: 250 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "trt";

/// GCRA state in Redis, shared by every process that uses the same server
/// (or cluster) and prefix. See the [module documentation](self). Cheap to
/// clone; clones share one connection.
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
    /// Where decisions wait for a batch.
    batching: Batching,
    deny: Option<Arc<DenyTable>>,
    /// `slots.lua`, for concurrency limits.
    slots_script: Script,
    leases: slots::LeaseIds,
}

/// Where a storage's decisions wait for a batch.
enum Batching {
    /// Nowhere: every decision is its own call.
    Off,
    /// The queue of the one server.
    Single(Arc<Batcher>),
    /// A queue per primary of the Cluster.
    Cluster(Nodes),
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

    /// Whether decisions are batched (batching on; on a Cluster, per
    /// primary).
    pub fn is_batching(&self) -> bool {
        !matches!(self.inner.batching, Batching::Off)
    }

    /// The cap on decisions per batch, when batching.
    pub fn max_batch(&self) -> Option<usize> {
        match &self.inner.batching {
            Batching::Off => None,
            Batching::Single(batcher) => Some(batcher.max()),
            Batching::Cluster(nodes) => Some(nodes.max()),
        }
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
        let batching = match (&conn, settings.max_batch) {
            (_, None) => Batching::Off,
            (Conn::Single(_), Some(max)) => Batching::Single(Arc::new(Batcher::new(max))),
            (Conn::Cluster(_), Some(max)) => Batching::Cluster(Nodes::new(max)),
        };
        let storage = RedisStorage {
            inner: Arc::new(Inner {
                conn,
                keys: settings.keys,
                timeout: settings.timeout,
                clock: settings.clock,
                script: Script::new(SINGLE),
                batching,
                deny: settings
                    .deny_cache
                    .map(|capacity| Arc::new(DenyTable::new(capacity))),
                slots_script: slots::script(),
                leases: slots::LeaseIds::new(),
            }),
        };
        if let Batching::Cluster(nodes) = &storage.inner.batching {
            nodes.refresh(&storage.inner);
        }
        storage
    }

    /// Decides `op` for every band of `key` in one script call, within the
    /// timeout. The decision of a refund is every band's state after it.
    #[cfg(test)]
    pub(crate) async fn run(
        &self,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
    ) -> Result<super::Decision, StorageError> {
        check_bands(bands, op)?;
        self.inner.clone().call(self.inner.args(key, bands, op)).await
    }
}

impl Storage for RedisStorage {
    fn decide(&self, key: StorageKey<'_>, bands: &[Quota], op: Op, clock: &Arc<dyn Clock>) -> Decide {
        if let Err(e) = check_bands(bands, op) {
            return Decide::ready(Err(e));
        }
        match &self.inner.deny {
            // Anchored on the deciding clock: the limiter's, or this storage's own in test mode.
            Some(table) => {
                let now = self.inner.clock.as_ref().unwrap_or(clock).now();
                let seen = script::counted(bands);
                table.guard(encode(key), &seen, op, now, || self.send(key, bands, op))
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
