//! The middleware: [`TierLimitLayer`] builds [`TierLimitService`], whose
//! [`ResponseFuture`] adds the rate-limit headers on the way out.
//!
//! * `config.rs`: what a layer's services read on every request;
//! * `layer.rs`: the layer, whose builder methods set that configuration;
//! * `admit.rs`: identification, the tier, the price, the decision, as
//!   functions of the configuration;
//! * `service.rs`: the service and the one serve path (admit, call the
//!   inner service, add the charge's headers);
//! * `future.rs`: the response future;
//! * `buffered.rs`: identification from a buffered body (feature
//!   `buffered-body`).

mod admit;
mod bill;
#[cfg(feature = "buffered-body")]
mod buffered;
mod config;
mod future;
mod head;
mod layer;
mod service;
#[cfg(test)]
mod tests;

#[cfg(feature = "buffered-body")]
pub use buffered::{BufferedTierLimitLayer, BufferedTierLimitService};
pub use future::ResponseFuture;
pub use layer::TierLimitLayer;
pub use service::TierLimitService;
