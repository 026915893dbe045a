//! The Lua scripts: `redis.lua` (one decision), `batch.lua` (many
//! decisions, each decided as `redis.lua` decides it) and `slots.lua` (a
//! concurrency slot taken with the charge of its bands as `redis.lua`
//! decides it, or given back), all after `gcra.lua` (the charge of one
//! band, which they share) and `each.lua` (a decision with an amount per
//! band), their arguments, the `EVALSHA` call with its `EVAL` fallbacks,
//! and the reply of one decision.
//!
//! A call is one `EVALSHA`. A `NOSCRIPT` reply (a restarted or flushed
//! server, a failover) is answered by one `EVAL`, which loads the script as
//! it runs it (the script never ran, so nothing is counted twice). A server
//! that refuses `EVALSHA` itself (renamed, or denied by an ACL) gets `EVAL`
//! from then on, with one warning in the log.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use smallvec::SmallVec;

use super::super::{
    Amount, BandStates, Decision, Op, StorageError, StorageErrorKind, StorageKey, band_names,
};
use super::error::Attempt;
use super::keys::{KeyBuf, KeyCodec, push_band};
use super::link::{Conn, Stage};
use crate::gcra::BandState;
use crate::quota::Quota;

/// One decision: `redis.lua`, after `gcra.lua` (`charge_band`, the
/// arithmetic of a charge on one limited band, which every script shares)
/// and `each.lua` (`decide_each`, a decision with an amount per band, which
/// `redis.lua` runs for an [`Op::Each`], on its own, in a batch or with a
/// slot).
pub(super) const SINGLE: &str = concat!(
    include_str!("gcra.lua"),
    include_str!("each.lua"),
    include_str!("redis.lua")
);

/// Many decisions in one call: `batch.lua` decides a charge of one limited
/// band with `gcra.lua`'s `charge_band`, as `redis.lua` does (with one
/// `MGET` for the whole batch), and any other decision through `redis.lua`'s
/// code itself, wrapped as the function `decide`. The
/// property test `batched_decisions_equal_one_call_each` holds both to the
/// single call's decisions.
pub(super) const BATCH: &str = concat!(
    include_str!("gcra.lua"),
    include_str!("each.lua"),
    "local function decide(KEYS, ARGV)\n",
    include_str!("redis.lua"),
    "\nend\n",
    "local read_one_by_one = false\n",
    include_str!("batch.lua")
);

/// Many decisions of one Redis Cluster node in one call: `cluster.lua`
/// (the flag `allow-cross-slot-keys`, Redis 7.0 and later, and the keys as
/// arguments), then what [`BATCH`] runs.
pub(super) const CLUSTER_BATCH: &str = concat!(
    include_str!("cluster.lua"),
    include_str!("gcra.lua"),
    include_str!("each.lua"),
    "local function decide(KEYS, ARGV)\n",
    include_str!("redis.lua"),
    "\nend\n",
    include_str!("batch.lua")
);

/// A concurrency slot: `slots.lua` takes one and charges the rate bands
/// with `redis.lua`'s code, wrapped as the function `decide` (as
/// [`BATCH`] wraps it), in one call and at one time, or gives one back.
pub(super) const SLOTS: &str = concat!(
    include_str!("gcra.lua"),
    include_str!("each.lua"),
    "local function decide(KEYS, ARGV)\n",
    include_str!("redis.lua"),
    "\nend\n",
    include_str!("slots.lua")
);

/// The batch script's contract, its first argument: the script refuses a
/// caller that speaks another one. Bump it with any change to the layout of
/// the batch's arguments or reply.
pub(super) const BATCH_CONTRACT: &str = "trt-batch-3";

/// Durations passed to the script are capped here (about 71 years) so that
/// the script's sums stay exact in Lua's doubles.
const MAX_SPAN_US: u64 = 1 << 51;

/// `bands` as the scripts count them: each interval rounded up to whole
/// microseconds (at most [`MAX_SPAN_US`]), as the arguments send it. The
/// deny cache keeps and decides the states the scripts report in these
/// units, so that its lower bound of a band's state is never above what
/// the server holds (in nanoseconds it would count a little more used time
/// per unit, and deny a requirement the server admits).
pub(super) fn counted(bands: &[Quota]) -> arrayvec::ArrayVec<Quota, { crate::storage::MAX_BANDS }> {
    bands
        .iter()
        .take(crate::storage::MAX_BANDS)
        .map(|quota| {
            if quota.is_unlimited() {
                return *quota;
            }
            let us = quota
                .emission_interval_nanos()
                .div_ceil(1_000)
                .clamp(1, MAX_SPAN_US);
            Quota::per_period(1, std::time::Duration::from_micros(us))
                .with_burst(quota.burst())
                .in_unit(quota.unit())
        })
        .collect()
}

