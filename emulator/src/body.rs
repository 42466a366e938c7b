//! The response body type of the emulator: a complete buffer, or a channel of chunks (SSE).
//!
//! A channel body yields each chunk as soon as the producer sends it; hyper writes (and, with
//! TCP_NODELAY, sends) every chunk before polling for the next, so each SSE event leaves at once.
//! When the client goes away hyper drops the body, the receiver closes, and the producer's next
//! `send` fails: that is how a streaming generation learns it must stop.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// See the module documentation.
#[derive(Debug)]
pub enum EmuBody {
    Full(Option<Bytes>),
    Chan(mpsc::Receiver<Bytes>),
}

impl EmuBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        EmuBody::Full(Some(b.into()))
    }
}

impl Body for EmuBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            EmuBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            EmuBody::Chan(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, EmuBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            EmuBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            EmuBody::Full(None) => SizeHint::with_exact(0),
            EmuBody::Chan(_) => SizeHint::default(),
        }
    }
}
