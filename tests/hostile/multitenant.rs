//! Multi-tenant attacks (issue 18): two tenants, A and B, each with an API key of its own,
//! share one real `corral serve`: its zygote, its warm pool, its host. Every test starts the
//! server on a loopback port with a database of its own and the shared image store (the
//! `default` image must be built, as for `crates/corral/tests/image.rs`), sends every request
//! with a key so that sessions belong to tenants, attacks across tenants, then stops the
//! server and checks that none of its processes and cgroups is left.
//!
//! Rootless, every sandbox runs as a host uid of its own from the caller's subordinate ids,
//! as it does as root; without subordinate ids the documented model (docs/threat-model.md §6)
//! is that all the caller's sandboxes share its uid and with it the per-uid kernel counters,
//! and the tests whose subject is exactly that (pipe buffers, host uids) check the weaker
//! property that holds there and that the sessions say so. inotify is counted per user
//! namespace as well, so it is held to isolation in every mode.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::*;
use crate::host::HostSecret;

mod agent_own;
mod control;
mod healing;
mod listings;
mod lockdown;
mod network_egress;
mod output_budget;
mod port_floods;
mod ports;
mod process_starts;
mod router_in_flight;
mod streams;
mod threads;
mod waiting;
mod watch_scans;

// ---- the server -----------------------------------------------------------------------------

/// A `corral serve` of this test. Dropping it kills it; [`Server::stop`] stops it and checks
/// what it leaves.
pub(crate) struct Server {
    child: Option<Child>,
    pub(crate) url: String,
    db: PathBuf,
    log: PathBuf,
    pub(crate) agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Server {
    /// Starts the server with a warm pool of `pool_size` sessions of the default image (0:
    /// every session is a sandbox of its own, no zygote) and waits until it answers.
    fn start(pool_size: usize) -> Server {
        Self::start_with(pool_size, "")
    }

    /// As [`Server::start`], with more lines of configuration.
    pub(crate) fn start_with(pool_size: usize, extra_config: &str) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("hx-mt-")
            .tempdir()
            .expect("tempdir");
        let port = free_port();
        let db = dir.path().join("keys.db");
        let log = dir.path().join("server.log");
        let config = dir.path().join("server.toml");
        fs::write(
            &config,
            format!(
                "pool_size = {pool_size}\ndefault_image = \"default\"\nshutdown_grace_s = 2\n\
                 {extra_config}\n"
            ),
        )
        .unwrap();
        // The image store is the one corral finds by itself (CORRAL_DATA_DIR, or the shared
        // /var/lib/corral); keys, sessions and the audit log go to this test's database.
        let child = spawn_corral(
            Command::new(corral_bin())
                .arg("serve")
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--db")
                .arg(&db)
                .arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap()),
        );
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build();
        let mut server = Server {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}"),
            db,
            log,
            agent,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server
            .agent
            .get(&format!("{}/healthz", server.url))
            .call()
            .is_err()
        {
            let exited = server.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "corral serve did not come up ({exited:?})\n{}",
                server.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub(crate) fn log_text(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        format!("--- corral serve stderr ---\n{}", tail(&text, 4000))
    }

    /// `corral key create --name NAME` on this server's database.
    pub(crate) fn key(&self, name: &str) -> String {
        let out = Command::new(corral_bin())
            .args(["key", "create", "--name", name, "--db"])
            .arg(&self.db)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "corral key create: {out:?}");
        let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(!key.is_empty(), "corral key create printed no key");
        key
    }

