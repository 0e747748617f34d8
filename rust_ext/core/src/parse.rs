//! Reading blocks from JSON values in every shape of docs/semantics.md §1, collecting every
//! violation with its field path (`blocks[3].content[1].type`), and the per-block char cap.

use crate::block::{Block, Image, Kind, Role, ToolCall};
use crate::json_text::to_json_text;
use rayon::prelude::*;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// One thing wrong with the input, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub index: usize,
    pub field: String,
    pub description: String,
}

/// A block cut by the char cap: the block as it was, and its message with the cut text in place.
#[derive(Clone, Debug)]
pub struct CharCut {
    pub index: usize,
    pub original: Block,
    pub message: Value,
}

#[derive(Clone, Debug)]
pub struct Conversation {
    pub blocks: Vec<Block>,
    pub cuts: Vec<CharCut>,
}

/// Ends every block the char cap cut.
pub const TRUNCATED_SUFFIX: &str = "[Truncated]";

/// Keys that name the call a tool result answers, all equal.
const RESULT_ID_KEYS: [&str; 5] = ["toolCallId", "tool_call_id", "callId", "call_id", "tool_use_id"];

/// Blocks this many or more are parsed across threads.
const PARALLEL_MIN_BLOCKS: usize = 512;

/// Parses a whole request. Ids must be unique; blocks over `max_block_chars` are cut.
/// `list_name` names the list in field paths (`blocks`).
pub fn parse_conversation(
    values: &[Value],
    max_block_chars: usize,
    list_name: &str,
) -> Result<Conversation, Vec<Violation>> {
    let parse_one = |(index, value): (usize, &Value)| -> Result<(Block, Option<CharCut>), Vec<Violation>> {
        let block = parse_block(value, index, list_name)?;
        if block.char_count() <= max_block_chars {
            return Ok((block, None));
        }
        let (mut cut_block, pointers) = read_block(value, index, list_name, true).map_err(|v| v.0)?;
        let original = cut_block.clone();
        cut_pieces(&mut cut_block.pieces, max_block_chars);
        let mut message = value.clone();
        for ((pointer, new), old) in pointers.iter().zip(&cut_block.pieces).zip(&original.pieces) {
            if new != old {
                if let Some(slot) = message.pointer_mut(pointer) {
                    *slot = Value::String(new.clone());
                }
            }
        }
        Ok((cut_block, Some(CharCut { index, original, message })))
    };
    let results: Vec<_> = if values.len() >= PARALLEL_MIN_BLOCKS {
        values.par_iter().enumerate().map(parse_one).collect()
    } else {
        values.iter().enumerate().map(parse_one).collect()
    };

    let mut blocks = Vec::with_capacity(values.len());
    let mut cuts = Vec::new();
    let mut violations = Vec::new();
    // Ids are checked among the blocks that parsed, so one request reports every problem.
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(values.len());
    for (index, result) in results.into_iter().enumerate() {
        match result {
            Ok((block, cut)) => {
                if let Some(first) = seen.insert(block.id.clone(), index) {
                    violations.push(Violation {
                        index,
                        field: format!("{list_name}[{index}].id"),
                        description: format!("duplicate id {:?} (also block {first})", block.id),
                    });
                }
                blocks.push(block);
                cuts.extend(cut);
            }
            Err(v) => violations.extend(v),
        }
    }
    if violations.is_empty() {
        Ok(Conversation { blocks, cuts })
    } else {
        violations.sort_by_key(|v| v.index);
        Err(violations)
    }
}

/// Parses one block on its own (no id uniqueness, no char cap).
pub fn parse_block(value: &Value, index: usize, list_name: &str) -> Result<Block, Vec<Violation>> {
    read_block(value, index, list_name, false).map(|(block, _)| block).map_err(|v| v.0)
}

/// Keeps `max_chars - 11` code points of text, then the suffix; later pieces become empty.
fn cut_pieces(pieces: &mut [String], max_chars: usize) {
    let mut remaining = Some(max_chars.saturating_sub(TRUNCATED_SUFFIX.len()));
    for piece in pieces {
        match remaining {
            None => piece.clear(),
            Some(left) => match piece.char_indices().nth(left) {
                None => remaining = Some(left - piece.chars().count()),
                Some((byte, _)) => {
                    piece.truncate(byte);
                    piece.push_str(TRUNCATED_SUFFIX);
                    remaining = None;
                }
            },
        }
    }
}

