//! Building a Debian image: debootstrap, apt, pip, matplotlib's font cache, then a stripped,
//! checked root filesystem and its manifest.
//!
//! Every tool runs under `setpriv --pdeathsig KILL unshare --mount --pid --fork
//! --kill-child`: the `/proc` it needs inside the chroot (and everything debootstrap mounts)
//! exists only in a private mount namespace that dies with the tool, and the whole tool
//! process tree dies with Corral, on any exit path. Nothing is ever mounted on the host.
//!
//! What runs as root here is Debian's own packages (verified by apt against the archive
//! keys the host trusts) and pip installing wheels only (`--only-binary :all:`), so no
//! package's own build code runs outside a sandbox.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::debian::Mirror;
use crate::progress::{Event, Phase, Progress};
use crate::recipe::Recipe;
use crate::{ImageError, Manifest, ToolFailure};

/// Where the prebuilt matplotlib font list lives in the image (read-only at run time).
const MPL_CACHE: &str = "/usr/share/corral/matplotlib";

/// The host's CA bundle, and where the pypi phase puts a copy inside the image.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const BUILD_CA_BUNDLE: &str = "/tmp/corral-host-ca.crt";

/// Lines of a failing tool's output shown in the error.
const TAIL_LINES: usize = 25;

/// Seeds `$MPLCONFIGDIR` (a fresh, empty /tmp in every sandbox) with the font list built
/// into the image; without it matplotlib rebuilds the list (0.25-0.35 s for the default
/// image's fonts, measured) on the first import in every sandbox.
const SITECUSTOMIZE: &str = r#"# Written by Corral's image builder.
# Every sandbox starts with an empty /tmp, where MPLCONFIGDIR points: link matplotlib's
# font list, built with the image, into it so matplotlib does not rebuild it (a few hundred
# milliseconds) on its first import in each sandbox.
import os as _os


def _corral_seed_matplotlib_cache():
    cache = _os.environ.get("MPLCONFIGDIR")
    if not cache or _os.path.isdir(cache):
        return
    prebuilt = "@MPL_CACHE@"
    try:
        _os.makedirs(cache, mode=0o700)
        for name in _os.listdir(prebuilt):
            if name.startswith("fontlist-"):
                _os.symlink(_os.path.join(prebuilt, name), _os.path.join(cache, name))
    except OSError:
        pass


_corral_seed_matplotlib_cache()
del _corral_seed_matplotlib_cache, _os
"#;

/// Fills `root` (which must not exist) from `recipe` and returns the image's manifest
/// (without knowing where the store will put it).
pub(crate) fn build(
    recipe: &Recipe,
    mirror: &Mirror,
    root: &Path,
    log_path: &Path,
    progress: &mut dyn Progress,
) -> Result<Manifest, ImageError> {
    let started = Instant::now();
    let log = File::create(log_path)
        .map_err(ImageError::io(format!("creating {}", log_path.display())))?;
    let mut phases = vec![Phase::Bootstrap, Phase::Packages];
    if !recipe.pypi.is_empty() {
        phases.push(Phase::Pypi);
    }
    phases.extend([Phase::FontCache, Phase::Finalize]);
    let hash = recipe.hash();
    progress.event(Event::Start {
        name: &recipe.name,
        hash: &hash,
        suite: &recipe.suite,
        mirror: &mirror.uri,
        phases: &phases,
    });
    let mut b = Builder {
        recipe,
        mirror,
        root,
        tools: Tools {
            log,
            log_path: log_path.to_path_buf(),
            progress,
        },
        skipped: Vec::new(),
    };
    let mut manifest = None;
    for &phase in &phases {
        let t = Instant::now();
        b.tools.progress.event(Event::Phase(phase));
        match phase {
            Phase::Bootstrap => b.bootstrap()?,
            Phase::Packages => b.packages()?,
            Phase::Pypi => b.pypi()?,
            Phase::FontCache => b.font_cache()?,
            Phase::Finalize => {
                b.finalize()?;
                manifest = Some(b.manifest(started)?);
            }
        }
        b.tools.progress.event(Event::PhaseDone(phase, t.elapsed()));
    }
    Ok(manifest.expect("finalize is the last phase"))
}

struct Builder<'a> {
    recipe: &'a Recipe,
    mirror: &'a Mirror,
    root: &'a Path,
    tools: Tools<'a>,
    /// Optional packages the suite lacks.
    skipped: Vec<String>,
}

