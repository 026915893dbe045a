//! Batching on a Redis Cluster: which primary serves which hash slot, as
//! this storage last read it (`CLUSTER SLOTS`), and a batch queue per
//! primary.
//!
//! * A decision queues at the node that serves its key's slot; each node's
//!   queue batches as a single server's does (two calls in flight at most,
//!   per node), with the batch script of `cluster.lua` (keys of many slots
//!   as arguments, Redis 7.0 or later).
//! * The map is read on first use, and again (at most every
//!   [`REFRESH_EVERY`]) when a batch meets a key its node does not serve or
//!   a batch fails: a stale map costs a decision one more call, never a
//!   wrong one, because a node refuses keys it does not serve and such a
//!   decision is sent again alone, routed by its keys (the driver follows
//!   `MOVED` and `ASK`).
//! * A decision whose slot the map does not name (no map yet, a slot not
//!   served) is its own call.
//! * Servers that refuse the batch script (older than Redis 7.0) turn
//!   batching off for the storage, with one warning: every decision is then
//!   its own call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::{RedisError, Value};

use super::Inner;
use super::batch::Batcher;

/// The fewest time between two reads of the slot map.
pub(super) const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// Slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// A slot no known primary serves.
const NONE: u16 = u16::MAX;

/// The queues of a Cluster's primaries.
pub(super) struct Nodes {
    max: usize,
    map: ArcSwap<SlotMap>,
    refresh: Mutex<Refresh>,
    /// The servers refused the batch script: no batching.
    refused: AtomicBool,
}

/// Per slot, the queue of the primary that serves it.
struct SlotMap {
    /// Per slot, an index into `nodes`, or [`NONE`].
    owner: Box<[u16]>,
    nodes: Vec<Arc<Batcher>>,
}

#[derive(Default)]
struct Refresh {
    running: bool,
    last: Option<Instant>,
}

impl Nodes {
    /// Queues of batches of at most `max` decisions, one per primary once
    /// the slot map has been read.
    pub(super) fn new(max: usize) -> Self {
        Nodes {
            max: max.max(2),
            map: ArcSwap::from_pointee(SlotMap {
                owner: vec![NONE; SLOTS].into_boxed_slice(),
                nodes: Vec::new(),
            }),
            refresh: Mutex::new(Refresh::default()),
            refused: AtomicBool::new(false),
        }
    }

    /// The cap on decisions per batch.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// The queue of the primary that serves `slot`; `None` (the decision
    /// is its own call) when no known primary does or batching is off.
    pub(super) fn queue(&self, slot: u16) -> Option<Arc<Batcher>> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        let map = self.map.load();
        let node = *map.owner.get(usize::from(slot))?;
        map.nodes.get(usize::from(node)).cloned()
    }

    /// The servers refused the batch script: every decision its own call
    /// from now on.
    pub(super) fn refuse(&self) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the Redis Cluster refuses the rate-limit batch script (it needs Redis 7.0 or later \
                 for `#!lua flags=allow-cross-slot-keys`); every decision is sent on its own"
            );
        }
    }

    /// Reads the slot map again in a task of its own, unless a read runs or
    /// ended less than [`REFRESH_EVERY`] ago (or batching is off).
    pub(super) fn refresh(&self, inner: &Arc<Inner>) {
        if self.refused.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut refresh = self.refresh.lock().unwrap_or_else(PoisonError::into_inner);
            if refresh.running || refresh.last.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
                return;
            }
            refresh.running = true;
        }
        let inner = inner.clone();
        runtime.spawn(async move {
            let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
            let read = tokio::time::timeout(inner.timeout, inner.conn.query(cmd, None)).await;
            if let super::Batching::Cluster(nodes) = &inner.batching {
                if let Ok(Ok(reply)) = read {
                    nodes.apply(&reply);
                }
                let mut refresh = nodes.refresh.lock().unwrap_or_else(PoisonError::into_inner);
                refresh.running = false;
                refresh.last = Some(Instant::now());
            }
        });
    }

    /// Takes a `CLUSTER SLOTS` reply as the slot map, keeping the queue of
    /// every primary that stays (a reply of another shape changes nothing).
    fn apply(&self, reply: &Value) {
        let Some(ranges) = slot_ranges(reply) else {
            return;
        };
        let old = self.map.load();
        let mut owner = vec![NONE; SLOTS].into_boxed_slice();
        let mut nodes: Vec<Arc<Batcher>> = Vec::new();
        for (start, end, addr) in ranges {
            let node = match nodes.iter().position(|b| b.node() == Some(&addr)) {
                Some(i) => i,
                None => {
                    let kept = old.nodes.iter().find(|b| b.node() == Some(&addr)).cloned();
                    nodes.push(kept.unwrap_or_else(|| Arc::new(Batcher::for_node(self.max, &addr))));
                    nodes.len() - 1
                }
            };
            let Ok(node) = u16::try_from(node) else {
                return;
            };
            for slot in &mut owner[usize::from(start)..=usize::from(end)] {
                *slot = node;
            }
        }
        self.map.store(Arc::new(SlotMap { owner, nodes }));
    }
}

