//! Tool definitions a request will send along with its prompt (`tools_json`, or a list of dicts):
//! they take room in the context window, so their tokens come off the budget before the shift
//! (`count::tools_tokens`). Read in the shapes the providers take:
//! - OpenAI Chat Completions: `{"type": "function", "function": {"name", "description", "parameters"}}`;
//! - OpenAI Responses: `{"type": "function", "name", "description", "parameters"}`, and built-in
//!   tools named by their `type` (`web_search`, `file_search`, ...);
//! - Anthropic: `{"name", "description", "input_schema"}`, and server tools named by their `type`
//!   (`web_search_20250305`, `bash_20250124`, ...).

use crate::json_doc::{read_array, repeated_keys, TapeNode};
use crate::json_text::to_json_text;
use crate::parse::{read_fields, Node, Shape, Violation};
use serde_json::Value;

/// Reads a JSON array of tool definitions (`tools_json`): malformed text is one violation on
/// `field`, a repeated key a violation on its place, as for blocks.
pub fn parse_json_tools(text: &str, field: &str) -> Result<Vec<Tool>, Vec<Violation>> {
    let document = read_array(text, "tool").map_err(|e| {
        vec![Violation { index: 0, field: field.to_owned(), description: format!("not a JSON array of tools: {e}") }]
    })?;
    let nodes: Vec<TapeNode> = document.elements.iter().map(|&at| TapeNode { tape: &document.tape, at }).collect();
    let repeated = repeated_keys(&nodes, &document.repeated, field);
    match parse_tools(&nodes, field) {
        Ok(tools) if repeated.is_empty() => Ok(tools),
        Ok(_) => Err(repeated),
        Err(violations) => Err(repeated.into_iter().chain(violations).collect()),
    }
}

/// One tool definition, as counting needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// A function the model may call (counted by the profile's function rule); otherwise a
    /// provider's built-in tool, counted as its JSON text.
    pub function: bool,
    pub name: String,
    pub description: String,
    /// The parameters schema's `properties`, in order, each with its own schema.
    pub properties: Vec<(String, Value)>,
    /// The definition's JSON text, as given (what the generic rule counts).
    pub json: String,
}

/// Reads every tool definition, collecting every violation; `list_name` names the list in field
/// paths (`tools_json[2].function.name`).
pub fn parse_tools<N: Node>(nodes: &[N], list_name: &str) -> Result<Vec<Tool>, Vec<Violation>> {
    let mut tools = Vec::with_capacity(nodes.len());
    let mut violations = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        let mut reader = Reader { index, violations: &mut violations };
        if let Some(tool) = reader.tool(node, &format!("{list_name}[{index}]")) {
            tools.push(tool);
        }
    }
    if violations.is_empty() {
        Ok(tools)
    } else {
        Err(violations)
    }
}

struct Reader<'v> {
    index: usize,
    violations: &'v mut Vec<Violation>,
}

