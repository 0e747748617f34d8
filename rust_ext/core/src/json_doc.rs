//! JSON text from clients (`blocks_json`), read in one pass into a flat tape: each top-level
//! element's span in the input is recorded (so the kept blocks go back out as the caller sent
//! them, byte for byte), and each element is readable as a `Node` whose strings point into the
//! input. One vector holds the whole document: reading a block allocates nothing per object or
//! list, which is where a general-purpose deserializer spent most of its time on chat JSON.

use crate::parse::{parse_conversation, CharCap, Conversation, Node, Shape, Violation};
use serde_json::{Map, Number, Value};

/// What an entry of a tape is.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Null,
    False,
    True,
    Int,
    Float,
    /// A string or object key: `a..a + b` of the input, or (when `b` is `OWNED`) the tape's
    /// unescaped string number `a`.
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

/// `Entry::b` of a string the tape holds unescaped.
const OWNED: u64 = u64::MAX;

/// A JSON document as a flat sequence of entries; strings point into the input unless escaped.
pub struct Tape<'a> {
    text: &'a str,
    entries: Vec<Entry>,
    owned: Vec<String>,
}

impl Tape<'_> {
    /// The index just past the value at `at` (and its contents).
    fn after(&self, at: usize) -> usize {
        match self.entries[at] {
            Entry { kind: Kind::List | Kind::Object, a, .. } => a as usize,
            _ => at + 1,
        }
    }

    fn str(&self, entry: Entry) -> &str {
        if entry.b == OWNED {
            &self.owned[entry.a as usize]
        } else {
            &self.text[entry.a as usize..(entry.a + entry.b) as usize]
        }
    }
}