/// A script and how this server takes it.
pub(super) struct Script {
    source: &'static str,
    sha: Box<str>,
    /// The server refused `EVALSHA`: send the script with every call.
    eval_only: AtomicBool,
}

/// What a script call sends after `EVAL[SHA] script|sha`.
pub(super) trait CallArgs {
    /// The number of keys.
    fn key_count(&self) -> usize;
    /// Bytes the arguments take, roughly (to size the command buffer).
    fn size(&self) -> usize;
    /// Appends `numkeys`, the keys and the other arguments.
    fn push(&self, cmd: &mut Cmd);
}

/// Keys and arguments of one decision.
pub(super) struct Args {
    pub(super) keys: SmallVec<[KeyBuf; 2]>,
    pub(super) mode: &'static str,
    pub(super) now: Option<u64>,
    pub(super) spans: SmallVec<[[u64; 3]; 2]>,
    /// For an [`Op::Each`] (mode `e`), per band: what it is asked for
    /// (`c`harge, re`q`uire, `f`orce, `r`efund; the span's increment is its
    /// units, one interval for a requirement) and its debt bound in
    /// microseconds; empty otherwise.
    pub(super) amounts: SmallVec<[(&'static str, u64); 2]>,
    /// Per forced band, the units its span's increment could not carry
    /// (capped at [`MAX_SPAN_US`]): forgiven besides what the script reports.
    cut: SmallVec<[u32; 2]>,
}

impl Args {
    /// `op` on every band of `key`; `now` in microseconds (`None`: the
    /// server's `TIME`).
    pub(super) fn new(
        codec: &KeyCodec,
        key: StorageKey<'_>,
        bands: &[Quota],
        op: Op,
        now: Option<u64>,
    ) -> Self {
        let base = codec.base_key(key);
        let mut keys = SmallVec::new();
        for (quota, name) in bands.iter().zip(band_names(bands)) {
            let mut k = base.clone();
            push_band(&mut k, quota, name);
            keys.push(k);
        }
        let mode = match op.on_bands() {
            Op::Refund(_) => "r",
            Op::Each(_) => "e",
            _ => "c",
        };
        let mut spans = SmallVec::new();
        let mut amounts = SmallVec::new();
        let mut cut = SmallVec::new();
        for (i, quota) in bands.iter().enumerate() {
            let (amount, debt) = op.band(i);
            let (kind, units) = match amount {
                Amount::Charge(n) => ("c", n),
                Amount::Require => ("q", 1),
                Amount::Force(n) => ("f", n),
                Amount::Refund(n) => ("r", n),
            };
            if quota.is_unlimited() {
                spans.push([0, 0, 0]);
                amounts.push((kind, 0));
                continue;
            }
            let interval = quota
                .emission_interval_nanos()
                .div_ceil(1_000)
                .clamp(1, MAX_SPAN_US);
            let tolerance = interval.saturating_mul(u64::from(quota.burst())).min(MAX_SPAN_US);
            let increment = interval.saturating_mul(u64::from(units)).min(MAX_SPAN_US);
            if kind == "f" {
                cut.resize(i + 1, 0);
                cut[i] = units - u32::try_from(increment / interval).unwrap_or(units).min(units);
            }
            spans.push([interval, tolerance, increment]);
            amounts.push((kind, interval.saturating_mul(u64::from(debt)).min(MAX_SPAN_US)));
        }
        if mode != "e" {
            amounts.clear();
        }
        Args {
            keys,
            mode,
            now,
            spans,
            amounts,
            cut,
        }
    }

    /// The script's `decision`, with the units of forced bands their spans
    /// could not carry counted as forgiven (a refusal forced nothing).
    pub(super) fn complete(&self, mut decision: Decision) -> Decision {
        if decision.allowed {
            for (state, cut) in decision.bands.iter_mut().zip(&self.cut) {
                state.forgiven = state.forgiven.saturating_add(*cut);
            }
        }
        decision
    }

    fn key_bytes(&self) -> usize {
        self.keys.iter().map(|k| k.len()).sum()
    }

    /// `mode now spans...` (the script's `ARGV`).
    pub(super) fn push_argv(&self, cmd: &mut Cmd) {
        cmd.arg(self.mode);
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        for span in &self.spans {
            cmd.arg(span[0]).arg(span[1]).arg(span[2]);
        }
        for (kind, debt) in &self.amounts {
            cmd.arg(*kind).arg(*debt);
        }
    }
}

impl CallArgs for Args {
    fn key_count(&self) -> usize {
        self.keys.len()
    }

    fn size(&self) -> usize {
        self.key_bytes() + 24 + 60 * self.spans.len() + 24 * self.amounts.len()
    }

    fn push(&self, cmd: &mut Cmd) {
        cmd.arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(&key[..]);
        }
        self.push_argv(cmd);
    }
}

impl Script {
    pub(super) fn new(source: &'static str) -> Self {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().into(),
            eval_only: AtomicBool::new(false),
        }
    }

