//! [`RedisStorageBuilder`]: where the connection comes from (URLs, or the
//! application's own redis-rs connection) and the storage's settings.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};

use super::super::{StorageError, StorageErrorKind};
use super::batch::DEFAULT_MAX_BATCH;
use super::error::{Attempt, redis_error, timeout_error};
use super::keys::KeyCodec;
use super::link::{ClusterLink, Conn};
use super::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisStorage, Settings};
use crate::clock::Clock;
use crate::storage::deny_cache::DEFAULT_CAPACITY;

/// Configures a [`RedisStorage`]; see [`RedisStorage::builder`],
/// [`RedisStorage::cluster`], [`RedisStorage::with_connection_manager`] and
/// [`RedisStorage::with_cluster_client`].
pub struct RedisStorageBuilder {
    source: Source,
    prefix: String,
    timeout: Duration,
    secret: Option<Vec<u8>>,
    clock: Option<Arc<dyn Clock>>,
    batching: bool,
    max_batch: usize,
    deny_cache: bool,
    deny_cache_capacity: usize,
}

/// Where the connection comes from.
enum Source {
    Url(String),
    ClusterUrls(Vec<String>),
    Manager(ConnectionManager),
    ClusterClient(ClusterClient),
}

impl RedisStorageBuilder {
    fn new(source: Source) -> Self {
        RedisStorageBuilder {
            source,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            secret: None,
            clock: None,
            batching: true,
            max_batch: DEFAULT_MAX_BATCH,
            deny_cache: true,
            deny_cache_capacity: DEFAULT_CAPACITY,
        }
    }

    pub(super) fn url(url: String) -> Self {
        Self::new(Source::Url(url))
    }

    pub(super) fn cluster_urls(urls: Vec<String>) -> Self {
        Self::new(Source::ClusterUrls(urls))
    }

    pub(super) fn manager(manager: ConnectionManager) -> Self {
        Self::new(Source::Manager(manager))
    }

    pub(super) fn cluster_client(client: ClusterClient) -> Self {
        Self::new(Source::ClusterClient(client))
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
    /// SHA-256. Without a secret a key is an unsalted pseudonym: whoever can
    /// read the key names and guess the id space gets the ids back by
    /// hashing every candidate (an anonymous client's IPv4 address from a
    /// /16 in milliseconds; see [Keys](super#keys)). With a secret kept out
    /// of Redis they cannot. Use 32 random bytes or more; every instance must
    /// use the same secret; changing it starts every bucket afresh. An empty
    /// secret is refused by [`connect`](Self::connect) and
    /// [`connect_lazy`](Self::connect_lazy).
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

    /// Whether decisions that arrive while a call is in flight go out
    /// together as one call (default on; see [How a decision is
    /// made](super#how-a-decision-is-made)). Off: one script call per
    /// decision. On a Redis Cluster, per primary (Redis 7.0 or later; see
    /// [Redis Cluster](super#redis-cluster)).
    ///
    /// A decision takes its place when it is asked for, and the first one
    /// asked for while no call is in flight is sent when it is first
    /// awaited. A program that asks for several decisions (the layer asks
    /// for one per request and awaits it at once) awaits them in the order
    /// it asked, or together (`join`): one awaited while an earlier one is
    /// not waits for it, up to its timeout.
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// The most decisions one batch carries (default 128; at least 2).
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max.max(2);
        self
    }