    /// (status, JSON body) of a request made with `key`.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let request = self
            .agent
            .request(method, &format!("{}{path}", self.url))
            .set("Accept", "application/json")
            .set("Authorization", &format!("Bearer {key}"));
        let response = match body {
            Some(b) => request
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => request.call(),
        };
        let response = match response {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}\n{}", self.log_text()),
        };
        let status = response.status();
        let mut bytes = Vec::new();
        response.into_reader().read_to_end(&mut bytes).unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Creates a session of `key` from `body`: its id, or the error answer.
    pub(crate) fn try_session(&self, key: &str, body: &Value) -> Result<String, (u16, Value)> {
        let (status, info) = self.call("POST", "/v1/sandboxes", key, Some(body));
        match (status, info["id"].as_str()) {
            (201, Some(id)) => Ok(id.to_string()),
            _ => Err((status, info)),
        }
    }

    pub(crate) fn session(&self, key: &str, body: &Value) -> String {
        self.try_session(key, body)
            .unwrap_or_else(|(status, answer)| {
                panic!(
                    "creating a session ({body}) failed: {status} {answer}\n{}",
                    self.log_text()
                )
            })
    }

    fn info(&self, key: &str, id: &str) -> Value {
        let (status, info) = self.call("GET", &format!("/v1/sandboxes/{id}"), key, None);
        assert_eq!(status, 200, "GET {id}: {info}");
        info
    }

    fn delete(&self, key: &str, id: &str) {
        let (status, answer) = self.call("DELETE", &format!("/v1/sandboxes/{id}"), key, None);
        assert_eq!(status, 204, "DELETE {id}: {answer}");
    }

    /// Executes `code` in session `id` of `key`; the folded result.
    pub(crate) fn exec(&self, key: &str, id: &str, code: &str) -> Outcome {
        let started = Instant::now();
        let body = json!({"code": code, "timeout_s": 60});
        let (status, result) = self.call(
            "POST",
            &format!("/v1/sandboxes/{id}/execute"),
            key,
            Some(&body),
        );
        assert_eq!(
            status,
            200,
            "executing in {id} failed: {result}\n{}",
            self.log_text()
        );
        outcome(result, started.elapsed())
    }

    /// Uploads `body` (streamed, chunked) to `path` in session `id` of `key`: (status, JSON
    /// body).
    fn upload(&self, key: &str, id: &str, path: &str, body: impl Read) -> (u16, Value) {
        let response = self
            .agent
            .put(&format!("{}/v1/sandboxes/{id}/files/{path}", self.url))
            .set("Accept", "application/json")
            .set("Authorization", &format!("Bearer {key}"))
            .send(body);
        let response = match response {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("PUT {path}: {e}\n{}", self.log_text()),
        };
        let status = response.status();
        (status, response.into_json().unwrap_or(Value::Null))
    }

    /// A one-shot run (`POST /v1/run`) of `key`.
    fn run(&self, key: &str, body: &Value) -> Outcome {
        let started = Instant::now();
        let (status, result) = self.call("POST", "/v1/run", key, Some(body));
        assert_eq!(status, 200, "POST /v1/run: {result}\n{}", self.log_text());
        outcome(result, started.elapsed())
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let text = self
            .agent
            .get(&format!("{}/metrics", self.url))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Waits until the warm pool holds `n` sessions; fails at once when the server says it
    /// cannot fork them.
    pub(crate) fn wait_pool(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.metric("corral_pool_ready").unwrap_or(0.0) >= n as f64 {
                return;
            }
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            assert!(
                !log.contains("not built"),
                "the `default` image is not built in the store corral finds (CORRAL_DATA_DIR={:?}, \
                 or /var/lib/corral): `corral image build default`\n{}",
                std::env::var_os("CORRAL_DATA_DIR"),
                self.log_text()
            );
            assert!(
                !log.contains("warm pool:") && !log.contains("no warm pool"),
                "the server cannot fork the sessions of its warm pool: no session can be made\n{}",
                self.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "the warm pool did not reach {n} sessions within 60 s\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then: the server exits cleanly, every process it had started is gone and so is
    /// every cgroup named after it. Returns what is not so.
    pub(crate) fn stop(mut self) -> Vec<String> {
        let pid = self.pid();
        let procs = descendants(pid);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "corral serve did not stop within 30 s of SIGTERM\n{}",
                    self.log_text()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        // What the server did not remove before it exited stays: nothing else removes a
        // cgroup but the next server's sweep, which may run at any time now (another test's
        // server starting), so this is looked at at once.
        let cgroups = cgroup_names_of(pid);
        let mut left = Vec::new();
        if !status.success() {
            left.push(format!("corral serve exited with {status:?}"));
        }
        if !cgroups.is_empty() {
            left.push(format!("the server left cgroups behind: {cgroups:?}"));
        }
        let gone = |procs: &[(i32, u64)]| procs.iter().all(|&(p, start)| !alive(p, start));
        if !wait_until(Duration::from_secs(10), || gone(&procs)) {
            let alive: Vec<_> = procs
                .iter()
                .filter(|&&(p, start)| alive(p, start))
                .map(|&(p, _)| (p, comm(p)))
                .collect();
            left.push(format!(
                "SANDBOX HOLE: processes outlived the server: {alive:?}"
            ));
        }
        left
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A folded result as the harness's [`Outcome`], for its assertions and dump.
fn outcome(result: Value, wall: Duration) -> Outcome {
    let o = Outcome {
        exit: None,
        raw_stdout: result.to_string(),
        raw_stderr: String::new(),
        json: Some(result),
        wall,
    };
    if std::env::var_os("HOSTILE_VERBOSE").is_some() {
        eprintln!("{}", o.dump());
    }
    o
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Whether `ok` became true within `limit`.
fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !ok() {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Fails with everything found: what the attack achieved, then what the server left on the
/// host after it was stopped.
fn verdict(what: &str, found: &[String], host: &[String]) {
    let mut message = String::new();
    if !found.is_empty() {
        message += &format!("{what}:\n  {}\n", found.join("\n  "));
    }
    if !host.is_empty() {
        message += &format!(
            "after the server stopped, the host is not as before:\n  {}\n",
            host.join("\n  ")
        );
    }
    assert!(message.is_empty(), "{message}");
}

/// A Python attack with the prelude and its parameters (`MT`, from JSON carried as hex, so
/// that no parameter is ever quoted into the code).
fn program(attack: &str, params: &Value) -> String {
    format!(
        "{PRELUDE}\nimport json as _mt_json\nMT = _mt_json.loads(bytes.fromhex('{}').decode())\n{attack}",
        hex(params.to_string().as_bytes())
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("/dev/urandom");
    buf
}

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

// ---- host-side process and cgroup views -------------------------------------------------------

/// (ppid, start time) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    Some((fields[1].parse().ok()?, fields[19].parse().ok()?))
}

fn alive(pid: i32, start: u64) -> bool {
    stat(pid).is_some_and(|(_, s)| s == start)
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Every process whose parent chain leads to `root` (not `root` itself), with its start time.
fn descendants(root: i32) -> Vec<(i32, u64)> {
    let mut parent = HashMap::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some(st) = stat(pid) {
            parent.insert(pid, st);
        }
    }
    let mut out = Vec::new();
    for (&pid, &(_, start)) in &parent {
        let mut p = pid;
        while let Some(&(pp, _)) = parent.get(&p) {
            if pp == root {
                out.push((pid, start));
                break;
            }
            if pp <= 1 {
                break;
            }
            p = pp;
        }
    }
    out
}

/// Cgroup directories of sandboxes created by process `pid` (named `<pid>-…`), on any
/// hierarchy.
fn cgroups_of(pid: i32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    let mut found = Vec::new();
    for base in fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for dir in [base.path().join("corral"), base.path()] {
            for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(entry.path());
                }
            }
        }
    }
    found
}

/// The distinct sandbox cgroup names of process `pid`.
fn cgroup_names_of(pid: i32) -> std::collections::BTreeSet<String> {
    cgroups_of(pid)
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// A `Key:` line of /proc/PID/status, split on whitespace.
fn status_field(pid: i32, key: &str) -> Vec<String> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

// ---- 1. secrets ------------------------------------------------------------------------------

/// A 24-byte slice of a secret and the 24 bytes that follow it there.
#[derive(Debug, Clone)]
struct Needle {
    what: String,
    slice: Vec<u8>,
    after: Vec<u8>,
}

impl Needle {
    fn at(what: &str, secret: &str, offset: usize) -> Needle {
        let b = secret.as_bytes();
        assert!(offset + 48 <= b.len(), "{what}: offset {offset} too late");
        Needle {
            what: format!("{what}[{offset}..]"),
            slice: b[offset..offset + 24].to_vec(),
            after: b[offset + 24..offset + 48].to_vec(),
        }
    }

    /// Whether bytes found after a hit are this secret's continuation (at least 8 of them:
    /// a hit at the very end of a region has fewer).
    fn continued_by(&self, found: &[u8]) -> bool {
        found.len() >= 8 && self.after.starts_with(found)
    }
}

/// Tenant A's secrets: a JWT-like token (~900 characters) and a PEM-like key (~3000), random
/// for every run.
struct Secrets {
    jwt: String,
    pem: String,
}

impl Secrets {
    fn new() -> Secrets {
        let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64url.encode(br#"{"alg":"RS256","typ":"JWT","kid":"tenant-a"}"#);
        let jwt = format!(
            "{header}.{}.{}",
            b64url.encode(random_bytes(500)),
            b64url.encode(random_bytes(128))
        );
        let body = base64::engine::general_purpose::STANDARD.encode(random_bytes(2190));
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            lines.join("\n")
        );
        Secrets { jwt, pem }
    }

    /// Three distinct slices of each secret, all in its random part.
    fn needles(&self) -> Vec<Needle> {
        let payload = self.jwt.find('.').unwrap() + 1;
        let signature = self.jwt.rfind('.').unwrap() + 1;
        let body = "-----BEGIN PRIVATE KEY-----\n".len();
        let pem_end = self.pem.len() - "\n-----END PRIVATE KEY-----\n".len();
        vec![
            Needle::at("A's JWT", &self.jwt, payload + 37),
            Needle::at("A's JWT", &self.jwt, payload + 333),
            Needle::at("A's JWT", &self.jwt, signature + 50),
            Needle::at("A's PEM", &self.pem, body + 101),
            Needle::at("A's PEM", &self.pem, (body + pem_end) / 2),
            Needle::at("A's PEM", &self.pem, pem_end - 120),
        ]
    }
}

/// Uses the secrets the way a program would; prints their lengths so the test knows they
/// arrived.
const USE_SECRETS: &str = r#"
import base64, hashlib, os
token = os.environ['TENANT_A_JWT']
key = os.environ['TENANT_A_PEM']
claims = base64.urlsafe_b64decode(token.split('.')[1] + '==')
fingerprint = hashlib.sha256(key.encode()).hexdigest()
cache = {'token': token, 'key': key.splitlines()[1:-1], 'claims': claims}
print('LENGTHS %d %d' % (len(token), len(key)))
"#;

/// What one scan of tenant B found.
fn check_scan(
    o: &Outcome,
    label: &str,
    a: &[Needle],
    canary: &Needle,
    own: Option<&Needle>,
    s: &Secrets,
    leaks: &mut Vec<String>,
) {
    assert!(
        o.has_line("START") && o.has_line("DONE"),
        "{label}: the scan did not run to its end\n{}",
        o.dump()
    );
    assert_eq!(o.status(), "success", "{label}\n{}", o.dump());
    let scanned: Vec<Vec<&str>> = o
        .values("SCANNED")
        .into_iter()
        .map(|v| v.split(' ').collect())
        .collect();
    let own_bytes: u64 = scanned
        .iter()
        .find(|f| f[0] == "self")
        .and_then(|f| f[1].parse().ok())
        .unwrap_or(0);
    assert!(
        own_bytes >= 8 << 20,
        "{label}: the scan read only {own_bytes} bytes of its own memory\n{}",
        o.dump()
    );
    // Reading another process's memory is a hole of its own.
    for l in o.lines().filter(|l| l.starts_with("ALLOWED ")) {
        leaks.push(format!("{label}: {l}"));
    }
    // Every hit: "<index> <address> <following bytes> <region>".
    let mut found_canary = false;
    let mut found_own = false;
    let mut copies: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for hit in o.values("HIT") {
        let f: Vec<&str> = hit.splitn(4, ' ').collect();
        let (Some(k), Some(after)) = (f.first().and_then(|k| k.parse::<usize>().ok()), f.get(2))
        else {
            panic!("{label}: malformed HIT line {hit:?}");
        };
        let after = unhex(after);
        if k < a.len() {
            if a[k].continued_by(&after) {
                let place = format!("{} {}", f.get(1).unwrap_or(&"?"), f.get(3).unwrap_or(&"?"));
                copies.entry(k).or_default().push(place);
            }
        } else if k == a.len() {
            found_canary |= canary.continued_by(&after);
        } else if own.is_some_and(|n| n.continued_by(&after)) {
            found_own = true;
        }
    }
    assert!(
        found_canary,
        "{label}: the scan did not find the session's own live canary: it does not really read \
         its heap\n{}",
        o.dump()
    );
    if own.is_some() {
        assert!(
            found_own,
            "{label}: the scan did not find the session's own environment secret\n{}",
            o.dump()
        );
    }
    for (k, places) in copies {
        leaks.push(format!(
            "{label}: {} is in its memory, followed by the rest of the secret, at {}",
            a[k].what,
            places.join(", ")
        ));
    }
    // Nothing of A's in B's environment, nor anywhere in what B printed.
    let keys = o.value("ENVKEYS");
    for name in ["TENANT_A_JWT", "TENANT_A_PEM"] {
        if keys.split(' ').any(|k| k == name) {
            leaks.push(format!(
                "{label}: A's variable {name} is in B's environment"
            ));
        }
    }
    let env = [unhex(o.value("ENVRAW")), unhex(o.value("PROCENV"))].concat();
    let text = format!("{}{}", o.stdout(), o.stderr());
    for n in a {
        if contains(&env, &n.slice) {
            leaks.push(format!("{label}: {} is in B's environment", n.what));
        }
        if contains(text.as_bytes(), &n.slice) {
            leaks.push(format!("{label}: {} is in B's output", n.what));
        }
    }
    for whole in [&s.jwt, &s.pem] {
        if text.contains(whole.as_str()) {
            leaks.push(format!("{label}: a whole secret of A's is in B's output"));
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Tenant A's sessions and one-shot runs hold secrets in their environment and use them; then
/// tenant B, in sessions from the warm pool (forked after A's) and freshly forked ones, and in
/// one-shot runs (one served from a fork of each of the pool's zygotes, one by a fresh
/// interpreter), reads all of its own memory looking for them. Sessions and Python one-shot
/// runs are forked from two pre-imported interpreters (the full zygote forks sessions and runs
/// that import the data stack, the lean one the other runs), which A's sessions and runs were
/// forked from too: nothing of them may reach B.
#[test]
fn secrets_do_not_cross_tenants() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let secrets = Secrets::new();
    let env = json!({"TENANT_A_JWT": secrets.jwt, "TENANT_A_PEM": secrets.pem});
    let lengths = format!("{} {}", secrets.jwt.len(), secrets.pem.len());

    // A: sessions with the secrets, used, some closed; a one-shot run with them too.
    let a_sessions: Vec<String> = (0..3)
        .map(|_| s.session(&key_a, &json!({ "env": env })))
        .collect();
    for id in &a_sessions {
        let o = s.exec(&key_a, id, &program(USE_SECRETS, &json!({})));
        assert_eq!(
            o.value("LENGTHS"),
            lengths,
            "A's secrets did not arrive\n{}",
            o.dump()
        );
    }
    for id in &a_sessions[..2] {
        s.delete(&key_a, id);
    }
    // One-shot runs forked from the full and from the lean zygote, as `/metrics` counts them.
    let forked_runs = || {
        ["full", "lean"].map(|z| {
            s.metric(&format!("corral_runs_forked_total{{zygote=\"{z}\"}}"))
                .unwrap_or(0.0)
        })
    };
    // A run that imports a module outside the standard library (IPython, which every full
    // zygote has imported) is forked from the full zygote; the others from the lean one.
    let from_full = |code: &str| format!("import IPython  # from the full zygote\n{code}");
    let o = s.run(
        &key_a,
        &json!({"code": program(USE_SECRETS, &json!({})), "env": env}),
    );
    assert_eq!(o.value("LENGTHS"), lengths, "{}", o.dump());
    // Python one-shot runs are served from forks where the run can have a cgroup (rootless
    // without one, by fresh interpreters).
    let forkable = !o.raw_stdout.contains("cgroups unavailable");
    let forked = |full: f64, lean: f64| {
        if forkable {
            [full, lean]
        } else {
            [0.0, 0.0]
        }
    };
    assert_eq!(
        forked_runs(),
        forked(0.0, 1.0),
        "A's run was forked from the lean zygote"
    );
    let o = s.run(
        &key_a,
        &json!({"code": from_full(&program(USE_SECRETS, &json!({}))), "env": env}),
    );
    assert_eq!(o.value("LENGTHS"), lengths, "{}", o.dump());
    assert_eq!(
        forked_runs(),
        forked(1.0, 1.0),
        "A's second run was forked from the full zygote"
    );
    // A takes the pool's sessions: the pool forks new ones, after A's secrets went through
    // the zygote.
    for _ in 0..2 {
        s.session(&key_a, &json!({}));
    }
    s.wait_pool(2);

    // B: two sessions from the pool, two forked for B alone, one one-shot run.
    let needles = secrets.needles();
    let canary_text = random_text(48);
    let canary = Needle::at("B's canary", &canary_text, 0);
    let own_secret = random_text(600);
    let own = Needle::at("B's own secret", &own_secret, 200);
    // The needles: A's six, then B's canary, then (for B's sessions with an environment of
    // their own) a slice of B's own secret.
    let mut params = json!({
        "needles": needles
            .iter()
            .chain([&canary])
            .map(|n| hex(&n.slice))
            .collect::<Vec<_>>(),
        "canary": hex(canary_text.as_bytes()),
    });
    let scan_plain = program(include_str!("attacks/mt_memscan.py"), &params);
    params["needles"]
        .as_array_mut()
        .unwrap()
        .push(json!(hex(&own.slice)));
    params["own"] = json!("TENANT_B_OWN");
    let scan_own = program(include_str!("attacks/mt_memscan.py"), &params);
    let own_env = json!({ "TENANT_B_OWN": own_secret });

    let mut leaks = Vec::new();
    let b_sessions = [
        ("B pooled session 1", json!({}), false),
        ("B pooled session 2", json!({}), false),
        (
            "B forked session (own limits)",
            json!({"limits": {"memory_mb": 700, "pids": 200}}),
            false,
        ),
        (
            "B pooled session (own env)",
            json!({ "env": own_env }),
            true,
        ),
    ];
    for (label, body, with_own) in &b_sessions {
        let id = s.session(&key_b, body);
        let code = if *with_own { &scan_own } else { &scan_plain };
        let o = s.exec(&key_b, &id, code);
        check_scan(
            &o,
            label,
            &needles,
            &canary,
            with_own.then_some(&own),
            &secrets,
            &mut leaks,
        );
    }
    let o = s.run(&key_b, &json!({"code": scan_own, "env": own_env}));
    assert_eq!(
        forked_runs(),
        forked(1.0, 2.0),
        "B's run was forked from the lean zygote"
    );
    check_scan(
        &o,
        "B one-shot run (forked from the lean zygote)",
        &needles,
        &canary,
        Some(&own),
        &secrets,
        &mut leaks,
    );
    let o = s.run(
        &key_b,
        &json!({"code": from_full(&scan_own), "env": own_env}),
    );
    assert_eq!(
        forked_runs(),
        forked(2.0, 2.0),
        "B's second run was forked from the full zygote"
    );
    check_scan(
        &o,
        "B one-shot run (forked from the full zygote)",
        &needles,
        &canary,
        Some(&own),
        &secrets,
        &mut leaks,
    );
    // A variable Python reads while it starts: this run gets a fresh interpreter.
    let cold_env = json!({ "TENANT_B_OWN": own_secret, "PYTHONDONTWRITEBYTECODE": "1" });
    let o = s.run(&key_b, &json!({"code": scan_own, "env": cold_env}));
    assert_eq!(
        forked_runs(),
        forked(2.0, 2.0),
        "B's third run: a fresh interpreter"
    );
    check_scan(
        &o,
        "B one-shot run (fresh interpreter)",
        &needles,
        &canary,
        Some(&own),
        &secrets,
        &mut leaks,
    );

    let host = s.stop();
    verdict(
        "SANDBOX HOLE: tenant A's secrets reached tenant B",
        &leaks,
        &host,
    );
}

/// `n` random characters of the base64url alphabet (secrets of B's own, and the canary).
fn random_text(n: usize) -> String {
    let b = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(n));
    b[..n].to_string()
}

// ---- 2. inotify ------------------------------------------------------------------------------

/// One step of `attacks/mt_inotify.py` in session `id`.
fn inotify_step(s: &Server, key: &str, id: &str, step: &str) -> Outcome {
    let code = program(
        include_str!("attacks/mt_inotify.py"),
        &json!({ "step": step }),
    );
    let o = s.exec(key, id, &code);
    o.assert_completed();
    o
}

/// inotify instances and watches are limited per user, counted at every level of user
/// namespaces up to the host's. Tenant A's session takes every instance it can get, then every
/// watch; tenant B's session, alive meanwhile, must still get an instance and add watches.
#[test]
fn inotify_exhaustion_is_per_session() {
    // The counters are the host's: no other sandbox may be alive meanwhile (rootless, they are
    // this test process's own).
    let _g = exclusive();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));

    let setup = inotify_step(&s, &key_b, &b, "setup");
    for what in ["SETUP-INIT", "SETUP-WATCH"] {
        assert_eq!(setup.value(what), "OK", "{}", setup.dump());
    }
    let before = inotify_step(&s, &key_b, &b, "probe");
    for what in ["PROBE-INIT", "PROBE-WATCH-NEW", "PROBE-WATCH-KEPT"] {
        assert_eq!(
            before.value(what),
            "OK",
            "B's probe fails before any attack\n{}",
            before.dump()
        );
    }

    // A: every instance it can open.
    let hog = inotify_step(&s, &key_a, &a, "hog-instances");
    let f: Vec<&str> = hog.value("INSTANCES").split(' ').collect();
    let held: usize = f[0].parse().unwrap();
    let nofile: usize = f[2].trim_start_matches("nofile=").parse().unwrap();
    let limits = fields(hog.value("LIMITS"));
    let max_instances: usize = limits["instances"].parse().unwrap_or(usize::MAX);
    if max_instances + 16 < nofile {
        assert!(
            f[1] == "EMFILE" && held + 16 < nofile,
            "A did not reach the inotify instance limit (it stopped after {held} with {}, \
             nofile {nofile}): the attack did not run as meant\n{}",
            f[1],
            hog.dump()
        );
    } else {
        eprintln!(
            "inotify_exhaustion_is_per_session: max_user_instances {max_instances} is beyond \
             what one session may open (nofile {nofile})"
        );
    }
    let during_instances = inotify_step(&s, &key_b, &b, "probe");

    // A: keeps 16 instances, adds every watch it can.
    let hog_watches = inotify_step(&s, &key_a, &a, "hog-watches");
    let watches = hog_watches.value("WATCHES").to_string();
    assert!(
        watches.split(' ').nth(1) == Some("ENOSPC"),
        "A did not reach the inotify watch limit ({watches}, {}; the attack stops after 40 s \
         or when the image has no more files): the attack did not run as meant\n{}",
        hog.value("LIMITS"),
        hog_watches.dump()
    );
    let during_watches = inotify_step(&s, &key_b, &b, "probe");

    s.delete(&key_a, &a);
    let after = inotify_step(&s, &key_b, &b, "probe");
    let mut host = s.stop();
    // The host: this process (rootless, the uid whose counters A filled) still gets instances.
    if let Err(e) = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::IN_CLOEXEC) {
        host.push(format!(
            "this process cannot create an inotify instance: {e}"
        ));
    }

    let mut starved = Vec::new();
    for what in ["PROBE-INIT", "PROBE-WATCH-NEW", "PROBE-WATCH-KEPT"] {
        let got = after.value(what);
        if got != "OK" {
            starved.push(format!(
                "once A's session is gone: B's {what} still fails with {got}"
            ));
        }
    }
    for (when, o) in [
        (format!("A holds {held} instances"), &during_instances),
        (
            format!(
                "A holds {} watches",
                watches.split(' ').next().unwrap_or("?")
            ),
            &during_watches,
        ),
    ] {
        for what in ["PROBE-INIT", "PROBE-WATCH-NEW", "PROBE-WATCH-KEPT"] {
            let got = o.value(what);
            if got != "OK" {
                starved.push(format!("while {when}: B's {what} failed with {got}"));
            }
        }
    }
    verdict(
        &format!(
            "SANDBOX HOLE: one tenant's session exhausts inotify for another's ({})",
            hog.value("LIMITS")
        ),
        &starved,
        &host,
    );
}

// ---- 3. pipe buffers -------------------------------------------------------------------------

/// `PROBE size=… grow=… grown=… holds=…` as a map.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Pipe buffers are accounted per user (`pipe-user-pages-soft`): once a user's pipes hold that
/// many pages, its new pipes get the minimum size and cannot grow. Tenant A's session grows
/// pipes until that happens; tenant B's session must still get full-size pipes.
#[test]
fn pipe_buffer_exhaustion_is_per_session() {
    let _g = exclusive();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    let step = |key: &str, id: &str, step: &str| {
        let code = program(
            include_str!("attacks/mt_pipes.py"),
            &json!({ "step": step }),
        );
        let o = s.exec(key, id, &code);
        o.assert_completed();
        o
    };

    let before = step(&key_b, &b, "probe");
    let hog = step(&key_a, &a, "hog");
    let limits = fields(hog.value("LIMITS"));
    let during = step(&key_b, &b, "probe");
    let b_warnings = warnings_of(&s.info(&key_b, &b)).unwrap_or_default();
    s.delete(&key_a, &a);
    let mut host = s.stop();
    // The host: a new pipe of this process (rootless, of the user whose pages A took) has its
    // full size again.
    let (r, w) = nix::unistd::pipe().unwrap();
    let host_size = nix::fcntl::fcntl(w.as_raw_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
    drop((r, w));
    if host_size != 65536 {
        host.push(format!(
            "a new pipe of this process holds {host_size} bytes"
        ));
    }

    let mut found = Vec::new();
    let probe = fields(during.value("PROBE"));
    let hogged = fields(hog.value("HOG"));
    let summary = format!(
        "A holds {} pipes, {} pages in all (soft limit {} pages); B's new pipe then: {probe:?}",
        hogged["pipes"], hogged["pages"], limits["soft"]
    );
    if limits["soft"] == "0" {
        eprintln!("pipe_buffer_exhaustion_is_per_session: no per-user pipe limit here (pipe-user-pages-soft is 0)");
    } else {
        // A's own new pipes come out minimal: its user is over the limit.
        assert_eq!(
            hogged["stop"],
            "new-pipes-shrunk",
            "A did not pass the per-user pipe buffer limit: the attack did not run as meant\n{}",
            hog.dump()
        );
        let before = fields(before.value("PROBE"));
        assert_eq!(
            (before["size"].as_str(), before["grow"].as_str()),
            ("65536", "OK"),
            "B's pipes are small before any attack: {before:?}"
        );
        if running_as_root() || has_subordinate_ids() {
            if probe["size"] != "65536" || probe["grow"] != "OK" {
                found.push(summary);
            }
        } else {
            // Rootless without subordinate ids, every sandbox is the caller's uid, whose
            // per-user counters they share (docs/threat-model.md §6): B's pipes may shrink,
            // but must still work, and B's session says so.
            eprintln!("pipe_buffer_exhaustion_is_per_session (rootless, one uid): {summary}");
            if probe["holds"].parse::<usize>().unwrap_or(0) < 4096 {
                found.push(format!("B's pipes do not work at all: {summary}"));
            }
            if !b_warnings.iter().any(|w| w.contains(CALLER_UID_WARNING)) {
                found.push(format!(
                    "B's session shares the caller's uid but does not say so: {b_warnings:?}"
                ));
            }
        }
    }
    verdict(
        "SANDBOX HOLE: one tenant's session shrinks another's pipes",
        &found,
        &host,
    );
}

// ---- 4. host uids ----------------------------------------------------------------------------

/// Host processes (below the server) one of whose threads is named `name`.
fn processes_named(server: i32, name: &str) -> Vec<i32> {
    descendants(server)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        })
        .collect()
}

fn host_uid(pid: i32) -> Option<u32> {
    let ids: Vec<u32> = status_field(pid, "Uid:")
        .iter()
        .filter_map(|u| u.parse().ok())
        .collect();
    (ids.len() == 4 && ids.iter().all(|&u| u == ids[0])).then(|| ids[0])
}

fn pid_namespace(pid: i32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// From the host, the kernels of live sessions (two tenants', pooled and freshly forked) run as
/// host uids of their own: no other process of the server's sandboxes holds one of them, none
/// is the caller's, and they have no supplementary group (as root, and rootless with
/// subordinate ids; rootless without, all of them are the caller's, as documented, and every
/// session says so).
#[test]
fn sessions_have_distinct_host_uids() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let tag = hex(&random_bytes(4));
    let sessions = [
        ("A pooled", &key_a, json!({})),
        ("B pooled", &key_b, json!({})),
        ("B forked", &key_b, json!({"limits": {"memory_mb": 700}})),
    ];
    let mut kernels = Vec::new();
    let mut unwarned = Vec::new();
    let mut groups = Vec::new();
    for (i, (label, key, body)) in sessions.iter().enumerate() {
        let id = s.session(key, body);
        let warnings = warnings_of(&s.info(key, &id)).unwrap_or_default();
        if !warnings.iter().any(|w| w.contains(CALLER_UID_WARNING)) {
            unwarned.push(format!("{label}: {warnings:?}"));
        }
        let name = format!("mtid{tag}{i}");
        let o = s.exec(
            key,
            &id,
            &program(
                include_str!("attacks/mt_identity.py"),
                &json!({ "name": name }),
            ),
        );
        o.assert_completed();
        assert_eq!(o.value("COMM"), name, "{}", o.dump());
        let pids = processes_named(s.pid(), &name);
        assert_eq!(
            pids.len(),
            1,
            "{label}: host processes named {name}: {pids:?}\n{}",
            o.dump()
        );
        let uid = host_uid(pids[0]).unwrap_or_else(|| panic!("{label}: uids of {}", pids[0]));
        groups.push((*label, status_field(pids[0], "Groups:")));
        kernels.push((
            *label,
            pids[0],
            uid,
            pid_namespace(pids[0]),
            o.value("IDS").to_string(),
        ));
    }
    let everyone: Vec<(i32, Option<u32>, Option<PathBuf>, String)> = descendants(s.pid())
        .into_iter()
        .map(|(p, _)| (p, host_uid(p), pid_namespace(p), comm(p)))
        .collect();
    let host = s.stop();

    let seen: Vec<String> = kernels
        .iter()
        .map(|(label, pid, uid, _, inside)| {
            format!("{label}: pid {pid}, host uid {uid} ({inside})")
        })
        .collect();
    let mut found = Vec::new();
    if running_as_root() || has_subordinate_ids() {
        // A kernel's sandbox is what shares its pid namespace (its init and its children);
        // no process of the server's outside it may hold its uid: not another session, not a
        // pooled one, not the zygote.
        let me = nix::unistd::getuid().as_raw();
        for (label, groups) in &groups {
            if !groups.is_empty() {
                found.push(format!("{label} has supplementary groups {groups:?}"));
            }
        }
        for (i, (label, _, uid, own_ns, _)) in kernels.iter().enumerate() {
            assert_ne!(*uid, 0, "{label} runs as host root");
            if *uid == me {
                found.push(format!("{label} runs as the caller's uid {me}"));
            }
            for (other, _, other_uid, _, _) in &kernels[i + 1..] {
                if uid == other_uid {
                    found.push(format!("{label} and {other} both run as host uid {uid}"));
                }
            }
            let outside: Vec<String> = everyone
                .iter()
                .filter(|(_, u, ns, _)| *u == Some(*uid) && own_ns.is_some() && ns != own_ns)
                .map(|(p, _, _, name)| format!("{p} ({name})"))
                .collect();
            if !outside.is_empty() {
                found.push(format!(
                    "{label}'s host uid {uid} is also held outside its sandbox by {}",
                    outside.join(", ")
                ));
            }
        }
        if unwarned.len() < kernels.len() {
            found.push(
                "sessions with host uids of their own warn that they run as the caller's".into(),
            );
        }
    } else {
        // Rootless without subordinate ids, every sandbox runs as the caller
        // (docs/threat-model.md §6), and says so.
        found.extend(
            unwarned
                .iter()
                .map(|w| format!("runs as the caller but does not say so: {w}")),
        );
        let me = nix::unistd::getuid().as_raw();
        for (label, _, uid, _, _) in &kernels {
            if *uid != me {
                found.push(format!(
                    "{label} runs as uid {uid}, not as the caller ({me})"
                ));
            }
        }
        eprintln!("sessions_have_distinct_host_uids (rootless: the caller's uid): {seen:#?}");
    }
    verdict(
        &format!("SANDBOX HOLE: sessions share host uids (kernels: {seen:?})"),
        &found,
        &host,
    );
}

// ---- 5. random state -------------------------------------------------------------------------

/// Sessions forked from one pre-imported interpreter start from a copy of its memory: their
/// random streams must still differ (reseeded in every child), and so should their str hash
/// seeds.
#[test]
fn sessions_differ_in_random_state() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let sessions = [
        ("A pooled", &key_a, json!({})),
        ("B pooled", &key_b, json!({})),
        ("B forked", &key_b, json!({"limits": {"memory_mb": 700}})),
    ];
    let state_of = |s: &Server, key: &str, body: &Value| -> Value {
        let id = s.session(key, body);
        let o = s.exec(
            key,
            &id,
            &program(include_str!("attacks/mt_random_state.py"), &json!({})),
        );
        o.assert_completed();
        serde_json::from_str(o.value("STATE")).unwrap()
    };
    let mut states = Vec::new();
    for (label, key, body) in &sessions {
        states.push((*label, state_of(&s, key, body)));
    }
    let mut host = s.stop();

    let mut same = Vec::new();
    for i in 0..states.len() {
        for j in i + 1..states.len() {
            let ((l1, s1), (l2, s2)) = (&states[i], &states[j]);
            for field in ["random", "random_bits", "urandom", "numpy", "numpy_bits"] {
                if !s1[field].is_null() && s1[field] == s2[field] {
                    same.push(format!("{l1} and {l2}: the same {field} {}", s1[field]));
                }
            }
            // Not asserted here: hash() of a str uses the interpreter's SipHash key, chosen once
            // when the interpreter starts and cached in every string of the zygote's heap, on
            // which every dict and set the zygote built depends, so a forked child cannot change
            // it. Sessions of one zygote share it (and the zygote's address-space layout); a new
            // zygote has a new one (docs/threat-model.md §7.1). A server without a warm pool
            // starts each session's interpreter fresh: there, below, it must differ.
        }
    }
    // `pool_size = 0`: every session is an interpreter of its own, with a hash key and an
    // address-space layout of its own, the choice docs/threat-model.md §7.1 offers operators.
    let s = Server::start(0);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let fresh = [
        ("A fresh", state_of(&s, &key_a, &json!({}))),
        ("B fresh", state_of(&s, &key_b, &json!({}))),
    ];
    let ((l1, s1), (l2, s2)) = (&fresh[0], &fresh[1]);
    for field in ["hash_x", "hash_bytes", "random", "urandom", "libc_printf"] {
        if s1[field] == s2[field] {
            same.push(format!("{l1} and {l2}: the same {field} {}", s1[field]));
        }
    }
    host.extend(s.stop());
    states.extend(fresh);
    let shown: Vec<String> = states.iter().map(|(l, st)| format!("{l}: {st}")).collect();
    verdict(
        &format!("sessions share random state (states: {})", shown.join("; ")),
        &same,
        &host,
    );
}

