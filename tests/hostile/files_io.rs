//! Files crossing the boundary: `--out` copy-out of hostile workspace
//! content and `--file` destinations that try to leave the workspace.

use crate::harness::*;
use crate::host::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The `files` of the result are relative paths that stay inside.
fn assert_file_paths_contained(o: &Outcome) {
    for f in o.j()["files"].as_array().into_iter().flatten() {
        let p = Path::new(f["path"].as_str().unwrap_or(""));
        assert!(
            p.components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir)),
            "result names a path outside --out: {p:?}\n{}",
            o.dump()
        );
    }
}

fn find_named<'a>(entries: &'a [(PathBuf, fs::Metadata)], name: &str) -> Option<&'a PathBuf> {
    entries
        .iter()
        .find(|(p, _)| p.file_name().is_some_and(|n| n == name))
        .map(|(p, _)| p)
}

#[test]
fn out_dir_symlinks_are_not_followed() {
    let _g = shared();
    let s = HostSecret::plant();
    let out = s.base.path().join("out");
    fs::create_dir(&out).unwrap();
    let mark = marker("outlinks");
    let o = Run::python(include_str!("attacks/out_symlinks.py"))
        .env("HOST_SECRET_PATH", s.path_str())
        .env("HOST_SECRET_DIR", s.dir_str())
        .env("MARK", &mark)
        .out(&out)
        .run();
    o.assert_completed();
    o.assert_no_escape();
    assert!(o.values("PLANTED").len() >= 9, "{}", o.dump());
    o.assert_blocked("hardlink-etc-passwd", &["EXDEV", "EPERM", "EACCES"]);
    o.assert_blocked("hardlink-python", &["EXDEV", "EPERM", "EACCES"]);
    assert_file_paths_contained(&o);

    let entries = walk(&out);
    // Non-vacuous: the ordinary file was copied out intact.
    let ok = find_named(&entries, &format!("ok-{mark}.txt"))
        .unwrap_or_else(|| panic!("ok file not copied out: {entries:#?}\n{}", o.dump()));
    assert_eq!(fs::read_to_string(ok).unwrap(), format!("OK-{mark}"));
    let mut total = 0;
    for (p, md) in &entries {
        assert!(!md.file_type().is_symlink(), "symlink copied out: {p:?}");
        if md.is_file() {
            total += md.len();
            let data = fs::read(p).unwrap();
            assert!(
                !String::from_utf8_lossy(&data).contains(&s.token),
                "SANDBOX HOLE: secret copied out via {p:?}"
            );
        }
    }
    assert!(total <= 16 << 20, "copied out {total} bytes");
    // Nothing was created or changed outside the out dir.
    assert_eq!(list_names(s.base.path()), vec!["out", "secret"]);
    s.assert_unchanged();
    assert_no_host_file_named(&format!("created-by-sandbox-{mark}"));
}

#[test]
fn out_dir_special_files_are_neutralised() {
    let _g = shared();
    let base = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    let out = base.path().join("out");
    fs::create_dir(&out).unwrap();
    let mark = marker("outspecial");
    let o = Run::python(include_str!("attacks/out_special_files.py"))
        .env("MARK", &mark)
        .disk("16M")
        .timeout(10)
        .out(&out)
        .run();
    o.assert_completed();
    assert_file_paths_contained(&o);
    // A FIFO must not hang the copy-out.
    assert!(
        o.wall < Duration::from_secs(30),
        "copy-out took {:?}",
        o.wall
    );
    let entries = walk(&out);
    assert!(
        find_named(&entries, &format!("ok-{mark}.txt")).is_some(),
        "ok file not copied out: {entries:#?}\n{}",
        o.dump()
    );
    let (mut apparent, mut allocated) = (0, 0);
    for (p, md) in &entries {
        assert!(
            md.is_file() || md.is_dir(),
            "special file copied out: {p:?} ({:?})",
            md.file_type()
        );
        let mode = md.permissions().mode();
        assert_eq!(
            mode & 0o7000,
            0,
            "setuid/setgid/sticky bit on host copy {p:?}: {mode:o}"
        );
        if md.is_file() {
            apparent += md.len();
            allocated += md.blocks() * 512;
        }
    }
    assert!(
        apparent <= 17 << 20,
        "copied out {apparent} bytes (sparse giant?)"
    );
    assert!(
        allocated <= 17 << 20,
        "copy-out used {allocated} bytes of host disk"
    );
    assert_eq!(list_names(base.path()), vec!["out"]);
}

#[test]
fn hardlinks_to_protected_files_fail() {
    let _g = shared();
    let before = digest(Path::new("/etc/passwd"));
    let o = Run::python(include_str!("attacks/hardlink.py")).run();
    o.assert_completed();
    o.assert_no_escape();
    let cross = &["EXDEV", "EPERM", "EACCES"];
    o.assert_blocked("hardlink-etc-passwd", cross);
    o.assert_blocked("hardlink-etc-shadow", &["ENOENT"]);
    o.assert_blocked("hardlink-python", cross);
    o.assert_blocked("hardlink-tmp-from-usr", cross);
    o.assert_blocked("linkat-proc-exe", &["EXDEV", "EPERM", "EACCES", "ENOENT"]);
    assert_eq!(digest(Path::new("/etc/passwd")), before);
}

#[test]
fn file_destination_cannot_leave_the_workspace() {
    let _g = shared();
    let base = tempfile::Builder::new().prefix("hx-").tempdir().unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let mark = marker("filedest");
    let payload = base.path().join("payload.txt");
    fs::write(&payload, format!("PAYLOAD-{mark}")).unwrap();
    let b = base.path().to_str().unwrap();
    let attack = include_str!("attacks/file_dest_traversal.py");

    // Control: an ordinary destination works, so the others are meaningful.
    let o = Run::python(attack)
        .file(&payload, "inputs/payload.txt")
        .run();
    o.assert_completed();
    assert!(
        o.values("WSFILE")
            .contains(&"/workspace/inputs/payload.txt"),
        "{}",
        o.dump()
    );

    let dests = [
        format!("../../../../../../../../..{b}/pwned-rel-{mark}"),
        format!("{b}/pwned-abs-{mark}"),
        format!("../pwned-up-{mark}"),
        format!("../../pwned-upup-{mark}"),
        format!("/tmp/../../../..{b}/pwned-tmp-{mark}"),
        format!("/proc/self/root{b}/pwned-proc-{mark}"),
    ];
    for dest in &dests {
        let o = Run::python(attack).file(&payload, dest).run();
        // corral may refuse the destination (preferred) or place it inside
        // the sandbox; either way nothing may appear on the host.
        if let Some(j) = &o.json {
            if j["status"] == "success" {
                for f in o.values("WSFILE") {
                    assert!(f.starts_with("/workspace/"), "{f}\n{}", o.dump());
                }
            }
        }
        assert_eq!(
            list_names(base.path()),
            vec!["payload.txt"],
            "SANDBOX HOLE: --file {dest} wrote on the host"
        );
        assert_no_host_file_named(&format!("pwned-up-{mark}"));
        assert_no_host_file_named(&format!("pwned-upup-{mark}"));
    }
}
