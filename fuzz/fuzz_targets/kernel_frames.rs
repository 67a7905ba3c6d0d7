//! Frames from an in-sandbox kernel (threat model I19): the host reassembles them, decodes
//! the JSON, and turns result bundles into events it serializes for clients.
#![no_main]

use corral_kernel::event::{rich_result, Event};
use corral_kernel::protocol::{Decoder, KernelMessage};
use libfuzzer_sys::fuzz_target;

mod chunks;

fuzz_target!(|data: &[u8]| {
    let (pieces, _) = chunks::chunks(data);
    let mut decoder = Decoder::new();
    for piece in pieces {
        decoder.push(piece);
        loop {
            match decoder.next_message() {
                Ok(Some(KernelMessage::Result {
                    is_main_result,
                    data,
                    ..
                })) => {
                    let event = Event::Result(rich_result(is_main_result, &data));
                    serde_json::to_vec(&event).expect("events serialize");
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                // An error ends the session: nothing more is read from this kernel.
                Err(_) => return,
            }
        }
    }
});
