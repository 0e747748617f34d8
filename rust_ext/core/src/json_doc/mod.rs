//! JSON text from clients (`blocks_json`), read in one pass into a flat tape: each top-level
//! element's span in the input is recorded (so the kept blocks go back out as the caller sent
//! them, byte for byte), and each element is readable as a `Node` whose strings point into the
//! input. One vector holds the whole document: reading a block allocates nothing per object or
//! list, which is where a general-purpose deserializer spent most of its time on chat JSON.
//!
//! The reader is hand-written because it is on the gRPC hot path and the same tape written
//! through serde_json's lexer takes 1.6-1.8x as long on 10k blocks (benchmarks/rust,
//! `json-readers`). In exchange
//! it is held to serde_json: `check_against_serde_json` (unit tests on mutated documents, and the
//! fuzz target `json_reader`) requires the same verdict, values, spans and class of error.

mod reader;
mod structural;

use crate::parse::{parse_conversation, CharCap, Conversation, Node, Shape, Violation};
use reader::Reader;
use serde_json::error::Category;
use serde_json::{Map, Number, Value};
use std::fmt;
use structural::Cursor;

/// What an entry of a tape is.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Null,
    False,
    True,
    Int,
    Float,
    /// A string or object key: `a..a + b` of the input, or (when `b` has the `OWNED` bit) of
    /// the tape's unescaped strings, `a..a + (b ^ OWNED)`.
    Str,
    /// A container, followed by its contents (an object's as key, value, key, value...); `a` is
    /// the index just past them.
    List,
    Object,
}

/// One entry of a tape, in document order: plain scalars, so entries are written in place (an
/// enum holding a `Cow` was assembled on the stack and copied, stalling on every string).
#[derive(Clone, Copy)]
struct Entry {
    kind: Kind,
    a: u64,
    b: u64,
}

/// The bit of `Entry::b` that marks a string the tape holds unescaped.
const OWNED: u64 = 1 << 63;

/// The text of string entry `entry`: in the input, or in `owned`.
#[inline]
fn entry_str<'s>(text: &'s str, owned: &'s str, entry: Entry) -> &'s str {
    let start = entry.a as usize;
    if entry.b & OWNED == 0 {
        &text[start..start + entry.b as usize]
    } else {
        &owned[start..start + (entry.b ^ OWNED) as usize]
    }
}

/// A JSON document as a flat sequence of entries; strings point into the input unless escaped.
pub struct Tape<'a> {
    text: &'a str,
    entries: Vec<Entry>,
    /// Every escaped string unescaped, one after the other: one buffer, not one allocation each.
    owned: String,
    /// Objects with a key that occurs twice: the object's tape index and the key.
    pub repeated: Vec<(usize, String)>,
}

/// How much of a tape was written: what a reader that stops mid-element goes back to.
#[derive(Clone, Copy)]
struct Mark {
    entries: usize,
    owned: usize,
    repeated: usize,
}

impl<'a> Tape<'a> {
    fn new(text: &'a str) -> Self {
        Tape { text, entries: Vec::with_capacity(text.len() / 16), owned: String::new(), repeated: Vec::new() }
    }

    fn mark(&self) -> Mark {
        Mark { entries: self.entries.len(), owned: self.owned.len(), repeated: self.repeated.len() }
    }

    fn rewind(&mut self, mark: Mark) {
        self.entries.truncate(mark.entries);
        self.owned.truncate(mark.owned);
        self.repeated.truncate(mark.repeated);
    }

    /// The index just past the value at `at` (and its contents).
    fn after(&self, at: usize) -> usize {
        match self.entries[at] {
            Entry { kind: Kind::List | Kind::Object, a, .. } => a as usize,
            _ => at + 1,
        }
    }

    #[inline]
    fn str(&self, entry: Entry) -> &str {
        entry_str(self.text, &self.owned, entry)
    }
}

/// The value at one index of a tape.
#[derive(Clone, Copy)]
pub struct TapeNode<'t, 'a> {
    pub(crate) tape: &'t Tape<'a>,
    pub(crate) at: usize,
}

impl TapeNode<'_, '_> {
    fn entry(&self) -> Entry {
        self.tape.entries[self.at]
    }

