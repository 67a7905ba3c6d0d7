//! The Connect protocol's envelopes in a request body from an HTTP client (threat model I20):
//! every envelope decoded must be exactly the bytes that came in, re-encoded.
#![no_main]

use corral_server::connect::{encode, Decoder, FLAG_COMPRESSED};
use libfuzzer_sys::fuzz_target;

mod chunks;

const MAX_LEN: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let (pieces, stream) = chunks::chunks(data);
    let mut decoder = Decoder::new(MAX_LEN);
    let mut envelopes = Vec::new();
    let mut failed = false;
    for piece in pieces {
        if decoder.push(piece, &mut envelopes).is_err() {
            failed = true;
            break;
        }
    }
    let mut reencoded = Vec::new();
    for e in &envelopes {
        assert_eq!(
            e.flags & FLAG_COMPRESSED,
            0,
            "a compressed envelope was accepted"
        );
        assert!(
            e.payload.len() <= MAX_LEN,
            "an envelope over the limit was accepted"
        );
        reencoded.extend_from_slice(&encode(e.flags, &e.payload));
    }
    assert!(
        stream.starts_with(&reencoded),
        "decoded envelopes differ from the input"
    );
    if !failed {
        // Whatever did not decode is an unfinished envelope, which `finish` refuses.
        assert_eq!(decoder.finish().is_ok(), reencoded.len() == stream.len());
    }
});
