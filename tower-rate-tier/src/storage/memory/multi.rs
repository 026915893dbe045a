//! The memory storage's keys of several bands: each band's time under
//! its [stable name](crate::storage::band_names), all decided under the
//! key's one lock.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dashmap::mapref::entry::Entry;

use super::gc::KeylessRefund;
use super::scope::Scope;
use super::{FRESH, Inner, Tats};
use crate::clock::{Clock, Nanos};
use crate::quota::Quota;
use crate::storage::{BandName, Decision, MAX_BANDS, Op, StorageError};

/// The stored TATs of `bands`, by band name; `None` for a band without one.
pub(super) fn lookup(stored: &Tats, names: &[BandName]) -> [Option<Nanos>; MAX_BANDS] {
    let mut tats = [None; MAX_BANDS];
    for (tat, name) in tats.iter_mut().zip(names) {
        *tat = stored.iter().find(|(n, _)| n == name).map(|&(_, t)| t);
    }
    tats
}

/// Whether `stored` holds exactly the bands of `names`, in their order: the
/// usual case (a key decided by the same tier each time), whose times are
/// read and written by position, without a search by name.
fn same_layout(stored: &Tats, names: &[BandName]) -> bool {
    stored.len() == names.len() && stored.iter().zip(names).all(|((n, _), name)| n == name)
}

/// `tats` under `names`, a band at a fresh state kept as [`FRESH`] (the GC
/// removes the key once every band has expired).
pub(super) fn store(names: &[BandName], tats: &[Option<Nanos>]) -> Tats {
    names
        .iter()
        .zip(tats)
        .map(|(&n, tat)| (n, tat.unwrap_or(FRESH)))
        .collect()
}

/// The most band states one key keeps: the bands of its decisions, and
/// those of other decisions (another band set of the same user: a
/// contract's own unit bands, a program's record with the tier's) while
/// they are live.
const MAX_STORED: usize = 2 * MAX_BANDS;

/// Writes `tats` under `names` into `stored`, whose layout differs from
/// `names` (see [`same_layout`]): the bands of this decision, and the stored
/// bands of others whose times have not passed (so that one band set's
/// decision never wipes another's state), at most [`MAX_STORED`].
fn store_merged(stored: &mut Tats, names: &[BandName], tats: &[Option<Nanos>], now: Nanos) {
    let others = stored
        .iter()
        .filter(|(name, tat)| *tat > now && !names.contains(name))
        .copied();
    *stored = names
        .iter()
        .zip(tats)
        .map(|(&n, tat)| (n, tat.unwrap_or(FRESH)))
        .chain(others)
        .take(MAX_STORED)
        .collect();
}

/// `stored`, merged with a band a key kept in the scope's one-band map
/// (the key moves from there the first time a decision of several bands
/// meets it: a tier that gained a band or a unit keeps its request band's
/// state).
fn seeded(single: Option<(BandName, Nanos)>) -> Option<Tats> {
    single.map(|kept| Box::new([kept]) as Tats)
}

