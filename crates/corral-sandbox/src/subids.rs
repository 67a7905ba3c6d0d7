//! The caller's subordinate ids (`/etc/subuid`, `/etc/subgid`) and the setuid helpers that
//! map them into a user namespace (`newuidmap`, `newgidmap`, Debian's `uidmap` package):
//! what gives each rootless sandbox a host uid and gid of its own ([`crate::ids`]).
//!
//! Only the system's own files and helpers are used, at fixed paths: nothing of the caller's
//! environment (`PATH`, a file named in a variable) decides which helper runs or which ids a
//! sandbox gets.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::Pid;

pub const SUBUID_FILE: &str = "/etc/subuid";
pub const SUBGID_FILE: &str = "/etc/subgid";
/// Where the helpers are looked for, in this order (never through `PATH`).
pub const HELPER_DIRS: [&str; 3] = ["/usr/bin", "/bin", "/usr/sbin"];
/// The fewest subordinate ids a range must hold to be used: one per live sandbox, zygote and
/// session of the user's Corral processes.
pub const MIN_IDS: u32 = 1024;
/// The most of a helper's error output kept in an error.
const HELPER_STDERR_KEPT: usize = 1024;

/// `count` consecutive ids from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u32,
    pub count: u32,
}

impl Range {
    /// One past the last id (at most `u32::MAX`, which is no id: `(uid_t)-1`).
    pub fn end(&self) -> u64 {
        u64::from(self.start) + u64::from(self.count)
    }

    fn contains(&self, id: u32) -> bool {
        (u64::from(self.start)..self.end()).contains(&u64::from(id))
    }

    fn overlaps(&self, other: &Range) -> bool {
        u64::from(self.start) < other.end() && u64::from(other.start) < self.end()
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.start, self.end() - 1)
    }
}

/// A line of a subordinate id file that is not `owner:start:count`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: &'static str,
}

/// The ranges of a subordinate id file (`/etc/subuid` or `/etc/subgid`) that belong to the
/// user `name` (when the user has one) or `uid` (the file may name an owner either way), in
/// the file's order. Strict and total: every line other than an empty one or a `#` comment
/// must be `owner:start:count`, with an owner that is not empty, decimal numbers without
/// sign, space or leading `+`, `count` at least 1 and the range ending at `u32::MAX` at the
/// latest; any other line makes the whole file an error (it says which line), whoever's it is.
pub fn parse(text: &[u8], name: Option<&str>, uid: u32) -> Result<Vec<Range>, ParseError> {
    let uid = uid.to_string();
    let mut ranges = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let fail = |reason| ParseError {
            line: i + 1,
            reason,
        };
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let line = std::str::from_utf8(line).map_err(|_| fail("not UTF-8"))?;
        let fields: Vec<&str> = line.split(':').collect();
        let [owner, start, count] = fields[..] else {
            return Err(fail("not owner:start:count"));
        };
        if owner.is_empty() {
            return Err(fail("no owner"));
        }
        let number = |field: &str| {
            if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail("a start or count that is not a decimal number"));
            }
            field
                .parse::<u32>()
                .map_err(|_| fail("a start or count over 4294967295"))
        };
        let range = Range {
            start: number(start)?,
            count: number(count)?,
        };
        if range.count == 0 {
            return Err(fail("an empty range"));
        }
        if range.end() > u64::from(u32::MAX) {
            return Err(fail("a range past the last id (4294967294)"));
        }
        if Some(owner) == name || owner == uid {
            ranges.push(range);
        }
    }
    Ok(ranges)
}

/// The first of `ranges` that Corral may lease sandboxes from: at least [`MIN_IDS`] ids, none
/// of them root's, the caller's own `own` or one of `reserved` (the ids root-mode Corral
/// gives its sandboxes). Else why none is.
pub fn choose(ranges: &[Range], own: u32, reserved: Range) -> Result<Range, String> {
    if ranges.is_empty() {
        return Err("no range".into());
    }
    ranges
        .iter()
        .find(|r| {
            r.count >= MIN_IDS && !r.contains(0) && !r.contains(own) && !r.overlaps(&reserved)
        })
        .copied()
        .ok_or_else(|| {
            let shown: Vec<String> = ranges.iter().map(Range::to_string).collect();
            format!(
                "no range of at least {MIN_IDS} ids that leaves out root, the user's own id and \
                 root-mode Corral's {reserved} (has {})",
                shown.join(", ")
            )
        })
}

