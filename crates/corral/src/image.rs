//! `corral image build | ls | rm | inspect`: a thin layer over `corral-image`, plus the
//! build progress display that `corral run` also uses for a first-use build.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use corral_image::{Built, Event, ImageError, Phase, Progress, Recipe, Store};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
    /// Where images are stored [default: $XDG_DATA_HOME/corral, else ~/.local/share/corral,
    /// or /var/lib/corral for root].
    #[arg(long, global = true, env = "CORRAL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build an image from a built-in recipe (default) or a recipe file. An unchanged recipe
    /// is never rebuilt.
    Build {
        /// Built-in recipe to build.
        #[arg(default_value = "default", conflicts_with = "recipe")]
        name: String,
        /// Build your own recipe (TOML; see crates/corral-image/recipes/default.toml).
        #[arg(long, value_name = "FILE")]
        recipe: Option<PathBuf>,
    },
    /// List the built images.
    Ls,
    /// Remove every image of that name (or the one whose hash starts with it).
    Rm { name: String },
    /// Print an image's manifest as JSON.
    Inspect { name: String },
}

pub fn main(args: ImageArgs) -> i32 {
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("corral image: {e:#}");
            1
        }
    }
}

fn run(args: ImageArgs) -> Result<()> {
    let store = Store::open(args.data_dir.as_deref());
    match args.command {
        ImageCommand::Build { name, recipe } => {
            let recipe = match recipe {
                Some(path) => Recipe::from_file(&path)?,
                None => Recipe::builtin(&name).with_context(|| {
                    format!(
                        "no built-in recipe `{name}` (the built-ins are default and host); \
                         build your own with --recipe FILE"
                    )
                })?,
            };
            build(&store, recipe)?;
        }
        ImageCommand::Ls => list(&store)?,
        ImageCommand::Rm { name } => {
            for m in store.remove(&name)? {
                println!("removed {} ({})", m.name, short(&m.hash));
            }
        }
        ImageCommand::Inspect { name } => {
            let manifest = store.inspect(&name)?;
            println!("{}", serde_json::to_string_pretty(&manifest)?);
        }
    }
    Ok(())
}

/// Builds `recipe` with progress on stderr (a bar on a terminal, log lines otherwise).
pub fn build(store: &Store, recipe: Recipe) -> Result<Built, ImageError> {
    let name = recipe.name.clone();
    let mut reporter = Reporter::new();
    let built = store.build(recipe, &mut reporter)?;
    reporter.finish();
    let m = &built.image.manifest;
    if built.already_built {
        eprintln!(
            "corral: image {name} ({}) is up to date: built {} from an unchanged recipe",
            short(&m.hash),
            m.created
        );
    } else {
        eprintln!(
            "corral: built image {name} ({}): {} in {}, at {}",
            short(&m.hash),
            human_size(m.size_bytes),
            human_duration(Duration::from_secs_f64(m.build_seconds)),
            built.image.path.display()
        );
    }
    Ok(built)
}