impl Builder<'_> {
    fn bootstrap(&mut self) -> Result<(), ImageError> {
        let mut cmd = isolated(&["--mount-proc"]);
        cmd.args(["debootstrap", "--variant=minbase"])
            .arg(format!("--components={}", self.mirror.components.join(",")))
            .arg(&self.recipe.suite)
            .arg(self.root)
            .arg(&self.mirror.uri);
        let hint = format!(
            "check that the mirror {} (from the host's apt sources) is reachable and serves \
             suite {:?}, and that the disk has 2 GB free; then build again",
            self.mirror.uri, self.recipe.suite
        );
        match self.tools.run(Phase::Bootstrap, cmd, &hint, |_| None) {
            // debootstrap explains failures in its own log inside the target, which goes
            // away with the failed build: keep its end.
            Err(ImageError::Tool(mut failure)) => {
                let own_log = self.root.join("debootstrap/debootstrap.log");
                if let Ok(text) = fs::read_to_string(own_log) {
                    let _ = writeln!(self.tools.log, "--- debootstrap.log ---\n{text}");
                    let last = tail_of(&text);
                    failure.tail.push("--- the end of debootstrap.log:".into());
                    failure
                        .tail
                        .extend(last[last.len().saturating_sub(10)..].iter().cloned());
                }
                Err(ImageError::Tool(failure))
            }
            other => other,
        }
    }

    fn packages(&mut self) -> Result<(), ImageError> {
        let root = self.root;
        write_in(
            root,
            "/etc/apt/sources.list",
            &self.mirror.sources_list,
            0o644,
        )?;
        // apt inside the chroot resolves the mirror's name like the host does; finalize
        // empties the file again (sandboxes have no network).
        let resolv = fs::read("/etc/resolv.conf").unwrap_or_default();
        write_in(root, "/etc/resolv.conf", resolv, 0o644)?;
        // No service may start inside the chroot.
        write_in(
            root,
            "/usr/sbin/policy-rc.d",
            "#!/bin/sh\nexit 101\n",
            0o755,
        )?;
        // Documentation, manual pages and translations are never needed in a sandbox.
        write_in(
            root,
            "/etc/dpkg/dpkg.cfg.d/corral-nodoc",
            "path-exclude=/usr/share/doc/*\npath-include=/usr/share/doc/*/copyright\n\
             path-exclude=/usr/share/man/*\npath-exclude=/usr/share/info/*\n\
             path-exclude=/usr/share/locale/*\npath-include=/usr/share/locale/locale.alias\n\
             path-exclude=/usr/share/lintian/*\n",
            0o644,
        )?;
        write_in(
            root,
            "/etc/apt/apt.conf.d/90corral",
            "APT::Install-Recommends \"false\";\nAcquire::Languages \"none\";\n",
            0o644,
        )?;

        let hint = format!(
            "a package could not be downloaded or installed (see the lines above): check that \
             the mirror {} is reachable and has every package of the recipe (`apt-cache \
             policy NAME` on a {} machine), then build again",
            self.mirror.uri, self.recipe.suite
        );
        let update = self.chroot(&["apt-get", "update", "-q"]);
        self.tools.run(Phase::Packages, update, &hint, |_| None)?;

        let mut wanted = self.recipe.packages.clone();
        for p in &self.recipe.optional_packages {
            let mut show = self.chroot(&["apt-cache", "show", "--no-all-versions", p]);
            show.stdout(Stdio::null()).stderr(Stdio::null());
            let available = show.status().is_ok_and(|s| s.success());
            if available {
                wanted.push(p.clone());
            } else {
                self.tools.progress.event(Event::Note(&format!(
                    "optional package {p} is not in {}: skipped",
                    self.recipe.suite
                )));
                self.skipped.push(p.clone());
            }
        }
        if !self.recipe.pypi.is_empty() && !wanted.iter().any(|p| p == "python3-pip") {
            wanted.push("python3-pip".into());
        }
        if wanted.is_empty() {
            return self.copy_files();
        }
        // apt reports progress on APT::Status-Fd. Pointed at stdout it breaks the output of
        // maintainer scripts run from triggers (ca-certificates' fails with "I/O error"), so
        // a shell inside the image gives it fd 3, joined to our stdout, and sends apt's own
        // output to stderr.
        let mut args = vec![
            "sh",
            "-c",
            "exec apt-get install -y -q --no-install-recommends -o APT::Status-Fd=3 \
             -o Dpkg::Use-Pty=0 \"$@\" 3>&1 1>&2",
            "sh",
        ];
        args.extend(wanted.iter().map(String::as_str));
        let install = self.chroot(&args);
        self.tools
            .run(Phase::Packages, install, &hint, apt_status_fraction)?;
        self.copy_files()
    }

    /// The recipe's `files`, copied with their modes (parents created 0755).
    fn copy_files(&mut self) -> Result<(), ImageError> {
        for f in &self.recipe.files {
            let contents =
                fs::read(&f.src).map_err(ImageError::io(format!("reading {}", f.src.display())))?;
            if hex::encode(Sha256::digest(&contents)) != f.sha256 {
                return Err(ImageError::Build(format!(
                    "{} changed while the image was being built; build again",
                    f.src.display()
                )));
            }
            write_in(self.root, &f.dest, &contents, f.mode)?;
        }
        Ok(())
    }

    fn pypi(&mut self) -> Result<(), ImageError> {
        let mut args = vec![
            "python3",
            "-m",
            "pip",
            "install",
            "--break-system-packages",
            "--root-user-action=ignore",
            "--disable-pip-version-check",
            "--no-input",
            "--no-cache-dir",
            "--progress-bar=off",
            "--only-binary=:all:",
        ];
        // pip checks TLS against the CAs the host trusts (a proxy's own CA among them), not
        // the image's fresh ca-certificates; the copy goes with the rest of /tmp in finalize.
        let cert = format!("--cert={BUILD_CA_BUNDLE}");
        if let Ok(bundle) = fs::read(HOST_CA_BUNDLE) {
            write_in(self.root, BUILD_CA_BUNDLE, bundle, 0o644)?;
            args.push(&cert);
        }
        args.extend(self.recipe.pypi.iter().map(String::as_str));
        let cmd = self.chroot(&args);
        let hint = "check the names and versions in the recipe's `pypi` list, and that PyPI has \
                    wheels of them for this Python (source distributions are refused: their \
                    build code would run as root)";
        self.tools.run(Phase::Pypi, cmd, hint, |_| None)
    }

    fn font_cache(&mut self) -> Result<(), ImageError> {
        if resolve_in_root(self.root, Path::new("/usr/bin/python3")).is_none() {
            self.tools
                .progress
                .event(Event::Note("no python3 in the image: no font cache"));
            return Ok(());
        }
        let hint = "matplotlib could not build its font list in the image; see the log";
        let build = format!(
            "import os, sys\n\
             try:\n    import matplotlib\nexcept ImportError:\n    sys.exit(0)\n\
             import matplotlib.font_manager as fm\n\
             print('matplotlib', matplotlib.__version__, 'font list:', len(fm.fontManager.ttflist), 'fonts in', '{MPL_CACHE}')\n"
        );
        let mut cmd = self.chroot(&["python3", "-c", &build]);
        cmd.env("MPLCONFIGDIR", MPL_CACHE).env("MPLBACKEND", "Agg");
        fs::create_dir_all(self.root.join(&MPL_CACHE[1..]))
            .map_err(ImageError::io("creating the font cache directory"))?;
        self.tools.run(Phase::FontCache, cmd, hint, |_| None)?;
        let has_font_list = fs::read_dir(self.root.join(&MPL_CACHE[1..]))
            .map_err(ImageError::io("reading the font cache directory"))?
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("fontlist-"));
        if !has_font_list {
            fs::remove_dir_all(self.root.join("usr/share/corral"))
                .map_err(ImageError::io("removing the empty font cache directory"))?;
            self.tools
                .progress
                .event(Event::Note("no matplotlib in the image: no font cache"));
            return Ok(());
        }
        self.install_sitecustomize()?;

        // Prove it: a fresh MPLCONFIGDIR, as in a sandbox, must not rebuild the font list.
        let check_dir = "/tmp/corral-font-cache-check";
        let _ = fs::remove_dir_all(self.root.join(&check_dir[1..]));
        let check = "import logging, sys\n\
                     logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n\
                     import matplotlib.pyplot\n";
        let mut cmd = self.chroot(&["python3", "-c", check]);
        cmd.env("MPLCONFIGDIR", check_dir).env("MPLBACKEND", "Agg");
        let output = self.tools.capture(Phase::FontCache, cmd, hint)?;
        let _ = fs::remove_dir_all(self.root.join(&check_dir[1..]));
        if output.contains("generated new fontManager") {
            return Err(ImageError::Tool(Box::new(ToolFailure {
                phase: Phase::FontCache,
                command: "python3 -c 'import matplotlib.pyplot' (fresh MPLCONFIGDIR)".into(),
                status: "rebuilt the font list instead of using the prebuilt one".into(),
                tail: tail_of(&output),
                log: self.tools.log_path.clone(),
                hint: "the image's sitecustomize.py did not seed MPLCONFIGDIR; report this \
                       as a Corral bug"
                    .into(),
            })));
        }
        Ok(())
    }

    /// Writes the seeding hook as the interpreter's `sitecustomize` (Debian's is a symlink
    /// into /etc with nothing Corral needs) and compiles it: the image is read-only, so a
    /// module without bytecode would be compiled again at every start.
    fn install_sitecustomize(&mut self) -> Result<(), ImageError> {
        let hint = "python3 in the image does not work; see the log";
        let cmd = self.chroot(&[
            "python3",
            "-c",
            "import sysconfig; print(sysconfig.get_path('stdlib'))",
        ]);
        let stdlib = self.tools.capture(Phase::FontCache, cmd, hint)?;
        let stdlib = stdlib.trim();
        let module = format!("{stdlib}/sitecustomize.py");
        let target = match fs::read_link(self.root.join(&module[1..])) {
            Ok(link) if link.is_absolute() => link,
            Ok(link) => Path::new(stdlib).join(link),
            Err(_) => PathBuf::from(&module),
        };
        write_in(
            self.root,
            &target,
            SITECUSTOMIZE.replace("@MPL_CACHE@", MPL_CACHE),
            0o644,
        )?;
        let compile = self.chroot(&["python3", "-m", "py_compile", &module]);
        self.tools.capture(Phase::FontCache, compile, hint)?;
        Ok(())
    }

    fn finalize(&mut self) -> Result<(), ImageError> {
        let root = self.root;
        edit_identity(root)?;
        write_in(root, "/etc/hostname", "corral\n", 0o644)?;
        write_in(
            root,
            "/etc/hosts",
            "127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            0o644,
        )?;
        write_in(root, "/etc/resolv.conf", "", 0o644)?;
        remove(&root.join("usr/sbin/policy-rc.d"))?;
        for backup in ["passwd-", "group-", "shadow-", "gshadow-"] {
            remove(&root.join("etc").join(backup))?;
        }

        // Package lists, downloaded packages, logs and scratch files: only the build used
        // them. Documentation of the packages debootstrap installed before the dpkg
        // excludes existed goes too (copyright files stay).
        for dir in [
            "var/lib/apt/lists",
            "var/cache/apt",
            "var/log",
            "tmp",
            "var/tmp",
            "root",
            "usr/share/man",
            "usr/share/info",
            "usr/share/lintian",
        ] {
            empty_dir(&self.root.join(dir), |_| false)?;
        }
        empty_dir(&self.root.join("usr/share/locale"), |p| {
            p.file_name().is_some_and(|n| n == "locale.alias")
        })?;
        empty_dir(&self.root.join("usr/share/doc"), |p| {
            p.file_name().is_some_and(|n| n == "copyright")
        })?;
        for dir in ["var/cache/debconf", "var/lib/dpkg"] {
            if let Ok(rd) = fs::read_dir(self.root.join(dir)) {
                for e in rd.filter_map(|e| e.ok()) {
                    if e.file_name().to_string_lossy().ends_with("-old") {
                        remove(&e.path())?;
                    }
                }
            }
        }
        fs::set_permissions(self.root, fs::Permissions::from_mode(0o755))
            .map_err(ImageError::io("setting the root directory's mode"))?;
        Ok(())
    }

    fn manifest(&mut self, started: Instant) -> Result<Manifest, ImageError> {
        self.tools
            .progress
            .event(Event::Output("hashing the root filesystem"));
        let (content_hash, size_bytes) = tree_hash_and_size(self.root)?;
        Ok(Manifest {
            name: self.recipe.name.clone(),
            hash: self.recipe.hash(),
            recipe: self.recipe.canonical(),
            content_hash,
            size_bytes,
            created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            build_seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            mirror: self.mirror.uri.clone(),
            languages: languages_in(self.root),
            packages: self.debian_versions()?,
            pypi_packages: pypi_versions(self.root),
            skipped_packages: self.skipped.clone(),
            env: self.recipe.env.clone(),
        })
    }

    fn debian_versions(&mut self) -> Result<BTreeMap<String, String>, ImageError> {
        let mut cmd = Command::new("dpkg-query");
        cmd.arg(format!(
            "--admindir={}",
            self.root.join("var/lib/dpkg").display()
        ))
        .args([
            "-W",
            "-f",
            "${db:Status-Abbrev}\\t${Package}\\t${Version}\\n",
        ]);
        let out = self.tools.capture(
            Phase::Finalize,
            cmd,
            "dpkg-query could not read the image's package database",
        )?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut f = l.split('\t');
                let (status, name, version) = (f.next()?, f.next()?, f.next()?);
                status
                    .starts_with("ii")
                    .then(|| (name.to_string(), version.to_string()))
            })
            .collect())
    }

    /// A command run inside the image with a fresh /proc and a fixed environment.
    fn chroot(&self, argv: &[&str]) -> Command {
        let proc = format!("--mount-proc={}", self.root.join("proc").display());
        let mut cmd = isolated(&[&proc]);
        cmd.arg("chroot").arg(self.root).args(argv);
        cmd
    }
}

