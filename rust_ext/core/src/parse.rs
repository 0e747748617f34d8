//! Reading blocks in every shape of docs/semantics.md §1, collecting every violation with its
//! field path (`blocks[3].content[1].type`), and the per-block char cap.
//!
//! The reader is generic over [`Node`], a read-only view of a JSON-like document: the core
//! implements it for `serde_json::Value` (JSON text from any client) and the Python bindings
//! for Python objects, so dict blocks are read in place with no intermediate copy and both
//! routes share one parser.

use crate::block::{Block, CountMemo, Image, Kind, Reasoning, ReasoningSource, Role, Strings, ToolCall};
use crate::image_header;
use crate::json_text::to_json_text;
use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::Value;
use std::fmt::Write;
use std::sync::Arc;

/// One node of a JSON-like document, as the parser sees it.
pub enum Shape<'a> {
    Null,
    Bool(bool),
    Int(i64),
    /// A non-integer number; may be NaN or infinite when it comes from Python.
    Float(f64),
    Str(&'a str),
    List,
    Object,
    /// Anything else (a Python set, a huge int, ...), by type name.
    Other(String),
}

impl Shape<'_> {
    pub fn type_name(&self) -> &str {
        match self {
            Shape::Null => "null",
            Shape::Bool(_) => "boolean",
            Shape::Int(_) | Shape::Float(_) => "number",
            Shape::Str(_) => "string",
            Shape::List => "list",
            Shape::Object => "object",
            Shape::Other(name) => name,
        }
    }
}

/// A read-only view of a JSON-like document.
pub trait Node: Sized {
    fn shape(&self) -> Shape<'_>;
    fn is_null(&self) -> bool {
        matches!(self.shape(), Shape::Null)
    }
    /// Calls `f` with each entry of an object, in order (nothing for other shapes).
    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self));
    /// The items of a list (empty for other shapes).
    fn items(&self) -> Vec<Self>;
    /// The node as an owned JSON value; an error describes what cannot be represented.
    fn to_json(&self) -> Result<Value, String>;
}

impl Node for &Value {
    fn shape(&self) -> Shape<'_> {
        match self {
            Value::Null => Shape::Null,
            Value::Bool(b) => Shape::Bool(*b),
            Value::Number(n) => {
                n.as_i64().map(Shape::Int).unwrap_or_else(|| Shape::Float(n.as_f64().unwrap_or(f64::NAN)))
            }
            Value::String(s) => Shape::Str(s),
            Value::Array(_) => Shape::List,
            Value::Object(_) => Shape::Object,
        }
    }

    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self)) {
        if let Value::Object(map) = self {
            for (key, value) in map {
                f(key, value);
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        match self {
            Value::Array(items) => items.iter().collect(),
            _ => Vec::new(),
        }
    }

    fn to_json(&self) -> Result<Value, String> {
        Ok((*self).clone())
    }
}

/// Where a node sits, built on the stack as the reader descends and formatted only when needed
/// (a violation, or a char-cap rewrite).
#[derive(Clone, Copy)]
enum Path<'p> {
    Block(&'p str, usize),
    Key(&'p Path<'p>, &'p str),
    Index(&'p Path<'p>, usize),
}

impl<'p> Path<'p> {
    fn key(&'p self, key: &'p str) -> Path<'p> {
        Path::Key(self, key)
    }

    fn index(&'p self, index: usize) -> Path<'p> {
        Path::Index(self, index)
    }

    /// `blocks[3].content[1].text`
    fn field(&self) -> String {
        let mut out = String::new();
        self.write_field(&mut out);
        out
    }

    fn write_field(&self, out: &mut String) {
        match self {
            Path::Block(list, index) => {
                let _ = write!(out, "{list}[{index}]");
            }
            Path::Key(parent, key) => {
                parent.write_field(out);
                out.push('.');
                out.push_str(key);
            }
            Path::Index(parent, index) => {
                parent.write_field(out);
                let _ = write!(out, "[{index}]");
            }
        }
    }

    /// JSON pointer inside the block: `/content/1/text`.
    fn pointer(&self) -> String {
        match self {
            Path::Block(..) => String::new(),
            Path::Key(parent, key) => format!("{}/{}", parent.pointer(), key.replace('~', "~0").replace('/', "~1")),
            Path::Index(parent, index) => format!("{}/{index}", parent.pointer()),
        }
    }
}

/// One thing wrong with the input, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub index: usize,
    pub field: String,
    pub description: String,
}

/// A block cut by the char cap: the block as it was, and its message with the cut text in place.
#[derive(Clone, Debug, PartialEq)]
pub struct CharCut {
    pub index: usize,
    pub original: Block,
    pub message: Value,
}

/// A block over its char cap whose reasoning alone leaves no room: reasoning is never cut, so the
/// block is not cut either, and the plan leaves it out whole (`REASONING_OVER_CAP`) unless its
/// group is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverCap {
    pub index: usize,
    pub reasoning_chars: usize,
    pub cap: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    /// Shared: a block read before is the block cached then (`block_cache`), and the list itself
    /// with the recent request it was read as (copying 10k pointers, and dropping them, was about
    /// a tenth of an agent loop's next turn).
    pub blocks: Arc<Vec<Arc<Block>>>,
    /// Shared: a recent request's cuts are taken with its blocks (`block_cache`).
    pub cuts: Vec<Arc<CharCut>>,
    pub over_cap: Vec<OverCap>,
}

impl Conversation {
    /// Its first `n` blocks, with their cuts and over-cap entries (all of them: the same list).
    pub fn prefix(&self, n: usize) -> Conversation {
        if n == self.blocks.len() {
            return self.clone();
        }
        Conversation {
            blocks: Arc::new(self.blocks[..n].to_vec()),
            cuts: self.cuts.iter().filter(|c| c.index < n).map(Arc::clone).collect(),
            over_cap: self.over_cap.iter().filter(|o| o.index < n).copied().collect(),
        }
    }

    /// `prefix(n)`, cut from this list in place when nothing else holds it.
    pub fn into_prefix(self, n: usize) -> Conversation {
        match Arc::try_unwrap(self.blocks) {
            Ok(mut blocks) => {
                blocks.truncate(n);
                let Conversation { mut cuts, mut over_cap, .. } = self;
                cuts.retain(|c| c.index < n);
                over_cap.retain(|o| o.index < n);
                Conversation { blocks: Arc::new(blocks), cuts, over_cap }
            }
            Err(blocks) => Conversation { blocks, ..self }.prefix(n),
        }
    }
}

/// Ends every block the char cap cut.
pub const TRUNCATED_SUFFIX: &str = "[Truncated]";

/// The char cap: every block's text at most `block` code points, and a tool result's (a block
/// that answers a call) at most `tool_result` (the smaller of the two applies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CharCap {
    pub block: usize,
    pub tool_result: usize,
}

impl CharCap {
    /// The cap of `block`.
    pub fn of(&self, block: &Block) -> usize {
        if block.result_ids.is_empty() {
            self.block
        } else {
            self.block.min(self.tool_result)
        }
    }
}

impl From<usize> for CharCap {
    /// The same cap for every block.
    fn from(max_chars: usize) -> Self {
        CharCap { block: max_chars, tool_result: max_chars }
    }
}

/// Keys that name the call a tool result answers, all equal.
const RESULT_ID_KEYS: [&str; 5] = ["toolCallId", "tool_call_id", "callId", "call_id", "tool_use_id"];
/// `call_id`'s place in `RESULT_ID_KEYS`: on a Responses `function_call` item it names the call
/// the item issues, not one it answers.
const CALL_ID: usize = 3;