// ---- 6. limits -------------------------------------------------------------------------------

/// Every limit at the largest value the API accepts (`corral_sandbox::limits`, the bounds
/// of every front-end) gives a session that starts and runs code; one more is refused as a
/// bad request. The maxima promise far more memory than this host has, so the server's
/// memory budget is raised past them (by default such a session is refused: more than the
/// whole budget).
#[test]
fn session_limits_accept_the_api_maxima() {
    let _g = shared();
    let s = Server::start_with(1, "memory_budget_bytes = 1099511627776");
    s.wait_pool(1);
    let key = s.key("A");
    let cases = [
        ("disk_mb 1024", json!({"disk_mb": 1024})),
        ("disk_mb 65536 (maximum)", json!({"disk_mb": 65536})),
        ("memory_mb 65536 (maximum)", json!({"memory_mb": 65536})),
        ("timeout_s 86400 (maximum)", json!({"timeout_s": 86400})),
        ("cpus 64 (maximum)", json!({"cpus": 64})),
        ("pids 32768 (maximum)", json!({"pids": 32768})),
        (
            "every maximum at once",
            json!({"disk_mb": 65536, "memory_mb": 65536, "timeout_s": 86400, "cpus": 64, "pids": 32768}),
        ),
    ];
    let code = "print(1)\nimport os\nst = os.statvfs('/workspace')\nprint('DISK', st.f_blocks * st.f_frsize)";
    let mut failed = Vec::new();
    for (label, limits) in &cases {
        match s.try_session(&key, &json!({ "limits": limits })) {
            Err((status, answer)) => failed.push(format!("{label}: {status} {answer}")),
            Ok(id) => {
                let o = s.exec(&key, &id, code);
                let disk = limits["disk_mb"].as_u64().map(|mb| (mb << 20).to_string());
                if o.status() != "success" || !o.stdout().starts_with("1\n") {
                    failed.push(format!("{label}: print(1) gave {}", o.dump()));
                } else if disk.as_deref().is_some_and(|d| o.value("DISK") != d) {
                    failed.push(format!("{label}: /workspace has {} bytes", o.value("DISK")));
                }
                s.delete(&key, &id);
            }
        }
    }
    // One past each maximum is refused before any sandbox is made.
    for limits in [
        json!({"disk_mb": 65537}),
        json!({"memory_mb": 65537}),
        json!({"timeout_s": 86401}),
        json!({"cpus": 65}),
        json!({"pids": 32769}),
    ] {
        let (status, answer) = s.call(
            "POST",
            "/v1/sandboxes",
            &key,
            Some(&json!({ "limits": limits })),
        );
        assert_eq!(status, 400, "{limits}: {answer}");
    }
    let host = s.stop();
    verdict("sessions refuse limits the API accepts", &failed, &host);
}

