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

use crate::json_spans::{object_spans, Span};
use crate::parse::{parse_conversation, CharCap, Conversation, Node, Shape, Violation};
use rustc_hash::FxHashSet;
use serde_json::error::Category;
use serde_json::{Map, Number, Value};
use std::borrow::Cow;
use std::fmt;

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
}

impl Tape<'_> {
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

/// A conversation read from JSON text, with where each block's text lies in that input.
#[derive(Clone, Debug)]
pub struct JsonConversation {
    pub conversation: Conversation,
    /// Byte range of each top-level element in the input.
    pub spans: Vec<Span>,
}

/// `bytes` as text, or what says where they are not UTF-8 (the message JSON text's callers give).
pub fn utf8_text(bytes: &[u8]) -> Result<&str, String> {
    simdutf8::compat::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))
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
    let repeated = repeated_keys(&nodes, &document.repeated, "blocks");
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
    /// Objects with a key that occurs twice: the object's tape index and the key.
    pub repeated: Vec<(usize, String)>,
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

/// Reads a top-level JSON array onto a tape, with each element's span; errors call an element
/// `element` ("block", "tool").
pub fn read_array<'a>(text: &'a str, element: &'static str) -> Result<Document<'a>, ReadError> {
    let mut reader = Reader {
        element,
        text,
        bytes: text.as_bytes(),
        pos: 0,
        entries: Vec::with_capacity(text.len() / 16),
        owned: String::new(),
        keys: Vec::new(),
        repeated: Vec::new(),
        failure: None,
    };
    match reader.spanned_array() {
        Some((elements, spans)) => Ok(Document {
            tape: Tape { text, entries: reader.entries, owned: reader.owned },
            elements,
            spans,
            repeated: reader.repeated,
        }),
        None => {
            let (at, class, what) = reader.failure.expect("the reader records why it stopped");
            let line_start = text[..at].rfind('\n').map_or(0, |newline| newline + 1);
            let line = 1 + text[..line_start].matches('\n').count();
            Err(ReadError { class, what: what.into_owned(), line, column: at - line_start + 1 })
        }
    }
}

/// A strict JSON reader (RFC 8259) over valid UTF-8 text, writing a tape. It stops at the first
/// error, recording what and where.
struct Reader<'a> {
    /// What the array holds, for error messages.
    element: &'static str,
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    entries: Vec<Entry>,
    owned: String,
    /// Tape indices of the keys of the objects being read, innermost last: one stack for all
    /// open objects, so reading an object allocates nothing.
    keys: Vec<usize>,
    repeated: Vec<(usize, String)>,
    failure: Option<(usize, ErrorClass, Cow<'static, str>)>,
}

/// Objects with more keys than this find repeats through a hash set rather than by comparing
/// each key with the ones before it.
const LINEAR_KEYS: usize = 16;

