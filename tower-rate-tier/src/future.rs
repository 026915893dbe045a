//! The response future of [`TierLimitService`](crate::TierLimitService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use crate::cost::{Charge, Scope};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`TierLimitService`](crate::TierLimitService).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // Admitted: the inner service runs; headers are added on the way out.
        Inner { #[pin] future: F, charge: Option<Arc<Charge>> },
        // Refused: the inner service was never called.
        Refused { response: Option<Response<B>> },
        // The identifier or the storage waits.
        Boxed { future: BoxFuture<Result<Response<B>, E>> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(future: F, charge: Option<Arc<Charge>>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, charge },
        }
    }

    pub(crate) fn refuse(response: Response<B>) -> Self {
        ResponseFuture {
            kind: Kind::Refused {
                response: Some(response),
            },
        }
    }

    pub(crate) fn boxed(future: BoxFuture<Result<Response<B>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, charge } => {
                let polled = {
                    let _scope = Scope::enter(charge.as_ref());
                    future.poll(cx)
                };
                let mut response = ready!(polled)?;
                if let Some(charge) = charge.take() {
                    charge.finish(&mut response);
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled after completion.
                None => Poll::Pending,
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