    fn at(&self, at: usize) -> Self {
        TapeNode { tape: self.tape, at }
    }

    /// The index just past a container's contents (`at + 1` for anything else).
    fn end(&self) -> usize {
        self.tape.after(self.at)
    }

    /// The node as a JSON value (anything on a tape is one).
    fn value(&self) -> Value {
        let entry = self.entry();
        match entry.kind {
            Kind::Null => Value::Null,
            Kind::False => Value::Bool(false),
            Kind::True => Value::Bool(true),
            Kind::Int => Value::Number((entry.a as i64).into()),
            Kind::Float => Number::from_f64(f64::from_bits(entry.a)).map_or(Value::Null, Value::Number),
            Kind::Str => Value::String(self.tape.str(entry).to_owned()),
            Kind::List => Value::Array(self.items().iter().map(TapeNode::value).collect()),
            Kind::Object => {
                let mut map = Map::new();
                self.for_each_entry(&mut |key, value| {
                    map.insert(key.to_owned(), value.value());
                });
                Value::Object(map)
            }
        }
    }

    /// The `[j]` or `.key` step from this container to the child that holds tape index `target`,
    /// and that child.
    fn step_towards(&self, target: usize) -> Option<(String, Self)> {
        match self.entry().kind {
            Kind::List => self
                .items()
                .into_iter()
                .enumerate()
                .find(|(_, item)| item.at <= target && target < item.end())
                .map(|(j, item)| (format!("[{j}]"), item)),
            Kind::Object => {
                let mut found = None;
                self.for_each_entry(&mut |key, value| {
                    if found.is_none() && value.at <= target && target < value.end() {
                        found = Some((format!(".{key}"), value));
                    }
                });
                found
            }
            _ => None,
        }
    }
}

impl Node for TapeNode<'_, '_> {
    fn shape(&self) -> Shape<'_> {
        let entry = self.entry();
        match entry.kind {
            Kind::Null => Shape::Null,
            Kind::False => Shape::Bool(false),
            Kind::True => Shape::Bool(true),
            Kind::Int => Shape::Int(entry.a as i64),
            Kind::Float => Shape::Float(f64::from_bits(entry.a)),
            Kind::Str => Shape::Str(self.tape.str(entry)),
            Kind::List => Shape::List,
            Kind::Object => Shape::Object,
        }
    }

    fn is_null(&self) -> bool {
        self.entry().kind == Kind::Null
    }

    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self)) {
        if let Entry { kind: Kind::Object, a: end, .. } = self.entry() {
            let mut at = self.at + 1;
            while at < end as usize {
                f(self.tape.str(self.tape.entries[at]), self.at(at + 1));
                at = self.tape.after(at + 1);
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        let mut items = Vec::new();
        if let Entry { kind: Kind::List, a: end, .. } = self.entry() {
            let mut at = self.at + 1;
            while at < end as usize {
                items.push(self.at(at));
                at = self.tape.after(at);
            }
        }
        items
    }

    fn to_json(&self) -> Result<Value, String> {
        Ok(self.value())
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

/// Parses a JSON array of blocks. Malformed text is one violation on `field` saying what is
/// wrong and where (line and column); a block with a repeated key is a violation naming the key's
/// place (`blocks[2].content[0].text`), reported with the block's other violations.
pub fn parse_json_blocks(text: &str, cap: impl Into<CharCap>, field: &str) -> Result<JsonConversation, Vec<Violation>> {
    let document = read_blocks(text).map_err(|e| {
        vec![Violation { index: 0, field: field.to_owned(), description: format!("not a JSON array of blocks: {e}") }]
    })?;
    let tape = &document.tape;
    let nodes: Vec<TapeNode> = document.elements.iter().map(|&at| TapeNode { tape, at }).collect();
    let repeated = repeated_keys(&nodes, &tape.repeated, "blocks");
    match parse_conversation(&nodes, cap, "blocks") {
        Ok(conversation) if repeated.is_empty() => Ok(JsonConversation { conversation, spans: document.spans }),
        Ok(_) => Err(repeated),
        Err(violations) => {
            let mut all = repeated;
            all.extend(violations);
            all.sort_by_key(|v| v.index); // stable: a block's repeated keys first
            Err(all)
        }
    }
}

/// Each repeated key as a violation on its place in its element.
pub fn repeated_keys(nodes: &[TapeNode], repeated: &[(usize, String)], list_name: &str) -> Vec<Violation> {
    repeated
        .iter()
        .map(|(object, key)| {
            // Elements are in tape order: the block holding `object` is the last one starting at
            // or before it.
            let index = nodes.partition_point(|node| node.at <= *object) - 1;
            let mut field = format!("{list_name}[{index}]");
            let mut node = nodes[index];
            while node.at != *object {
                let Some((step, child)) = node.step_towards(*object) else { break };
                field.push_str(&step);
                node = child;
            }
            field.push('.');
            field.push_str(key);
            Violation {
                index,
                field,
                description: format!("duplicate key {key:?}: a provider may read either value, so it is refused"),
            }
        })
        .collect()
}

/// Containers nested inside one block deeper than this are refused (the reader recurses), as
/// dict blocks are.
pub const MAX_DEPTH: usize = 128;

/// A JSON array read onto a tape.
pub struct Document<'a> {
    pub tape: Tape<'a>,
    /// The tape index of each element.
    pub elements: Vec<usize>,
    pub spans: Vec<Span>,
}

/// The kind of a reading error, as serde_json classifies its own (the fuzz target checks that
/// both readers refuse the same text with the same kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Not JSON.
    Syntax,
    /// JSON cut short.
    Eof,
    /// JSON, but not an array.
    Data,
}

/// Why text is not a JSON array: what is wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    pub class: ErrorClass,
    pub what: String,
    pub line: usize,
    /// 1-based, in bytes.
    pub column: usize,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at line {} column {}", self.what, self.line, self.column)
    }
}

