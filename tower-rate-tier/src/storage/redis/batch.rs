//! Opportunistic batching: a decision that arrives while the storage's call
//! is in flight waits in a queue; the queue goes out as one call of the
//! batch script when a call ends, or as a second call in flight once it
//! holds its share of the decisions waiting. A single server has one
//! queue, a Redis Cluster one per primary (`nodes.rs`), each as described
//! here.
//!
//! * No timer: a decision that finds no call in flight is sent at once, as
//!   one ordinary script call, so light traffic sees no added latency and
//!   no batch script. Batches form only under concurrency, as large as the
//!   traffic that arrived during a round trip.
//! * Two calls in flight at most: the queue goes out as a call of its own
//!   while one call is in flight once it holds half of the decisions in
//!   flight and queued (so the two calls stay of about one size), rather
//!   than waiting for that call to end. Redis then always has the next call
//!   to run while the client handles the last reply, and each call still
//!   carries a batch of its share of the traffic. The check runs when a
//!   queued decision is first awaited, so decisions asked for together
//!   before any is awaited stay together.
//! * Order: the queue is first in, first out, a batch decides in queue
//!   order, and a call takes decisions only once the call that took
//!   decisions before it has been handed to the connection (which sends in
//!   order), so decisions are made in the order they were asked for, each
//!   exactly as a call of its own would make it.
//! * The right to send (a [`Turn`]) passes from a finished call to a task
//!   that sends what has queued meanwhile, and that task keeps sending while
//!   the queue refills; it ends (and the turn with it) once the queue is
//!   empty, or holds less than its share while another call is in flight
//!   (whose end takes it). A turn dropped early (its caller gave up, the
//!   runtime ended) passes on too, so a queued decision is never stranded.
//! * Timeouts stay per decision: a queued decision fails with `Timeout`
//!   once its own timeout has passed since it was first awaited; a
//!   decision whose caller has gone is never sent; a batch that failed or
//!   timed out is never sent again (a `NOSCRIPT` reply, which means it did
//!   not run, is answered by sending the script, as for a single call).

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;

use redis::RedisError;
use tokio::sync::oneshot;

use super::super::{Decide, Decision, StorageError, StorageErrorKind};
use super::batch_args::BatchArgs;
use super::error::{Attempt, redis_error, timeout_error};
use super::script::{Args, BATCH, CLUSTER_BATCH, Script};
use super::{Batching, Inner, keys, nodes};

mod alone;
use alone::{alone_in_turn, resend};

/// How many calls one storage has in flight at most.
const MAX_IN_FLIGHT: usize = 2;

/// The default cap on decisions per batch.
pub(super) const DEFAULT_MAX_BATCH: usize = 128;

/// The queue of one storage on a single server, or of one node of a
/// Redis Cluster.
pub(super) struct Batcher {
    max: usize,
    script: Script,
    /// On a Cluster, the node (`host:port`) whose decisions queue here.
    node: Option<Box<str>>,
    state: Mutex<State>,
}

struct State {
    /// Calls in flight (turns held).
    in_flight: usize,
    /// Decisions in those calls.
    flying: usize,
    /// A call has taken its decisions but not yet been handed to the
    /// connection: no other call takes decisions until it has.
    unsent: bool,
    /// Empty while `in_flight` is 0: whoever would give the last turn back
    /// takes the queue instead.
    queue: VecDeque<Waiting>,
}

impl State {
    /// Whether the queue goes out now, as the call of a turn whose call has
    /// ended (`alone`: no other call in flight) or of a new turn: it is not
    /// empty, no call waits to be handed to the connection, and either no
    /// other call is in flight or the queue holds its share, an even part
    /// of the decisions in flight and queued.
    fn ready(&self, alone: bool, max: usize) -> bool {
        let share = (self.flying + self.queue.len())
            .div_ceil(MAX_IN_FLIGHT)
            .clamp(1, max);
        !self.queue.is_empty() && !self.unsent && (alone || self.queue.len() >= share)
    }
}

/// A decision waiting for a batch.
struct Waiting {
    args: Args,
    attempt: Attempt,
    reply: oneshot::Sender<Result<Decision, StorageError>>,
}

impl Batcher {
    /// Batches of at most `max` decisions (at least 2) on a single server.
    pub(super) fn new(max: usize) -> Self {
        Self::with(max, BATCH, None)
    }

    /// Batches of at most `max` decisions (at least 2) for the Cluster
    /// node at `node` (`host:port`).
    pub(super) fn for_node(max: usize, node: &str) -> Self {
        Self::with(max, CLUSTER_BATCH, Some(node.into()))
    }

    fn with(max: usize, source: &'static str, node: Option<Box<str>>) -> Self {
        Batcher {
            max: max.max(2),
            script: Script::new(source),
            node,
            state: Mutex::new(State {
                in_flight: 0,
                flying: 0,
                unsent: false,
                queue: VecDeque::new(),
            }),
        }
    }

