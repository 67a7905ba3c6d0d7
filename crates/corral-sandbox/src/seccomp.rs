//! Seccomp-BPF allow-lists for the sandbox, one profile per role.
//!
//! The rules are reviewed data, not code: `seccomp/workload.json` (untrusted user code) and
//! `seccomp/init.json` (our pid-1 reaper), in seccompiler's JSON format; `seccomp/README.md`
//! explains every denied class and every conditional rule. `build.rs` compiles them for the
//! target architecture (see `seccomp_profile.rs`), so starting a sandbox costs no parsing.

use nix::errno::Errno;

pub use libc::sock_filter;

use crate::spec::Role;

mod programs {
    include!(concat!(env!("OUT_DIR"), "/seccomp_programs.rs"));
}

/// `seccomp(SECCOMP_SET_MODE_FILTER)` failed; EACCES means no_new_privs was not set.
#[derive(Debug, thiserror::Error)]
#[error("seccomp(SECCOMP_SET_MODE_FILTER) failed: {0}")]
pub struct SeccompError(#[source] pub Errno);

/// The BPF programs to install for `role`, in installation order.
///
/// For the workload the order matters: the kernel runs every installed filter on each syscall
/// and acts on the most severe result; among results of equal severity (ERRNO here) the most
/// recently installed filter wins (kernel/seccomp.c: seccomp_run_filters walks from the newest
/// filter and only replaces its result with a strictly more severe one). So the `clone3` filter
/// comes last for its ENOSYS to beat the allow-list's EPERM, while its default "allow" can
/// never override a denial by the allow-list.
/// The workload's are for the untrusted code and everything it spawns; the zygote's for
/// Corral's zygote and the sessions it forks, until each installs the workload's.
pub fn filters(role: Role) -> &'static [&'static [sock_filter]] {
    match role {
        Role::Workload => programs::WORKLOAD,
        Role::Zygote => programs::ZYGOTE,
    }
}

/// The programs of every sandbox's (and session's) own pid-1 reaper, once its setup is done.
pub fn init_filters() -> &'static [&'static [sock_filter]] {
    programs::INIT
}