/// Reads a top-level JSON array of blocks (RFC 8259, strictly) onto a tape, with each block's span.
pub fn read_blocks(text: &str) -> Result<Document<'_>, ReadError> {
    read_array(text, "block")
}

/// `read_blocks` by the precise reader alone, byte by byte: what the structural reader is measured
/// against (benchmarks/rust, `json-readers`).
#[doc(hidden)]
pub fn read_blocks_precise(text: &str) -> Result<Document<'_>, ReadError> {
    read_all(ArrayReader::precise(text, "block")?)
}

/// Reads a top-level JSON array onto a tape, with each element's span; errors call an element
/// `element` ("block", "tool").
pub fn read_array<'a>(text: &'a str, element: &'static str) -> Result<Document<'a>, ReadError> {
    read_all(ArrayReader::new(text, element)?)
}

fn read_all(mut reader: ArrayReader<'_>) -> Result<Document<'_>, ReadError> {
    let (mut elements, mut spans) = (Vec::new(), Vec::new());
    while let Some((at, span)) = reader.next_element()? {
        elements.push(at);
        spans.push(span);
    }
    Ok(Document { tape: reader.reader.tape, elements, spans })
}

/// Reads a top-level JSON array one element at a time: the structural reader while it can, the
/// precise reader from the element where it cannot (so errors are always the precise reader's).
pub struct ArrayReader<'a> {
    reader: Reader<'a>,
    /// None once the precise reader reads (or where there is no SIMD path).
    cursor: Option<Cursor<'a>>,
}

impl<'a> ArrayReader<'a> {
    /// The precise reader alone, from the start: what the structural reader is checked against.
    fn precise(text: &'a str, element: &'static str) -> Result<Self, ReadError> {
        let mut reader = Reader::new(text, element);
        reader.open_array().ok_or_else(|| reader.error())?;
        Ok(ArrayReader { reader, cursor: None })
    }

    /// A reader past the array's `[`; an error when the text does not begin an array.
    pub fn new(text: &'a str, element: &'static str) -> Result<Self, ReadError> {
        let mut reader = Reader::new(text, element);
        let mut cursor = Cursor::new(text.as_bytes());
        let opened = cursor.as_mut().and_then(Cursor::next).filter(|&at| text.as_bytes()[at] == b'[');
        match opened {
            Some(at) => reader.pos = at + 1,
            None => {
                cursor = None;
                reader.open_array().ok_or_else(|| reader.error())?;
            }
        }
        Ok(ArrayReader { reader, cursor })
    }

