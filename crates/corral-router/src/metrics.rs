//! `GET /metrics` through a router: every node's samples, each labelled with its `node`, in one
//! OpenMetrics text exposition, as a node writes it (a metric's samples from every node together under its one
//! `# HELP` and `# TYPE`), and for every node the router knows `corral_router_node_up{node}`
//! (0: it does not answer, and its samples are missing) and `corral_router_node_refused{node}`
//! (1: it refused the key other nodes took, and its samples are missing; the nodes' keys
//! differ). Per node, not summed: a sum is one query away (`sum without (node) (…)`), while a
//! sum could not be taken apart again; the console's ops page shows the sums. The client's key
//! goes to every node, which decides on it (a key every node refuses gets a node's refusal);
//! each node's exposition is read whole, at most [`MAX_METRICS_BYTES`].

use axum::http::{header, HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use corral_kernel::NodeName;

use crate::gather::{fetch, node_error, Missing, Refusals};
use crate::nodes::Nodes;
use crate::route::{no_nodes, Face};

/// The largest `/metrics` answer read from one node.
pub const MAX_METRICS_BYTES: usize = 4 << 20;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Metric families in the order first seen: each one's `# HELP`/`# TYPE`/`# UNIT` lines and
/// samples.
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
}

struct Family {
    name: String,
    comments: Vec<String>,
    samples: Vec<String>,
}

impl Exposition {
    fn family(&mut self, name: &str) -> &mut Family {
        let at = match self.families.iter().position(|f| f.name == name) {
            Some(at) => at,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    comments: Vec::new(),
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[at]
    }

    /// Adds node `node`'s exposition `text`, its samples labelled `node="NODE"`.
    fn add(&mut self, node: &NodeName, text: &str) {
        let mut current: Option<String> = None;
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.split_whitespace();
                if let (Some("HELP" | "TYPE" | "UNIT"), Some(name)) = (words.next(), words.next()) {
                    let family = self.family(name);
                    if !family.comments.iter().any(|c| c == line) {
                        family.comments.push(line.to_string());
                    }
                    current = Some(name.to_string());
                }
                continue;
            }
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            // A sample belongs to the family declared last when its name is that family's
            // (`_total`, `_bucket`, … after it), else to a family of its own name.
            let family = match &current {
                Some(f) if name.starts_with(f.as_str()) => f.clone(),
                _ => name.to_string(),
            };
            let rest = &line[name_end..];
            let label = format!("node=\"{node}\"");
            let sample = match rest.strip_prefix('{') {
                Some(labels) if labels.starts_with('}') => format!("{name}{{{label}{labels}"),
                Some(labels) => format!("{name}{{{label},{labels}"),
                None => format!("{name}{{{label}}}{rest}"),
            };
            self.family(&family).samples.push(sample);
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for family in &self.families {
            for line in family.comments.iter().chain(&family.samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

pub(crate) async fn metrics(nodes: &Nodes, headers: &HeaderMap) -> Response {
    let up = nodes.up();
    if up.is_empty() {
        return no_nodes(Face::Native);
    }
    let answers = futures_util::future::join_all(up.iter().map(|(_, addr)| {
        fetch(
            nodes,
            Face::Native,
            *addr,
            Method::GET,
            "/metrics",
            headers,
            MAX_METRICS_BYTES,
        )
    }))
    .await;
    let mut exposition = Exposition::default();
    let mut refusals = Refusals::default();
    for ((name, _), answer) in up.into_iter().zip(answers) {
        match answer {
            Ok(bytes) => match std::str::from_utf8(&bytes) {
                Ok(text) => {
                    refusals.taken();
                    exposition.add(&name, text)
                }
                Err(e) => {
                    return node_error(
                        Face::Native,
                        format!("node {name}'s metrics are not text: {e}"),
                    )
                }
            },
            Err(Missing::Down) => nodes.mark_down(&name),
            Err(Missing::Answer(answer)) => {
                if let Some(answer) = refusals.keep(&name, answer) {
                    return answer;
                }
            }
        }
    }
    if let Some(refusal) = refusals.refusal() {
        return refusal;
    }
    let known = nodes.known();
    let node_up = exposition.family("corral_router_node_up");
    node_up.comments = vec![
        "# HELP corral_router_node_up Whether the node answers this router (0: its samples are \
         missing)."
            .into(),
        "# TYPE corral_router_node_up gauge".into(),
    ];
    node_up.samples = known
        .iter()
        .map(|(name, m)| {
            format!(
                "corral_router_node_up{{node=\"{name}\"}} {}",
                u8::from(m.up)
            )
        })
        .collect();
    let node_refused = exposition.family("corral_router_node_refused");
    node_refused.comments = vec![
        "# HELP corral_router_node_refused Whether the node refused the key other nodes took \
         (1: its samples are missing; the nodes' keys differ)."
            .into(),
        "# TYPE corral_router_node_refused gauge".into(),
    ];
    node_refused.samples = known
        .iter()
        .map(|(name, _)| {
            format!(
                "corral_router_node_refused{{node=\"{name}\"}} {}",
                u8::from(refusals.nodes.contains(name))
            )
        })
        .collect();
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], exposition.render()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_is_labelled_with_its_node_under_its_family() {
        let a: NodeName = "node-a".parse().unwrap();
        let b: NodeName = "node-b".parse().unwrap();
        let mut exposition = Exposition::default();
        let text = |live: u32| {
            format!(
                "# HELP corral_sessions_live Live sessions.\n# TYPE corral_sessions_live gauge\n\
                 corral_sessions_live {live}\n\
                 # HELP corral_http_requests_total Requests.\n\
                 # TYPE corral_http_requests_total counter\n\
                 corral_http_requests_total{{route=\"/x\",status=\"200\"}} 3\n\
                 corral_http_requests_total{{}} 1\n# EOF\n"
            )
        };
        exposition.add(&a, &text(2));
        exposition.add(&b, &text(5));
        assert_eq!(
            exposition.render(),
            "# HELP corral_sessions_live Live sessions.\n\
             # TYPE corral_sessions_live gauge\n\
             corral_sessions_live{node=\"node-a\"} 2\n\
             corral_sessions_live{node=\"node-b\"} 5\n\
             # HELP corral_http_requests_total Requests.\n\
             # TYPE corral_http_requests_total counter\n\
             corral_http_requests_total{node=\"node-a\",route=\"/x\",status=\"200\"} 3\n\
             corral_http_requests_total{node=\"node-a\"} 1\n\
             corral_http_requests_total{node=\"node-b\",route=\"/x\",status=\"200\"} 3\n\
             corral_http_requests_total{node=\"node-b\"} 1\n\
             # EOF\n"
        );
    }
}
