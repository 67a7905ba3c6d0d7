//! Code policy (docs/code-policy.md): which modules code may import, and how long it may be.
//!
//! Defence in depth, never a boundary: the length is checked here, on the host, before
//! anything starts; the imports are checked inside the sandbox, by the runtime that runs the
//! code (a static pre-check that refuses the code before any of it runs, and an import hook
//! while it runs), because the host never parses untrusted code. The code runs in the same
//! interpreter as that hook and can undo it; what holds whatever the code does is the sandbox.
//!
//! [`CodePolicy::new`] is the one place a policy is checked; every front-end builds its policy
//! there, and narrows a base policy (a server's, an API key's) with [`CodePolicy::narrowed_by`].

use std::collections::BTreeSet;
use std::fmt;

use corral_sandbox::{LanguageError, Violation, ViolationRule, POLICY_VIOLATION};
use serde::Serialize;

use crate::session::Language;

/// Most modules in each list.
pub const MAX_MODULES: usize = 1024;
/// Longest module name, in bytes.
pub const MAX_MODULE_NAME_BYTES: usize = 128;
/// Largest `max_code_bytes`: the largest code a kernel takes in one frame.
pub const MAX_CODE_BYTES: u64 = crate::protocol::MAX_FRAME as u64;

/// What code may import and how long it may be. The default allows everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodePolicy {
    allowed_modules: Option<BTreeSet<String>>,
    denied_modules: BTreeSet<String>,
    max_code_bytes: Option<usize>,
}

/// A field of a policy, as errors name it; front-ends name it their own way (`--allow-module`,
/// `policy.allowed_modules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyField {
    AllowedModules,
    DeniedModules,
    MaxCodeBytes,
}

impl PolicyField {
    pub fn name(self) -> &'static str {
        match self {
            PolicyField::AllowedModules => "allowed_modules",
            PolicyField::DeniedModules => "denied_modules",
            PolicyField::MaxCodeBytes => "max_code_bytes",
        }
    }
}

impl fmt::Display for PolicyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy that cannot be: a bad module name, too many modules, a length out of range, or
/// module rules for a language without modules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{field}: {name:?} is not a module name ({why})")]
    InvalidModule {
        field: PolicyField,
        name: String,
        why: &'static str,
    },
    #[error("{field}: {count} modules, more than the {MAX_MODULES} a list may hold")]
    TooManyModules { field: PolicyField, count: usize },
    #[error("{field} must be between 1 and {MAX_CODE_BYTES} (asked: {asked})")]
    MaxCodeBytes { field: PolicyField, asked: u64 },
    #[error(
        "{language} has no modules: a code policy for it can only set max_code_bytes (its \
         allowed_modules and denied_modules cannot be checked)"
    )]
    NoModules { language: &'static str },
}

impl PolicyError {
    /// The field at fault, if one is.
    pub fn field(&self) -> Option<PolicyField> {
        match self {
            PolicyError::InvalidModule { field, .. }
            | PolicyError::TooManyModules { field, .. }
            | PolicyError::MaxCodeBytes { field, .. } => Some(*field),
            PolicyError::NoModules { .. } => None,
        }
    }

    /// The message with the field named as the caller knows it (`--allow-module`,
    /// `policy.allowed_modules`).
    pub fn naming(&self, field: &str) -> String {
        let text = self.to_string();
        match self.field() {
            Some(f) => format!("{field}{}", &text[f.name().len()..]),
            None => text,
        }
    }
}

/// A request that would widen the policy it narrows ([`CodePolicy::narrowed_by`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Widening {
    #[error(
        "allowed_modules: {} not allowed by the policy in force (it allows only: {})",
        quoted(modules),
        listed(allowed)
    )]
    NotAllowed {
        modules: Vec<String>,
        allowed: Vec<String>,
    },
    #[error("allowed_modules: {} denied by the policy in force", quoted(modules))]
    Denied { modules: Vec<String> },
    #[error("max_code_bytes: {asked} is more than the {limit} of the policy in force")]
    MoreCode { asked: usize, limit: usize },
}

fn quoted(modules: &[String]) -> String {
    let names: Vec<String> = modules.iter().map(|m| format!("`{m}`")).collect();
    let verb = if modules.len() == 1 { "is" } else { "are" };
    format!("{} {verb}", names.join(", "))
}

fn listed(modules: &[String]) -> String {
    if modules.is_empty() {
        "no module".into()
    } else {
        modules.join(", ")
    }
}

