//! Build progress as events, so the library stays UI-agnostic: the CLI draws a progress
//! bar or prints log lines, tests record the events.

use std::fmt;
use std::time::Duration;

/// The steps of a build, in order. `Pypi` only happens when the recipe lists PyPI packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Bootstrap,
    Packages,
    Pypi,
    FontCache,
    Finalize,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so that width and alignment in format strings apply.
        f.pad(match self {
            Phase::Bootstrap => "bootstrap",
            Phase::Packages => "packages",
            Phase::Pypi => "pypi",
            Phase::FontCache => "font cache",
            Phase::Finalize => "finalize",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// Another process is building the same image; this one waits for it.
    Waiting {
        name: &'a str,
    },
    /// The build starts; `phases` is the whole plan.
    Start {
        name: &'a str,
        hash: &'a str,
        suite: &'a str,
        mirror: &'a str,
        phases: &'a [Phase],
    },
    Phase(Phase),
    /// How far the current phase is, from 0 to 1, when the tool tells.
    Fraction(f64),
    /// One line of a tool's output (also written to the build log).
    Output(&'a str),
    /// Something worth telling that is not an error (for example a skipped optional package).
    Note(&'a str),
    PhaseDone(Phase, Duration),
}

pub trait Progress {
    fn event(&mut self, event: Event<'_>);
}
