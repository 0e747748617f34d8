//! A chat's audit stores what changed (docs/store.md, "What an audit stores"). The final messages
//! of a prompt, a JSON array, are split into their elements (the blocks); each block is stored
//! once per chat, keyed by the XXH3-128 of its text. The blocks a write adds go into one row, a
//! segment: their texts compressed together with a zstd dictionary trained on blocks
//! (`data/blocks.zdict`), keyed by the hash of its blocks' hashes. The audit keeps its references
//! (`Refs`): every segment the chat still needs with the hashes of its blocks, and the messages
//! in order as indices into them. A next turn that sends its history again adds one small segment
//! with its new messages; a segment none of whose blocks an audit references any more is deleted,
//! and when a write adds a segment, what is referenced of the chat's small segments (under
//! `MERGED_BELOW_BYTES`) and of those mostly unreferenced is written again into it: a chat holds
//! few segments, and little text no audit references.
//!
//! The references rebuild the array byte for byte: an array is split only when it is exactly `[`,
//! its elements joined by one separator (`,` as the core writes an array, `, ` as Python's
//! `json.dumps` does), and `]`; any other array is stored whole, as before.

use crate::json_spans::{self, Span};
use rustc_hash::{FxHashMap, FxHashSet};
use std::fmt;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_128;

/// The key of a stored block, or of a segment, within its chat.
pub type Hash = u128;

/// The dictionary blocks are compressed with; its id is in every frame, so a frame names the
/// dictionary it needs (a new dictionary takes a new id, and the old one stays for reading).
const DICTIONARY: &[u8] = include_bytes!("../data/blocks.zdict");
const LEVEL: i32 = 6;
const HASH_BYTES: usize = 16;
/// A segment of less data is written again into the next one a write adds: small rows each cost a
/// key and a row's overhead, and compress less than one row of their texts together.
const MERGED_BELOW_BYTES: usize = 1024;

/// How the elements of a split array were joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Separator {
    Comma,
    CommaSpace,
}

impl Separator {
    fn text(self) -> &'static [u8] {
        match self {
            Separator::Comma => b",",
            Separator::CommaSpace => b", ",
        }
    }

    fn code(self) -> u8 {
        match self {
            Separator::Comma => 0,
            Separator::CommaSpace => 1,
        }
    }

    fn from_code(code: u8) -> Result<Separator, StoredError> {
        match code {
            0 => Ok(Separator::Comma),
            1 => Ok(Separator::CommaSpace),
            _ => Err(StoredError("unknown separator in message references")),
        }
    }
}

/// What is wrong with stored data (a damaged store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredError(pub &'static str);

impl fmt::Display for StoredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for StoredError {}

/// The top-level elements of a JSON array, and how they were joined; None unless the text is
/// exactly `[`, the elements joined by one separator, `]` (`[]` has no elements). The text is
/// taken as the valid JSON a shift wrote: only strings and nesting are tracked. An array of
/// objects (a prompt's messages) is scanned 64 bytes at a time (`json_spans`), any other byte by
/// byte.
pub fn split_array(text: &[u8]) -> Option<(Vec<&[u8]>, Separator)> {
    match json_spans::object_spans(text) {
        Some(spans) if !spans.is_empty() => joined(text, &spans),
        _ => split_bytewise(text),
    }
}

/// The elements at `spans`, if the text is exactly `[`, them joined by one separator, `]`.
fn joined<'a>(text: &'a [u8], spans: &[Span]) -> Option<(Vec<&'a [u8]>, Separator)> {
    let gap = |end: usize, start: usize| &text[end..start];
    let separator = match spans.get(1) {
        Some(&(second, _)) if gap(spans[0].0 + spans[0].1, second) == b", " => Separator::CommaSpace,
        _ => Separator::Comma,
    };
    let (first, _) = spans[0];
    let (last, last_len) = spans[spans.len() - 1];
    let exact = first == 1
        && last + last_len + 1 == text.len()
        && spans.windows(2).all(|w| gap(w[0].0 + w[0].1, w[1].0) == separator.text());
    exact.then(|| (spans.iter().map(|&(start, len)| &text[start..start + len]).collect(), separator))
}