    /// One script call (`EVALSHA`, or `EVAL` where needed) for `attempt`;
    /// a failure names the step that failed.
    /// On a Cluster, `to` names the slot whose primary runs it (see
    /// [`Conn::query`]).
    pub(super) async fn call(
        &self,
        conn: &Conn,
        args: &impl CallArgs,
        attempt: Attempt,
        to: Option<u16>,
    ) -> Result<Value, (Attempt, RedisError)> {
        let failed = |step: Attempt| {
            move |(stage, error): (Stage, RedisError)| match stage {
                Stage::Connect => (Attempt::ConnectCluster, error),
                Stage::Command => (step, error),
            }
        };
        if !self.eval_only.load(Ordering::Relaxed) {
            match conn.query(self.command(args, true), to).await {
                Err((Stage::Command, e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    return conn
                        .query(self.command(args, false), to)
                        .await
                        .map_err(failed(Attempt::LoadScript));
                }
                Err((Stage::Command, e)) if refuses_evalsha(&e) => {
                    tracing::warn!("Redis refuses EVALSHA; sending the rate-limit script with every call");
                    self.eval_only.store(true, Ordering::Relaxed);
                }
                other => return other.map_err(failed(attempt)),
            }
        }
        conn.query(self.command(args, false), to)
            .await
            .map_err(failed(attempt))
    }

    fn command(&self, args: &impl CallArgs, by_sha: bool) -> Cmd {
        let size = if by_sha { 48 } else { self.source.len() + 8 } + args.size();
        let mut cmd = Cmd::with_capacity(5 + 4 * args.key_count(), size);
        if by_sha {
            cmd.arg("EVALSHA").arg(&*self.sha);
        } else {
            cmd.arg("EVAL").arg(self.source);
        }
        args.push(&mut cmd);
        cmd
    }
}

/// `EVALSHA` itself is refused: `ERR unknown command 'evalsha'` (renamed
/// away), or an ACL denying the command (not a key or a command the script
/// runs, which is a `NOPERM` too).
fn refuses_evalsha(e: &RedisError) -> bool {
    let detail = e.detail().map(str::to_ascii_lowercase).unwrap_or_default();
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => detail.contains("'evalsha' command"),
        ErrorKind::Server(ServerErrorKind::ResponseError) => detail.contains("unknown command 'evalsha'"),
        _ => false,
    }
}

/// The script's reply: `{allowed, now, (remaining, reset_after, retry_after)
/// per band}`, times in microseconds; for an [`Op::Each`] (mode `e`), then
/// the units forgiven per band.
///
/// `spans` are the bands' `[interval, tolerance, increment]` the call was
/// made with: the time until each band has one more unit, and its debt, are
/// counted from its interval and tolerance.
pub(super) fn decode(value: Value, spans: &[[u64; 3]]) -> Result<Decision, StorageError> {
    let bands = spans.len();
    let bad = bad_reply;
    let Value::Array(items) = value else {
        return Err(bad());
    };
    let each = items.len() == 2 + 4 * bands && bands > 0;
    if bands > super::super::MAX_BANDS || (items.len() != 2 + 3 * bands && !each) {
        return Err(bad());
    }
    let mut reply = [0i64; 2 + 4 * super::super::MAX_BANDS];
    for (slot, item) in reply.iter_mut().zip(items) {
        let Value::Int(i) = item else {
            return Err(bad());
        };
        *slot = i;
    }
    let mut states = BandStates::new();
    let forgiven = &reply[2 + 3 * bands..2 + 4 * bands];
    for ((band, span), &forgiven) in reply[2..2 + 3 * bands].chunks_exact(3).zip(spans).zip(forgiven) {
        let used = u64::try_from(band[1]).unwrap_or(0);
        states.push(BandState {
            remaining: if band[0] < 0 {
                u32::MAX
            } else {
                u32::try_from(band[0]).unwrap_or(u32::MAX)
            },
            reset_after_ns: micros_to_nanos(band[1]),
            retry_after_ns: micros_to_nanos(band[2]),
            more_after_ns: next_unit_in(used, span[0], span[1]).saturating_mul(1_000),
            debt_ns: used.saturating_sub(span[1]).saturating_mul(1_000),
            forgiven: if each {
                u32::try_from(forgiven).unwrap_or(0)
            } else {
                0
            },
        });
    }
    Ok(Decision::new(reply[0] == 1, micros_to_nanos(reply[1]), states))
}

