//! `libcorral_session.so`: the zygote (a Python interpreter) loads it and forks each session
//! with `corral_session_fork`, whose child enters the session's sandbox through
//! the engine's one implementation of the lockdown ([`corral_sandbox::session`]) and no
//! system call, struct layout or seccomp program is written in Python.
#![forbid(unsafe_code)]

pub use corral_sandbox::session::corral_session_fork;