/// `setpriv --pdeathsig KILL -- unshare --mount --propagation private --pid --fork
/// --kill-child EXTRA... --` with a clean environment (nothing of the caller's reaches
/// the tools or the image).
fn isolated(extra: &[&str]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--", "unshare", "--mount"])
        .args([
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
        ])
        .args(extra)
        .arg("--")
        .env_clear()
        .envs([
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            ("LANG", "C.UTF-8"),
            ("HOME", "/root"),
            ("DEBIAN_FRONTEND", "noninteractive"),
            ("DEBCONF_NONINTERACTIVE_SEEN", "true"),
        ])
        .stdin(Stdio::null());
    // apt and pip reach the network the way the host does.
    for var in [
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
    ] {
        if let Some(value) = std::env::var_os(var) {
            cmd.env(var, value);
        }
    }
    cmd
}

/// apt's `APT::Status-Fd` lines: downloads are the first 30% of the phase, dpkg the rest.
fn apt_status_fraction(line: &str) -> Option<(f64, String)> {
    let mut parts = line.splitn(4, ':');
    let kind = parts.next()?;
    let _ = parts.next()?;
    let percent: f64 = parts.next()?.parse().ok()?;
    let text = parts.next().unwrap_or("").to_string();
    let f = percent.clamp(0.0, 100.0) / 100.0;
    match kind {
        "dlstatus" => Some((0.3 * f, text)),
        "pmstatus" => Some((0.3 + 0.7 * f, text)),
        _ => None,
    }
}

