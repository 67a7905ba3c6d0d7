//! A running program's output streamed to a client (native `…/processes` streams, E2B
//! `process.Process/Start` and `Connect`) by an async task that waits for the program's
//! events without a thread: the agent's reader wakes it ([`Subscription::on_event`]).
//!
//! A stream lasts as long as its program or its client, and a key may hold 128 a sandbox
//! (32 programs, 4 subscribers each). Were each to keep a blocking thread while it waits,
//! as an execution's stream does, one key's streams of silent programs would take every
//! thread of tokio's blocking pool (512), which every key's uploads, creations, executions
//! and file calls share (hostile `multitenant::streams`).
//!
//! Bounds: the subscriber's queue ([`corral_kernel::agent::SUBSCRIBER_BYTES`]) and at most
//! [`BUFFER`] frames queued for the client; a client that reads nothing for
//! [`super::SLOW_CLIENT_LIMIT`] loses its stream, and one that goes away ends it at once.
//! Every output's bytes stay counted in its key's share of the server's output bytes
//! (`max_output_bytes`) from the queue until hyper has written its frame to the socket and
//! dropped it: the frame owns the units ([`Bytes::from_owner`]).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use corral_kernel::agent::{ProcessEvent, Subscription};
use corral_share::Grant;
use futures_util::StreamExt as _;
use tokio::sync::{mpsc, Notify};

/// Frames of one output stream queued for its client (an output frame is at most 32 KiB of
/// output, 44 KiB once in base64).
pub const BUFFER: usize = 8;

/// The client went away, or read nothing for [`super::SLOW_CLIENT_LIMIT`]: the stream ends.
#[derive(Debug)]
pub struct ClientGone;

/// A subscription and the client it is streamed to.
pub struct Pump {
    sub: Subscription,
    ready: Arc<Notify>,
    frames: mpsc::Sender<Bytes>,
    /// What the last event holds of the output bytes, handed on to the next frame sent.
    held: Mutex<Option<Grant>>,
}

/// A frame and the output bytes it holds, given back when hyper drops it.
struct Counted {
    frame: Bytes,
    _held: Grant,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.frame
    }
}

impl Pump {
    pub fn pid(&self) -> i32 {
        self.sub.pid()
    }

    /// The program's next event within `wait` (`None`: none came), without a thread.
    pub async fn next(&self, wait: Duration) -> Result<Option<ProcessEvent>, ClientGone> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // `notify_one` keeps a permit when nobody waits: an event that arrives between
            // this look and the wait below still wakes it.
            if let Some((event, held)) = self.sub.next_held(Duration::ZERO) {
                // Only this task touches the slot: it holds consistent state.
                *self.held.lock().unwrap_or_else(PoisonError::into_inner) = Some(held);
                return Ok(Some(event));
            }
            tokio::select! {
                woken = tokio::time::timeout_at(deadline, self.ready.notified()) => {
                    if woken.is_err() {
                        return Ok(None);
                    }
                }
                () = self.frames.closed() => return Err(ClientGone),
            }
        }
    }

    /// Queues a frame for the client; it holds the output bytes of the last event until it
    /// is written.
    pub async fn send(&self, frame: Bytes) -> Result<(), ClientGone> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let frame = match held {
            Some(held) if held.amount() > 0 => Bytes::from_owner(Counted { frame, _held: held }),
            _ => frame,
        };
        match tokio::time::timeout(super::SLOW_CLIENT_LIMIT, self.frames.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(ClientGone),
        }
    }
}

/// A streamed response of `content_type` whose frames `work` sends from `sub`'s events; the
/// subscription ends with `work` (when the program ends or the client goes).
pub fn stream<F, Fut>(content_type: &'static str, sub: Subscription, work: F) -> Response
where
    F: FnOnce(Pump) -> Fut,
    Fut: Future<Output = Result<(), ClientGone>> + Send + 'static,
{
    let ready = Arc::new(Notify::new());
    let wake = ready.clone();
    sub.on_event(move || wake.notify_one());
    let (frames, rx) = mpsc::channel::<Bytes>(BUFFER);
    let pump = Pump {
        sub,
        ready,
        frames,
        held: Mutex::new(None),
    };
    let done = work(pump);
    tokio::spawn(async move {
        let _ = done.await;
    });
    let body = Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>),
    );
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}
