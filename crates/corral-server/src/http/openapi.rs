//! The parts of the OpenAPI document (`GET /openapi.json`) beyond [`super::ApiDoc`]'s list —
//! the programs, code contexts and ports of a sandbox — and what completes the whole
//! document: every path parameter declared, and a check that every `/v1/` route the native
//! server registers is in it.

use std::collections::BTreeMap;

use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{OpenApi, Required};

use super::{contexts, processes};

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        processes::start,
        processes::list,
        processes::output,
        processes::input,
        processes::close_stdin,
        processes::signal,
        processes::resize,
        contexts::create,
        contexts::list,
        contexts::restart,
        contexts::remove,
        crate::ports::native
    ),
    tags(
        (name = "processes", description = "Programs in a sandbox beside its interpreter (docs/api.md#processes)"),
        (name = "contexts", description = "More interpreters in a sandbox, on its files (docs/api.md#code-contexts)"),
        (name = "ports", description = "Servers that programs run inside a sandbox (docs/api.md#ports)"),
    )
)]
pub struct SandboxProgramsDoc;

/// The names in a path template: `["id", "pid"]` for `/v1/sandboxes/{id}/processes/{pid}`.
fn template_names(path: &str) -> Vec<&str> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .collect()
}

/// A path parameter `name`, as the routes of this server use them.
fn path_parameter(name: &str) -> Parameter {
    let (kind, description) = match name {
        "id" => (
            Type::String,
            "A sandbox's id (an API key's id on `/v1/keys/{id}`)",
        ),
        "path" => (
            Type::String,
            "A path relative to `/workspace` (or the sandbox program's URL path), `/`s included",
        ),
        "pid" => (Type::Integer, "A program's pid inside the sandbox"),
        "port" => (Type::Integer, "A TCP port inside the sandbox (1 to 65535)"),
        "context" => (Type::String, "A code context's id"),
        _ => (Type::String, ""),
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description((!description.is_empty()).then_some(description))
        .schema(Some(ObjectBuilder::new().schema_type(kind)))
        .build()
}

/// The operations of a path, with their methods.
fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", &mut item.get),
        ("put", &mut item.put),
        ("post", &mut item.post),
        ("delete", &mut item.delete),
        ("options", &mut item.options),
        ("head", &mut item.head),
        ("patch", &mut item.patch),
        ("trace", &mut item.trace),
    ]
    .into_iter()
    .filter_map(|(method, op)| Some((method, op.as_mut()?)))
}

