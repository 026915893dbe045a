//! [`ResponseBody`]: the body of a response that passed through the limiter,
//! the inner service's own body or the limiter's refusal.
//!
//! The limiter never needs to build the inner service's body type, so it
//! wraps services whose body it cannot construct (tonic's among them).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::meter::ContentMeter;
use crate::slot::SlotGuard;

pin_project! {
    /// The inner service's body, or the limiter's refusal (a JSON problem
    /// document).
    ///
    /// The body of a request that holds a slot of its tier's concurrency
    /// limit holds it until the body ends (its last frame is read, or it
    /// fails) or is dropped. The body of a request whose tier counts the
    /// unit `content-bytes` counts its data frames as they are read, and
    /// charges them when it ends or is dropped.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        held: Held,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Refusal { body: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody::holding(body, None, None)
    }

    /// The inner service's body, holding the request's slot and counting
    /// its content until it ends.
    pub(crate) fn holding(body: B, slot: Option<SlotGuard>, meter: Option<ContentMeter>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            held: Held { slot, meter },
        }
    }

    /// A refusal's body.
    pub fn refusal(body: Bytes) -> Self {
        let body = (!body.is_empty()).then_some(body);
        ResponseBody {
            kind: Kind::Refusal { body },
            held: Held::default(),
        }
    }

    /// Whether the limiter answered (the inner service was not called).
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Refusal { .. })
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = body.as_mut().poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(meter)) = (&frame, &mut this.held.meter) {
                    if let Some(data) = frame.data_ref() {
                        meter.count(data.len());
                    }
                }
                let ended = match &frame {
                    Poll::Ready(None | Some(Err(_))) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    Poll::Pending => false,
                };
                if ended {
                    // the response is over: its slot is given back, its
                    // content charged
                    this.held.slot.take();
                    this.held.meter.take();
                }
                frame
            }
            KindProj::Refusal { body } => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Refusal { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Refusal { body } => SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

/// What a body holds for the request until it ends: its slot, its content
/// meter.
#[derive(Debug, Default)]
struct Held {
    slot: Option<SlotGuard>,
    meter: Option<ContentMeter>,
}

/// Marks, in its extensions, a response the limiter answered itself for
/// want of quota (a 429, the 403 of a cost above the burst, a failed
/// storage's answer): a limiter further out gives its charge back (a
/// refused request consumes nothing anywhere) and leaves the refusal's own
/// headers alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal;

/// Marks, in its extensions, a response whose content the limiter wrote
/// though its request stays counted, in this limiter and those further out:
/// an answer for a reason that is not a quota (a client not identified, a
/// tier not configured, a body that could not be read: see [`answer`]),
/// and the 403 of a reservation no quota of its unit can hold. Like a
/// [`Refusal`]'s, its content is not counted as `content-bytes`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimiterContent;

/// A refusal of the limiter as the response of the service it wraps.
pub(crate) fn refusal<B>(response: Response<Bytes>) -> Response<ResponseBody<B>> {
    let mut response = response.map(ResponseBody::refusal);
    mark_refusal(&mut response);
    response
}

/// The limiter's answer for a reason that is not a quota, as the response
/// of the service it wraps: limiters further out count the request (an
/// outer per-address limit throttles unknown keys and unreadable bodies).
pub(crate) fn answer<B>(response: Response<Bytes>) -> Response<ResponseBody<B>> {
    let mut response = response.map(ResponseBody::refusal);
    mark_answer(&mut response);
    response
}

/// Marks `response` as a refusal of the limiter: the [`Refusal`] extension,
/// and `Cache-Control: no-store` unless it says otherwise (a refusal is
/// about one client at one moment; no cache may answer it to another).
pub(crate) fn mark_refusal<B>(response: &mut Response<B>) {
    response.extensions_mut().insert(Refusal);
    no_store(response);
}

/// Marks `response` as content of the limiter that leaves its request
/// counted: the [`LimiterContent`] extension, and `Cache-Control:
/// no-store` unless it says otherwise.
pub(crate) fn mark_answer<B>(response: &mut Response<B>) {
    response.extensions_mut().insert(LimiterContent);
    no_store(response);
}

fn no_store<B>(response: &mut Response<B>) {
    response
        .headers_mut()
        .entry(http::header::CACHE_CONTROL)
        .or_insert(http::HeaderValue::from_static("no-store"));
}
