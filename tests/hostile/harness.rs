//! Runs attack programs through the real `corral run --json` and reads the
//! result object. Every attack prints the line protocol documented in
//! `attacks/prelude.py`; the helpers here assert on it so that a test can
//! never pass just because the program did not run.

use serde_json::Value;
use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Python helpers prepended to every Python attack.
pub const PRELUDE: &str = include_str!("attacks/prelude.py");

/// The documented per-stream output cap.
pub const OUTPUT_CAP: usize = 1 << 20;

/// The pids of the `corral` processes this test binary started (and its own, for sandboxes it
/// builds in-process): a cgroup's name begins with the pid of the process that made it, so the
/// host checks judge only what these made and pass beside another Corral on the same host.
static CORRAL_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Starts `cmd` (a `corral` command) and remembers its pid as one of this suite's own.
pub fn spawn_corral(cmd: &mut Command) -> Child {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", corral_bin().display()));
    CORRAL_PIDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(child.id());
    child
}

/// Whether `pid` is this test binary or a `corral` process it started.
pub fn is_own_pid(pid: u32) -> bool {
    pid == std::process::id()
        || CORRAL_PIDS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&pid)
}

/// The corral binary: `CORRAL_BIN` (rootless pass) or the one cargo built.
pub fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

/// Rootless: whether the user running the tests has subordinate ids Corral can use (a range of
/// at least 1024 ids for it, by name or uid, in both `/etc/subuid` and `/etc/subgid`, and
/// `newuidmap` and `newgidmap` installed), read here without Corral's help. Then every sandbox
/// must run as a host uid and gid of its own; else every result must say that it runs as the
/// caller's (docs/threat-model.md §6).
pub fn has_subordinate_ids() -> bool {
    let uid = nix::unistd::getuid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name);
    let has_range = |file: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|line| match line.split(':').collect::<Vec<_>>()[..] {
                [owner, _, count] => {
                    (Some(owner) == name.as_deref() || owner == uid.to_string())
                        && count.parse::<u32>().is_ok_and(|n| n >= 1024)
                }
                _ => false,
            })
    };
    let helper = |name: &str| {
        ["/usr/bin", "/bin", "/usr/sbin"]
            .iter()
            .any(|dir| Path::new(dir).join(name).exists())
    };
    has_range("/etc/subuid")
        && has_range("/etc/subgid")
        && helper("newuidmap")
        && helper("newgidmap")
}

/// The words every result's `warnings` has when a rootless sandbox runs as the caller's uid.
pub const CALLER_UID_WARNING: &str = "rootless without subordinate ids";

/// Tests that compare global host state (cgroup dirs, mount table, process
/// counts) before and after a run take the lock exclusively so no other
/// sandbox is alive meanwhile; every other test takes it shared.
static SERIAL: RwLock<()> = RwLock::new(());

pub fn shared() -> RwLockReadGuard<'static, ()> {
    SERIAL.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    SERIAL.write().unwrap_or_else(|e| e.into_inner())
}

/// A unique lowercase alphanumeric marker: safe in argv, file names, env.
pub fn marker(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(nanos);
    let a = h.finish();
    let mut h2 = RandomState::new().build_hasher();
    h2.write_u64(a);
    format!("hx{tag}{a:016x}{:08x}", h2.finish() as u32)
}

/// Who starts the sandbox. The engine creates it one way for a single-threaded caller and
/// another for a multithreaded one, so attacks on what that start sets up run through both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `corral run`, a single-threaded process: init is cloned straight into the sandbox's
    /// namespaces.
    Command,
    /// The engine called from a multithreaded process (as the server does), in this test
    /// process: a forked stage 1 makes the namespaces and init.
    Threaded,
}

pub const CALLERS: [Caller; 2] = [Caller::Command, Caller::Threaded];

/// One `corral run` invocation under construction.
pub struct Run {
    lang: &'static str,
    code: String,
    args: Vec<OsString>,
    host_env: Vec<(String, String)>,
    timeout_secs: u64,
    json: bool,
    caller: Caller,
    /// For a run by the engine in this process: its egress and limits.
    egress: Option<(corral_sandbox::Egress, corral_sandbox::Limits)>,
}

impl Run {
    pub fn python(attack: &str) -> Self {
        Self::new("python", format!("{PRELUDE}\n{attack}"))
    }

