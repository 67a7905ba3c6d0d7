//! How a sandbox's own processes (stage 1, init and the workload of a sandbox, the init and
//! kernel of a session forked from a zygote) tell the host which step of their setup failed.
//!
//! A failing process sends one message before it exits: [`MSG_ERROR`], the [`Step`]'s code,
//! the `errno` underneath (0: none), what the step acted on when it names it (a directory, a
//! program) and the error's text, all bounded. The host turns it back into a [`ChildFailure`],
//! whose source is the `errno`.

use std::error::Error;
use std::fmt;
use std::io;

use nix::errno::Errno;

/// The tag of a failure report (child → host), on a sandbox's report socket and on a
/// session's control socket alike.
pub const MSG_ERROR: u8 = b'E';
/// The most of a failure's subject a report carries, in bytes.
const MAX_SUBJECT: usize = 255;
/// The most of an error's text a report carries, in bytes.
const MAX_DETAIL: usize = 1024;
/// Tag, step, errno and the subject's length.
const HEADER: usize = 1 + 1 + 4 + 1;

macro_rules! steps {
    ($($(#[$doc:meta])* $step:ident = $code:literal => $what:expr,)*) => {
        /// A step of a sandbox's setup that its own processes take. (What the host does
        /// itself fails as one of [`crate::SandboxError`]'s other variants.)
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Step {
            $($(#[$doc])* $step,)*
        }

        impl Step {
            /// What the step does, as the report of its failure says it.
            pub fn what(self) -> &'static str {
                match self {
                    $(Step::$step => $what,)*
                }
            }

            fn code(self) -> u8 {
                match self {
                    $(Step::$step => $code,)*
                }
            }

            fn from_code(code: u8) -> Option<Step> {
                match code {
                    $($code => Some(Step::$step),)*
                    _ => None,
                }
            }

            #[cfg(test)]
            const ALL: &'static [Step] = &[$(Step::$step,)*];
        }
    };
}

steps! {
    /// A forked session reads what it is to be from its control socket.
    ReadPlan = 1 => "reading the session plan",
    /// Root mode (and a session's): becoming the sandbox's own host ids.
    SwitchUser = 2 => "switching to the unprivileged sandbox user",
    Namespaces = 3 => crate::child::NAMESPACES_FAILED,
    /// Rootless with subordinate ids: telling the host the user namespace exists.
    ReportNamespace = 4 => "reporting the user namespace",
    MapUser = 5 => "mapping the sandbox user",
    /// Inside the user namespace, once its ids are mapped.
    SandboxUser = 6 => "switching to the sandbox user",
    RuntimeDir = 7 => "opening the runtime directory",
    StartInit = 8 => "starting the sandbox's init",
    HideCommandLine = 9 => "hiding the host command line",
    BlockSigchld = 10 => "blocking SIGCHLD",
    Signalfd = 11 => "creating a signalfd",
    StartPipe = 12 => "creating the start pipe",
    SocketPair = 13 => "creating a socket pair",
    /// Forking the workload (a session's kernel), or releasing it.
    StartWorkload = 14 => "starting the workload",
    Inotify = 15 => "limiting the sandbox's inotify use",
    /// Mounts, the root's files and `pivot_root`.
    BuildRoot = 16 => "building the sandbox's root filesystem",
    /// A forked one-shot run's program file.
    PlaceProgram = 17 => "placing the program",
    CreateNetwork = 18 => "creating the network namespace",
    PassNetwork = 19 => "passing the network namespace to init",
    JoinNetwork = 20 => "joining the sandbox's network namespace",
    ProxyEndpoint = 21 => "opening the egress proxy's endpoint",
    OpenWorkspace = 22 => "opening /workspace",
    ReportReady = 23 => "reporting readiness",
    ReportKernel = 24 => "reporting the kernel",
    Stdio = 25 => "setting up standard streams",
    SignalMask = 26 => "restoring the signal mask",
    JoinCgroup = 27 => "joining the sandbox's cgroup",
    NoNewPrivs = 28 => "locking the sandbox down",
    Capabilities = 29 => "locking the sandbox down",
    Seccomp = 30 => "locking the sandbox down",
    Rlimits = 31 => "locking the sandbox down",
    Landlock = 32 => "locking the sandbox down",
    CpuAffinity = 33 => "restoring the CPU affinity",
    EnterWorkspace = 34 => "entering /workspace",
    ProcessAgent = 35 => "starting the process agent",
    /// The subject is the program, which was not found or could not be executed.
    Exec = 36 => "executing",
}

/// A setup step of a sandbox's own process failed, as the process reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildFailure {
    pub step: Step,
    /// What the step acted on, when it names it (empty when not).
    pub subject: String,
    /// The error's text, as the failing process wrote it.
    pub detail: String,
    /// The system error underneath, when there was one.
    pub errno: Option<Errno>,
}

impl fmt::Display for ChildFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.step.what())?;
        if !self.subject.is_empty() {
            write!(f, " {}", self.subject)?;
        }
        write!(f, ": {}", self.detail)
    }
}

impl Error for ChildFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.errno.as_ref().map(|e| e as &(dyn Error + 'static))
    }
}

