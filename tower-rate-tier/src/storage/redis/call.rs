//! One decision on its way to Redis: its keys and arguments, the queue it
//! waits in (the server's, a Cluster primary's, or none), and one script
//! call of its own within the timeout (the call `slots.rs` makes too).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::super::{Decide, Decision, Op, StorageError, StorageErrorKind, StorageKey};
use super::error::{Attempt, redis_error, timeout_error};
use super::script::{Args, CallArgs, Script, decode};
use super::{Batching, Inner, RedisStorage, batch, keys};
use crate::quota::Quota;

impl Inner {
    /// The script's keys and arguments for `op` on every band of `key`.
    pub(super) fn args(&self, key: StorageKey<'_>, bands: &[Quota], op: Op) -> (Args, Attempt) {
        let now = self.clock.as_ref().map(|clock| clock.now() / 1_000);
        let attempt = match op.on_bands() {
            Op::Charge(0) => Attempt::Peek,
            Op::Refund(_) => Attempt::Refund,
            _ => Attempt::Charge,
        };
        (Args::new(&self.keys, key, bands, op, now), attempt)
    }

    /// One script call within the timeout.
    pub(super) async fn call(
        self: Arc<Self>,
        (args, attempt): (Args, Attempt),
    ) -> Result<Decision, StorageError> {
        let value = self.query(&self.script, &args, attempt).await?;
        decode(value, &args.spans).map(|d| args.complete(d))
    }

    /// One script call within the timeout, as a call that holds its node's
    /// turn to send makes it: `None` when the node redirected it (its slot
    /// is moving or moved), for the caller to give the turn back before it
    /// sends the decision again ([`Inner::call`] follows redirections until
    /// the timeout).
    pub(super) async fn call_in_turn(
        &self,
        args: &Args,
        attempt: Attempt,
    ) -> Option<Result<Decision, StorageError>> {
        match self
            .query_as(&self.script, args, attempt, Redirected::Return)
            .await
        {
            Ok(Ok(value)) => Some(decode(value, &args.spans).map(|d| args.complete(d))),
            Ok(Err(error)) => Some(Err(error)),
            Err(Moved) => None,
        }
    }

    /// One call of `script` with `args` within the timeout: its reply, or
    /// the failure of `attempt`.
    pub(super) async fn query(
        &self,
        script: &Script,
        args: &(impl CallArgs + Sync),
        attempt: Attempt,
    ) -> Result<Value, StorageError> {
        match self.query_as(script, args, attempt, Redirected::Resend).await {
            Ok(answer) => answer,
            // (never: a redirected call is sent again until the timeout)
            Err(Moved) => Err(timeout_error(attempt, self.timeout)),
        }
    }

    /// [`Inner::query`], answering `Err(Moved)` at the first redirection
    /// when `redirected` says so.
    async fn query_as(
        &self,
        script: &Script,
        args: &(impl CallArgs + Sync),
        attempt: Attempt,
        redirected: Redirected,
    ) -> Result<Result<Value, StorageError>, Moved> {
        let call = async {
            let (mut refused, mut resent) = (false, 0);
            loop {
                match script.call(&self.conn, args, attempt, None).await {
                    // A refused connection means the command was not sent:
                    // it may be the refusal that an earlier reconnect
                    // attempt left behind (during an outage that has ended
                    // since), so one more try reconnects now rather than
                    // failing this decision. A dropped connection (the
                    // server restarted, or closed it while idle) is met by
                    // the first command sent on it after: one more try too
                    // (see `retries_once`).
                    Err((_, e)) if retries_once(&e) && !refused => refused = true,
                    // On a Cluster whose slots move, a redirection that the
                    // driver's own retry met again: the script did not run,
                    // so it is sent again, until the timeout (see
                    // `resend_pause`).
                    Err((_, e)) if moved_on(&e) && redirected == Redirected::Return => {
                        break Err(Moved);
                    }
                    Err((_, e)) if moved_on(&e) => {
                        let pause = resend_pause(resent);
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                        resent += 1;
                    }
                    other => break Ok(other),
                }
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                // a node that hangs: its replica may have taken over
                self.conn.met_stale_slot_map();
                Ok(Err(timeout_error(attempt, self.timeout)))
            }
            Ok(Err(Moved)) => Err(Moved),
            Ok(Ok(Err((attempt, e)))) => Ok(Err(redis_error(attempt, e))),
            Ok(Ok(Ok(value))) => Ok(Ok(value)),
        }
    }
}

