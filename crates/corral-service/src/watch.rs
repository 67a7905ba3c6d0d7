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
//!
//! A scan costs CPU in proportion to its directory (up to `MAX_ENTRIES` entries), and a key
//! may have many watchers in many sandboxes: every scan takes a turn ([`Scans`]) of a pool
//! shared between keys (corral-share: `max_watch_scans` in all, one a key, every key's one
//! out of a reserve above them), and a key keeps its turn after its scan for
//! `1 / watch_scan_share - 1` times as long as the scan took, so that all of one key's scans
//! take at most `watch_scan_share` of a core, and all keys' at most
//! `max_watch_scans + reserve` times that. A scan without a turn is put off, never
//! lost: the next one reports what changed since the last.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_sandbox::workspace::{EntryInfo, EntryKind, UPLOAD_TEMP_PREFIX};
use corral_share::{Grant, Pool};

use crate::config::Config;

/// The most watchers one sandbox has at once.
pub const MAX_WATCHERS: usize = 8;

/// The longest a key keeps its turn after one scan, whatever the scan took.
const MAX_REST: Duration = Duration::from_secs(60);
/// How often a caller that waits for a turn looks again.
const TURN_RETRY: Duration = Duration::from_millis(20);

/// The turns of watcher scans, shared between keys (see the module's documentation).
pub struct Scans {
    turns: Arc<Pool>,
    /// How much longer than its scan a key keeps its turn.
    rest_factor: f64,
}

/// One scan of a key's, and the rest after it ([`ScanTurn::scan`]).
pub struct ScanTurn {
    turn: Grant,
    rest_factor: f64,
}

impl Scans {
    pub fn new(config: &Config) -> Scans {
        Scans {
            turns: Pool::new("watcher scans", "turns", config.watch_scan_limits()),
            rest_factor: 1.0 / config.watch_scan_share - 1.0,
        }
    }

    /// A turn for `key` now, or `None` while the key's last scan rests or the pool is full.
    pub fn turn(&self, key: &str) -> Option<ScanTurn> {
        let turn = self.turns.take(key, 1).ok()?;
        Some(ScanTurn {
            turn,
            rest_factor: self.rest_factor,
        })
    }

    /// A turn for `key`, waited for (on this blocking thread) at most `limit`.
    pub fn turn_within(&self, key: &str, limit: Duration) -> Option<ScanTurn> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(turn) = self.turn(key) {
                return Some(turn);
            }
            if Instant::now() + TURN_RETRY > deadline {
                return None;
            }
            std::thread::sleep(TURN_RETRY);
        }
    }
}

impl ScanTurn {
    /// Runs `scan`, then keeps the key's turn for its rest: by a task of the server's
    /// runtime, so that the blocking thread is free at once.
    pub fn scan<T>(self, scan: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let done = scan();
        let rest = started.elapsed().mul_f64(self.rest_factor).min(MAX_REST);
        let turn = self.turn;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(rest).await;
                    drop(turn);
                });
            }
            // Outside a runtime (no caller of the server is) the thread rests itself.
            Err(_) => {
                std::thread::sleep(rest);
                drop(turn);
            }
        }
        done
    }
}

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

    #[tokio::test]
    async fn a_keys_scans_take_turns_with_rests_and_leave_other_keys_theirs() {
        let config = Config {
            max_watch_scans: 2,
            watch_scan_share: 0.01,
            ..Config::default()
        };
        let scans = Scans::new(&config);
        let a = scans.turn("a").expect("a's first turn");
        assert!(scans.turn("a").is_none(), "one scan a key at a time");
        // A scan of 20 ms keeps a's turn for 99 times that after it (by a task of the
        // runtime, which this test's thread is: it blocks it as a blocking thread would).
        let scanned = a.scan(|| {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        assert_eq!(scanned, 7);
        assert!(scans.turn("a").is_none(), "a's turn rests after its scan");
        assert!(
            scans.turn_within("a", Duration::from_millis(100)).is_none(),
            "a caller that waits less than the rest gets none"
        );
        // Two other keys fill the pool; a fourth gets its turn out of the reserve, a fifth
        // when one is given back.
        let b = scans.turn("b").unwrap();
        let _c = scans.turn("c").expect("c's floor");
        assert!(scans.turn("d").is_none(), "the reserve bounds the floors");
        drop(b);
        assert!(scans.turn("d").is_some());
        assert_eq!(scans.turns.held_by("a"), 1);
    }

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