impl ChildFailure {
    /// The report of `err` failing `step` (on `subject`, when not empty).
    pub(crate) fn encode(step: Step, subject: &str, err: &(dyn Error + 'static)) -> Vec<u8> {
        let subject = prefix(subject, MAX_SUBJECT);
        let detail = err.to_string();
        let detail = prefix(&detail, MAX_DETAIL);
        let errno = errno_of(err).map_or(0, |e| e as i32);
        let mut msg = Vec::with_capacity(HEADER + subject.len() + detail.len());
        msg.extend_from_slice(&[MSG_ERROR, step.code()]);
        msg.extend_from_slice(&errno.to_le_bytes());
        msg.push(subject.len() as u8);
        msg.extend_from_slice(subject.as_bytes());
        msg.extend_from_slice(detail.as_bytes());
        msg
    }

    /// The failure a report (tag included) says; `None` for anything else.
    pub fn decode(msg: &[u8]) -> Option<ChildFailure> {
        let [MSG_ERROR, code, e0, e1, e2, e3, len, rest @ ..] = msg else {
            return None;
        };
        let step = Step::from_code(*code)?;
        let errno = i32::from_le_bytes([*e0, *e1, *e2, *e3]);
        let (subject, detail) = rest.split_at_checked(usize::from(*len))?;
        Some(ChildFailure {
            step,
            subject: String::from_utf8_lossy(subject).into_owned(),
            detail: String::from_utf8_lossy(detail).into_owned(),
            errno: (errno != 0).then(|| Errno::from_raw(errno)),
        })
    }
}

/// The first `errno` in `err`'s chain of sources.
fn errno_of(err: &(dyn Error + 'static)) -> Option<Errno> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(errno) = e.downcast_ref::<Errno>() {
            return Some(*errno);
        }
        if let Some(raw) = e
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(Errno::from_raw(raw));
        }
        next = e.source();
    }
    None
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_brings_back_its_step_subject_text_and_errno() {
        let err = io::Error::from_raw_os_error(libc::ENOENT);
        let msg = ChildFailure::encode(Step::Exec, "python3 (is it installed?)", &err);
        let failure = ChildFailure::decode(&msg).expect("a failure report");
        assert_eq!(failure.step, Step::Exec);
        assert_eq!(failure.errno, Some(Errno::ENOENT));
        assert_eq!(
            failure.to_string(),
            format!("executing python3 (is it installed?): {err}")
        );
        let source = failure.source().expect("the errno is the source");
        assert_eq!(source.downcast_ref::<Errno>(), Some(&Errno::ENOENT));

        // An errno found deeper in the chain, and a step without a subject.
        let lockdown = crate::lockdown::LockdownError::Rlimit {
            resource: nix::sys::resource::Resource::RLIMIT_NPROC,
            source: Errno::EPERM,
        };
        let failure = ChildFailure::decode(&ChildFailure::encode(lockdown.step(), "", &lockdown))
            .expect("a failure report");
        assert_eq!(failure.step, Step::Rlimits);
        assert_eq!(failure.errno, Some(Errno::EPERM));
        assert_eq!(
            failure.to_string(),
            format!("locking the sandbox down: {lockdown}")
        );

        // No errno at all.
        let err = io::Error::other("the host gave up on this sandbox");
        let failure = ChildFailure::decode(&ChildFailure::encode(Step::JoinCgroup, "", &err))
            .expect("a failure report");
        assert_eq!(failure.errno, None);
        assert!(failure.source().is_none());
        assert_eq!(
            failure.to_string(),
            "joining the sandbox's cgroup: the host gave up on this sandbox"
        );
    }

    #[test]
    fn every_step_has_its_own_code() {
        for &step in Step::ALL {
            assert_eq!(Step::from_code(step.code()), Some(step));
        }
        let mut codes: Vec<u8> = Step::ALL.iter().map(|s| s.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Step::ALL.len());
        assert_eq!(Step::from_code(0), None);
    }

    #[test]
    fn a_report_is_bounded_and_a_malformed_one_is_none() {
        let long = "é".repeat(4096);
        let msg = ChildFailure::encode(Step::RuntimeDir, &long, &io::Error::other(long.clone()));
        assert!(msg.len() <= HEADER + MAX_SUBJECT + MAX_DETAIL);
        let failure = ChildFailure::decode(&msg).expect("a failure report");
        assert!(failure.subject.chars().all(|c| c == 'é'));
        assert!(failure.detail.chars().all(|c| c == 'é'));

        assert_eq!(ChildFailure::decode(b""), None);
        assert_eq!(ChildFailure::decode(b"Ea message of old"), None);
        // An unknown step, a subject longer than the message, another tag.
        assert_eq!(ChildFailure::decode(&[MSG_ERROR, 200, 0, 0, 0, 0, 0]), None);
        assert_eq!(
            ChildFailure::decode(&[MSG_ERROR, 1, 0, 0, 0, 0, 9, b'x']),
            None
        );
        let mut other = ChildFailure::encode(Step::Exec, "", &io::Error::other("x"));
        other[0] = b'X';
        assert_eq!(ChildFailure::decode(&other), None);
    }
}