    /// The cap on decisions per batch.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// On a Cluster, the node whose decisions queue here.
    pub(super) fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `max` queued decisions whose callers still wait, in order,
    /// for a call about to be handed to the connection.
    fn take(&self, state: &mut State) -> Vec<Waiting> {
        let mut batch = Vec::with_capacity(self.max.min(state.queue.len()));
        while batch.len() < self.max {
            match state.queue.pop_front() {
                Some(waiting) if waiting.reply.is_closed() => {}
                Some(waiting) => batch.push(waiting),
                None => break,
            }
        }
        state.flying += batch.len();
        state.unsent = !batch.is_empty();
        batch
    }
}

/// Decides `args` through the queue of `inner` (which has a batcher): at
/// once when no call is in flight, else with a later batch.
pub(super) fn submit(inner: &Arc<Inner>, batcher: &Arc<Batcher>, (args, attempt): (Args, Attempt)) -> Decide {
    let mut state = batcher.state();
    if state.in_flight == 0 {
        state.in_flight = 1;
        state.flying = 1;
        state.unsent = true;
        drop(state);
        let mut turn = Turn::new(inner.clone(), batcher.clone(), 1);
        let inner = inner.clone();
        return Decide::pending(async move {
            let deadline = tokio::time::Instant::now() + inner.timeout;
            let call = inner.call_in_turn(&args, attempt);
            let decided = handed(&turn.batcher, &mut turn.unsent, call).await;
            drop(turn);
            match decided {
                Some(decided) => decided,
                // redirected (its slot is moving): sent again once the turn
                // is given back, within what is left of the timeout
                None => tokio::time::timeout_at(deadline, inner.clone().call((args, attempt)))
                    .await
                    .unwrap_or_else(|_| Err(timeout_error(attempt, inner.timeout))),
            }
        });
    }
    let (reply, answer) = oneshot::channel();
    state.queue.push_back(Waiting { args, attempt, reply });
    drop(state);
    let (inner, batcher) = (inner.clone(), batcher.clone());
    Decide::pending(async move {
        spread(&inner, &batcher);
        match tokio::time::timeout(inner.timeout, answer).await {
            Err(_) => Err(timeout_error(attempt, inner.timeout)),
            Ok(Ok(decided)) => decided,
            Ok(Err(_)) => Err(StorageError::new(
                StorageErrorKind::Unavailable,
                "the Redis storage stopped before sending a queued decision (its runtime ended)",
            )),
        }
    })
}

/// Sends the queue as a call of its own when there is room for one more
/// call in flight and the queue holds its share (see [`State::ready`]),
/// rather than after a call in flight.
fn spread(inner: &Arc<Inner>, batcher: &Arc<Batcher>) {
    let mut state = batcher.state();
    if state.in_flight == 0 || state.in_flight >= MAX_IN_FLIGHT || !state.ready(false, batcher.max) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let batch = batcher.take(&mut state);
    if batch.is_empty() {
        return;
    }
    state.in_flight += 1;
    drop(state);
    let turn = Turn::new(inner.clone(), batcher.clone(), batch.len());
    runtime.spawn(flush(turn, batch));
}

/// Runs `call`, the call of a turn, and notes after its first poll (which
/// hands its command to the connection, or ends it) that the next call may
/// take decisions.
async fn handed<F: Future>(batcher: &Batcher, unsent: &mut bool, call: F) -> F::Output {
    let mut call = pin!(call);
    let first = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    handed_over(batcher, unsent);
    match first {
        Poll::Ready(output) => output,
        Poll::Pending => call.await,
    }
}

/// Notes that a turn's call has been handed to the connection (or given
/// up): the next call may take decisions.
fn handed_over(batcher: &Batcher, unsent: &mut bool) {
    if std::mem::take(unsent) {
        batcher.state().unsent = false;
    }
}

/// The right to have one call in flight, with the number of decisions in
/// it.
struct Turn {
    inner: Arc<Inner>,
    batcher: Arc<Batcher>,
    size: usize,
    held: bool,
    /// Its call has taken decisions but not been handed to the connection.
    unsent: bool,
}

impl Turn {
    /// The turn of a call that has just taken `size` decisions.
    fn new(inner: Arc<Inner>, batcher: Arc<Batcher>, size: usize) -> Self {
        Turn {
            inner,
            batcher,
            size,
            held: true,
            unsent: true,
        }
    }

    /// The next batch to send after this turn's call, or `None` after
    /// giving the turn back (see [`State::ready`]).
    fn next(&mut self) -> Option<Vec<Waiting>> {
        let batcher = &*self.batcher;
        let mut state = batcher.state();
        state.flying -= std::mem::take(&mut self.size);
        let alone = state.in_flight == 1;
        if state.ready(alone, batcher.max) {
            let batch = batcher.take(&mut state);
            if !batch.is_empty() {
                self.size = batch.len();
                self.unsent = true;
                return Some(batch);
            }
        }
        state.in_flight -= 1;
        self.held = false;
        None
    }
}

