//! Frames from a session's process agent (threat model: the process agent), which runs inside
//! the sandbox: the host reassembles them however they are split and decodes each header.
//! Checks: the same frames (or the same first error) whatever the split, each payload within
//! the frame bound, and nothing held past one frame and one read.
#![no_main]

use corral_sandbox::agent::{FrameReader, Message, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

mod chunks;

/// Every frame of `pieces`, delivered one after another, up to the first error (`Err` with
/// how many frames came before it).
fn frames(pieces: &[&[u8]]) -> Result<Vec<(Message, Vec<u8>)>, usize> {
    let mut reader = FrameReader::default();
    let mut seen = Vec::new();
    for piece in pieces {
        reader.push(piece);
        loop {
            match reader.next_frame::<Message>() {
                Ok(Some(frame)) => {
                    assert!(frame.payload.len() <= MAX_FRAME);
                    seen.push((frame.header, frame.payload));
                }
                Ok(None) => break,
                // The host stops listening to an agent that breaks the protocol.
                Err(_) => return Err(seen.len()),
            }
        }
        assert!(reader.held() < 4 + MAX_FRAME);
    }
    Ok(seen)
}

fuzz_target!(|data: &[u8]| {
    let (pieces, stream) = chunks::chunks(data);
    let split = frames(&pieces);
    let whole = frames(&[stream]);
    match (&split, &whole) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("the split decides: {split:?} against {whole:?}"),
    }
});
