//! The precise reader: byte by byte over the text, strict (RFC 8259), stopping at the first error
//! with what and where. It reads every document the structural reader (`structural.rs`) gives up
//! on, so errors are always its own; and it writes the tape entries both readers share.

use super::{Entry, ErrorClass, Kind, ReadError, Span, Tape, MAX_DEPTH, OWNED};
use rustc_hash::FxHashSet;
use std::borrow::Cow;

/// Objects with more keys than this find repeats through a hash set rather than by comparing
/// each key with the ones before it.
const LINEAR_KEYS: usize = 16;

/// A key of an open object: its tape index, and what most keys differ in (their length and first
/// eight bytes), so a repeat is found without reading the keys' texts again.
#[derive(Clone, Copy)]
pub(super) struct Key {
    at: usize,
    len: usize,
    head: u64,
}

impl Key {
    fn of(at: usize, text: &str) -> Key {
        let mut head = [0u8; 8];
        let n = text.len().min(8);
        head[..n].copy_from_slice(&text.as_bytes()[..n]);
        Key { at, len: text.len(), head: u64::from_le_bytes(head) }
    }
}

/// Where a reader is in the top-level array.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// Just after `[`: an element or `]` comes next.
    Opened,
    /// After an element: `,` or `]` comes next.
    Between,
    /// After `]` and the whitespace after it.
    Closed,
}

/// A strict JSON reader over valid UTF-8 text, writing a tape. It stops at the first error,
/// recording what and where.
pub(super) struct Reader<'a> {
    /// What the array holds, for error messages.
    pub(super) element: &'static str,
    pub(super) text: &'a str,
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
    pub(super) tape: Tape<'a>,
    /// The keys of the objects being read, innermost last: one stack for all open objects, so
    /// reading an object allocates nothing.
    keys: Vec<Key>,
    pub(super) failure: Option<(usize, ErrorClass, Cow<'static, str>)>,
    pub(super) place: Place,
}

impl<'a> Reader<'a> {
    pub(super) fn new(text: &'a str, element: &'static str) -> Self {
        Reader {
            element,
            text,
            bytes: text.as_bytes(),
            pos: 0,
            tape: Tape::new(text),
            keys: Vec::new(),
            failure: None,
            place: Place::Opened,
        }
    }

    #[inline]
    pub(super) fn push(&mut self, kind: Kind, a: u64, b: u64) {
        self.tape.entries.push(Entry { kind, a, b });
    }

    /// Records an error at `at` (the first one recorded stands) and stops the reader.
    pub(super) fn fail_at<T>(&mut self, at: usize, class: ErrorClass, what: impl Into<Cow<'static, str>>) -> Option<T> {
        self.failure.get_or_insert((at, class, what.into()));
        None
    }

