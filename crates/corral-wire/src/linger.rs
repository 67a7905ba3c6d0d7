//! Requests answered before their body was read (refusals: no key, a path outside the
//! workspace, too large, an unknown route). hyper cannot carry another request on such a
//! connection and closes it; the bytes the client sent that nobody read then make the kernel
//! reset the connection, which can destroy the answer before the client reads it (Node's
//! `fetch` reports "fetch failed" instead of the refusal). So the rest of such a body is read
//! and dropped when it is small ([`LINGER_BYTES`]) and comes soon ([`LINGER_TIME`]), and the
//! connection goes on; otherwise the answer says `Connection: close`, so that a client never
//! sends its next request onto a connection that is closing.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Version};
use axum::response::Response;
use futures_util::StreamExt;
use http_body::{Frame, SizeHint};

/// The most of an unread body that is read (and dropped) after its answer.
pub const LINGER_BYTES: u64 = 64 * 1024;
/// How long the rest of an unread body may take to come.
pub const LINGER_TIME: Duration = Duration::from_secs(1);

/// A request's body, shared by the handler (through [`SharedBody`]) and the middleware:
/// `None` once it has been read to its end.
type Slot = Arc<Mutex<Option<Body>>>;

fn lock(slot: &Slot) -> MutexGuard<'_, Option<Body>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The body a handler reads.
struct SharedBody(Slot);

impl HttpBody for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut slot = lock(&self.0);
        let Some(body) = slot.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            *slot = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.0).as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        lock(&self.0)
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// Reads `body` to its end if it is at most [`LINGER_BYTES`] and ends within
/// [`LINGER_TIME`]; whether it did.
async fn drain(body: Body) -> bool {
    if body.size_hint().lower() > LINGER_BYTES {
        return false;
    }
    let mut data = body.into_data_stream();
    let read_all = async {
        let mut read = 0u64;
        while let Some(chunk) = data.next().await {
            let Ok(chunk) = chunk else { return false };
            read += chunk.len() as u64;
            if read > LINGER_BYTES {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(LINGER_TIME, read_all)
        .await
        .unwrap_or(false)
}

/// The middleware: a body its handler let go of unread is read to its end when that is cheap
/// (see the module's documentation); when it is not, or when the handler still holds a body
/// it has not read to its end (an answer that streams while it reads), the answer says
/// `Connection: close`.
pub async fn close_if_body_unread(req: Request, next: axum::middleware::Next) -> Response {
    if req.body().is_end_stream() || req.version() > Version::HTTP_11 {
        return next.run(req).await;
    }
    let slot: Slot = Arc::new(Mutex::new(None));
    let req = req.map(|body| {
        *lock(&slot) = Some(body);
        Body::new(SharedBody(slot.clone()))
    });
    let mut response = next.run(req).await;
    let unread = if Arc::strong_count(&slot) > 1 {
        lock(&slot).is_some()
    } else {
        let rest = lock(&slot).take();
        match rest {
            Some(body) => !drain(body).await,
            None => false,
        }
    };
    if unread {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(sizes: &[usize]) -> Body {
        let parts: Vec<Result<Bytes, std::io::Error>> = sizes
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b'x'; n])))
            .collect();
        Body::from_stream(futures_util::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_small_rest_is_read_and_a_large_one_is_not() {
        assert!(drain(Body::from("small")).await);
        assert!(drain(chunks(&[1024; 64])).await); // exactly LINGER_BYTES
        assert!(!drain(chunks(&[1024, 64 * 1024])).await); // over, streamed without a length
        assert!(!drain(Body::from(vec![0u8; LINGER_BYTES as usize + 1])).await);
        // its length says so
    }

    #[tokio::test]
    async fn a_rest_that_does_not_come_is_given_up() {
        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let started = std::time::Instant::now();
        assert!(!drain(never).await);
        assert!(started.elapsed() >= LINGER_TIME);
    }
}
