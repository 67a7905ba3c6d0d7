//! `libcorral_session.so`: the zygote (a Python interpreter) loads it and calls
//! `corral_session_enter` in each forked child, so that a session enters its sandbox through
//! the engine's one implementation of the lockdown ([`corral_sandbox::session`]) and no
//! system call, struct layout or seccomp program is written in Python.
#![forbid(unsafe_code)]

pub use corral_sandbox::session::corral_session_enter;
