//! The sandbox's root filesystem as a plan of mount operations.
//!
//! The plan is built in the host process (it only reads which image entries exist) and is
//! pure data, so what ends up visible inside a sandbox is unit-tested without privileges.
//! `init` executes it inside the new mount namespace.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};

use crate::spec::Rootfs;

/// Where the new root is assembled (a tmpfs mounted over it, in the sandbox's mount namespace only).
pub const NEW_ROOT: &str = "/tmp";

/// Top-level entries of the host image: the host's programs and libraries, nothing else.
const HOST_TOP_LEVEL: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Top-level entries of a directory image that are never bound: they are synthesized,
/// mounted fresh, or hold nothing a sandbox should see (`etc` is bound on its own).
pub const IMAGE_SKIPPED: [&str; 12] = [
    "dev",
    "proc",
    "sys",
    "tmp",
    "workspace",
    "run",
    "etc",
    "root",
    "home",
    "boot",
    "mnt",
    "media",
];

/// Host `/etc` entries that the host image binds read-only: needed by programs, never secret
/// (library cache, CA certificates, Debian's alternatives symlinks, fonts, matplotlib's rc).
pub const HOST_ETC_WHITELIST: [&str; 5] = [
    "ld.so.cache",
    "ssl",
    "alternatives",
    "fonts",
    "matplotlibrc",
];

/// Device nodes bound from the host's `/dev`.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// `/proc` entries hidden from the sandbox, files behind `/dev/null` and directories behind an
/// empty read-only tmpfs (those that do not exist on the host are skipped): they describe the
/// whole host, not the sandbox. `keys` would list the caller's own keys in rootless mode;
/// `1/cgroup` is init's, which stays in the host's cgroup, so its path would climb out of the
/// sandbox's cgroup namespace into the host's tree. The rest name the host: its boot line and
/// boot configuration, its kernel build, its hardware and drivers, its disks, its boot id.
/// `kallsyms` and `modules` show real kernel addresses to everyone on a host whose
/// `kptr_restrict` is 0 and `perf_event_paranoid` at most 1. Left readable on purpose:
/// `version` (it repeats `uname(2)`, which no mount hides), `cpuinfo`, `meminfo`, `stat`,
/// `loadavg`, `uptime` (runtimes size their pools from them; docs/threat-model.md §8), and
/// files only real root can read (`kmsg`, `slabinfo`, `vmallocinfo`, `pagetypeinfo`, ...).
const PROC_MASKED: [&str; 31] = [
    "timer_list",
    "sched_debug",
    "kcore",
    "keys",
    "1/cgroup",
    // The host's boot and kernel build.
    "cmdline",
    "bootconfig",
    "config.gz",
    "kallsyms",
    "modules",
    "sys/kernel/random/boot_id",
    // Its hardware and drivers.
    "iomem",
    "ioports",
    "interrupts",
    "devices",
    "misc",
    "consoles",
    "crypto",
    "buddyinfo",
    "zoneinfo",
    "bus",
    "irq",
    "driver",
    "acpi",
    "scsi",
    "asound",
    // Its disks and filesystems (`fs` has a directory per host disk: `fs/ext4/<disk>`).
    "partitions",
    "diskstats",
    "swaps",
    "fs",
    "mdstat",
];

/// Where [`crate::SandboxSpec::runtime_dir`] appears inside the sandbox.
pub const RUNTIME_DIR: &str = "/run/corral/lib";

pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
pub const HOSTNAME: &str = "corral";

/// What an image path is on the host, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Missing,
    Directory,
    File,
    Symlink(PathBuf),
}

impl Entry {
    pub fn of(path: &Path) -> Entry {
        match fs::symlink_metadata(path) {
            Err(_) => Entry::Missing,
            Ok(m) if m.file_type().is_symlink() => {
                fs::read_link(path).map_or(Entry::Missing, Entry::Symlink)
            }
            Ok(m) if m.is_dir() => Entry::Directory,
            Ok(_) => Entry::File,
        }
    }
}

