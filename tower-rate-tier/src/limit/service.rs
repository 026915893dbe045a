//! [`TierLimitService`]: the middleware service, and the path every request
//! takes through it: admit, call the inner service, add the charge's headers.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::admit::{self, Decided};
use super::admit::{Admission, Answer};
use super::bill::Bill;
use super::config::LayerConfig;
use super::future::{ResponseFuture, finish};
use super::head::Head;
use crate::body::ResponseBody;
use crate::identity::TierIdentity;
use crate::slot::{Acquiring, SlotGuard};

/// The service of [`TierLimitLayer`](crate::TierLimitLayer).
#[derive(Clone)]
pub struct TierLimitService<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<LayerConfig>,
}

impl<S> TierLimitService<S> {
    pub(crate) fn new(inner: S, config: Arc<LayerConfig>) -> Self {
        TierLimitService { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for TierLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierLimitService")
            .field("inner", &self.inner)
            .field("tiers", &self.config.ledger.tiers)
            .finish_non_exhaustive()
    }
}

/// Where a request that cannot be admitted at once resumes.
pub(crate) enum Start {
    /// The identifier waits.
    Identify,
    /// Identified (from a buffered body, say).
    #[cfg_attr(not(feature = "buffered-body"), allow(dead_code))]
    Identified(Option<TierIdentity>),
    /// Billed; the storage's answer is awaited.
    Decide(Bill, Acquiring),
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TierLimitService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if admit::reads_parts(&self.config) {
            let (mut parts, body) = req.into_parts();
            return match admit_now(&self.config, &mut parts) {
                Ok(admission) => self.pass_or_refuse(admission, Request::from_parts(parts, body)),
                Err(start) => self.resume(start, parts, body),
            };
        }
        // Only the headers and extensions are read: in place, without
        // splitting the request.
        let mut req = req;
        match admit_now(&self.config, &mut req) {
            Ok(admission) => self.pass_or_refuse(admission, req),
            Err(start) => {
                let (parts, body) = req.into_parts();
                self.resume(start, parts, body)
            }
        }
    }
}

/// Admits a request without waiting, or says where to resume when the
/// identifier or the storage must wait.
fn admit_now(config: &Arc<LayerConfig>, head: &mut impl Head) -> Result<Admission, Start> {
    let Some(identity) = admit::identify_now(config, head) else {
        return Err(Start::Identify);
    };
    let bill = match admit::bill(config, head, identity) {
        Ok(bill) => bill,
        Err(answered) => return Ok(answered),
    };
    match admit::decide(config, &bill) {
        Decided::Now(answer) => Ok(admit::admission(config, head, bill, answer)),
        Decided::Pending(pending) => Err(Start::Decide(bill, pending)),
    }
}

impl<S> TierLimitService<S> {
    /// Calls the inner service for an admitted request, or answers.
    #[inline]
    fn pass_or_refuse<ReqB, ResB>(
        &mut self,
        admission: Admission,
        req: Request<ReqB>,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        match admission {
            Admission::Pass(charge, slot) => ResponseFuture::inner(self.inner.call(req), charge, slot),
            Admission::Refuse(response) => {
                let mark = crate::body::mark_refusal;
                ResponseFuture::answer(limiter_answer(&self.config, req.headers(), response, mark))
            }
            Admission::Answer(response) => {
                let mark = crate::body::mark_answer;
                ResponseFuture::answer(limiter_answer(&self.config, req.headers(), response, mark))
            }
        }
    }

    /// Serves a request that waits, in a task of its own.
    pub(crate) fn resume<ReqB, ResB>(
        &mut self,
        start: Start,
        parts: Parts,
        body: ReqB,
    ) -> ResponseFuture<S::Future, ResB, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        ReqB: Send + 'static,
        ResB: Send + 'static,
    {
        // The inner service is called later: take the one that was polled
        // ready and leave a clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        ResponseFuture::boxed(Box::pin(serve(config, inner, start, parts, body)))
    }
}

/// The limiter's own answer to a request it does not pass, in the
/// request's protocol, with its `mark` (a refusal for want of quota, or an
/// answer limiters further out count).
#[cold]
fn limiter_answer(
    config: &LayerConfig,
    request: &http::HeaderMap,
    response: Response<bytes::Bytes>,
    mark: fn(&mut Response<bytes::Bytes>),
) -> Response<bytes::Bytes> {
    let mut answer = admit::answer(config, request, response);
    mark(&mut answer);
    answer
}

/// The serve path of a request that waits: identify, bill, decide, call the
/// inner service for an admitted request, add the charge's headers.
pub(crate) async fn serve<S, ReqB, ResB>(
    config: Arc<LayerConfig>,
    mut inner: S,
    start: Start,
    mut parts: Parts,
    body: ReqB,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    let bill = match start {
        Start::Decide(bill, pending) => Ok((bill, Some(pending))),
        Start::Identified(identity) => admit::bill(&config, &mut parts, identity).map(|bill| (bill, None)),
        Start::Identify => {
            let identity = admit::identify(&config, &parts).await;
            admit::bill(&config, &mut parts, identity).map(|bill| (bill, None))
        }
    };
    let admission = match bill {
        Ok((bill, pending)) => {
            let decided = match pending {
                Some(pending) => Decided::Pending(pending),
                None => admit::decide(&config, &bill),
            };
            match decided {
                Decided::Now(answer) => admit::admission(&config, &mut parts, bill, answer),
                // a slot taken after a wait is given back where it was
                // waited for (see `SlotGuard::waited_here`)
                Decided::Pending(pending) => {
                    match admit::admission(&config, &mut parts, bill, Answer::Storage(pending.await)) {
                        Admission::Pass(charge, slot) => {
                            Admission::Pass(charge, slot.map(SlotGuard::waited_here))
                        }
                        other => other,
                    }
                }
            }
        }
        Err(answered) => answered,
    };
    match admission {
        Admission::Pass(charge, slot) => {
            // a failure of the inner service drops the slot here
            let response = inner.call(Request::from_parts(parts, body)).await?;
            Ok(finish(response, charge.as_ref(), slot))
        }
        Admission::Refuse(response) => Ok(crate::body::refusal(admit::answer(
            &config,
            &parts.headers,
            response,
        ))),
        Admission::Answer(response) => Ok(crate::body::answer(admit::answer(
            &config,
            &parts.headers,
            response,
        ))),
    }
}