// ---- 7. warnings -----------------------------------------------------------------------------

fn warnings_of(v: &Value) -> Option<Vec<String>> {
    v["warnings"]
        .as_array()?
        .iter()
        .map(|w| w.as_str().map(str::to_string))
        .collect()
}

/// Whether `w` (from a one-shot run) is reported among `session`'s warnings: the same
/// weakened protection, in whatever words.
fn reported(w: &str, session: &[String]) -> bool {
    let w = w.to_lowercase();
    let topic = ["rlimit", "landlock", "swap", "cgroup"]
        .into_iter()
        .find(|t| w.contains(t));
    session.iter().any(|s| match topic {
        Some(t) => s.to_lowercase().contains(t),
        None => s.to_lowercase() == w,
    })
}

/// A session reports the protections that are weaker than asked for as one-shot runs do: a
/// `warnings` array on the session's info (`GET /v1/sandboxes/{id}`) and on every folded
/// execution result. (Assumed shape: the one-shot result's `warnings`, an array of strings.)
#[test]
fn sessions_carry_warnings() {
    let _g = shared();
    let s = Server::start(1);
    s.wait_pool(1);
    let key = s.key("A");
    let oneshot = s.run(&key, &json!({"code": "print(1)"}));
    assert_eq!(oneshot.status(), "success", "{}", oneshot.dump());
    let expected = warnings_of(oneshot.j()).unwrap_or_else(|| {
        panic!(
            "the one-shot result has no warnings array\n{}",
            oneshot.dump()
        )
    });

    let before = cgroup_names_of(s.pid());
    let forked = s.session(&key, &json!({"limits": {"memory_mb": 700}}));
    let forked_has_cgroup = cgroup_names_of(s.pid()).len() > before.len();
    let pooled = s.session(&key, &json!({}));

    let mut missing = Vec::new();
    for (label, id) in [("forked session", &forked), ("pooled session", &pooled)] {
        let info = s.info(&key, id);
        let result = s.exec(&key, id, "print(1)");
        assert_eq!(result.stdout(), "1\n", "{}", result.dump());
        for (what, value) in [("info", &info), ("execution result", result.j())] {
            let Some(got) = warnings_of(value) else {
                missing.push(format!(
                    "{label}: its {what} has no `warnings` array: {value}"
                ));
                continue;
            };
            for w in &expected {
                if !reported(w, &got) {
                    missing.push(format!(
                        "{label}: its {what} does not report {w:?} (it has {got:?})"
                    ));
                }
            }
            if label == "forked session"
                && !forked_has_cgroup
                && !got.iter().any(|w| w.to_lowercase().contains("rlimit"))
            {
                missing.push(format!(
                    "{label}: it has no cgroup (memory and pids are rlimits only) but its {what} does not say so: {got:?}"
                ));
            }
        }
    }
    let host = s.stop();
    verdict(
        &format!(
            "sessions do not carry their sandbox's warnings (one-shot runs report {expected:?}; \
             the forked session {} a cgroup)",
            if forked_has_cgroup { "has" } else { "has no" }
        ),
        &missing,
        &host,
    );
}

