//! Directory watchers of the E2B face (`files.watch_dir`), by polling: a watcher keeps what
//! its directory held at the last poll (a bounded listing from
//! [`Workspace::list_dir`](corral_sandbox::Workspace::list_dir), which never follows a link)
//! and each poll reports the difference as events.
//!
//! Why polling rather than inotify: inotify instances and watches are a per-user budget of the
//! host (`max_user_instances`, 128 by default, shared by every sandbox and the server itself),
//! and an inotify mark pins the sandbox's tmpfs after the sandbox has ended. A polling watcher
//! holds no kernel resource and no descriptor, only its last listing (at most
//! [`MAX_ENTRIES`](corral_sandbox::workspace::MAX_ENTRIES) entries, at most
//! [`MAX_WATCHERS`] per sandbox). The SDK itself polls (`get_new_events`), so a poll that
//! walks the directory answers the same question; what it cannot see is a change undone
//! between two polls (a file made and removed again), and several writes between two polls
//! are one `write`. An upload in progress is not seen: its hidden name
//! ([`UPLOAD_TEMP_PREFIX`]) is left out of every snapshot, so a finished upload is the `create`
//! or `write` of its own name, as it is for envd.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use corral_sandbox::workspace::{EntryInfo, EntryKind, UPLOAD_TEMP_PREFIX};

/// The most watchers one sandbox has at once.
pub const MAX_WATCHERS: usize = 8;

/// What a poll reports of one entry, as E2B's `EventType` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventKind {
    /// Gone (or its name now holds something of another kind).
    Remove,
    /// Gone from this name, and the same file (inode) is now at another name.
    Rename,
    Create,
    /// A file whose size or modification time changed, or that another file replaced
    /// (directories are not reported).
    Write,
    /// Permission bits changed.
    Chmod,
}

impl EventKind {
    /// The name of the `filesystem.EventType` value.
    pub fn proto_name(self) -> &'static str {
        match self {
            EventKind::Create => "EVENT_TYPE_CREATE",
            EventKind::Write => "EVENT_TYPE_WRITE",
            EventKind::Remove => "EVENT_TYPE_REMOVE",
            EventKind::Rename => "EVENT_TYPE_RENAME",
            EventKind::Chmod => "EVENT_TYPE_CHMOD",
        }
    }
}

/// What a listing said of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    ino: u64,
    kind: EntryKind,
    size: u64,
    modified: (i64, u32),
    mode: u32,
}

/// A directory's entries at one poll, by path relative to the directory.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<PathBuf, Seen>);

impl Snapshot {
    /// The snapshot of a listing of directory `dir` (entries' paths are relative to the
    /// workspace), without the uploads in progress.
    pub fn of(dir: &Path, entries: &[EntryInfo]) -> Snapshot {
        Snapshot(
            entries
                .iter()
                .filter(|e| !e.name().starts_with(UPLOAD_TEMP_PREFIX))
                .map(|e| {
                    let rel = e.path.strip_prefix(dir).unwrap_or(&e.path).to_path_buf();
                    let seen = Seen {
                        ino: e.ino,
                        kind: e.kind,
                        size: e.size,
                        modified: e.modified,
                        mode: e.mode,
                    };
                    (rel, seen)
                })
                .collect(),
        )
    }

