//! Output of programs held for clients that do not read it (issue 31). A key may have 100
//! sandboxes x 32 programs x 4 output streams, and every stream used to hold its own bounded
//! queue of output and frames for its client but nothing bounded them together: one key
//! with 40 sessions of programs writing 3 MB each to unread streams took the server from
//! 21 MiB to 2.4 GiB. Every byte held for a client is now counted in a pool of output bytes
//! (corral-share: `max_output_bytes`, a per-key share, a floor every key keeps): past it
//! the output is dropped from the stream it was for (a `lost` line), never kept.
//!
//! The tests scale the budgets down through the config (4 MiB in all, 2 MiB a key: a key's
//! floor is 256 KiB, out of a reserve of 512 KiB), fill them with the unread streams of one or
//! two keys, and check the server's memory, the streams' `lost` lines, and that another key
//! still runs a program and reads all of its output at once.

use std::io::Read;
use std::net::TcpStream;

use super::streams::open_stream;
use super::*;

const BUDGET_CONFIG: &str = "max_output_bytes = 4194304\nmax_output_bytes_per_key = 2097152";
/// The most the pool holds: `max_output_bytes` and the floors' reserve (an eighth of it).
const CEILING_KIB: u64 = 4 * 1024 + 512;
/// What a stream costs the server besides its output, at most: its connection, its task,
/// hyper's state (about 110 KiB measured with the pool, 400 KiB without).
const STREAM_KIB: u64 = 160;
/// Sessions of each key that fills its budget, and programs in each (4 streams each).
const SESSIONS: usize = 2;
const PROGRAMS: usize = 16;

/// Opens `PROGRAMS` programs in each of `SESSIONS` sessions of `key`, each writing 12 MB at
/// once and then sleeping, each with 4 output streams (its start and 3 more) that nobody
/// reads: the open connections.
fn fill(s: &Server, key: &str) -> Vec<TcpStream> {
    let bearer = format!("Bearer {key}");
    let auth = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/json"),
    ];
    let mut held = Vec::new();
    for _ in 0..SESSIONS {
        let id = s.session(key, &json!({}));
        for p in 0..PROGRAMS {
            let body = json!({"cmd": "sh", "args": ["-c",
                "sleep 1; head -c 12000000 /dev/zero; exec sleep 600"], "tag": format!("w{p}")})
            .to_string();
            let path = format!("/v1/sandboxes/{id}/processes");
            held.push(open_stream(s, "POST", &path, &auth, body.as_bytes()).unwrap());
            let pid = *s.processes(key, &id).iter().max().unwrap();
            for _ in 0..3 {
                let path = format!("/v1/sandboxes/{id}/processes/{pid}/output");
                held.push(open_stream(s, "GET", &path, &auth[..1], b"").unwrap());
            }
        }
    }
    held
}

/// Reads an unread stream on until it says that output was dropped (`lost`), for at most
/// 20 s: whether it did.
fn says_lost(conn: &mut TcpStream) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    while Instant::now() < deadline {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if contains(&seen, b"\"type\":\"lost\"") {
            return true;
        }
        // Keep only a tail that may hold the start of the line.
        if seen.len() > 1 << 20 {
            seen.drain(..seen.len() - 64);
        }
    }
    false
}

/// Key `key` runs a program that writes 200 KB and reads its stream as it comes: all of
/// it, without a `lost` line, within 30 s.
fn reads_all_at_once(s: &Server, key: &str) {
    let id = s.session(key, &json!({}));
    let started = Instant::now();
    let (_, reader) = s.start_process(
        key,
        &id,
        &json!({"cmd": "sh", "args": ["-c", "head -c 200000 /dev/zero | tr '\\0' y"]}),
    );
    let mut out = 0usize;
    for line in std::io::BufRead::lines(reader) {
        let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
        match event["type"].as_str() {
            Some("stdout") => {
                out += base64::engine::general_purpose::STANDARD
                    .decode(event["data"].as_str().unwrap())
                    .unwrap()
                    .len()
            }
            Some("lost") => panic!("{key}'s own stream lost output: {event}"),
            Some("end") => break,
            _ => {}
        }
    }
    let took = started.elapsed();
    assert_eq!(out, 200_000, "{key} read {out} bytes of 200000");
    assert!(
        took < Duration::from_secs(30),
        "{key}'s program took {took:?}"
    );
    eprintln!("{key} ran a program and read its 200 KB in {took:?}");
}

/// Keys `fillers` fill their output budgets with unread streams; keys `readers` still run
/// programs and read them whole, and the server holds no more than the pool.
fn unread_output_stays_within_the_pool(fillers: &[&str], readers: &[&str]) {
    let _g = shared();
    let s = Server::start_with(2, BUDGET_CONFIG);
    s.wait_pool(2);
    let server = s.pid();
    let keys: HashMap<&str, String> = fillers
        .iter()
        .chain(readers)
        .map(|&k| (k, s.key(k)))
        .collect();
    let before = rss_kib(server);
    // The server's peak resident memory, sampled every 50 ms until `done`.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = thread::spawn({
        let done = done.clone();
        move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(server));
                thread::sleep(Duration::from_millis(50));
            }
            peak
        }
    });
    let mut held: Vec<TcpStream> = fillers.iter().flat_map(|k| fill(&s, &keys[k])).collect();
    // Every program writes its 12 MB.
    thread::sleep(Duration::from_secs(8));
    for key in readers {
        reads_all_at_once(&s, &keys[key]);
    }
    // A filler's streams say that their output was dropped.
    assert!(
        says_lost(&mut held[0]),
        "an unread stream did not say that output was dropped"
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    eprintln!(
        "{} unread streams of {fillers:?}: the server went from {before} KiB to a peak of \
         {peak} KiB",
        held.len()
    );
    // The pool, twice over for what the allocator keeps, and what the streams cost besides.
    let bound = before + 2 * CEILING_KIB + STREAM_KIB * held.len() as u64;
    assert!(
        peak < bound,
        "the server grew from {before} KiB to {peak} KiB (bound {bound} KiB) for {} unread \
         streams",
        held.len()
    );
    drop(held);
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn one_keys_unread_output_stays_within_its_share_and_another_key_reads_its_own() {
    unread_output_stays_within_the_pool(&["A"], &["B"]);
}

#[test]
fn two_keys_unread_output_stays_within_the_pool_and_a_third_reads_its_own() {
    unread_output_stays_within_the_pool(&["A", "B"], &["C"]);
}