fn split_bytewise(text: &[u8]) -> Option<(Vec<&[u8]>, Separator)> {
    let inner = text.strip_prefix(b"[")?.strip_suffix(b"]")?;
    if inner.is_empty() {
        return Some((Vec::new(), Separator::Comma));
    }
    let mut elements = Vec::new();
    let mut separator = None;
    let (mut depth, mut in_string, mut escaped, mut start) = (0usize, false, false, 0usize);
    let mut i = 0;
    while i < inner.len() {
        let byte = inner[i];
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => depth = depth.checked_sub(1)?,
                b',' if depth == 0 => {
                    let gap = if inner.get(i + 1) == Some(&b' ') { Separator::CommaSpace } else { Separator::Comma };
                    if *separator.get_or_insert(gap) != gap {
                        return None;
                    }
                    elements.push(&inner[start..i]);
                    i += gap.text().len();
                    start = i;
                    continue;
                }
                _ => {}
            }
        }
        i += 1;
    }
    elements.push(&inner[start..]);
    let exact = !in_string && depth == 0 && elements.iter().all(|e| is_trimmed(e));
    exact.then_some((elements, separator.unwrap_or(Separator::Comma)))
}

fn is_trimmed(element: &[u8]) -> bool {
    match (element.first(), element.last()) {
        (Some(first), Some(last)) => !first.is_ascii_whitespace() && !last.is_ascii_whitespace(),
        _ => false,
    }
}

/// A segment's blocks: the texts, one after another, each after its length (u32, little-endian),
/// compressed as one zstd frame with the dictionary.
fn compress_segment(texts: &[&[u8]]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(texts.iter().map(|t| t.len() + 4).sum());
    for text in texts {
        raw.extend_from_slice(&u32::try_from(text.len()).expect("a block under 4 GiB").to_le_bytes());
        raw.extend_from_slice(text);
    }
    let mut compressor =
        zstd::bulk::Compressor::with_dictionary(LEVEL, DICTIONARY).expect("the bundled dictionary loads");
    compressor.include_contentsize(true).expect("a zstd parameter");
    compressor.include_checksum(false).expect("a zstd parameter");
    compressor.compress(&raw).expect("compressing into a growing buffer")
}

/// The texts of a stored segment.
pub fn decompress_segment(data: &[u8]) -> Result<Vec<Vec<u8>>, StoredError> {
    let size = zstd::zstd_safe::get_frame_content_size(data)
        .ok()
        .flatten()
        .ok_or(StoredError("a stored segment is not a zstd frame with its size"))?;
    let mut decompressor = zstd::bulk::Decompressor::with_dictionary(DICTIONARY)
        .map_err(|_| StoredError("the bundled dictionary does not load"))?;
    let raw = decompressor
        .decompress(data, usize::try_from(size).map_err(|_| StoredError("a stored segment is too large"))?)
        .map_err(|_| StoredError("a stored segment is not a zstd frame of the bundled dictionary"))?;
    let mut texts = Vec::new();
    let mut rest = raw.as_slice();
    while !rest.is_empty() {
        let (length, tail) = rest.split_first_chunk::<4>().ok_or(StoredError("a stored segment is cut short"))?;
        let length = u32::from_le_bytes(*length) as usize;
        let text = tail.get(..length).ok_or(StoredError("a stored segment is cut short"))?;
        texts.push(text.to_vec());
        rest = &tail[length..];
    }
    Ok(texts)
}

fn hash_of_bytes(bytes: &[u8]) -> Hash {
    u128::from_le_bytes(bytes.try_into().expect("16 bytes"))
}

fn segment_hash(blocks: &[Hash]) -> Hash {
    let bytes: Vec<u8> = blocks.iter().flat_map(|h| h.to_le_bytes()).collect();
    xxh3_128(&bytes)
}

/// A stored segment: its hash, its blocks' hashes in order, and the size of its data.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Segment {
    hash: Hash,
    blocks: Vec<Hash>,
    bytes: usize,
}

/// The blocks a chat has stored: its segments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    segments: Vec<Segment>,
}

impl Stored {
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.blocks.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The segments' hashes, as the store keys their rows.
    pub fn segment_hashes(&self) -> impl Iterator<Item = Hash> + '_ {
        self.segments.iter().map(|s| s.hash)
    }

    fn locations(&self) -> FxHashMap<Hash, (usize, usize)> {
        let mut at = FxHashMap::default();
        for (s, segment) in self.segments.iter().enumerate() {
            for (i, block) in segment.blocks.iter().enumerate() {
                at.entry(*block).or_insert((s, i));
            }
        }
        at
    }
}