    /// An error at the reading position: the text ended (`Eof`) or holds something else there.
    pub(super) fn fail<T>(&mut self, what: impl Into<Cow<'static, str>>) -> Option<T> {
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

    /// Reads on from `pos` (after an element, or after `[`), forgetting any error and open object.
    pub(super) fn restart_at(&mut self, pos: usize) {
        self.pos = pos;
        self.failure = None;
        self.keys.clear();
    }

    /// The error the reader stopped at, with its line and column.
    pub(super) fn error(&self) -> ReadError {
        let (at, class, what) = self.failure.clone().expect("the reader records why it stopped");
        let text = self.text;
        let line_start = text[..at].rfind('\n').map_or(0, |newline| newline + 1);
        let line = 1 + text[..line_start].matches('\n').count();
        ReadError { class, what: what.into_owned(), line, column: at - line_start + 1 }
    }

    /// `[`, or why the text is not an array.
    pub(super) fn open_array(&mut self) -> Option<()> {
        if !self.eat(b'[') {
            return self.not_an_array();
        }
        self.place = Place::Opened;
        Some(())
    }

    /// The next element (its tape index and span), or None after the last one; the array's `]`
    /// and nothing after it but whitespace. `Err(())` when the text is malformed (`failure` says
    /// how).
    pub(super) fn next_element(&mut self) -> Result<Option<(usize, Span)>, ()> {
        let place = self.place;
        if place == Place::Closed {
            return Ok(None);
        }
        if self.eat(b']') {
            self.close_array().ok_or(())?;
            return Ok(None);
        }
        if place == Place::Between && !self.eat(b',') {
            return self.fail(format!("expected `,` or `]` after a {}", self.element)).ok_or(());
        }
        self.skip_whitespace();
        let (start, at) = (self.pos, self.tape.entries.len());
        self.value(0).ok_or(())?;
        self.place = Place::Between;
        Ok(Some((at, (start, self.pos - start))))
    }

    /// After `]`: only whitespace may follow.
    pub(super) fn close_array(&mut self) -> Option<()> {
        self.skip_whitespace();
        if self.pos != self.bytes.len() {
            return self.fail(format!("trailing characters after the array of {}s", self.element));
        }
        self.place = Place::Closed;
        Some(())
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
            Some(b'{' | b'[') if depth == MAX_DEPTH => self.too_deep(),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.list(depth),
            Some(b't') => self.literal("true", Kind::True),
            Some(b'f') => self.literal("false", Kind::False),
            Some(b'n') => self.literal("null", Kind::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.fail("expected a value"),
        }
    }

    pub(super) fn too_deep<T>(&mut self) -> Option<T> {
        let what = format!("a {} is nested deeper than {MAX_DEPTH} levels", self.element);
        self.fail_at(self.pos, ErrorClass::Syntax, what)
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        self.pos += 1;
        let (at, first_key) = self.open_object();
        let mut many = None;
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
        self.close_container(at, first_key);
        Some(())
    }

    /// Writes an object's entry: its tape index, and where its keys start on the key stack.
    #[inline]
    pub(super) fn open_object(&mut self) -> (usize, usize) {
        let at = self.tape.entries.len();
        self.push(Kind::Object, 0, 0);
        (at, self.keys.len())
    }

    /// Ends the container at tape index `at`: its entry points past its contents.
    #[inline]
    pub(super) fn close_container(&mut self, at: usize, first_key: usize) {
        self.keys.truncate(first_key);
        self.tape.entries[at].a = self.tape.entries.len() as u64;
    }

    /// Notes a key the object at tape index `object` already has (its keys so far are
    /// `keys[first..]`, or `many` once there are too many to compare one by one). The key is the
    /// last entry written.
    pub(super) fn check_key(&mut self, object: usize, first: usize, many: &mut Option<FxHashSet<String>>) {
        let at = self.tape.entries.len() - 1;
        let text = self.tape.str(self.tape.entries[at]);
        let key = Key::of(at, text);
        let seen = match many {
            Some(set) => !set.insert(text.to_owned()),
            None => self.keys[first..].iter().any(|k| {
                k.len == key.len && k.head == key.head && (k.len <= 8 || self.tape.str(self.tape.entries[k.at]) == text)
            }),
        };
        if seen {
            self.tape.repeated.push((object, text.to_owned()));
        }
        self.keys.push(key);
        if many.is_none() && self.keys.len() - first > LINEAR_KEYS {
            *many =
                Some(self.keys[first..].iter().map(|k| self.tape.str(self.tape.entries[k.at]).to_owned()).collect());
        }
    }

    fn list(&mut self, depth: usize) -> Option<()> {
        self.pos += 1;
        let at = self.tape.entries.len();
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
        self.tape.entries[at].a = self.tape.entries.len() as u64;
        Some(())
    }

    pub(super) fn literal(&mut self, word: &'static str, kind: Kind) -> Option<()> {
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
    pub(super) fn number(&mut self) -> Option<()> {
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
    /// out of line, so the common case above is small enough to inline. `pos` ends past the
    /// closing quote.
    #[inline(never)]
    pub(super) fn escaped_string(&mut self, start: usize) -> Option<()> {
        let from = self.tape.owned.len();
        self.tape.owned.push_str(&self.text[start..self.pos]);
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    let len = (self.tape.owned.len() - from) as u64;
                    self.push(Kind::Str, from as u64, len | OWNED);
                    return Some(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let unescaped = self.escape()?;
                    self.tape.owned.push(unescaped);
                }
                _ => return self.fail("control character in a string (it must be escaped)"),
            }
            let run = self.pos;
            self.skip_plain();
            self.tape.owned.push_str(&self.text[run..self.pos]);
        }
    }

    /// Advances to the next `"`, `\` or control character (or the end): sixteen bytes at a time
    /// with SSE2 (every x86-64 has it), eight at a time elsewhere, then byte by byte.
    pub(super) fn skip_plain(&mut self) {
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
pub(super) fn first_special_of_eight(chunk: [u8; 8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH;
    let word = u64::from_le_bytes(chunk);
    let special =
        below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1) | below(word, 0x20);
    (special != 0).then(|| (special.trailing_zeros() / 8) as usize)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod sse2 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };

    /// The offset of the first `"`, `\` or control character in sixteen bytes: three byte-wise
    /// compares and one mask (a byte is a control character when max(byte, 0x1f) is 0x1f).
    pub(in super::super) fn first_special(chunk: &[u8; 16]) -> Option<usize> {
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
