//! What the host says about Debian: its suite, and the mirror in its apt sources.
//!
//! Corral never names a mirror itself: machines often reach only their own (a proxy, a
//! snapshot, a local cache), so an image is bootstrapped from the mirror the host's apt uses.

use std::path::Path;

use crate::ImageError;

const OS_RELEASE: &str = "/etc/os-release";
const SOURCES_LIST: &str = "/etc/apt/sources.list";
const SOURCES_DIR: &str = "/etc/apt/sources.list.d";

/// One enabled `deb` entry of an apt sources file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
}

/// Where an image's packages come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The archive that serves the suite itself (what debootstrap is given).
    pub uri: String,
    pub components: Vec<String>,
    /// The image's `/etc/apt/sources.list`: the suite and its companions (`-updates`,
    /// `-security`) from the host's sources, so the image gets the host's security fixes.
    pub sources_list: String,
}

/// The host's Debian codename (`VERSION_CODENAME` in /etc/os-release).
pub fn host_codename() -> Result<String, ImageError> {
    let text = std::fs::read_to_string(OS_RELEASE).map_err(|e| ImageError::Host {
        message: format!("cannot read {OS_RELEASE} to find the host's Debian suite: {e}"),
    })?;
    codename_from_os_release(&text).ok_or_else(|| ImageError::Host {
        message: format!(
            "{OS_RELEASE} has no VERSION_CODENAME; set `suite = \"bookworm\"` (or another \
             suite) in a recipe instead of \"host\""
        ),
    })
}

fn codename_from_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix("VERSION_CODENAME=")?;
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// Every enabled `deb` entry of the host: /etc/apt/sources.list, then the one-line `.list`
/// and deb822 `.sources` files of /etc/apt/sources.list.d in name order.
pub fn host_sources() -> Vec<AptSource> {
    let mut sources = read(Path::new(SOURCES_LIST)).map_or_else(Vec::new, |t| parse_one_line(&t));
    let mut entries: Vec<_> = std::fs::read_dir(SOURCES_DIR)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    for path in entries {
        let Some(text) = read(&path) else { continue };
        match path.extension().and_then(|e| e.to_str()) {
            Some("list") => sources.extend(parse_one_line(&text)),
            Some("sources") => sources.extend(parse_deb822(&text)),
            _ => {}
        }
    }
    sources
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `deb [options] URI SUITE COMPONENT...` lines.
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line
            .strip_prefix("deb ")
            .or_else(|| line.strip_prefix("deb\t"))
        else {
            continue;
        };
        let mut rest = rest.trim_start();
        if rest.starts_with('[') {
            match rest.find(']') {
                Some(end) => rest = rest[end + 1..].trim_start(),
                None => continue,
            }
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(AptSource {
            uri: uri.to_string(),
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
        });
    }
    out
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`), separated by
/// blank lines; comment lines are ignored and continuation lines are joined.
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in stanza.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with(' ') || line.starts_with('\t') {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                fields.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let get = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let words = |key: &str| -> Vec<String> {
            get(key)
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default()
        };
        let enabled = get("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if !enabled || !words("types").iter().any(|t| t == "deb") {
            continue;
        }
        for uri in words("uris") {
            out.push(AptSource {
                uri,
                suites: words("suites"),
                components: words("components"),
            });
        }
    }
    out
}

/// The mirror for `suite`, found through the host's own suite `host_codename`: the entry
/// serving exactly that suite is the archive; entries for `<codename>-*` (updates,
/// security) come along, renamed to the target suite.
pub fn mirror_for(
    sources: &[AptSource],
    host_codename: &str,
    suite: &str,
) -> Result<Mirror, ImageError> {
    let archive = sources
        .iter()
        .find(|s| s.suites.iter().any(|x| x == host_codename))
        .ok_or_else(|| ImageError::Host {
            message: format!(
                "no Debian mirror for the host's suite {host_codename:?} in {SOURCES_LIST} or \
                 {SOURCES_DIR}/*.sources: Corral bootstraps images from the mirror the host's \
                 apt uses, so add yours there (and check `apt-get update` works)"
            ),
        })?;
    let mut lines = Vec::new();
    for source in sources {
        for s in &source.suites {
            let renamed = if s == host_codename {
                suite.to_string()
            } else if let Some(rest) = s.strip_prefix(&format!("{host_codename}-")) {
                format!("{suite}-{rest}")
            } else {
                continue;
            };
            let line = format!(
                "deb {} {} {}",
                source.uri,
                renamed,
                source.components.join(" ")
            );
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    Ok(Mirror {
        uri: archive.uri.clone(),
        components: archive.components.clone(),
        sources_list: lines.join("\n") + "\n",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main contrib

Types: deb
URIs: https://vendor.example/node
Suites: nodistro
Components: main

Types: deb
Enabled: no
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
";

    #[test]
    fn codename_comes_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(codename_from_os_release(text).as_deref(), Some("bookworm"));
        assert_eq!(
            codename_from_os_release("VERSION_CODENAME=\"trixie\"\n").as_deref(),
            Some("trixie")
        );
        assert_eq!(codename_from_os_release("ID=debian\n"), None);
    }

    #[test]
    fn deb822_stanzas_are_parsed_and_disabled_ones_skipped() {
        let s = parse_deb822(DEB822);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].uri, "http://mirror.example/debian");
        assert_eq!(s[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(s[1].components, ["main", "contrib"]);
        assert_eq!(s[2].suites, ["nodistro"]);
    }

    #[test]
    fn one_line_sources_with_options_and_comments() {
        let text = "# comment\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n\
                    deb-src http://mirror.example/debian bookworm main\n\
                    deb http://other.example/x cloud-sdk-bookworm main # trailing\n";
        let s = parse_one_line(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].uri, "http://mirror.example/debian");
        assert_eq!(s[0].components, ["main", "contrib"]);
        assert_eq!(s[1].suites, ["cloud-sdk-bookworm"]);
    }

    #[test]
    fn mirror_is_the_hosts_archive_with_its_companions() {
        let sources = parse_deb822(DEB822);
        let m = mirror_for(&sources, "bookworm", "bookworm").unwrap();
        assert_eq!(m.uri, "http://mirror.example/debian");
        assert_eq!(m.components, ["main"]);
        assert_eq!(
            m.sources_list,
            "deb http://mirror.example/debian bookworm main\n\
             deb http://mirror.example/debian bookworm-updates main\n\
             deb http://security.example/debian-security bookworm-security main contrib\n"
        );
        let m = mirror_for(&sources, "bookworm", "trixie").unwrap();
        assert!(m.sources_list.contains("debian-security trixie-security"));
        assert!(!m.sources_list.contains("nodistro"));
    }

    #[test]
    fn no_mirror_for_the_host_suite_is_a_clear_error() {
        let sources = parse_one_line("deb http://other.example/x cloud-sdk-bookworm main\n");
        let err = mirror_for(&sources, "bookworm", "bookworm")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no Debian mirror for the host's suite \"bookworm\""),
            "{err}"
        );
    }
}