impl Reader<'_> {
    fn violation(&mut self, field: String, description: impl Into<String>) {
        self.violations.push(Violation { index: self.index, field, description: description.into() });
    }

    fn tool<N: Node>(&mut self, node: &N, at: &str) -> Option<Tool> {
        if !matches!(node.shape(), Shape::Object) {
            let got = node.shape().type_name().to_owned();
            self.violation(at.to_owned(), format!("must be an object (a tool definition), got {got}"));
            return None;
        }
        let json = match node.to_json() {
            Ok(value) => to_json_text(&value),
            Err(description) => {
                self.violation(at.to_owned(), description);
                return None;
            }
        };
        read_fields!(node, {
            kind: "type", function: "function", name: "name", description: "description", parameters: "parameters",
            input_schema: "input_schema",
        });
        let kind = match kind.as_ref().map(|k| k.shape()) {
            None => None,
            Some(Shape::Str(kind)) => Some(kind.to_owned()),
            Some(other) => {
                let got = other.type_name().to_owned();
                self.violation(format!("{at}.type"), format!("must be a string, got {got}"));
                return None;
            }
        };
        if let Some(function) = function {
            // OpenAI Chat Completions.
            if kind.as_deref().is_some_and(|k| k != "function") {
                self.violation(format!("{at}.type"), "must be \"function\" for a tool with a `function` object");
            }
            let at = format!("{at}.function");
            if !matches!(function.shape(), Shape::Object) {
                let got = function.shape().type_name().to_owned();
                self.violation(at, format!("must be an object, got {got}"));
                return None;
            }
            read_fields!(function, { name: "name", description: "description", parameters: "parameters" });
            return self.function(name, description, parameters, &at, "parameters", json);
        }
        match kind.as_deref() {
            // OpenAI Responses.
            Some("function") => self.function(name, description, parameters, at, "parameters", json),
            // A provider's own tool (web search, code interpreter, computer use, an OpenAI free-form
            // custom tool, ...).
            Some(kind) if kind != "custom" || input_schema.is_none() => {
                let name = match name.as_ref().map(|n| n.shape()) {
                    Some(Shape::Str(name)) => name.to_owned(),
                    _ => kind.to_owned(),
                };
                Some(Tool { function: false, name, description: String::new(), properties: Vec::new(), json })
            }
            // Anthropic: a custom tool has no type (or "custom") and a schema.
            _ => self.function(name, description, input_schema, at, "input_schema", json),
        }
    }

    /// A function tool's name (required), description and parameters schema (field `schema_key`).
    fn function<N: Node>(
        &mut self,
        name: Option<N>,
        description: Option<N>,
        schema: Option<N>,
        at: &str,
        schema_key: &str,
        json: String,
    ) -> Option<Tool> {
        let name = match name.as_ref().map(|n| n.shape()) {
            Some(Shape::Str(name)) if !name.is_empty() => Some(name.to_owned()),
            Some(Shape::Str(_)) => {
                self.violation(format!("{at}.name"), "must not be empty");
                None
            }
            None => {
                self.violation(format!("{at}.name"), "missing: a function tool needs a name");
                None
            }
            Some(other) => {
                let got = other.type_name().to_owned();
                self.violation(format!("{at}.name"), format!("must be a string, got {got}"));
                None
            }
        };
        let description = match description.as_ref().map(|d| d.shape()) {
            None => Some(String::new()),
            Some(Shape::Str(description)) => Some(description.to_owned()),
            Some(other) => {
                let got = other.type_name().to_owned();
                self.violation(format!("{at}.description"), format!("must be a string, got {got}"));
                None
            }
        };
        let properties = match schema {
            None => Some(Vec::new()),
            Some(schema) => self.properties(&schema, &format!("{at}.{schema_key}")),
        };
        Some(Tool { function: true, name: name?, description: description?, properties: properties?, json })
    }

    /// The `properties` of a parameters schema (an object schema; other schemas have none).
    fn properties<N: Node>(&mut self, schema: &N, at: &str) -> Option<Vec<(String, Value)>> {
        if !matches!(schema.shape(), Shape::Object) {
            let got = schema.shape().type_name().to_owned();
            self.violation(at.to_owned(), format!("must be an object (a JSON schema), got {got}"));
            return None;
        }
        read_fields!(schema, { properties: "properties" });
        let Some(properties) = properties else { return Some(Vec::new()) };
        let at = format!("{at}.properties");
        if !matches!(properties.shape(), Shape::Object) {
            let got = properties.shape().type_name().to_owned();
            self.violation(at, format!("must be an object, got {got}"));
            return None;
        }
        let mut read = Vec::new();
        let mut valid = true;
        properties.for_each_entry(&mut |key, property| match property.to_json() {
            Ok(value @ Value::Object(_)) => read.push((key.to_owned(), value)),
            Ok(other) => {
                let got = (&other).shape().type_name().to_owned();
                self.violation(format!("{at}.{key}"), format!("must be an object (a JSON schema), got {got}"));
                valid = false;
            }
            Err(description) => {
                self.violation(format!("{at}.{key}"), description);
                valid = false;
            }
        });
        valid.then_some(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(tools: Value) -> Result<Vec<Tool>, Vec<Violation>> {
        parse_tools(&tools.as_array().unwrap().iter().collect::<Vec<_>>(), "tools_json")
    }

    fn fields_of(tools: Value) -> Vec<String> {
        parse(tools).unwrap_err().into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn reads_every_provider_shape() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}});
        let tools = parse(json!([
            {"type": "function", "function": {"name": "chat", "description": "d.", "parameters": schema}},
            {"type": "function", "name": "responses", "parameters": schema},
            {"name": "anthropic", "description": "a", "input_schema": schema},
            {"type": "web_search"},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "function", "function": {"name": "bare"}}
        ]))
        .unwrap();
        let names: Vec<(&str, bool)> = tools.iter().map(|t| (t.name.as_str(), t.function)).collect();
        assert_eq!(
            names,
            [
                ("chat", true),
                ("responses", true),
                ("anthropic", true),
                ("web_search", false),
                ("web_search", false),
                ("bare", true)
            ]
        );
        let keys: Vec<&str> = tools[0].properties.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!((keys.as_slice(), tools[0].description.as_str()), (&["city", "days"][..], "d."));
        assert!(tools[5].properties.is_empty());
        assert_eq!(tools[3].json, r#"{"type": "web_search"}"#);
    }

    #[test]
    fn json_text_is_read_as_values_are() {
        let text = r#"[{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"type": "string"}}}}}]"#;
        let values: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parse_json_tools(text, "tools_json").unwrap(), parse(values).unwrap());
        let err = parse_json_tools(r#"[{"name": "f", "name": "g"}]"#, "tools_json").unwrap_err();
        assert_eq!(err[0].field, "tools_json[0].name");
        let err = parse_json_tools("[{}", "tools_json").unwrap_err();
        assert_eq!(err[0].field, "tools_json");
        assert!(err[0].description.starts_with("not a JSON array of tools: "), "{}", err[0].description);
    }

    #[test]
    fn violations_name_the_field() {
        assert_eq!(
            fields_of(json!([
                {"type": "function", "function": {"description": "no name"}},
                {"type": "function", "function": {"name": 7, "parameters": {"properties": {"x": 3}}}},
                {"type": "tool", "function": {"name": "f"}},
                {"name": "a", "input_schema": []},
                {"type": "function", "name": "", "description": 5},
                "not an object",
                {"type": 3}
            ])),
            [
                "tools_json[0].function.name",
                "tools_json[1].function.name",
                "tools_json[1].function.parameters.properties.x",
                "tools_json[2].type",
                "tools_json[3].input_schema",
                "tools_json[4].name",
                "tools_json[4].description",
                "tools_json[5]",
                "tools_json[6].type",
            ]
        );
    }
}
