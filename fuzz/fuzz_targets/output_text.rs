//! A sandbox's stdout and stderr (threat model I7), turned into text event by event: however
//! the bytes are split, the events must add up to the lossy UTF-8 decoding of all of them.
#![no_main]

use corral_kernel::event::Utf8Stream;
use libfuzzer_sys::fuzz_target;

mod chunks;

fuzz_target!(|data: &[u8]| {
    let (pieces, stream) = chunks::chunks(data);
    let mut utf8 = Utf8Stream::default();
    let mut text = String::new();
    for piece in pieces {
        text.push_str(&utf8.push(piece));
    }
    text.push_str(&utf8.flush());
    assert_eq!(text, String::from_utf8_lossy(stream));
});
