//! The seccomp profiles as reviewed data, and their compilation to BPF.
//!
//! Shared by `build.rs`, which compiles the profiles once for the target architecture and
//! embeds the programs in the library, and by the tests, which check the data for every
//! architecture. The JSON files extend seccompiler's format by one optional rule key,
//! `"arches"`: a rule naming a syscall only some architectures have (x86_64's legacy `open`,
//! `fork`, ...) lists them and is dropped for the others. seccompiler rejects unknown keys and
//! syscall names, so a typo in the data fails the build instead of being skipped.

use std::collections::HashSet;

use seccompiler::{BpfProgram, TargetArch};
use serde_json::Value;

/// The kernel's limit on the length of one classic BPF program (`BPF_MAXINSNS`).
pub const BPF_MAX_LEN: usize = 4096;

/// Errors compiling a seccomp profile (at build time).
#[derive(Debug)]
pub enum ProfileError {
    /// A profile file is not valid JSON.
    Json {
        file: &'static str,
        source: serde_json::Error,
    },
    /// A profile file is JSON, but not a profile this module accepts.
    Profile { file: &'static str, reason: String },
    /// seccompiler rejected a profile (e.g. a syscall name unknown on `arch`).
    Compile {
        file: &'static str,
        arch: TargetArch,
        source: seccompiler::Error,
    },
    /// A BPF program is longer than the kernel accepts.
    TooLong { len: usize },
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileError::Json { file, source } => {
                write!(f, "seccomp profile {file} is not valid JSON: {source}")
            }
            ProfileError::Profile { file, reason } => write!(f, "seccomp profile {file}: {reason}"),
            ProfileError::Compile { file, arch, source } => {
                write!(
                    f,
                    "cannot compile seccomp profile {file} for {arch:?}: {source}"
                )
            }
            ProfileError::TooLong { len } => write!(
                f,
                "BPF program of {len} instructions exceeds the kernel limit of {BPF_MAX_LEN}"
            ),
        }
    }
}

impl std::error::Error for ProfileError {}

/// One JSON file and the filters it must define, in installation order.
pub struct Profile {
    pub file: &'static str,
    pub json: &'static [u8],
    pub filters: &'static [&'static str],
    /// The rules of another profile's filter that are prepended to one of ours, so a
    /// profile that only widens another lists just the difference.
    pub extends: Option<Extends>,
}

/// `base`'s filter `from` is prepended to our filter `into`.
pub struct Extends {
    pub base: &'static Profile,
    pub from: &'static str,
    pub into: &'static str,
}

pub const WORKLOAD: Profile = Profile {
    file: "workload.json",
    json: include_bytes!("../seccomp/workload.json"),
    // Order matters. The kernel runs every installed filter on each syscall and acts on the
    // most severe result; among results of equal severity (both ERRNO here) the most recently
    // installed filter wins (kernel/seccomp.c: seccomp_run_filters walks from the newest filter
    // and only replaces its result with a strictly more severe one). So `clone3` must come
    // last for its ENOSYS to beat the allow-list's EPERM, while its default "allow" can never
    // override a denial by the allow-list.
    filters: &["workload", "workload_clone3"],
    extends: None,
};

pub const INIT: Profile = Profile {
    file: "init.json",
    json: include_bytes!("../seccomp/init.json"),
    filters: &["init"],
    extends: None,
};

pub const ZYGOTE: Profile = Profile {
    file: "zygote.json",
    json: include_bytes!("../seccomp/zygote.json"),
    filters: &["zygote", "zygote_clone3"],
    extends: Some(Extends {
        base: &WORKLOAD,
        from: "workload",
        into: "zygote",
    }),
};

/// Compiles `profile` for `arch` into its programs, in installation order.
pub fn compile(profile: &Profile, arch: TargetArch) -> Result<Vec<BpfProgram>, ProfileError> {
    let json = select_arch(profile, arch)?;
    let mut compiled = seccompiler::compile_from_json(json.as_slice(), arch).map_err(|source| {
        ProfileError::Compile {
            file: profile.file,
            arch,
            source,
        }
    })?;
    let mut programs = Vec::with_capacity(profile.filters.len());
    for name in profile.filters {
        let program = compiled
            .remove(*name)
            .ok_or_else(|| ProfileError::Profile {
                file: profile.file,
                reason: format!("filter {name:?} is missing"),
            })?;
        if program.len() > BPF_MAX_LEN {
            return Err(ProfileError::TooLong { len: program.len() });
        }
        programs.push(program);
    }
    // A filter nobody installs would be reviewed but never enforced.
    if let Some(extra) = compiled.keys().next() {
        return Err(ProfileError::Profile {
            file: profile.file,
            reason: format!("filter {extra:?} is never installed"),
        });
    }
    Ok(programs)
}