    pub fn javascript(attack: &str) -> Self {
        Self::new("javascript", attack.to_string())
    }

    pub fn bash(attack: &str) -> Self {
        Self::new("bash", attack.to_string())
    }

    fn new(lang: &'static str, code: String) -> Self {
        Run {
            lang,
            code,
            args: Vec::new(),
            host_env: Vec::new(),
            // Small default so a hung sandbox cannot stall the suite.
            timeout_secs: 15,
            json: true,
            caller: Caller::Command,
            egress: None,
        }
    }

    pub fn caller(mut self, caller: Caller) -> Self {
        self.caller = caller;
        self
    }

    /// Run by the engine in this process (a threaded caller), with this egress (a resolver of
    /// the test's) and these limits.
    pub fn engine_egress(
        mut self,
        egress: corral_sandbox::Egress,
        limits: corral_sandbox::Limits,
    ) -> Self {
        self.caller = Caller::Threaded;
        self.egress = Some((egress, limits));
        self
    }

    /// `--env K=V`: a parameter for the attack program.
    pub fn env(mut self, key: &str, value: impl AsRef<str>) -> Self {
        self.args.push("--env".into());
        self.args.push(format!("{key}={}", value.as_ref()).into());
        self
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn timeout(mut self, secs: u64) -> Self {
        self.timeout_secs = secs;
        self
    }

    pub fn memory(self, size: &str) -> Self {
        self.arg("--memory").arg(size)
    }

    pub fn pids(self, n: u32) -> Self {
        self.arg("--pids").arg(n.to_string())
    }

    pub fn disk(self, size: &str) -> Self {
        self.arg("--disk").arg(size)
    }

    /// `--file LOCAL:DEST`.
    pub fn file(self, local: &Path, dest: &str) -> Self {
        let mut spec = local.as_os_str().to_owned();
        spec.push(":");
        spec.push(dest);
        self.arg("--file").arg(spec)
    }

    pub fn out(self, dir: &Path) -> Self {
        self.arg("--out").arg(dir)
    }

    /// An environment variable of the corral process itself (host side).
    pub fn host_env(mut self, key: &str, value: &str) -> Self {
        self.host_env.push((key.to_string(), value.to_string()));
        self
    }

    /// Run without `--json` (to check exit codes).
    pub fn without_json(mut self) -> Self {
        self.json = false;
        self
    }

    pub fn spawn(self) -> Running {
        let mut cmd = Command::new(corral_bin());
        // The host image: it needs no build, and the attacks need nothing but Python.
        cmd.arg("run")
            .args(["--image", "host"])
            .arg("-c")
            .arg(&self.code)
            .arg("--lang")
            .arg(self.lang)
            .arg("--timeout")
            .arg(self.timeout_secs.to_string());
        if self.json {
            cmd.arg("--json");
        }
        cmd.args(&self.args)
            .envs(self.host_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_corral(&mut cmd);
        let out = drain(child.stdout.take().expect("stdout"));
        let err = drain(child.stderr.take().expect("stderr"));
        Running {
            child: Some(child),
            out: Some(out),
            err: Some(err),
            started: Instant::now(),
            // Generous: corral itself must enforce --timeout; this only
            // keeps a broken engine from hanging the suite forever.
            deadline: Duration::from_secs(self.timeout_secs + 45),
            json: self.json,
        }
    }

    pub fn run(self) -> Outcome {
        match self.caller {
            Caller::Command => self.spawn().wait(),
            Caller::Threaded => self.run_in_threaded_caller(),
        }
    }

    /// The one-shot path of `corral run` (the same runner, the host image), called from a
    /// thread of this process while another thread exists. Takes `--env` and the timeout.
    fn run_in_threaded_caller(self) -> Outcome {
        assert_eq!(self.lang, "python", "threaded runs take Python attacks");
        let mut spec = corral_sandbox::SandboxSpec::new(Vec::new());
        if let Some((egress, limits)) = self.egress.clone() {
            spec.egress = egress;
            spec.limits = limits;
        }
        spec.limits.timeout = Duration::from_secs(self.timeout_secs);
        for pair in self.args.chunks(2) {
            let [flag, value] = pair else {
                panic!("threaded runs take --env K=V only")
            };
            assert_eq!(flag, "--env", "threaded runs take --env K=V only");
            let (k, v) = value
                .to_str()
                .and_then(|kv| kv.split_once('='))
                .expect("K=V");
            spec.env.push((k.to_string(), v.to_string()));
        }
        let started = Instant::now();
        let result = thread::scope(|scope| {
            scope
                .spawn(|| {
                    let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
                    assert!(threads > 1, "the caller must be multithreaded");
                    let code = self.code.clone().into_bytes();
                    let python = corral_kernel::Language::Python;
                    let quiet = &mut |_, _: &[u8]| {};
                    let policy = &corral_kernel::CodePolicy::default();
                    corral_kernel::oneshot::run(
                        spec, python, "main.py", code, policy, None, None, quiet,
                    )
                    .0
                })
                .join()
                .expect("the engine panicked")
        });
        let json = serde_json::to_value(&result).expect("the result serializes");
        let o = Outcome {
            exit: None,
            raw_stdout: json.to_string(),
            raw_stderr: String::new(),
            json: Some(json),
            wall: started.elapsed(),
        };
        o.shown_if_verbose()
    }
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// A corral process that is still running. Dropping it kills it.
pub struct Running {
    child: Option<Child>,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
    started: Instant,
    deadline: Duration,
    json: bool,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("child").id()
    }

    /// True once corral has exited (does not reap the output).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.as_mut().expect("child").try_wait(), Ok(Some(_)))
    }

    pub fn wait(mut self) -> Outcome {
        let mut child = self.child.take().expect("child");
        let exit = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st;
            }
            if self.started.elapsed() > self.deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "corral did not return within {:?} (it must enforce --timeout itself)",
                    self.deadline
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let wall = self.started.elapsed();
        let out = self.out.take().expect("out").join().unwrap_or_default();
        let err = self.err.take().expect("err").join().unwrap_or_default();
        let raw_stdout = String::from_utf8_lossy(&out).into_owned();
        let raw_stderr = String::from_utf8_lossy(&err).into_owned();
        let json = if self.json {
            serde_json::from_str::<Value>(raw_stdout.trim()).ok()
        } else {
            None
        };
        let o = Outcome {
            exit: Some(exit),
            raw_stdout,
            raw_stderr,
            json,
            wall,
        };
        o.shown_if_verbose()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one `corral run` produced (or the engine or a server, for a program run without it).
pub struct Outcome {
    /// How `corral run` exited; `None` when no `corral run` process ran the program.
    pub exit: Option<ExitStatus>,
    pub raw_stdout: String,
    pub raw_stderr: String,
    pub json: Option<Value>,
    pub wall: Duration,
}

fn clip(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Outcome {
    /// HOSTILE_VERBOSE=1 shows every run, to audit passing tests.
    fn shown_if_verbose(self) -> Self {
        if std::env::var_os("HOSTILE_VERBOSE").is_some() {
            eprintln!("{}", self.dump());
        }
        self
    }

    /// A readable summary for assertion messages.
    pub fn dump(&self) -> String {
        match &self.json {
            Some(j) => format!(
                "corral exit={:?} wall={:?}\nstatus={} exit_code={} signal={} error_message={} warnings={}\n--- program stdout ---\n{}\n--- program stderr ---\n{}\n--- corral stderr ---\n{}",
                self.exit.and_then(|e| e.code()),
                self.wall,
                j["status"],
                j["exit_code"],
                j["signal"],
                j["error_message"],
                j["warnings"],
                clip(self.stdout(), 6000),
                clip(self.stderr(), 3000),
                clip(&self.raw_stderr, 2000),
            ),
            None => format!(
                "corral exit={:?} wall={:?} (no JSON result)\n--- corral stdout ---\n{}\n--- corral stderr ---\n{}",
                self.exit.and_then(|e| e.code()),
                self.wall,
                clip(&self.raw_stdout, 6000),
                clip(&self.raw_stderr, 3000),
            ),
        }
    }

    pub fn j(&self) -> &Value {
        self.json
            .as_ref()
            .unwrap_or_else(|| panic!("corral printed no JSON result object\n{}", self.dump()))
    }

    pub fn status(&self) -> &str {
        self.j()["status"].as_str().unwrap_or("<missing>")
    }

    pub fn stdout(&self) -> &str {
        self.j()["stdout"].as_str().unwrap_or("")
    }

    pub fn stderr(&self) -> &str {
        self.j()["stderr"].as_str().unwrap_or("")
    }

    pub fn warnings(&self) -> Vec<String> {
        self.j()["warnings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// cgroups were unavailable: memory/pids are enforced by rlimits only.
    pub fn rlimit_mode(&self) -> bool {
        self.warnings()
            .iter()
            .any(|w| w.to_lowercase().contains("rlimit"))
    }

    pub fn execution_time_ms(&self) -> u64 {
        self.j()["execution_time_ms"].as_u64().unwrap_or(u64::MAX)
    }

    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.stdout().lines()
    }

    pub fn has_line(&self, line: &str) -> bool {
        self.lines().any(|l| l == line)
    }

    /// The rest of every stdout line starting with `KEY `.
    pub fn values(&self, key: &str) -> Vec<&str> {
        let prefix = format!("{key} ");
        self.lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .collect()
    }

    /// The first value for `KEY`, or a failure showing the output.
    pub fn value(&self, key: &str) -> &str {
        self.values(key)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("no `{key} ...` line in the program output\n{}", self.dump()))
    }

    /// Corral exited as its status says (docs/cli.md, one rule with and without `--json`):
    /// the program's own code for `success` and `error` (128 + N for signal N), 124 for
    /// `timeout`, 137 for `memory_limit`, 125 for `sandbox_error`.
    pub fn assert_exit_follows_status(&self) {
        let Some(exit) = self.exit else {
            return; // run by the engine or a server: no exit code of `corral run`'s to check
        };
        let j = self.j();
        let expected = match self.status() {
            "timeout" => 124,
            "memory_limit" => 137,
            "sandbox_error" => 125,
            _ => j["exit_code"]
                .as_i64()
                .or_else(|| j["signal"].as_i64().map(|s| 128 + s))
                .unwrap_or(1) as i32,
        };
        assert_eq!(
            exit.code(),
            Some(expected),
            "corral's exit code does not follow its status\n{}",
            self.dump()
        );
    }

    /// The program ran inside a sandbox (not a sandbox_error, marker seen).
    pub fn assert_started(&self) {
        self.assert_exit_follows_status();
        assert_ne!(
            self.status(),
            "sandbox_error",
            "sandbox could not be built\n{}",
            self.dump()
        );
        assert!(
            self.stdout().starts_with("START\n") || self.has_line("START"),
            "attack program did not start\n{}",
            self.dump()
        );
    }

    /// Ran to the end and exited 0.
    pub fn assert_completed(&self) {
        self.assert_started();
        assert!(
            self.has_line("DONE"),
            "attack program did not reach its end\n{}",
            self.dump()
        );
        assert_eq!(self.status(), "success", "{}", self.dump());
    }

    /// No attempt succeeded and nothing leaked.
    pub fn assert_no_escape(&self) {
        let bad: Vec<&str> = self
            .lines()
            .filter(|l| l.starts_with("ALLOWED ") || l.starts_with("LEAK "))
            .collect();
        assert!(bad.is_empty(), "SANDBOX HOLE: {bad:#?}\n{}", self.dump());
    }

    /// `BLOCKED <what> <errno>` was printed with one of the expected errnos.
    pub fn assert_blocked(&self, what: &str, errnos: &[&str]) {
        let prefix = format!("BLOCKED {what} ");
        let got: Vec<&str> = self
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .collect();
        assert!(
            !got.is_empty(),
            "no `BLOCKED {what}` line (attempt not made, or it SUCCEEDED)\n{}",
            self.dump()
        );
        for e in &got {
            assert!(
                errnos.contains(e),
                "`{what}` failed with {e}, expected one of {errnos:?}\n{}",
                self.dump()
            );
        }
    }

    /// A secret appears nowhere in what corral returned.
    pub fn assert_absent(&self, secret: &str) {
        assert!(
            !self.raw_stdout.contains(secret) && !self.raw_stderr.contains(secret),
            "SANDBOX HOLE: secret {secret} leaked into the result\n{}",
            self.dump()
        );
    }
}

/// errno sets used across tests.
pub const EPERM: &[&str] = &["EPERM"];
pub const NO_FILE: &[&str] = &["ENOENT"];
pub const NO_FILE_OR_ACCESS: &[&str] = &["ENOENT", "EACCES"];
pub const READ_ONLY: &[&str] = &["EROFS", "EACCES", "EPERM"];
