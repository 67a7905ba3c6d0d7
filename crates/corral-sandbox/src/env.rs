//! The one rule for environment variables, which every layer applies to what a caller asks
//! for (a request's `env`, a command's, a process's, a one-shot run's): a name is not empty
//! and holds neither `=` nor a NUL byte; a value holds no NUL byte. No process environment
//! can hold anything else.

/// A variable no process environment can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{0:?} is not a valid variable name (non-empty, no '=' or NUL)")]
    Name(String),
    #[error("the value of {0:?} holds a NUL byte")]
    Value(String),
}

/// Checks one variable against the rule.
pub fn check_var(name: &str, value: &str) -> Result<(), EnvError> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return Err(EnvError::Name(name.to_string()));
    }
    if value.contains('\0') {
        return Err(EnvError::Value(name.to_string()));
    }
    Ok(())
}

/// Checks every variable of `env`; the first that breaks the rule is the error.
pub fn check<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), EnvError> {
    env.into_iter().try_for_each(|(k, v)| check_var(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_no_environment_can_hold_are_refused() {
        assert_eq!(check([("A", "1"), ("B_2", ""), ("x y", "=\n")]), Ok(()));
        for bad in ["", "A=B", "=", "A\0"] {
            assert_eq!(
                check_var(bad, "1"),
                Err(EnvError::Name(bad.into())),
                "{bad:?}"
            );
        }
        assert_eq!(check_var("A", "1\0"), Err(EnvError::Value("A".into())));
        assert_eq!(
            check([("A", "1"), ("", "2"), ("B", "\0")]),
            Err(EnvError::Name(String::new())),
            "the first that breaks the rule"
        );
    }
}