struct Violations(Vec<Violation>);

type Read = Result<(Block, Vec<String>), Violations>;

fn read_block(value: &Value, index: usize, list_name: &str, record_pointers: bool) -> Read {
    let at = format!("{list_name}[{index}]");
    let Some(obj) = value.as_object() else {
        return Err(Violations(vec![Violation {
            index,
            field: at,
            description: format!("must be an object, got {}", type_name(value)),
        }]));
    };
    let mut r = Reader { index, violations: Vec::new(), pointers: record_pointers.then(Vec::new) };
    let block = r.block(obj, &at);
    if r.violations.is_empty() {
        Ok((block, r.pointers.unwrap_or_default()))
    } else {
        Err(Violations(r.violations))
    }
}

struct Reader {
    index: usize,
    violations: Vec<Violation>,
    /// JSON pointers of the text pieces, in piece order, when the char cap needs to rewrite them.
    pointers: Option<Vec<String>>,
}

/// The output of reading a list of parts.
#[derive(Default)]
struct Parts {
    pieces: Vec<String>,
    calls: Vec<ToolCall>,
    result_ids: Vec<String>,
    images: Vec<Image>,
}

impl Reader {
    fn violation(&mut self, field: String, description: impl Into<String>) {
        self.violations.push(Violation { index: self.index, field, description: description.into() });
    }

    fn block(&mut self, obj: &Map<String, Value>, at: &str) -> Block {
        let id = match self.string(obj, "id", at) {
            Some("") => {
                self.violation(format!("{at}.id"), "must not be empty");
                String::new()
            }
            Some(id) => id.to_owned(),
            None => format!("#{}", self.index),
        };
        let item_type = self.string(obj, "type", at);
        let implied_role = match item_type {
            Some("function_call") | Some("reasoning") => Some(Role::Assistant),
            Some("function_call_output") => Some(Role::Tool),
            _ => None,
        };
        let role = match self.string(obj, "role", at) {
            Some(name) => Role::parse(name).unwrap_or_else(|| {
                self.violation(
                    format!("{at}.role"),
                    format!("unknown role {name:?} (expected system, developer, user, assistant or tool)"),
                );
                Role::User
            }),
            None => implied_role.unwrap_or_else(|| {
                match item_type {
                    None | Some("message") => self.violation(format!("{at}.role"), "missing"),
                    Some(other) => {
                        self.violation(format!("{at}.type"), format!("unknown item type {other:?} and no role"))
                    }
                }
                Role::User
            }),
        };
        let kind = match self.string(obj, "kind", at) {
            Some(name) => Kind::parse(name).unwrap_or_else(|| {
                self.violation(
                    format!("{at}.kind"),
                    format!(
                        "unknown kind {name:?} (expected system, character, persona, lorebook, memory, summary or message)"
                    ),
                );
                Kind::Message
            }),
            None => Kind::Message,
        };

        let mut parts = Parts::default();
        if item_type == Some("reasoning") {
            self.content(obj, "summary", at, "", &mut parts);
        }
        self.content(obj, "content", at, "", &mut parts);
        if item_type == Some("function_call_output") {
            self.content(obj, "output", at, "", &mut parts);
        }
        if item_type == Some("function_call") {
            if let Some(call_id) = self.required_id(obj, "call_id", at) {
                let name = self.string(obj, "name", at).unwrap_or("").to_owned();
                let arguments = self.arguments(obj.get("arguments"));
                parts.calls.push(ToolCall { id: call_id, name, arguments });
            }
        }
        self.tool_calls(obj, at, &mut parts.calls);

        let pinned = self.flag(obj, "pinned", at);
        let mandatory = self.flag(obj, "mandatory", at);
        let injected = self.flag(obj, "injected", at);
        let relevance = self.relevance(obj, at);

        // `call_id` on a function_call item is the call it issues, not one it answers.
        let issues_call_id = item_type == Some("function_call");
        for key in RESULT_ID_KEYS {
            if issues_call_id && key == "call_id" {
                continue;
            }
            if let Some(id) = self.result_id(obj, key, at) {
                parts.result_ids.push(id);
            }
        }
        match obj.get("meta") {
            None | Some(Value::Null) => {}
            Some(Value::Object(meta)) => {
                let meta_at = format!("{at}.meta");
                for key in RESULT_ID_KEYS {
                    if let Some(id) = self.result_id(meta, key, &meta_at) {
                        parts.result_ids.push(id);
                    }
                }
            }
            Some(other) => self.violation(format!("{at}.meta"), format!("must be an object, got {}", type_name(other))),
        }

        Block {
            id,
            role,
            kind,
            pieces: parts.pieces,
            calls: parts.calls,
            result_ids: parts.result_ids,
            images: parts.images,
            pinned,
            mandatory,
            injected,
            relevance,
        }
    }

