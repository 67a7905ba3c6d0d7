//! Which modules a Python program imports, by a static look at its text: what decides which of
//! an image's zygotes forks a one-shot run ([`crate::zygote::Zygote::prefers_full`]).
//!
//! The look is textual and conservative: it finds every `import a.b as c, d` and
//! `from a.b import c` in the program, including those in functions, in branches never
//! taken, in comments and in string literals. It misses imports made at run time
//! (`__import__`, `importlib.import_module`, `exec` of built text). A miss or a superfluous
//! find changes only which zygote serves the run, never its result: both run the program as a
//! fresh interpreter does, and a module not imported in the zygote is imported by the run.

use std::collections::BTreeSet;

/// The top-level names of the modules that `code` imports (`a` for `import a.b` or
/// `from a.b import c`). Relative imports (`from . import x`) name none.
pub fn imported_modules(code: &[u8]) -> BTreeSet<&str> {
    let words = Words { code, at: 0 };
    let words: Vec<Word<'_>> = words.collect();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            Word::Name(b"import") => {
                // import a.b [as c] {, d.e [as f]}
                i += 1;
                while let Some((name, next)) = dotted_name(&words, i) {
                    found.extend(name);
                    i = next;
                    if words.get(i) == Some(&Word::Name(b"as")) {
                        i += 2;
                    }
                    if words.get(i) != Some(&Word::Punct(b',')) {
                        break;
                    }
                    i += 1;
                }
            }
            Word::Name(b"from") => {
                // from a.b import c (not `yield from x`, `raise E from e`); from . import d
                i += 1;
                let relative = words.get(i) == Some(&Word::Punct(b'.'));
                while words.get(i) == Some(&Word::Punct(b'.')) {
                    i += 1;
                }
                let (name, next) = match words.get(i) {
                    Some(Word::Name(b"import")) => (None, i), // from . import d
                    _ => dotted_name(&words, i).unwrap_or((None, i)),
                };
                if words.get(next) != Some(&Word::Name(b"import")) {
                    continue;
                }
                if !relative {
                    found.extend(name);
                }
                // What it imports from there are names, not modules.
                i = next + 1;
                while let Some(word) = words.get(i) {
                    match word {
                        Word::Name(b"import" | b"from") => break,
                        Word::Name(_) | Word::Punct(b'(' | b')' | b',' | b'*') => i += 1,
                        Word::Punct(_) => break,
                    }
                }
            }
            _ => i += 1,
        }
    }
    found
}

/// The dotted name starting at `words[i]`: its first part (`None` when it is not valid
/// UTF-8) and the index after it.
fn dotted_name<'a>(words: &[Word<'a>], mut i: usize) -> Option<(Option<&'a str>, usize)> {
    let Some(Word::Name(first)) = words.get(i) else {
        return None;
    };
    i += 1;
    while words.get(i) == Some(&Word::Punct(b'.'))
        && matches!(words.get(i + 1), Some(Word::Name(_)))
    {
        i += 2;
    }
    Some((std::str::from_utf8(first).ok(), i))
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Word<'a> {
    /// A run of identifier characters (ASCII letters, digits, `_`, and any non-ASCII byte).
    Name(&'a [u8]),
    /// Any other character but white space and line continuations.
    Punct(u8),
}

/// The words of a text, white space (newlines and `\` continuations included) between them.
struct Words<'a> {
    code: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Words<'a> {
    type Item = Word<'a>;

    fn next(&mut self) -> Option<Word<'a>> {
        let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
        loop {
            let &b = self.code.get(self.at)?;
            if b.is_ascii_whitespace() || b == b'\\' {
                self.at += 1;
                continue;
            }
            let start = self.at;
            self.at += 1;
            if !is_name(b) {
                return Some(Word::Punct(b));
            }
            while self.code.get(self.at).is_some_and(|&b| is_name(b)) {
                self.at += 1;
            }
            return Some(Word::Name(&self.code[start..self.at]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(code: &str) -> Vec<&str> {
        imported_modules(code.as_bytes()).into_iter().collect()
    }

    #[test]
    fn finds_import_and_from_statements_anywhere() {
        assert_eq!(names("print(1)"), Vec::<&str>::new());
        assert_eq!(names("import os"), ["os"]);
        assert_eq!(
            names("import numpy as np, pandas.io.json as j,sys\nx = 1"),
            ["numpy", "pandas", "sys"]
        );
        assert_eq!(
            names("from matplotlib import pyplot as plt\nfrom scipy.stats import (norm,\n t)"),
            ["matplotlib", "scipy"]
        );
        assert_eq!(
            names("def f():\n    if False:\n        import seaborn\n    return 1"),
            ["seaborn"]
        );
        assert_eq!(names("import os; import json"), ["json", "os"]);
        assert_eq!(names("from \\\n  numpy \\\n import array"), ["numpy"]);
        assert_eq!(names("import\tnumpy . linalg"), ["numpy"]);
        assert_eq!(names("from ünïcode import x"), ["ünïcode"]);
    }

    #[test]
    fn over_approximates_in_comments_and_strings() {
        assert_eq!(names("# import pandas\nprint(1)"), ["pandas"]);
        assert_eq!(names("s = 'from numpy import x'"), ["numpy"]);
    }

    #[test]
    fn ignores_what_is_not_an_import_of_a_module() {
        assert_eq!(
            names("from . import sibling\nfrom ..pkg import (x,\n y as z)\nfrom os import *"),
            ["os"]
        );
        assert_eq!(
            names("from json import loads\nimport numpy"),
            ["json", "numpy"]
        );
        assert_eq!(
            names("def g():\n    yield from range(3)\nraise ValueError from None"),
            Vec::<&str>::new()
        );
        assert_eq!(
            names("important = 1\nfromage = 2\nx.import_ = 3"),
            Vec::<&str>::new()
        );
        assert_eq!(names("import"), Vec::<&str>::new());
        assert_eq!(names("from numpy"), Vec::<&str>::new());
        assert_eq!(names("__import__('pandas')"), Vec::<&str>::new());
        // Not UTF-8: not a module name (Python refuses the program).
        assert!(imported_modules(b"import \xff\xfe").is_empty());
    }
}