/// Parses a whole request. Ids must be unique; blocks over their `cap` are cut.
/// `list_name` names the list in field paths (`blocks`).
pub fn parse_conversation<N: Node>(
    nodes: &[N],
    cap: impl Into<CharCap>,
    list_name: &str,
) -> Result<Conversation, Vec<Violation>> {
    let cap = cap.into();
    let mut blocks = Vec::with_capacity(nodes.len());
    let mut cuts = Vec::new();
    let mut over_cap = Vec::new();
    let mut violations = Vec::new();
    // Every block with a readable id takes part in the duplicate check, including blocks with
    // other errors, so one request reports every problem. The check runs after the loop over
    // borrowed ids: no id is copied for it.
    let mut ids: Vec<(usize, Id)> = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        let block = match parse_block(node, index, list_name) {
            Ok(block) => block,
            Err(v) => {
                ids.extend(readable_id(node, index).map(|id| (index, Id::Owned(id))));
                violations.extend(v);
                continue;
            }
        };
        match capped(node, block, index, list_name, cap) {
            Ok(capped) => {
                ids.push((index, Id::Parsed(blocks.len())));
                blocks.push(capped.push_into(&mut cuts, &mut over_cap));
            }
            Err((id, v)) => {
                ids.push((index, Id::Owned(id)));
                violations.extend(v);
            }
        }
    }
    let mut all = duplicate_ids(&ids, &blocks, list_name);
    if all.is_empty() && violations.is_empty() {
        return Ok(Conversation { blocks: Arc::new(blocks), cuts, over_cap });
    }
    all.extend(violations);
    all.sort_by_key(|v| v.index); // stable: a block's duplicate id before its other violations
    Err(all)
}

/// `known` (a valid conversation's first blocks, with the hashes of their ids or more when known)
/// and then `rest` read and cut under `cap`, as `parse_conversation` of them all would give it,
/// with the hashes of all their ids; `known` handed back when a block of `rest` has a violation
/// or an id repeats (a whole read then says what is wrong). The known list is extended in place
/// when nothing else holds it.
pub fn extend_conversation<N: Node>(
    mut known: Conversation,
    known_ids: Option<IdHashes>,
    rest: &[N],
    cap: CharCap,
    list_name: &str,
) -> Result<(Conversation, IdHashes), Conversation> {
    let (from, cuts_from, over_cap_from) = (known.blocks.len(), known.cuts.len(), known.over_cap.len());
    let Conversation { blocks, cuts, over_cap } = &mut known;
    let blocks = Arc::make_mut(blocks);
    blocks.reserve(rest.len());
    let read = rest.iter().all(|node| {
        let index = blocks.len();
        let block = parse_block(node, index, list_name).ok().and_then(|b| capped(node, b, index, list_name, cap).ok());
        block.map(|block| blocks.push(block.push_into(cuts, over_cap))).is_some()
    });
    let ids = if read { unique_id_hashes(blocks, known_ids.map(|ids| (ids, from))) } else { None };
    match ids {
        Some(ids) => Ok((known, ids)),
        None => {
            blocks.truncate(from);
            cuts.truncate(cuts_from);
            over_cap.truncate(over_cap_from);
            Err(known)
        }
    }
}

/// Whether no two blocks have the same id.
pub fn unique_ids(blocks: &[Arc<Block>]) -> bool {
    let mut ids: FxHashSet<&str> = FxHashSet::with_capacity_and_hasher(blocks.len(), Default::default());
    blocks.iter().all(|b| ids.insert(b.id.as_str()))
}

/// The hashes (XXH3) of a valid conversation's block ids, kept with a request read lately so that
/// a request extending it checks its new blocks' ids only: a new id whose hash is not among them
/// is none of theirs. Every id of the conversation has its hash in it (a request that took less
/// of it leaves more: still a sound check); a new id whose hash is in already sends the check
/// back to every id. Checking every id of a 10k-block history read each id from its block (two
/// cache misses each): 5-8% of a next turn's shift.
#[derive(Clone, Debug, Default)]
pub struct IdHashes(FxHashSet<u64>);

fn id_hash(block: &Block) -> u64 {
    xxhash_rust::xxh3::xxh3_64(block.id.as_bytes())
}

/// The hashes of `blocks`' ids, when no id repeats (None when one does). `known`: the hashes of
/// the ids of their first `from` blocks (or more), so only the blocks after those are hashed.
pub fn unique_id_hashes(blocks: &[Arc<Block>], known: Option<(IdHashes, usize)>) -> Option<IdHashes> {
    // Hashes of blocks dropped since (a request that took less) pile up no further than this.
    let known = known.filter(|(IdHashes(hashes), _)| hashes.len() <= 2 * blocks.len());
    if let Some((IdHashes(mut hashes), from)) = known {
        hashes.reserve(blocks.len().saturating_sub(from));
        if blocks[from..].iter().all(|b| hashes.insert(id_hash(b))) {
            return Some(IdHashes(hashes));
        }
    }
    let mut hashes = FxHashSet::with_capacity_and_hasher(blocks.len(), Default::default());
    let mut clash = false;
    for block in blocks {
        clash |= !hashes.insert(id_hash(block));
    }
    // Two ids of one hash are told apart by the ids themselves.
    (!clash || unique_ids(blocks)).then_some(IdHashes(hashes))
}

/// A block under the char cap: as read, over it with reasoning that leaves no room (whole), or cut.
pub enum Capped {
    Fits(Block),
    OverCap(Block, OverCap),
    Cut(Block, Box<CharCut>),
}

impl Capped {
    /// The block as it goes in; its cut or its over-cap entry recorded.
    pub fn push_into(self, cuts: &mut Vec<Arc<CharCut>>, over_cap: &mut Vec<OverCap>) -> Arc<Block> {
        match self {
            Capped::Fits(block) => Arc::new(block),
            Capped::OverCap(block, over) => {
                over_cap.push(over);
                Arc::new(block)
            }
            Capped::Cut(block, cut) => {
                cuts.push(Arc::from(cut));
                Arc::new(block)
            }
        }
    }
}

/// `block`, read from `node` at `index`, under `cap` (the block cache cuts a block found or read
/// on its own as a whole read cuts it); a cut that fails gives the block's id and the violations.
pub fn capped<N: Node>(
    node: &N,
    block: Block,
    index: usize,
    list_name: &str,
    cap: CharCap,
) -> Result<Capped, (String, Vec<Violation>)> {
    if fits_cap(&block, cap) {
        return Ok(Capped::Fits(block));
    }
    let max_chars = cap.of(&block);
    // Reasoning is never cut: the text gets what it leaves, or the block goes whole.
    let reasoning_chars = block.reasoning_chars();
    if reasoning_chars + TRUNCATED_SUFFIX.len() > max_chars {
        return Ok(Capped::OverCap(block, OverCap { index, reasoning_chars, cap: max_chars }));
    }
    match cut_block(node, index, list_name, max_chars - reasoning_chars) {
        Ok((cut_block, cut)) => Ok(Capped::Cut(cut_block, Box::new(cut))),
        Err(v) => Err((block.id, v)),
    }
}

/// Whether `block` is within its char cap (and so goes in as read).
pub fn fits_cap(block: &Block, cap: CharCap) -> bool {
    // Bytes bound code points from above, so most blocks skip the code point count.
    let max_chars = cap.of(block);
    let bytes = block.pieces.iter().map(String::len).sum::<usize>() + block.reasoning_bytes(false);
    bytes <= max_chars || block.char_count() <= max_chars
}

/// A block's id for the duplicate check: of a parsed block, or read from a block that failed.
enum Id {
    Parsed(usize),
    Owned(String),
}

