//! [`Head`]: what the limiter reads and writes of a request, split or not.

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request};

/// The parts of a request head the limiter reads and writes: [`Parts`], or a
/// whole [`Request`] read in place (no split, no move of the head).
pub(crate) trait Head {
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    fn method(&self) -> &Method;
    fn headers(&self) -> &HeaderMap;
    fn extensions(&self) -> &Extensions;
    fn extensions_mut(&mut self) -> &mut Extensions;
    /// The head as `Parts`, for the user's functions of `&Parts`.
    fn parts(&self) -> Option<&Parts>;
}

impl Head for Parts {
    fn method(&self) -> &Method {
        &self.method
    }
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    fn extensions(&self) -> &Extensions {
        &self.extensions
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }
    fn parts(&self) -> Option<&Parts> {
        Some(self)
    }
}

impl<B> Head for Request<B> {
    fn method(&self) -> &Method {
        self.method()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn extensions(&self) -> &Extensions {
        self.extensions()
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
    fn parts(&self) -> Option<&Parts> {
        None
    }
}