/// One step of building the root. Paths are absolute paths *inside* the sandbox unless
/// named `source` (a host path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mkdir(PathBuf, u32),
    Symlink {
        link: PathBuf,
        target: PathBuf,
    },
    File {
        path: PathBuf,
        contents: Vec<u8>,
        mode: u32,
    },
    /// Recursive bind, then read-only, nosuid, nodev on the whole subtree.
    BindReadOnly {
        source: PathBuf,
        target: PathBuf,
    },
    /// A host directory shown read-only at `target` (an empty directory of the plan) as an
    /// overlay whose only other layer is `target` itself. Unlike a bind, whose entry in
    /// `/proc/self/mountinfo` names the source's path on its filesystem (the image store's
    /// path on the host), the overlay's entry names only the descriptors it was given
    /// (`lowerdir=/proc/self/fd/N:/proc/self/fd/M`). Not recursive: image directories have no
    /// mounts below them.
    OverlayReadOnly {
        source: PathBuf,
        target: PathBuf,
    },
    /// A host device node bound onto an empty file.
    BindDevice {
        source: PathBuf,
        target: PathBuf,
    },
    Tmpfs {
        target: PathBuf,
        size: u64,
        mode: u32,
        noexec: bool,
    },
    Proc(PathBuf),
    Devpts(PathBuf),
    /// Bind a path onto itself read-only (used for `/proc/sys`).
    ReadOnlySelf(PathBuf),
    /// Bind `/dev/null` over a file, or an empty read-only tmpfs over a directory; nothing
    /// when the path does not exist.
    Mask(PathBuf),
}

/// Builds the plan for `rootfs`; `lookup` tells what a host path is.
pub fn plan(
    rootfs: &Rootfs,
    disk_bytes: u64,
    run_files: &[(&str, &[u8])],
    mask_proc: bool,
    lookup: impl Fn(&Path) -> Entry,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let (image_root, top_level): (PathBuf, Vec<String>) = match rootfs {
        Rootfs::Host => (
            PathBuf::from("/"),
            HOST_TOP_LEVEL.iter().map(|s| s.to_string()).collect(),
        ),
        Rootfs::Directory(dir) => (dir.clone(), list_top_level(dir)),
    };
    for name in &top_level {
        let source = image_root.join(name);
        let target = Path::new("/").join(name);
        match lookup(&source) {
            Entry::Directory => {
                ops.push(Op::Mkdir(target.clone(), 0o755));
                ops.push(match rootfs {
                    // The same paths inside as outside: a bind shows nothing new, and keeps
                    // the host's mounts below them.
                    Rootfs::Host => Op::BindReadOnly { source, target },
                    Rootfs::Directory(_) => Op::OverlayReadOnly { source, target },
                });
            }
            Entry::Symlink(to) => ops.push(Op::Symlink {
                link: target,
                target: to,
            }),
            Entry::File | Entry::Missing => {}
        }
    }

    ops.push(Op::Mkdir("/etc".into(), 0o755));
    match rootfs {
        Rootfs::Host => {
            for (name, contents) in synthetic_etc() {
                ops.push(Op::File {
                    path: Path::new("/etc").join(name),
                    contents: contents.into_bytes(),
                    mode: 0o644,
                });
            }
            ops.push(Op::Symlink {
                link: "/etc/localtime".into(),
                target: "/usr/share/zoneinfo/Etc/UTC".into(),
            });
            for name in HOST_ETC_WHITELIST {
                let source = Path::new("/etc").join(name);
                match lookup(&source) {
                    Entry::Directory => {
                        ops.push(Op::Mkdir(source.clone(), 0o755));
                        ops.push(Op::BindReadOnly {
                            target: source.clone(),
                            source,
                        });
                    }
                    Entry::File => {
                        ops.push(Op::File {
                            path: source.clone(),
                            contents: Vec::new(),
                            mode: 0o644,
                        });
                        ops.push(Op::BindReadOnly {
                            target: source.clone(),
                            source,
                        });
                    }
                    Entry::Symlink(to) => ops.push(Op::Symlink {
                        link: source,
                        target: to,
                    }),
                    Entry::Missing => {}
                }
            }
        }
        Rootfs::Directory(dir) => ops.push(Op::OverlayReadOnly {
            source: dir.join("etc"),
            target: "/etc".into(),
        }),
    }

    ops.push(Op::Mkdir("/dev".into(), 0o755));
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        ops.push(Op::File {
            path: path.clone(),
            contents: Vec::new(),
            mode: 0o666,
        });
        ops.push(Op::BindDevice {
            source: path.clone(),
            target: path,
        });
    }
    ops.push(Op::Mkdir("/dev/pts".into(), 0o755));
    ops.push(Op::Devpts("/dev/pts".into()));
    ops.push(Op::Mkdir("/dev/shm".into(), 0o1777));
    ops.push(Op::Tmpfs {
        target: "/dev/shm".into(),
        size: disk_bytes,
        mode: 0o1777,
        noexec: true,
    });
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(Op::Symlink {
            link: Path::new("/dev").join(link),
            target: target.into(),
        });
    }

    ops.push(Op::Mkdir("/proc".into(), 0o555));
    ops.push(Op::Proc("/proc".into()));
    if mask_proc {
        ops.extend(proc_protection());
    }

    for (dir, mode) in [("/tmp", 0o1777), ("/workspace", 0o755)] {
        ops.push(Op::Mkdir(dir.into(), mode));
        ops.push(Op::Tmpfs {
            target: dir.into(),
            size: disk_bytes,
            mode,
            noexec: false,
        });
    }

    ops.push(Op::Mkdir("/run".into(), 0o755));
    ops.push(Op::Mkdir("/run/corral".into(), 0o755));
    for (name, contents) in run_files {
        let path = Path::new("/run/corral").join(name);
        ops.push(Op::File {
            path,
            contents: contents.to_vec(),
            mode: 0o444,
        });
    }
    ops
}