/// A violation for each block whose id an earlier block has (naming the latest such block).
fn duplicate_ids(ids: &[(usize, Id)], blocks: &[Arc<Block>], list_name: &str) -> Vec<Violation> {
    let mut last_index: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(ids.len(), Default::default());
    let mut duplicates = Vec::new();
    for (index, id) in ids {
        let id = match id {
            Id::Parsed(position) => blocks[*position].id.as_str(),
            Id::Owned(id) => id.as_str(),
        };
        if let Some(first) = last_index.insert(id, *index) {
            duplicates.push(Violation {
                index: *index,
                field: format!("{list_name}[{index}].id"),
                description: format!("duplicate id {id:?} (also block {first})"),
            });
        }
    }
    duplicates
}

/// [`parse_conversation`] over JSON values, for tests.
#[cfg(test)]
pub fn parse_values(
    values: &[Value],
    cap: impl Into<CharCap>,
    list_name: &str,
) -> Result<Conversation, Vec<Violation>> {
    parse_conversation(&values.iter().collect::<Vec<_>>(), cap, list_name)
}

/// Parses one block on its own (no id uniqueness, no char cap).
pub fn parse_block<N: Node>(node: &N, index: usize, list_name: &str) -> Result<Block, Vec<Violation>> {
    read_block(node, index, list_name, false).map(|(block, _)| block)
}

/// Reads the block again recording where each text piece lives, cuts its text to `max_block_chars`
/// code points (what its reasoning leaves), and rewrites those places in a copy of its message.
fn cut_block<N: Node>(
    node: &N,
    index: usize,
    list_name: &str,
    max_block_chars: usize,
) -> Result<(Block, CharCut), Vec<Violation>> {
    let (mut block, places) = read_block(node, index, list_name, true)?;
    let mut message = node
        .to_json()
        .map_err(|description| vec![Violation { index, field: format!("{list_name}[{index}]"), description }])?;
    let original = block.clone();
    cut_pieces(&mut block.pieces, max_block_chars);
    for ((pointer, new), old) in places.pieces.iter().zip(&block.pieces).zip(&original.pieces) {
        if new != old {
            if let Some(slot) = message.pointer_mut(pointer) {
                *slot = Value::String(new.clone());
            }
        }
    }
    Ok((block, CharCut { index, original, message }))
}

/// How to rewrite a block (`rewrite_block`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rewrite<'a> {
    /// The first text piece becomes this, later pieces empty (a block without text stays as is).
    pub text: Option<&'a str>,
    /// Calls whose arguments are emptied (`"{}"` where they are JSON text, `{}` where an object).
    pub clear_calls: &'a [&'a str],
    /// Its reasoning parts and fields are removed (a Responses reasoning item's are not: the item
    /// is its reasoning).
    pub clear_reasoning: bool,
}

/// The message of block `node` rewritten as `how` says: a tool result cleared in place, or old
/// reasoning left out, in whatever shape the block came. Reasoning is never edited, only removed.
pub fn rewrite_block<N: Node>(node: &N, index: usize, list_name: &str, how: Rewrite) -> Result<Value, Vec<Violation>> {
    let Rewrite { text, clear_calls, clear_reasoning } = how;
    let (_, places) = read_block(node, index, list_name, true)?;
    let mut message = node
        .to_json()
        .map_err(|description| vec![Violation { index, field: format!("{list_name}[{index}]"), description }])?;
    if let Some(text) = text {
        for (k, pointer) in places.pieces.iter().enumerate() {
            if let Some(slot) = message.pointer_mut(pointer) {
                *slot = Value::String(if k == 0 { text.to_owned() } else { String::new() });
            }
        }
    }
    for (call, pointer) in &places.arguments {
        if clear_calls.contains(&call.as_str()) {
            if let Some(slot) = message.pointer_mut(pointer) {
                *slot =
                    if slot.is_string() { Value::String("{}".to_owned()) } else { Value::Object(Default::default()) };
            }
        }
    }
    if clear_reasoning {
        // Latest first, so removing a part leaves the indices of earlier ones as they were.
        for pointer in places.reasoning.iter().rev() {
            remove_at(&mut message, pointer);
        }
    }
    Ok(message)
}

