//! `GET /docs`: the OpenAPI document as a plain HTML page (no scripts, nothing fetched).

use serde_json::Value;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `#/components/schemas/Name` → `Name`, linked to its section.
fn schema_link(schema: &Value) -> String {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or(r);
            format!("<a href=\"#schema-{0}\">{0}</a>", escape(name))
        }
        None => format!("<code>{}</code>", escape(&schema.to_string())),
    }
}

pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    let doc = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Corral API</title><style>\
         body{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.4}\
         .op{border:1px solid #ccc;border-radius:6px;padding:.5rem 1rem;margin:1rem 0}\
         .m{font-weight:bold;text-transform:uppercase;margin-right:.5rem}\
         pre{background:#f6f6f6;padding:.5rem;overflow:auto}</style></head><body>",
    );
    let info = &doc["info"];
    html += &format!(
        "<h1>{}</h1><p>{}</p><p>Machine-readable: <a href=\"/openapi.json\">/openapi.json</a>.</p>",
        escape(info["title"].as_str().unwrap_or("API")),
        escape(info["description"].as_str().unwrap_or(""))
    );
    html += "<h2>Routes</h2>";
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            html += &format!(
                "<div class=\"op\"><p><span class=\"m\">{}</span><code>{}</code></p>",
                escape(method),
                escape(path)
            );
            for key in ["summary", "description"] {
                if let Some(text) = op.get(key).and_then(Value::as_str) {
                    html += &format!("<p>{}</p>", escape(text));
                }
            }
            if let Some(content) = op
                .pointer("/requestBody/content")
                .and_then(Value::as_object)
            {
                for (mime, body) in content {
                    html += &format!(
                        "<p>Body ({}): {}</p>",
                        escape(mime),
                        schema_link(&body["schema"])
                    );
                }
            }
            html += "<ul>";
            for (status, response) in op["responses"].as_object().into_iter().flatten() {
                let schemas: Vec<String> = response["content"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(_, c)| schema_link(&c["schema"]))
                    .collect();
                html += &format!(
                    "<li><b>{}</b> {} {}</li>",
                    escape(status),
                    escape(response["description"].as_str().unwrap_or("")),
                    schemas.join(", ")
                );
            }
            html += "</ul></div>";
        }
    }
    html += "<h2>Schemas</h2>";
    for (name, schema) in doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        html += &format!(
            "<h3 id=\"schema-{0}\">{0}</h3><pre>{1}</pre>",
            escape(name),
            escape(&serde_json::to_string_pretty(schema).unwrap_or_default())
        );
    }
    html += "</body></html>";
    html
}