/// An audit's references, as stored beside it: the separator; the segments (count, then each
/// one's hash, data size, block count and blocks' hashes); the messages (count, then each one's
/// block as a position among all the segments' blocks, in order). Sizes, counts and positions are
/// u32, little-endian.
pub struct Refs {
    pub separator: Separator,
    pub stored: Stored,
    /// Each message's segment and block within it.
    pub messages: Vec<(usize, usize)>,
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoredError> {
        if self.0.len() < n {
            return Err(StoredError("message references cut short"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn count(&mut self) -> Result<usize, StoredError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize)
    }

    fn hash(&mut self) -> Result<Hash, StoredError> {
        Ok(hash_of_bytes(self.take(HASH_BYTES)?))
    }
}

fn push_count(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).expect("under 4 billion").to_le_bytes());
}

impl Refs {
    pub fn parse(bytes: &[u8]) -> Result<Refs, StoredError> {
        let mut reader = Reader(bytes);
        let separator = Separator::from_code(reader.take(1)?[0])?;
        let mut segments = Vec::new();
        let mut positions = Vec::new(); // each block's (segment, index), in the order listed
        for s in 0..reader.count()? {
            let hash = reader.hash()?;
            let bytes = reader.count()?;
            let n = reader.count()?;
            let blocks = (0..n).map(|_| reader.hash()).collect::<Result<Vec<_>, _>>()?;
            positions.extend((0..n).map(|i| (s, i)));
            segments.push(Segment { hash, blocks, bytes });
        }
        let messages = (0..reader.count()?)
            .map(|_| positions.get(reader.count()?).copied().ok_or(StoredError("a message names no stored block")))
            .collect::<Result<Vec<_>, _>>()?;
        if !reader.0.is_empty() {
            return Err(StoredError("message references run past their end"));
        }
        Ok(Refs { separator, stored: Stored { segments }, messages })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.separator.code()];
        push_count(&mut out, self.stored.segments.len());
        let mut first = Vec::with_capacity(self.stored.segments.len());
        let mut position = 0;
        for segment in &self.stored.segments {
            out.extend_from_slice(&segment.hash.to_le_bytes());
            push_count(&mut out, segment.bytes);
            push_count(&mut out, segment.blocks.len());
            for block in &segment.blocks {
                out.extend_from_slice(&block.to_le_bytes());
            }
            first.push(position);
            position += segment.blocks.len();
        }
        push_count(&mut out, self.messages.len());
        for (s, i) in &self.messages {
            push_count(&mut out, first[*s] + i);
        }
        out
    }

    /// The array, from its segments' texts (by segment hash).
    pub fn rebuild(&self, texts: &FxHashMap<Hash, Vec<Vec<u8>>>) -> Result<Vec<u8>, StoredError> {
        let mut out = vec![b'['];
        for (k, (s, i)) in self.messages.iter().enumerate() {
            if k > 0 {
                out.extend_from_slice(self.separator.text());
            }
            let segment = &self.stored.segments[*s];
            let text = texts
                .get(&segment.hash)
                .ok_or(StoredError("a segment of the audit is not stored"))?
                .get(*i)
                .ok_or(StoredError("a stored segment holds fewer blocks than its references"))?;
            if xxh3_128(text) != segment.blocks[*i] {
                return Err(StoredError("a stored block is not the text its audit references"));
            }
            out.extend_from_slice(text);
        }
        out.push(b']');
        Ok(out)
    }
}

/// What an audit stores of its messages, given what its chat has stored.
pub struct Written {
    /// `Refs` of the array, as bytes.
    pub refs: Vec<u8>,
    /// The segment the write adds (its hash and data), if it adds a block.
    pub new: Option<(Hash, Vec<u8>)>,
    /// The chat's segments the write deletes: none of their blocks referenced, or what is
    /// referenced written again in the new segment.
    pub gone: Vec<Hash>,
    /// What the chat has stored once the write is.
    pub stored: Arc<Stored>,
}