/// Reads `file` and chooses the range of the user `name` or `uid` in it ([`parse`]) that
/// leaves out `own`, the user's own id of the file's kind ([`choose`]).
pub fn range_in(
    file: &Path,
    name: Option<&str>,
    uid: u32,
    own: u32,
    reserved: Range,
) -> Result<Range, String> {
    let text = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let ranges = parse(&text, name, uid).map_err(|e| format!("{}: {e}", file.display()))?;
    choose(&ranges, own, reserved).map_err(|why| {
        let who = name.map_or_else(|| format!("uid {uid}"), |n| format!("{n} (uid {uid})"));
        format!("{}: {why} for {who}", file.display())
    })
}

/// The helper `name` in the first of `dirs` that has it, as a canonical path, if it is a
/// regular file owned by root, writable by root alone, and privileged: setuid, or carrying
/// file capabilities (`security.capability`, as some distributions install it). Else why not.
pub fn find_helper(name: &str, dirs: &[&str]) -> Result<PathBuf, String> {
    let Some(found) = dirs
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
    else {
        return Err(format!(
            "no {name} in {} (Debian's uidmap package installs it)",
            dirs.join(", ")
        ));
    };
    let path = found
        .canonicalize()
        .map_err(|e| format!("{}: {e}", found.display()))?;
    let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let shown = path.display();
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(format!("{shown} is not owned and writable by root alone"));
    }
    if meta.mode() & 0o4000 == 0 && !has_file_capabilities(&path) {
        return Err(format!(
            "{shown} is neither setuid root nor has file capabilities: it cannot map ids"
        ));
    }
    Ok(path)
}

fn has_file_capabilities(path: &Path) -> bool {
    let path = crate::rootfs::cstring(path);
    // SAFETY: both strings are NUL-terminated; with size 0 the kernel writes nothing and
    // returns the attribute's size.
    let size = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    size > 0
}