impl Inner {
    /// Bands under their names (a tier of several bands, or one band the
    /// scope's `single` map does not hold), all decided under the key's one
    /// lock.
    pub(super) fn decide_many(
        &self,
        scope: &Scope,
        user: &str,
        bands: &[Quota],
        op: Op,
        clock: &Arc<dyn Clock>,
        refund: KeylessRefund,
    ) -> Result<Decision, StorageError> {
        let mut names = [BandName::default(); MAX_BANDS];
        for (slot, name) in names.iter_mut().zip(crate::storage::band_names(bands)) {
            *slot = name;
        }
        let names = &names[..bands.len()];
        let n = bands.len();
        // The decision over the stored state (none for a new key), and the
        // state to keep (none when every band is fresh).
        let apply = |stored: Option<&Tats>, now: Nanos| {
            let mut tats = stored.map_or([None; MAX_BANDS], |s| lookup(s, names));
            let decision = crate::storage::decide_bands(&mut tats[..n], now, bands, op);
            let keep = tats[..n].iter().any(Option::is_some);
            (decision, keep.then(|| store(names, &tats[..n])))
        };
        if let Some(mut stored) = scope.multi.get_mut(user) {
            return self.decide_in(scope, user, &mut stored, bands, names, op, clock);
        }
        // A key of the one-band map whose band is one of these moves here
        // with its state. Read here without its lock, only to know whether
        // the decision writes anything and whether a new key needs room.
        let single_name = scope.single_name().filter(|name| names.contains(name));
        let single = single_name.and_then(|name| scope.single.get(user).map(|tat| (name, *tat)));
        let now = clock.now();
        let (decision, new) = apply(seeded(single).as_ref(), now);
        // Nothing to keep of a key that has no state: answered as it is. A
        // key with its state in the one-band map goes on (a refund may
        // leave it fresh: it then leaves that map).
        if new.is_none() && single.is_none() {
            if self.keyless_in_overflow(op, refund) {
                return Ok(self.decide_overflow(scope.key(user), bands, op, clock));
            }
            return Ok(decision);
        }
        // (room is taken before any lock: an inline sweep at the key cap
        // locks every shard in turn)
        let reserved = single.is_none();
        if reserved && !self.reserve_slot(now) {
            return Ok(self.decide_overflow(scope.key(user), bands, op, clock));
        }
        match scope.multi.entry(Box::from(user)) {
            Entry::Occupied(mut e) => {
                // made meanwhile: decided as any entry (which moves the
                // one-band map's key itself); the key reserved goes back
                if reserved {
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
                self.decide_in(scope, user, e.get_mut(), bands, names, op, clock)
            }
            Entry::Vacant(e) => {
                // Under this entry's lock the one-band state moves here
                // whole: taken out of its map, so that no one-band decision
                // charges it meanwhile, and no new one-band key is made
                // beside this one (see `Inner::insert_one`).
                let moved =
                    single_name.and_then(|name| scope.single.remove(user).map(|(_, tat)| (name, tat)));
                let now = clock.now();
                let (decision, new) = apply(seeded(moved).as_ref(), now);
                // The keys after, against those before and the room
                // reserved: the one-band key moved here, or left fresh (a
                // refund), or was swept meanwhile (and counted), or made
                // meanwhile.
                let keys = isize::from(new.is_some()) - isize::from(moved.is_some()) - isize::from(reserved);
                if keys > 0 {
                    self.len.fetch_add(keys.unsigned_abs(), Ordering::Relaxed);
                } else if keys < 0 {
                    self.len.fetch_sub(keys.unsigned_abs(), Ordering::Relaxed);
                }
                if let Some(new) = new {
                    e.insert(new);
                }
                Ok(decision)
            }
        }
    }

    /// Carries out `op` on `bands` (named `names`) in the user's entry
    /// `stored`, locked: by position when it holds exactly these bands,
    /// else by name. A band the entry lacks may still be in the one-band
    /// map (the key's first decisions were of it alone): its state moves
    /// here (that map's lock is only ever taken inside an entry's). Always
    /// `Ok`: its callers' answer, written in place.
    // Inlined into its two callers, the path of every decision of several
    // bands: as a call it cost a unit check 44 instructions more (1,489
    // against 1,445, callgrind).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decide_in(
        &self,
        scope: &Scope,
        user: &str,
        stored: &mut Tats,
        bands: &[Quota],
        names: &[BandName],
        op: Op,
        clock: &Arc<dyn Clock>,
    ) -> Result<Decision, StorageError> {
        let n = bands.len();
        let now = clock.now();
        // a band fresh again (a refund) is kept expired, for the GC
        if same_layout(stored, names) {
            let mut tats = [None; MAX_BANDS];
            for (tat, &(_, kept)) in tats.iter_mut().zip(stored.iter()) {
                *tat = Some(kept);
            }
            let decision = crate::storage::decide_bands(&mut tats[..n], now, bands, op);
            for ((_, kept), tat) in stored.iter_mut().zip(&tats) {
                *kept = tat.unwrap_or(FRESH);
            }
            return Ok(decision);
        }
        let mut tats = lookup(stored, names);
        // taken out of the one-band map at once, so that no one-band
        // decision charges it between this read and its removal
        let single = scope
            .single_name()
            .and_then(|name| names.iter().position(|n| *n == name))
            .filter(|&i| tats[i].is_none())
            .and_then(|i| scope.single.remove(user).map(|(_, tat)| (i, tat)));
        if let Some((i, tat)) = single {
            tats[i] = Some(tat);
            // one key now, where there were two
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        let decision = crate::storage::decide_bands(&mut tats[..n], now, bands, op);
        store_merged(stored, names, &tats[..n], now);
        Ok(decision)
    }
}
