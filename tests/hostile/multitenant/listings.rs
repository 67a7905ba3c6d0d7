//! Listings of a workspace the sandbox shaped to be as large as the entry bound allows: a
//! chain of 31 directories with 255-byte names (each path past it is 8 KiB long, beyond
//! `PATH_MAX`, made relative to each directory) holding 5,000 links with 255-byte names and
//! 4,000-byte targets and 4,000 empty files with 255-byte names. 9,031 entries are within the
//! 10,000 of a listing, but the paths and targets alone are some 90 MB, which the server would
//! hold (and encode as JSON, twice as much) for every call: native `files:list`, E2B `ListDir`
//! and a recursive watcher must be refused whole, the list of files (`GET …/files`) cut at
//! 8 MiB of paths as it is cut at 10,000 files, and the server's peak memory must stay within
//! 64 MiB of where it was.

use super::*;

/// The shaped tree, made in the sandbox's workspace.
const SHAPE: &str = r#"
import os
os.chdir("/workspace")
for i in range(31):
    name = ("d%02d" % i) + "x" * 252
    os.mkdir(name)
    os.chdir(name)
target = "/" + "t" * 3999
for i in range(5000):
    os.symlink(target, ("l%05d" % i) + "y" * 249)
for i in range(4000):
    open(("f%05d" % i) + "z" * 249, "w").close()
print("SHAPED")
"#;

/// The server's peak resident memory so far, in KiB.
fn peak_kib(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn listings_of_long_names_and_link_targets_are_bounded_in_bytes() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let key = s.key("A");
    let response = s
        .agent
        .post(&format!("{}/v2/sandboxes", s.url))
        .set("X-API-KEY", &key)
        .set("Content-Type", "application/json")
        .send_string(r#"{"templateID":"base"}"#)
        .unwrap_or_else(|e| panic!("E2B create: {e}\n{}", s.log_text()));
    let created: Value = response.into_json().unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let o = s.exec(&key, &id, SHAPE);
    assert_eq!(o.stdout(), "SHAPED\n", "{}", o.dump());
    let server = s.pid();
    let before = peak_kib(server);
    let mut found = Vec::new();

    let (status, answer) = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files:list?path=&depth=32"),
        &key,
        None,
    );
    if status != 400 {
        found.push(format!(
            "native files:list answered {status} ({} entries)",
            answer["entries"].as_array().map_or(0, Vec::len)
        ));
    }
    let plane = |path: &str, body: &str| {
        let response = s
            .agent
            .post(&format!("{}{path}", s.url))
            .set("E2b-Sandbox-Id", &id)
            .set("X-Access-Token", &token)
            .set("Content-Type", "application/json")
            .send_string(body);
        let response = match response {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{path}: {e}\n{}", s.log_text()),
        };
        let status = response.status();
        let text = response.into_string().unwrap_or_default();
        (status, text)
    };
    let (status, text) = plane(
        "/filesystem.Filesystem/ListDir",
        r#"{"path":"/home/user","depth":32}"#,
    );
    if status != 400 || !text.contains("invalid_argument") {
        found.push(format!(
            "E2B ListDir answered {status} ({} bytes)",
            text.len()
        ));
    }
    let (status, text) = plane(
        "/filesystem.Filesystem/CreateWatcher",
        r#"{"path":"/home/user","recursive":true}"#,
    );
    if status != 400 || !text.contains("invalid_argument") {
        found.push(format!(
            "a recursive watcher was made: {status} {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    let (status, listed) = s.call("GET", &format!("/v1/sandboxes/{id}/files"), &key, None);
    let files = listed["files"].as_array().cloned().unwrap_or_default();
    let bytes: usize = files
        .iter()
        .filter_map(|f| f["path"].as_str())
        .map(str::len)
        .sum();
    if status != 200 || files.is_empty() || files.len() >= 4000 || bytes > 8 << 20 {
        found.push(format!(
            "GET files answered {status}: {} files, {bytes} bytes of paths",
            files.len()
        ));
    }
    let after = peak_kib(server);
    if after > before + 64 * 1024 {
        found.push(format!(
            "the server's peak memory went from {before} KiB to {after} KiB"
        ));
    }
    // A listing of a reasonable part of the same tree still works.
    let (status, answer) = s.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files:list?path="),
        &key,
        None,
    );
    assert_eq!(status, 200, "{answer}");
    let host = s.stop();
    verdict("a listing was not bounded in bytes", &found, &host);
}