/// Drops the rules whose `"arches"` exclude `arch`, strips that key (unknown to seccompiler) and
/// rejects rule sets whose meaning would be surprising.
pub fn select_arch(profile: &Profile, arch: TargetArch) -> Result<Vec<u8>, ProfileError> {
    let file = profile.file;
    let invalid = |reason: String| ProfileError::Profile { file, reason };
    let arch_name = match arch {
        TargetArch::x86_64 => "x86_64",
        TargetArch::aarch64 => "aarch64",
        TargetArch::riscv64 => "riscv64",
    };

    let mut root: Value = serde_json::from_slice(profile.json)
        .map_err(|source| ProfileError::Json { file, source })?;
    if let Some(ext) = &profile.extends {
        let base: Value =
            serde_json::from_slice(ext.base.json).map_err(|source| ProfileError::Json {
                file: ext.base.file,
                source,
            })?;
        let inherited = base[ext.from]["filter"]
            .as_array()
            .cloned()
            .ok_or_else(|| {
                invalid(format!(
                    "{}: no filter {:?} to extend",
                    ext.base.file, ext.from
                ))
            })?;
        let own = root[ext.into]["filter"]
            .as_array_mut()
            .ok_or_else(|| invalid(format!("no filter {:?} to extend into", ext.into)))?;
        own.splice(0..0, inherited);
    }
    let filters = root
        .as_object_mut()
        .ok_or_else(|| invalid("top level is not an object".into()))?;
    for (name, filter) in filters.iter_mut() {
        let rules = filter
            .get_mut("filter")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| invalid(format!("{name}: \"filter\" is not an array")))?;
        let mut kept = Vec::with_capacity(rules.len());
        for mut rule in rules.drain(..) {
            let object = rule
                .as_object_mut()
                .ok_or_else(|| invalid(format!("{name}: a rule is not an object")))?;
            if let Some(arches) = object.remove("arches") {
                let arches = arches
                    .as_array()
                    .filter(|list| !list.is_empty())
                    .ok_or_else(|| {
                        invalid(format!("{name}: \"arches\" must be a non-empty list"))
                    })?;
                let mut applies = false;
                for entry in arches {
                    match entry.as_str() {
                        Some("x86_64" | "aarch64") => applies |= entry == arch_name,
                        _ => return Err(invalid(format!("{name}: unsupported arch {entry}"))),
                    }
                }
                if !applies {
                    continue;
                }
            }
            kept.push(rule);
        }
        check_rule_shapes(name, &kept).map_err(invalid)?;
        *rules = kept;
    }
    serde_json::to_vec(&root).map_err(|source| ProfileError::Json { file, source })
}

/// seccompiler ORs the rules of one syscall, but a rule without `args` only means "any
/// arguments" while it is that syscall's only rule: next to a conditional rule it silently
/// disappears. Reject that, and plain duplicates, so the file means what it says.
fn check_rule_shapes(filter: &str, rules: &[Value]) -> Result<(), String> {
    let mut unconditional = HashSet::new();
    let mut conditional = HashSet::new();
    for rule in rules {
        let syscall = rule
            .get("syscall")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{filter}: a rule has no \"syscall\" name"))?;
        let has_args = rule.get("args").is_some();
        let fresh = if has_args {
            conditional.insert(syscall)
        } else {
            unconditional.insert(syscall)
        };
        if !has_args && !fresh {
            return Err(format!("{filter}: {syscall} is listed twice"));
        }
        if unconditional.contains(syscall) && conditional.contains(syscall) {
            return Err(format!(
                "{filter}: {syscall} has both an unconditional and a conditional rule"
            ));
        }
    }
    Ok(())
}
