//! The seccomp profiles as reviewed data, and their compilation to BPF.
//!
//! Shared by `build.rs`, which compiles the profiles once for the target architecture and
//! embeds the programs in the library, and by the tests, which check the data for every
//! architecture. The JSON files extend seccompiler's format by one optional rule key,
//! `"arches"`: a rule naming a syscall only some architectures have (x86_64's legacy `open`,
//! `fork`, ...) lists them and is dropped for the others. seccompiler rejects unknown keys and
//! syscall names, so a typo in the data fails the build instead of being skipped.

use std::collections::HashSet;

use seccompiler::{sock_filter, BpfProgram, TargetArch};
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
    let root: Value = serde_json::from_slice(&json).map_err(|source| ProfileError::Json {
        file: profile.file,
        source,
    })?;
    let Value::Object(mut filters) = root else {
        unreachable!("select_arch checked that the top level is an object")
    };
    let mut programs = Vec::with_capacity(profile.filters.len());
    for name in profile.filters {
        let filter = filters.remove(*name).ok_or_else(|| ProfileError::Profile {
            file: profile.file,
            reason: format!("filter {name:?} is missing"),
        })?;
        let program = compile_filter(profile.file, name, filter, arch)?;
        if program.len() > BPF_MAX_LEN {
            return Err(ProfileError::TooLong { len: program.len() });
        }
        programs.push(program);
    }
    // A filter nobody installs would be reviewed but never enforced.
    if let Some(extra) = filters.keys().next() {
        return Err(ProfileError::Profile {
            file: profile.file,
            reason: format!("filter {extra:?} is never installed"),
        });
    }
    Ok(programs)
}

// Classic BPF opcodes (<linux/bpf_common.h>) of the instructions the dispatch adds or inspects.
const BPF_LD_W_ABS: u16 = 0x20;
/// The instruction class of jumps.
const BPF_JMP: u16 = 0x05;
const BPF_JMP_JA: u16 = 0x05;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
/// `offsetof(struct seccomp_data, nr)`.
const SECCOMP_DATA_NR: u32 = 0;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn same(a: &sock_filter, b: &sock_filter) -> bool {
    (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k)
}

/// What a range of syscall numbers leads to.
enum Leaf {
    /// One action for every number in the range, whatever the arguments.
    Return(u32),
    /// One syscall's rules as seccompiler compiled them: a comparison with the syscall's
    /// number, its argument checks, and the default action; no path runs off its end.
    Rules(Vec<sock_filter>),
}