/// The filesystems a session forked from a zygote mounts over the zygote's (whose root has
/// the mount points already): its own devpts, `/dev/shm`, `/proc` with the one-shot
/// protections, `/tmp` and `/workspace`.
pub fn session_plan(disk_bytes: u64) -> Vec<Op> {
    let mut ops = vec![
        Op::Devpts("/dev/pts".into()),
        Op::Tmpfs {
            target: "/dev/shm".into(),
            size: disk_bytes,
            mode: 0o1777,
            noexec: true,
        },
        Op::Proc("/proc".into()),
    ];
    ops.extend(proc_protection());
    for (dir, mode) in [("/tmp", 0o1777), ("/workspace", 0o755)] {
        ops.push(Op::Tmpfs {
            target: dir.into(),
            size: disk_bytes,
            mode,
            noexec: false,
        });
    }
    ops
}

/// Binds the directory open at `dir` (an `O_PATH` descriptor init opened before the new root
/// hid its path) read-only at [`RUNTIME_DIR`] in the new root.
pub fn bind_runtime_dir(dir: BorrowedFd<'_>, new_root: &Path) -> io::Result<()> {
    execute(
        &[
            Op::Mkdir(RUNTIME_DIR.into(), 0o755),
            Op::OverlayReadOnly {
                source: format!("/proc/self/fd/{}", dir.as_raw_fd()).into(),
                target: RUNTIME_DIR.into(),
            },
        ],
        new_root,
    )
}

/// `/proc/sys` read-only and the host-wide `/proc` files hidden.
pub fn proc_protection() -> Vec<Op> {
    let mut ops = vec![Op::ReadOnlySelf("/proc/sys".into())];
    ops.extend(
        PROC_MASKED
            .iter()
            .map(|name| Op::Mask(Path::new("/proc").join(name))),
    );
    ops
}

fn list_top_level(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !IMAGE_SKIPPED.contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The identity files of the host image: they name the sandbox user and nothing of the host.
fn synthetic_etc() -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n\
                 sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/workspace:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"),
        ),
        ("hostname", format!("{HOSTNAME}\n")),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
        ("resolv.conf", String::new()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n\
             protocols: files\nservices: files\n"
                .to_string(),
        ),
    ]
}

/// Runs the plan with `new_root` as the sandbox's `/`. Every error names the step.
pub fn execute(ops: &[Op], new_root: &Path) -> io::Result<()> {
    // Modes are created exactly as planned (sticky bits, 0o666 devices), without a chmod each.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let result = ops.iter().try_for_each(|op| {
        execute_one(op, new_root).map_err(|e| io::Error::new(e.kind(), format!("{op:?}: {e}")))
    });
    nix::sys::stat::umask(umask);
    result
}

fn inside(new_root: &Path, path: &Path) -> PathBuf {
    new_root.join(path.strip_prefix("/").unwrap_or(path))
}