impl Reader<'_> {
    fn push(&mut self, kind: Kind, a: u64, b: u64) {
        self.entries.push(Entry { kind, a, b });
    }

    /// Records an error at `at` (the first one recorded stands) and stops the reader.
    fn fail_at<T>(&mut self, at: usize, class: ErrorClass, what: impl Into<Cow<'static, str>>) -> Option<T> {
        self.failure.get_or_insert((at, class, what.into()));
        None
    }

    /// An error at the reading position: the text ended (`Eof`) or holds something else there.
    fn fail<T>(&mut self, what: impl Into<Cow<'static, str>>) -> Option<T> {
        let class = if self.pos >= self.bytes.len() { ErrorClass::Eof } else { ErrorClass::Syntax };
        let what = if class == ErrorClass::Eof { "the text ends early".into() } else { what.into() };
        self.fail_at(self.pos.min(self.bytes.len()), class, what)
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    /// Skips whitespace, then consumes `byte` if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_whitespace();
        let found = self.bytes.get(self.pos) == Some(&byte);
        self.pos += usize::from(found);
        found
    }

    /// `[ value, ... ]` and nothing after it but whitespace: each element's tape index and span.
    fn spanned_array(&mut self) -> Option<(Vec<usize>, Vec<Span>)> {
        let (mut elements, mut spans) = (Vec::new(), Vec::new());
        if !self.eat(b'[') {
            return self.not_an_array();
        }
        if !self.eat(b']') {
            loop {
                self.skip_whitespace();
                let start = self.pos;
                elements.push(self.entries.len());
                self.value(0)?;
                spans.push((start, self.pos - start));
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return self.fail(format!("expected `,` or `]` after a {}", self.element));
                }
            }
        }
        self.skip_whitespace();
        if self.pos != self.bytes.len() {
            return self.fail(format!("trailing characters after the array of {}s", self.element));
        }
        Some((elements, spans))
    }

    /// The text holds something other than an array: a JSON value of another type, or not JSON.
    fn not_an_array<T>(&mut self) -> Option<T> {
        let start = self.pos;
        let got = match self.bytes.get(self.pos) {
            Some(b'{') => "an object",
            Some(b'"') => "a string",
            Some(b't' | b'f') => "a boolean",
            Some(b'n') => "null",
            Some(b'-' | b'0'..=b'9') => "a number",
            _ => return self.fail(format!("expected a JSON array of {}s", self.element)),
        };
        // A scalar must itself be well-formed before its type can be the problem (an object is
        // the wrong type from its first byte).
        if got != "an object" {
            self.value(0)?;
        }
        self.fail_at(start, ErrorClass::Data, format!("it is {got}"))
    }

    /// Reads one value onto the tape.
    fn value(&mut self, depth: usize) -> Option<()> {
        self.skip_whitespace();
        match self.bytes.get(self.pos) {
            Some(b'"') => {
                self.pos += 1;
                self.string()
            }
            Some(b'{' | b'[') if depth == MAX_DEPTH => {
                let what = format!("a {} is nested deeper than {MAX_DEPTH} levels", self.element);
                self.fail_at(self.pos, ErrorClass::Syntax, what)
            }
            Some(b'{') => self.object(depth),
            Some(b'[') => self.list(depth),
            Some(b't') => self.literal("true", Kind::True),
            Some(b'f') => self.literal("false", Kind::False),
            Some(b'n') => self.literal("null", Kind::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.fail("expected a value"),
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        self.pos += 1;
        let at = self.entries.len();
        self.push(Kind::Object, 0, 0);
        let first_key = self.keys.len();
        let mut many: Option<FxHashSet<String>> = None;
        if !self.eat(b'}') {
            loop {
                if !self.eat(b'"') {
                    return self.fail("expected a key (a string)");
                }
                self.string()?;
                self.check_key(at, first_key, &mut many);
                if !self.eat(b':') {
                    return self.fail("expected `:` after a key");
                }
                self.value(depth + 1)?;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return self.fail("expected `,` or `}` in an object");
                }
            }
        }
        self.keys.truncate(first_key);
        self.entries[at].a = self.entries.len() as u64;
        Some(())
    }

    /// Notes a key the object at tape index `object` already has (its keys so far are
    /// `keys[first..]`, or `many` once there are too many to compare one by one).
    fn check_key(&mut self, object: usize, first: usize, many: &mut Option<FxHashSet<String>>) {
        let key = self.entries.len() - 1;
        let text = self.key_text(key);
        let seen = match many {
            Some(set) => !set.insert(text.to_owned()),
            // Lengths first (both are in the entries): keys of one object mostly differ in length.
            None => self.keys[first..]
                .iter()
                .any(|&k| self.entries[k].b & !OWNED == text.len() as u64 && self.key_text(k) == text),
        };
        if seen {
            self.repeated.push((object, self.key_text(key).to_owned()));
        }
        self.keys.push(key);
        if many.is_none() && self.keys.len() - first > LINEAR_KEYS {
            *many = Some(self.keys[first..].iter().map(|&k| self.key_text(k).to_owned()).collect());
        }
    }

    /// The text of the key at tape index `at`.
    fn key_text(&self, at: usize) -> &str {
        entry_str(self.text, &self.owned, self.entries[at])
    }

    fn list(&mut self, depth: usize) -> Option<()> {
        self.pos += 1;
        let at = self.entries.len();
        self.push(Kind::List, 0, 0);
        if !self.eat(b']') {
            loop {
                self.value(depth + 1)?;
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return self.fail("expected `,` or `]` in a list");
                }
            }
        }
        self.entries[at].a = self.entries.len() as u64;
        Some(())
    }

    fn literal(&mut self, word: &'static str, kind: Kind) -> Option<()> {
        let rest = &self.bytes[self.pos..];
        if rest.starts_with(word.as_bytes()) {
            self.pos += word.len();
            self.push(kind, 0, 0);
            return Some(());
        }
        // Where the text stops matching the word.
        let matching = rest.iter().zip(word.as_bytes()).take_while(|(a, b)| a == b).count();
        self.pos += matching;
        self.fail("expected a value (true, false or null?)")
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`: an integer when it fits an i64,
    /// otherwise a finite float (as serde_json reads numbers, "-0" included).
    fn number(&mut self) -> Option<()> {
        let start = self.pos;
        self.pos += usize::from(self.bytes[self.pos] == b'-');
        match self.bytes.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                if self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    return self.fail("invalid number: a leading zero");
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.fail("invalid number"),
        }
        let mut integer = true;
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            integer = false;
            if self.digits() == 0 {
                return self.fail("invalid number: a digit must follow `.`");
            }
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.fail("invalid number: a digit must follow the exponent");
            }
        }
        let text = &self.text[start..self.pos];
        if integer && text != "-0" {
            if let Ok(int) = text.parse::<i64>() {
                self.push(Kind::Int, int as u64, 0);
                return Some(());
            }
        }
        match text.parse::<f64>() {
            Ok(float) if float.is_finite() => {
                self.push(Kind::Float, float.to_bits(), 0);
                Some(())
            }
            _ => self.fail_at(start, ErrorClass::Syntax, "number out of range (beyond a 64-bit float)"),
        }
    }

    /// The rest of a string (or key) whose opening quote was consumed, onto the tape: a span of
    /// the input when it has no escapes, else an unescaped copy.
    #[inline(always)] // one call per string and key: the call itself cost 6% of the reader
    fn string(&mut self) -> Option<()> {
        let start = self.pos;
        self.skip_plain();
        if self.bytes.get(self.pos) == Some(&b'"') {
            self.pos += 1;
            self.push(Kind::Str, start as u64, (self.pos - 1 - start) as u64);
            return Some(());
        }
        self.escaped_string(start)
    }

    /// The rest of a string from `start` whose plain run ends at an escape (or an error): kept
    /// out of line, so the common case above is small enough to inline.
    #[inline(never)]
    fn escaped_string(&mut self, start: usize) -> Option<()> {
        let from = self.owned.len();
        self.owned.push_str(&self.text[start..self.pos]);
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    self.push(Kind::Str, from as u64, (self.owned.len() - from) as u64 | OWNED);
                    return Some(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let unescaped = self.escape()?;
                    self.owned.push(unescaped);
                }
                _ => return self.fail("control character in a string (it must be escaped)"),
            }
            let run = self.pos;
            self.skip_plain();
            self.owned.push_str(&self.text[run..self.pos]);
        }
    }

    /// Advances to the next `"`, `\` or control character (or the end): sixteen bytes at a time
    /// with SSE2 (every x86-64 has it), eight at a time elsewhere, then byte by byte.
    fn skip_plain(&mut self) {
        // The position stays in a register, not written back at every step.
        let mut pos = self.pos;
        #[cfg(target_arch = "x86_64")]
        while let Some(chunk) = self.bytes.get(pos..pos + 16) {
            if let Some(offset) = sse2::first_special(chunk.try_into().expect("sixteen bytes")) {
                self.pos = pos + offset;
                return;
            }
            pos += 16;
        }
        while let Some(chunk) = self.bytes.get(pos..pos + 8) {
            if let Some(offset) = first_special_of_eight(chunk.try_into().expect("eight bytes")) {
                self.pos = pos + offset;
                return;
            }
            pos += 8;
        }
        while let Some(&byte) = self.bytes.get(pos) {
            if byte == b'"' || byte == b'\\' || byte < 0x20 {
                break;
            }
            pos += 1;
        }
        self.pos = pos;
    }

    /// The character of an escape whose backslash was consumed; `\uXXXX` pairs surrogates.
    fn escape(&mut self) -> Option<char> {
        const UNPAIRED: &str = "unpaired UTF-16 surrogate in a \\u escape (JSON text must encode Unicode characters)";
        let Some(&byte) = self.bytes.get(self.pos) else { return self.fail("invalid escape") };
        self.pos += 1;
        Some(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let escape = self.pos - 2;
                let high = self.hex4()?;
                if (0xDC00..0xE000).contains(&high) {
                    return self.fail_at(escape, ErrorClass::Syntax, UNPAIRED);
                }
                if !(0xD800..0xDC00).contains(&high) {
                    return char::from_u32(high);
                }
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    // The text may end where the pair's second half would begin.
                    let cut_off = matches!(&self.bytes[self.pos..], [] | [b'\\']);
                    let class = if cut_off { ErrorClass::Eof } else { ErrorClass::Syntax };
                    return self.fail_at(escape, class, UNPAIRED);
                }
                self.pos += 2;
                let low = self.hex4()?;
                if !(0xDC00..0xE000).contains(&low) {
                    return self.fail_at(escape, ErrorClass::Syntax, UNPAIRED);
                }
                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
            }
            _ => {
                self.pos -= 1;
                return self.fail("invalid escape");
            }
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let Some(digits) = self.bytes.get(self.pos..self.pos + 4) else {
            self.pos = self.bytes.len(); // fewer than four bytes left
            return self.fail("invalid \\u escape: four hex digits expected");
        };
        if let Some(bad) = digits.iter().position(|b| !b.is_ascii_hexdigit()) {
            self.pos += bad;
            return self.fail("invalid \\u escape: four hex digits expected");
        }
        self.pos += 4;
        u32::from_str_radix(&self.text[self.pos - 4..self.pos], 16).ok()
    }
}