// ---- uploads ----------------------------------------------------------------------------------

/// Uploads into a sandbox that prepared for them (issue 19 item 4, issue 20 item 4), in a
/// session forked from the zygote: a file over the sandbox's disk limit is refused with 507
/// and leaves nothing (no partial file, no temporary name, the existing file unchanged); a
/// link, FIFO or directory the sandbox planted at the target, or a linked directory on the
/// way, is refused and stays as it was; a target the sandbox keeps swapping for a link to a
/// host file never leads the upload out. Rootless on a cgroup v1 host there is no cgroup to
/// charge: the workspace's size bounds the upload all the same.
#[test]
fn uploads_that_do_not_fit_leave_nothing_and_never_follow_links() {
    let _g = shared();
    let secret = HostSecret::plant();
    let s = Server::start(1);
    s.wait_pool(1);
    let key = s.key("A");
    let id = s.session(&key, &json!({"limits": {"memory_mb": 512, "disk_mb": 16}}));
    let mut found = Vec::new();
    let (status, answer) = s.upload(&key, &id, "keep.txt", &b"original"[..]);
    assert_eq!(status, 201, "{answer}");
    let plant = format!(
        "import os\nos.symlink({0:?}, 'link')\nos.symlink({1:?}, 'dirlink')\n\
         os.mkfifo('fifo')\nos.mkdir('dir')\nprint('planted')",
        secret.path_str(),
        secret.dir_str()
    );
    let o = s.exec(&key, &id, &plant);
    assert_eq!(o.stdout(), "planted\n", "{}", o.dump());

    let over = std::io::repeat(b'u').take(20 << 20);
    let (status, answer) = s.upload(&key, &id, "keep.txt", over);
    if (status, answer["error"]["code"].as_str()) != (507, Some("insufficient_storage")) {
        found.push(format!("20 MiB into a 16 MiB workspace: {status} {answer}"));
    }
    for target in ["link", "fifo", "dir", "dirlink/new.txt"] {
        let (status, answer) = s.upload(&key, &id, target, &b"OVERWRITTEN"[..]);
        if status != 400 {
            found.push(format!(
                "an upload to {target} was not refused: {status} {answer}"
            ));
        }
    }
    let check = format!(
        "import os, stat\n\
         print(sorted(os.listdir('.')))\n\
         print(repr(open('keep.txt').read(64)), os.path.getsize('keep.txt'))\n\
         print(os.readlink('link') == {0:?}, stat.S_ISFIFO(os.lstat('fifo').st_mode), \
         os.path.isdir('dir'))",
        secret.path_str()
    );
    let o = s.exec(&key, &id, &check);
    let expected = "['dir', 'dirlink', 'fifo', 'keep.txt', 'link']\n'original' 8\nTrue True True\n";
    if o.stdout() != expected {
        found.push(format!(
            "the workspace after the refused uploads:\n{}",
            o.dump()
        ));
    }

    // The sandbox swaps `race` between nothing and a link to the host's file while uploads
    // to it go on.
    let racer = format!(
        "import subprocess, sys\n\
         code = 'import os\\nwhile True:\\n try: os.unlink(\"race\")\\n except OSError: pass\\n \
         try: os.symlink({0:?}, \"race\")\\n except OSError: pass\\n'\n\
         p = subprocess.Popen([sys.executable, '-c', code])\nprint(p.pid)",
        secret.path_str()
    );
    let o = s.exec(&key, &id, &racer);
    let racer_pid = o.stdout().trim().to_string();
    assert!(racer_pid.parse::<u32>().is_ok(), "{}", o.dump());
    for _ in 0..40 {
        let (status, answer) = s.upload(&key, &id, "race", &b"OVERWRITTEN"[..]);
        if status != 201 && status != 400 && status != 404 {
            found.push(format!(
                "an upload to the swapped target: {status} {answer}"
            ));
        }
    }
    let o = s.exec(
        &key,
        &id,
        &format!("import os, signal\nos.kill({racer_pid}, signal.SIGKILL)\nprint('stopped')"),
    );
    assert_eq!(o.stdout(), "stopped\n", "{}", o.dump());

    // Within the room left, it replaces the file, as the sandbox's own.
    let (status, answer) = s.upload(&key, &id, "keep.txt", &b"replaced"[..]);
    if status != 201 {
        found.push(format!("a fitting upload: {status} {answer}"));
    }
    let o = s.exec(
        &key,
        &id,
        "import os\nprint(repr(open('keep.txt').read(64)), os.stat('keep.txt').st_uid == os.getuid())",
    );
    if o.stdout() != "'replaced' True\n" {
        found.push(format!("the replaced file:\n{}", o.dump()));
    }
    secret.assert_unchanged();
    let host = s.stop();
    verdict("uploads escaped or left something behind", &found, &host);
}

