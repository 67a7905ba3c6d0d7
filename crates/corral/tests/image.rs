//! Images through the real `corral` binary: the `default` data-science image end to end, and
//! the image commands and first-use behaviour on throwaway stores.
//!
//! The tests that run code in `default` need it built in the store `corral` finds
//! (`CORRAL_DATA_DIR`, as scripts/test and .ci/run set it, or the default data directory).
//! They fail, never skip, when it is not: `corral image build default` builds it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn corral() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_corral"));
    cmd.stdin(Stdio::null());
    cmd
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Panics with what to do when the `default` image is not built.
fn require_default_image() {
    let out = corral()
        .args(["image", "inspect", "default"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "these tests need the `default` image, and it is not built in the store corral uses \
         (CORRAL_DATA_DIR={:?}): run `corral image build default` first (scripts/test does)\n{}",
        std::env::var_os("CORRAL_DATA_DIR"),
        text(&out.stderr)
    );
}

/// `corral run --json --image default ...` → the result object.
fn run_json(args: &[&str]) -> Value {
    let out = corral()
        .args(["run", "--json", "--image", "default"])
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}): stdout {:?} stderr {:?}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

fn assert_success(result: &Value) {
    assert_eq!(result["status"], "success", "{result:#}");
}

#[test]
fn default_image_runs_pandas_and_matplotlib_and_returns_a_png() {
    require_default_image();
    let out_dir = tempfile::tempdir().unwrap();
    let csv = out_dir.path().join("sales.csv");
    std::fs::write(
        &csv,
        "day,amount\n2024-01-03,10\n2024-01-20,5\n2024-02-11,7\n2024-03-02,12\n",
    )
    .unwrap();
    let results = out_dir.path().join("out");
    let out: Output = corral()
        .args(["run", "--image", "default"])
        .arg(repo_root().join("examples/analysis.py"))
        .arg("--file")
        .arg(&csv)
        .arg("--out")
        .arg(&results)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("sales.csv: 4 rows, 1 series"), "{stdout}");
    assert!(
        stdout.contains("total per series:\namount    34"),
        "{stdout}"
    );
    let png = std::fs::read(results.join("chart.png")).expect("chart.png copied out");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 10_000, "a real chart, not an empty image");
    assert!(
        stderr.contains("saved") && stderr.contains("chart.png"),
        "{stderr}"
    );
}

#[test]
fn default_image_has_the_scientific_stack() {
    require_default_image();
    let code = "\
import importlib, json
mods = ['numpy', 'pandas', 'matplotlib', 'scipy', 'seaborn', 'IPython', 'openpyxl', 'PIL']
print(json.dumps({m: importlib.import_module(m).__version__ for m in mods}))
import scipy.stats, seaborn
print(round(float(scipy.stats.norm.cdf(1.96)), 3))
";
    let r = run_json(&["-c", code, "--timeout", "60"]);
    assert_success(&r);
    let stdout = r["stdout"].as_str().unwrap();
    let versions: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    for m in [
        "numpy",
        "pandas",
        "matplotlib",
        "scipy",
        "seaborn",
        "IPython",
        "openpyxl",
        "PIL",
    ] {
        assert!(versions[m].is_string(), "{m} missing: {stdout}");
    }
    assert!(stdout.contains("\n0.975\n"), "{stdout}");

    let js = run_json(&["--lang", "javascript", "-c", "console.log(6 * 7)"]);
    assert_success(&js);
    assert_eq!(js["stdout"], "42\n");
}

#[test]
fn matplotlib_uses_the_prebuilt_font_cache() {
    require_default_image();
    // matplotlib logs "generated new fontManager" at INFO when it rebuilds its font list.
    let code = "\
import logging, os, time
logging.basicConfig(level=logging.INFO)
t = time.perf_counter()
import matplotlib.pyplot as plt
print('import', round(time.perf_counter() - t, 3))
cache = os.environ['MPLCONFIGDIR']
print('cache', cache, sorted(os.listdir(cache)))
print('backend', plt.get_backend())
";
    let r = run_json(&["-c", code]);
    assert_success(&r);
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        !stderr.contains("generated new fontManager"),
        "matplotlib rebuilt its font cache inside the sandbox: {stderr}"
    );
    let stdout = r["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("cache /tmp/.matplotlib ['fontlist-v"),
        "{stdout}"
    );
    assert!(stdout.contains("backend agg"), "{stdout}");
}

#[test]
fn default_image_environment_and_identity() {
    require_default_image();
    let code = "\
echo threads=$OPENBLAS_NUM_THREADS/$OMP_NUM_THREADS backend=$MPLBACKEND
id -un; hostname; grep -c . /etc/resolv.conf || true
touch /usr/x 2>/dev/null && echo rootfs-writable || echo rootfs-read-only
ls /var/lib/apt/lists | wc -l
ls /usr/share/doc | head -1 >/dev/null; ls /usr/share/man 2>/dev/null | wc -l
";
    let r = run_json(&["--lang", "bash", "--cpus", "2", "-c", code]);
    assert_success(&r);
    assert_eq!(
        r["stdout"], "threads=2/2 backend=Agg\nsandbox\ncorral\n0\nrootfs-read-only\n0\n0\n",
        "{r:#}"
    );
}