    /// The next element onto the tape (its index there and its span), or None after the last.
    pub fn next_element(&mut self) -> Result<Option<(usize, Span)>, ReadError> {
        if let Some(cursor) = &mut self.cursor {
            let (mark, resume) = (self.reader.tape.mark(), self.reader.pos);
            if let Some(element) = self.reader.fast_next_element(cursor) {
                return Ok(element);
            }
            self.reader.tape.rewind(mark);
            self.reader.restart_at(resume);
            self.cursor = None;
        }
        self.reader.next_element().map_err(|()| self.reader.error())
    }

    /// What has been read: every element so far, or (after `clear`) the last one.
    pub fn tape(&self) -> &Tape<'a> {
        &self.reader.tape
    }

    /// Empties the tape, so it holds only what is read next: a caller done with each element
    /// keeps one element's entries in memory, not the document's.
    pub fn clear(&mut self) {
        self.reader.tape.rewind(Mark { entries: 0, owned: 0, repeated: 0 });
    }
}

/// The differential check of this reader against serde_json, shared by the fuzz target
/// (`fuzz/fuzz_targets/json_reader.rs`) and the unit tests; panics on a disagreement. Both accept
/// the same documents with the same values and spans, or refuse them with the same class of
/// error. The one difference by design: serde_json's nesting limit counts the outer array and is
/// one level lower, so a block 127 or 128 levels deep is read here and refused there.
#[doc(hidden)]
pub fn check_against_serde_json(text: &str) {
    let ours = read_blocks(text);
    // The structural reader (with the precise one after it, where it stops) reads as the precise
    // reader alone does, errors included.
    let precise = read_blocks_precise(text);
    match (&ours, &precise) {
        (Ok(ours), Ok(precise)) => {
            assert_eq!((&ours.elements, &ours.spans), (&precise.elements, &precise.spans), "{text:?}");
            assert_eq!(ours.tape.repeated, precise.tape.repeated, "{text:?}");
            for (&a, &b) in ours.elements.iter().zip(&precise.elements) {
                let (a, b) =
                    (TapeNode { tape: &ours.tape, at: a }.value(), TapeNode { tape: &precise.tape, at: b }.value());
                assert_eq!(a, b, "{text:?}");
            }
        }
        (Err(ours), Err(precise)) => assert_eq!(ours, precise, "{text:?}"),
        _ => panic!("{text:?}: {:?} vs the precise reader's {:?}", ours.as_ref().err(), precise.as_ref().err()),
    }
    let theirs = serde_json::from_str::<Vec<Value>>(text);
    match (ours, theirs) {
        (Ok(doc), Ok(values)) => {
            assert_eq!(doc.elements.len(), values.len(), "{text:?}");
            for ((&at, &(start, len)), value) in doc.elements.iter().zip(&doc.spans).zip(&values) {
                let ours = TapeNode { tape: &doc.tape, at }.value();
                assert!(same_value(&ours, value), "{text:?}: {ours:?} vs {value:?}");
                let element: Value = serde_json::from_str(&text[start..start + len]).expect("a span is one value");
                assert!(same_value(&element, value), "{text:?}: span {start}+{len}");
            }
        }
        (Err(ours), Err(theirs)) => {
            let class = match theirs.classify() {
                Category::Syntax => ErrorClass::Syntax,
                Category::Eof => ErrorClass::Eof,
                Category::Data => ErrorClass::Data,
                Category::Io => unreachable!("reading from memory"),
            };
            let depth = ours.what.contains("nested deeper") || theirs.to_string().starts_with("recursion");
            assert!(depth || ours.class == class, "{text:?}: {ours:?} vs serde_json {theirs}");
        }
        (Ok(_), Err(theirs)) => assert!(theirs.to_string().starts_with("recursion"), "{text:?}: serde_json {theirs}"),
        (Err(ours), Ok(_)) => panic!("{text:?}: refused ({ours}), serde_json accepts it"),
    }
}

