//! The configuration of a [`TierLimitLayer`](super::TierLimitLayer): what
//! its services read on every request. `layer.rs` builds it, `admit.rs`
//! decides with it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
#[cfg(feature = "buffered-body")]
use std::time::Duration;

use http::HeaderMap;
use http::request::Parts;

use crate::cost::Ledger;
use crate::identity::{ClientAddrs, TierIdentifier, TierIdentity};
use crate::policy::OnUnknownTier;

pub(crate) type HeadersFn = dyn Fn(&HeaderMap) -> Option<TierIdentity> + Send + Sync;
pub(crate) type PartsFn = dyn Fn(&Parts) -> Option<TierIdentity> + Send + Sync;
pub(crate) type CostFn = dyn Fn(&Parts) -> Option<u32> + Send + Sync;

#[derive(Clone)]
pub(crate) enum Identify {
    Nobody,
    Headers(Arc<HeadersFn>),
    Parts(Arc<PartsFn>),
    Async(Arc<dyn TierIdentifier>),
}

/// A layer's configuration: everything a
/// [`TierLimitService`](super::TierLimitService) needs, the per-request
/// charges sharing its [`Ledger`].
#[derive(Clone)]
pub(crate) struct LayerConfig {
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) identify: Identify,
    pub(crate) on_unknown_tier: OnUnknownTier,
    pub(crate) cost_fn: Option<Arc<CostFn>>,
    pub(crate) client_addrs: ClientAddrs,
    /// Set once this layer has warned that it keyed an anonymous client
    /// without an address (see `admit::unidentified`).
    pub(crate) warned_no_address: Arc<AtomicBool>,
    #[cfg(feature = "buffered-body")]
    pub(crate) body: BodyLimits,
    #[cfg(feature = "grpc")]
    pub(crate) grpc_retry_pushback: bool,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<Arc<crate::metrics::RequestCounters>>,
}

#[cfg(feature = "buffered-body")]
/// Body buffering limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyLimits {
    pub(crate) max: usize,
    pub(crate) timeout: Duration,
}

#[cfg(feature = "buffered-body")]
impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            max: 64 * 1024,
            timeout: Duration::from_secs(10),
        }
    }
}