/// Compiles one filter: seccompiler's architecture check, then a binary search over the
/// syscall number that ends in each syscall's action or rules.
///
/// seccompiler itself emits a linear chain, where a syscall's rules are reached only after
/// comparing the number with every syscall listed before it. The kernel runs that chain on
/// every syscall its action cache cannot answer, and when a filter is installed it emulates
/// the filter for every syscall number to fill that cache: about 1 ms per sandbox start for
/// the workload's 1400-instruction chain, against some 20 instructions per number here.
///
/// The semantics stay seccompiler's: every syscall's rules are compiled by seccompiler on
/// their own and used unchanged (argument comparisons included), and a number no rule names
/// gets the same default action. The tests in `seccomp.rs` check the result against
/// seccompiler's chain for every syscall number and the argument values the rules compare.
fn compile_filter(
    file: &'static str,
    name: &str,
    mut filter: Value,
    arch: TargetArch,
) -> Result<BpfProgram, ProfileError> {
    let odd = |reason: String| ProfileError::Profile {
        file,
        reason: format!("{name}: unexpected seccompiler output: {reason}"),
    };
    let rules = match filter.get_mut("filter").map(Value::take) {
        Some(Value::Array(rules)) => rules,
        _ => unreachable!("select_arch checked that every filter has a rule array"),
    };
    let compile_rules = |rules: Vec<Value>| -> Result<BpfProgram, ProfileError> {
        let mut one = filter.clone();
        one["filter"] = Value::Array(rules);
        let json =
            serde_json::to_vec(&serde_json::json!({ name: one })).expect("a JSON value serializes");
        let mut compiled = seccompiler::compile_from_json(json.as_slice(), arch)
            .map_err(|source| ProfileError::Compile { file, arch, source })?;
        Ok(compiled.remove(name).expect("the filter just compiled"))
    };

    // Without rules: the architecture check, then the default action.
    let mut prologue = compile_rules(Vec::new())?;
    let default = match prologue.pop() {
        Some(ret) if ret.code == BPF_RET_K => ret,
        _ => return Err(odd("an empty filter does not end in a return".into())),
    };
    let load_nr = insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR);

    // Each syscall's rules, in the order the file lists them.
    let mut by_syscall: Vec<(String, Vec<Value>)> = Vec::new();
    for rule in rules {
        let syscall = rule["syscall"]
            .as_str()
            .expect("select_arch checked that every rule names its syscall")
            .to_owned();
        match by_syscall.iter_mut().find(|(s, _)| *s == syscall) {
            Some((_, same_syscall)) => same_syscall.push(rule),
            None => by_syscall.push((syscall, vec![rule])),
        }
    }

    let mut leaves = std::collections::BTreeMap::new();
    for (syscall, rules) in by_syscall {
        let program = compile_rules(rules)?;
        // The architecture check, the number loaded, the syscall's block, the default action.
        let block = program
            .strip_prefix(prologue.as_slice())
            .and_then(|rest| rest.split_first())
            .filter(|(load, _)| same(load, &load_nr))
            .map(|(_, block)| block)
            .filter(|block| block.last().is_some_and(|ret| same(ret, &default)))
            .ok_or_else(|| odd(format!("{syscall}: not one syscall's block")))?;
        let nr = match block.first() {
            Some(i) if (i.code, i.jt, i.jf) == (BPF_JEQ_K, 0, 1) => i.k,
            _ => return Err(odd(format!("{syscall}: no syscall number comparison"))),
        };
        // A syscall allowed outright: compare, skip over the action, the action, the default.
        let leaf = match block {
            [_, skip, over, ret, dflt, _]
                if same(skip, &insn(BPF_JMP_JA, 0, 0, 1))
                    && same(over, &insn(BPF_JMP_JA, 0, 0, 2))
                    && ret.code == BPF_RET_K
                    && same(dflt, &default) =>
            {
                Leaf::Return(ret.k)
            }
            _ => {
                if !stays_inside(block) {
                    return Err(odd(format!("{syscall}: a jump leaves the syscall's block")));
                }
                Leaf::Rules(block.to_vec())
            }
        };
        if leaves.insert(nr, leaf).is_some() {
            return Err(odd(format!(
                "{syscall}: syscall number {nr} compiled twice"
            )));
        }
    }

    // Ranges covering every 32-bit number, each with its first number; neighbours with the
    // same action are merged.
    let mut ranges: Vec<(u32, Leaf)> = Vec::new();
    let mut push = |first: u32, leaf: Leaf| match (ranges.last(), &leaf) {
        (Some((_, Leaf::Return(last))), Leaf::Return(k)) if last == k => {}
        _ => ranges.push((first, leaf)),
    };
    let mut next = 0;
    for (nr, leaf) in leaves {
        if nr > next {
            push(next, Leaf::Return(default.k));
        }
        push(nr, leaf);
        next = nr
            .checked_add(1)
            .ok_or_else(|| odd("syscall number u32::MAX".into()))?;
    }
    push(next, Leaf::Return(default.k));

    let mut program = prologue;
    program.push(load_nr);
    program.extend(search(&ranges));
    Ok(program)
}

/// Whether every path through `block` ends in one of its own returns: each jump lands inside
/// it and the last instruction returns.
fn stays_inside(block: &[sock_filter]) -> bool {
    let inside = |at: usize, offset: u32| at + 1 + (offset as usize) < block.len();
    block.last().is_some_and(|i| i.code == BPF_RET_K)
        && block.iter().enumerate().all(|(at, i)| match i.code {
            BPF_JMP_JA => inside(at, i.k),
            c if c & 0x07 == BPF_JMP => inside(at, i.jt.into()) && inside(at, i.jf.into()),
            _ => true,
        })
}

/// A binary search over `ranges` (sorted by their first syscall number, covering every
/// number) with the syscall number in the accumulator; every path ends in a return.
fn search(ranges: &[(u32, Leaf)]) -> Vec<sock_filter> {
    match ranges {
        [] => unreachable!("the ranges cover every number"),
        [(_, Leaf::Return(k))] => vec![insn(BPF_RET_K, 0, 0, *k)],
        [(_, Leaf::Rules(block))] => block.clone(),
        _ => {
            let mid = ranges.len() / 2;
            let pivot = ranges[mid].0;
            let below = search(&ranges[..mid]);
            let above = search(&ranges[mid..]);
            let mut out = Vec::with_capacity(2 + below.len() + above.len());
            // Numbers from `pivot` on go to `above`; a conditional jump reaches 255 ahead.
            match u8::try_from(below.len()) {
                Ok(skip) => out.push(insn(BPF_JGE_K, skip, 0, pivot)),
                Err(_) => {
                    out.push(insn(BPF_JGE_K, 0, 1, pivot));
                    out.push(insn(BPF_JMP_JA, 0, 0, below.len() as u32));
                }
            }
            out.extend(below);
            out.extend(above);
            out
        }
    }
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
