//! The batch script's arguments and reply (`batch.lua`): which decisions of
//! a batch are short (a charge of one limited band, decided inline by the
//! script and answered with one integer), and each decision's answer.

use redis::{Cmd, Value};
use smallvec::SmallVec;

use super::super::{BandStates, Decision, StorageError};
use super::error::{Attempt, item_error};
use super::script::{Args, BATCH_CONTRACT, CallArgs, bad_reply, decode};
use crate::gcra::BandState;

/// The arguments of a batch (see `batch.lua`): every decision's keys, then
/// the contract, the number of decisions, the time and the band triples of
/// the short decisions, and per decision its tag (short) or its `ARGV`
/// (full). For a Cluster node (`cluster.lua`) no key is declared: the key
/// count and the keys open the arguments instead.
pub(super) struct BatchArgs<'a> {
    items: Vec<&'a Args>,
    /// The time of the short decisions.
    now: Option<u64>,
    /// The distinct band triples of the short decisions.
    triples: SmallVec<[[u64; 3]; 4]>,
    /// Per decision: its triple (1-based) when short, 0 when full.
    short: Vec<u8>,
    /// The keys go as arguments (`cluster.lua`: a Cluster node's batch,
    /// whose keys span slots).
    keys_as_args: bool,
}

/// The tags of short decisions: `s<j>` names triple `j`.
const TAGS: [&str; 16] = [
    "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14", "s15", "s16",
];

impl<'a> BatchArgs<'a> {
    /// Decisions `items`, in order. A charge of one limited band is short
    /// when it shares the first such decision's time (always, with the
    /// server's `TIME`) and its triple is one of the first [`TAGS`] distinct
    /// ones; any other decision is full. `keys_as_args` for the batch of
    /// a Cluster node (`cluster.lua`).
    pub(super) fn new(items: Vec<&'a Args>, keys_as_args: bool) -> Self {
        let mut now = None;
        let mut first = true;
        let mut triples = SmallVec::new();
        let mut short = Vec::with_capacity(items.len());
        for args in &items {
            let mut tag = 0;
            if args.keys.len() == 1 && args.mode == "c" && args.spans[0][0] != 0 {
                if first {
                    (now, first) = (args.now, false);
                }
                if args.now == now {
                    let triple = args.spans[0];
                    tag = match triples.iter().position(|t| *t == triple) {
                        Some(j) => j + 1,
                        None if triples.len() < TAGS.len() => {
                            triples.push(triple);
                            triples.len()
                        }
                        None => 0,
                    };
                }
            }
            short.push(tag as u8);
        }
        BatchArgs {
            items,
            now,
            triples,
            short,
            keys_as_args,
        }
    }

    /// Splits the script's reply into one element per decision and the
    /// short decisions' time (when one was decided); `None` for a reply of
    /// another shape.
    pub(super) fn split(&self, value: Value) -> Option<(Vec<Value>, Option<u64>)> {
        let Value::Array(mut replies) = value else {
            return None;
        };
        if replies.len() == self.items.len() + 1 {
            let Some(Value::Int(now)) = replies.pop() else {
                return None;
            };
            return Some((replies, Some(u64::try_from(now).ok()?)));
        }
        (replies.len() == self.items.len()).then_some((replies, None))
    }

    /// Decision `i`'s element of the reply: a decision, or the error of
    /// that decision alone (for `attempt`).
    pub(super) fn decode(
        &self,
        i: usize,
        reply: Value,
        now: Option<u64>,
        attempt: Attempt,
    ) -> Result<Decision, StorageError> {
        match reply {
            Value::BulkString(text) => Err(item_error(attempt, &String::from_utf8_lossy(&text))),
            Value::SimpleString(text) => Err(item_error(attempt, &text)),
            Value::Int(used) if self.short[i] > 0 => match now {
                Some(now) => Ok(short_decision(
                    used,
                    self.triples[usize::from(self.short[i]) - 1],
                    now,
                )),
                None => Err(bad_reply()),
            },
            other => decode(other, &self.items[i].spans).map(|d| self.items[i].complete(d)),
        }
    }
}

/// A short decision from its reply element (the band's time used after it
/// when admitted, `-(used + 1)` when denied) and its triple: what
/// `redis.lua` replies for the same charge.
fn short_decision(reply: i64, [interval, tol, inc]: [u64; 3], now: u64) -> Decision {
    let allowed = reply >= 0;
    let used = if allowed { reply } else { -(reply + 1) };
    let used = u64::try_from(used).unwrap_or(0);
    let left = tol.saturating_sub(used);
    let retry = if allowed {
        0
    } else {
        (used + inc).saturating_sub(tol)
    };
    let mut states = BandStates::new();
    states.push(BandState {
        remaining: u32::try_from(left / interval.max(1)).unwrap_or(u32::MAX),
        reset_after_ns: used.saturating_mul(1_000),
        retry_after_ns: retry.saturating_mul(1_000),
        more_after_ns: crate::gcra::next_unit_after(used, interval).saturating_mul(1_000),
        debt_ns: 0,
        forgiven: 0,
    });
    Decision::new(allowed, now.saturating_mul(1_000), states)
}

impl CallArgs for BatchArgs<'_> {
    fn key_count(&self) -> usize {
        self.items.iter().map(|a| a.keys.len()).sum()
    }

    fn size(&self) -> usize {
        48 + 60 * self.triples.len() + self.items.iter().map(|a| a.size() + 4).sum::<usize>()
    }

    fn push(&self, cmd: &mut Cmd) {
        if self.keys_as_args {
            cmd.arg(0);
        }
        cmd.arg(self.key_count());
        for args in &self.items {
            for key in &args.keys {
                cmd.arg(&key[..]);
            }
        }
        cmd.arg(BATCH_CONTRACT).arg(self.items.len());
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.triples.len());
        for triple in &self.triples {
            cmd.arg(triple[0]).arg(triple[1]).arg(triple[2]);
        }
        for (args, &tag) in self.items.iter().zip(&self.short) {
            if tag > 0 {
                cmd.arg(TAGS[usize::from(tag) - 1]);
            } else {
                cmd.arg(args.keys.len());
                args.push_argv(cmd);
            }
        }
    }
}