/// A helper that did not map the ids.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("starting {}: {source}", helper.display())]
    Start {
        helper: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} {args} failed ({status}): {stderr}", helper.display())]
    Failed {
        helper: PathBuf,
        args: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// A helper started for one process: [`Mapping::finish`] waits for it.
pub struct Mapping {
    helper: PathBuf,
    args: Vec<String>,
    child: std::process::Child,
}

impl Mapping {
    /// Starts `helper` (newuidmap or newgidmap) to give the user namespace of `pid` the map
    /// `lines` (inside, outside, count), with an empty environment.
    pub fn start(helper: &Path, pid: Pid, lines: &[(u32, u32, u32)]) -> Result<Mapping, MapError> {
        let mut args = vec![pid.to_string()];
        for (inside, outside, count) in lines {
            args.extend([inside, outside, count].map(u32::to_string));
        }
        let child = Command::new(helper)
            .args(&args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| MapError::Start {
                helper: helper.to_path_buf(),
                source,
            })?;
        Ok(Mapping {
            helper: helper.to_path_buf(),
            args,
            child,
        })
    }

    /// Waits for the helper; an error unless it exited 0.
    pub fn finish(self) -> Result<(), MapError> {
        let output = self
            .child
            .wait_with_output()
            .map_err(|source| MapError::Start {
                helper: self.helper.clone(),
                source,
            })?;
        if output.status.success() {
            return Ok(());
        }
        let kept = &output.stderr[..output.stderr.len().min(HELPER_STDERR_KEPT)];
        Err(MapError::Failed {
            helper: self.helper,
            args: self.args.join(" "),
            status: output.status,
            stderr: String::from_utf8_lossy(kept).trim().to_string(),
        })
    }
}

/// Maps `uids` and `gids` (inside, outside, count) into the user namespace of `pid`, both
/// helpers running at once. The first failure is returned (the other helper is still waited
/// for).
pub fn map(
    newuidmap: &Path,
    newgidmap: &Path,
    pid: Pid,
    uids: &[(u32, u32, u32)],
    gids: &[(u32, u32, u32)],
) -> Result<(), MapError> {
    let uid_map = Mapping::start(newuidmap, pid, uids)?;
    let gid_map = Mapping::start(newgidmap, pid, gids);
    let uid_done = uid_map.finish();
    uid_done.and(gid_map?.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_RANGE: Range = Range {
        start: 1_000_000_000,
        count: 65_536,
    };

    fn r(start: u32, count: u32) -> Range {
        Range { start, count }
    }

    #[test]
    fn the_users_ranges_are_found_by_name_or_uid_in_file_order() {
        let text = b"# comment\n\nalice:100000:65536\nbob:165536:65536\n1000:231072:2048\nalice:300000:10\n";
        assert_eq!(
            parse(text, Some("alice"), 1000).unwrap(),
            [r(100000, 65536), r(231072, 2048), r(300000, 10)]
        );
        assert_eq!(parse(text, Some("bob"), 1001).unwrap(), [r(165536, 65536)]);
        assert_eq!(parse(text, None, 1000).unwrap(), [r(231072, 2048)]);
        assert_eq!(parse(text, Some("carol"), 1002).unwrap(), []);
        assert_eq!(parse(b"", Some("alice"), 1000).unwrap(), []);
        // A name that is a number is a name too; no prefix or partial match.
        assert_eq!(
            parse(b"alice2:1:1\nalic:1:1\n", Some("alice"), 7).unwrap(),
            []
        );
        assert_eq!(
            parse(b"x:4294967294:1\n", Some("x"), 7).unwrap(),
            [r(4294967294, 1)]
        );
    }

    #[test]
    fn any_malformed_line_rejects_the_file_and_says_which() {
        for (text, line) in [
            (&b"alice:100000\n"[..], 1),
            (b"alice:100000:65536:1\n", 1),
            (b"ok:1:1\n:100000:65536\n", 2),
            (b"alice: 100000:65536\n", 1),
            (b"alice:100000:65536 \n", 1),
            (b"alice:+100000:65536\n", 1),
            (b"alice:-1:65536\n", 1),
            (b"alice:0x10:65536\n", 1),
            (b"alice::65536\n", 1),
            (b"alice:100000:0\n", 1),
            (b"alice:4294967296:1\n", 1),
            (b"alice:4294967295:1\n", 1),
            (b"alice:4294967000:1000\n", 1),
            (b"bob:1:1\nalice:\xff:1\n", 2),
            (b"alice:100000:65536\r\n", 1),
            (b" # not a comment\n", 1),
        ] {
            let err = parse(text, Some("alice"), 1000).unwrap_err();
            assert_eq!(err.line, line, "{:?}: {err}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn a_range_is_used_only_if_it_is_big_enough_and_holds_nobody_elses_ids() {
        let ok = r(100000, 65536);
        assert_eq!(choose(&[ok], 1000, ROOT_RANGE), Ok(ok));
        // The first usable one, skipping what is too small or holds another's ids.
        for bad in [
            r(200000, MIN_IDS - 1),
            r(0, 65536),
            r(900, 200),
            r(999_990_000, 20_000),
            r(1_000_065_535, 2048),
        ] {
            assert_eq!(choose(&[bad, ok], 1000, ROOT_RANGE), Ok(ok), "{bad}");
            assert!(choose(&[bad], 1000, ROOT_RANGE).is_err(), "{bad}");
        }
        assert_eq!(
            choose(&[r(1_000_065_536, MIN_IDS)], 1000, ROOT_RANGE),
            Ok(r(1_000_065_536, MIN_IDS))
        );
        assert_eq!(choose(&[], 1000, ROOT_RANGE), Err("no range".into()));
    }

    #[test]
    fn helpers_must_be_privileged_files_of_root() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().to_str().unwrap()];
        assert!(find_helper("newuidmap", &dirs)
            .unwrap_err()
            .contains("no newuidmap"));
        let path = dir.path().join("newuidmap");
        std::fs::write(&path, b"").unwrap();
        let set_mode = |mode| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        set_mode(0o4755);
        if !nix::unistd::geteuid().is_root() {
            assert!(find_helper("newuidmap", &dirs)
                .unwrap_err()
                .contains("root"));
            return;
        }
        assert_eq!(
            find_helper("newuidmap", &dirs).unwrap(),
            path.canonicalize().unwrap()
        );
        set_mode(0o755);
        assert!(find_helper("newuidmap", &dirs)
            .unwrap_err()
            .contains("neither setuid"));
        set_mode(0o4775);
        assert!(find_helper("newuidmap", &dirs)
            .unwrap_err()
            .contains("root alone"));
        set_mode(0o4755);
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(1)), None).unwrap();
        assert!(find_helper("newuidmap", &dirs)
            .unwrap_err()
            .contains("root alone"));
    }
}
