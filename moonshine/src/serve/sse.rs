//! Server-sent events: one `data:` line per chunk, the body fed by the generation thread.

use super::*;

/// One server-sent event: `data: JSON\n\n`.
pub(super) fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A response body fed by the generation thread; dropping it (client gone) closes the
/// channel, which the thread sees at its next send.
pub(super) struct SseBody {
    pub(super) rx: mpsc::Receiver<Bytes>,
    pub(super) _cancel: CancelOnDrop,
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}
