//! The per-route costs a limiter has learned from the declarations it saw,
//! so that later requests to a route are charged in one storage operation.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use http::Method;
use smallvec::SmallVec;

use super::Source;

#[cfg(feature = "axum")]
pub(crate) type RouteKey = axum::extract::MatchedPath;
#[cfg(not(feature = "axum"))]
pub(crate) type RouteKey = std::convert::Infallible;

#[cfg(feature = "axum")]
fn route_str(key: &RouteKey) -> &str {
    key.as_str()
}
#[cfg(not(feature = "axum"))]
fn route_str(key: &RouteKey) -> &str {
    match *key {}
}

/// The per-route costs a limiter has learned, by `MatchedPath` and method.
type LearnedMap = HashMap<Arc<str>, SmallVec<[(Method, u32, Source, bool); 2]>, foldhash::fast::RandomState>;

#[derive(Default)]
pub(crate) struct Learned {
    map: RwLock<LearnedMap>,
}

const MAX_LEARNED_ROUTES: usize = 4096;

impl Learned {
    /// The learned cost, its source, and whether it is provisional (learned
    /// from a refused request, whose later declarations may not have run).
    pub(crate) fn get(&self, method: &Method, path: &RouteKey) -> Option<(u32, Source, bool)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let entries = map.get(route_str(path))?;
        entries
            .iter()
            .find(|(m, ..)| m == method)
            .map(|&(_, cost, source, provisional)| (cost, source, provisional))
    }

    pub(crate) fn set(&self, method: &Method, path: &RouteKey, cost: u32, source: Source, provisional: bool) {
        if self.get(method, path) == Some((cost, source, provisional)) {
            return;
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_LEARNED_ROUTES && !map.contains_key(route_str(path)) {
            return;
        }
        let entries = map.entry(Arc::from(route_str(path))).or_default();
        match entries.iter_mut().find(|(m, ..)| m == method) {
            Some(entry) => *entry = (method.clone(), cost, source, provisional),
            None => entries.push((method.clone(), cost, source, provisional)),
        }
    }
}

impl fmt::Debug for Learned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Learned").field("routes", &map.len()).finish()
    }
}
