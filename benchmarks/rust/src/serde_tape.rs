//! The alternative to contextshift's own reader that the benchmark keeps measuring: serde_json
//! (fuzzed upstream) lexing the same kind of tape, with spans and repeated-key detection. The
//! array is read as raw elements (their spans: serde_json has no public byte offset), then each
//! element is read again, while in cache, by a visitor writing the tape. Written and measured for
//! issue #12; the engine keeps its own reader while this stays about half its speed.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Null,
    Bool,
    Int,
    Float,
    Str,
    List,
    Object,
}

/// As contextshift's tape: plain scalars; strings are spans of the input or owned copies.
#[derive(Clone, Copy)]
pub struct Entry {
    pub kind: Kind,
    pub a: u64,
    pub b: u64,
}

const OWNED: u64 = u64::MAX;
const MAX_DEPTH: usize = 128;

#[derive(Default)]
pub struct Tape {
    pub entries: Vec<Entry>,
    pub owned: Vec<String>,
    pub elements: Vec<usize>,
    pub spans: Vec<(usize, usize)>,
    pub repeated: Vec<(usize, String)>,
    keys: Vec<usize>,
}

impl Tape {
    /// How many strings and keys the tape holds.
    pub fn strings(&self) -> usize {
        self.entries.iter().filter(|e| matches!(e.kind, Kind::Str)).count()
    }

    fn push(&mut self, kind: Kind, a: u64, b: u64) {
        self.entries.push(Entry { kind, a, b });
    }

    fn str<'t>(&'t self, text: &'t str, at: usize) -> &'t str {
        let Entry { a, b, .. } = self.entries[at];
        if b == OWNED {
            &self.owned[a as usize]
        } else {
            &text[a as usize..(a + b) as usize]
        }
    }
}

/// Reads a JSON array of blocks onto a tape; serde_json's error otherwise.
pub fn read(text: &str) -> Result<Tape, serde_json::Error> {
    let mut reader =
        ArrayReader { text, tape: Tape { entries: Vec::with_capacity(text.len() / 16), ..Tape::default() } };
    let mut outer = serde_json::Deserializer::from_str(text);
    de::Deserializer::deserialize_seq(&mut outer, &mut reader)?;
    outer.end()?;
    Ok(reader.tape)
}

struct ArrayReader<'a> {
    text: &'a str,
    tape: Tape,
}

impl<'de> Visitor<'de> for &mut ArrayReader<'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of blocks")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(raw) = seq.next_element::<&'de RawValue>()? {
            let element = raw.get();
            let start = element.as_ptr() as usize - self.text.as_ptr() as usize;
            self.tape.elements.push(self.tape.entries.len());
            self.tape.spans.push((start, element.len()));
            let mut de = serde_json::Deserializer::from_str(element);
            de.disable_recursion_limit(); // the seed's own limit applies
            ValueSeed { text: self.text, tape: &mut self.tape, depth: 0 }
                .deserialize(&mut de)
                .map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

struct ValueSeed<'t, 'a> {
    text: &'a str,
    tape: &'t mut Tape,
    depth: usize,
}

impl<'a> ValueSeed<'_, 'a> {
    fn child(&mut self) -> ValueSeed<'_, 'a> {
        ValueSeed { text: self.text, tape: self.tape, depth: self.depth + 1 }
    }

    fn open<E: de::Error>(&mut self, kind: Kind) -> Result<usize, E> {
        if self.depth == MAX_DEPTH {
            return Err(E::custom(format_args!("a block is nested deeper than {MAX_DEPTH} levels")));
        }
        self.tape.push(kind, 0, 0);
        Ok(self.tape.entries.len() - 1)
    }

    fn close(&mut self, at: usize) {
        self.tape.entries[at].a = self.tape.entries.len() as u64;
    }

    fn push_str(&mut self, s: &str, borrowed: bool) {
        let offset = (s.as_ptr() as usize).wrapping_sub(self.text.as_ptr() as usize);
        if borrowed && offset <= self.text.len() && s.len() <= self.text.len() - offset {
            self.tape.push(Kind::Str, offset as u64, s.len() as u64);
        } else {
            self.tape.push(Kind::Str, self.tape.owned.len() as u64, OWNED);
            self.tape.owned.push(s.to_owned());
        }
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.tape.push(Kind::Null, 0, 0);
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.tape.push(Kind::Bool, u64::from(v), 0);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.tape.push(Kind::Int, v as u64, 0);
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        match i64::try_from(v) {
            Ok(v) => self.visit_i64(v),
            Err(_) => self.visit_f64(v as f64),
        }
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.tape.push(Kind::Float, v.to_bits(), 0);
        Ok(())
    }

    fn visit_borrowed_str<E>(mut self, v: &'de str) -> Result<(), E> {
        self.push_str(v, true);
        Ok(())
    }

    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        self.push_str(v, false);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let at = self.open(Kind::List)?;
        while seq.next_element_seed(self.child())?.is_some() {}
        self.close(at);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let at = self.open(Kind::Object)?;
        let first = self.tape.keys.len();
        while map.next_key_seed(self.child())?.is_some() {
            let key = self.tape.entries.len() - 1;
            let text = self.tape.str(self.text, key);
            if self.tape.keys[first..].iter().any(|&k| self.tape.str(self.text, k) == text) {
                let repeated = (at, text.to_owned());
                self.tape.repeated.push(repeated);
            }
            self.tape.keys.push(key);
            map.next_value_seed(self.child())?;
        }
        self.tape.keys.truncate(first);
        self.close(at);
        Ok(())
    }
}