    /// Whether denials are kept in process to deny repeated requests
    /// without a round trip (default on; see
    /// [`DenyCache`](crate::storage::DenyCache) for what it guarantees). Off:
    /// every request asks Redis.
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }

    /// The most keys the deny cache keeps (default
    /// [`DEFAULT_CAPACITY`](crate::storage::deny_cache::DEFAULT_CAPACITY),
    /// 65,536).
    pub fn deny_cache_capacity(mut self, keys: usize) -> Self {
        self.deny_cache_capacity = keys;
        self
    }

    /// Connects and returns the storage. Fails when a URL, the prefix or
    /// the secret is invalid, or the server (any cluster node given) does not
    /// answer within the timeout (at least 1 s for this first connection).
    /// With a connection of the application's own, it checks that the server
    /// answers (any reply counts, an ACL refusal of `PING` too).
    pub async fn connect(self) -> Result<RedisStorage, StorageError> {
        let keys = self.keys()?;
        let connect_timeout = self.timeout.max(Duration::from_secs(1));
        let conn = match &self.source {
            Source::Url(url) => {
                let made = ConnectionManager::new_with_config(single_client(url)?, self.manager_config());
                let manager = tokio::time::timeout(connect_timeout, made)
                    .await
                    .map_err(|_| timeout_error(Attempt::Connect, connect_timeout))?
                    .map_err(|e| redis_error(Attempt::Connect, e))?;
                Conn::Single(manager)
            }
            Source::Manager(manager) => {
                let mut manager = manager.clone();
                let ping = redis::cmd("PING");
                let ping = ping.query_async::<redis::Value>(&mut manager);
                match tokio::time::timeout(connect_timeout, ping).await {
                    Err(_) => return Err(timeout_error(Attempt::Connect, connect_timeout)),
                    Ok(Err(e)) if !matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                        return Err(redis_error(Attempt::Connect, e));
                    }
                    Ok(_) => Conn::Single(manager),
                }
            }
            Source::ClusterUrls(_) | Source::ClusterClient(_) => {
                let link = Arc::new(ClusterLink::new(self.make_cluster_client()?, connect_timeout));
                tokio::time::timeout(connect_timeout, link.connection())
                    .await
                    .map_err(|_| timeout_error(Attempt::ConnectCluster, connect_timeout))?
                    .map_err(|e| redis_error(Attempt::ConnectCluster, e))?;
                Conn::Cluster(link)
            }
        };
        Ok(self.finish(keys, conn))
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
    /// let storage = RedisStorage::builder("redis://127.0.0.1:6379")
    ///     .hash_secret(std::env::var("RATE_LIMIT_KEY_SECRET")?)
    ///     .connect_lazy()?;
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
        let keys = self.keys()?;
        let conn = match &self.source {
            Source::Url(url) => {
                let manager =
                    ConnectionManager::new_lazy_with_config(single_client(url)?, self.manager_config())
                        .map_err(|e| redis_error(Attempt::Configure, e))?;
                Conn::Single(manager)
            }
            Source::Manager(manager) => Conn::Single(manager.clone()),
            Source::ClusterUrls(_) | Source::ClusterClient(_) => {
                let connect_timeout = self.timeout.max(Duration::from_secs(1));
                Conn::Cluster(Arc::new(ClusterLink::new(
                    self.make_cluster_client()?,
                    connect_timeout,
                )))
            }
        };
        Ok(self.finish(keys, conn))
    }

    fn keys(&self) -> Result<KeyCodec, StorageError> {
        KeyCodec::new(&self.prefix, self.secret.as_deref())
    }

    fn make_cluster_client(&self) -> Result<ClusterClient, StorageError> {
        match &self.source {
            Source::ClusterClient(client) => Ok(client.clone()),
            Source::ClusterUrls(urls) => RedisStorage::cluster_client_builder(urls.clone(), self.timeout)
                .build()
                .map_err(|e| redis_error(Attempt::Configure, e)),
            Source::Url(_) | Source::Manager(_) => Err(StorageError::new(
                StorageErrorKind::Other,
                "not a Redis Cluster configuration",
            )),
        }
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        RedisStorage::manager_config(self.timeout)
    }

    fn finish(self, keys: KeyCodec, conn: Conn) -> RedisStorage {
        if !keys.has_secret() {
            tracing::warn!(
                prefix = %keys.prefix,
                "RedisStorage without hash_secret: its keys are unsalted SHA-256 hashes of user ids, \
                 which anyone who can list them reverses for guessable ids (IP addresses, emails, \
                 numeric ids); set RedisStorageBuilder::hash_secret"
            );
        }
        let settings = Settings {
            keys,
            timeout: self.timeout,
            clock: self.clock,
            max_batch: self.batching.then_some(self.max_batch),
            deny_cache: self.deny_cache.then_some(self.deny_cache_capacity),
        };
        RedisStorage::from_parts(conn, settings)
    }
}

fn single_client(url: &str) -> Result<redis::Client, StorageError> {
    redis::Client::open(url).map_err(|e| redis_error(Attempt::Configure, e))
}

impl RedisStorage {
    /// The [`ConnectionManagerConfig`] the storage gives its own connections
    /// for a per-call `timeout`; use it for a manager of your own
    /// ([`RedisStorage::with_connection_manager`]) to keep the storage's
    /// failure behaviour: one connection attempt per reconnect (bounded by
    /// the timeout) and no backoff sleeps, so that decisions fail fast while
    /// the server is down. The manager starts a new attempt when a call meets
    /// a broken connection.
    pub fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_min_delay(Duration::from_millis(1))
            .set_max_delay(Duration::from_millis(10))
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
    }

    /// The [`ClusterClientBuilder`] the storage uses for cluster `urls` and a
    /// per-call `timeout`: connection and response timeouts of `timeout`, one
    /// retry (after a redirection or a connection error), short waits. Add
    /// your own settings (TLS, an ACL user) and pass the client to
    /// [`RedisStorage::with_cluster_client`].
    pub fn cluster_client_builder<I>(urls: I, timeout: Duration) -> ClusterClientBuilder
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        ClusterClientBuilder::new(urls)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(1)
            .min_retry_wait(5)
            .max_retry_wait(50)
    }
}

impl fmt::Debug for RedisStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Url(_) => "url",
            Source::ClusterUrls(_) => "cluster urls",
            Source::Manager(_) => "connection manager",
            Source::ClusterClient(_) => "cluster client",
        };
        f.debug_struct("RedisStorageBuilder")
            .field("source", &source)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("hash_secret", &self.secret.is_some())
            .field("client_clock", &self.clock.is_some())
            .field("batching", &self.batching)
            .field("max_batch", &self.max_batch)
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_capacity", &self.deny_cache_capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use crate::warnings_for_tests::Warnings;

    use super::*;

    fn warnings_when_built(builder: RedisStorageBuilder) -> usize {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let (subscriber, seen) = Warnings::of(module_path!().trim_end_matches("::tests"));
        let scope = crate::warnings_for_tests::scoped(subscriber);
        builder.connect_lazy().expect("a lazy storage");
        drop(scope);
        seen.load(Ordering::SeqCst)
    }

    #[test]
    fn a_storage_without_a_secret_warns_once_when_built() {
        assert_eq!(
            warnings_when_built(RedisStorage::builder("redis://127.0.0.1:1")),
            1
        );
        let salted = RedisStorage::builder("redis://127.0.0.1:1").hash_secret([7u8; 32]);
        assert_eq!(warnings_when_built(salted), 0);
    }

    #[test]
    fn an_empty_secret_is_refused() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let err = RedisStorage::builder("redis://127.0.0.1:1")
            .hash_secret("")
            .connect_lazy()
            .unwrap_err();
        assert_eq!(err.kind(), StorageErrorKind::Other);
        assert!(err.to_string().contains("hash secret is empty"), "{err}");
    }
}