/// What a call does when its node redirects it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Redirected {
    /// Sends it again, until the timeout.
    Resend,
    /// Answers [`Moved`].
    Return,
}

/// A call its node redirected, not sent again.
pub(super) struct Moved;

/// How long a decision waits before it is sent again after its `resent`-th
/// redirection (counted from 0): at once the first time, then 1 ms, 2 ms,
/// and 4 ms each time after, so that a cluster whose nodes keep redirecting
/// is not flooded until the timeout.
///
/// A redirection comes back often while a slot is half moved, and not only
/// when the slot moved on: the driver follows an `ASK` by sending `ASKING`
/// and then, once it is answered, the command, on the node's connection
/// that every caller shares, so another command sent in between takes the
/// one-time `ASKING` and the importing node answers the decision with
/// `MOVED` back to the source. Each new try is a new chance; no count of
/// tries is enough under load, hence the timeout as the only bound.
fn resend_pause(resent: u32) -> Duration {
    match resent {
        0 => Duration::ZERO,
        n => Duration::from_millis(1 << (n - 1).min(2)),
    }
}

/// A reply that says the command did not run here and names where to
/// send it (`MOVED`, `ASK`), or asks to send it again (`TRYAGAIN`: a
/// decision whose keys are split by a slot's move).
fn moved_on(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::TryAgain)
    )
}

pub(super) fn check_bands(bands: &[Quota], op: Op) -> Result<(), StorageError> {
    if bands.is_empty() || bands.len() > super::super::MAX_BANDS {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            "a decision needs 1 to MAX_BANDS bands",
        ));
    }
    if matches!(op, Op::Each(amounts) if amounts.len() != bands.len()) {
        return Err(StorageError::new(
            StorageErrorKind::Other,
            "an `Op::Each` needs one amount per band",
        ));
    }
    Ok(())
}

impl RedisStorage {
    /// One decision by Redis: the key names and arguments are made now (the
    /// future owns them), and sent at once or with the next batch.
    pub(super) fn send(&self, key: StorageKey<'_>, bands: &[Quota], op: Op) -> Decide {
        match op {
            Op::Acquire { .. } | Op::AcquireEach { .. } | Op::Release(_) => {
                super::slots::send(&self.inner, key, bands, op)
            }
            Op::Charge(_) | Op::Refund(_) | Op::Each(_) => self.inner.submit(self.inner.args(key, bands, op)),
        }
    }
}

impl Inner {
    /// Sends `args` at once, or with the next batch of the queue of its
    /// server (on a Cluster, of the primary of its key's slot).
    pub(super) fn submit(self: &Arc<Self>, args: (Args, Attempt)) -> Decide {
        match &self.batching {
            Batching::Single(batcher) => batch::submit(self, batcher, args),
            Batching::Cluster(nodes) => match nodes.queue(keys::slot(&args.0.keys[0])) {
                Some(batcher) => batch::submit(self, &batcher, args),
                None => {
                    nodes.refresh(self);
                    Decide::pending(self.clone().call(args))
                }
            },
            Batching::Off => Decide::pending(self.clone().call(args)),
        }
    }
}

/// Whether a call that failed with `e` is sent once more: on a refused
/// connection (the command was not sent) or a dropped one (the server
/// restarted, or closed the connection while it was idle: the first command
/// sent on it after meets a broken pipe). A connection that drops while the
/// command is in flight may have run it: the one more try can then apply it
/// twice (a charge, or a refund), as a timed-out call may have applied it
/// once.
pub(super) fn retries_once(e: &redis::RedisError) -> bool {
    e.is_connection_refusal() || e.is_connection_dropped()
}
