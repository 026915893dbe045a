//! The connection to Redis: one server through redis-rs's
//! [`ConnectionManager`] (which reconnects by itself), or a Redis Cluster
//! through a [`ClusterLink`] that makes the cluster connection, and makes it
//! again, from a [`ClusterClient`].
//!
//! A cluster connection is driven by a task on the tokio runtime that made
//! it, and redis-rs cannot revive one whose runtime has ended; only its
//! client can make a new one. That is why a storage keeps the client, not a
//! connection, and why the link makes each connection on a task of its own:
//! an attempt is never cut short by the call that started it timing out.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, Value};
use tokio::sync::watch;

use super::nodes::{ClusterMap, slot_ranges};

/// A connection to one server or to a cluster. Cheap to clone.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<ClusterLink>),
}

/// Where a query failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Before the command was sent: no cluster connection could be made.
    Connect,
    /// Sending the command or reading its reply (connecting included for a
    /// single server, whose manager connects as part of a command).
    Command,
}

impl Conn {
    /// Sends `cmd` and reads its reply. On a Cluster it goes to the node
    /// that serves its keys, or, with `to`, to the primary that serves slot
    /// `to` (a command whose keys are arguments).
    pub(super) async fn query(&self, cmd: Cmd, to: Option<u16>) -> Result<Value, (Stage, RedisError)> {
        match self {
            Conn::Single(manager) => {
                let mut manager = manager.clone();
                cmd.query_async(&mut manager)
                    .await
                    .map_err(|e| (Stage::Command, e))
            }
            Conn::Cluster(link) => {
                let (id, mut conn) = link.connection().await.map_err(|e| (Stage::Connect, e))?;
                let reply = match to {
                    Some(slot) => {
                        let route = Route::new(slot, SlotAddr::Master);
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                        // a reply that is an error is an error, as for
                        // `query_async`
                        conn.route_command(cmd, routing)
                            .await
                            .and_then(Value::extract_error)
                    }
                    None => cmd.query_async(&mut conn).await,
                };
                if let Err(error) = &reply {
                    link.check(id, error);
                }
                reply.map_err(|e| (Stage::Command, e))
            }
        }
    }

    /// After a node of a Cluster answered `READONLY` inside a reply (an
    /// item of a batch), or a call got no answer in time (a node that
    /// hangs): a connection is made anew, with the slot map as it is now,
    /// at most once a second, and takes the place of this one once made
    /// (see [`ClusterLink::reconnect_soon`]).
    pub(super) fn met_stale_slot_map(&self) {
        if let Conn::Cluster(link) = self {
            link.reconnect_soon();
        }
    }

    /// `"single"` or `"cluster"`.
    pub(super) fn mode(&self) -> &'static str {
        match self {
            Conn::Single(_) => "single",
            Conn::Cluster(_) => "cluster",
        }
    }
}

/// A Redis Cluster connection, made (and made again) by a task of its own:
/// an attempt is never cut short by the call that started it timing out, and
/// a connection whose driver task is gone (its runtime ended) is replaced by
/// the next call.
pub(super) struct ClusterLink {
    client: ClusterClient,
    /// How long one attempt may take.
    connect_timeout: Duration,
    slot: Mutex<Slot>,
    /// Numbers the attempts (and so the connections they make): a late
    /// error never drops a newer connection, a stale attempt never
    /// overwrites a newer one.
    attempts: AtomicU64,
    /// When a connection was last made anew for a slot map that may be
    /// stale (see [`ClusterLink::reconnect_soon`]).
    last_reset: Mutex<Option<Instant>>,
    /// The slot map the connection in use was made with, once read.
    map_in_use: Mutex<Option<ClusterMap>>,
}

/// How often at most a connection is made anew for a slot map that may be
/// stale: a replica answers `READONLY` until its promotion, and a node that
/// hangs times out until its replica takes over; a connection made again
/// sooner reads the same map.
const RESET_EVERY: Duration = Duration::from_secs(1);

/// What an attempt ends with: the connection and its number, or the error.
type Outcome = Option<Result<(u64, ClusterConnection), RedisError>>;

enum Slot {
    Idle,
    /// Attempt `id` runs since `since`; `ended` turns `Some` when it ends.
    Connecting {
        id: u64,
        since: Instant,
        ended: watch::Receiver<Outcome>,
    },
    Ready {
        id: u64,
        conn: ClusterConnection,
    },
}

