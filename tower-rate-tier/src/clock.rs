//! Time sources.
//!
//! Every decision is made against an absolute time: nanoseconds since the Unix
//! epoch. Absolute time lets separate processes share one store, and lets the
//! `X-RateLimit-Reset` header name a wall-clock second.
//!
//! * [`SystemClock`] reads the wall clock once per process and advances it with
//!   the monotonic clock, so time never goes backwards inside a process even if
//!   the system clock is stepped.
//! * [`FakeClock`] is moved by hand, for tests; clones share one time.
//!
//! ```
//! use std::time::Duration;
//! use tower_rate_tier::clock::{Clock, FakeClock};
//!
//! let clock = FakeClock::new();
//! let other = clock.clone();
//! let before = clock.now();
//! other.advance(Duration::from_secs(2));
//! assert_eq!(clock.now() - before, 2_000_000_000);
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
pub type Nanos = u64;

/// A source of absolute time, in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time, in nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The process clock: wall-clock time, advanced monotonically.
///
/// The wall clock is read once per process; from then on time advances with a
/// monotonic clock ([`quanta`](https://docs.rs/quanta): the CPU's invariant
/// time-stamp counter where it has one, the OS monotonic clock otherwise), so
/// it never moves backwards within a process and costs a few nanoseconds to
/// read. All `SystemClock`s of a process share that anchor.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// A system clock.
    pub const fn new() -> Self {
        SystemClock
    }
}

struct Anchor {
    clock: quanta::Clock,
    start: u64,
    wall: Nanos,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Anchor { clock, start, wall }
    })
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        let anchor = anchor();
        let elapsed = anchor.clock.delta_as_nanos(anchor.start, anchor.clock.raw());
        anchor.wall.saturating_add(elapsed)
    }
}

/// A clock moved by hand, for tests. Clones share one time.
///
/// It starts at 2024-01-01T00:00:00Z (`1_704_067_200` Unix seconds), so
/// header values in tests are stable.
#[derive(Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// The time a [`FakeClock::new`] starts at, in Unix seconds.
    pub const START_UNIX_SECS: u64 = 1_704_067_200;

    /// A clock at [`FakeClock::START_UNIX_SECS`].
    pub fn new() -> Self {
        Self::at(Duration::from_secs(Self::START_UNIX_SECS))
    }

    /// A clock at `since_epoch` after the Unix epoch.
    pub fn at(since_epoch: Duration) -> Self {
        let clock = FakeClock {
            nanos: Arc::new(AtomicU64::new(0)),
        };
        clock.set(since_epoch);
        clock
    }

    /// Moves time forward (saturating at the end of `u64` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = duration_nanos(by);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_add(by)));
    }

    /// Moves time backward (saturating at the epoch), as a stepped system
    /// clock would.
    pub fn rewind(&self, by: Duration) {
        let by = duration_nanos(by);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(by)));
    }

    /// Sets the time to `since_epoch` after the Unix epoch.
    pub fn set(&self, since_epoch: Duration) {
        self.nanos.store(duration_nanos(since_epoch), Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.nanos.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock").field("nanos", &self.now()).finish()
    }
}

pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_monotonic_and_near_wall_time() {
        let c = SystemClock;
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert!(a.abs_diff(wall) < 5_000_000_000);
    }

    #[test]
    fn fake_clock_moves_both_ways_and_saturates() {
        let c = FakeClock::at(Duration::from_secs(10));
        c.advance(Duration::from_secs(5));
        assert_eq!(c.now(), 15_000_000_000);
        c.rewind(Duration::from_secs(20));
        assert_eq!(c.now(), 0);
        c.set(Duration::MAX);
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now(), u64::MAX);
    }
}
