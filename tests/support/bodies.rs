//! Response bodies for tests of what holds a request open.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

/// A body that sends one chunk, then never ends: a stream the client keeps
/// open (an export, a long poll, a completion), holding its slot until it
/// is dropped.
#[derive(Debug, Default)]
pub struct Endless {
    sent: bool,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent {
            return Poll::Pending;
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first")))))
    }
}

/// A body of `frames` data frames, each the same shared chunk: gigabytes
/// sent without holding them.
#[derive(Debug)]
pub struct Repeated {
    /// The chunk each frame shares.
    pub chunk: Bytes,
    /// The frames still to send.
    pub frames: usize,
}

impl http_body::Body for Repeated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.frames == 0 {
            return Poll::Ready(None);
        }
        self.frames -= 1;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }
}
