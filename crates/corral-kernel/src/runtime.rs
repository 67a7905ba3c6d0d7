//! The in-sandbox kernel runtimes, embedded in the binary and placed read-only under
//! `/run/corral` in each sandbox (so no image needs them installed).

use crate::session::Language;

pub const PYTHON_KERNEL: (&str, &str) = (
    "corral_kernel.py",
    include_str!("../runtime/corral_kernel.py"),
);
/// Loaded by the Python kernels in session mode, and by the one-shot runner when a run has
/// results to report.
pub const PYTHON_KERNEL_LIB: (&str, &str) = (
    "corral_kernel_lib.py",
    include_str!("../runtime/corral_kernel_lib.py"),
);
/// The code policy's pre-check and import hook (docs/code-policy.md), loaded by the Python
/// kernels and the one-shot runner when there is a policy.
pub const PYTHON_POLICY: (&str, &str) = (
    "corral_policy.py",
    include_str!("../runtime/corral_policy.py"),
);
/// The one-shot runner, run as the script itself: from its precompiled bytecode when the
/// image's cache has it (see [`crate::bytecode`]), else from this source.
pub const PYTHON_ONESHOT: (&str, &str) = (
    "corral_oneshot.py",
    include_str!("../runtime/corral_oneshot.py"),
);
/// The Python runtime of a one-shot run (whose bytecode the image's cache holds).
pub const PYTHON_ONESHOT_RUNTIME: [(&str, &str); 3] =
    [PYTHON_ONESHOT, PYTHON_KERNEL_LIB, PYTHON_POLICY];
/// Compiles the one-shot runtime to bytecode inside a sandbox of the image.
pub const PYTHON_COMPILER: (&str, &str) = (
    "corral_compile.py",
    include_str!("../runtime/corral_compile.py"),
);
const JAVASCRIPT_KERNEL: (&str, &str) = (
    "corral_kernel.js",
    include_str!("../runtime/corral_kernel.js"),
);
/// The code policy for JavaScript: loaded by the kernel when there is a policy, and the
/// preload of a one-shot run under one.
pub const JAVASCRIPT_POLICY: (&str, &str) = (
    "corral_policy.js",
    include_str!("../runtime/corral_policy.js"),
);
/// Where a one-shot run under a code policy finds its module rules (JSON, as a `policy`
/// frame's fields).
pub const POLICY_RULES: &str = "corral_code_policy.json";
pub const ZYGOTE: (&str, &str) = (
    "corral_zygote.py",
    include_str!("../runtime/corral_zygote.py"),
);
/// The engine's session lockdown as a library the zygote loads (built by `build.rs` from
/// crates/corral-session).
pub const SESSION_LIBRARY: (&str, &[u8]) = (
    "libcorral_session.so",
    include_bytes!(concat!(env!("OUT_DIR"), "/libcorral_session.so")),
);
const BASH_KERNEL: (&str, &str) = ("corral_bash.py", include_str!("../runtime/corral_bash.py"));

/// The command that starts a session kernel for `language`.
pub fn kernel_argv(language: Language) -> Vec<String> {
    let path = |file: &str| format!("/run/corral/{file}");
    match language {
        Language::Python => vec!["python3".into(), path(PYTHON_KERNEL.0)],
        // Node's REPL rewriter for top-level await is an internal module.
        Language::Javascript => vec![
            "node".into(),
            "--expose-internals".into(),
            path(JAVASCRIPT_KERNEL.0),
        ],
        Language::Bash => vec!["python3".into(), path(BASH_KERNEL.0)],
    }
}

/// The runtime files a `language` kernel needs under `/run/corral`.
pub fn support_files(language: Language) -> Vec<(String, Vec<u8>)> {
    let files: &[(&str, &str)] = match language {
        Language::Python => &[PYTHON_KERNEL, PYTHON_KERNEL_LIB, PYTHON_POLICY],
        Language::Javascript => &[JAVASCRIPT_KERNEL, JAVASCRIPT_POLICY],
        Language::Bash => &[BASH_KERNEL, PYTHON_KERNEL_LIB],
    };
    as_support_files(files.iter().copied())
}

/// Every language's kernel files: a session's code contexts may be of any language
/// ([`crate::context`]), so a full zygote and a session's own sandbox carry them all.
pub fn every_kernel_file() -> Vec<(String, Vec<u8>)> {
    // The languages share some files (bash's kernel uses the Python kernel's library).
    [Language::Python, Language::Javascript, Language::Bash]
        .into_iter()
        .flat_map(support_files)
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

/// Embedded `(name, source)` runtime files as `/run/corral` support files.
pub fn as_support_files<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, Vec<u8>)> {
    files
        .into_iter()
        .map(|(name, text)| (name.to_string(), text.as_bytes().to_vec()))
        .collect()
}