/// The references of `messages` and what to write and delete; None when the array cannot be
/// rebuilt from its elements (see `split_array`): then it is stored whole.
pub fn store(messages: &[u8], stored: &Stored) -> Option<Written> {
    let (elements, separator) = split_array(messages)?;
    let hashes: Vec<Hash> = elements.iter().map(|e| xxh3_128(e)).collect();
    let referenced: FxHashSet<Hash> = hashes.iter().copied().collect();
    let adds = {
        let held = stored.locations();
        hashes.iter().any(|h| !held.contains_key(h))
    };
    // Segments kept: those with a block referenced. When the write adds a segment anyway, it takes
    // in what is referenced of the chat's small segments and of those mostly unreferenced.
    let keep: Vec<bool> = stored
        .segments
        .iter()
        .map(|segment| {
            let used = segment.blocks.iter().filter(|b| referenced.contains(b)).count();
            let small = segment.bytes < MERGED_BELOW_BYTES;
            used > 0 && !(adds && (small || used * 2 < segment.blocks.len()))
        })
        .collect();
    let mut kept =
        Stored { segments: stored.segments.iter().zip(&keep).filter(|(_, k)| **k).map(|(s, _)| s.clone()).collect() };
    let gone = stored.segments.iter().zip(&keep).filter(|(_, k)| !**k).map(|(s, _)| s.hash).collect();
    let mut at = kept.locations();
    let mut new_texts: Vec<&[u8]> = Vec::new();
    let mut new_blocks: Vec<Hash> = Vec::new();
    for (element, hash) in elements.iter().zip(&hashes) {
        if !at.contains_key(hash) {
            at.insert(*hash, (kept.segments.len(), new_blocks.len()));
            new_texts.push(element);
            new_blocks.push(*hash);
        }
    }
    let new = (!new_blocks.is_empty()).then(|| {
        let hash = segment_hash(&new_blocks);
        let data = compress_segment(&new_texts);
        kept.segments.push(Segment { hash, blocks: new_blocks, bytes: data.len() });
        (hash, data)
    });
    let messages = hashes.iter().map(|h| at[h]).collect();
    let refs = Refs { separator, stored: kept, messages };
    Some(Written { refs: refs.encode(), new, gone, stored: Arc::new(refs.stored) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Option<(Vec<String>, Separator)> {
        split_array(text.as_bytes())
            .map(|(e, s)| (e.iter().map(|x| String::from_utf8(x.to_vec()).unwrap()).collect(), s))
    }

    /// Messages of these ids, each with text of its own that compresses little (hex digits).
    fn array(ids: &[&str]) -> Vec<u8> {
        let text = |id: &str| {
            (0..8u64).map(|k| format!("{:032x}", xxh3_128(format!("{id}{k}").as_bytes()))).collect::<String>()
        };
        let items: Vec<String> = ids.iter().map(|id| format!(r#"{{"id":"{id}","text":"{}"}}"#, text(id))).collect();
        format!("[{}]", items.join(",")).into_bytes()
    }

    /// Every segment of a chat as the store holds them, after `written`.
    fn apply(rows: &mut FxHashMap<Hash, Vec<Vec<u8>>>, written: &Written) {
        for gone in &written.gone {
            rows.remove(gone);
        }
        if let Some((hash, data)) = &written.new {
            rows.insert(*hash, decompress_segment(data).unwrap());
        }
        assert_eq!(rows.keys().copied().collect::<FxHashSet<_>>(), written.stored.segment_hashes().collect());
    }

    #[test]
    fn arrays_split_into_their_elements_as_written() {
        assert_eq!(texts("[]"), Some((vec![], Separator::Comma)));
        assert_eq!(texts(r#"[{"a":1}]"#), Some((vec![r#"{"a":1}"#.into()], Separator::Comma)));
        let (elements, separator) = texts(r#"[{"a":"x,y]"},{"b":[1,{"c":"\"}"}]}]"#).unwrap();
        assert_eq!(elements, vec![r#"{"a":"x,y]"}"#, r#"{"b":[1,{"c":"\"}"}]}"#]);
        assert_eq!(separator, Separator::Comma);
        let (elements, separator) = texts(r#"[{"a": 1}, {"b": "\\"}, 3]"#).unwrap();
        assert_eq!(elements, vec![r#"{"a": 1}"#, r#"{"b": "\\"}"#, "3"]);
        assert_eq!(separator, Separator::CommaSpace);
    }

    #[test]
    fn objects_scanned_64_bytes_at_a_time_split_as_byte_by_byte() {
        let long = format!(r#"{{"a":"{}\\","b":{{"c":[1,"]",2]}}}}"#, r#"x,}]\"{["#.repeat(40));
        for (text, splits) in [
            (format!("[{long},{long},{{}}]"), true),
            (format!("[{long}, {long}]"), true),
            (format!("[{long}]"), true),
            (format!("[{long}, {long},{long}]"), false),
            (format!("[ {long}]"), false),
        ] {
            let split = split_array(text.as_bytes());
            assert_eq!(split, split_bytewise(text.as_bytes()), "{text}");
            assert_eq!(split.is_some(), splits, "{text}");
        }
    }

    #[test]
    fn arrays_that_would_not_rebuild_alike_are_not_split() {
        for text in ["[{},  {}]", "[{}, {},{}]", "[ {}]", "[{} ]", "{}", "[{}", r#"["a]"#, "[,]", "[{},]"] {
            assert_eq!(texts(text), None, "{text}");
        }
    }

    #[test]
    fn a_next_turn_adds_one_segment_of_its_new_blocks() {
        let mut rows = FxHashMap::default();
        let ids: Vec<String> = (0..12).map(|n| format!("m{n}")).collect();
        let first_ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let first = store(&array(&[&first_ids[..], &["m0"]].concat()), &Stored::default()).unwrap();
        apply(&mut rows, &first);
        assert_eq!(first.stored.len(), 12); // the repeated message is stored once
        let refs = Refs::parse(&first.refs).unwrap();
        assert_eq!(refs.rebuild(&rows).unwrap(), array(&[&first_ids[..], &["m0"]].concat()));
        let again = store(&array(&first_ids), &first.stored).unwrap();
        assert!(again.new.is_none() && again.gone.is_empty());
        // m0 left out, n1 added: the first segment (12 blocks, 11 referenced) stays.
        let next_ids = [&first_ids[1..], &["n1"]].concat();
        let next = store(&array(&next_ids), &first.stored).unwrap();
        apply(&mut rows, &next);
        assert_eq!((rows.len(), next.gone.len(), next.stored.len()), (2, 0, 13));
        // n2 added: the small segment of n1 goes into the new one with it.
        let last_ids = [&next_ids[..], &["n2"]].concat();
        let last = store(&array(&last_ids), &next.stored).unwrap();
        apply(&mut rows, &last);
        assert_eq!((rows.len(), last.gone.len(), last.stored.len()), (2, 1, 14));
        assert_eq!(Refs::parse(&last.refs).unwrap().rebuild(&rows).unwrap(), array(&last_ids));
    }

    #[test]
    fn a_segment_mostly_unreferenced_is_written_again_with_the_next_blocks() {
        let mut rows = FxHashMap::default();
        let first = store(&array(&["a", "b", "c", "d", "e"]), &Stored::default()).unwrap();
        apply(&mut rows, &first);
        let next = store(&array(&["e", "f"]), &first.stored).unwrap();
        apply(&mut rows, &next);
        assert_eq!(next.gone.len(), 1);
        assert_eq!((rows.len(), next.stored.len()), (1, 2)); // one segment: e again, and f
        assert_eq!(Refs::parse(&next.refs).unwrap().rebuild(&rows).unwrap(), array(&["e", "f"]));
        let none = store(b"[]", &next.stored).unwrap();
        apply(&mut rows, &none);
        assert!(rows.is_empty() && none.stored.is_empty());
    }

    #[test]
    fn references_rebuild_the_array_byte_for_byte() {
        for text in [r#"[{"a":1},{"b":"é"}]"#, r#"[{"a": 1}, {"b": 2}, {"a": 1}]"#, "[]"] {
            let written = store(text.as_bytes(), &Stored::default()).unwrap();
            let mut rows = FxHashMap::default();
            apply(&mut rows, &written);
            assert_eq!(Refs::parse(&written.refs).unwrap().rebuild(&rows).unwrap(), text.as_bytes());
            assert_eq!(Refs::parse(&written.refs).unwrap().stored, *written.stored);
        }
    }

    #[test]
    fn damaged_data_is_an_error_not_a_panic() {
        assert!(decompress_segment(b"not zstd").is_err());
        for refs in [&b""[..], &[7], &[0, 1, 0, 0], &[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]] {
            assert!(Refs::parse(refs).is_err(), "{refs:?}");
        }
        let written = store(&array(&["a"]), &Stored::default()).unwrap();
        let refs = Refs::parse(&written.refs).unwrap();
        assert!(refs.rebuild(&FxHashMap::default()).is_err());
        let wrong = FxHashMap::from_iter([(written.stored.segments[0].hash, vec![b"{}".to_vec()])]);
        assert!(refs.rebuild(&wrong).is_err());
        let mut cut = written.refs.clone();
        cut.pop();
        assert!(Refs::parse(&cut).is_err());
    }
}