/// Removes the array element or object entry JSON pointer `pointer` names, if present.
fn remove_at(message: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    let key = last.replace("~1", "/").replace("~0", "~");
    match message.pointer_mut(parent) {
        Some(Value::Array(items)) => {
            if let Some(i) = key.parse::<usize>().ok().filter(|&i| i < items.len()) {
                items.remove(i);
            }
        }
        Some(Value::Object(entries)) => {
            entries.shift_remove(&key);
        }
        _ => {}
    }
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

/// Binds each named entry of object `obj` to a local `Option` in one pass over its entries
/// (a `match` on the key, not a scan of a key list); null counts as missing.
/// Binds each named field of an object (None when absent or null), in one pass over its entries;
/// `, ids: KEYS` also binds `ids`, an array of the values of the keys in `KEYS` (in its order).
macro_rules! read_fields {
    ($obj:expr, { $($name:ident: $key:literal),* $(,)? } $(, $ids:ident: $keys:expr)?) => {
        $(let mut $name = None;)*
        $(let mut $ids: [Option<_>; $keys.len()] = Default::default();)?
        $obj.for_each_entry(&mut |key, value| {
            if !value.is_null() {
                match key {
                    $($key => $name = Some(value),)*
                    _ => {
                        $(if let Some(at) = $keys.iter().position(|k| *k == key) {
                            $ids[at] = Some(value);
                        })?
                    }
                }
            }
        });
    };
}
pub(crate) use read_fields;

/// The size in the header of an image part's inline data (`crate::image_header`): a base64
/// `data:` URL in `image_url` (a string, or an object's `url`: OpenAI Chat and Responses, and the
/// typed API's images) or in `image` (Vercel AI SDK), or an Anthropic `source` of type `base64`
/// (its `data`) or with a `url`. None for an image given by any other URL or by a file id, and
/// for fields of other shapes (an image's source is never an error: it only prices the image).
fn inline_image_size<N: Node>(image_url: Option<N>, image: Option<N>, source: Option<N>) -> Option<(u64, u64)> {
    fn string_size<N: Node>(node: &N) -> Option<(u64, u64)> {
        match node.shape() {
            Shape::Str(url) => image_header::data_url_size(url),
            _ => None,
        }
    }
    fn url_size<N: Node>(node: &N) -> Option<(u64, u64)> {
        if !matches!(node.shape(), Shape::Object) {
            return string_size(node);
        }
        read_fields!(node, { url: "url" });
        url.as_ref().and_then(string_size)
    }
    if let Some(size) = image_url.as_ref().or(image.as_ref()).and_then(url_size) {
        return Some(size);
    }
    let source = source?;
    if !matches!(source.shape(), Shape::Object) {
        return None;
    }
    read_fields!(source, { source_type: "type", data: "data", url: "url" });
    match (source_type.as_ref().map(|t| t.shape()), data.as_ref().map(|d| d.shape())) {
        (Some(Shape::Str("base64")), Some(Shape::Str(data))) => image_header::base64_size(data.as_bytes()),
        _ => url.as_ref().and_then(string_size),
    }
}

/// The id a block that failed to parse would have had: given (a non-empty string) or `#<index>`.
fn readable_id<N: Node>(node: &N, index: usize) -> Option<String> {
    if !matches!(node.shape(), Shape::Object) {
        return None;
    }
    read_fields!(node, { id: "id" });
    match id.as_ref().map(|id| id.shape()) {
        None => Some(format!("#{index}")),
        Some(Shape::Str(id)) if !id.is_empty() => Some(id.to_owned()),
        Some(_) => None,
    }
}

fn read_block<N: Node>(
    node: &N,
    index: usize,
    list_name: &str,
    record_places: bool,
) -> Result<(Block, Places), Vec<Violation>> {
    let at = Path::Block(list_name, index);
    let shape = node.shape();
    if !matches!(shape, Shape::Object) {
        return Err(vec![Violation {
            index,
            field: at.field(),
            description: format!("must be an object, got {}", shape.type_name()),
        }]);
    }
    let mut r = Reader { index, violations: Vec::new(), places: record_places.then(Places::default) };
    let block = r.block(node, &at);
    if r.violations.is_empty() {
        Ok((block, r.places.unwrap_or_default()))
    } else {
        Err(r.violations)
    }
}

struct Reader {
    index: usize,
    violations: Vec<Violation>,
    /// Where the text pieces and call arguments are, when a rewrite needs them.
    places: Option<Places>,
}

/// JSON pointers inside a block: of its text pieces in piece order, of each call's arguments, and
/// of the reasoning a rewrite may remove (parts and fields, in reading order).
#[derive(Default)]
struct Places {
    pieces: Vec<String>,
    arguments: Vec<(String, String)>,
    reasoning: Vec<String>,
}

/// What a block's `meta` says besides the calls it answers.
#[derive(Default)]
struct Meta {
    manual_excluded: bool,
    reasoning_tokens: Option<u64>,
}

/// What reading content-like fields yields.
#[derive(Default)]
struct Parts {
    pieces: Strings,
    calls: Vec<ToolCall>,
    result_ids: Strings,
    images: Vec<Image>,
    reasoning: Vec<Reasoning>,
}

impl Reader {
    fn violation(&mut self, at: &Path, description: impl Into<String>) {
        self.violations.push(Violation { index: self.index, field: at.field(), description: description.into() });
    }

    fn wrong_type<N: Node>(&mut self, at: &Path, expected: &str, node: &N) {
        self.violation(at, format!("must be {expected}, got {}", node.shape().type_name()));
    }

    /// A block from its object, in stages: who (id, role, kind), what it says (content, reasoning,
    /// calls), the calls it answers, its flags, its meta.
    fn block<N: Node>(&mut self, obj: &N, at: &Path) -> Block {
        read_fields!(obj, {
            id: "id", item_type: "type", role: "role", kind: "kind", content: "content", summary: "summary",
            output: "output", tool_calls: "tool_calls", pinned: "pinned", mandatory: "mandatory",
            injected: "injected", relevance: "relevance", meta: "meta", name: "name", arguments: "arguments",
            reasoning_content: "reasoning_content", reasoning: "reasoning", encrypted: "encrypted_content",
        }, answered: RESULT_ID_KEYS);
        let id = self.block_id(id.as_ref(), at);
        let item_type = self.string(item_type.as_ref(), &at.key("type"));
        let role = self.role(role.as_ref(), item_type, at);
        let kind = self.kind(kind.as_ref(), at);

        let mut parts = Parts::default();
        self.reasoning_fields(reasoning_content.as_ref(), reasoning.as_ref(), at, &mut parts);
        if item_type == Some("reasoning") {
            self.reasoning_item(summary.as_ref(), content.as_ref(), encrypted.as_ref(), at, &mut parts);
        } else {
            self.content(content.as_ref(), &at.key("content"), &mut parts);
        }
        if item_type == Some("function_call_output") {
            self.content(output.as_ref(), &at.key("output"), &mut parts);
        }
        let issues_call_id = item_type == Some("function_call");
        if issues_call_id {
            let call_id = answered[CALL_ID].take();
            self.issued_call(call_id.as_ref(), name.as_ref(), arguments.as_ref(), at, &mut parts.calls);
        }
        self.tool_calls(tool_calls.as_ref(), &at.key("tool_calls"), &mut parts.calls);

        let pinned = self.flag(pinned.as_ref(), &at.key("pinned"));
        let mandatory = self.flag(mandatory.as_ref(), &at.key("mandatory"));
        let injected = self.flag(injected.as_ref(), &at.key("injected"));
        let relevance = self.relevance(relevance.as_ref(), &at.key("relevance"));
        self.answered_ids(&answered, at, &mut parts.result_ids);
        let meta = self.meta(meta.as_ref(), at, &mut parts.result_ids);

        // A participant name is lenient: only a string is one, and nothing else is an error, so the
        // blocks that parsed before names were counted still parse.
        let participant = match name.as_ref().map(|n| n.shape()) {
            Some(Shape::Str(n)) if !issues_call_id => Some(n.to_owned()),
            _ => None,
        };
        Block {
            id,
            role,
            kind,
            name: participant,
            pieces: parts.pieces,
            calls: parts.calls,
            result_ids: parts.result_ids,
            images: parts.images,
            pinned,
            mandatory,
            injected,
            relevance,
            manual_excluded: meta.manual_excluded,
            reasoning: parts.reasoning,
            reasoning_tokens: meta.reasoning_tokens,
            counted: CountMemo::default(),
        }
    }

    /// A block's id: given (a non-empty string), else `#<index>`.
    fn block_id<N: Node>(&mut self, node: Option<&N>, at: &Path) -> String {
        match self.string(node, &at.key("id")) {
            Some("") => {
                self.violation(&at.key("id"), "must not be empty");
                String::new()
            }
            Some(id) => id.to_owned(),
            None => format!("#{}", self.index),
        }
    }

    /// A block's role: given, else implied by its Responses item `type`.
    fn role<N: Node>(&mut self, node: Option<&N>, item_type: Option<&str>, at: &Path) -> Role {
        let implied = match item_type {
            Some("function_call") | Some("reasoning") => Some(Role::Assistant),
            Some("function_call_output") => Some(Role::Tool),
            _ => None,
        };
        let given = node.is_some();
        match self.string(node, &at.key("role")) {
            Some(name) => Role::parse(name).unwrap_or_else(|| {
                self.violation(
                    &at.key("role"),
                    format!("unknown role {name:?} (expected system, developer, user, assistant or tool)"),
                );
                Role::User
            }),
            // A role of the wrong type is already reported.
            None if given => Role::User,
            None => implied.unwrap_or_else(|| {
                match item_type {
                    None | Some("message") => self.violation(&at.key("role"), "missing"),
                    Some(other) => self.violation(&at.key("type"), format!("unknown item type {other:?} and no role")),
                }
                Role::User
            }),
        }
    }

    /// A block's kind, `message` when not given.
    fn kind<N: Node>(&mut self, node: Option<&N>, at: &Path) -> Kind {
        match self.string(node, &at.key("kind")) {
            Some(name) => Kind::parse(name).unwrap_or_else(|| {
                self.violation(
                    &at.key("kind"),
                    format!(
                        "unknown kind {name:?} (expected system, character, persona, lorebook, memory, summary or message)"
                    ),
                );
                Kind::Message
            }),
            None => Kind::Message,
        }
    }

    /// The call a Responses `function_call` item issues: its `call_id`, `name` and `arguments`.
    fn issued_call<N: Node>(
        &mut self,
        call_id: Option<&N>,
        name: Option<&N>,
        arguments: Option<&N>,
        at: &Path,
        calls: &mut Vec<ToolCall>,
    ) {
        let Some(call_id) = self.required_id(call_id, &at.key("call_id")) else { return };
        let name = self.string(name, &at.key("name")).unwrap_or("").to_owned();
        let arguments_at = at.key("arguments");
        let text = self.arguments(arguments, &arguments_at);
        self.call(calls, ToolCall { id: call_id, name, arguments: text }, arguments.map(|_| &arguments_at));
    }

    /// The ids of the calls a block answers, under each of `RESULT_ID_KEYS` given.
    fn answered_ids<N: Node>(&mut self, ids: &[Option<N>], at: &Path, result_ids: &mut Strings) {
        for (key, value) in RESULT_ID_KEYS.iter().zip(ids) {
            if let Some(value) = value {
                result_ids.extend(self.required_id(Some(value), &at.key(key)));
            }
        }
    }

    /// A block's `meta`: the calls it answers (added to `result_ids`), `manualExcluded`, and the
    /// reasoning tokens a provider reported.
    fn meta<N: Node>(&mut self, meta: Option<&N>, at: &Path, result_ids: &mut Strings) -> Meta {
        let Some(meta) = meta else { return Meta::default() };
        let meta_at = at.key("meta");
        if !matches!(meta.shape(), Shape::Object) {
            self.wrong_type(&meta_at, "an object", meta);
            return Meta::default();
        }
        read_fields!(meta, { manual: "manualExcluded", reported: "reasoning_tokens" }, answered: RESULT_ID_KEYS);
        let read = Meta {
            manual_excluded: self.flag(manual.as_ref(), &meta_at.key("manualExcluded")),
            reasoning_tokens: self.size(reported.as_ref(), &meta_at.key("reasoning_tokens")),
        };
        self.answered_ids(&answered, &meta_at, result_ids);
        read
    }

    /// A chat message's `reasoning_content` and `reasoning` (vLLM's newer name; its replies carry
    /// both, with the same text, which then counts once).
    fn reasoning_fields<N: Node>(&mut self, content: Option<&N>, reasoning: Option<&N>, at: &Path, parts: &mut Parts) {
        if content.is_none() && reasoning.is_none() {
            return; // most blocks
        }
        let mut texts = Strings::new();
        for (node, key) in [(content, "reasoning_content"), (reasoning, "reasoning")] {
            let field_at = at.key(key);
            if let Some(text) = self.string(node, &field_at) {
                if let Some(places) = &mut self.places {
                    places.reasoning.push(field_at.pointer());
                }
                if !texts.iter().any(|t| t == text) {
                    texts.push(text.to_owned());
                }
            }
        }
        if !texts.is_empty() {
            parts.reasoning.push(Reasoning { source: ReasoningSource::Content, texts, opaque: Strings::new() });
        }
    }

    /// A Responses `reasoning` item: its summary and content parts and its `encrypted_content` are
    /// all its reasoning (anything else its parts hold counts as usual).
    fn reasoning_item<N: Node>(
        &mut self,
        summary: Option<&N>,
        content: Option<&N>,
        encrypted: Option<&N>,
        at: &Path,
        parts: &mut Parts,
    ) {
        let mut inner = Parts::default();
        let recorded = self.places.as_ref().map(|p| p.pieces.len());
        self.content(summary, &at.key("summary"), &mut inner);
        self.content(content, &at.key("content"), &mut inner);
        if let (Some(places), Some(recorded)) = (&mut self.places, recorded) {
            places.pieces.truncate(recorded); // reasoning text is not the block's text
        }
        let opaque = self.string(encrypted, &at.key("encrypted_content")).map(str::to_owned);
        parts.calls.extend(inner.calls);
        parts.result_ids.extend(inner.result_ids);
        parts.images.extend(inner.images);
        parts.reasoning.extend(inner.reasoning);
        parts.reasoning.push(Reasoning {
            source: ReasoningSource::ResponsesItem,
            texts: inner.pieces,
            opaque: opaque.into_iter().collect(),
        });
    }

    /// An optional string; a value of another type is a violation.
    fn string<'n, N: Node>(&mut self, node: Option<&'n N>, at: &Path) -> Option<&'n str> {
        let node = node?;
        match node.shape() {
            Shape::Str(s) => Some(s),
            _ => {
                self.wrong_type(at, "a string", node);
                None
            }
        }
    }

    /// A required non-empty id string.
    fn required_id<N: Node>(&mut self, node: Option<&N>, at: &Path) -> Option<String> {
        let Some(node) = node else {
            self.violation(at, "missing");
            return None;
        };
        match node.shape() {
            Shape::Str("") => {
                self.violation(at, "must not be empty");
                None
            }
            Shape::Str(s) => Some(s.to_owned()),
            _ => {
                self.wrong_type(at, "a string", node);
                None
            }
        }
    }

    fn flag<N: Node>(&mut self, node: Option<&N>, at: &Path) -> bool {
        let Some(node) = node else { return false };
        match node.shape() {
            Shape::Bool(b) => b,
            _ => {
                self.wrong_type(at, "a boolean", node);
                false
            }
        }
    }

    /// A caller's relevance, on the scale every relevance source shares: 0 (unrelated) to 1.
    fn relevance<N: Node>(&mut self, node: Option<&N>, at: &Path) -> Option<f64> {
        let node = node?;
        let value = match node.shape() {
            Shape::Int(i) => i as f64,
            Shape::Float(f) => f,
            _ => {
                self.wrong_type(at, "a number", node);
                return None;
            }
        };
        if (0.0..=1.0).contains(&value) {
            return Some(value + 0.0); // -0.0 is 0
        }
        let why = if value.is_finite() { "must be between 0 and 1" } else { "must be finite, between 0 and 1" };
        self.violation(at, format!("{why}, got {value}"));
        None
    }

    /// The JSON text of a value (tool inputs), or a violation naming what cannot be represented.
    fn json_text<N: Node>(&mut self, node: &N, at: &Path) -> String {
        match node.to_json() {
            Ok(value) => to_json_text(&value),
            Err(description) => {
                self.violation(at, description);
                String::new()
            }
        }
    }

    /// Adds a call the block issues, noting where its arguments are (`arguments_at`, when given).
    fn call(&mut self, calls: &mut Vec<ToolCall>, call: ToolCall, arguments_at: Option<&Path>) {
        if let (Some(places), Some(at)) = (&mut self.places, arguments_at) {
            places.arguments.push((call.id.clone(), at.pointer()));
        }
        calls.push(call);
    }

    /// Arguments of a `tool_calls` entry or a function_call item: a string as is, any other
    /// value as its JSON text, missing as empty.
    fn arguments<N: Node>(&mut self, node: Option<&N>, at: &Path) -> String {
        match node {
            None => String::new(),
            Some(node) => match node.shape() {
                Shape::Str(s) => s.to_owned(),
                _ => self.json_text(node, at),
            },
        }
    }

    fn tool_calls<N: Node>(&mut self, node: Option<&N>, at: &Path, calls: &mut Vec<ToolCall>) {
        let Some(node) = node else { return };
        if !matches!(node.shape(), Shape::List) {
            return self.wrong_type(at, "a list", node);
        }
        for (j, call) in node.items().iter().enumerate() {
            let call_at = at.index(j);
            if !matches!(call.shape(), Shape::Object) {
                self.wrong_type(&call_at, "an object", call);
                continue;
            }
            read_fields!(call, { id: "id", function: "function", name: "name", arguments: "arguments" });
            let id = self.required_id(id.as_ref(), &call_at.key("id"));
            let function_at = call_at.key("function");
            let (name, arguments, arguments_at) = match function {
                Some(function) if matches!(function.shape(), Shape::Object) => {
                    read_fields!(function, { name: "name", arguments: "arguments" });
                    let name = self.string(name.as_ref(), &function_at.key("name")).unwrap_or("").to_owned();
                    (name, arguments, function_at.key("arguments"))
                }
                Some(function) => {
                    self.wrong_type(&function_at, "an object", &function);
                    (String::new(), None, function_at)
                }
                None => {
                    let name = self.string(name.as_ref(), &call_at.key("name")).unwrap_or("").to_owned();
                    (name, arguments, call_at.key("arguments"))
                }
            };
            let text = self.arguments(arguments.as_ref(), &arguments_at);
            if let Some(id) = id {
                self.call(calls, ToolCall { id, name, arguments: text }, arguments.map(|_| &arguments_at));
            }
        }
    }

    /// A content-like field: a string (one text piece) or a list of parts.
    fn content<N: Node>(&mut self, node: Option<&N>, at: &Path, parts: &mut Parts) {
        let Some(node) = node else { return };
        match node.shape() {
            Shape::Str(s) => self.piece(parts, s.to_owned(), at),
            Shape::List => {
                for (j, part) in node.items().iter().enumerate() {
                    self.part(part, &at.index(j), parts);
                }
            }
            _ => self.wrong_type(at, "a string or a list of parts", node),
        }
    }

    fn piece(&mut self, parts: &mut Parts, text: String, at: &Path) {
        if let Some(places) = &mut self.places {
            places.pieces.push(at.pointer());
        }
        parts.pieces.push(text);
    }

    /// A required text field of a part, as a text piece.
    fn text<N: Node>(&mut self, node: Option<&N>, at: &Path, parts: &mut Parts) {
        if let Some(text) = self.required_text(node, at) {
            self.piece(parts, text, at);
        }
    }

    /// A required string field.
    fn required_text<N: Node>(&mut self, node: Option<&N>, at: &Path) -> Option<String> {
        let Some(node) = node else {
            self.violation(at, "missing");
            return None;
        };
        match node.shape() {
            Shape::Str(s) => Some(s.to_owned()),
            _ => {
                self.wrong_type(at, "a string", node);
                None
            }
        }
    }

    fn part<N: Node>(&mut self, part: &N, at: &Path, parts: &mut Parts) {
        if !matches!(part.shape(), Shape::Object) {
            return self.wrong_type(at, "an object", part);
        }
        read_fields!(part, {
            part_type: "type", text: "text", refusal: "refusal", thinking: "thinking", id: "id", name: "name",
            input: "input", args: "args", tool_call_id: "toolCallId", tool_name: "toolName",
            tool_use_id: "tool_use_id", content: "content", output: "output", result: "result",
            detail: "detail", image_url: "image_url", width: "width", height: "height", data: "data",
            image: "image", source: "source",
        });
        let type_at = at.key("type");
        let Some(part_type) = part_type else { return self.violation(&type_at, "missing") };
        let Shape::Str(part_type) = part_type.shape() else { return self.wrong_type(&type_at, "a string", &part_type) };
        match part_type {
            "text" | "input_text" | "output_text" | "summary_text" | "reasoning_text" => {
                self.text(text.as_ref(), &at.key("text"), parts)
            }
            "refusal" => self.text(refusal.as_ref(), &at.key("refusal"), parts),
            "thinking" | "redacted_thinking" => {
                let (source, texts, opaque) = if part_type == "thinking" {
                    let text = self.required_text(thinking.as_ref(), &at.key("thinking"));
                    (ReasoningSource::Thinking, text.into_iter().collect(), Strings::new())
                } else {
                    let data = self.string(data.as_ref(), &at.key("data")).map(str::to_owned);
                    (ReasoningSource::RedactedThinking, Strings::new(), data.into_iter().collect())
                };
                if let Some(places) = &mut self.places {
                    places.reasoning.push(at.pointer());
                }
                parts.reasoning.push(Reasoning { source, texts, opaque });
            }
            "image_url" | "image" | "input_image" => {
                let nested_detail = image_url.as_ref().filter(|u| matches!(u.shape(), Shape::Object)).and_then(|url| {
                    read_fields!(url, { detail: "detail" });
                    let url_at = at.key("image_url");
                    self.string(detail.as_ref(), &url_at.key("detail")).map(str::to_owned)
                });
                let detail = self.string(detail.as_ref(), &at.key("detail")).map(str::to_owned).or(nested_detail);
                let width = self.size(width.as_ref(), &at.key("width"));
                let height = self.size(height.as_ref(), &at.key("height"));
                let given = matches!((width, height), (Some(w), Some(h)) if w > 0 && h > 0);
                let header_size = if given { None } else { inline_image_size(image_url, image, source) };
                parts.images.push(Image { detail, width, height, header_size });
            }
            "tool_use" => {
                if let Some(id) = self.required_id(id.as_ref(), &at.key("id")) {
                    let name = self.string(name.as_ref(), &at.key("name")).unwrap_or("").to_owned();
                    let input_at = at.key("input");
                    let arguments = input.as_ref().map(|input| self.json_text(input, &input_at)).unwrap_or_default();
                    self.call(&mut parts.calls, ToolCall { id, name, arguments }, input.map(|_| &input_at));
                }
            }
            "tool-call" => {
                if let Some(id) = self.required_id(tool_call_id.as_ref(), &at.key("toolCallId")) {
                    let name = self.string(tool_name.as_ref(), &at.key("toolName")).unwrap_or("").to_owned();
                    let (input, input_at) = match input {
                        Some(input) => (Some(input), at.key("input")),
                        None => (args, at.key("args")),
                    };
                    let arguments = input.as_ref().map(|input| self.json_text(input, &input_at)).unwrap_or_default();
                    self.call(&mut parts.calls, ToolCall { id, name, arguments }, input.map(|_| &input_at));
                }
            }
            "tool_result" => {
                parts.result_ids.extend(self.required_id(tool_use_id.as_ref(), &at.key("tool_use_id")));
                self.content(content.as_ref(), &at.key("content"), parts);
            }
            "tool-result" => {
                parts.result_ids.extend(self.required_id(tool_call_id.as_ref(), &at.key("toolCallId")));
                let (value, value_at) = match output {
                    Some(output) => (Some(output), at.key("output")),
                    None => (result, at.key("result")),
                };
                if let Some(value) = value {
                    let text = match value.shape() {
                        Shape::Str(s) => s.to_owned(),
                        _ => self.json_text(&value, &value_at),
                    };
                    self.piece(parts, text, &value_at);
                }
            }
            other => self.violation(&type_at, format!("unknown part type {other:?}")),
        }
    }

    fn size<N: Node>(&mut self, node: Option<&N>, at: &Path) -> Option<u64> {
        let node = node?;
        match node.shape() {
            Shape::Int(i) if i >= 0 => Some(i as u64),
            _ => {
                self.wrong_type(at, "a non-negative integer", node);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(values: Value) -> Result<Conversation, Vec<Violation>> {
        parse_values(values.as_array().unwrap(), 50_000, "blocks")
    }

    fn fields(values: Value) -> Vec<String> {
        parse(values).unwrap_err().into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn a_conversation_extended_is_the_conversation_read_whole() {
        let values = json!([
            {"id": "s", "role": "system", "content": "short"},
            {"id": "a", "role": "user", "content": "a long message cut by the cap"},
            {"role": "assistant", "content": "named by its place"},
            {"id": "r", "role": "tool", "tool_call_id": "c1", "content": "a long result cut by the cap"},
            {"id": "e", "role": "user", "content": "end"},
        ]);
        let nodes: Vec<&Value> = values.as_array().unwrap().iter().collect();
        let cap = CharCap { block: 20, tool_result: 12 };
        let whole = parse_conversation(&nodes, cap, "blocks").unwrap();
        assert_eq!(whole.cuts.len(), 2);
        let all_ids = unique_id_hashes(&whole.blocks, None).unwrap();
        for known in 0..=nodes.len() {
            // The known blocks' id hashes: none, theirs, or all five (a superset: a request that
            // took less of the one before).
            let theirs = unique_id_hashes(&whole.blocks[..known], None).unwrap();
            for known_ids in [None, Some(theirs), Some(all_ids.clone())] {
                let (extended, ids) =
                    extend_conversation(whole.prefix(known), known_ids, &nodes[known..], cap, "blocks").unwrap();
                assert_eq!(extended.blocks, whole.blocks, "{known} known");
                assert_eq!(extended.cuts, whole.cuts, "{known} known");
                assert_eq!(ids.0, all_ids.0, "{known} known");
            }
        }
        // A block with a violation, or an id the known blocks have: the known blocks handed back
        // (a whole read says why), whether their id hashes are given or not.
        let bad = [json!({"id": "x", "role": "nobody", "content": "?"}), json!({"id": "a", "role": "user"})];
        for bad in bad {
            for known_ids in [None, Some(all_ids.clone())] {
                let known = extend_conversation(whole.prefix(5), known_ids, &[&bad], cap, "blocks").unwrap_err();
                assert_eq!((known.blocks, known.cuts), (whole.blocks.clone(), whole.cuts.clone()));
            }
            // Past a known prefix, handed back as it was too.
            let known = extend_conversation(whole.prefix(2), None, &[nodes[2], &bad], cap, "blocks").unwrap_err();
            assert_eq!((known.blocks.len(), known.cuts.len()), (2, 1));
        }
    }

    #[test]
    fn id_hashes_find_every_repeated_id() {
        let named = |ids: &[&str]| {
            let values: Vec<Value> = ids.iter().map(|id| json!({"id": id, "role": "user", "content": "x"})).collect();
            parse(Value::Array(values)).unwrap().blocks
        };
        let abcd = named(&["a", "b", "c", "d"]);
        let abca: Vec<Arc<Block>> = [0, 1, 2, 0].iter().map(|&i| Arc::clone(&abcd[i])).collect();
        assert!(unique_id_hashes(&abca, None).is_none());
        let abc = unique_id_hashes(&abcd[..3], None).unwrap();
        assert!(unique_id_hashes(&abca, Some((abc.clone(), 3))).is_none());
        assert_eq!(unique_id_hashes(&abcd, Some((abc, 3))).map(|ids| ids.0.len()), Some(4));
        // A new id whose hash is in already (the known hashes also hold those of a block since
        // dropped: "d" at the same place) is checked against every id, not taken for a repeat.
        let all = unique_id_hashes(&abcd, None).unwrap();
        assert_eq!(unique_id_hashes(&abcd, Some((all, 3))).map(|ids| ids.0.len()), Some(4));
        // More hashes than twice the blocks (many dropped since) are not carried on: rebuilt.
        let many = unique_id_hashes(&named(&["v", "w", "x", "y", "z", "a", "b", "c"]), None).unwrap();
        assert_eq!(unique_id_hashes(&abcd[..3], Some((many, 3))).map(|ids| ids.0.len()), Some(3));
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
        assert_eq!(conv.blocks[0].result_ids.as_slice(), ["a", "b", "c", "d", "e", "f"]);
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
        assert_eq!((b[2].role, b[2].reasoning[0].texts[0].as_str()), (Role::Assistant, "think"));
        assert!(b[2].pieces.is_empty() && b[2].is_reasoning_item());
    }

    /// The providers' published shapes: an OpenAI reasoning item with encrypted content, Anthropic
    /// thinking and redacted thinking beside a tool_use, DeepSeek's reasoning_content, and vLLM's
    /// reply carrying both reasoning fields; reasoning is never a text piece.
    #[test]
    fn reasoning_in_every_shape() {
        let conv = parse(json!([
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
             "encrypted_content": "gAAAAB"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Let me check.", "signature": "EqQB"},
                {"type": "redacted_thinking", "data": "EmwKAhgB"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "assistant", "content": "", "reasoning_content": "The user wants the time.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
            {"role": "assistant", "content": "9.8", "reasoning": "compare", "reasoning_content": "compare",
             "meta": {"reasoning_tokens": 120}}
        ]))
        .unwrap();
        let b = &conv.blocks;
        let sources: Vec<Vec<ReasoningSource>> =
            b.iter().map(|b| b.reasoning.iter().map(|r| r.source).collect()).collect();
        assert_eq!(
            sources,
            [
                vec![ReasoningSource::ResponsesItem],
                vec![ReasoningSource::Thinking, ReasoningSource::RedactedThinking],
                vec![ReasoningSource::Content],
                vec![ReasoningSource::Content]
            ]
        );
        assert_eq!(b[0].reasoning[0].opaque.as_slice(), ["gAAAAB"]);
        assert_eq!(b[1].pieces.as_slice(), ["Checking."]);
        assert_eq!(b[1].reasoning[1].opaque.as_slice(), ["EmwKAhgB"]);
        assert_eq!(b[3].reasoning[0].texts.as_slice(), ["compare"], "the same text in both fields counts once");
        assert_eq!((b[3].reasoning_tokens, b[2].reasoning_tokens), (Some(120), None));
        assert_eq!(
            fields(json!([
                {"role": "assistant", "reasoning_content": 5},
                {"role": "assistant", "content": [{"type": "thinking"}, {"type": "redacted_thinking", "data": 1}]},
                {"type": "reasoning", "encrypted_content": []},
                {"role": "assistant", "meta": {"reasoning_tokens": -1}}
            ])),
            [
                "blocks[0].reasoning_content",
                "blocks[1].content[0].thinking",
                "blocks[1].content[1].data",
                "blocks[2].encrypted_content",
                "blocks[3].meta.reasoning_tokens"
            ]
        );
    }

    #[test]
    fn char_cap_never_cuts_reasoning() {
        let thinking = "t".repeat(100);
        let values = json!([
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thinking, "signature": "s"},
                {"type": "text", "text": "x".repeat(100)}
            ]},
            {"role": "assistant", "reasoning_content": "r".repeat(190), "content": "y"}
        ]);
        let conv = parse_values(values.as_array().unwrap(), 150, "blocks").unwrap();
        // The text gets what the thinking leaves: 150 - 100 - 11 characters and the suffix.
        assert_eq!(conv.blocks[0].reasoning[0].texts[0], thinking);
        assert_eq!(conv.blocks[0].pieces[0], format!("{}{TRUNCATED_SUFFIX}", "x".repeat(39)));
        assert_eq!(conv.cuts[0].message["content"][0]["thinking"], Value::String(thinking.clone()));
        // Reasoning alone over the cap: not cut, left for the plan to drop whole.
        assert_eq!(conv.over_cap, [OverCap { index: 1, reasoning_chars: 190, cap: 150 }]);
        assert_eq!(conv.blocks[1].pieces[0], "y");
        assert_eq!(conv.cuts.len(), 1);
    }

    #[test]
    fn clearing_reasoning_removes_parts_and_fields_and_nothing_else() {
        let how = Rewrite { clear_reasoning: true, ..Rewrite::default() };
        let anthropic = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "a", "signature": "s1"},
            {"type": "text", "text": "Checking."},
            {"type": "redacted_thinking", "data": "d"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}
        ]});
        let cleared = rewrite_block(&&anthropic, 0, "blocks", how).unwrap();
        assert_eq!(
            cleared["content"],
            json!([{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "t", "name": "f", "input": {}}])
        );
        let chat = json!({"role": "assistant", "reasoning_content": "r", "reasoning": "r", "content": "ok"});
        assert_eq!(rewrite_block(&&chat, 0, "blocks", how).unwrap(), json!({"role": "assistant", "content": "ok"}));
        // A reasoning item is its reasoning: nothing of it is removed.
        let item = json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]});
        assert_eq!(rewrite_block(&&item, 0, "blocks", how).unwrap(), item);
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
        assert_eq!(b[1].result_ids.as_slice(), ["t1", "t2"]);
        assert_eq!(b[1].pieces.as_slice(), ["ok", r#"{"done": true}"#]);
        assert_eq!(b[1].images.len(), 1);
    }

    #[test]
    fn an_image_sent_inline_without_a_size_has_its_header_size() {
        // A PNG signature and IHDR chunk, 123 x 321, in base64.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAHsAAAFBCAYAAAA";
        let url = format!("data:image/png;base64,{png}");
        let conv = parse(json!([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url, "detail": "high"}},    // OpenAI Chat
            {"type": "image_url", "image_url": url},                               // a bare URL
            {"type": "input_image", "image_url": url},                             // OpenAI Responses
            {"type": "image", "image": url, "mimeType": "image/png"},              // Vercel AI SDK
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
            {"type": "image", "source": {"type": "url", "url": url}},              // Anthropic
            {"type": "image_url", "image_url": {"url": url}, "width": 512},        // half a size
            {"type": "image_url", "image_url": {"url": url}, "width": 0, "height": 0},
            // Given a size, the header is not read.
            {"type": "image_url", "image_url": {"url": url}, "width": 10, "height": 20},
            // Of unknown size.
            {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
            {"type": "input_image", "file_id": "file-1"},
            {"type": "image", "source": {"type": "base64", "data": "bm90IGFuIGltYWdl"}},
            {"type": "image", "source": "data"},
            {"type": "image_url", "image_url": {"url": 7}}
        ]}]))
        .unwrap();
        let sizes: Vec<_> = conv.blocks[0].images.iter().map(|i| i.header_size).collect();
        let header = Some((123, 321));
        assert_eq!(
            sizes,
            [header, header, header, header, header, header, header, header, None, None, None, None, None, None]
        );
        assert_eq!(conv.blocks[0].images[0].detail.as_deref(), Some("high"));
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
            [
                "blocks[0].role",
                "blocks[1].content[0].type",
                "blocks[1].pinned",
                "blocks[3].id",
                "blocks[3].relevance",
                "blocks[4]"
            ]
        );
        assert_eq!(fields(json!([{"id": "x", "role": "user"}, {"id": "x", "role": "user"}])), ["blocks[1].id"]);
        assert_eq!(fields(json!([{"id": "#1", "role": "user"}, {"role": "user"}])), ["blocks[1].id"]);
        assert_eq!(fields(json!([{"type": "web_search_call"}])), ["blocks[0].type"]);
        let relevance = json!([{"role": "user", "relevance": 1.5}, {"role": "user", "relevance": -1}]);
        assert_eq!(fields(relevance), ["blocks[0].relevance", "blocks[1].relevance"]);
        let edges = json!([{"role": "user", "relevance": 0}, {"role": "user", "relevance": 1.0}]);
        assert!(parse_values(edges.as_array().unwrap(), 64, "blocks").is_ok());
    }

    #[test]
    fn char_cap_cuts_on_code_points_and_rewrites_the_message() {
        let text: String = "日本🙂".repeat(40);
        let values = json!([{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": text}, {"type": "text", "text": "tail"}]}]);
        let conv = parse_values(values.as_array().unwrap(), 64, "blocks").unwrap();
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

    #[test]
    fn tool_result_cap_cuts_only_blocks_that_answer_a_call() {
        let long = "x".repeat(200);
        let values = json!([
            {"id": "u", "role": "user", "content": long},
            {"id": "a", "role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
            {"id": "t", "role": "tool", "tool_call_id": "c1", "content": long},
            {"id": "r", "type": "function_call_output", "call_id": "c2", "output": long},
            {"id": "p", "role": "user", "content": [{"type": "tool_result", "tool_use_id": "c3", "content": long}]},
            {"id": "s", "role": "tool", "tool_call_id": "c4", "content": "short"}
        ]);
        let cap = CharCap { block: 150, tool_result: 100 };
        let conv = parse_values(values.as_array().unwrap(), cap, "blocks").unwrap();
        let chars: Vec<usize> = conv.blocks.iter().map(|b| b.char_count()).collect();
        assert_eq!(chars, [150, 0, 100, 100, 100, 5]);
        assert_eq!(conv.cuts.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 2, 3, 4]);
        assert!(conv.blocks[2].pieces[0].ends_with(TRUNCATED_SUFFIX));
        assert_eq!(conv.cuts[2].message["output"], Value::String(conv.blocks[3].pieces[0].clone()));
        // The smaller cap wins: a tool-result cap above the block cap changes nothing.
        let loose = parse_values(values.as_array().unwrap(), CharCap { block: 150, tool_result: 1000 }, "blocks");
        assert!(loose.unwrap().blocks.iter().all(|b| b.char_count() <= 150));
        assert_eq!(CharCap::from(64), CharCap { block: 64, tool_result: 64 });
    }

    #[test]
    fn rewrite_replaces_text_and_clears_arguments_in_every_shape() {
        let rewrite = |value: Value, text: Option<&str>, clear_calls: &[&str]| {
            rewrite_block(&&value, 0, "blocks", Rewrite { text, clear_calls, clear_reasoning: false }).unwrap()
        };
        // OpenAI: a tool message, and the call's string arguments.
        let tool =
            rewrite(json!({"role": "tool", "tool_call_id": "c1", "content": "long output"}), Some("[gone]"), &[]);
        assert_eq!(tool, json!({"role": "tool", "tool_call_id": "c1", "content": "[gone]"}));
        let call = json!({"role": "assistant", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": "{\"q\": 1}"}},
            {"id": "c2", "function": {"name": "g", "arguments": "{\"q\": 2}"}}
        ]});
        let cleared = rewrite(call, None, &["c2"]);
        assert_eq!(cleared["tool_calls"][0]["function"]["arguments"], "{\"q\": 1}");
        assert_eq!(cleared["tool_calls"][1]["function"]["arguments"], "{}");
        // Anthropic: a tool_result part's content (parts) and a tool_use input object.
        let result = rewrite(
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
            ]}]}),
            Some("[gone]"),
            &[],
        );
        assert_eq!(
            result["content"][0]["content"],
            json!([{"type": "text", "text": "[gone]"}, {"type": "text", "text": ""}])
        );
        let tool_use = rewrite(
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": 1}}]}),
            None,
            &["t"],
        );
        assert_eq!(tool_use["content"][0]["input"], json!({}));
        // Responses: a function_call_output's output, a function_call's arguments.
        let output =
            rewrite(json!({"type": "function_call_output", "call_id": "r", "output": "x"}), Some("[gone]"), &[]);
        assert_eq!(output["output"], "[gone]");
        let function_call =
            rewrite(json!({"type": "function_call", "call_id": "r", "name": "f", "arguments": "{}x"}), None, &["r"]);
        assert_eq!(function_call["arguments"], "{}");
        // Vercel AI SDK: a tool-result's JSON output becomes the text.
        let vercel = rewrite(
            json!({"role": "tool", "content": [{"type": "tool-result", "toolCallId": "v", "output": {"rows": [1, 2]}}]}),
            Some("[gone]"),
            &[],
        );
        assert_eq!(vercel["content"][0]["output"], "[gone]");
    }

    #[test]
    fn manual_flag_is_read_from_meta_and_must_be_a_boolean() {
        let conv = parse(json!([{"role": "user", "meta": {"manualExcluded": true}}, {"role": "user"}])).unwrap();
        assert!(conv.blocks[0].manual_excluded && !conv.blocks[1].manual_excluded);
        assert_eq!(
            fields(json!([{"role": "user", "meta": {"manualExcluded": "yes"}}])),
            ["blocks[0].meta.manualExcluded"]
        );
    }
}