fn execute_one(op: &Op, root: &Path) -> io::Result<()> {
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    match op {
        Op::Mkdir(path, mode) => {
            let p = inside(root, path);
            match fs::DirBuilder::new().mode(*mode).create(&p) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            }
        }
        Op::Symlink { link, target } => std::os::unix::fs::symlink(target, inside(root, link)),
        Op::File {
            path,
            contents,
            mode,
        } => {
            let p = inside(root, path);
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(*mode)
                .open(&p)
                .and_then(|mut f| io::Write::write_all(&mut f, contents))
        }
        Op::BindReadOnly { source, target } => {
            let t = inside(root, target);
            mount(
                Some(source.as_path()),
                &t,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            crate::sys::make_read_only(&t)
        }
        Op::OverlayReadOnly { source, target } => {
            let t = inside(root, target);
            let open = |path: &Path| {
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(path)
            };
            let (lower, empty) = (open(source)?, open(&t)?);
            let data = format!(
                "lowerdir=/proc/self/fd/{}:/proc/self/fd/{}",
                lower.as_raw_fd(),
                empty.as_raw_fd()
            );
            mount(
                Some("overlay"),
                &t,
                Some("overlay"),
                MsFlags::MS_RDONLY | nosuid_nodev,
                Some(data.as_str()),
            )
            .map_err(io::Error::from)
        }
        Op::BindDevice { source, target } => mount(
            Some(source.as_path()),
            &inside(root, target),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(io::Error::from),
        Op::Tmpfs {
            target,
            size,
            mode,
            noexec,
        } => {
            let mut flags = nosuid_nodev;
            if *noexec {
                flags |= MsFlags::MS_NOEXEC;
            }
            let data = format!("size={size},mode={mode:o},nr_inodes=65536");
            mount(
                Some("tmpfs"),
                &inside(root, target),
                Some("tmpfs"),
                flags,
                Some(data.as_str()),
            )
            .map_err(io::Error::from)
        }
        Op::Proc(target) => mount(
            Some("proc"),
            &inside(root, target),
            Some("proc"),
            nosuid_nodev | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(io::Error::from),
        Op::Devpts(target) => mount(
            Some("devpts"),
            &inside(root, target),
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620,max=64"),
        )
        .map_err(io::Error::from),
        Op::ReadOnlySelf(path) => {
            let p = inside(root, path);
            mount(
                Some(p.as_path()),
                &p,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            crate::sys::make_read_only(&p)
        }
        Op::Mask(path) => {
            let p = inside(root, path);
            match fs::symlink_metadata(&p) {
                Err(_) => Ok(()),
                Ok(m) if m.is_dir() => mount(
                    Some("tmpfs"),
                    &p,
                    Some("tmpfs"),
                    nosuid_nodev | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
                    Some("size=4k,nr_inodes=2,mode=555"),
                )
                .map_err(io::Error::from),
                Ok(_) => mount(
                    Some(inside(root, Path::new("/dev/null")).as_path()),
                    &p,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(io::Error::from),
            }
        }
    }
}

/// A path as a C string (paths never contain NUL on Linux).
pub fn cstring(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("paths have no NUL byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A merged-/usr host like Debian 12: /bin, /lib, /lib64, /sbin are symlinks into /usr.
    fn debian_host(path: &Path) -> Entry {
        match path.to_str().unwrap() {
            "/usr" | "/etc/ssl" | "/etc/alternatives" => Entry::Directory,
            "/bin" => Entry::Symlink("usr/bin".into()),
            "/sbin" => Entry::Symlink("usr/sbin".into()),
            "/lib" => Entry::Symlink("usr/lib".into()),
            "/lib64" => Entry::Symlink("usr/lib64".into()),
            "/etc/ld.so.cache" => Entry::File,
            _ => Entry::Missing,
        }
    }

    fn host_plan() -> Vec<Op> {
        plan(
            &Rootfs::Host,
            1 << 20,
            &[("main.py", b"print(1)")],
            true,
            debian_host,
        )
    }

    #[test]
    fn host_image_binds_only_programs_and_libraries_read_only() {
        let ops = host_plan();
        let binds: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                Op::BindReadOnly { source, .. } => Some(source.to_str().unwrap()),
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            ["/usr", "/etc/ld.so.cache", "/etc/ssl", "/etc/alternatives"]
        );
        assert!(ops.contains(&Op::Symlink {
            link: "/bin".into(),
            target: "usr/bin".into()
        }));
    }

    #[test]
    fn nothing_secret_from_the_host_is_planned() {
        let ops = host_plan();
        for op in &ops {
            if let Op::BindReadOnly { source, .. } | Op::BindDevice { source, .. } = op {
                for secret in [
                    "/etc/shadow",
                    "/etc/passwd",
                    "/root",
                    "/home",
                    "/run",
                    "/var",
                    "/sys",
                    "/proc",
                    "/tmp",
                ] {
                    assert!(
                        !source.starts_with(secret),
                        "host {} is bound",
                        source.display()
                    );
                }
            }
        }
        let passwd = ops
            .iter()
            .find_map(|op| match op {
                Op::File { path, contents, .. } if path == Path::new("/etc/passwd") => {
                    Some(String::from_utf8(contents.clone()).unwrap())
                }
                _ => None,
            })
            .unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000:sandbox:/workspace:/bin/bash"));
        assert!(!passwd.contains("corral-test") && !passwd.contains(":/root:/bin/bash"));
    }

    #[test]
    fn writable_mounts_are_size_limited_tmpfs() {
        let ops = host_plan();
        let tmpfs: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Tmpfs { target, size, .. } => Some((target.to_str().unwrap(), *size)),
                _ => None,
            })
            .collect();
        assert_eq!(
            tmpfs,
            [
                ("/dev/shm", 1 << 20),
                ("/tmp", 1 << 20),
                ("/workspace", 1 << 20)
            ]
        );
    }

    #[test]
    fn proc_is_fresh_with_sys_read_only_and_host_wide_files_masked() {
        let ops = host_plan();
        let proc_at = ops
            .iter()
            .position(|o| *o == Op::Proc("/proc".into()))
            .unwrap();
        let ro_at = ops
            .iter()
            .position(|o| *o == Op::ReadOnlySelf("/proc/sys".into()))
            .unwrap();
        assert!(proc_at < ro_at);
        assert!(ops.contains(&Op::Mask("/proc/timer_list".into())));
        for host_wide in [
            "cmdline",
            "config.gz",
            "kallsyms",
            "partitions",
            "bus",
            "fs",
        ] {
            let mask = Op::Mask(Path::new("/proc").join(host_wide));
            let at = ops.iter().position(|o| *o == mask).unwrap();
            assert!(proc_at < at);
        }
        let boot_id = Op::Mask("/proc/sys/kernel/random/boot_id".into());
        assert!(ro_at < ops.iter().position(|o| *o == boot_id).unwrap());
        assert!(!format!("{ops:?}").contains("\"/sys\""));
    }

    #[test]
    fn sessions_get_the_one_shot_proc_protection() {
        let protection = |ops: &[Op]| -> Vec<Op> {
            ops.iter()
                .filter(|o| matches!(o, Op::Mask(_) | Op::ReadOnlySelf(_)))
                .cloned()
                .collect()
        };
        let one_shot = protection(&host_plan());
        assert_eq!(protection(&session_plan(1 << 20)), one_shot);
        assert!(one_shot.contains(&Op::Mask("/proc/cmdline".into())));
    }

    #[test]
    fn zygote_proc_is_unmasked_so_sessions_can_mount_their_own() {
        let ops = plan(&Rootfs::Host, 1 << 20, &[], false, debian_host);
        assert!(ops.contains(&Op::Proc("/proc".into())));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, Op::Mask(_) | Op::ReadOnlySelf(_))));
    }

    #[test]
    fn program_file_is_read_only() {
        let ops = host_plan();
        assert!(ops.contains(&Op::File {
            path: "/run/corral/main.py".into(),
            contents: b"print(1)".to_vec(),
            mode: 0o444
        }));
    }

    #[test]
    fn directory_image_overlays_its_etc_and_skips_host_state_dirs() {
        let image = tempfile::tempdir().unwrap();
        for d in ["usr", "etc", "var", "home", "root", "proc", "opt"] {
            fs::create_dir(image.path().join(d)).unwrap();
        }
        std::os::unix::fs::symlink("usr/bin", image.path().join("bin")).unwrap();
        let ops = plan(
            &Rootfs::Directory(image.path().to_path_buf()),
            1 << 20,
            &[],
            true,
            Entry::of,
        );
        // Overlays, not binds: a bind's mount table entry would name the image store's path.
        let shown: Vec<_> = ops
            .iter()
            .filter_map(|op| match op {
                Op::OverlayReadOnly { target, .. } => Some(target.to_str().unwrap()),
                Op::BindReadOnly { .. } => panic!("an image directory is bound: {op:?}"),
                _ => None,
            })
            .collect();
        assert_eq!(shown, ["/opt", "/usr", "/var", "/etc"]);
        assert!(ops.contains(&Op::Symlink {
            link: "/bin".into(),
            target: "usr/bin".into()
        }));
    }
}