/// The value at one index of a tape.
#[derive(Clone, Copy)]
pub struct TapeNode<'t, 'a> {
    tape: &'t Tape<'a>,
    at: usize,
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

    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self)) {
        if self.entry().kind == Kind::Object {
            let mut at = self.at + 1;
            while at < self.end() {
                f(self.tape.str(self.tape.entries[at]), self.at(at + 1));
                at = self.tape.after(at + 1);
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        let mut items = Vec::new();
        if self.entry().kind == Kind::List {
            let mut at = self.at + 1;
            while at < self.end() {
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

/// Parses a JSON array of blocks. A malformed document is one violation on `field`.
pub fn parse_json_blocks(text: &str, cap: impl Into<CharCap>, field: &str) -> Result<JsonConversation, Vec<Violation>> {
    let (tape, elements, spans) = read_spanned_array(text).ok_or_else(|| {
        vec![Violation {
            index: 0,
            field: field.to_owned(),
            description: format!("not a JSON array of blocks: {}", describe_malformed(text)),
        }]
    })?;
    let nodes: Vec<TapeNode> = elements.into_iter().map(|at| TapeNode { tape: &tape, at }).collect();
    let conversation = parse_conversation(&nodes, cap, "blocks")?;
    Ok(JsonConversation { conversation, spans })
}

/// Containers nested inside one block deeper than this are refused (the reader recurses), as
/// dict blocks are.
const MAX_DEPTH: usize = 128;

/// A strict JSON reader (RFC 8259) over valid UTF-8 text, writing a tape. Any error is `None`;
/// `describe_malformed` then asks serde_json what is wrong.
struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    entries: Vec<Entry>,
    owned: Vec<String>,
}

impl Reader<'_> {
    fn push(&mut self, kind: Kind, a: u64, b: u64) {
        self.entries.push(Entry { kind, a, b });
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
            return None;
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
                    return None;
                }
            }
        }
        self.skip_whitespace();
        (self.pos == self.bytes.len()).then_some((elements, spans))
    }

    /// Reads one value onto the tape.
    fn value(&mut self, depth: usize) -> Option<()> {
        self.skip_whitespace();
        match *self.bytes.get(self.pos)? {
            b'"' => {
                self.pos += 1;
                self.string()
            }
            b'{' | b'[' if depth == MAX_DEPTH => None,
            b'{' => self.object(depth),
            b'[' => self.list(depth),
            b't' => self.literal("true", Kind::True),
            b'f' => self.literal("false", Kind::False),
            b'n' => self.literal("null", Kind::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        self.pos += 1;
        let at = self.entries.len();
        self.push(Kind::Object, 0, 0);
        if !self.eat(b'}') {
            loop {
                if !self.eat(b'"') {
                    return None;
                }
                self.string()?;
                if !self.eat(b':') {
                    return None;
                }
                self.value(depth + 1)?;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        self.entries[at].a = self.entries.len() as u64;
        Some(())
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
                    return None;
                }
            }
        }
        self.entries[at].a = self.entries.len() as u64;
        Some(())
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Option<()> {
        let found = self.bytes[self.pos..].starts_with(word.as_bytes());
        self.pos += word.len();
        found.then(|| self.push(kind, 0, 0))
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
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return None,
        }
        let mut integer = true;
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            integer = false;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        let text = &self.text[start..self.pos];
        if integer && text != "-0" {
            if let Ok(int) = text.parse::<i64>() {
                self.push(Kind::Int, int as u64, 0);
                return Some(());
            }
        }
        let float = text.parse::<f64>().ok()?;
        float.is_finite().then(|| self.push(Kind::Float, float.to_bits(), 0))
    }

    /// The rest of a string (or key) whose opening quote was consumed, onto the tape: a span of
    /// the input when it has no escapes, else an unescaped copy.
    fn string(&mut self) -> Option<()> {
        let start = self.pos;
        self.skip_plain();
        if *self.bytes.get(self.pos)? == b'"' {
            self.pos += 1;
            self.push(Kind::Str, start as u64, (self.pos - 1 - start) as u64);
            return Some(());
        }
        let mut owned = String::from(&self.text[start..self.pos]);
        loop {
            match *self.bytes.get(self.pos)? {
                b'"' => {
                    self.pos += 1;
                    self.push(Kind::Str, self.owned.len() as u64, OWNED);
                    self.owned.push(owned);
                    return Some(());
                }
                b'\\' => {
                    self.pos += 1;
                    owned.push(self.escape()?);
                }
                _ => return None, // a control character
            }
            let run = self.pos;
            self.skip_plain();
            owned.push_str(&self.text[run..self.pos]);
        }
    }

    /// Advances to the next `"`, `\` or control character (or the end), eight bytes at a time.
    fn skip_plain(&mut self) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        // Nonzero when some byte of `word` is below `n` (it may also flag a byte after that one).
        let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH;
        while let Some(chunk) = self.bytes.get(self.pos..self.pos + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let special = below(word ^ (ONES * u64::from(b'"')), 1)
                | below(word ^ (ONES * u64::from(b'\\')), 1)
                | below(word, 0x20);
            if special != 0 {
                break;
            }
            self.pos += 8;
        }
        while let Some(&byte) = self.bytes.get(self.pos) {
            if byte == b'"' || byte == b'\\' || byte < 0x20 {
                return;
            }
            self.pos += 1;
        }
    }

    /// The character of an escape whose backslash was consumed; `\uXXXX` pairs surrogates.
    fn escape(&mut self) -> Option<char> {
        let byte = *self.bytes.get(self.pos)?;
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
                let high = self.hex4()?;
                if (0xDC00..0xE000).contains(&high) {
                    return None; // a lone trailing surrogate
                }
                if !(0xD800..0xDC00).contains(&high) {
                    return char::from_u32(high);
                }
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return None; // a lone leading surrogate
                }
                self.pos += 2;
                let low = self.hex4()?;
                if !(0xDC00..0xE000).contains(&low) {
                    return None;
                }
                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.pos..self.pos + 4)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos += 4;
        u32::from_str_radix(digits, 16).ok()
    }
}

/// A top-level JSON array read onto a tape, with each element's tape index and byte span; `None`
/// when the text is not a well-formed array.
fn read_spanned_array(text: &str) -> Option<(Tape<'_>, Vec<usize>, Vec<Span>)> {
    let entries = Vec::with_capacity(text.len() / 16);
    let mut reader = Reader { text, bytes: text.as_bytes(), pos: 0, entries, owned: Vec::new() };
    let (elements, spans) = reader.spanned_array()?;
    Some((Tape { text, entries: reader.entries, owned: reader.owned }, elements, spans))
}