/// Runs build tools: output goes line by line to the build log and to the progress
/// callback, and the last lines are kept for the error message.
struct Tools<'a> {
    log: File,
    log_path: PathBuf,
    progress: &'a mut dyn Progress,
}

impl Tools<'_> {
    /// Runs `cmd` to completion; `status` turns a line into a fraction of the phase (and a
    /// readable text) when it is a progress line.
    fn run(
        &mut self,
        phase: Phase,
        cmd: Command,
        hint: &str,
        status: impl Fn(&str) -> Option<(f64, String)>,
    ) -> Result<(), ImageError> {
        self.execute(phase, cmd, hint, status, None)
    }

    /// Runs `cmd` and returns its stdout (stderr goes to the log only).
    fn capture(&mut self, phase: Phase, cmd: Command, hint: &str) -> Result<String, ImageError> {
        let mut out = String::new();
        self.execute(phase, cmd, hint, |_| None, Some(&mut out))?;
        Ok(out)
    }

    fn execute(
        &mut self,
        phase: Phase,
        mut cmd: Command,
        hint: &str,
        status: impl Fn(&str) -> Option<(f64, String)>,
        mut capture: Option<&mut String>,
    ) -> Result<(), ImageError> {
        let shown = shown_command(&cmd);
        let _ = writeln!(self.log, "$ {shown}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                ImageError::Tool(Box::new(ToolFailure {
                    phase,
                    command: shown.clone(),
                    status: format!("could not start: {e}"),
                    tail: Vec::new(),
                    log: self.log_path.clone(),
                    hint: "install debootstrap and util-linux (scripts/setup does)".into(),
                }))
            })?;
        let (tx, rx) = mpsc::channel();
        let readers: Vec<_> = [
            (
                true,
                Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
            ),
            (false, Box::new(child.stderr.take().expect("piped"))),
        ]
        .into_iter()
        .map(|(is_stdout, pipe)| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for chunk in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
                    // dpkg redraws some lines with '\r': each part is a line of its own.
                    for part in chunk.split(|&b| b == b'\r') {
                        let line = String::from_utf8_lossy(part).trim_end().to_string();
                        if tx.send((is_stdout, line)).is_err() {
                            return;
                        }
                    }
                }
            })
        })
        .collect();
        drop(tx);

        let mut tail = VecDeque::with_capacity(TAIL_LINES);
        for (is_stdout, line) in rx {
            let _ = writeln!(self.log, "{line}");
            if let Some(out) = capture.as_deref_mut().filter(|_| is_stdout) {
                out.push_str(&line);
                out.push('\n');
                continue;
            }
            if line.is_empty() {
                continue;
            }
            let shown_line = match status(&line) {
                Some((fraction, text)) => {
                    self.progress.event(Event::Fraction(fraction));
                    text
                }
                None => line,
            };
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            self.progress.event(Event::Output(&shown_line));
            tail.push_back(shown_line);
        }
        for r in readers {
            let _ = r.join();
        }
        let exit = child
            .wait()
            .map_err(ImageError::io(format!("waiting for {shown}")))?;
        let _ = self.log.flush();
        if exit.success() {
            return Ok(());
        }
        Err(ImageError::Tool(Box::new(ToolFailure {
            phase,
            command: shown,
            status: match exit.code() {
                Some(code) => format!("exited with status {code}"),
                None => "was killed by a signal".to_string(),
            },
            tail: tail.into(),
            log: self.log_path.clone(),
            hint: hint.to_string(),
        })))
    }
}

