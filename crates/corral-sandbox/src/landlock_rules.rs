//! The workload's Landlock domain: the image read-only, the scratch areas read-write.

use landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest ABI whose rights we have reviewed; newer kernels enforce this subset.
const ABI_VERSION: ABI = ABI::V6;

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("{0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("the kernel does not enforce Landlock (kernel >= 5.13 with lsm=landlock needed; pass --allow-degraded to run without it)")]
    NotEnforced,
}

/// Restricts the calling process (must run after pivot_root). With `required`, a kernel
/// without Landlock is an error; otherwise the sandbox runs without this layer.
pub fn restrict(required: bool) -> Result<(), LandlockError> {
    let read = AccessFs::from_read(ABI_VERSION);
    let all = AccessFs::from_all(ABI_VERSION);
    let device = AccessFs::from_file(ABI_VERSION) | AccessFs::ReadDir;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?
        .scope(Scope::from_all(ABI_VERSION))?
        .create()?
        .add_rules(path_beneath_rules(["/"], read))?
        .add_rules(path_beneath_rules(["/dev"], device))?
        .add_rules(path_beneath_rules(["/workspace", "/tmp", "/dev/shm"], all))?
        .restrict_self()?;
    if required && status.ruleset == RulesetStatus::NotEnforced {
        return Err(LandlockError::NotEnforced);
    }
    Ok(())
}

/// The Landlock ABI version the running kernel supports (0 when it has none).
pub fn kernel_abi() -> i64 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attribute pointer and size 0 only
    // returns the ABI version.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    rc.max(0)
}