/// The module rules a kernel is told (docs/kernel-protocol.md): the fields of its `policy`
/// frame, and of a forked run's `run` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModuleRules<'a> {
    pub allowed_modules: Option<&'a BTreeSet<String>>,
    pub denied_modules: &'a BTreeSet<String>,
}

/// Why `name` is not a module name, if it is not: ASCII letters, digits, `_`, `-` and `.`
/// (Python's dotted names, npm's package names), or an npm scope `@scope/name`; no empty part.
fn invalid_module(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > MAX_MODULE_NAME_BYTES {
        return Some("longer than 128 bytes");
    }
    let bare = match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, rest)) if !scope.is_empty() && !rest.is_empty() => {
                if !part_ok(scope) {
                    return Some("a scope is letters, digits, `_`, `-` and `.`");
                }
                rest
            }
            _ => return Some("a scoped name is `@scope/name`"),
        },
        None => name,
    };
    if bare.contains('/') {
        return Some("a module is named without a path: `fs`, not `fs/promises`");
    }
    if !part_ok(bare) {
        return Some("only ASCII letters, digits, `_`, `-` and `.` between the dots");
    }
    None
}

fn part_ok(part: &str) -> bool {
    part.split('.').all(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// Whether `module` is `entry` or one of its submodules (`os.path` for `os`).
fn within(module: &str, entry: &str) -> bool {
    module
        .strip_prefix(entry)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn module_set(
    field: PolicyField,
    names: impl IntoIterator<Item = String>,
) -> Result<BTreeSet<String>, PolicyError> {
    let mut set = BTreeSet::new();
    for name in names {
        if let Some(why) = invalid_module(&name) {
            return Err(PolicyError::InvalidModule { field, name, why });
        }
        set.insert(name);
        if set.len() > MAX_MODULES {
            return Err(PolicyError::TooManyModules {
                field,
                count: set.len(),
            });
        }
    }
    Ok(set)
}

impl CodePolicy {
    /// A policy: code may import only `allowed_modules` (when given; an empty list allows
    /// none), never `denied_modules` (which win over the allowed ones), and be at most
    /// `max_code_bytes` long. A name covers its submodules. Checked: module names
    /// ([`MAX_MODULE_NAME_BYTES`]), at most [`MAX_MODULES`] per list, a length of 1 to
    /// [`MAX_CODE_BYTES`].
    pub fn new(
        allowed_modules: Option<impl IntoIterator<Item = String>>,
        denied_modules: impl IntoIterator<Item = String>,
        max_code_bytes: Option<u64>,
    ) -> Result<CodePolicy, PolicyError> {
        let allowed_modules = allowed_modules
            .map(|names| module_set(PolicyField::AllowedModules, names))
            .transpose()?;
        let denied_modules = module_set(PolicyField::DeniedModules, denied_modules)?;
        let max_code_bytes = max_code_bytes
            .map(|asked| match usize::try_from(asked) {
                Ok(n) if (1..=MAX_CODE_BYTES).contains(&asked) => Ok(n),
                _ => Err(PolicyError::MaxCodeBytes {
                    field: PolicyField::MaxCodeBytes,
                    asked,
                }),
            })
            .transpose()?;
        Ok(CodePolicy {
            allowed_modules,
            denied_modules,
            max_code_bytes,
        })
    }

    pub fn allowed_modules(&self) -> Option<&BTreeSet<String>> {
        self.allowed_modules.as_ref()
    }

    pub fn denied_modules(&self) -> &BTreeSet<String> {
        &self.denied_modules
    }

    pub fn max_code_bytes(&self) -> Option<usize> {
        self.max_code_bytes
    }

    /// Whether it says anything about modules.
    pub fn has_module_rules(&self) -> bool {
        self.allowed_modules.is_some() || !self.denied_modules.is_empty()
    }

    /// What a kernel of `language` is told, when there is anything to tell: bash has no
    /// modules, so its kernels are told nothing (only the length applies to it).
    pub fn module_rules(&self, language: Language) -> Option<ModuleRules<'_>> {
        (self.has_module_rules() && language != Language::Bash).then_some(ModuleRules {
            allowed_modules: self.allowed_modules.as_ref(),
            denied_modules: &self.denied_modules,
        })
    }

    /// Refuses module rules for a language without modules (bash), which could not be
    /// checked: a caller that asks for them is told so rather than ignored.
    pub fn check_language(&self, language: Language) -> Result<(), PolicyError> {
        if language == Language::Bash && self.has_module_rules() {
            return Err(PolicyError::NoModules {
                language: language.name(),
            });
        }
        Ok(())
    }

    /// The policy for code of `language`: this one, without its module rules for bash (a
    /// base policy a server applies to every language, whose module rules bash code cannot
    /// break).
    pub fn for_language(&self, language: Language) -> CodePolicy {
        match language {
            Language::Bash => CodePolicy {
                max_code_bytes: self.max_code_bytes,
                ..CodePolicy::default()
            },
            Language::Python | Language::Javascript => self.clone(),
        }
    }

    /// The policy `request` asks for within this one, which it may only narrow: its allowed
    /// modules must all be allowed here (and none denied here), and its length no more than
    /// this one's. What it leaves out is this policy's; the denied modules of both apply.
    pub fn narrowed_by(&self, request: &CodePolicy) -> Result<CodePolicy, Widening> {
        let allowed_modules = match (&self.allowed_modules, &request.allowed_modules) {
            (base, None) => base.clone(),
            (base, Some(asked)) => {
                let denied: Vec<String> = asked
                    .iter()
                    .filter(|m| self.denied_modules.iter().any(|d| within(m, d)))
                    .cloned()
                    .collect();
                if !denied.is_empty() {
                    return Err(Widening::Denied { modules: denied });
                }
                if let Some(base) = base {
                    let outside: Vec<String> = asked
                        .iter()
                        .filter(|m| !base.iter().any(|b| within(m, b)))
                        .cloned()
                        .collect();
                    if !outside.is_empty() {
                        return Err(Widening::NotAllowed {
                            modules: outside,
                            allowed: base.iter().cloned().collect(),
                        });
                    }
                }
                Some(asked.clone())
            }
        };
        let max_code_bytes = match (self.max_code_bytes, request.max_code_bytes) {
            (Some(limit), Some(asked)) if asked > limit => {
                return Err(Widening::MoreCode { asked, limit })
            }
            (base, asked) => asked.or(base),
        };
        let mut denied_modules = self.denied_modules.clone();
        denied_modules.extend(request.denied_modules.iter().cloned());
        Ok(CodePolicy {
            allowed_modules,
            denied_modules,
            max_code_bytes,
        })
    }

    /// The error that refuses code of `len` bytes, when it is longer than `max_code_bytes`.
    pub fn length_violation(&self, len: usize) -> Option<LanguageError> {
        let limit = self.max_code_bytes.filter(|&limit| len > limit)?;
        let value = format!(
            "the code is {len} bytes, more than the {limit} bytes the code policy allows \
             (max_code_bytes); it was not run: make it shorter"
        );
        Some(LanguageError {
            name: POLICY_VIOLATION.into(),
            traceback: format!("{POLICY_VIOLATION}: {value}"),
            value,
            violations: vec![Violation {
                rule: ViolationRule::MaxCodeBytes,
                line: None,
                module: None,
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn policy(allowed: Option<&[&str]>, denied: &[&str], max: Option<u64>) -> CodePolicy {
        CodePolicy::new(allowed.map(names), names(denied), max).unwrap()
    }

    #[test]
    fn module_names_are_python_or_npm_names() {
        let ok = [
            "numpy",
            "os.path",
            "_strptime",
            "left-pad",
            "socket.io",
            "@types/node",
            "@scope/pkg.x",
        ];
        policy(Some(&ok), &ok, None);
        for bad in [
            "",
            "os..path",
            ".os",
            "os.",
            "fs/promises",
            "@scope",
            "@/x",
            "@a/b/c",
            "na me",
            "mod\0",
            "ünïcode",
            &"x".repeat(129),
        ] {
            let err = CodePolicy::new(Some(names(&[bad])), Vec::new(), None).unwrap_err();
            assert!(
                matches!(&err, PolicyError::InvalidModule { field: PolicyField::AllowedModules, name, .. } if name == bad),
                "{bad:?}: {err}"
            );
            let err = CodePolicy::new(None::<Vec<String>>, names(&[bad]), None).unwrap_err();
            assert_eq!(err.field(), Some(PolicyField::DeniedModules), "{bad:?}");
        }
    }

    #[test]
    fn lists_and_lengths_are_bounded() {
        let many: Vec<String> = (0..=MAX_MODULES).map(|i| format!("m{i}")).collect();
        assert!(matches!(
            CodePolicy::new(None::<Vec<String>>, many.clone(), None),
            Err(PolicyError::TooManyModules { count, .. }) if count == MAX_MODULES + 1
        ));
        CodePolicy::new(Some(many[..MAX_MODULES].to_vec()), Vec::new(), None).unwrap();
        for bad in [0, MAX_CODE_BYTES + 1, u64::MAX] {
            let err = CodePolicy::new(None::<Vec<String>>, Vec::new(), Some(bad)).unwrap_err();
            assert_eq!(
                err,
                PolicyError::MaxCodeBytes {
                    field: PolicyField::MaxCodeBytes,
                    asked: bad
                }
            );
        }
        let err = CodePolicy::new(None::<Vec<String>>, Vec::new(), Some(0)).unwrap_err();
        assert_eq!(
            err.naming("--max-code-bytes"),
            format!("--max-code-bytes must be between 1 and {MAX_CODE_BYTES} (asked: 0)")
        );
        let err = CodePolicy::new(Some(names(&["a b"])), Vec::new(), None).unwrap_err();
        assert!(
            err.naming("policy.allowed_modules")
                .starts_with("policy.allowed_modules: \"a b\" is not a module name"),
            "{err}"
        );
    }

    #[test]
    fn the_default_policy_says_nothing() {
        let p = CodePolicy::default();
        assert!(!p.has_module_rules());
        assert_eq!(p.module_rules(Language::Python), None);
        assert_eq!(p.length_violation(usize::MAX), None);
        // An empty allow-list is a rule: nothing may be imported.
        let none = policy(Some(&[]), &[], None);
        assert!(none.has_module_rules());
        assert_eq!(
            serde_json::to_value(none.module_rules(Language::Python).unwrap()).unwrap(),
            serde_json::json!({"allowed_modules": [], "denied_modules": []})
        );
    }

    #[test]
    fn bash_takes_only_the_length() {
        let p = policy(Some(&["numpy"]), &["socket"], Some(100));
        assert_eq!(
            p.check_language(Language::Bash),
            Err(PolicyError::NoModules { language: "bash" })
        );
        p.check_language(Language::Python).unwrap();
        p.check_language(Language::Javascript).unwrap();
        assert_eq!(p.module_rules(Language::Bash), None);
        let bash = p.for_language(Language::Bash);
        assert_eq!(bash, policy(None, &[], Some(100)));
        bash.check_language(Language::Bash).unwrap();
        assert_eq!(p.for_language(Language::Python), p);
    }

    #[test]
    fn code_over_the_length_is_refused_naming_the_limit() {
        let p = policy(None, &[], Some(10));
        assert_eq!(p.length_violation(10), None);
        let e = p.length_violation(11).unwrap();
        assert_eq!(e.name, "PolicyViolation");
        assert!(
            e.value.contains("11 bytes, more than the 10 bytes"),
            "{}",
            e.value
        );
        assert_eq!(
            e.violations,
            [Violation {
                rule: ViolationRule::MaxCodeBytes,
                line: None,
                module: None
            }]
        );
    }

    #[test]
    fn a_request_narrows_the_base_and_never_widens_it() {
        let base = policy(
            Some(&["numpy", "pandas", "os"]),
            &["os.system_helpers", "socket"],
            Some(1000),
        );
        // Absent fields inherit; denied modules add up; the length is the request's.
        let asked = policy(Some(&["numpy", "os.path"]), &["pickle"], Some(500));
        let narrowed = base.narrowed_by(&asked).unwrap();
        assert_eq!(
            narrowed,
            policy(
                Some(&["numpy", "os.path"]),
                &["os.system_helpers", "pickle", "socket"],
                Some(500)
            )
        );
        assert_eq!(base.narrowed_by(&CodePolicy::default()).unwrap(), base);
        // Widening, each way.
        assert_eq!(
            base.narrowed_by(&policy(Some(&["numpy", "scipy", "requests"]), &[], None)),
            Err(Widening::NotAllowed {
                modules: names(&["requests", "scipy"]),
                allowed: names(&["numpy", "os", "pandas"]),
            })
        );
        let denied = base
            .narrowed_by(&policy(Some(&["socket"]), &[], None))
            .unwrap_err();
        assert_eq!(
            denied.to_string(),
            "allowed_modules: `socket` is denied by the policy in force"
        );
        assert_eq!(
            base.narrowed_by(&policy(None, &[], Some(1001))),
            Err(Widening::MoreCode {
                asked: 1001,
                limit: 1000
            })
        );
        // A base without an allow-list takes the request's; without a length, the request's.
        let open = policy(None, &["socket"], None);
        assert_eq!(
            open.narrowed_by(&policy(Some(&["json"]), &[], Some(7))),
            Ok(policy(Some(&["json"]), &["socket"], Some(7)))
        );
        assert!(matches!(
            open.narrowed_by(&policy(Some(&["socket.x"]), &[], None)),
            Err(Widening::Denied { .. })
        ));
    }
}