/// The tool's own command line, without the isolation wrapper, shortened for messages.
fn shown_command(cmd: &Command) -> String {
    let args: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let start = args
        .iter()
        .position(|a| a == "--")
        .and_then(|first| {
            args[first + 1..]
                .iter()
                .position(|a| a == "--")
                .map(|second| first + 1 + second + 1)
        })
        .unwrap_or(0);
    let mut s = args[start..]
        .iter()
        .map(|a| match a.lines().next() {
            Some(first) if a.contains('\n') => format!("'{first}…'"),
            _ if a.contains(' ') => format!("'{a}'"),
            _ => a.clone(),
        })
        .collect::<Vec<_>>()
        .join(" ");
    if s.len() > 300 {
        let cut = (0..=300)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn tail_of(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Adds the sandbox user (uid/gid 1000, home /workspace) to the image's passwd and group,
/// keeping Debian's system accounts (root, nobody, ...) and dropping any other user of that
/// name or id.
fn edit_identity(root: &Path) -> Result<(), ImageError> {
    use corral_sandbox::rootfs::{SANDBOX_GID, SANDBOX_UID};
    for (file, id, entry) in [
        (
            "passwd",
            SANDBOX_UID,
            format!("sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/workspace:/bin/bash"),
        ),
        ("group", SANDBOX_GID, format!("sandbox:x:{SANDBOX_GID}:")),
    ] {
        let path = root.join("etc").join(file);
        let text = fs::read_to_string(&path)
            .map_err(ImageError::io(format!("reading {}", path.display())))?;
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                let mut f = l.split(':');
                let name = f.next().unwrap_or("");
                let this_id = f.nth(1).and_then(|v| v.parse::<u32>().ok());
                name != "sandbox" && this_id != Some(id)
            })
            .collect();
        lines.push(&entry);
        write_in(
            root,
            Path::new("/etc").join(file),
            lines.join("\n") + "\n",
            0o644,
        )?;
    }
    Ok(())
}

/// Which of Corral's languages the image at `root` can run (`/` for the host).
pub(crate) fn languages_in(root: &Path) -> Vec<String> {
    [
        ("python", &["/usr/bin/python3"][..]),
        ("javascript", &["/usr/bin/node"][..]),
        ("bash", &["/usr/bin/bash", "/bin/bash"][..]),
    ]
    .into_iter()
    .filter(|(_, paths)| {
        paths
            .iter()
            .any(|p| resolve_in_root(root, Path::new(p)).is_some_and(|m| m.mode() & 0o111 != 0))
    })
    .map(|(lang, _)| lang.to_string())
    .collect()
}

/// The metadata of `path` inside the tree at `root`, following its symlinks within that tree
/// (an absolute link target is taken relative to `root`, as in the sandbox).
fn resolve_in_root(root: &Path, path: &Path) -> Option<fs::Metadata> {
    let mut inner = path.to_path_buf();
    for _ in 0..40 {
        let host = root.join(inner.strip_prefix("/").unwrap_or(&inner));
        let meta = fs::symlink_metadata(&host).ok()?;
        if !meta.file_type().is_symlink() {
            return Some(meta);
        }
        let target = fs::read_link(&host).ok()?;
        inner = if target.is_absolute() {
            target
        } else {
            inner.parent().unwrap_or(Path::new("/")).join(target)
        };
    }
    None
}

/// Versions of what pip installed, from the `*.dist-info` directories under /usr/local.
fn pypi_versions(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(libs) = fs::read_dir(root.join("usr/local/lib")) else {
        return out;
    };
    for lib in libs.filter_map(|e| e.ok()) {
        let Ok(rd) = fs::read_dir(lib.path().join("dist-packages")) else {
            continue;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some((pkg, version)) = name
                .strip_suffix(".dist-info")
                .and_then(|s| s.rsplit_once('-'))
            {
                out.insert(pkg.to_string(), version.to_string());
            }
        }
    }
    out
}

/// SHA-256 over the tree (each entry's relative path, type, permission bits, link target or
/// contents, in path order) and its disk usage (hard links counted once).
fn tree_hash_and_size(root: &Path) -> Result<(String, u64), ImageError> {
    let mut tree = Sha256::new();
    let mut size = 0u64;
    let mut seen = HashSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = root.join(&rel);
        let mut children: Vec<_> = fs::read_dir(&path)
            .map_err(ImageError::io(format!("reading {}", path.display())))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        children.sort();
        // Depth-first in path order: push in reverse so the smallest name is visited first.
        let mut dirs = Vec::new();
        for name in children {
            let rel = rel.join(&name);
            let path = root.join(&rel);
            let meta = fs::symlink_metadata(&path)
                .map_err(ImageError::io(format!("reading {}", path.display())))?;
            if seen.insert((meta.dev(), meta.ino())) {
                size += meta.blocks() * 512;
            }
            let mode = meta.mode() & 0o7777;
            let name = rel.to_string_lossy();
            let ft = meta.file_type();
            if ft.is_dir() {
                tree.update(format!("d {name} {mode:o}\n"));
                dirs.push(rel);
            } else if ft.is_symlink() {
                let target = fs::read_link(&path)
                    .map_err(ImageError::io(format!("reading {}", path.display())))?;
                tree.update(format!("l {name} {}\n", target.to_string_lossy()));
            } else if ft.is_file() {
                let mut file = File::open(&path)
                    .map_err(ImageError::io(format!("reading {}", path.display())))?;
                let mut contents = Sha256::new();
                std::io::copy(&mut file, &mut contents)
                    .map_err(ImageError::io(format!("reading {}", path.display())))?;
                let digest = hex::encode(contents.finalize());
                tree.update(format!("f {name} {mode:o} {digest}\n"));
            } else {
                tree.update(format!("o {name} {mode:o} {}\n", meta.rdev()));
            }
        }
        stack.extend(dirs.into_iter().rev());
    }
    Ok((format!("sha256:{}", hex::encode(tree.finalize())), size))
}