/// The filesystem calls (`…/files:stat|list|mkdir|move|remove`, issue 22) against a sandbox
/// that planted links to a host directory and keeps swapping a name between a directory and
/// such a link while the calls go on: none of them reaches the host (the host directory is
/// exactly as planted), and none of another key's calls reaches the sandbox (404 each, as an
/// unknown sandbox, and the sandbox's files are as they were).
#[test]
fn filesystem_calls_never_follow_links_nor_cross_keys() {
    let _g = shared();
    let secret = HostSecret::plant();
    let s = Server::start(1);
    s.wait_pool(1);
    let (a, b) = (s.key("A"), s.key("B"));
    let id = s.session(&a, &json!({}));
    let mut found = Vec::new();
    let plant = format!(
        "import os\nos.symlink({0:?}, 'dirlink')\nos.symlink({1:?}, 'filelink')\n\
         os.mkdir('real')\nopen('real/a.txt', 'w').write('a')\nprint('planted')",
        secret.dir_str(),
        secret.path_str()
    );
    let o = s.exec(&a, &id, &plant);
    assert_eq!(o.stdout(), "planted\n", "{}", o.dump());
    let call = |method: &str, what: &str, body: Option<Value>| {
        s.call(
            method,
            &format!("/v1/sandboxes/{id}/{what}"),
            &a,
            body.as_ref(),
        )
    };
    let refused: [(&str, &str, Option<Value>); 7] = [
        ("GET", "files:list?path=dirlink", None),
        ("GET", "files:stat?path=dirlink/secret.txt", None),
        (
            "POST",
            "files:mkdir",
            Some(json!({"path": "dirlink/planted"})),
        ),
        (
            "POST",
            "files:move",
            Some(json!({"from": "real/a.txt", "to": "dirlink/a.txt"})),
        ),
        (
            "POST",
            "files:move",
            Some(json!({"from": "dirlink/secret.txt", "to": "stolen"})),
        ),
        (
            "POST",
            "files:remove",
            Some(json!({"path": "dirlink/secret.txt"})),
        ),
        ("GET", "files:list?path=&depth=32", None),
    ];
    for (i, (method, what, body)) in refused.into_iter().enumerate() {
        let (status, answer) = call(method, what, body);
        // The last one lists the workspace: the links are listed, never entered.
        let ok = if i == 6 {
            status == 200
                && answer["entries"].as_array().is_some_and(|e| {
                    e.iter()
                        .all(|e| !e["path"].as_str().unwrap_or("").starts_with("dirlink/"))
                })
        } else {
            status == 400 && answer["error"]["code"] == "invalid_path"
        };
        if !ok {
            found.push(format!("{method} {what}: {status} {answer}"));
        }
    }
    // A link is moved and removed as itself; the host file stays.
    let (status, answer) = call(
        "POST",
        "files:move",
        Some(json!({"from": "filelink", "to": "real/moved"})),
    );
    if status != 200 || answer["type"] != "symlink" {
        found.push(format!("moving a link: {status} {answer}"));
    }
    let (status, answer) = call("POST", "files:remove", Some(json!({"path": "real/moved"})));
    if status != 204 {
        found.push(format!("removing a link: {status} {answer}"));
    }

    // The sandbox swaps `race` between a directory and a link to the host directory while
    // the calls go on.
    let racer = format!(
        r#"import subprocess, sys
code = """
import os, shutil
while True:
    try: os.unlink("race")
    except OSError: shutil.rmtree("race", True)
    try: os.symlink({0:?}, "race")
    except OSError: pass
    try: os.unlink("race")
    except OSError: pass
    os.makedirs("race/sub", exist_ok=True)
"""
p = subprocess.Popen([sys.executable, "-c", code])
print(p.pid)
"#,
        secret.dir_str()
    );
    let o = s.exec(&a, &id, &racer);
    let racer_pid = o.stdout().trim().to_string();
    assert!(racer_pid.parse::<u32>().is_ok(), "{}", o.dump());
    for n in 0..30 {
        let (status, answer) = s.upload(&a, &id, &format!("real/m{n}.txt"), &b"m"[..]);
        assert_eq!(status, 201, "{answer}");
        let attempts: [(&str, String, Option<Value>); 5] = [
            (
                "POST",
                "files:mkdir".into(),
                Some(json!({"path": format!("race/made{n}")})),
            ),
            (
                "POST",
                "files:move".into(),
                Some(json!({"from": format!("real/m{n}.txt"), "to": format!("race/m{n}.txt")})),
            ),
            (
                "POST",
                "files:remove".into(),
                Some(json!({"path": "race/secret.txt"})),
            ),
            ("GET", "files:list?path=race&depth=2".into(), None),
            ("GET", "files:stat?path=race/secret.txt".into(), None),
        ];
        for (method, what, body) in attempts {
            let (status, answer) = call(method, &what, body);
            let entered = answer["entries"].as_array().is_some_and(|entries| {
                entries
                    .iter()
                    .any(|e| e["path"].as_str().unwrap_or("").ends_with("secret.txt"))
            });
            let stated = what.starts_with("files:stat") && status == 200;
            if status >= 500 || entered || stated || answer.to_string().contains(&secret.token) {
                found.push(format!(
                    "{method} {what} during the swaps: {status} {answer}"
                ));
            }
        }
    }
    let o = s.exec(
        &a,
        &id,
        &format!("import os, signal\nos.kill({racer_pid}, signal.SIGKILL)\nprint('stopped')"),
    );
    assert_eq!(o.stdout(), "stopped\n", "{}", o.dump());

    // Another key: every call is the 404 of an unknown sandbox, and changes nothing.
    let theirs: [(&str, &str, Option<Value>); 6] = [
        ("GET", "files:stat?path=real", None),
        ("GET", "files:list?path=&depth=4", None),
        ("POST", "files:mkdir", Some(json!({"path": "from-b"}))),
        (
            "POST",
            "files:move",
            Some(json!({"from": "real", "to": "taken-by-b"})),
        ),
        ("POST", "files:remove", Some(json!({"path": "real"}))),
        ("GET", "files:stat?path=", None),
    ];
    for (method, what, body) in theirs {
        let (status, answer) = s.call(
            method,
            &format!("/v1/sandboxes/{id}/{what}"),
            &b,
            body.as_ref(),
        );
        if status != 404 || answer.to_string().contains("real") {
            found.push(format!("key B: {method} {what}: {status} {answer}"));
        }
    }
    let o = s.exec(&a, &id, "import os\nprint(sorted(n for n in os.listdir('.') if n != 'race'), os.path.isfile('real/a.txt'))");
    if o.stdout() != "['dirlink', 'real'] True\n" {
        found.push(format!("A's workspace at the end:\n{}", o.dump()));
    }
    secret.assert_unchanged();
    let host = s.stop();
    verdict(
        "filesystem calls followed a link or crossed keys",
        &found,
        &host,
    );
}