/// Completes what utoipa leaves out: declares every path parameter an operation's path
/// template names and the operation does not declare itself (those of a handler's `Path`
/// extractor), and makes the operation ids of a handler of several methods unique
/// (`port_get`, `port_post`…), as OpenAPI requires.
pub fn complete(doc: &mut OpenApi) {
    for (path, item) in doc.paths.paths.iter_mut() {
        let names = template_names(path);
        let mut ids = BTreeMap::new();
        for (_, op) in operations(item) {
            if let Some(id) = &op.operation_id {
                *ids.entry(id.clone()).or_insert(0) += 1;
            }
        }
        for (method, op) in operations(item) {
            if let Some(id) = op.operation_id.as_mut() {
                if ids[id.as_str()] > 1 {
                    *id = format!("{id}_{method}");
                }
            }
            let params = op.parameters.get_or_insert_with(Vec::new);
            for name in &names {
                let declared = params
                    .iter()
                    .any(|p| p.name == *name && p.parameter_in == ParameterIn::Path);
                if !declared {
                    params.push(path_parameter(name));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    /// A `.route(` call of the source: the path literal that follows it and the methods of the
    /// handlers up to its closing parenthesis (`any` for every method).
    fn routes_in(source: &str) -> Vec<(String, BTreeSet<String>)> {
        let mut found = Vec::new();
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            // The call's extent: up to the parenthesis that closes it.
            let mut depth = 1usize;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(rest.len(), |(i, _)| i);
            let call = &rest[..end];
            let Some(path) = call
                .trim_start()
                .strip_prefix('"')
                .and_then(|p| p.split_once('"'))
                .map(|(p, _)| p)
            else {
                continue;
            };
            let methods = ["get", "post", "put", "delete", "patch", "any"]
                .into_iter()
                .filter(|m| {
                    call.match_indices(&format!("{m}(")).any(|(i, _)| {
                        !call[..i]
                            .chars()
                            .next_back()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
                })
                .map(String::from)
                .collect();
            found.push((path.to_string(), methods));
        }
        found
    }

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).expect("the crate's sources") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                // Routers of unit tests are not the server's.
                let text = match text.split_once("#[cfg(test)]\nmod tests") {
                    Some((code, _)) => code.to_string(),
                    None => text,
                };
                out.push((path.display().to_string(), text));
            }
        }
    }

    /// How a registered path reads in the document: `{*path}` is `{path}`; a route ending in
    /// `/` is the one without it (`files/` with no path, `ports/{port}/`).
    fn documented_form(path: &str) -> String {
        let path = path.replace("{*", "{");
        match path.strip_suffix('/') {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => path,
        }
    }

    /// Registered paths documented under another: the port proxy's `ports/{port}` is
    /// `ports/{port}/{path}` with an empty `path`.
    const SAME_AS: [(&str, &str); 1] = [(
        "/v1/sandboxes/{id}/ports/{port}",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
    )];

    /// Axum cannot list a router's routes, so the routes are read from the source: every
    /// `route` call with a `/v1/` path in every file of this crate outside its tests (a route
    /// added in a new module is found too), with the methods its handlers are registered for.
    /// Each must be in the document with each of those methods (`any`: at least one).
    #[test]
    fn every_registered_v1_route_is_in_the_document() {
        let doc = serde_json::to_value(super::super::api_doc()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let mut registered: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, text) in &files {
            for (path, methods) in routes_in(text) {
                if path.starts_with("/v1/") {
                    registered.entry(path).or_default().extend(methods);
                }
            }
        }
        // The source reading itself finds what it must.
        for known in [
            "/v1/sandboxes/{id}/processes/{pid}/signal",
            "/v1/sandboxes/{id}/files:move",
            "/v1/sandboxes/{id}/ports/{port}/{*path}",
            "/v1/whoami",
        ] {
            assert!(
                registered.contains_key(known),
                "{known} not found in the source"
            );
        }
        assert_eq!(
            registered["/v1/sandboxes/{id}/contexts"],
            BTreeSet::from(["get".to_string(), "post".to_string()])
        );
        let mut missing = Vec::new();
        for (path, methods) in &registered {
            let form = documented_form(path);
            let form = SAME_AS
                .iter()
                .find(|(p, _)| *p == form)
                .map_or(form.clone(), |(_, d)| d.to_string());
            let Some(item) = paths.get(&form) else {
                missing.push(format!("{path} (as {form})"));
                continue;
            };
            for method in methods {
                let there = if method == "any" {
                    !item.as_object().unwrap().is_empty()
                } else {
                    item.get(method).is_some()
                };
                if !there {
                    missing.push(format!("{} {path}", method.to_uppercase()));
                }
            }
        }
        assert!(missing.is_empty(), "not in /openapi.json: {missing:#?}");
    }

    #[test]
    fn the_source_reading_sees_methods_and_nested_calls() {
        let source = r#"
            Router::new()
                .route("/v1/a", post(contexts::create).get(contexts::list))
                .route(
                    "/v1/b/{id}",
                    axum::routing::delete(remove),
                )
                .route("/v1/c", any(|| async { f(g(1)) }))
                .route("/other", get(x))
        "#;
        let found = routes_in(source);
        let set = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            found,
            vec![
                ("/v1/a".to_string(), set(&["get", "post"])),
                ("/v1/b/{id}".to_string(), set(&["delete"])),
                ("/v1/c".to_string(), set(&["any"])),
                ("/other".to_string(), set(&["get"])),
            ]
        );
    }

    /// Clients generated from the document name a call by its operation id.
    #[test]
    fn operation_ids_are_unique() {
        let doc = serde_json::to_value(super::super::api_doc()).unwrap();
        let mut seen = BTreeMap::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_default().to_string();
                assert!(!id.is_empty(), "{method} {path} has no operation id");
                if let Some(other) = seen.insert(id.clone(), format!("{method} {path}")) {
                    panic!("{id} names {other} and {method} {path}");
                }
            }
        }
    }

    #[test]
    fn every_path_parameter_is_declared() {
        let doc = serde_json::to_value(super::super::api_doc()).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let declared: BTreeSet<&str> = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                let named: BTreeSet<&str> = template_names(path).into_iter().collect();
                assert_eq!(declared, named, "{method} {path}");
            }
        }
        let signal = &doc["paths"]["/v1/sandboxes/{id}/processes/{pid}/signal"]["post"];
        let pid = signal["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "pid")
            .unwrap();
        assert_eq!(pid["schema"]["type"], "integer");
    }
}
