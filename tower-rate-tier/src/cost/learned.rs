//! The per-route costs a limiter has learned from the declarations it saw,
//! so that later requests to a route are charged in one storage operation.
//!
//! What a client controls must not grow this table: a route is axum's
//! `MatchedPath` (a pattern of the application's own, never the request's
//! path), and a method is learned only if it is one of the nine standard
//! ones. Axum routes no other method to a handler anyway (a method router's
//! layers also wrap its 405 fallback, so a declaration runs for any method
//! name a client sends); the limiter does not learn from 405 and 501
//! answers either (see `Charge::finish`). Requests with other methods are
//! priced afresh each time, as a route never seen. The table holds at most
//! [`MAX_LEARNED`] costs, and a lookup is one hash of the path under a read
//! lock and an index by method.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use http::Method;

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

/// The most (route, method) costs a limiter keeps.
const MAX_LEARNED: usize = 4096;

/// The standard methods, each with a slot of its own in a route's costs.
const METHODS: usize = 9;

/// The slot of a standard method; `None` for an extension method.
fn slot(method: &Method) -> Option<usize> {
    Some(match *method {
        Method::GET => 0,
        Method::POST => 1,
        Method::PUT => 2,
        Method::DELETE => 3,
        Method::HEAD => 4,
        Method::OPTIONS => 5,
        Method::PATCH => 6,
        Method::CONNECT => 7,
        Method::TRACE => 8,
        _ => return None,
    })
}

/// A learned cost: the cost, who declared it, and whether it is provisional
/// (learned from a refused request, whose later declarations may not have
/// run).
type Cost = (u32, Source, bool);

#[derive(Default)]
struct Table {
    routes: HashMap<Arc<str>, [Option<Cost>; METHODS], foldhash::fast::RandomState>,
    /// Costs held, over every route and method.
    len: usize,
}

#[derive(Default)]
pub(crate) struct Learned {
    table: RwLock<Table>,
}

impl Learned {
    /// The learned cost, its source, and whether it is provisional.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn get(&self, method: &Method, path: &RouteKey) -> Option<Cost> {
        self.get_str(method, route_str(path))
    }

    /// Learns a cost; an extension method, or a new cost past
    /// [`MAX_LEARNED`], is not kept.
    pub(crate) fn set(&self, method: &Method, path: &RouteKey, cost: u32, source: Source, provisional: bool) {
        self.set_str(method, route_str(path), (cost, source, provisional));
    }

    fn get_str(&self, method: &Method, path: &str) -> Option<Cost> {
        let slot = slot(method)?;
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        table.routes.get(path)?[slot]
    }

    fn set_str(&self, method: &Method, path: &str, new: Cost) {
        let Some(slot) = slot(method) else {
            return;
        };
        if self.get_str(method, path) == Some(new) {
            return;
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let Table { routes, len } = &mut *table;
        if let Some(costs) = routes.get_mut(path) {
            if costs[slot].is_none() {
                if *len >= MAX_LEARNED {
                    return;
                }
                *len += 1;
            }
            costs[slot] = Some(new);
            return;
        }
        if *len >= MAX_LEARNED {
            return;
        }
        let mut costs = [None; METHODS];
        costs[slot] = Some(new);
        routes.insert(Arc::from(path), costs);
        *len += 1;
    }
}

impl fmt::Debug for Learned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Learned")
            .field("routes", &table.routes.len())
            .field("costs", &table.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE: Cost = (5, Source::RouteLayer, false);

    #[test]
    fn only_standard_methods_are_learned() {
        let learned = Learned::default();
        learned.set_str(&Method::GET, "/search", FIVE);
        assert_eq!(learned.get_str(&Method::GET, "/search"), Some(FIVE));
        assert_eq!(learned.get_str(&Method::POST, "/search"), None);
        let brew = Method::from_bytes(b"BREW").unwrap();
        learned.set_str(&brew, "/search", FIVE);
        assert_eq!(learned.get_str(&brew, "/search"), None);
        // a learned cost is updated in place
        learned.set_str(&Method::GET, "/search", (1, Source::Default, false));
        assert_eq!(
            learned.get_str(&Method::GET, "/search"),
            Some((1, Source::Default, false))
        );
        assert_eq!(learned.table.read().unwrap().len, 1);
    }

    #[test]
    fn the_table_holds_at_most_max_learned_costs_over_routes_and_methods() {
        let learned = Learned::default();
        let methods = [Method::GET, Method::POST, Method::PUT, Method::DELETE];
        for i in 0..MAX_LEARNED {
            learned.set_str(&methods[i % 4], &format!("/r{}", i / 4), FIVE);
        }
        assert_eq!(learned.table.read().unwrap().len, MAX_LEARNED);
        // full: neither a new method of a known route nor a new route is kept
        learned.set_str(&Method::PATCH, "/r0", FIVE);
        learned.set_str(&Method::GET, "/new", FIVE);
        assert_eq!(learned.get_str(&Method::PATCH, "/r0"), None);
        assert_eq!(learned.get_str(&Method::GET, "/new"), None);
        // what is known can still change
        learned.set_str(&Method::GET, "/r0", (2, Source::Handler, false));
        assert_eq!(
            learned.get_str(&Method::GET, "/r0"),
            Some((2, Source::Handler, false))
        );
        assert_eq!(learned.table.read().unwrap().len, MAX_LEARNED);
    }
}