// ---- 7. what a sandbox learns of the host's layout -----------------------------------------

/// The host paths a mount table inside a sandbox must not name: the data directory the server
/// keeps its compiled runtime and own images in, the shared image store (rootless, the server
/// reads images from both), each stored image's id, and the caller's home (rootless, its data
/// directory is below it).
fn host_layout_strings() -> Vec<String> {
    let data_dir = std::env::var_os("CORRAL_DATA_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_DATA_HOME")
                .filter(|v| !v.is_empty())
                .map(|x| PathBuf::from(x).join("corral"))
        })
        .unwrap_or_else(|| {
            if running_as_root() {
                PathBuf::from("/var/lib/corral")
            } else {
                PathBuf::from(std::env::var("HOME").unwrap()).join(".local/share/corral")
            }
        });
    let stores = [data_dir.clone(), PathBuf::from("/var/lib/corral")];
    let ids: Vec<String> = stores
        .iter()
        .filter_map(|store| fs::read_dir(store.join("images")).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.len() >= 16)
        .collect();
    assert!(!ids.is_empty(), "no stored image in {stores:?}");
    let mut strings: Vec<String> = stores
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    strings.extend(ids);
    if !running_as_root() {
        strings.extend(std::env::var("HOME").ok().filter(|h| h.len() > 1));
    }
    strings
}

/// No mount table a sandbox can read names where the host keeps its images: the image's
/// directories are overlays whose entries name only descriptors, for one-shot runs served
/// from forks, one-shot runs in fresh interpreters, pooled sessions and freshly forked ones.
#[test]
fn mount_tables_name_no_host_path() {
    let _g = exclusive();
    let s = Server::start(1);
    s.wait_pool(1);
    let key = s.key("A");
    let forbidden = host_layout_strings();
    let attack = program(include_str!("attacks/mt_mount_tables.py"), &json!({}));
    let mut seen = Vec::new();
    seen.push((
        "one-shot run (fork)",
        s.run(&key, &json!({ "code": attack })),
    ));
    // A variable read at the interpreter's start: served by a fresh interpreter.
    seen.push((
        "one-shot run (fresh interpreter)",
        s.run(
            &key,
            &json!({ "code": attack, "env": {"PYTHONDONTWRITEBYTECODE": "1"} }),
        ),
    ));
    let pooled = s.session(&key, &json!({}));
    seen.push(("pooled session", s.exec(&key, &pooled, &attack)));
    let forked = s.session(&key, &json!({"limits": {"memory_mb": 700}}));
    seen.push(("forked session", s.exec(&key, &forked, &attack)));

    let mut found = Vec::new();
    for (label, o) in &seen {
        o.assert_completed();
        let tables: BTreeMap<&str, String> = o
            .values("TABLE")
            .into_iter()
            .filter_map(|line| line.split_once(' '))
            .map(|(path, text)| (path, String::from_utf8_lossy(&unhex(text)).into_owned()))
            .collect();
        // The attack ran as meant: the sandbox's own table is readable and lists its mounts.
        let own = &tables["/proc/self/mountinfo"];
        assert!(
            own.contains(" /workspace ") && own.contains(" /usr "),
            "{label}: /proc/self/mountinfo is not the sandbox's mount table:\n{own}"
        );
        for (path, text) in &tables {
            for needle in &forbidden {
                if let Some(line) = text.lines().find(|l| l.contains(needle.as_str())) {
                    found.push(format!("{label}: {path} names {needle:?}: {line}"));
                }
            }
        }
    }
    let host = s.stop();
    verdict(
        "SANDBOX HOLE: a mount table shows the host's image store",
        &found,
        &host,
    );
}

// ---- processes and terminals (issue 22) ------------------------------------------------------