/// Writes the file `inner` (an absolute path inside the image at `root`) with exactly
/// `mode`, replacing what was there. Missing directories are created 0755. A symlink on the
/// way is refused: it could point out of the image, and this runs on the host as root.
fn write_in(
    root: &Path,
    inner: impl AsRef<Path>,
    contents: impl AsRef<[u8]>,
    mode: u32,
) -> Result<(), ImageError> {
    let inner = inner.as_ref();
    let rel = inner.strip_prefix("/").unwrap_or(inner);
    let mut dir = root.to_path_buf();
    for c in rel.parent().into_iter().flat_map(Path::components) {
        dir.push(c);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::Build(format!(
                    "cannot write {} into the image: {} is not a directory there (a symlink?)",
                    inner.display(),
                    dir.strip_prefix(root).unwrap_or(&dir).display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(&dir)
                    .and_then(|_| fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)))
                    .map_err(ImageError::io(format!("creating {}", dir.display())))?;
            }
            Err(e) => return Err(ImageError::io(format!("reading {}", dir.display()))(e)),
        }
    }
    let path = root.join(rel);
    remove(&path)?;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .and_then(|mut f| f.write_all(contents.as_ref()))
        .and_then(|_| fs::set_permissions(&path, fs::Permissions::from_mode(mode)))
        .map_err(ImageError::io(format!("writing {}", path.display())))
}

