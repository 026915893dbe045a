//! The response future of [`TierLimitService`](crate::TierLimitService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;
use crate::cost::Charge;
use crate::slot::SlotGuard;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`TierLimitService`](crate::TierLimitService)
    /// and [`BufferedTierLimitService`](crate::BufferedTierLimitService).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // Admitted at once: the inner service runs; headers are added on the
        // way out.
        // A request that holds a slot keeps it here until the inner service
        // answers, then in the body.
        Inner { #[pin] future: F, charge: Option<Arc<Charge>>, slot: Option<SlotGuard> },
        // Answered by the limiter (refused, or denied): the inner service
        // was never called; the response carries its mark.
        Refused { response: Option<Response<Bytes>> },
        // The identifier, the body or the storage waits: the whole serve
        // path runs in a task of its own.
        Boxed { future: BoxFuture<Result<Response<ResponseBody<B>>, E>> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(future: F, charge: Option<Arc<Charge>>, slot: Option<SlotGuard>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, charge, slot },
        }
    }

    /// The limiter's own answer, marked (see [`crate::body::mark_refusal`]
    /// and [`crate::body::mark_answer`]).
    pub(crate) fn answer(response: Response<Bytes>) -> Self {
        ResponseFuture {
            kind: Kind::Refused {
                response: Some(response),
            },
        }
    }

    pub(crate) fn boxed(future: BoxFuture<Result<Response<ResponseBody<B>>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

/// The inner service's response on its way out: the charge's headers
/// added, the request's slot handed to the body.
pub(crate) fn finish<B>(
    mut response: Response<B>,
    charge: Option<&Arc<Charge>>,
    slot: Option<SlotGuard>,
) -> Response<ResponseBody<B>> {
    let meter = charge.and_then(|charge| {
        // a gRPC answer that is a refusal of a reservation, for want of
        // quota (see `Charge::finish`)
        let grpc_for_quota = charge.finish(&mut response);
        let extensions = response.extensions();
        let refusal = extensions.get::<crate::body::Refusal>().is_some();
        if refusal && (response.status() == http::StatusCode::TOO_MANY_REQUESTS || grpc_for_quota) {
            // refused for want of quota: nothing the handler reserved is
            // consumed
            charge.give_back_unrecorded();
            return None;
        }
        if refusal || extensions.get::<crate::body::LimiterContent>().is_some() {
            // the limiter's own content counts nothing
            charge.refused_content();
            return None;
        }
        charge.content_meter()
    });
    response.map(|body| ResponseBody::holding(body, slot, meter))
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, charge, slot } => {
                let response = ready!(future.poll(cx));
                // the inner service failed: its slot is given back now
                let slot = slot.take();
                Poll::Ready(Ok(finish(response?, charge.take().as_ref(), slot)))
            }
            KindProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(ResponseBody::refusal))),
                None => panic!("`ResponseFuture` polled after completion"),
            },
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Refused { .. } => "Refused",
            Kind::Boxed { .. } => "Boxed",
        };
        f.debug_tuple("ResponseFuture").field(&kind).finish()
    }
}
