//! The request head a sandbox's program sends its egress proxy (threat model I26), parsed as it
//! arrives: however the bytes are split, a prefix of a complete head is never complete, the
//! whole is parsed alike, and a rewritten plain request is itself a complete head that ends in
//! `Connection: close`.
#![no_main]

use corral_egress::head::{self, Request, MAX_HEAD};
use libfuzzer_sys::fuzz_target;

mod chunks;

fuzz_target!(|data: &[u8]| {
    let (pieces, stream) = chunks::chunks(data);
    let whole = head::parse(stream);
    let mut seen = Vec::new();
    for piece in pieces {
        seen.extend_from_slice(piece);
        match head::parse(&seen) {
            Ok(None) => assert!(seen.len() < MAX_HEAD),
            Ok(Some((_, len))) => {
                // Complete as soon as the head is: the same request as from all the bytes.
                assert_eq!(
                    head::parse(stream).map(|r| r.map(|(_, l)| l)),
                    Ok(Some(len))
                );
                break;
            }
            Err(_) => break,
        }
    }
    if let Ok(Some((Request::Http { head, .. }, len))) = whole {
        assert!(len <= stream.len());
        assert!(head.ends_with(b"Connection: close\r\n\r\n"));
        assert!(matches!(head::parse(&head), Err(_) | Ok(Some(_))));
    }
});
