//! The bound on response bytes a station holds for clients that have not read them yet
//! (issue 32, item 10).
//!
//! A body is whole in memory once computed (`/lm-head` for 64 rows of a 151,936-token vocab
//! is 38.9 MB) and stays so until the client reads it or the send timeout cuts the
//! connection. Without a bound, 40 clients that ask and never read held 1.5 GB. So every
//! body over [`UNBUDGETED`] bytes takes its size from one station-wide budget
//! (`--max-response-memory`) before it is sent and gives it back when the last byte has been
//! handed to the connection or the connection is dropped; when the budget is spent the
//! answer is `503 responses_busy` with `Retry-After` instead, and the body is freed at once.
//! Routes that know an answer's size before computing it (`/lm-head`, `/forward`) ask
//! [`ResponseBudget::room_for`] first, so a spent budget costs no compute either.
//! The body goes out in [`CHUNK`]-byte copies, so the whole buffer is freed as soon as the
//! last chunk is taken, not when the last chunk has crossed the socket.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default `--max-response-memory`: room for six 64-row Qwen2.5 `/lm-head` answers.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 256 << 20;
/// Bodies up to this size go out without taking from the budget (health, errors, one row
/// of logits of a small vocabulary); the connection bound caps what they can hold.
pub const UNBUDGETED: usize = 64 << 10;
/// Bytes handed to the connection at a time.
const CHUNK: usize = 256 << 10;
/// The budget counts in KiB (a semaphore's permits are `u32` per acquisition).
const UNIT: usize = 1 << 10;

/// The station-wide budget of response bytes not yet handed to the connections.
pub struct ResponseBudget {
    permits: Arc<Semaphore>,
    /// The budget, in [`UNIT`]s.
    units: usize,
    /// Bytes held now (a gauge for `/metrics`).
    held: Arc<AtomicUsize>,
}

impl ResponseBudget {
    /// A budget of `bytes` (at least one [`UNIT`]).
    pub fn new(bytes: usize) -> ResponseBudget {
        let units = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        ResponseBudget {
            permits: Arc::new(Semaphore::new(units)),
            units,
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.units * UNIT
    }

    /// Bytes taken by bodies not yet handed over.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether an answer of `bytes` would fit now: checked before computing one whose size
    /// is known, so a spent budget costs no compute (the hard bound is [`Self::hold`]).
    pub fn room_for(&self, bytes: usize) -> bool {
        bytes <= UNBUDGETED
            || self.permits.available_permits() >= bytes.div_ceil(UNIT).min(self.units)
    }

    /// `data` as a body holding its share of the budget until sent or dropped; `None` when
    /// the budget cannot take it now. A body larger than the whole budget takes all of it
    /// (so it is served alone rather than never).
    pub fn hold(&self, data: Bytes) -> Option<Held> {
        if data.len() <= UNBUDGETED {
            return Some(Held { data, share: None });
        }
        let units = data.len().div_ceil(UNIT).min(self.units);
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(u32::try_from(units).ok()?)
            .ok()?;
        self.held.fetch_add(data.len(), Ordering::Relaxed);
        Some(Held {
            share: Some(Share {
                _permit: permit,
                bytes: data.len(),
                held: self.held.clone(),
            }),
            data,
        })
    }
}

/// A body's share of the budget; given back on drop.
struct Share {
    _permit: OwnedSemaphorePermit,
    bytes: usize,
    held: Arc<AtomicUsize>,
}

impl Drop for Share {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A response body within the budget: sent in [`CHUNK`]-byte copies; the buffer and its
/// share go at the last chunk (or when the connection drops the body).
pub struct Held {
    data: Bytes,
    share: Option<Share>,
}

impl Held {
    /// An empty body.
    pub fn empty() -> Held {
        Held {
            data: Bytes::new(),
            share: None,
        }
    }
}

impl Body for Held {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let me = self.get_mut();
        if me.data.is_empty() {
            me.share = None;
            return Poll::Ready(None);
        }
        if me.share.is_none() {
            // Small and unbudgeted: the buffer itself.
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut me.data)))));
        }
        // Copies: a slice would keep the whole buffer alive until it crossed the socket.
        let n = me.data.len().min(CHUNK);
        let chunk = Bytes::copy_from_slice(&me.data[..n]);
        me.data.advance(n);
        if me.data.is_empty() {
            // The last piece is taken: the buffer goes, and with it the share.
            me.data = Bytes::new();
            me.share = None;
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn bodies_take_the_budget_until_sent_and_small_ones_are_free() {
        let b = ResponseBudget::new(1 << 20);
        let big = |n: usize| Bytes::from(vec![1u8; n]);
        let a = b.hold(big(600 << 10)).expect("fits");
        assert_eq!(b.held(), 600 << 10);
        assert!(b.hold(big(600 << 10)).is_none(), "over the budget");
        assert!(!b.room_for(600 << 10) && b.room_for(400 << 10) && b.room_for(1000));
        assert!(b.hold(big(1000)).is_some(), "a small body is not budgeted");
        let sent = a.collect().await.expect("body").to_bytes();
        assert_eq!(sent.len(), 600 << 10);
        assert!(sent.iter().all(|&x| x == 1));
        assert_eq!(b.held(), 0, "sent: the share is back");
        let c = b.hold(big(600 << 10)).expect("fits again");
        drop(c);
        // A body larger than the whole budget is served alone.
        let huge = b.hold(big(3 << 20)).expect("alone");
        assert!(b.hold(big(100 << 10)).is_none());
        drop(huge);
        assert!(b.hold(big(100 << 10)).is_some());
    }
}
