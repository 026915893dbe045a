//! Decisions sent one by one: by a call that holds its node's turn (each
//! sent once), and again after a redirection (in a task of their own,
//! following redirections until their callers give up).

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use super::super::Inner;
use super::Waiting;

/// Each decision of `batch` as a call of its own, in order (on a Cluster
/// routed by its keys: the driver follows `MOVED` and `ASK`). A call ends
/// when its caller gives up (its own timeout, counted from when it asked,
/// has passed): a decision sent again after a redirection is not sent once
/// more for no one, and the decisions after it are not held up.
async fn alone(inner: &Arc<Inner>, batch: Vec<Waiting>) {
    for Waiting {
        args,
        attempt,
        mut reply,
    } in batch
    {
        let mut call = pin!(inner.clone().call((args, attempt)));
        let decided = poll_fn(|cx| {
            if reply.poll_closed(cx).is_ready() {
                return Poll::Ready(None);
            }
            call.as_mut().poll(cx).map(Some)
        })
        .await;
        if let Some(decided) = decided {
            let _ = reply.send(decided);
        }
    }
}

/// Each decision of `batch` as a call of its own, in order, by a call that
/// holds its node's turn: a decision its node redirects (its slot is
/// moving or moved) is sent again once the others are answered, in a task
/// of its own ([`resend`]), so that a key stuck in a slot being moved
/// never holds the turn (nor the node's queue) for its timeout. A decision
/// whose caller has gone is not sent.
pub(super) async fn alone_in_turn(inner: &Arc<Inner>, batch: Vec<Waiting>) {
    let mut moved = Vec::new();
    for mut waiting in batch {
        let decided = {
            let mut call = pin!(inner.call_in_turn(&waiting.args, waiting.attempt));
            poll_fn(|cx| {
                if waiting.reply.poll_closed(cx).is_ready() {
                    return Poll::Ready(None);
                }
                call.as_mut().poll(cx).map(Some)
            })
            .await
        };
        match decided {
            Some(Some(decided)) => {
                let _ = waiting.reply.send(decided);
            }
            Some(None) => moved.push(waiting),
            None => {}
        }
    }
    if !moved.is_empty() {
        resend(inner, moved).await;
    }
}

/// The decisions of a batch whose keys its node did not serve, each sent
/// again alone ([`alone`]) in a task of its own: a key stuck in a slot
/// being moved (`TRYAGAIN` until the move goes on) holds up its own
/// callers only, never the node's queue, whose turn this call gives back.
pub(super) async fn resend(inner: &Arc<Inner>, moved: Vec<Waiting>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let inner = inner.clone();
            runtime.spawn(async move { alone(&inner, moved).await });
        }
        Err(_) => alone(inner, moved).await,
    }
}