    /// The events that lead from `self` to `now`: removals and renames, then creations,
    /// writes and mode changes, each group in path order.
    pub fn events_to(&self, now: &Snapshot) -> Vec<(PathBuf, EventKind)> {
        // The files now at a name that did not hold them before.
        let arrived: HashSet<(u64, EntryKind)> = now
            .0
            .iter()
            .filter(|(path, seen)| self.0.get(*path).is_none_or(|old| old.ino != seen.ino))
            .map(|(_, seen)| (seen.ino, seen.kind))
            .collect();
        // A file replaced by another file at its name (an upload, an editor's save) whose
        // old inode went nowhere else: written.
        let rewritten = |old: &Seen, new: &Seen| {
            old.ino != new.ino
                && old.kind == EntryKind::File
                && new.kind == EntryKind::File
                && !arrived.contains(&(old.ino, old.kind))
        };
        let mut events = Vec::new();
        for (path, old) in &self.0 {
            match now.0.get(path) {
                Some(new) if new.ino == old.ino && new.kind == old.kind => {}
                Some(new) if rewritten(old, new) => {}
                _ if arrived.contains(&(old.ino, old.kind)) => {
                    events.push((path.clone(), EventKind::Rename))
                }
                _ => events.push((path.clone(), EventKind::Remove)),
            }
        }
        for (path, new) in &now.0 {
            match self.0.get(path) {
                Some(old) if rewritten(old, new) => {
                    events.push((path.clone(), EventKind::Write));
                    if old.mode != new.mode {
                        events.push((path.clone(), EventKind::Chmod));
                    }
                }
                Some(old) if old.ino == new.ino && old.kind == new.kind => {
                    let written = (old.size, old.modified) != (new.size, new.modified);
                    if written && new.kind != EntryKind::Dir {
                        events.push((path.clone(), EventKind::Write));
                    }
                    if old.mode != new.mode {
                        events.push((path.clone(), EventKind::Chmod));
                    }
                }
                _ => events.push((path.clone(), EventKind::Create)),
            }
        }
        events
            .sort_by(|a, b| (a.1 > EventKind::Rename, &a.0).cmp(&(b.1 > EventKind::Rename, &b.0)));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, ino: u64, kind: EntryKind, size: u64, mtime: i64) -> EntryInfo {
        EntryInfo {
            path: PathBuf::from(path),
            kind,
            size,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            ino,
            modified: (mtime, 0),
            link_target: None,
        }
    }

    #[test]
    fn polls_report_what_changed_between_them() {
        use EntryKind::{Dir, File};
        let dir = Path::new("w");
        let before = Snapshot::of(
            dir,
            &[
                entry("w/kept", 1, File, 1, 10),
                entry("w/written", 2, File, 1, 10),
                entry("w/removed", 3, File, 1, 10),
                entry("w/moved", 4, File, 1, 10),
                entry("w/sub", 5, Dir, 0, 10),
                entry("w/replaced", 6, File, 1, 10),
                entry("w/retyped", 9, File, 1, 10),
            ],
        );
        let mut chmod = entry("w/kept", 1, File, 1, 10);
        chmod.mode = 0o100600;
        let after = Snapshot::of(
            dir,
            &[
                chmod,
                entry("w/written", 2, File, 5, 11),
                entry("w/sub", 5, Dir, 0, 11),
                entry("w/sub/moved", 4, File, 1, 10),
                entry("w/new", 7, File, 0, 12),
                entry("w/replaced", 8, File, 1, 10),
                entry("w/retyped", 10, Dir, 0, 10),
            ],
        );
        let events: Vec<(String, EventKind)> = before
            .events_to(&after)
            .into_iter()
            .map(|(p, k)| (p.display().to_string(), k))
            .collect();
        assert_eq!(
            events,
            [
                ("moved".into(), EventKind::Rename),
                ("removed".into(), EventKind::Remove),
                ("retyped".into(), EventKind::Remove),
                ("kept".into(), EventKind::Chmod),
                ("new".into(), EventKind::Create),
                ("replaced".into(), EventKind::Write),
                ("retyped".into(), EventKind::Create),
                ("sub/moved".into(), EventKind::Create),
                ("written".into(), EventKind::Write),
            ]
        );
        assert!(after.events_to(&after).is_empty());
    }

    #[test]
    fn an_upload_in_progress_is_not_seen_and_its_end_is_a_create_or_a_write() {
        use EntryKind::File;
        let dir = Path::new("w");
        let temp = format!("w/{UPLOAD_TEMP_PREFIX}abc");
        let before = Snapshot::of(dir, &[entry("w/old", 1, File, 1, 10)]);
        let during = Snapshot::of(
            dir,
            &[entry("w/old", 1, File, 1, 10), entry(&temp, 2, File, 3, 11)],
        );
        assert!(before.events_to(&during).is_empty());
        let after = Snapshot::of(
            dir,
            &[
                entry("w/old", 3, File, 5, 12),
                entry("w/new", 2, File, 3, 11),
            ],
        );
        let events: Vec<(String, EventKind)> = during
            .events_to(&after)
            .into_iter()
            .map(|(p, k)| (p.display().to_string(), k))
            .collect();
        assert_eq!(
            events,
            [
                ("new".into(), EventKind::Create),
                ("old".into(), EventKind::Write)
            ]
        );
    }
}