/// The offset of the first `"`, `\` or control character in eight bytes, found as one word: the
/// high bit of each byte below `n` is set by `below`. Bytes above a flagged one may be flagged too
/// (a borrow runs upwards), never one below it, so the lowest flag is exact.
fn first_special_of_eight(chunk: [u8; 8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH;
    let word = u64::from_le_bytes(chunk);
    let special =
        below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1) | below(word, 0x20);
    (special != 0).then(|| (special.trailing_zeros() / 8) as usize)
}

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };

    /// The offset of the first `"`, `\` or control character in sixteen bytes: three byte-wise
    /// compares and one mask (a byte is a control character when max(byte, 0x1f) is 0x1f).
    pub(super) fn first_special(chunk: &[u8; 16]) -> Option<usize> {
        // SAFETY: SSE2 is part of x86-64; the load reads exactly the sixteen bytes of `chunk`
        // and needs no alignment.
        let mask = unsafe {
            let v = _mm_loadu_si128(chunk.as_ptr().cast());
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            let control = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x1f)), _mm_set1_epi8(0x1f));
            _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control))
        };
        (mask != 0).then(|| mask.trailing_zeros() as usize)
    }
}

/// The differential check of this reader against serde_json, shared by the fuzz target
/// (`fuzz/fuzz_targets/json_reader.rs`) and the unit tests; panics on a disagreement. Both accept
/// the same documents with the same values and spans, or refuse them with the same class of
/// error. The one difference by design: serde_json's nesting limit counts the outer array and is
/// one level lower, so a block 127 or 128 levels deep is read here and refused there.
#[doc(hidden)]
pub fn check_against_serde_json(text: &str) {
    let scanned = object_spans(text);
    // With its `raw_value` feature, serde_json reads an object with this key as a raw value
    // (its private marker), not as JSON: no verdict of its to compare with.
    if text.contains("$serde_json::private::RawValue") {
        let _ = read_blocks(text);
        return;
    }
    let theirs = serde_json::from_str::<Vec<Value>>(text);
    match (read_blocks(text), theirs) {
        (Ok(doc), Ok(values)) => {
            assert_eq!(doc.elements.len(), values.len(), "{text:?}");
            if values.iter().all(Value::is_object) {
                assert_eq!(scanned.as_ref(), Some(&doc.spans), "{text:?}: the scan's spans");
            }
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
                assert_eq!(sse2::first_special(&chunk), naive(&chunk), "byte {byte:#04x} at {at}");
                let eight: [u8; 8] = chunk[at.min(8)..at.min(8) + 8].try_into().unwrap();
                assert_eq!(first_special_of_eight(eight), naive(&eight), "byte {byte:#04x} at {at}");
            }
        }
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

    /// Found by the fuzzer: serde_json (with `raw_value`) reads an object keyed by its private
    /// marker as a raw value and refuses it with a data error where the reader sees a syntax error.
    #[test]
    fn fuzz_serde_json_raw_value_marker_is_not_compared() {
        check_against_serde_json(r#"[{"id": "a", "function": {"$serde_json::private::RawValue": "{\"x\": 1}"}]"#);
        check_against_serde_json(r#"[{"$serde_json::private::RawValue": 5}]"#);
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