/// A Cluster's slot map as `CLUSTER SLOTS` tells it: `(first slot, last
/// slot, "host:port" of the primary)` per range.
pub(super) type ClusterMap = Vec<(u16, u16, String)>;

/// The ranges of a `CLUSTER SLOTS` reply; `None` for a reply of another
/// shape.
pub(super) fn slot_ranges(reply: &Value) -> Option<ClusterMap> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let slot = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|&s| usize::from(s) < SLOTS),
            _ => None,
        };
        let (start, end) = (slot(fields.first())?, slot(fields.get(1))?);
        let Some(Value::Array(primary)) = fields.get(2) else {
            return None;
        };
        let host = match primary.first()? {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Value::SimpleString(text) => text.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return None;
        };
        if start > end {
            return None;
        }
        out.push((start, end, format!("{host}:{port}")));
    }
    Some(out)
}

/// A batch's reply element that says the node does not serve the
/// decision's key (its slot moved, is moving without the key here, or is
/// served by no one): Redis's errors for a script that reaches such a key.
pub(super) fn relocated(reply: &Value) -> bool {
    let text = error_text(reply);
    ["non local key", "during rehashing of the slot", "slot not served"]
        .iter()
        .any(|needle| text.contains(needle))
}

/// Whether an item of a batch's reply is a `READONLY` error: the node the
/// batch went to is a replica now (see `ClusterLink::check`).
pub(super) fn demoted(reply: &Value) -> bool {
    error_text(reply).starts_with("READONLY")
}

/// The text of an item of a batch's reply that is an error (a string), or
/// `""`.
fn error_text(reply: &Value) -> &str {
    match reply {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).unwrap_or(""),
        Value::SimpleString(text) => text,
        _ => "",
    }
}

/// The server could not take the batch script: it does not read the
/// script's first line (`#!lua flags=...`, Redis 7.0 and later).
pub(super) fn refuses_script(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or("");
    detail.contains("shebang") || (detail.contains("Error compiling script") && detail.contains(":1:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn the_slot_map_follows_cluster_slots_and_keeps_queues() {
        let nodes = Nodes::new(16);
        assert!(nodes.queue(0).is_none());
        nodes.apply(&Value::Array(vec![
            range(0, 5460, 7001),
            range(5461, 10922, 7002),
            range(10923, 16383, 7003),
        ]));
        let first = nodes.queue(0).expect("slot 0 is served");
        assert_eq!(first.node(), Some("127.0.0.1:7001"));
        assert_eq!(nodes.queue(5461).unwrap().node(), Some("127.0.0.1:7002"));
        assert_eq!(nodes.queue(16383).unwrap().node(), Some("127.0.0.1:7003"));
        assert!(nodes.queue(16384).is_none());
        // slot 0 moves to the third node, slot 1 to a new one: the queues
        // of the nodes that stay are the same queues
        nodes.apply(&Value::Array(vec![
            range(0, 0, 7003),
            range(1, 1, 7004),
            range(2, 5460, 7001),
            range(5461, 10922, 7002),
            range(10923, 16383, 7003),
        ]));
        assert_eq!(nodes.queue(0).unwrap().node(), Some("127.0.0.1:7003"));
        assert_eq!(nodes.queue(1).unwrap().node(), Some("127.0.0.1:7004"));
        assert!(Arc::ptr_eq(&first, &nodes.queue(2).unwrap()));
        // a reply of another shape changes nothing; a refusal turns it off
        nodes.apply(&Value::Array(vec![Value::Int(3)]));
        nodes.apply(&Value::Array(vec![range(9, 3, 7001)]));
        assert_eq!(nodes.queue(0).unwrap().node(), Some("127.0.0.1:7003"));
        nodes.refuse();
        assert!(nodes.queue(0).is_none());
    }

    #[test]
    fn relocations_and_old_servers_are_recognised() {
        assert!(relocated(&bulk(
            "ERR Script attempted to access a non local key in a cluster node"
        )));
        assert!(relocated(&bulk(
            "ERR Unable to execute command 'get' in script because undeclared keys were accessed \
             during rehashing of the slot"
        )));
        assert!(!relocated(&bulk("NOPERM this user has no permissions")));
        assert!(!relocated(&Value::Int(3)));
        let server = |detail: &str| {
            RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                detail.to_owned(),
            ))
        };
        // Redis 6 does not read the first line as a shebang
        assert!(refuses_script(&server(
            "Error compiling script (new function): user_script:1: unexpected symbol near '#'"
        )));
        assert!(refuses_script(&server(
            "Unexpected flag in script shebang: allow-cross-slot-keys"
        )));
        assert!(!refuses_script(&server("tower-rate-tier: bad batch arguments")));
    }
}
