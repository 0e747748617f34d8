//! JSON text from clients (`blocks_json`), read without building `serde_json::Value`s: each
//! top-level element is kept as its raw text (so the kept blocks go back out as the caller sent
//! them, byte for byte) and parsed into a borrowed document whose strings point into the input.

use crate::parse::{parse_conversation, Conversation, Node, Shape, Violation};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::borrow::Cow;
use std::fmt;

/// A JSON node borrowing its strings from the input where it has no escapes.
pub enum Doc<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    List(Vec<Doc<'a>>),
    Object(Vec<(Cow<'a, str>, Doc<'a>)>),
}

impl<'de> Deserialize<'de> for Doc<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

/// An object key or string, borrowed when the input allows.
struct CowStr<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for CowStr<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Doc::deserialize(deserializer)? {
            Doc::Str(s) => Ok(CowStr(s)),
            _ => Err(serde::de::Error::custom("object key must be a string")),
        }
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Doc<'de>, E> {
        Ok(Doc::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Doc<'de>, E> {
        Ok(Doc::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Doc<'de>, E> {
        Ok(Doc::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Doc<'de>, E> {
        Ok(i64::try_from(u).map(Doc::Int).unwrap_or(Doc::Float(u as f64)))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Doc<'de>, E> {
        Ok(Doc::Float(f))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Doc<'de>, E> {
        Ok(Doc::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Doc<'de>, E> {
        Ok(Doc::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Doc<'de>, E> {
        Ok(Doc::Str(Cow::Owned(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Doc::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc<'de>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((CowStr(key), value)) = map.next_entry()? {
            entries.push((key, value));
        }
        Ok(Doc::Object(entries))
    }
}

impl<'a> Node for &Doc<'a> {
    fn shape(&self) -> Shape<'_> {
        match self {
            Doc::Null => Shape::Null,
            Doc::Bool(b) => Shape::Bool(*b),
            Doc::Int(i) => Shape::Int(*i),
            Doc::Float(f) => Shape::Float(*f),
            Doc::Str(s) => Shape::Str(s),
            Doc::List(_) => Shape::List,
            Doc::Object(_) => Shape::Object,
        }
    }

    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self)) {
        if let Doc::Object(entries) = self {
            for (key, value) in entries {
                f(key, value);
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        match self {
            Doc::List(items) => items.iter().collect(),
            _ => Vec::new(),
        }
    }

    fn to_json(&self) -> Result<Value, String> {
        Ok(match self {
            Doc::Null => Value::Null,
            Doc::Bool(b) => Value::Bool(*b),
            Doc::Int(i) => Value::Number((*i).into()),
            Doc::Float(f) => Number::from_f64(*f).map(Value::Number).unwrap_or(Value::Null),
            Doc::Str(s) => Value::String(s.to_string()),
            Doc::List(items) => Value::Array(items.iter().map(|i| i.to_json()).collect::<Result<_, _>>()?),
            Doc::Object(entries) => {
                let mut map = Map::with_capacity(entries.len());
                for (key, value) in entries {
                    map.insert(key.to_string(), value.to_json()?);
                }
                Value::Object(map)
            }
        })
    }
}

/// Where an element's text lies in the input: byte offset and length.
type Span = (usize, usize);

/// A conversation read from JSON text, with where each block's text lies in that input.
#[derive(Debug)]
pub struct JsonConversation {
    pub conversation: Conversation,
    /// Byte range of each top-level element in the input.
    pub spans: Vec<Span>,
}

/// Parses a JSON array of blocks. A malformed document is one violation on `field`.
pub fn parse_json_blocks(text: &str, max_block_chars: usize, field: &str) -> Result<JsonConversation, Vec<Violation>> {
    let (docs, spans) = read_spanned_array(text).ok_or_else(|| {
        let error = describe_malformed(text);
        vec![Violation {
            index: 0,
            field: field.to_owned(),
            description: format!("not a JSON array of blocks: {error}"),
        }]
    })?;
    let nodes: Vec<&Doc> = docs.iter().collect();
    let conversation = parse_conversation(&nodes, max_block_chars, "blocks")?;
    Ok(JsonConversation { conversation, spans })
}

fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while matches!(bytes.get(pos), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        pos += 1;
    }
    pos
}

/// A top-level JSON array's elements and their byte spans, in one pass over the text: each
/// element is read by its own deserializer, whose offset says where the element ends. `None`
/// when the text is not a well-formed array (`describe_malformed` then says why).
fn read_spanned_array(text: &str) -> Option<(Vec<Doc<'_>>, Vec<Span>)> {
    let bytes = text.as_bytes();
    let mut pos = skip_whitespace(bytes, 0);
    if bytes.get(pos) != Some(&b'[') {
        return None;
    }
    let (mut docs, mut spans) = (Vec::new(), Vec::new());
    pos = skip_whitespace(bytes, pos + 1);
    if bytes.get(pos) == Some(&b']') {
        pos += 1;
    } else {
        loop {
            let mut element = serde_json::Deserializer::from_str(&text[pos..]).into_iter::<Doc>();
            docs.push(element.next()?.ok()?);
            spans.push((pos, element.byte_offset()));
            pos = skip_whitespace(bytes, pos + element.byte_offset());
            match bytes.get(pos) {
                Some(b',') => pos = skip_whitespace(bytes, pos + 1),
                Some(b']') => {
                    pos += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    (skip_whitespace(bytes, pos) == bytes.len()).then_some((docs, spans))
}

/// serde_json's account of what is wrong with a malformed array, with its line and column in
/// the whole text.
fn describe_malformed(text: &str) -> String {
    match serde_json::from_str::<Vec<Doc>>(text) {
        Err(e) => e.to_string(),
        Ok(_) => "unreadable array".to_owned(), // not reached: the two readers agree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_values;
    use serde_json::json;

    #[test]
    fn reads_like_values_and_keeps_spans() {
        let blocks = json!([
            {"id": "a", "role": "user", "content": "caf\u{e9} \"quoted\"", "meta": {"n": 18446744073709551615u64}},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {"x": [1, 2.5, null]}}]}
        ]);
        let text = format!(" {}\n", serde_json::to_string_pretty(&blocks).unwrap());
        let from_doc = parse_json_blocks(&text, 50_000, "blocks_json").unwrap();
        let from_values = parse_values(blocks.as_array().unwrap(), 50_000, "blocks").unwrap();
        assert_eq!(from_doc.conversation.blocks, from_values.blocks);
        let (start, len) = from_doc.spans[1];
        let element: Value = serde_json::from_str(&text[start..start + len]).unwrap();
        assert_eq!(element, blocks[1]);
    }

    #[test]
    fn malformed_text_is_one_violation() {
        let err = parse_json_blocks("[{]", 100, "blocks_json").unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].field, "blocks_json");
        assert!(parse_json_blocks("{}", 100, "blocks_json").is_err());
        // Positions are in the whole text, not in the element being read.
        let err = parse_json_blocks("[{\"content\": \"a\"},\n {\"content\": ]", 100, "blocks_json").unwrap_err();
        assert!(err[0].description.ends_with("at line 2 column 14"), "{}", err[0].description);
    }

    #[test]
    fn array_framing_is_strict() {
        for text in ["[", "[1,]", "[1 2]", "[1] x", "[,1]", "", "[]]"] {
            assert!(read_spanned_array(text).is_none(), "{text:?} was accepted");
            assert!(serde_json::from_str::<Vec<Doc>>(text).is_err(), "{text:?} is valid JSON");
        }
        let text = " \t[ ]\n";
        assert_eq!(read_spanned_array(text).map(|(docs, _)| docs.len()), Some(0));
        let text = "[ \"]\" ,1.5,{\"a\":[1]}\r\n]";
        let (docs, spans) = read_spanned_array(text).unwrap();
        assert_eq!(docs.len(), 3);
        let pieces: Vec<&str> = spans.iter().map(|&(start, len)| &text[start..start + len]).collect();
        assert_eq!(pieces, ["\"]\"", "1.5", "{\"a\":[1]}"]);
    }
}
