//! The route layer [`tier_cost(n)`](fn@tier_cost).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::Source;
use super::charge::Charges;
use super::settlement::Settlement;
use crate::body::ResponseBody;

/// A route layer giving every request of the route a cost:
/// `.route("/export", get(export).layer(tier_cost(20)))`.
///
/// It needs a [`TierLimitLayer`](crate::TierLimitLayer) to run before it
/// (router-wide); without one, requests are refused with 500. See the
/// [module docs](crate::cost) for how the charge is kept exact.
pub fn tier_cost(cost: u32) -> TierCostLayer {
    TierCostLayer { cost }
}

/// The layer of [`tier_cost`](fn@tier_cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierCostLayer {
    cost: u32,
}

impl<S> Layer<S> for TierCostLayer {
    type Service = TierCostService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TierCostService {
            inner,
            cost: self.cost,
        }
    }
}

/// The service of [`tier_cost`](fn@tier_cost).
#[derive(Debug, Clone)]
pub struct TierCostService<S> {
    inner: S,
    cost: u32,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TierCostService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = TierCostFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let cost = self.cost;
        let state = match Settlement::of(req.extensions().get::<Charges>(), cost, Source::RouteLayer) {
            // A route whose cost the limiter learned: charged already.
            Settlement::Done => State::Inner {
                future: self.inner.call(req),
            },
            Settlement::NoLimiter(refusal) => State::Refused {
                response: Some(refusal),
            },
            settlement => {
                // The storage settles the difference first; the inner
                // service is called after, so take the one that was polled
                // ready and leave a clone.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                State::Settling {
                    future: Box::pin(async move {
                        match settlement.run(cost, Source::RouteLayer).await {
                            Ok(()) => inner.call(req).await.map(|r| r.map(ResponseBody::inner)),
                            Err(refusal) => Ok(crate::body::refusal(refusal)),
                        }
                    }),
                }
            }
        };
        TierCostFuture { state }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`TierCostService`].
    pub struct TierCostFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        // Settled without the storage: the inner service runs.
        Inner { #[pin] future: F },
        // Refused: the inner service was never called.
        Refused { response: Option<Response<Bytes>> },
        // The storage settles, then the inner service runs.
        Settling { future: BoxFuture<Result<Response<ResponseBody<B>>, E>> },
    }
}

impl<F, B, E> Future for TierCostFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => Poll::Ready(Ok(ready!(future.poll(cx))?.map(ResponseBody::inner))),
            StateProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(crate::body::refusal(response))),
                None => panic!("`TierCostFuture` polled after completion"),
            },
            StateProj::Settling { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for TierCostFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } => "Inner",
            State::Refused { .. } => "Refused",
            State::Settling { .. } => "Settling",
        };
        f.debug_tuple("TierCostFuture").field(&state).finish()
    }
}
