//! Settling a route-level declaration against the charges of every
//! limiter a request passed.

use bytes::Bytes;
use http::Response;
use smallvec::SmallVec;

use super::Source;
use super::charge::Charges;
use crate::refusal::missing_limiter;

/// A route-level declaration of `declared` units, by `source`, against the
/// charges of every limiter the request passed.
pub(crate) enum Settlement {
    /// Every charge already matches: nothing to ask the storage.
    Done,
    /// No limiter ran before the declaration: the 500 to answer with.
    NoLimiter(Response<Bytes>),
    /// Some charge must be topped up or refunded: [`Settlement::run`].
    Storage(Charges, SmallVec<[Option<u32>; 2]>),
}

impl Settlement {
    /// Looks at every charge of the request.
    pub(crate) fn of(charges: Option<&Charges>, declared: u32, source: Source) -> Self {
        let Some(charges) = charges.filter(|c| !c.0.is_empty()) else {
            return Settlement::NoLimiter(missing_limiter(declared));
        };
        let pending: SmallVec<[Option<u32>; 2]> = charges
            .0
            .iter()
            .map(|c| c.as_ref().and_then(|c| c.note(declared, source)))
            .collect();
        if pending.iter().all(Option::is_none) {
            return Settlement::Done;
        }
        Settlement::Storage(charges.clone(), pending)
    }

    /// Settles every charge that needs it, in order; a refusal undoes the
    /// settlements already made.
    pub(crate) async fn run(self, declared: u32, source: Source) -> Result<(), Response<Bytes>> {
        let (charges, pending) = match self {
            Settlement::Done => return Ok(()),
            Settlement::NoLimiter(refusal) => return Err(refusal),
            Settlement::Storage(charges, pending) => (charges, pending),
        };
        for (i, (charge, charged)) in charges.0.iter().zip(&pending).enumerate() {
            let (Some(charge), Some(charged)) = (charge, *charged) else {
                continue;
            };
            if let Err(refusal) = charge.settle(charged, declared, source).await {
                for (earlier, was) in charges.0[..i].iter().zip(&pending) {
                    let Some(earlier) = earlier else { continue };
                    let now = earlier.lock().charged.total();
                    let was = was.unwrap_or(now);
                    if now > was {
                        earlier.give_back(now - was).await;
                    }
                }
                return Err(refusal);
            }
        }
        Ok(())
    }
}
