//! Opportunistic batching: a decision that arrives while the storage's call
//! is in flight waits in a queue; when the call ends, everything queued (up
//! to the cap) goes out as one call of the batch script.
//!
//! * No timer: a decision that finds no call in flight is sent at once, as
//!   one ordinary script call, so light traffic sees no added latency and
//!   no batch script. Batches form only under concurrency, as large as the
//!   traffic that arrived during one round trip.
//! * Order: the queue is first in, first out, and a batch decides in queue
//!   order, so decisions are made in the order they were asked for, each
//!   exactly as a call of its own would make it.
//! * The right to send (a [`Turn`]) passes from a finished call to a task
//!   that sends what has queued meanwhile, and that task keeps sending while
//!   the queue refills; it ends (and the turn with it) once the queue is
//!   empty. A turn dropped early (its caller gave up, the runtime ended)
//!   passes on too, so a queued decision is never stranded.
//! * Timeouts stay per decision: a queued decision fails with
//!   `Timeout` once its own timeout has passed since it was asked for; a
//!   decision whose caller has gone is never sent; a batch that failed or
//!   timed out is never sent again (a `NOSCRIPT` reply, which means it did
//!   not run, is answered by sending the script, as for a single call).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::RedisError;
use tokio::sync::oneshot;

use super::super::{Decide, Decision, StorageError, StorageErrorKind};
use super::Inner;
use super::batch_args::BatchArgs;
use super::error::{Attempt, redis_error, timeout_error};
use super::script::{Args, BATCH, Script};

/// How many calls one storage has in flight at once. One: everything that
/// arrives during a call is decided by the next, which keeps the server's
/// work per decision lowest.
const MAX_IN_FLIGHT: usize = 1;

/// The default cap on decisions per batch.
pub(super) const DEFAULT_MAX_BATCH: usize = 128;

/// The queue of one storage.
pub(super) struct Batcher {
    max: usize,
    script: Script,
    state: Mutex<State>,
}

struct State {
    in_flight: usize,
    /// Never empty while `in_flight` is 0: whoever gives the last turn back
    /// takes the queue first.
    queue: VecDeque<Waiting>,
}

/// A decision waiting for a batch.
struct Waiting {
    args: Args,
    attempt: Attempt,
    bands: usize,
    reply: oneshot::Sender<Result<Decision, StorageError>>,
}

impl Batcher {
    /// Batches of at most `max` decisions (at least 2).
    pub(super) fn new(max: usize) -> Self {
        Batcher {
            max: max.max(2),
            script: Script::new(BATCH),
            state: Mutex::new(State {
                in_flight: 0,
                queue: VecDeque::new(),
            }),
        }
    }

    /// The cap on decisions per batch.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `max` queued decisions whose callers still wait, in order.
    fn take(&self, state: &mut State) -> Vec<Waiting> {
        let mut batch = Vec::with_capacity(self.max.min(state.queue.len()));
        while batch.len() < self.max {
            match state.queue.pop_front() {
                Some(waiting) if waiting.reply.is_closed() => {}
                Some(waiting) => batch.push(waiting),
                None => break,
            }
        }
        batch
    }
}

/// Decides `args` through the queue of `inner` (which has a batcher): at
/// once when no call is in flight, else with the next batch.
pub(super) fn submit(
    inner: &Arc<Inner>,
    batcher: &Batcher,
    (args, attempt): (Args, Attempt),
    bands: usize,
) -> Decide {
    let mut state = batcher.state();
    if state.in_flight < MAX_IN_FLIGHT && state.queue.is_empty() {
        state.in_flight += 1;
        drop(state);
        let turn = Turn {
            inner: inner.clone(),
            held: true,
        };
        return Decide::pending(async move {
            let decided = turn.inner.clone().call((args, attempt), bands).await;
            drop(turn);
            decided
        });
    }
    let (reply, answer) = oneshot::channel();
    state.queue.push_back(Waiting {
        args,
        attempt,
        bands,
        reply,
    });
    drop(state);
    let timeout = inner.timeout;
    Decide::pending(async move {
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(timeout_error(attempt, timeout)),
            Ok(Ok(decided)) => decided,
            Ok(Err(_)) => Err(StorageError::new(
                StorageErrorKind::Unavailable,
                "the Redis storage stopped before sending a queued decision (its runtime ended)",
            )),
        }
    })
}

/// The right to have one call in flight.
struct Turn {
    inner: Arc<Inner>,
    held: bool,
}

impl Turn {
    fn batcher(&self) -> Option<&Batcher> {
        self.inner.batch.as_ref()
    }

    /// The next batch to send, or `None` after giving the turn back (the
    /// queue was empty).
    fn next(&mut self) -> Option<Vec<Waiting>> {
        let batcher = self.inner.batch.as_ref()?;
        let mut state = batcher.state();
        let batch = batcher.take(&mut state);
        if batch.is_empty() {
            state.in_flight -= 1;
            self.held = false;
            return None;
        }
        Some(batch)
    }
}

impl Drop for Turn {
    /// A finished (or abandoned) call passes the turn to a task that sends
    /// what has queued meanwhile.
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Some(batch) = self.next() else {
            return;
        };
        let next = Turn {
            inner: self.inner.clone(),
            held: true,
        };
        self.held = false;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flush(next, batch));
            }
            Err(_) => {
                // No runtime to send on: every queued caller gets an error
                // (its sender dropped) and the turn is given back.
                let mut next = next;
                next.held = false;
                if let Some(batcher) = next.batcher() {
                    let mut state = batcher.state();
                    state.queue.clear();
                    state.in_flight -= 1;
                }
            }
        }
    }
}

/// Sends batches on `turn` while the queue refills.
async fn flush(mut turn: Turn, mut batch: Vec<Waiting>) {
    loop {
        batch.retain(|waiting| !waiting.reply.is_closed());
        send(&turn.inner, batch).await;
        match turn.next() {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// One call for `batch`: the single script for one decision, the batch
/// script for more; every caller gets its answer.
async fn send(inner: &Arc<Inner>, batch: Vec<Waiting>) {
    if batch.len() <= 1 {
        for waiting in batch {
            let decided = inner
                .clone()
                .call((waiting.args, waiting.attempt), waiting.bands)
                .await;
            let _ = waiting.reply.send(decided);
        }
        return;
    }
    let Some(batcher) = inner.batch.as_ref() else {
        return;
    };
    let args = BatchArgs::new(batch.iter().map(|waiting| &waiting.args).collect());
    let call = async {
        // `Charge` stands for "each decision's own attempt" in what fails.
        match batcher.script.call(&inner.conn, &args, Attempt::Charge).await {
            // Not sent (see `Inner::call`): one more try.
            Err((_, e)) if e.is_connection_refusal() => {
                batcher.script.call(&inner.conn, &args, Attempt::Charge).await
            }
            other => other,
        }
    };
    let outcome = tokio::time::timeout(inner.timeout, call).await;
    match outcome {
        Err(_) => {
            for waiting in batch {
                let _ = waiting
                    .reply
                    .send(Err(timeout_error(waiting.attempt, inner.timeout)));
            }
        }
        Ok(Err((step, error))) => fail_all(batch, step, &error),
        Ok(Ok(value)) => match args.split(value) {
            Some((replies, now)) => {
                let decided: Vec<_> = replies
                    .into_iter()
                    .zip(&batch)
                    .enumerate()
                    .map(|(i, (reply, waiting))| args.decode(i, reply, now, waiting.attempt))
                    .collect();
                drop(args);
                for (waiting, decided) in batch.into_iter().zip(decided) {
                    let _ = waiting.reply.send(decided);
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