impl ClusterLink {
    pub(super) fn new(client: ClusterClient, connect_timeout: Duration) -> Self {
        ClusterLink {
            client,
            connect_timeout,
            slot: Mutex::new(Slot::Idle),
            attempts: AtomicU64::new(0),
            last_reset: Mutex::new(None),
            map_in_use: Mutex::new(None),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection and its number, waiting for an attempt (started now
    /// if none runs).
    pub(super) async fn connection(self: &Arc<Self>) -> Result<(u64, ClusterConnection), RedisError> {
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
                    let (done, ended) = watch::channel(None);
                    *slot = Slot::Connecting {
                        id,
                        since: Instant::now(),
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

    async fn attempt(link: Weak<Self>, id: u64, done: watch::Sender<Outcome>) {
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
        let made = outcome.as_ref().ok().map(|(_, conn)| conn.clone());
        let _ = done.send(Some(outcome));
        // the map it was made with, read after it is in use
        if let Some(answer) = match made {
            Some(conn) => primaries_answer(&conn, timeout).await,
            None => None,
        } {
            if let Some(link) = link.upgrade() {
                // (the slot's lock is let go first: `reconnect_soon` takes
                // the map's, then the slot's)
                let in_use = matches!(*link.slot(), Slot::Ready { id: current, .. } if current == id);
                if in_use {
                    *link.map_in_use.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer.map);
                }
            }
        }
    }

    /// Drops connection `id` after `error` if it says the connection's driver
    /// task is gone, so that the next call connects again; makes one anew
    /// in the background if it says that a node it sent to is no primary
    /// any more or did not answer in time (see
    /// [`ClusterLink::reconnect_soon`]).
    ///
    /// A node answers `READONLY` when a failover made it a replica: redis-rs
    /// puts every cluster connection in `READONLY` mode, in which a replica
    /// runs a script itself (`EVAL` is no write command) and fails its first
    /// write, where it would redirect (`MOVED`) any other client. redis-rs
    /// reads the slot map again only on a redirection, so without this every
    /// decision of the failed-over slots would meet the old primary for good.
    /// Such a connection is replaced at most once a second: a replica of a
    /// primary that died answers `READONLY` until its promotion, and a
    /// connection made again sooner would read the same map.
    fn check(self: &Arc<Self>, id: u64, error: &RedisError) {
        let gone = error.is_io_error() && error.to_string().contains("redis_cluster: Unable to");
        if gone {
            let mut slot = self.slot();
            if matches!(*slot, Slot::Ready { id: current, .. } if current == id) {
                *slot = Slot::Idle;
            }
        } else if error.code() == Some("READONLY") || error.is_timeout() {
            // a demoted primary, or a node that hangs (its replica may have
            // taken over)
            self.reconnect_soon();
        }
    }

    /// Makes a connection anew, with the slot map as it is then, in a task
    /// of its own, and puts it in place of the one in use once it is made
    /// and every primary of its map answers, or its map moved a slot (see
    /// [`primaries_answer`]):
    /// decisions go on on the one in use meanwhile (a node that hangs never
    /// holds up the others' decisions), and one that cannot be made (its
    /// seeds out of reach) leaves it. At most once every [`RESET_EVERY`].
    fn reconnect_soon(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut last = self.last_reset.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < RESET_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        // numbered now: it never takes the place of a connection made after
        let id = self.attempts.fetch_add(1, Ordering::Relaxed);
        let link = Arc::downgrade(self);
        runtime.spawn(async move {
            let Some((client, timeout)) = link.upgrade().map(|l| (l.client.clone(), l.connect_timeout))
            else {
                return;
            };
            let Ok(Ok(conn)) = tokio::time::timeout(timeout, client.get_async_connection()).await else {
                return;
            };
            let Some(answer) = primaries_answer(&conn, timeout).await else {
                return;
            };
            let Some(link) = link.upgrade() else {
                return;
            };
            let mut map_in_use = link.map_in_use.lock().unwrap_or_else(PoisonError::into_inner);
            let moved = map_in_use.as_ref().is_some_and(|map| *map != answer.map);
            if !answer.every_primary && !moved {
                return;
            }
            let mut slot = link.slot();
            // in place of an older connection, or of none (an attempt under
            // way then finds itself replaced, and leaves this one in place)
            if !matches!(*slot, Slot::Ready { id: current, .. } if current > id) {
                *slot = Slot::Ready { id, conn };
                *map_in_use = Some(answer.map);
            }
        });
    }
}

/// What a request to every primary of `conn` (a `CLUSTER SLOTS` to each,
/// a command the storage needs anyway) tells within `timeout`: `None` when
/// it failed or timed out (a primary it links to hangs).
///
/// A connection made anew while a node hangs has no link to it (the driver
/// then leaves that node out of a request to every primary, so the answers
/// are counted against the primaries the map names): its first decision
/// for that node's keys would set the driver reconnecting, which holds up
/// every decision on the connection, those of the other nodes too, for up
/// to the connection timeout. Such a connection is put in place only when
/// its map moved slots from the one in use (a failover elsewhere: the one
/// in use sends their keys to a demoted primary), else the one in use
/// still serves the other nodes.
async fn primaries_answer(conn: &ClusterConnection, timeout: Duration) -> Option<Answered> {
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let mut probe = conn.clone();
    let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
    let Ok(Ok(Value::Map(answers))) =
        tokio::time::timeout(timeout, probe.route_command(slots, routing)).await
    else {
        return None;
    };
    let maps: Vec<_> = answers
        .iter()
        .filter_map(|(_, answer)| slot_ranges(answer))
        .collect();
    let mut map = maps.first()?.clone();
    map.sort_unstable();
    let primaries: HashSet<&str> = map.iter().map(|(_, _, primary)| primary.as_str()).collect();
    let every_primary = maps.len() == answers.len() && answers.len() >= primaries.len();
    Some(Answered { map, every_primary })
}

/// See [`primaries_answer`].
struct Answered {
    /// The map, as the first answer tells it.
    map: ClusterMap,
    /// Every primary the map names answered.
    every_primary: bool,
}