/// What is wrong with text the reader refused: serde_json's account, with line and column.
fn describe_malformed(text: &str) -> String {
    match serde_json::from_str::<Vec<serde::de::IgnoredAny>>(text) {
        Err(e) => e.to_string(),
        Ok(_) => format!("a block is nested deeper than {MAX_DEPTH} levels"),
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

    /// The elements of a well-formed array as values, and their spans' texts.
    fn read(text: &str) -> Option<(Vec<Value>, Vec<&str>)> {
        let (tape, elements, spans) = read_spanned_array(text)?;
        let values = elements.iter().map(|&at| TapeNode { tape: &tape, at }.to_json().unwrap()).collect();
        Some((values, spans.iter().map(|&(start, len)| &text[start..start + len]).collect()))
    }

    #[test]
    fn array_framing_is_strict() {
        for text in ["[", "[1,]", "[1 2]", "[1] x", "[,1]", "", "[]]"] {
            assert!(read_spanned_array(text).is_none(), "{text:?} was accepted");
        }
        assert_eq!(read(" \t[ ]\n"), Some((vec![], vec![])));
        let text = "[ \"]\" ,1.5,{\"a\":[1]}\r\n]";
        let (values, pieces) = read(text).unwrap();
        assert_eq!(values, [json!("]"), json!(1.5), json!({"a": [1]})]);
        assert_eq!(pieces, ["\"]\"", "1.5", "{\"a\":[1]}"]);
    }

    /// Equal values, floats within a relative 1e-15: serde_json's default float parsing may be
    /// one unit in the last place off, where this reader rounds correctly.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
            }
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|((kx, vx), (ky, vy))| kx == ky && same(vx, vy))
            }
            _ => a == b,
        }
    }

    /// The reader's verdict and values, against serde_json's.
    fn check_against_serde(text: &str) {
        let ours = read(text).map(|(values, _)| values);
        let theirs = serde_json::from_str::<Vec<Value>>(text).ok();
        match (&ours, &theirs) {
            (Some(ours), Some(theirs)) => assert!(
                ours.len() == theirs.len() && ours.iter().zip(theirs).all(|(a, b)| same(a, b)),
                "{text:?}: {ours:?} vs {theirs:?}"
            ),
            _ => assert_eq!(ours.is_some(), theirs.is_some(), "{text:?}"),
        }
    }

    #[test]
    fn agrees_with_serde_json() {
        let texts = [
            r#"[{"a": "plain", "b": "esc \" \\ \/ \b \f \n \r \t \u00e9 \ud83d\udeb2 end", "c": "é🚲"}]"#,
            r#"[0, -0, 12, -12, 1.5, -1.5e3, 2E-2, 1e+2, 9223372036854775807, -9223372036854775808]"#,
            r#"[18446744073709551615, 1e308, 123456789012345678901234567890]"#,
            r#"[true, false, null, [], {}, [[]], {"": {"": []}}, "", "\u0000", {"k": 1, "k": 2}]"#,
            "[\"tab\there\"]",
            "[\"newline\nhere\"]",
            r#"[01]"#,
            r#"[1.]"#,
            r#"[.5]"#,
            r#"[1e]"#,
            r#"[-]"#,
            r#"[+1]"#,
            r#"[1e400]"#,
            r#"[0x10]"#,
            r#"[tru]"#,
            r#"[nul]"#,
            r#"[True]"#,
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
        ];
        for text in texts {
            check_against_serde(text);
        }
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
            check_against_serde(&text.iter().collect::<String>());
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let nested = |levels: usize| format!("[{}{}]", "[".repeat(levels), "]".repeat(levels));
        assert!(read_spanned_array(&nested(MAX_DEPTH)).is_some());
        let err = parse_json_blocks(&nested(MAX_DEPTH + 1), 100, "blocks_json").unwrap_err();
        assert!(err[0].description.ends_with("nested deeper than 128 levels"), "{}", err[0].description);
        // Refused without overflowing the stack.
        let err = parse_json_blocks(&nested(100_000), 100, "blocks_json").unwrap_err();
        assert!(err[0].description.ends_with("nested deeper than 128 levels"), "{}", err[0].description);
    }
}