fn list(store: &Store) -> Result<()> {
    let mut rows = vec![[
        "NAME".to_string(),
        "HASH".into(),
        "SIZE".into(),
        "CREATED".into(),
        "LANGUAGES".into(),
    ]];
    rows.push([
        "host".into(),
        "-".into(),
        "-".into(),
        "(built in: the host's /usr)".into(),
        String::new(),
    ]);
    for image in store.list()? {
        let m = &image.manifest;
        let mut created = m.created.clone();
        if image.shared {
            created.push_str(" (shared store)");
        }
        rows.push([
            m.name.clone(),
            short(&m.hash).into(),
            human_size(m.size_bytes),
            created,
            m.languages.join(","),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

fn human_size(bytes: u64) -> String {
    let mut value = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if value < 1024.0 || unit == "GiB" {
            return if unit == "B" {
                format!("{bytes} B")
            } else {
                format!("{value:.1} {unit}")
            };
        }
        value /= 1024.0;
    }
    unreachable!("the loop returns at GiB")
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Shows build events: an indicatif bar on a terminal, plain log lines otherwise (CI logs).
struct Reporter {
    bar: Option<ProgressBar>,
    phases: Vec<Phase>,
    current: usize,
    started: Instant,
    /// Non-terminal: the last quarter of the current phase that was logged.
    logged_quarter: u32,
}

impl Reporter {
    fn new() -> Self {
        Reporter {
            bar: None,
            phases: Vec::new(),
            current: 0,
            started: Instant::now(),
            logged_quarter: 0,
        }
    }

    fn terminal() -> bool {
        std::io::stderr().is_terminal()
    }

    fn log(&self, text: &str) {
        let secs = self.started.elapsed().as_secs();
        eprintln!("corral: [{:>2}:{:02}] {text}", secs / 60, secs % 60);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Reporter {
    /// On failure the bar stays where it stopped, above the error message.
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

impl Progress for Reporter {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Waiting { name } => {
                eprintln!("corral: another corral is building image {name}; waiting for it")
            }
            Event::Start {
                name,
                hash,
                suite,
                mirror,
                phases,
            } => {
                self.phases = phases.to_vec();
                self.started = Instant::now();
                let names: Vec<String> = phases.iter().map(|p| p.to_string()).collect();
                eprintln!(
                    "corral: building image {name} ({}): Debian {suite} from {mirror}; \
                     {} (takes a few minutes)",
                    short(hash),
                    names.join(", ")
                );
                if Self::terminal() {
                    let bar =
                        ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr());
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{spinner:.green} {prefix:<16.bold} [{elapsed_precise}] \
                             {bar:24.cyan/blue} {wide_msg:.dim}",
                        )
                        .expect("a valid template")
                        .progress_chars("=> "),
                    );
                    bar.enable_steady_tick(Duration::from_millis(120));
                    self.bar = Some(bar);
                }
            }
            Event::Phase(phase) => {
                self.current += 1;
                self.logged_quarter = 0;
                let prefix = format!("[{}/{}] {phase}", self.current, self.phases.len());
                match &self.bar {
                    Some(bar) => {
                        bar.set_prefix(prefix);
                        bar.set_position(0);
                        bar.set_message("");
                    }
                    None => self.log(&prefix),
                }
            }
            Event::Fraction(f) => match &self.bar {
                Some(bar) => bar.set_position((f * 1000.0) as u64),
                None => {
                    let quarter = (f * 4.0).floor() as u32;
                    if (1..4).contains(&quarter) && quarter > self.logged_quarter {
                        self.logged_quarter = quarter;
                        let phase = self.phases.get(self.current.wrapping_sub(1));
                        let phase = phase.map(|p| p.to_string()).unwrap_or_default();
                        self.log(&format!("{phase} {}%", quarter * 25));
                    }
                }
            },
            Event::Output(line) => {
                if let Some(bar) = &self.bar {
                    bar.set_message(line.to_string());
                }
            }
            Event::Note(text) => match &self.bar {
                Some(bar) => bar.println(format!("  note: {text}")),
                None => self.log(&format!("note: {text}")),
            },
            Event::PhaseDone(phase, took) => match &self.bar {
                Some(bar) => bar.println(format!("  done {phase:<11} {}", human_duration(took))),
                None => self.log(&format!("{phase} done in {}", human_duration(took))),
            },
        }
    }
}

/// The exact command that builds `name`, as this user would have to type it.
pub fn build_command(name: &str, data_dir: Option<&Path>) -> String {
    let sudo = if nix::unistd::geteuid().is_root() {
        ""
    } else {
        "sudo "
    };
    match data_dir {
        Some(dir) => format!(
            "{sudo}corral image build {name} --data-dir {}",
            dir.display()
        ),
        None => format!("{sudo}corral image build {name}"),
    }
}

/// Asks on the terminal whether to build `name` now; false when there is no terminal.
pub fn confirm_build(name: &str, command: &str) -> Result<bool> {
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Ok(false);
    }
    eprint!(
        "corral: image `{name}` is not built yet. Build it now ({command}; a few minutes, \
         downloads packages from the Debian mirror)? [Y/n] "
    );
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("reading the answer")?;
    let answer = answer.trim().to_ascii_lowercase();
    if !(answer.is_empty() || answer == "y" || answer == "yes") {
        bail!("not building image `{name}`; build it later with `{command}`");
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(1_288_490_189), "1.2 GiB");
        assert_eq!(human_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(human_duration(Duration::from_millis(5200)), "5.2s");
    }
}
