//! The first bytes of a tunnel through a sandbox's egress proxy (threat model I26): the TLS
//! ClientHello whose server name the proxy checks, read as it arrives. However the bytes are
//! split, the reader reaches the same verdict as from all of them at once, never buffers more
//! than its bound, and never passes anything that does not start as a TLS handshake.
#![no_main]

use corral_egress::hello::{Hello, HelloReader, MAX_HELLO};
use libfuzzer_sys::fuzz_target;

mod chunks;

fn read(pieces: &[&[u8]]) -> (Option<Hello>, usize) {
    let mut reader = HelloReader::default();
    for piece in pieces {
        if let Some(verdict) = reader.push(piece) {
            return (Some(verdict), reader.bytes.len());
        }
    }
    (None, reader.bytes.len())
}

fuzz_target!(|data: &[u8]| {
    let (pieces, stream) = chunks::chunks(data);
    let (split, held) = read(&pieces);
    let (whole, _) = read(&[stream]);
    if split.is_none() {
        assert!(held <= MAX_HELLO);
    }
    if let Some(Hello::ServerName(_)) = &split {
        assert_eq!(stream.first(), Some(&0x16));
        // All at once, the same name (unless the bytes after it go past the bound).
        if stream.len() <= MAX_HELLO {
            assert_eq!(split, whole);
        }
    }
    if stream.first().is_some_and(|&b| b != 0x16) {
        assert!(matches!(split, Some(Hello::NotTls(_))));
    }
});