/// The time until a band of `interval` and `tolerance` with `used` taken
/// has one more unit: for a band in debt (`used` beyond the tolerance),
/// until it has one unit again, as `gcra` reports it.
fn next_unit_in(used: u64, interval: u64, tolerance: u64) -> u64 {
    if used > tolerance && interval > 0 {
        return (used - tolerance).saturating_add(interval);
    }
    crate::gcra::next_unit_after(used, interval)
}

pub(super) fn bad_reply() -> StorageError {
    StorageError::new(
        StorageErrorKind::Other,
        "unexpected reply from the rate-limit script (another script under its SHA-1?)",
    )
}

fn micros_to_nanos(us: i64) -> u64 {
    u64::try_from(us).unwrap_or(0).saturating_mul(1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&i| Value::Int(i)).collect())
    }

    #[test]
    fn replies_decode() {
        let spans = [[1_000, 5_000, 1_000], [0, 0, 0]];
        let d = decode(ints(&[1, 1_700_000_000_000_000, 4, 1_500, 0, -1, 0, 0]), &spans).unwrap();
        assert!(d.allowed);
        assert_eq!(d.now, 1_700_000_000_000_000_000);
        assert_eq!(d.bands[0].remaining, 4);
        assert_eq!(d.bands[0].reset_after_ns, 1_500_000);
        // 1.5 ms used of 1 ms units: the next one is back in 0.5 ms
        assert_eq!(d.bands[0].more_after_ns, 500_000);
        assert_eq!(d.bands[1].remaining, u32::MAX);
        assert_eq!(d.bands[1].more_after_ns, 0);
        let d = decode(ints(&[0, 5, 0, 10, 7]), &spans[..1]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.bands[0].retry_after_ns, 7_000);
        assert_eq!(d.bands[0].more_after_ns, 10_000);
        assert!(decode(ints(&[1, 2, 3]), &spans[..1]).is_err());
        assert!(decode(Value::Nil, &spans[..1]).is_err());
        assert!(decode(Value::Array(vec![Value::Int(1), Value::Nil]), &[]).is_err());
    }

    #[test]
    fn a_band_in_debt_has_a_unit_after_its_debt_and_one_interval() {
        assert_eq!(next_unit_in(5, 2, 4), 3);
        assert_eq!(next_unit_in(3, 2, 4), 1);
        let d = decode(ints(&[1, 5, 0, 7_000, 0, 0]), &[[1_000, 5_000, 1_000]]).unwrap();
        assert_eq!(
            (d.bands[0].debt_ns, d.bands[0].more_after_ns),
            (2_000_000, 3_000_000)
        );
        let d = decode(ints(&[1, 5, 0, 5_000, 0, 4]), &[[1_000, 5_000, 1_000]]).unwrap();
        assert_eq!((d.bands[0].debt_ns, d.bands[0].forgiven), (0, 4));
    }

    #[test]
    fn evalsha_refusals_are_recognised() {
        let server = |kind, detail: &str| {
            RedisError::from((
                ErrorKind::Server(kind),
                "An error was signalled by the server",
                detail.to_owned(),
            ))
        };
        use ServerErrorKind::{NoPerm, ResponseError};
        assert!(refuses_evalsha(&server(
            ResponseError,
            "unknown command 'EVALSHA', with args beginning with:"
        )));
        assert!(refuses_evalsha(&server(
            NoPerm,
            "this user has no permissions to run the 'evalsha' command"
        )));
        // a command or key the script uses, denied: not a reason to stop
        // using EVALSHA
        assert!(!refuses_evalsha(&server(
            NoPerm,
            "this user has no permissions to run the 'set' command script: 0123"
        )));
        assert!(!refuses_evalsha(&server(
            ResponseError,
            "tower-rate-tier: bad script arguments"
        )));
    }

    #[test]
    fn arguments_name_bands_by_window_and_cap_spans() {
        let codec = KeyCodec::new("t", None).unwrap();
        let key = StorageKey {
            namespace: "",
            tier: "free",
            user: "u",
        };
        let bands = [Quota::per_day(10), Quota::unlimited()];
        let args = Args::new(&codec, key, &bands, Op::Refund(2), Some(7));
        assert_eq!(args.mode, "r");
        assert!(args.keys[0].ends_with(b"}:w86400000"));
        assert!(args.keys[1].ends_with(b"}:unlimited"));
        assert_eq!(args.spans[0], [8_640_000_000, 86_400_000_000, 17_280_000_000]);
        assert_eq!(args.spans[1], [0, 0, 0]);
        let peek = Args::new(&codec, key, &bands[..1], Op::Charge(0), None);
        assert_eq!((peek.mode, peek.spans[0][2], peek.now), ("c", 0, None));
        let huge = Args::new(
            &codec,
            key,
            &[Quota::per_day(1).with_burst(u32::MAX)],
            Op::Charge(u32::MAX),
            None,
        );
        assert_eq!(huge.spans[0][1..], [MAX_SPAN_US, MAX_SPAN_US]);
    }
}