fn remove(path: &Path) -> Result<(), ImageError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(ImageError::io(format!("removing {}", path.display()))(e))
        }
        _ => Ok(()),
    }
}

/// Deletes everything under `dir` except the files `keep` accepts (and the directories
/// leading to them); `dir` itself stays.
fn empty_dir(dir: &Path, keep: impl Fn(&Path) -> bool + Copy) -> Result<bool, ImageError> {
    // Never follow a link out of the image.
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Ok(false);
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return Ok(false);
    };
    let mut kept_any = false;
    for e in rd.filter_map(|e| e.ok()) {
        let path = e.path();
        let ft = e
            .file_type()
            .map_err(ImageError::io(format!("reading {}", path.display())))?;
        if ft.is_dir() {
            if empty_dir(&path, keep)? {
                kept_any = true;
            } else {
                fs::remove_dir(&path)
                    .map_err(ImageError::io(format!("removing {}", path.display())))?;
            }
        } else if keep(&path) {
            kept_any = true;
        } else {
            remove(&path)?;
        }
    }
    Ok(kept_any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn apt_status_lines_become_fractions() {
        assert_eq!(
            apt_status_fraction("dlstatus:3:50.0:Retrieving file 3 of 6"),
            Some((0.15, "Retrieving file 3 of 6".to_string()))
        );
        let (f, text) = apt_status_fraction("pmstatus:python3:100:Installed python3").unwrap();
        assert!((f - 1.0).abs() < 1e-9);
        assert_eq!(text, "Installed python3");
        assert_eq!(apt_status_fraction("Get:1 http://x bookworm/main"), None);
    }

    #[test]
    fn languages_follow_links_inside_the_image() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir_all(r.join("usr/bin")).unwrap();
        symlink("usr/bin", r.join("bin")).unwrap();
        fs::write(r.join("usr/bin/python3.11"), "").unwrap();
        fs::set_permissions(
            r.join("usr/bin/python3.11"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        symlink("python3.11", r.join("usr/bin/python3")).unwrap();
        fs::write(r.join("usr/bin/bash"), "").unwrap();
        fs::set_permissions(r.join("usr/bin/bash"), fs::Permissions::from_mode(0o755)).unwrap();
        // An absolute link that only resolves inside the image, not on the host.
        symlink("/usr/bin/nodejs-in-image", r.join("usr/bin/node")).unwrap();
        assert_eq!(languages_in(r), ["python", "bash"]);
        fs::write(r.join("usr/bin/nodejs-in-image"), "").unwrap();
        fs::set_permissions(
            r.join("usr/bin/nodejs-in-image"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_eq!(languages_in(r), ["python", "javascript", "bash"]);
    }

    #[test]
    fn identity_files_gain_the_sandbox_user_and_keep_system_accounts() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc");
        fs::create_dir(&etc).unwrap();
        fs::write(
            etc.join("passwd"),
            "root:x:0:0:root:/root:/bin/bash\nold:x:1000:1000::/home/old:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        )
        .unwrap();
        fs::write(
            etc.join("group"),
            "root:x:0:\nold:x:1000:\nnogroup:x:65534:\n",
        )
        .unwrap();
        edit_identity(root.path()).unwrap();
        assert_eq!(
            fs::read_to_string(etc.join("passwd")).unwrap(),
            "root:x:0:0:root:/root:/bin/bash\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
             sandbox:x:1000:1000:sandbox:/workspace:/bin/bash\n"
        );
        assert_eq!(
            fs::read_to_string(etc.join("group")).unwrap(),
            "root:x:0:\nnogroup:x:65534:\nsandbox:x:1000:\n"
        );
    }

    #[test]
    fn tree_hash_covers_contents_modes_and_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir_all(r.join("a/b")).unwrap();
        fs::write(r.join("a/b/f"), "x").unwrap();
        symlink("b/f", r.join("a/l")).unwrap();
        let (h1, size) = tree_hash_and_size(r).unwrap();
        assert!(h1.starts_with("sha256:") && size > 0);
        assert_eq!(tree_hash_and_size(r).unwrap().0, h1);
        fs::write(r.join("a/b/f"), "y").unwrap();
        let h2 = tree_hash_and_size(r).unwrap().0;
        assert_ne!(h1, h2);
        fs::set_permissions(r.join("a/b/f"), fs::Permissions::from_mode(0o600)).unwrap();
        assert_ne!(tree_hash_and_size(r).unwrap().0, h2);
    }

    #[test]
    fn empty_dir_keeps_only_what_is_asked() {
        let root = tempfile::tempdir().unwrap();
        let doc = root.path().join("doc");
        fs::create_dir_all(doc.join("pkg/examples")).unwrap();
        fs::write(doc.join("pkg/copyright"), "c").unwrap();
        fs::write(doc.join("pkg/changelog.gz"), "c").unwrap();
        fs::write(doc.join("pkg/examples/x"), "c").unwrap();
        empty_dir(&doc, |p| p.file_name().is_some_and(|n| n == "copyright")).unwrap();
        assert!(doc.join("pkg/copyright").exists());
        assert!(!doc.join("pkg/changelog.gz").exists() && !doc.join("pkg/examples").exists());
    }

    #[test]
    fn shown_command_drops_the_isolation_wrapper() {
        let mut cmd = isolated(&["--mount-proc"]);
        cmd.args(["debootstrap", "--variant=minbase", "bookworm", "/x"]);
        assert_eq!(
            shown_command(&cmd),
            "debootstrap --variant=minbase bookworm /x"
        );
    }
}