    /// An optional string field; a value of another type is a violation.
    fn string<'v>(&mut self, obj: &'v Map<String, Value>, key: &str, at: &str) -> Option<&'v str> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                self.violation(format!("{at}.{key}"), format!("must be a string, got {}", type_name(other)));
                None
            }
        }
    }

    /// A required non-empty id string.
    fn required_id(&mut self, obj: &Map<String, Value>, key: &str, at: &str) -> Option<String> {
        match obj.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::String(_)) => {
                self.violation(format!("{at}.{key}"), "must not be empty");
                None
            }
            None | Some(Value::Null) => {
                self.violation(format!("{at}.{key}"), "missing");
                None
            }
            Some(other) => {
                self.violation(format!("{at}.{key}"), format!("must be a string, got {}", type_name(other)));
                None
            }
        }
    }

    /// An optional result id: absent is fine, present must be a non-empty string.
    fn result_id(&mut self, obj: &Map<String, Value>, key: &str, at: &str) -> Option<String> {
        match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(_) => self.required_id(obj, key, at),
        }
    }

    fn flag(&mut self, obj: &Map<String, Value>, key: &str, at: &str) -> bool {
        match obj.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.violation(format!("{at}.{key}"), format!("must be a boolean, got {}", type_name(other)));
                false
            }
        }
    }

    fn relevance(&mut self, obj: &Map<String, Value>, at: &str) -> Option<f64> {
        match obj.get("relevance") {
            None | Some(Value::Null) => None,
            // serde_json numbers are always finite; NaN and infinities are rejected on the way in.
            Some(Value::Number(n)) => n.as_f64(),
            Some(other) => {
                self.violation(format!("{at}.relevance"), format!("must be a number, got {}", type_name(other)));
                None
            }
        }
    }

    /// Arguments of a `tool_calls` entry or a function_call item: a string as is, any other
    /// JSON value as its JSON text, missing as empty.
    fn arguments(&mut self, value: Option<&Value>) -> String {
        match value {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => to_json_text(other),
        }
    }

    fn tool_calls(&mut self, obj: &Map<String, Value>, at: &str, calls: &mut Vec<ToolCall>) {
        let list = match obj.get("tool_calls") {
            None | Some(Value::Null) => return,
            Some(Value::Array(list)) => list,
            Some(other) => {
                self.violation(format!("{at}.tool_calls"), format!("must be a list, got {}", type_name(other)));
                return;
            }
        };
        for (j, call) in list.iter().enumerate() {
            let call_at = format!("{at}.tool_calls[{j}]");
            let Some(call) = call.as_object() else {
                self.violation(call_at, format!("must be an object, got {}", type_name(call)));
                continue;
            };
            let id = self.required_id(call, "id", &call_at);
            let (name, arguments) = match call.get("function") {
                Some(Value::Object(function)) => {
                    let function_at = format!("{call_at}.function");
                    (self.string(function, "name", &function_at), self.arguments(function.get("arguments")))
                }
                None | Some(Value::Null) => {
                    (self.string(call, "name", &call_at), self.arguments(call.get("arguments")))
                }
                Some(other) => {
                    self.violation(
                        format!("{call_at}.function"),
                        format!("must be an object, got {}", type_name(other)),
                    );
                    (None, String::new())
                }
            };
            if let Some(id) = id {
                calls.push(ToolCall { id, name: name.unwrap_or("").to_owned(), arguments });
            }
        }
    }

    /// A content-like field: a string (one text piece) or a list of parts.
    /// `pointer` is the JSON pointer of `obj`, for the char cap's rewrite.
    fn content(&mut self, obj: &Map<String, Value>, key: &str, at: &str, pointer: &str, parts: &mut Parts) {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => self.piece(parts, s.clone(), || format!("{pointer}/{key}")),
            Some(Value::Array(list)) => {
                for (j, part) in list.iter().enumerate() {
                    self.part(part, &format!("{at}.{key}[{j}]"), &format!("{pointer}/{key}/{j}"), parts);
                }
            }
            Some(other) => self.violation(
                format!("{at}.{key}"),
                format!("must be a string or a list of parts, got {}", type_name(other)),
            ),
        }
    }

    fn piece(&mut self, parts: &mut Parts, text: String, pointer: impl FnOnce() -> String) {
        if let Some(pointers) = &mut self.pointers {
            pointers.push(pointer());
        }
        parts.pieces.push(text);
    }

    fn text_field(&mut self, part: &Map<String, Value>, key: &str, at: &str, pointer: &str, parts: &mut Parts) {
        match part.get(key) {
            Some(Value::String(s)) => self.piece(parts, s.clone(), || format!("{pointer}/{key}")),
            None | Some(Value::Null) => self.violation(format!("{at}.{key}"), "missing"),
            Some(other) => self.violation(format!("{at}.{key}"), format!("must be a string, got {}", type_name(other))),
        }
    }

    fn part(&mut self, part: &Value, at: &str, pointer: &str, parts: &mut Parts) {
        let Some(obj) = part.as_object() else {
            self.violation(at.to_owned(), format!("must be an object, got {}", type_name(part)));
            return;
        };
        let part_type = match obj.get("type") {
            Some(Value::String(t)) => t.as_str(),
            None | Some(Value::Null) => {
                self.violation(format!("{at}.type"), "missing");
                return;
            }
            Some(other) => {
                self.violation(format!("{at}.type"), format!("must be a string, got {}", type_name(other)));
                return;
            }
        };
        match part_type {
            "text" | "input_text" | "output_text" | "summary_text" | "reasoning_text" => {
                self.text_field(obj, "text", at, pointer, parts)
            }
            "refusal" => self.text_field(obj, "refusal", at, pointer, parts),
            "thinking" => self.text_field(obj, "thinking", at, pointer, parts),
            "redacted_thinking" => {}
            "image_url" | "image" | "input_image" => {
                let image = self.image(obj, at);
                parts.images.push(image);
            }
            "tool_use" => {
                if let Some(id) = self.required_id(obj, "id", at) {
                    let name = self.string(obj, "name", at).unwrap_or("").to_owned();
                    let arguments = obj.get("input").map(to_json_text).unwrap_or_default();
                    parts.calls.push(ToolCall { id, name, arguments });
                }
            }
            "tool-call" => {
                if let Some(id) = self.required_id(obj, "toolCallId", at) {
                    let name = self.string(obj, "toolName", at).unwrap_or("").to_owned();
                    let input = obj.get("input").or_else(|| obj.get("args"));
                    let arguments = input.map(to_json_text).unwrap_or_default();
                    parts.calls.push(ToolCall { id, name, arguments });
                }
            }
            "tool_result" => {
                if let Some(id) = self.required_id(obj, "tool_use_id", at) {
                    parts.result_ids.push(id);
                }
                self.content(obj, "content", at, pointer, parts);
            }
            "tool-result" => {
                if let Some(id) = self.required_id(obj, "toolCallId", at) {
                    parts.result_ids.push(id);
                }
                let key = if obj.contains_key("output") { "output" } else { "result" };
                match obj.get(key) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(s)) => self.piece(parts, s.clone(), || format!("{pointer}/{key}")),
                    Some(other) => self.piece(parts, to_json_text(other), || format!("{pointer}/{key}")),
                }
            }
            other => self.violation(format!("{at}.type"), format!("unknown part type {other:?}")),
        }
    }

    fn image(&mut self, obj: &Map<String, Value>, at: &str) -> Image {
        let nested_detail = match obj.get("image_url") {
            Some(Value::Object(url)) => self.string(url, "detail", &format!("{at}.image_url")),
            _ => None,
        };
        let detail = self.string(obj, "detail", at).or(nested_detail).map(str::to_owned);
        let mut size = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(other) => {
                self.violation(format!("{at}.{key}"), format!("must be a non-negative integer, got {other}"));
                None
            }
        };
        let width = size("width");
        let height = size("height");
        Image { detail, width, height }
    }
}

pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(values: Value) -> Result<Conversation, Vec<Violation>> {
        parse_conversation(values.as_array().unwrap(), 50_000, "blocks")
    }

    fn fields(values: Value) -> Vec<String> {
        parse(values).unwrap_err().into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn generated_ids_and_defaults() {
        let conv = parse(json!([{"role": "user", "content": "hi"}, {"role": "assistant"}])).unwrap();
        assert_eq!(conv.blocks[0].id, "#0");
        assert_eq!(conv.blocks[1].id, "#1");
        assert_eq!(conv.blocks[1].kind, Kind::Message);
        assert!(conv.blocks[1].pieces.is_empty());
    }

    #[test]
    fn every_result_id_spelling_counts() {
        let conv = parse(json!([{
            "role": "tool", "toolCallId": "a", "tool_call_id": "b", "callId": "c", "call_id": "d",
            "tool_use_id": "e", "meta": {"toolCallId": "f"}
        }]))
        .unwrap();
        assert_eq!(conv.blocks[0].result_ids, ["a", "b", "c", "d", "e", "f"]);
    }

    #[test]
    fn responses_items_take_role_from_type() {
        let conv = parse(json!([
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}
        ]))
        .unwrap();
        let b = &conv.blocks;
        assert_eq!((b[0].role, b[0].calls[0].id.as_str()), (Role::Assistant, "c1"));
        assert!(b[0].result_ids.is_empty());
        assert_eq!(
            (b[1].role, b[1].result_ids.as_slice(), b[1].pieces.as_slice()),
            (Role::Tool, &["c1".to_owned()][..], &["42".to_owned()][..])
        );
        assert_eq!((b[2].role, b[2].pieces[0].as_str()), (Role::Assistant, "think"));
    }

    #[test]
    fn anthropic_and_vercel_parts() {
        let conv = parse(json!([
            {"role": "assistant", "content": [
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"q": "x", "n": 2}},
                {"type": "tool-call", "toolCallId": "t2", "toolName": "put", "args": {"k": [1, 2]}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]},
                {"type": "tool-result", "toolCallId": "t2", "result": {"done": true}},
                {"type": "image", "source": {}}
            ]}
        ]))
        .unwrap();
        let b = &conv.blocks;
        assert_eq!(b[0].calls[0].arguments, r#"{"q": "x", "n": 2}"#);
        assert_eq!(b[0].calls[1].arguments, r#"{"k": [1, 2]}"#);
        assert_eq!(b[1].result_ids, ["t1", "t2"]);
        assert_eq!(b[1].pieces, ["ok", r#"{"done": true}"#]);
        assert_eq!(b[1].images.len(), 1);
    }

    #[test]
    fn violations_name_block_and_field() {
        assert_eq!(
            fields(json!([
                {"role": "robot"},
                {"role": "user", "content": [{"type": "video"}], "pinned": "yes"},
                {"id": "x", "role": "user"},
                {"id": "x", "role": "user", "relevance": "high"},
                7
            ])),
            ["blocks[0].role", "blocks[1].content[0].type", "blocks[1].pinned", "blocks[3].relevance", "blocks[4]"]
        );
        assert_eq!(fields(json!([{"id": "x", "role": "user"}, {"id": "x", "role": "user"}])), ["blocks[1].id"]);
        assert_eq!(fields(json!([{"id": "#1", "role": "user"}, {"role": "user"}])), ["blocks[1].id"]);
        assert_eq!(fields(json!([{"type": "web_search_call"}])), ["blocks[0].type"]);
    }

    #[test]
    fn char_cap_cuts_on_code_points_and_rewrites_the_message() {
        let text: String = "日本🙂".repeat(40);
        let values = json!([{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": text}, {"type": "text", "text": "tail"}]}]);
        let conv = parse_conversation(values.as_array().unwrap(), 64, "blocks").unwrap();
        let block = &conv.blocks[0];
        assert_eq!(block.char_count(), 64);
        assert!(block.pieces[1].ends_with(TRUNCATED_SUFFIX));
        assert_eq!(block.pieces[2], "");
        let cut = &conv.cuts[0];
        assert_eq!(cut.original.char_count(), 2 + 120 + 4);
        assert_eq!(cut.message["content"][1]["text"], Value::String(block.pieces[1].clone()));
        assert_eq!(cut.message["content"][2]["text"], "");
        assert_eq!(cut.message["content"][0]["text"], "ab");
    }
}