/// Install them on the calling thread (requires no_new_privs already set, or CAP_SYS_ADMIN).
/// Must not allocate (the programs are static).
///
/// Safe to call between fork and execve: it only issues raw `seccomp(2)` calls.
pub fn install(programs: &[&[sock_filter]]) -> Result<(), SeccompError> {
    /// `struct sock_fprog` from <linux/filter.h>.
    #[repr(C)]
    struct SockFprog {
        len: libc::c_ushort,
        filter: *const sock_filter,
    }

    for program in programs {
        let len =
            libc::c_ushort::try_from(program.len()).map_err(|_| SeccompError(Errno::E2BIG))?;
        let fprog = SockFprog {
            len,
            filter: program.as_ptr(),
        };
        // SAFETY: `fprog` points at `len` initialized `sock_filter`s (repr(C), the kernel's
        // layout) that outlive the call; the kernel copies the program and keeps no pointer.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &fprog as *const SockFprog,
            )
        };
        if rc != 0 {
            return Err(SeccompError(Errno::last()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Output, Stdio};
    use std::sync::mpsc;
    use std::time::Duration;

    use libc::{c_long, c_ulong};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, pipe, ForkResult};

    use super::*;
    use crate::seccomp_profile::*;
    use seccompiler::TargetArch;
    use serde_json::Value;
    use std::collections::{BTreeSet, HashSet};

    #[cfg(target_arch = "x86_64")]
    const HOST_ARCH: TargetArch = TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    const HOST_ARCH: TargetArch = TargetArch::aarch64;

    const ARCHES: [TargetArch; 2] = [TargetArch::x86_64, TargetArch::aarch64];

    /// Syscall names each filter of `profile` mentions on `arch`.
    fn syscall_names(profile: &Profile, arch: TargetArch) -> HashMap<String, HashSet<String>> {
        let root: Value = serde_json::from_slice(&select_arch(profile, arch).unwrap()).unwrap();
        let mut names = HashMap::new();
        for (filter, body) in root.as_object().unwrap() {
            let set = body["filter"]
                .as_array()
                .unwrap()
                .iter()
                .map(|rule| rule["syscall"].as_str().unwrap().to_owned())
                .collect();
            names.insert(filter.clone(), set);
        }
        names
    }

    #[test]
    fn profiles_compile_for_every_supported_arch() {
        for profile in [&WORKLOAD, &INIT, &ZYGOTE] {
            for arch in ARCHES {
                let programs = compile(profile, arch)
                    .unwrap_or_else(|e| panic!("{} for {arch:?}: {e:?}", profile.file));
                assert_eq!(programs.len(), profile.filters.len());
                assert!(programs
                    .iter()
                    .all(|p| !p.is_empty() && p.len() <= BPF_MAX_LEN));
            }
        }
        for (embedded, profile) in [
            (filters(Role::Workload), &WORKLOAD),
            (init_filters(), &INIT),
            (filters(Role::Zygote), &ZYGOTE),
        ] {
            let fresh = compile(profile, HOST_ARCH).unwrap();
            assert_eq!(embedded.len(), fresh.len());
            for (e, f) in embedded.iter().zip(&fresh) {
                let same = e.len() == f.len()
                    && e.iter()
                        .zip(f)
                        .all(|(a, b)| (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k));
                assert!(same, "the embedded program differs from the profile data");
            }
        }
        for arch in ARCHES {
            let workload = &syscall_names(&WORKLOAD, arch)["workload"];
            let init = &syscall_names(&INIT, arch)["init"];
            eprintln!(
                "{arch:?}: workload allows {} syscalls, init {}",
                workload.len(),
                init.len()
            );
            assert!(
                init.is_subset(workload),
                "init must be narrower than the workload"
            );
            // The zygote widens the workload by exactly the namespace calls a session needs
            // before it installs the workload filter on top.
            let zygote = &syscall_names(&ZYGOTE, arch)["zygote"];
            let extra: HashSet<&str> = zygote.difference(workload).map(String::as_str).collect();
            assert_eq!(
                extra,
                HashSet::from([
                    "unshare",
                    "mount",
                    "mount_setattr",
                    "sethostname",
                    "capset",
                    "setresuid",
                    "setresgid",
                    "setgroups"
                ])
            );
        }
    }

    #[test]
    fn forbidden_syscalls_are_absent_from_every_profile() {
        for arch in ARCHES {
            for (profile, allow_list) in [(&WORKLOAD, "workload"), (&INIT, "init")] {
                let allowed = &syscall_names(profile, arch)[allow_list];
                let leaked: Vec<_> = FORBIDDEN.iter().filter(|s| allowed.contains(**s)).collect();
                assert!(
                    leaked.is_empty(),
                    "{} {arch:?} allows {leaked:?}",
                    profile.file
                );
            }
        }
    }

    #[test]
    fn malformed_profiles_are_rejected() {
        let reject = |json: &'static str| {
            let profile = Profile {
                file: "test.json",
                json: json.as_bytes(),
                filters: &["f"],
                extends: None,
            };
            compile(&profile, HOST_ARCH).unwrap_err().to_string()
        };
        let rules = |r: &str| -> &'static str {
            Box::leak(
                format!(r#"{{"f": {{"default_action": "allow", "filter_action": {{"errno": 1}}, "filter": [{r}]}}}}"#)
                    .into_boxed_str(),
            )
        };
        let mixed = rules(
            r#"{"syscall": "socket"}, {"syscall": "socket", "args": [{"index": 0, "type": "dword", "op": "eq", "val": 1}]}"#,
        );
        assert!(reject(mixed).contains("both an unconditional and a conditional"));
        assert!(reject(rules(r#"{"syscall": "read"}, {"syscall": "read"}"#)).contains("twice"));
        assert!(reject(rules(r#"{"syscall": "read", "arches": ["sparc"]}"#)).contains("arch"));
        assert!(reject(rules(r#"{"syscall": "no_such_call"}"#)).contains("compile"));
        let extra = r#"{"f": {"default_action": "allow", "filter_action": {"errno": 1}, "filter": []},
                        "g": {"default_action": "allow", "filter_action": {"errno": 1}, "filter": []}}"#;
        assert!(reject(extra).contains("never installed"));
        assert!(reject(
            r#"{"g": {"default_action": "allow", "filter_action": {"errno": 1}, "filter": []}}"#
        )
        .contains("missing"));
    }

    /// `struct seccomp_data` as the kernel fills it on both (little-endian) architectures.
    fn seccomp_data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
        let mut data = [0u8; 64];
        data[..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (slot, arg) in data[16..].chunks_exact_mut(8).zip(args) {
            slot.copy_from_slice(&arg.to_le_bytes());
        }
        data
    }

    /// seccompiler's copy of the kernel's `sock_filter`, as libc's.
    fn as_libc(program: &[seccompiler::sock_filter]) -> Vec<sock_filter> {
        program
            .iter()
            .map(|i| sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect()
    }

    /// How a program decided one syscall.
    struct Decision {
        action: u32,
        /// The arguments it read, one bit per index.
        args_read: u8,
        /// Instructions it ran.
        steps: usize,
    }

    /// A classic-BPF interpreter for the instructions seccomp programs use, with the kernel's
    /// semantics; running off the end or an unknown instruction panics.
    fn decide(program: &[sock_filter], data: &[u8; 64]) -> Decision {
        let (mut acc, mut pc, mut args_read, mut steps) = (0u32, 0usize, 0u8, 0usize);
        loop {
            let insn = program[pc];
            steps += 1;
            pc += 1;
            let k = insn.k;
            match insn.code {
                // BPF_LD | BPF_W | BPF_ABS
                0x20 => {
                    let at = k as usize;
                    acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                    if at >= 16 {
                        args_read |= 1 << ((at - 16) / 8);
                    }
                }
                // BPF_ALU | BPF_AND | BPF_K
                0x54 => acc &= k,
                // BPF_RET | BPF_K
                0x06 => {
                    return Decision {
                        action: k,
                        args_read,
                        steps,
                    }
                }
                // BPF_JMP | BPF_JA
                0x05 => pc += k as usize,
                // BPF_JMP | BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET with BPF_K
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match insn.code {
                        0x15 => acc == k,
                        0x25 => acc > k,
                        0x35 => acc >= k,
                        _ => acc & k != 0,
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                code => panic!("instruction {code:#06x} is not interpreted"),
            }
        }
    }

    /// Per argument index: the constants `program` compares that argument with, each as
    /// itself, its neighbours, its complement, and with the upper 32 bits set or holding it.
    fn argument_values(program: &[sock_filter]) -> [BTreeSet<u64>; 6] {
        let mut values: [BTreeSet<u64>; 6] = Default::default();
        let mut loaded = None;
        for insn in program {
            match insn.code {
                0x20 => loaded = insn.k.checked_sub(16).map(|at| at as usize / 8),
                0x06 => loaded = None,
                0x54 | 0x15 | 0x25 | 0x35 | 0x45 => {
                    if let Some(arg) = loaded {
                        let k = insn.k;
                        for low in [k, k ^ 1, k.wrapping_add(1), k.wrapping_sub(1), !k] {
                            values[arg].insert(u64::from(low));
                            values[arg].insert(u64::from(low) | 0xffff_ffff_0000_0000);
                            values[arg].insert(u64::from(low) << 32);
                        }
                    }
                }
                _ => {}
            }
        }
        values
    }

    /// Every combination of one value per listed argument index, the others zero.
    fn combinations(indexes: &[usize], values: &[BTreeSet<u64>; 6]) -> Vec<[u64; 6]> {
        let mut all = vec![[0u64; 6]];
        for &index in indexes {
            all = all
                .iter()
                .flat_map(|args| {
                    values[index].iter().map(move |&v| {
                        let mut args = *args;
                        args[index] = v;
                        args
                    })
                })
                .collect();
        }
        all
    }

    const AUDIT_ARCHES: [u32; 5] = [
        0xc000_003e, // x86_64
        0xc000_00b7, // aarch64
        0x4000_0003, // i386 (int 0x80 on x86_64)
        0x4000_0028, // arm (32-bit compat on aarch64)
        0,
    ];

    /// The binary-search programs decide every syscall number, architecture and compared
    /// argument value as seccompiler's linear chains of the same rules do.
    #[test]
    fn search_programs_decide_as_seccompilers_chains() {
        let mut numbers: Vec<u32> = (0..1100).collect();
        numbers.extend(0x4000_0000..0x4000_0000 + 600); // x32
        numbers.extend([0x7fff_ffff, 0x8000_0000, u32::MAX - 1, u32::MAX]);
        for profile in [&WORKLOAD, &INIT, &ZYGOTE] {
            for arch in ARCHES {
                let json = select_arch(profile, arch).unwrap();
                let mut chains = seccompiler::compile_from_json(json.as_slice(), arch).unwrap();
                let searches = compile(profile, arch).unwrap();
                for (name, search) in profile.filters.iter().zip(&searches) {
                    let chain = as_libc(&chains.remove(*name).unwrap());
                    let search = &as_libc(search);
                    let values = argument_values(&chain);
                    let mut bits = values.clone();
                    for set in &mut bits {
                        set.extend((0..64).map(|b| 1u64 << b));
                        set.extend([0, u64::MAX]);
                    }
                    let (mut checked, mut longest) = (0usize, 0);
                    let mut check = |nr: u32, audit: u32, args: [u64; 6]| {
                        let data = seccomp_data(nr, audit, args);
                        let (old, new) = (decide(&chain, &data), decide(search, &data));
                        assert_eq!(
                            old.action, new.action,
                            "{} {name} {arch:?}: syscall {nr} arch {audit:#x} args {args:x?}",
                            profile.file
                        );
                        checked += 1;
                        if new.args_read == 0 {
                            longest = longest.max(new.steps);
                        }
                        old.args_read | new.args_read
                    };
                    for &nr in &numbers {
                        for audit in AUDIT_ARCHES {
                            if check(nr, audit, [0; 6]) == 0 {
                                continue;
                            }
                            // Each argument alone over many values, then every combination of
                            // the compared values over the arguments the rules read.
                            let mut read = 0;
                            for index in 0..6 {
                                for args in combinations(&[index], &bits) {
                                    read |= check(nr, audit, args);
                                }
                            }
                            let indexes: Vec<usize> =
                                (0..6).filter(|i| read & (1 << i) != 0).collect();
                            for args in combinations(&indexes, &values) {
                                check(nr, audit, args);
                            }
                        }
                    }
                    eprintln!(
                        "{} {name} {arch:?}: {} instructions (seccompiler: {}), {checked} \
                         decisions compared, at most {longest} steps without arguments",
                        profile.file,
                        search.len(),
                        chain.len()
                    );
                    // The kernel emulates this for every syscall number at installation.
                    assert!(longest <= 32, "the search is too deep: {longest} steps");
                }
            }
        }
    }

    /// The argument checks whose getting wrong would matter most, on the installed program.
    #[test]
    fn search_program_keeps_the_argument_checks() {
        let workload = filters(Role::Workload)[0];
        let audit = if cfg!(target_arch = "x86_64") {
            AUDIT_ARCHES[0]
        } else {
            AUDIT_ARCHES[1]
        };
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let allow = libc::SECCOMP_RET_ALLOW;
        let action = |nr: c_long, args: [u64; 6]| {
            decide(workload, &seccomp_data(nr as u32, audit, args)).action
        };
        // The same numbers on x86_64 and aarch64 (libc types them per target).
        let (tiocsti, tcgets) = (0x5412, 0x5401);
        assert_eq!(action(libc::SYS_ioctl, [0, tiocsti, 0, 0, 0, 0]), eperm);
        assert_eq!(
            action(libc::SYS_ioctl, [0, tiocsti | 1 << 32, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(action(libc::SYS_ioctl, [0, tcgets, 0, 0, 0, 0]), allow);
        let newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(action(libc::SYS_clone, [newuser, 0, 0, 0, 0, 0]), eperm);
        assert_eq!(
            action(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            allow
        );
        assert_eq!(action(libc::SYS_ptrace, [0; 6]), eperm);
        assert_eq!(action(libc::SYS_read, [0; 6]), allow);
        let socket = |domain: i32, ty: i32, protocol: u64| {
            action(
                libc::SYS_socket,
                [domain as u64, ty as u64, protocol, 0, 0, 0],
            )
        };
        for domain in [libc::AF_INET, libc::AF_INET6] {
            let tcp = libc::IPPROTO_TCP as u64;
            let udp = libc::IPPROTO_UDP as u64;
            assert_eq!(socket(domain, libc::SOCK_STREAM, 0), allow);
            assert_eq!(socket(domain, libc::SOCK_STREAM, tcp), allow);
            assert_eq!(socket(domain, libc::SOCK_DGRAM, 0), allow);
            assert_eq!(socket(domain, libc::SOCK_DGRAM, udp), allow);
            // The kernel reads the protocol as an int: bits 32-63 change nothing.
            assert_eq!(socket(domain, libc::SOCK_STREAM, tcp | 1 << 32), allow);
            for protocol in [
                libc::IPPROTO_MPTCP,
                libc::IPPROTO_UDPLITE,
                libc::IPPROTO_SCTP,
            ] {
                let protocol = protocol as u64;
                assert_eq!(socket(domain, libc::SOCK_STREAM, protocol), eperm);
                assert_eq!(socket(domain, libc::SOCK_DGRAM, protocol), eperm);
            }
            assert_eq!(socket(domain, libc::SOCK_DGRAM, tcp), eperm);
            assert_eq!(socket(domain, libc::SOCK_STREAM, udp), eperm);
        }
    }

    /// Syscalls the brief forbids outright (conditionally allowed ones are probed below).
    const FORBIDDEN: &[&str] = &[
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "unshare",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "swapoff",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "sethostname",
        "setdomainname",
        "acct",
        "quotactl",
        "syslog",
        "vhangup",
        "open_by_handle_at",
        "name_to_handle_at",
        "lookup_dcookie",
        "iopl",
        "ioperm",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "open_tree",
        "move_mount",
        "mount_setattr",
        "kcmp",
        "pidfd_getfd",
        "uselib",
        "fanotify_init",
        "lsm_set_self_attr",
        "clone3",
    ];

    #[derive(Clone, Copy, Debug)]
    enum Expect {
        /// The call succeeds.
        Success,
        /// The call fails with exactly this errno.
        Errno(i32),
        /// The filter lets the call through; the kernel may still refuse for its own reasons.
        NotErrno(i32),
    }

    struct Probe {
        name: &'static str,
        expect: Expect,
        call: fn() -> c_long,
    }

    /// Raw syscall for the probes, which run in a forked child.
    fn sys(nr: c_long, args: [c_ulong; 6]) -> c_long {
        // SAFETY: every probe passes only integers, null or invalid pointers (the kernel
        // fails those with EFAULT), pointers to static C strings, or pointers to live local
        // buffers of the size the syscall writes. None unmaps or remaps memory; the only
        // mapping probe asks for a fresh anonymous page at an address the kernel picks.
        unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) }
    }

    const NONE: c_ulong = c_ulong::MAX; // -1: an invalid descriptor, pid or flag set
    const DENY: Expect = Expect::Errno(libc::EPERM);

    /// Raw clone(2) with `flags` (no CLONE_VM, so it behaves like fork): if the filter let a
    /// namespace through, the new process leaves at once and is reaped.
    fn clone_with(flags: c_ulong) -> c_long {
        let rc = sys(
            libc::SYS_clone,
            [flags | libc::SIGCHLD as c_ulong, 0, 0, 0, 0, 0],
        );
        if rc == 0 {
            // SAFETY: _exit ends the accidental child without touching shared state.
            unsafe { libc::_exit(0) };
        }
        if rc > 0 {
            // SAFETY: reaps the child just created; a null status pointer is allowed.
            unsafe { libc::waitpid(rc as libc::pid_t, std::ptr::null_mut(), 0) };
        }
        rc
    }

    fn open_socket(domain: i32, ty: i32, protocol: i32) -> c_long {
        sys(
            libc::SYS_socket,
            [
                domain as c_ulong,
                ty as c_ulong,
                protocol as c_ulong,
                0,
                0,
                0,
            ],
        )
    }

    fn make_node(mode: libc::mode_t) -> c_long {
        let path = c"/nonexistent-corral-dir/node".as_ptr() as c_ulong;
        let dev = libc::makedev(1, 3) as c_ulong;
        sys(
            libc::SYS_mknodat,
            [libc::AT_FDCWD as c_ulong, path, mode as c_ulong, dev, 0, 0],
        )
    }

    /// A probe whose call is `$call`, made into a `fn` pointer.
    macro_rules! probe {
        ($name:expr, $expect:expr, $call:expr) => {
            Probe {
                name: $name,
                expect: $expect,
                call: || $call,
            }
        };
    }

    /// A probe of raw syscall `$nr` that the filter must deny with EPERM.
    macro_rules! deny {
        ($name:literal, $nr:expr, [$($arg:expr),*]) => {
            probe!($name, DENY, sys($nr, pad([$($arg as c_ulong),*])))
        };
    }

    /// Pads syscall arguments to six with zeros.
    fn pad<const N: usize>(args: [c_ulong; N]) -> [c_ulong; 6] {
        let mut all = [0; 6];
        all[..N].copy_from_slice(&args);
        all
    }

    /// Arguments are chosen so that, should the filter fail, the kernel rejects or ignores the
    /// call (bad pointers, bad descriptors, bad flags) even for root.
    fn probes() -> Vec<Probe> {
        use libc::*;
        #[allow(unused_mut)] // x86_64 adds its legacy syscalls below
        let mut probes = vec![
            deny!("ptrace", SYS_ptrace, [NONE, 0, 0, 0]),
            deny!("process_vm_readv", SYS_process_vm_readv, [0, 0, 0, 0, 0, 0]),
            deny!(
                "process_vm_writev",
                SYS_process_vm_writev,
                [0, 0, 0, 0, 0, 0]
            ),
            deny!("mount", SYS_mount, [0, 0, 0, 0, 0]),
            deny!("umount2", SYS_umount2, [0, 0]),
            deny!("pivot_root", SYS_pivot_root, [0, 0]),
            deny!("chroot", SYS_chroot, [0]),
            deny!("unshare", SYS_unshare, [CLONE_NEWUSER]),
            deny!("setns", SYS_setns, [NONE, 0]),
            deny!("keyctl", SYS_keyctl, [NONE, 0, 0, 0, 0]),
            deny!("add_key", SYS_add_key, [0, 0, 0, 0, 0]),
            deny!("request_key", SYS_request_key, [0, 0, 0, 0]),
            deny!("bpf", SYS_bpf, [NONE, 0, 0]),
            deny!(
                "perf_event_open",
                SYS_perf_event_open,
                [0, 0, NONE, NONE, 0]
            ),
            deny!("userfaultfd", SYS_userfaultfd, [0]),
            deny!("io_uring_setup", SYS_io_uring_setup, [0, 0]),
            deny!("io_uring_enter", SYS_io_uring_enter, [NONE, 0, 0, 0, 0, 0]),
            deny!("io_uring_register", SYS_io_uring_register, [NONE, 0, 0, 0]),
            deny!("init_module", SYS_init_module, [0, 0, 0]),
            deny!("finit_module", SYS_finit_module, [NONE, 0, 0]),
            deny!("delete_module", SYS_delete_module, [0, 0]),
            deny!("kexec_load", SYS_kexec_load, [0, 0, 0, NONE]),
            deny!(
                "kexec_file_load",
                SYS_kexec_file_load,
                [NONE, NONE, 0, 0, NONE]
            ),
            deny!("reboot", SYS_reboot, [0, 0, 0, 0]),
            deny!("swapon", SYS_swapon, [0, 0]),
            deny!("swapoff", SYS_swapoff, [0]),
            deny!("settimeofday", SYS_settimeofday, [0, 0]),
            deny!("clock_settime", SYS_clock_settime, [CLOCK_REALTIME, 0]),
            deny!("clock_adjtime", SYS_clock_adjtime, [CLOCK_REALTIME, 0]),
            deny!("adjtimex", SYS_adjtimex, [0]),
            deny!("sethostname", SYS_sethostname, [0, NONE]),
            deny!("setdomainname", SYS_setdomainname, [0, NONE]),
            deny!("acct", SYS_acct, [1]),
            deny!("quotactl", SYS_quotactl, [0, 0, 0, 0]),
            deny!("syslog", SYS_syslog, [10, 0, 0]),
            deny!("vhangup", SYS_vhangup, []),
            deny!("open_by_handle_at", SYS_open_by_handle_at, [NONE, 0, 0]),
            deny!(
                "name_to_handle_at",
                SYS_name_to_handle_at,
                [NONE, 0, 0, 0, 0]
            ),
            deny!("lookup_dcookie", SYS_lookup_dcookie, [0, 0, 0]),
            deny!("fsopen", SYS_fsopen, [0, 0]),
            deny!("fsconfig", SYS_fsconfig, [NONE, 0, 0, 0, 0]),
            deny!("fsmount", SYS_fsmount, [NONE, 0, 0]),
            deny!("fspick", SYS_fspick, [NONE, 0, 0]),
            deny!("open_tree", SYS_open_tree, [NONE, 0, 0]),
            deny!("move_mount", SYS_move_mount, [NONE, 0, NONE, 0, 0]),
            deny!("mount_setattr", SYS_mount_setattr, [NONE, 0, 0, 0, 0]),
            deny!("kcmp", SYS_kcmp, [0, 0, 0, 0, 0]),
            deny!("pidfd_getfd", SYS_pidfd_getfd, [NONE, NONE, 0]),
            deny!("fanotify_init", SYS_fanotify_init, [0, 0]),
            // Not in libc yet; numbers from 424 on are the same on every architecture.
            deny!("lsm_set_self_attr", 460, [0, 0, 0, 0]),
            deny!(
                "personality(ADDR_NO_RANDOMIZE)",
                SYS_personality,
                [ADDR_NO_RANDOMIZE]
            ),
            deny!("personality(PER_LINUX32)", SYS_personality, [0x0008]),
            // Stricter than Docker's default profile.
            deny!("setuid", SYS_setuid, [0]),
            deny!("capset", SYS_capset, [0, 0]),
            deny!("io_setup", SYS_io_setup, [0, 0]),
            deny!("mq_open", SYS_mq_open, [0, 0, 0, 0]),
            deny!("msgget", SYS_msgget, [0, 0]),
            deny!("vmsplice", SYS_vmsplice, [NONE, 0, 0, 0]),
            deny!("process_madvise", SYS_process_madvise, [NONE, 0, 0, 0, 0]),
            // The allow-list's EPERM is overridden by the later clone3 filter.
            probe!(
                "clone3",
                Expect::Errno(ENOSYS),
                sys(SYS_clone3, pad([0, 0]))
            ),
            probe!(
                "clone(CLONE_NEWUSER)",
                DENY,
                clone_with(CLONE_NEWUSER as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWNS)",
                DENY,
                clone_with(CLONE_NEWNS as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWPID)",
                DENY,
                clone_with(CLONE_NEWPID as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWNET)",
                DENY,
                clone_with(CLONE_NEWNET as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWUTS)",
                DENY,
                clone_with(CLONE_NEWUTS as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWIPC)",
                DENY,
                clone_with(CLONE_NEWIPC as c_ulong)
            ),
            probe!(
                "clone(CLONE_NEWCGROUP)",
                DENY,
                clone_with(CLONE_NEWCGROUP as c_ulong)
            ),
            probe!("clone(CLONE_NEWTIME)", DENY, clone_with(0x80)),
            // An invalid fd: the filter answers before the kernel looks at it, and a broken
            // filter cannot inject keystrokes into the terminal running the tests.
            deny!("ioctl(TIOCSTI)", SYS_ioctl, [NONE, TIOCSTI, 0]),
            deny!("ioctl(TIOCLINUX)", SYS_ioctl, [NONE, TIOCLINUX, 0]),
            deny!(
                "ioctl(TIOCSTI | 1 << 32)",
                SYS_ioctl,
                [NONE, (1 << 32) | TIOCSTI as c_ulong, 0]
            ),
            probe!(
                "socket(AF_PACKET)",
                DENY,
                open_socket(AF_PACKET, SOCK_RAW, 0)
            ),
            probe!(
                "socket(AF_INET, SOCK_RAW)",
                DENY,
                open_socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)
            ),
            probe!(
                "socket(AF_INET6, SOCK_RAW)",
                DENY,
                open_socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)
            ),
            probe!(
                "socket(AF_INET, SOCK_SEQPACKET)",
                DENY,
                open_socket(AF_INET, SOCK_SEQPACKET, 0)
            ),
            probe!(
                "socket(AF_NETLINK, NETLINK_AUDIT)",
                DENY,
                open_socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT)
            ),
            probe!(
                "socket(AF_VSOCK)",
                DENY,
                open_socket(AF_VSOCK, SOCK_STREAM, 0)
            ),
            probe!(
                "socket(AF_ALG)",
                DENY,
                open_socket(AF_ALG, SOCK_SEQPACKET, 0)
            ),
            deny!(
                "socketpair(AF_INET)",
                SYS_socketpair,
                [AF_INET, SOCK_STREAM, 0, 0]
            ),
            // AF_INET/AF_INET6 take protocol 0, TCP or UDP only: MPTCP, UDP-Lite, SCTP and
            // ping sockets are other protocol modules, each its own kernel attack surface.
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)",
                DENY,
                open_socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)
            ),
            probe!(
                "socket(AF_INET6, SOCK_STREAM, IPPROTO_MPTCP)",
                DENY,
                open_socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_MPTCP)
            ),
            probe!(
                "socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE)",
                DENY,
                open_socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE)
            ),
            probe!(
                "socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDPLITE)",
                DENY,
                open_socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK, IPPROTO_UDPLITE)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)",
                DENY,
                open_socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)
            ),
            probe!(
                "socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)",
                DENY,
                open_socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_UDP)",
                DENY,
                open_socket(AF_INET, SOCK_STREAM, IPPROTO_UDP)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP | 1 << 32)",
                DENY,
                sys(
                    SYS_socket,
                    pad([
                        AF_INET as c_ulong,
                        SOCK_STREAM as c_ulong,
                        (1 << 32) | IPPROTO_MPTCP as c_ulong
                    ])
                )
            ),
            probe!("mknodat(S_IFCHR)", DENY, make_node(S_IFCHR | 0o600)),
            probe!("mknodat(S_IFBLK)", DENY, make_node(S_IFBLK | 0o600)),
            probe!("mknodat(S_IFSOCK)", DENY, make_node(S_IFSOCK | 0o600)),
            // What must keep working.
            probe!("getpid", Expect::Success, sys(SYS_getpid, [0; 6])),
            probe!(
                "socket(AF_INET, SOCK_STREAM)",
                Expect::Success,
                open_socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_TCP)",
                Expect::Success,
                open_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, IPPROTO_TCP)
            ),
            probe!(
                "socket(AF_INET, SOCK_DGRAM, 0)",
                Expect::Success,
                open_socket(AF_INET, SOCK_DGRAM, 0)
            ),
            probe!(
                "socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP)",
                Expect::Success,
                open_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP)
            ),
            probe!(
                "socket(AF_INET6, SOCK_STREAM, IPPROTO_TCP)",
                Expect::NotErrno(EPERM),
                open_socket(AF_INET6, SOCK_STREAM, IPPROTO_TCP)
            ),
            probe!(
                "socket(AF_INET6, SOCK_DGRAM, 0)",
                Expect::NotErrno(EPERM),
                open_socket(AF_INET6, SOCK_DGRAM, 0)
            ),
            probe!(
                "socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDP)",
                Expect::NotErrno(EPERM),
                open_socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDP)
            ),
            probe!(
                "socket(AF_UNIX, SOCK_DGRAM)",
                Expect::Success,
                open_socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0)
            ),
            probe!(
                "socket(AF_INET6, SOCK_STREAM)",
                Expect::NotErrno(EPERM),
                open_socket(AF_INET6, SOCK_STREAM, 0)
            ),
            probe!(
                "socket(AF_NETLINK, NETLINK_ROUTE)",
                Expect::NotErrno(EPERM),
                open_socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE)
            ),
            Probe {
                name: "socketpair(AF_UNIX)",
                expect: Expect::Success,
                call: || {
                    let mut fds = [0 as c_int; 2];
                    sys(
                        SYS_socketpair,
                        pad([
                            AF_UNIX as c_ulong,
                            SOCK_STREAM as c_ulong,
                            0,
                            fds.as_mut_ptr() as c_ulong,
                        ]),
                    )
                },
            },
            // socketpair's protocol is left to the kernel: AF_UNIX takes only 0 (or PF_UNIX).
            Probe {
                name: "socketpair(AF_UNIX, SOCK_STREAM, IPPROTO_MPTCP)",
                expect: Expect::Errno(EPROTONOSUPPORT),
                call: || {
                    let mut fds = [0 as c_int; 2];
                    sys(
                        SYS_socketpair,
                        pad([
                            AF_UNIX as c_ulong,
                            SOCK_STREAM as c_ulong,
                            IPPROTO_MPTCP as c_ulong,
                            fds.as_mut_ptr() as c_ulong,
                        ]),
                    )
                },
            },
            Probe {
                name: "pipe2",
                expect: Expect::Success,
                call: || {
                    let mut fds = [0 as c_int; 2];
                    sys(
                        SYS_pipe2,
                        pad([fds.as_mut_ptr() as c_ulong, O_CLOEXEC as c_ulong]),
                    )
                },
            },
            Probe {
                name: "openat(/etc/hostname)",
                expect: Expect::Success,
                call: || {
                    sys(
                        SYS_openat,
                        pad([
                            AT_FDCWD as c_ulong,
                            c"/etc/hostname".as_ptr() as c_ulong,
                            O_RDONLY as c_ulong,
                        ]),
                    )
                },
            },
            Probe {
                name: "fork + wait",
                expect: Expect::Success,
                call: fork_and_wait,
            },
            probe!(
                "personality(query)",
                Expect::Success,
                sys(SYS_personality, pad([0xffff_ffff]))
            ),
            probe!(
                "prctl(PR_GET_NO_NEW_PRIVS)",
                Expect::Success,
                sys(SYS_prctl, pad([PR_GET_NO_NEW_PRIVS as c_ulong]))
            ),
            probe!(
                "ioctl(TCGETS)",
                Expect::Errno(EBADF),
                sys(SYS_ioctl, pad([NONE, TCGETS as c_ulong, 0]))
            ),
            probe!(
                "mknodat(S_IFIFO)",
                Expect::Errno(ENOENT),
                make_node(S_IFIFO | 0o600)
            ),
            probe!(
                "mknodat(S_IFREG)",
                Expect::Errno(ENOENT),
                make_node(S_IFREG | 0o600)
            ),
        ];
        #[cfg(target_arch = "x86_64")]
        probes.extend([
            deny!("iopl", SYS_iopl, [4]),
            deny!("ioperm", SYS_ioperm, [0, 0, 0]),
            deny!("uselib", SYS_uselib, [0]),
            deny!("modify_ldt", SYS_modify_ldt, [0, 0, 0]),
            Probe {
                name: "mknod(S_IFCHR)",
                expect: DENY,
                call: || {
                    sys(
                        SYS_mknod,
                        pad([
                            c"/nonexistent-corral-dir/node".as_ptr() as c_ulong,
                            (S_IFCHR | 0o600) as c_ulong,
                            makedev(1, 3) as c_ulong,
                        ]),
                    )
                },
            },
            Probe {
                name: "fork (x86_64 syscall)",
                expect: Expect::Success,
                call: || {
                    let rc = sys(SYS_fork, [0; 6]);
                    if rc == 0 {
                        // SAFETY: the new process leaves at once.
                        unsafe { libc::_exit(0) };
                    }
                    if rc > 0 {
                        // SAFETY: reaps the child just created; a null status pointer is allowed.
                        unsafe { libc::waitpid(rc as pid_t, std::ptr::null_mut(), 0) };
                    }
                    rc
                },
            },
        ]);
        probes
    }

    /// fork(3) (glibc uses clone(2)) and wait for a grandchild that exits with 7.
    fn fork_and_wait() -> c_long {
        // SAFETY: the grandchild only calls _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: see above.
            unsafe { libc::_exit(7) };
        }
        if pid < 0 {
            return -1;
        }
        let mut status = 0;
        // SAFETY: waits for our own child, writing into a local.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7 {
            0
        } else {
            -1
        }
    }

    /// Exit code of a probe child that could not install the filter.
    const INSTALL_FAILED: i32 = 90;

    /// Runs `probes` in a forked child under `programs`; returns one result per probe: 0 for
    /// success, else the errno.
    fn run_probes(programs: &[&[sock_filter]], probes: &[Probe]) -> Vec<i32> {
        let mut results = vec![0i32; probes.len()];
        let (read_end, write_end) = pipe().unwrap();
        // SAFETY: the test binary is multi-threaded, so the child sticks to async-signal-safe
        // operations: raw syscalls, fork/waitpid/write/_exit, and writes into memory that was
        // allocated before the fork. It never allocates, panics or returns.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                // SAFETY: plain syscalls with integer arguments. setsid detaches from the
                // terminal so a broken vhangup probe could not hang it up.
                unsafe {
                    libc::setsid();
                    libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                }
                if install(programs).is_err() {
                    // SAFETY: leaves the child without running the parent's exit handlers.
                    unsafe { libc::_exit(INSTALL_FAILED) };
                }
                for (slot, probe) in results.iter_mut().zip(probes) {
                    *slot = if (probe.call)() == -1 {
                        Errno::last_raw()
                    } else {
                        0
                    };
                }
                let len = std::mem::size_of_val(results.as_slice());
                // SAFETY: writes the initialized results buffer to our own pipe, then leaves.
                unsafe {
                    let written = libc::write(write_end.as_raw_fd(), results.as_ptr().cast(), len);
                    libc::_exit(if written == len as isize { 0 } else { 1 });
                }
            }
            ForkResult::Parent { child } => {
                drop(write_end);
                let mut bytes = Vec::new();
                std::fs::File::from(read_end)
                    .read_to_end(&mut bytes)
                    .unwrap();
                let status = waitpid(child, None).unwrap();
                assert_eq!(status, WaitStatus::Exited(child, 0), "probe child failed");
                assert_eq!(bytes.len(), std::mem::size_of_val(results.as_slice()));
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                    .collect()
            }
        }
    }

    fn check_probes(what: &str, programs: &[&[sock_filter]], probes: &[Probe]) {
        let results = run_probes(programs, probes);
        let failures: Vec<String> = probes
            .iter()
            .zip(&results)
            .filter(|(probe, &got)| match probe.expect {
                Expect::Success => got != 0,
                Expect::Errno(e) => got != e,
                Expect::NotErrno(e) => got == e,
            })
            .map(|(probe, &got)| {
                format!(
                    "{}: expected {:?}, got {}",
                    probe.name,
                    probe.expect,
                    Errno::from_raw(got)
                )
            })
            .collect();
        eprintln!(
            "{what}: {} probes, {} unexpected",
            probes.len(),
            failures.len()
        );
        assert!(
            failures.is_empty(),
            "{what} filter:\n{}",
            failures.join("\n")
        );
    }

    #[test]
    fn workload_filter_denies_what_it_must_and_allows_the_rest() {
        let probes = probes();
        // Every outright-forbidden syscall is probed, except those this arch does not have.
        let x86_only = ["iopl", "ioperm", "uselib"];
        for name in FORBIDDEN {
            let exists = cfg!(target_arch = "x86_64") || !x86_only.contains(name);
            let probed = probes.iter().any(|p| p.name == *name);
            assert!(probed || !exists, "{name} is not probed");
        }
        check_probes("workload", filters(Role::Workload), &probes);
    }

    /// A zygote keeps CAP_SETUID and CAP_SETGID (as root in the host's user namespace,
    /// rootless with subordinate ids in its own): its filter lets it take only ids of the
    /// sandbox range and drop its supplementary groups, never become root (or the caller)
    /// again.
    #[test]
    fn zygote_filter_confines_id_changes_to_the_sandbox_range() {
        use libc::*;
        const NO_CHANGE: c_ulong = u32::MAX as c_ulong;
        let probes = [
            probe!(
                "setresuid(0, 0, 0)",
                Expect::Errno(EPERM),
                sys(SYS_setresuid, [0; 6])
            ),
            probe!(
                "setresgid(0, 0, 0)",
                Expect::Errno(EPERM),
                sys(SYS_setresgid, [0; 6])
            ),
            probe!(
                "setresuid(-1, 0, -1)",
                Expect::Errno(EPERM),
                sys(SYS_setresuid, [NO_CHANGE, 0, NO_CHANGE, 0, 0, 0])
            ),
            probe!(
                "setresuid(BASE - 1, ...)",
                Expect::Errno(EPERM),
                sys(
                    SYS_setresuid,
                    [
                        (crate::ids::ROOT_MODE_ID_BASE - 1) as c_ulong,
                        NO_CHANGE,
                        NO_CHANGE,
                        0,
                        0,
                        0
                    ]
                )
            ),
            Probe {
                name: "setgroups(1, [0])",
                expect: Expect::Errno(EPERM),
                call: || {
                    let groups: [gid_t; 1] = [0];
                    sys(SYS_setgroups, [1, groups.as_ptr() as c_ulong, 0, 0, 0, 0])
                },
            },
            probe!(
                "setresuid(-1, -1, -1)",
                Expect::Success,
                sys(SYS_setresuid, [NO_CHANGE, NO_CHANGE, NO_CHANGE, 0, 0, 0])
            ),
            // The socket rules come from the workload profile the zygote extends.
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)",
                Expect::Errno(EPERM),
                open_socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)
            ),
            probe!(
                "socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDPLITE)",
                Expect::Errno(EPERM),
                open_socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDPLITE)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM, IPPROTO_TCP)",
                Expect::Success,
                open_socket(AF_INET, SOCK_STREAM, IPPROTO_TCP)
            ),
        ];
        check_probes("zygote", filters(Role::Zygote), &probes);
    }

    #[test]
    fn init_filter_allows_only_reaping() {
        use libc::*;
        let probes = [
            probe!("getpid", Expect::Success, sys(SYS_getpid, [0; 6])),
            Probe {
                name: "mmap(PROT_READ | PROT_WRITE)",
                expect: Expect::Success,
                call: || {
                    sys(
                        SYS_mmap,
                        [
                            0,
                            4096,
                            (PROT_READ | PROT_WRITE) as c_ulong,
                            (MAP_PRIVATE | MAP_ANONYMOUS) as c_ulong,
                            NONE,
                            0,
                        ],
                    )
                },
            },
            Probe {
                name: "mmap(PROT_EXEC)",
                expect: DENY,
                call: || {
                    sys(
                        SYS_mmap,
                        [
                            0,
                            4096,
                            (PROT_READ | PROT_EXEC) as c_ulong,
                            (MAP_PRIVATE | MAP_ANONYMOUS) as c_ulong,
                            NONE,
                            0,
                        ],
                    )
                },
            },
            probe!(
                "wait4",
                Expect::Errno(ECHILD),
                sys(SYS_wait4, [NONE, 0, WNOHANG as c_ulong, 0, 0, 0])
            ),
            probe!(
                "kill(0)",
                Expect::Success,
                sys(SYS_kill, [0, 0, 0, 0, 0, 0])
            ),
            deny!(
                "openat",
                SYS_openat,
                [AT_FDCWD, c"/etc/hostname".as_ptr(), O_RDONLY]
            ),
            deny!("execve", SYS_execve, [c"/bin/true".as_ptr(), 0, 0]),
            deny!("mprotect", SYS_mprotect, [0, 0, PROT_EXEC]),
            probe!("clone", DENY, clone_with(0)),
            probe!(
                "socket(AF_UNIX)",
                DENY,
                open_socket(AF_UNIX, SOCK_STREAM, 0)
            ),
            probe!(
                "socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC)",
                Expect::Success,
                open_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)
            ),
            probe!(
                "socket(AF_INET, SOCK_DGRAM)",
                DENY,
                open_socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)
            ),
            probe!(
                "socket(AF_INET6, SOCK_STREAM)",
                DENY,
                open_socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)
            ),
            probe!(
                "blocking socket(AF_INET, SOCK_STREAM)",
                DENY,
                open_socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)
            ),
            deny!("ptrace", SYS_ptrace, [NONE, 0, 0, 0]),
        ];
        check_probes("init", init_filters(), &probes);
    }

    /// Runs `cmd` under the workload filter (installed between fork and exec) with a timeout.
    fn run_sandboxed(mut cmd: Command) -> Output {
        let programs = filters(Role::Workload);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: the hook runs between fork and exec: prctl and `install` are raw syscalls
        // on precompiled programs and do not allocate.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                install(programs).map_err(|SeccompError(errno)| std::io::Error::from(errno))
            });
        }
        let child = cmd.spawn().unwrap();
        let pgid = child.id() as libc::pid_t;
        let (done, finished) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if finished.recv_timeout(Duration::from_secs(120)).is_err() {
                // SAFETY: signals the process group we created; it is not reaped yet.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
        });
        let output = child.wait_with_output().unwrap();
        let _ = done.send(());
        watchdog.join().unwrap();
        output
    }

    fn stdout_of(name: &str, cmd: Command) -> String {
        let output = run_sandboxed(cmd);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{name} failed under the workload filter: {:?}\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    const PYTHON: &str = r#"
import json, multiprocessing, socket, subprocess, threading
from concurrent.futures import ThreadPoolExecutor

def square(x):
    return x * x

if __name__ == "__main__":
    with multiprocessing.Pool(2) as pool:
        pooled = pool.map(square, range(5))
    with ThreadPoolExecutor(4) as executor:
        threaded = list(executor.map(square, range(5)))
    seen = []
    thread = threading.Thread(target=seen.append, args=("thread",))
    thread.start()
    thread.join()
    ls = subprocess.run(["ls", "/"], capture_output=True, check=True).stdout
    a, b = socket.socketpair()
    a.sendall(b"ping")
    print(json.dumps({"pool": pooled, "threads": threaded, "seen": seen, "ls": bool(ls), "pair": b.recv(4).decode()}))
"#;

    const NODE: &str = r#"
const { Worker } = require('worker_threads');
const { execSync } = require('child_process');
const worker = new Worker('require("worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
worker.on('message', (m) => {
  console.log(`worker ${m} ${execSync('echo hi').toString().trim()}`);
  worker.terminate();
});
"#;

    #[test]
    fn real_workloads_run_under_the_workload_filter() {
        let mut python = Command::new("/usr/bin/python3");
        python.args(["-c", PYTHON]);
        assert_eq!(
            stdout_of("python3", python).trim(),
            r#"{"pool": [0, 1, 4, 9, 16], "threads": [0, 1, 4, 9, 16], "seen": ["thread"], "ls": true, "pair": "ping"}"#
        );

        // scripts/setup installs Node.js: its absence is a broken set-up, not a reason to pass.
        let mut node = Command::new("/usr/bin/node");
        node.args(["-e", NODE]);
        assert_eq!(stdout_of("node", node).trim(), "worker 42 hi");

        let mut bash = Command::new("bash");
        bash.args(["-c", "ls / | grep -c . ; echo $((1+2)) | cat"]);
        let visible = std::fs::read_dir("/")
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(stdout_of("bash", bash), format!("{visible}\n3\n"));
    }
}
