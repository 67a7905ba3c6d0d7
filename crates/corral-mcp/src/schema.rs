//! The MCP tools as function-calling definitions (`corral tools --format openai|anthropic`),
//! made from the very schemas the MCP server lists. The application owns the sandbox there, so
//! `session_id` is left out: each call goes to the app's sandbox.

use serde_json::{json, Map, Value};

use crate::tools::tool_list;

/// The tools an agent application offers its model: code and files.
pub const FUNCTION_TOOLS: [&str; 4] = ["run_code", "write_file", "read_file", "list_files"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Chat Completions `tools`: `{"type": "function", "function": {name, description, parameters}}`.
    Openai,
    /// Messages API `tools`: `{name, description, input_schema}`.
    Anthropic,
}

/// A tool's input schema without `session_id` and the generator's bookkeeping keys.
fn parameters(schema: &Map<String, Value>) -> Value {
    let mut schema = schema.clone();
    schema.remove("$schema");
    schema.remove("title");
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.remove("session_id");
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|r| r != "session_id");
    }
    Value::Object(schema)
}

/// The definitions of [`FUNCTION_TOOLS`] in `format`, in that order.
pub fn function_tools(format: Format) -> Value {
    let tools = tool_list();
    let defs = FUNCTION_TOOLS
        .iter()
        .filter_map(|name| tools.iter().find(|t| t.name == *name))
        .map(|t| {
            let description = t.description.as_deref().unwrap_or_default();
            let params = parameters(&t.input_schema);
            match format {
                Format::Openai => json!({
                    "type": "function",
                    "function": {"name": t.name, "description": description, "parameters": params},
                }),
                Format::Anthropic => {
                    json!({"name": t.name, "description": description, "input_schema": params})
                }
            }
        })
        .collect();
    Value::Array(defs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_tools_match_the_mcp_tools_without_session_id() {
        let openai = function_tools(Format::Openai);
        let names: Vec<&str> = openai
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, FUNCTION_TOOLS);
        let run_code = &openai[0]["function"]["parameters"];
        assert_eq!(run_code["type"], "object");
        assert!(run_code["properties"]["code"].is_object());
        assert!(run_code["properties"].get("session_id").is_none());
        assert_eq!(run_code["required"], json!(["code"]));

        let anthropic = function_tools(Format::Anthropic);
        assert_eq!(anthropic[1]["name"], "write_file");
        assert_eq!(
            anthropic[1]["input_schema"]["required"],
            json!(["path", "content"])
        );
        assert_eq!(
            anthropic[1]["description"],
            openai[1]["function"]["description"]
        );
    }
}