/// Equal JSON values, numbers by value: an integer beyond i64 is a float on the tape.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64() && (x.is_f64() || y.is_f64()),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((kx, vx), (ky, vy))| kx == ky && same_value(vx, vy))
        }
        _ => a == b,
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

    /// The one violation of malformed text.
    fn description(text: &str) -> String {
        let err = parse_json_blocks(text, 100, "blocks_json").unwrap_err();
        assert_eq!(err.len(), 1, "{err:?}");
        assert_eq!(err[0].field, "blocks_json");
        err[0].description.clone()
    }

    #[test]
    fn malformed_text_is_one_violation() {
        description("[{]");
        assert_eq!(description("{}"), "not a JSON array of blocks: it is an object at line 1 column 1");
        // Positions are in the whole text, not in the element being read.
        assert!(description("[{\"content\": \"a\"},\n {\"content\": ]").ends_with("at line 2 column 14"));
    }

    /// Found by hand (issue #12): the reader once answered these with "a block is nested deeper
    /// than 128 levels", because the description came from a parser that skipped what failed.
    #[test]
    fn lone_surrogate_is_named_with_its_place() {
        assert_eq!(
            description(r#"[{"role":"user","content":"a\ud83db"}]"#),
            "not a JSON array of blocks: unpaired UTF-16 surrogate in a \\u escape (JSON text must encode \
             Unicode characters) at line 1 column 29"
        );
        assert_eq!(
            description("[{\"role\":\"user\",\"content\":\"ok\"},\n  {\"content\":\"\\udc00\"}]"),
            "not a JSON array of blocks: unpaired UTF-16 surrogate in a \\u escape (JSON text must encode \
             Unicode characters) at line 2 column 15"
        );
        assert!(description(r#"[{"content":"\ud800\u0041"}]"#).contains("unpaired UTF-16 surrogate"));
    }

    #[test]
    fn number_out_of_range_is_named_with_its_place() {
        assert_eq!(
            description(r#"[{"role":"user","content":"x","relevance":1e999}]"#),
            "not a JSON array of blocks: number out of range (beyond a 64-bit float) at line 1 column 43"
        );
    }

    #[test]
    fn repeated_key_names_the_block_and_the_key() {
        let err =
            parse_json_blocks(r#"[{"role":"user","role":"assistant","content":"x"}]"#, 100, "blocks_json").unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].field, "blocks[0].role");
        assert!(err[0].description.starts_with("duplicate key \"role\""), "{}", err[0].description);
        // Anywhere in a block, reported with the block's other violations, in block order.
        let text = r#"[{"role":"user"},{"role":"bot","content":[{"type":"text","text":"a","text":"b"}]},
            {"role":"user","meta":{"k":1,"k":2}}]"#;
        let err = parse_json_blocks(text, 100, "blocks_json").unwrap_err();
        let fields: Vec<&str> = err.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, ["blocks[1].content[0].text", "blocks[1].role", "blocks[2].meta.k"]);
        // Objects large enough for the hash set.
        let keys: Vec<String> = (0..40).map(|i| format!("\"k{}\":{i}", i % 39)).collect();
        let text = format!(r#"[{{"role":"user","meta":{{{}}}}}]"#, keys.join(","));
        let err = parse_json_blocks(&text, 100, "blocks_json").unwrap_err();
        assert_eq!(err.iter().map(|v| v.field.as_str()).collect::<Vec<_>>(), ["blocks[0].meta.k0"]);
    }

    /// The elements of a well-formed array as values, and their spans' texts.
    fn read(text: &str) -> Option<(Vec<Value>, Vec<&str>)> {
        let doc = read_blocks(text).ok()?;
        let values = doc.elements.iter().map(|&at| TapeNode { tape: &doc.tape, at }.value()).collect();
        Some((values, doc.spans.iter().map(|&(start, len)| &text[start..start + len]).collect()))
    }

    #[test]
    fn array_framing_is_strict() {
        for text in ["[", "[1,]", "[1 2]", "[1] x", "[,1]", "", "[]]", "\u{feff}[1]", "[1]\u{0}"] {
            assert!(read_blocks(text).is_err(), "{text:?} was accepted");
        }
        assert_eq!(read(" \t[ ]\n"), Some((vec![], vec![])));
        let text = "[ \"]\" ,1.5,{\"a\":[1]}\r\n, -0, 18446744073709551615, 9223372036854775807]";
        let (values, pieces) = read(text).unwrap();
        assert_eq!(
            values,
            [json!("]"), json!(1.5), json!({"a": [1]}), json!(-0.0), json!(18446744073709551615.0), json!(i64::MAX)]
        );
        assert_eq!(pieces, ["\"]\"", "1.5", "{\"a\":[1]}", "-0", "18446744073709551615", "9223372036854775807"]);
    }

    #[test]
    fn strings_point_into_the_input_unless_escaped() {
        let doc = read_blocks(r#"["plain", "esc \" \u00e9 \ud83d\udeb2", {"k\n": "v"}]"#).unwrap();
        let borrowed = doc.tape.entries.iter().filter(|e| e.kind == Kind::Str && e.b & OWNED == 0).count();
        let owned: Vec<&str> = doc
            .tape
            .entries
            .iter()
            .filter(|e| e.kind == Kind::Str && e.b & OWNED != 0)
            .map(|&e| doc.tape.str(e))
            .collect();
        assert_eq!((borrowed, owned.as_slice()), (2, &["esc \" é 🚲", "k\n"][..]));
    }

    #[test]
    fn special_bytes_at_every_offset_of_a_word() {
        // The plain-run scan finds a quote, a backslash or a control character from the chunk it
        // lies in: at each offset, after plain ASCII and after multi-byte characters.
        for run in ["a", "é", "日", "🙂"] {
            for k in 0..20 {
                let plain = run.repeat(k);
                for special in ["\\\"", "\\\\", "\\u00e9", "\n", "\u{1f}", "\u{0}"] {
                    check_against_serde_json(&format!("[\"{plain}{special}{plain}\", \"{plain}\"]"));
                }
            }
        }
    }

    #[test]
    fn chunk_scans_find_the_first_special_byte_of_any_value() {
        let naive = |chunk: &[u8]| chunk.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        for byte in 0..=255u8 {
            for at in 0..16 {
                // Plain bytes on both sides, and a second special byte later that must not win.
                let mut chunk = [b'a'; 16];
                chunk[at] = byte;
                chunk[15] = if at < 15 { b'"' } else { byte };
                #[cfg(target_arch = "x86_64")]
                assert_eq!(reader::sse2::first_special(&chunk), naive(&chunk), "byte {byte:#04x} at {at}");
                let eight: [u8; 8] = chunk[at.min(8)..at.min(8) + 8].try_into().unwrap();
                assert_eq!(reader::first_special_of_eight(eight), naive(&eight), "byte {byte:#04x} at {at}");
            }
        }
    }

    /// Reads `text`, asserting that the structural reader read all of it: a regression that sent
    /// well-formed text to the precise reader would show only as time.
    fn read_structurally(text: &str) {
        let mut reader = ArrayReader::new(text, "block").unwrap();
        while reader.next_element().unwrap().is_some() {}
        assert!(reader.cursor.is_some() || cfg!(not(target_arch = "x86_64")), "{text:?}");
    }

    #[test]
    fn chunk_boundaries_fall_anywhere() {
        // Strings, escapes, backslash runs, numbers and literals at every offset of a 64-byte
        // chunk, so each carry (escape, string, number) crosses a boundary.
        let pieces =
            [r#""a\"b""#, r#""\\\\""#, r#""\\""#, "-12.5e3", "true", r#""\u00e9x""#, r#"{"k": [1, null], "é": ""}"#];
        for pad in 0..140 {
            for piece in pieces {
                let text = format!("[\"{}\", {piece},{piece} ,\n{piece}]", "x".repeat(pad));
                check_against_serde_json(&text);
                read_structurally(&text);
            }
        }
        let long =
            format!("[{}]", vec![r#"{"id": "b1", "role": "user", "content": "caf\u00e9 \"x\""}"#; 50].join(", "));
        read_structurally(&long);
    }

    #[test]
    fn agrees_with_serde_json() {
        let texts = [
            r#"[{"a": "plain", "b": "esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\udeb2 end", "c": "é🚲"}]"#,
            r#"[0, -0, 12, -12, 1.5, -1.5e3, 2E-2, 1e+2, 9223372036854775807, -9223372036854775808]"#,
            r#"[18446744073709551615, 1e308, 123456789012345678901234567890, 2.2250738585072011e-308]"#,
            r#"[true, false, null, [], {}, [[]], {"": {"": []}}, "", "\u0000", {"k": 1, "k": 2}]"#,
            "[\"tab\there\"]",
            "[\"newline\nhere\"]",
            "[01]",
            "[1.]",
            "[.5]",
            "[1e]",
            "[-]",
            "[+1]",
            "[1e400]",
            "[-1e400]",
            "[0x10]",
            "[tru]",
            "[nul]",
            "[True]",
            r#"["\x"]"#,
            r#"["\u12"]"#,
            r#"["\u12G4"]"#,
            r#"["\ud800"]"#,
            r#"["\udc00"]"#,
            r#"["\ud800\u0041"]"#,
            r#"["\ud800\n"]"#,
            r#"[{"a" 1}]"#,
            r#"[{"a": 1,}]"#,
            r#"[{1: 2}]"#,
            r#"[{"a": 1 "b": 2}]"#,
            r#"["unterminated]"#,
            r#"["a" "b"]"#,
            r#"[[1, 2], [3,]]"#,
            "[1]\u{0}",
            "\u{feff}[1]",
            "",
            "[",
            "null",
            "{}",
            "[1] [2]",
        ];
        for text in texts {
            check_against_serde_json(text);
        }
    }

    /// Found by the fuzz target json_reader: after a leading zero a digit is an invalid number
    /// (serde_json: a syntax error), not the end of a number, and so not "it is a number".
    #[test]
    fn fuzz_leading_zero_then_digit_is_a_syntax_error() {
        check_against_serde_json("0922337203.719551,]");
        let error = |text| read_blocks(text).err().expect("refused");
        assert_eq!(error("09").to_string(), "invalid number: a leading zero at line 1 column 2");
        assert_eq!(error("[01]").class, ErrorClass::Syntax);
    }

    /// Found by the fuzz target json_reader: a surrogate escape followed by one byte other than a
    /// backslash, at the end of the text, is an unpaired surrogate (a syntax error), not a cut-off.
    #[test]
    fn fuzz_unpaired_surrogate_before_the_last_byte() {
        check_against_serde_json("\"assistad8d8:=h\\ud83d]");
        check_against_serde_json("[\"\\ud83d\\");
        check_against_serde_json("[\"\\ud83d");
    }

    #[test]
    fn mutated_documents_agree_with_serde_json() {
        let base: Vec<char> = r#"[{"id": "a\"b", "role": "user", "content": [{"type": "text", "text": "x\u00e9🚲"}],
            "n": -12.5e-3, "ok": true, "none": null, "list": [1, [2, {"k": "\\"}]]}, "tail"]"#
            .chars()
            .collect();
        let alphabet: Vec<char> = "{}[]\":,\\u0123456789.eE+-tfn ae\u{1}\ré🚲".chars().collect();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        for _ in 0..20_000 {
            let mut text = base.clone();
            for _ in 0..1 + next(3) {
                let at = next(text.len());
                match next(3) {
                    0 => {
                        text.remove(at);
                    }
                    1 => text.insert(at, alphabet[next(alphabet.len())]),
                    _ => text[at] = alphabet[next(alphabet.len())],
                }
            }
            check_against_serde_json(&text.iter().collect::<String>());
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let nested = |levels: usize| format!("[{}{}]", "[".repeat(levels), "]".repeat(levels));
        assert!(read_blocks(&nested(MAX_DEPTH)).is_ok());
        let deep = description(&nested(MAX_DEPTH + 1));
        assert!(deep.ends_with("a block is nested deeper than 128 levels at line 1 column 130"), "{deep}");
        // Refused without overflowing the stack.
        assert!(description(&nested(100_000)).contains("nested deeper than 128 levels"));
    }
}