// --- image commands on throwaway stores (no build needed) ---------------------------------

/// A store holding one image `NAME` whose manifest lists `languages` (a `true` binary is
/// not needed: these tests stop before anything runs).
fn fake_store(name: &str, languages: &[&str]) -> (tempfile::TempDir, String) {
    let data = tempfile::tempdir().unwrap();
    let hash = format!("{:0>64}", "abc123");
    let image = data.path().join("images").join(&hash);
    std::fs::create_dir_all(image.join("rootfs/usr/bin")).unwrap();
    let manifest = serde_json::json!({
        "name": name, "hash": hash,
        "recipe": {"builder_version": 1, "name": name, "kind": "debian", "suite": "bookworm",
                   "packages": ["python3"], "optional_packages": [], "pypi": [], "files": [],
                   "env": {}},
        "content_hash": "sha256:00", "size_bytes": 123_456_789u64,
        "created": "2025-05-20T10:00:00Z", "build_seconds": 1.0, "mirror": "http://mirror.invalid",
        "languages": languages, "packages": {"python3": "3.11.2-1+b1"}, "pypi_packages": {},
        "skipped_packages": [], "env": {}
    });
    std::fs::write(image.join("manifest.json"), manifest.to_string()).unwrap();
    (data, hash)
}

#[test]
fn ls_inspect_and_rm() {
    let (data, hash) = fake_store("tiny", &["python"]);
    let image = |args: &[&str]| {
        corral()
            .arg("image")
            .args(args)
            .arg("--data-dir")
            .arg(data.path())
            .output()
            .unwrap()
    };
    let ls = image(&["ls"]);
    assert!(ls.status.success());
    let listing = text(&ls.stdout);
    assert!(listing.starts_with("NAME"), "{listing}");
    let row = listing
        .lines()
        .find(|l| l.starts_with("tiny"))
        .expect(&listing);
    for cell in ["00000000", "117.7 MiB", "2025-05-20T10:00:00Z", "python"] {
        assert!(row.contains(cell), "{cell} missing from {row:?}");
    }
    assert!(listing.lines().any(|l| l.starts_with("host")), "{listing}");

    let inspect = image(&["inspect", "tiny"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let manifest: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(manifest["hash"], hash.as_str());
    assert_eq!(manifest["packages"]["python3"], "3.11.2-1+b1");

    // A hash prefix names it too, as for `image rm`.
    let by_prefix = image(&["inspect", &hash[..8]]);
    assert!(by_prefix.status.success(), "{}", text(&by_prefix.stderr));
    let manifest: Value = serde_json::from_slice(&by_prefix.stdout).unwrap();
    assert_eq!(manifest["hash"], hash.as_str());

    let host = image(&["inspect", "host"]);
    let host: Value = serde_json::from_slice(&host.stdout).unwrap();
    assert_eq!(host["name"], "host");

    let rm = image(&["rm", "tiny"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    assert!(text(&rm.stdout).contains("removed tiny"));
    assert!(!data.path().join("images").join(&hash).exists());
    assert!(!text(&image(&["ls"]).stdout).contains("tiny"));
    let again = image(&["rm", "tiny"]);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("image `tiny` is not built"));
}

#[test]
fn the_manifest_decides_the_languages() {
    let (data, _) = fake_store("pyonly", &["python"]);
    let out = corral()
        .args([
            "run",
            "--json",
            "--image",
            "pyonly",
            "--lang",
            "javascript",
            "-c",
            "1",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "sandbox_error");
    let msg = r["error_message"].as_str().unwrap();
    assert!(
        msg.contains("image `pyonly` has no javascript interpreter (it has: python)"),
        "{msg}"
    );
}

#[test]
fn an_unbuilt_default_image_fails_with_the_command_that_builds_it() {
    let data = tempfile::tempdir().unwrap();
    let out = corral()
        .args(["run", "--json", "-c", "print(1)"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "sandbox_error");
    let msg = r["error_message"].as_str().unwrap();
    let command = format!(
        "corral image build default --data-dir {}",
        data.path().display()
    );
    assert!(msg.contains(&command) && msg.contains("--yes"), "{msg}");
    // Nothing was built or run in its place (no silent fallback to `host`).
    assert_eq!(r["stdout"], "");
    assert!(!data.path().join("images").exists());

    let unknown = corral()
        .args(["run", "--json", "--image", "nope", "-c", "1"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&unknown.stdout).unwrap();
    assert!(r["error_message"]
        .as_str()
        .unwrap()
        .contains("no image named `nope`"));
}

#[test]
fn image_build_rejects_bad_input_before_building() {
    let data = tempfile::tempdir().unwrap();
    let recipe = data.path().join("bad.toml");
    std::fs::write(
        &recipe,
        "name = \"mine\"\npackages = [\"python3\"]\npackage = []\n",
    )
    .unwrap();
    let out = corral()
        .args(["image", "build", "--recipe"])
        .arg(&recipe)
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("unknown field `package`"),
        "{err}"
    );

    let out = corral()
        .args(["image", "build", "nosuch"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("no built-in recipe `nosuch`"));

    let out = corral()
        .args(["image", "build", "host"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("nothing to build"));
}