/// The resident memory of a process now, in KiB.
fn rss_kib(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

impl Server {
    /// Starts a program in session `id` of `key` (`POST …/processes`): its pid, from the
    /// stream's `start` line, and the stream, which the caller may read or leave unread.
    fn start_process(
        &self,
        key: &str,
        id: &str,
        body: &Value,
    ) -> (
        i64,
        std::io::BufReader<Box<dyn Read + Send + Sync + 'static>>,
    ) {
        let response = self
            .agent
            .post(&format!("{}/v1/sandboxes/{id}/processes", self.url))
            .set("Authorization", &format!("Bearer {key}"))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .unwrap_or_else(|e| panic!("starting {body}: {e}\n{}", self.log_text()));
        let mut reader = std::io::BufReader::new(response.into_reader());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
        let start: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(start["type"], "start", "{first}");
        // The rest of the stream stays with the caller, unread.
        (start["pid"].as_i64().unwrap(), reader)
    }

    /// Runs `sh -c script` through session `id`'s agent and reads its stream to the end: the
    /// program's stdout.
    fn agent_output(&self, key: &str, id: &str, script: &str) -> String {
        let (_, reader) =
            self.start_process(key, id, &json!({"cmd": "sh", "args": ["-c", script]}));
        let mut out = Vec::new();
        for line in std::io::BufRead::lines(reader) {
            let event: Value = serde_json::from_str(&line.unwrap()).unwrap();
            match event["type"].as_str() {
                Some("stdout") => out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(event["data"].as_str().unwrap())
                        .unwrap(),
                ),
                Some("end") => break,
                _ => {}
            }
        }
        String::from_utf8(out).unwrap()
    }

    fn processes(&self, key: &str, id: &str) -> Vec<i64> {
        let (status, list) = self.call("GET", &format!("/v1/sandboxes/{id}/processes"), key, None);
        assert_eq!(status, 200, "{list}");
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_i64().unwrap())
            .collect()
    }
}

/// A tenant cannot list, read, feed, resize or signal another tenant's processes, nor list,
/// create, restart, remove or run code in its code contexts, through the API or from inside
/// its own sandbox; the attacked process and context run on, unchanged.
#[test]
fn processes_do_not_cross_tenants() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    let (pid, _stream) = s.start_process(
        &key_a,
        &a,
        &json!({"cmd": "sleep", "args": ["300"], "stdin": true, "tag": "victim"}),
    );
    let base = format!("/v1/sandboxes/{a}/processes");
    let attempts: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", base.clone(), None),
        ("POST", base.clone(), Some(json!({"cmd": "true"}))),
        ("GET", format!("{base}/{pid}/output"), None),
        (
            "POST",
            format!("{base}/{pid}/input"),
            Some(json!({"data": "x"})),
        ),
        ("POST", format!("{base}/{pid}/close-stdin"), Some(json!({}))),
        (
            "POST",
            format!("{base}/{pid}/signal"),
            Some(json!({"signal": "SIGKILL"})),
        ),
        (
            "POST",
            format!("{base}/{pid}/resize"),
            Some(json!({"rows": 1, "cols": 1})),
        ),
    ];
    let (status, ctx) = s.call(
        "POST",
        &format!("/v1/sandboxes/{a}/contexts"),
        &key_a,
        Some(&json!({"language": "python"})),
    );
    assert_eq!(status, 201, "{ctx}");
    let ctx = ctx["id"].as_str().unwrap().to_string();
    let contexts = format!("/v1/sandboxes/{a}/contexts");
    let mut attempts = attempts;
    attempts.extend([
        ("GET", contexts.clone(), None),
        (
            "POST",
            contexts.clone(),
            Some(json!({"language": "python"})),
        ),
        ("POST", format!("{contexts}/{ctx}/restart"), Some(json!({}))),
        ("DELETE", format!("{contexts}/{ctx}"), None),
        (
            "POST",
            format!("/v1/sandboxes/{a}/execute"),
            Some(json!({"code": "1", "context": ctx})),
        ),
    ]);
    for (method, path, body) in &attempts {
        let (status, answer) = s.call(method, path, &key_b, body.as_ref());
        assert_eq!(status, 404, "B: {method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found", "{answer}");
    }
    // B's own sandbox knows no such process (pids are per sandbox), and B's code cannot
    // reach it either: another pid namespace.
    let (status, answer) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/processes/{pid}/signal"),
        &key_b,
        Some(&json!({"signal": "SIGKILL"})),
    );
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (404, json!("process_not_found"))
    );
    let o = s.exec(
        &key_b,
        &b,
        "import os, signal\nfor p in range(1, 4096):\n    try: os.kill(p, 0)\n    except OSError: continue\n    \
         print('SEES', p, open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode().strip())",
    );
    assert!(
        !o.stdout().contains("sleep 300"),
        "B sees A's process:\n{}",
        o.stdout()
    );
    assert_eq!(s.processes(&key_a, &a), vec![pid], "A's process is gone");
    // B's own sandbox has no such context; A's still runs.
    let (status, _) = s.call(
        "POST",
        &format!("/v1/sandboxes/{b}/execute"),
        &key_b,
        Some(&json!({"code": "1", "context": ctx})),
    );
    assert_eq!(status, 404);
    let (status, listed) = s.call("GET", &contexts, &key_a, None);
    assert_eq!(status, 200);
    assert!(
        listed["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == ctx.as_str()),
        "{listed}"
    );
    let (status, answer) = s.call(
        "POST",
        &format!("{base}/{pid}/signal"),
        &key_a,
        Some(&json!({"signal": 9})),
    );
    assert_eq!(status, 204, "{answer}");
    assert!(wait_until(Duration::from_secs(10), || s
        .processes(&key_a, &a)
        .is_empty()));
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}

/// PTY input from a client that floods it: a terminal whose program never reads takes at
/// most 64 KiB of input, and the rest is refused (429 `process_input_full`) without the server
/// growing; output a client does not read is not buffered without a bound either; the other
/// tenant's sandbox works meanwhile.
#[test]
fn pty_input_flood_and_unread_output_leave_the_host_bounded() {
    let _g = shared();
    let s = Server::start(2);
    s.wait_pool(2);
    let (key_a, key_b) = (s.key("A"), s.key("B"));
    let a = s.session(&key_a, &json!({}));
    let b = s.session(&key_b, &json!({}));
    let server_pid = s.pid();
    let (pid, _terminal) = s.start_process(
        &key_a,
        &a,
        // Raw mode: the terminal keeps what it is sent (in canonical mode the kernel drops
        // input past its line buffer).
        &json!({"cmd": "sh", "args": ["-c", "stty raw -echo; exec sleep 600"],
                "pty": {"rows": 24, "cols": 80}}),
    );
    // A program that writes as fast as it can, whose stream nobody reads.
    let (writer, _unread) =
        s.start_process(&key_a, &a, &json!({"cmd": "cat", "args": ["/dev/zero"]}));
    thread::sleep(Duration::from_secs(1));
    let before = rss_kib(server_pid);

    let chunk = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 48 << 10]);
    let input = json!({ "data_base64": chunk });
    let path = format!("/v1/sandboxes/{a}/processes/{pid}/input");
    let (mut accepted, mut refused) = (0usize, 0usize);
    // 600 x 48 KiB: 28 MiB sent at a program that reads none of it.
    for _ in 0..600 {
        let (status, answer) = s.call("POST", &path, &key_a, Some(&input));
        match status {
            204 => accepted += 48 << 10,
            429 => {
                assert_eq!(answer["error"]["code"], "process_input_full", "{answer}");
                refused += 1;
            }
            _ => panic!("input: {status} {answer}\n{}", s.log_text()),
        }
    }
    // What the agent holds plus what the terminal's buffers took.
    assert!(
        accepted <= (64 << 10) + (1 << 20),
        "{accepted} bytes accepted"
    );
    assert!(refused >= 550, "only {refused} refused");
    // B's sandbox is unaffected.
    let o = s.exec(&key_b, &b, "print(6 * 7)");
    assert_eq!(o.stdout().trim(), "42", "{}", o.dump());
    let after = rss_kib(server_pid);
    assert!(
        after < before + 64 * 1024,
        "the server grew from {before} KiB to {after} KiB"
    );
    // Both programs still run, and die when told to.
    assert_eq!(
        s.processes(&key_a, &a).len(),
        2,
        "{:?}",
        s.processes(&key_a, &a)
    );
    for p in [pid, writer] {
        let (status, answer) = s.call(
            "POST",
            &format!("/v1/sandboxes/{a}/processes/{p}/signal"),
            &key_a,
            Some(&json!({"signal": "SIGKILL"})),
        );
        assert_eq!(status, 204, "{answer}");
    }
    assert!(wait_until(Duration::from_secs(10), || s
        .processes(&key_a, &a)
        .is_empty()));
    let left = s.stop();
    assert!(left.is_empty(), "{left:?}");
}