impl Drop for Turn {
    /// A finished (or abandoned) call passes the turn to a task that sends
    /// what has queued meanwhile.
    fn drop(&mut self) {
        handed_over(&self.batcher, &mut self.unsent);
        if !self.held {
            return;
        }
        let Some(batch) = self.next() else {
            return;
        };
        let mut next = Turn::new(self.inner.clone(), self.batcher.clone(), self.size);
        (self.held, self.unsent) = (false, false);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flush(next, batch));
            }
            Err(_) => {
                // No runtime to send on: every queued caller gets an error
                // (its sender dropped) and the turn is given back.
                next.held = false;
                handed_over(&next.batcher, &mut next.unsent);
                let mut state = next.batcher.state();
                state.queue.clear();
                state.flying -= next.size;
                state.in_flight -= 1;
            }
        }
    }
}

/// Sends batches on `turn` while the queue refills.
async fn flush(mut turn: Turn, mut batch: Vec<Waiting>) {
    loop {
        batch.retain(|waiting| !waiting.reply.is_closed());
        let Turn {
            inner,
            batcher,
            unsent,
            ..
        } = &mut turn;
        handed(batcher, unsent, send(inner, batcher, batch)).await;
        match turn.next() {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// One call for `batch`: the single script for one decision, the batch
/// script for more; every caller gets its answer. On a Cluster the batch
/// goes to the primary of its first decision's slot (the node of this
/// queue, unless that slot has moved since), and a decision whose key that
/// node does not serve (it moved, or is moving) is sent again alone, routed
/// by its keys, once the others are answered ([`resend`]).
async fn send(inner: &Arc<Inner>, batcher: &Batcher, batch: Vec<Waiting>) {
    if batch.len() <= 1 {
        return alone_in_turn(inner, batch).await;
    }
    let nodes = match &inner.batching {
        Batching::Cluster(nodes) => Some(nodes),
        Batching::Off | Batching::Single(_) => None,
    };
    let args = BatchArgs::new(
        batch.iter().map(|waiting| &waiting.args).collect(),
        nodes.is_some(),
    );
    let to = nodes.map(|_| keys::slot(&batch[0].args.keys[0]));
    let call = async {
        // `Charge` stands for "each decision's own attempt" in what fails.
        match batcher.script.call(&inner.conn, &args, Attempt::Charge, to).await {
            // Not sent, or sent on a connection already dead (see
            // `retries_once`): one more try.
            Err((_, e)) if super::call::retries_once(&e) => {
                batcher.script.call(&inner.conn, &args, Attempt::Charge, to).await
            }
            other => other,
        }
    };
    let outcome = tokio::time::timeout(inner.timeout, call).await;
    match outcome {
        Err(_) => {
            // a node that hangs: its replica may have taken over
            inner.conn.met_stale_slot_map();
            for waiting in batch {
                let _ = waiting
                    .reply
                    .send(Err(timeout_error(waiting.attempt, inner.timeout)));
            }
        }
        Ok(Err((step, error))) => match nodes {
            // A server older than the script (it never ran): every
            // decision its own call from now on.
            Some(nodes) if nodes::refuses_script(&error) => {
                nodes.refuse();
                drop(args);
                alone_in_turn(inner, batch).await;
            }
            Some(nodes) => {
                // the node may be gone, its slots served elsewhere soon
                nodes.refresh(inner);
                fail_all(batch, step, &error);
            }
            None => fail_all(batch, step, &error),
        },
        Ok(Ok(value)) => match args.split(value) {
            Some((replies, now)) => {
                if nodes.is_some() && replies.iter().any(nodes::demoted) {
                    // a failover made the batch's node a replica
                    inner.conn.met_stale_slot_map();
                    if let Some(nodes) = nodes {
                        nodes.refresh(inner);
                    }
                }
                let decided: Vec<_> = replies
                    .into_iter()
                    .zip(&batch)
                    .enumerate()
                    .map(|(i, (reply, waiting))| {
                        let moved = nodes.is_some() && nodes::relocated(&reply);
                        (!moved).then(|| args.decode(i, reply, now, waiting.attempt))
                    })
                    .collect();
                drop(args);
                let mut moved = Vec::new();
                for (waiting, decided) in batch.into_iter().zip(decided) {
                    match decided {
                        Some(decided) => {
                            let _ = waiting.reply.send(decided);
                        }
                        None => moved.push(waiting),
                    }
                }
                if let (Some(nodes), false) = (nodes, moved.is_empty()) {
                    nodes.refresh(inner);
                    resend(inner, moved).await;
                }
            }
            None => {
                drop(args);
                for waiting in batch {
                    let _ = waiting.reply.send(Err(StorageError::new(
                        StorageErrorKind::Other,
                        "unexpected reply from the rate-limit batch script (another script under its SHA-1?)",
                    )));
                }
            }
        },
    }
}

fn fail_all(batch: Vec<Waiting>, step: Attempt, error: &RedisError) {
    for waiting in batch {
        let attempt = if step == Attempt::Charge {
            waiting.attempt
        } else {
            step
        };
        let _ = waiting.reply.send(Err(redis_error(attempt, error.clone())));
    }
}
