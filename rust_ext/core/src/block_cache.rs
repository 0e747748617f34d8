//! Blocks already read from JSON, looked up by the text they were read from. A chat backend or an
//! agent loop sends its whole history every turn: a block whose JSON text was read before is not
//! read again, and its parsed form is shared (`Arc`) by every conversation that holds it.
//!
//! A request's blocks are found by a structural scan (`json_doc::object_spans`), each span hashed
//! (XXH3-128: a false hit needs a 128-bit collision) and looked up under one lock. Only text the
//! reader has read is ever a key, and only a block read without a violation whose parsed form does
//! not depend on its place is stored (a block without an id is named by its index), so a
//! conversation read from the cache is the one `parse_json_blocks` gives. A block over the char
//! cap is stored as read and cut per request, as a whole read cuts it. Anything the cache path
//! does not handle (a duplicate id, a violation, text that is not an array of objects, a request
//! mostly new) is read whole by `parse_json_blocks`, which also fills the cache. Two generations
//! within a memory bound, as the count cache keeps them.
//!
//! The text of recent requests is also held (not copied: the caller's own text, shared), with
//! their spans, blocks and tool-call groups: a request that starts with the bytes of one of them
//! (the same chat's history resent, a turn longer, or a retry) takes the blocks of that common
//! prefix as they are, and only the rest is scanned, hashed, looked up and checked to be UTF-8.
//! Byte equality, no hash, decides that reuse. They take at most a quarter of the bound on top of
//! the generations' (their text and, about as much again, blocks that may outlive a generation).

use crate::block::Block;
use crate::group::Groups;
use crate::json_doc::{parse_json_blocks, read_blocks, utf8_text, JsonConversation, TapeNode};
use crate::json_spans::{first_object_spans, object_spans_after, Span};
use crate::parse::{capped, fits_cap, parse_block, unique_id_hashes, CharCap, Conversation, IdHashes, Violation};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use xxhash_rust::xxh3::xxh3_128;

/// Default bound: 64 MiB of blocks (their JSON text and their parsed form).
/// `CONTEXTSHIFT_BLOCK_CACHE_BYTES` overrides it at start; `configure` changes it at run time.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

/// What an entry costs beyond its JSON text, which bounds its strings from above: the parsed
/// block, the `Arc`'s counts and a hash table slot.
const ENTRY_OVERHEAD: usize = std::mem::size_of::<Block>() + 64;

/// A request with more new blocks than one in this many is read whole: reading the new blocks
/// one at a time costs a document each.
const MOSTLY_NEW: usize = 4;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub capacity_bytes: usize,
}

pub struct BlockCache {
    generations: Mutex<Generations>,
    recent: Mutex<RecentRequests>,
    capacity_bytes: AtomicUsize,
}

/// Text a request was read from, shared with its caller (a 10k-block request is 3 MB) while a
/// later request may reuse what was read from it.
pub type SharedText = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Requests read lately, most recently used last, within a quarter of the bound.
#[derive(Default)]
struct RecentRequests {
    requests: Vec<Arc<Recent>>,
    bytes: usize,
}

/// A request read under `cap`: its text (UTF-8: kept only once read), what was read from it, its
/// tool-call groups, and the keys of its first blocks (to find the requests a new one may share a
/// prefix with).
struct Recent {
    text: SharedText,
    /// Its blocks as read under `cap`: cut, or over it, as a whole read gives them.
    read: JsonConversation,
    groups: Arc<Groups>,
    /// Its ids' hashes, once a request extended another (a request read whole has not made them).
    ids: Option<IdHashes>,
    opening: [u128; PROBED],
    cap: CharCap,
}

impl Recent {
    /// Its text, and as much again for its blocks (as the generations count a block), and what
    /// it holds per block.
    fn bytes(&self) -> usize {
        2 * (*self.text).as_ref().len() + self.read.spans.len() * RECENT_OVERHEAD
    }

    /// Its first `n` blocks, with their spans, cuts and blocks over the cap.
    fn prefix(&self, n: usize) -> JsonConversation {
        JsonConversation { conversation: self.read.conversation.prefix(n), spans: self.read.spans[..n].to_vec() }
    }
}

/// What a recent request holds per block beyond its text: a span, a pointer, its group (five
/// words at most: a block of its own is a group of its own), its id's hash (two words at most).
const RECENT_OVERHEAD: usize =
    std::mem::size_of::<Span>() + std::mem::size_of::<Arc<Block>>() + 7 * std::mem::size_of::<usize>();

/// Recent requests compared byte by byte with a new one that opens as they do, at most.
const COMPARED: usize = 4;

/// Blocks by key, with the bytes each is counted as.
type Generation = FxHashMap<u128, (Arc<Block>, usize)>;

/// Lookups try `current`, then `previous` (moving a hit into `current`); when `current` holds
/// half the bound it becomes `previous` and the old `previous` is dropped.
#[derive(Default)]
struct Generations {
    current: Generation,
    previous: Generation,
    current_bytes: usize,
    hits: u64,
    misses: u64,
}

impl Generations {
    /// The block of `key`, if cached; a generation retired to make room goes to `retired`.
    fn get(&mut self, key: u128, generation_bytes: usize, retired: &mut Vec<Generation>) -> Option<Arc<Block>> {
        if let Some((block, _)) = self.current.get(&key) {
            return Some(Arc::clone(block));
        }
        let (block, bytes) = self.previous.remove(&key)?;
        self.insert(key, Arc::clone(&block), bytes, generation_bytes, retired);
        Some(block)
    }

    /// Stores `block`; the generation it retires goes to `retired`, to be freed by the caller
    /// once the lock is released (its blocks' drop would stall every other lookup).
    fn insert(
        &mut self,
        key: u128,
        block: Arc<Block>,
        bytes: usize,
        generation_bytes: usize,
        retired: &mut Vec<Generation>,
    ) {
        if self.current_bytes + bytes > generation_bytes {
            retired.push(std::mem::replace(&mut self.previous, std::mem::take(&mut self.current)));
            self.current_bytes = 0;
        }
        if bytes <= generation_bytes && self.current.insert(key, (block, bytes)).is_none() {
            self.current_bytes += bytes;
        }
    }
}

impl RecentRequests {
    /// Up to `COMPARED` requests that open with the blocks of `opening` under `cap`, latest first.
    fn opening_with(&self, opening: &[u128; PROBED], cap: CharCap) -> Vec<Arc<Recent>> {
        let same = self.requests.iter().rev().filter(|r| &r.opening == opening && r.cap == cap);
        same.take(COMPARED).map(Arc::clone).collect()
    }

    /// Adds `request` (in place of `replaced`, the request it extends), dropping the least
    /// recently used beyond `bound`; what it drops is returned, to be freed outside the lock.
    fn add(&mut self, request: Arc<Recent>, replaced: Option<&Arc<Recent>>, bound: usize) -> Vec<Arc<Recent>> {
        let mut dropped = Vec::new();
        if let Some(at) = replaced.and_then(|old| self.requests.iter().position(|r| Arc::ptr_eq(r, old))) {
            dropped.push(self.requests.remove(at));
        }
        // What it replaces is out before the bound is checked: a request over half the bound
        // would otherwise push out itself.
        self.bytes -= dropped.iter().map(|r| r.bytes()).sum::<usize>();
        self.bytes += request.bytes();
        self.requests.push(request);
        while self.bytes > bound && !self.requests.is_empty() {
            let oldest = self.requests.remove(0);
            self.bytes -= oldest.bytes();
            dropped.push(oldest);
        }
        dropped
    }

    /// Marks `request` as the most recently used.
    fn touch(&mut self, request: &Arc<Recent>) {
        if let Some(at) = self.requests.iter().position(|r| Arc::ptr_eq(r, request)) {
            let used = self.requests.remove(at);
            self.requests.push(used);
        }
    }
}

impl BlockCache {
    pub fn new(capacity_bytes: usize) -> Self {
        BlockCache {
            generations: Mutex::default(),
            recent: Mutex::default(),
            capacity_bytes: AtomicUsize::new(capacity_bytes),
        }
    }

    /// Counts `n` blocks taken from a recent request as hits: blocks not read again.
    fn count_reused(&self, n: usize) {
        self.lock().hits += n as u64;
    }

    /// Each key's block, if cached; one lock for all of them.
    fn get_many(&self, keys: &[u128]) -> Vec<Option<Arc<Block>>> {
        let generation_bytes = self.capacity_bytes.load(Ordering::Relaxed) / 2;
        let mut retired = Vec::new();
        let mut generations = self.lock();
        let found: Vec<Option<Arc<Block>>> =
            keys.iter().map(|&key| generations.get(key, generation_bytes, &mut retired)).collect();
        let hits = found.iter().filter(|b| b.is_some()).count();
        generations.hits += hits as u64;
        generations.misses += (keys.len() - hits) as u64;
        drop(generations);
        found
    }

    /// Stores blocks read from text of the given lengths.
    fn put_many(&self, entries: impl Iterator<Item = (u128, Arc<Block>, usize)>) {
        let generation_bytes = self.capacity_bytes.load(Ordering::Relaxed) / 2;
        if generation_bytes == 0 {
            return;
        }
        let mut retired = Vec::new();
        let mut generations = self.lock();
        for (key, block, text_bytes) in entries {
            generations.insert(key, block, text_bytes + ENTRY_OVERHEAD, generation_bytes, &mut retired);
        }
        drop(generations);
    }

    /// Keeps `request` for later requests that share a prefix with it (replacing the request it
    /// extends), within a quarter of the bound.
    fn remember(&self, request: Recent, replaced: Option<&Arc<Recent>>) {
        let bound = self.capacity_bytes.load(Ordering::Relaxed) / 4;
        if request.bytes() > bound {
            return;
        }
        let dropped = self.recent().add(Arc::new(request), replaced, bound);
        drop(dropped);
    }

    /// Sets the memory bound, dropping every entry; zero turns the cache off.
    pub fn configure(&self, capacity_bytes: usize) {
        self.capacity_bytes.store(capacity_bytes, Ordering::Relaxed);
        let recent = std::mem::take(&mut *self.recent());
        let mut generations = self.lock();
        let (hits, misses) = (generations.hits, generations.misses);
        let old = std::mem::replace(&mut *generations, Generations { hits, misses, ..Generations::default() });
        drop(generations);
        drop((old, recent));
    }

    /// Drops every entry and zeroes the counters.
    pub fn clear(&self) {
        let recent = std::mem::take(&mut *self.recent());
        let old = std::mem::take(&mut *self.lock());
        drop((old, recent));
    }

    pub fn stats(&self) -> BlockCacheStats {
        let generations = self.lock();
        BlockCacheStats {
            hits: generations.hits,
            misses: generations.misses,
            entries: generations.current.len() + generations.previous.len(),
            capacity_bytes: self.capacity_bytes(),
        }
    }

    /// The memory bound in bytes (0: off), read without the cache's lock.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes.load(Ordering::Relaxed)
    }

    /// A poisoned lock only means a thread panicked between two map operations; each is whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.generations.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// As `lock`: the list changes by whole pushes and removes.
    fn recent(&self) -> std::sync::MutexGuard<'_, RecentRequests> {
        self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The cache every request of this process shares.
pub fn global() -> &'static BlockCache {
    static CACHE: OnceLock<BlockCache> = OnceLock::new();
    CACHE.get_or_init(|| BlockCache::new(bound_from_env("CONTEXTSHIFT_BLOCK_CACHE_BYTES", DEFAULT_CAPACITY_BYTES)))
}

/// A cache's memory bound: the environment variable `name` in bytes, else `default`.
pub(crate) fn bound_from_env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// `parse_json_blocks` through `cache`: the same conversation or the same violations.
pub fn parse_json_blocks_cached(
    shared: &SharedText,
    cap: impl Into<CharCap>,
    field: &str,
    cache: &BlockCache,
) -> Result<JsonConversation, Vec<Violation>> {
    read_json_conversation(shared, cap, field, cache).map(|(parsed, _)| parsed)
}

/// `parse_json_blocks_cached`, and the conversation's tool-call groups (`Groups::build` of its
/// blocks): a recent request's as they are for the same bytes, or extended when the blocks after
/// its own are groups of their own (a chat's next turn).
pub fn read_json_conversation(
    shared: &SharedText,
    cap: impl Into<CharCap>,
    field: &str,
    cache: &BlockCache,
) -> Result<(JsonConversation, Arc<Groups>), Vec<Violation>> {
    let bytes: &[u8] = (**shared).as_ref();
    let cap = cap.into();
    // A request whose blocks cost more than half a generation (their text, twice: the parsed
    // form's overhead is about as much again for chat-sized blocks) would push out what others
    // left and then itself, and be read whole every time with the cost of filling on top.
    if bytes.len() * 4 > cache.capacity_bytes.load(Ordering::Relaxed) / 2 {
        return parse_json_blocks(utf8(bytes, field)?, cap, field).map(with_groups);
    }
    // The first blocks tell which recent requests this one may extend; a request whose first
    // blocks are new is read whole, without a scan of its own (the same system prompt opening
    // many chats is why two are probed).
    let probe = first_object_spans(bytes, PROBED).unwrap_or_default();
    let Ok(opening) = <[u128; PROBED]>::try_from(keys(bytes, &probe)) else {
        return read_whole(shared, utf8(bytes, field)?, cap, field, cache);
    };
    let prior = longest_shared_prefix(bytes, cache.recent().opening_with(&opening, cap));
    // What is known without reading: the blocks of a recent request's prefix (under this cap), or
    // none and the probed blocks found (to go through the cap with the rest).
    let (text, mut known, mut found, mut new_keys) = match &prior {
        Some((request, reused)) => {
            let (start, len) = request.read.spans[*reused - 1];
            if simdutf8::basic::from_utf8(&bytes[start + len..]).is_err() {
                utf8(bytes, field)?; // the violation says where, in the whole text
            }
            // SAFETY: up to the end of the last block taken (a `}`: a char boundary) the bytes are
            // a recent request's, which were UTF-8 before it was kept; the rest is checked above.
            let text = unsafe { std::str::from_utf8_unchecked(bytes) };
            (text, request.prefix(*reused), Vec::new(), Vec::new())
        }
        None => {
            let text = utf8(bytes, field)?;
            let probed = cache.get_many(&opening);
            if probed.iter().any(Option::is_none) {
                return read_whole(shared, text, cap, field, cache);
            }
            (text, JsonConversation { conversation: Conversation::default(), spans: probe }, probed, opening.to_vec())
        }
    };
    let &(last_start, last_len) = known.spans.last().expect("a prefix of at least the probed blocks");
    let end = last_start + last_len;
    if let Some((request, reused)) = &prior {
        if *reused == request.read.spans.len() && bytes[end..] == (*request.text).as_ref()[end..] {
            // The very request again (the same bytes): its reading as it is. (Any other request
            // is kept in place of the one it extends, or beside it.)
            cache.recent().touch(request);
            cache.count_reused(*reused);
            return Ok((known, Arc::clone(&request.groups)));
        }
    }
    let Some(rest) = object_spans_after(text, end) else {
        return read_whole(shared, text, cap, field, cache);
    };
    let rest_keys = keys(bytes, &rest);
    found.extend(cache.get_many(&rest_keys));
    new_keys.extend(rest_keys);
    let new = found.iter().filter(|b| b.is_none()).count();
    if new * MOSTLY_NEW > known.spans.len() + rest.len() {
        return read_whole(shared, text, cap, field, cache);
    }
    let offset = known.conversation.blocks.len();
    known.spans.extend_from_slice(&rest);
    let known_ids = prior.as_ref().and_then(|(request, _)| Some((request.ids.clone()?, offset)));
    let Some((parsed, read, ids)) = from_cache(text, known, known_ids, found, cap) else {
        return read_whole(shared, text, cap, field, cache);
    };
    cache.put_many(read.into_iter().map(|(i, block)| (new_keys[i - offset], block, parsed.spans[i].1)));
    let extended = prior
        .as_ref()
        .filter(|(request, reused)| *reused == request.read.spans.len())
        .and_then(|(request, _)| request.groups.extended(&parsed.conversation.blocks));
    let groups = Arc::new(extended.unwrap_or_else(|| Groups::build(&parsed.conversation.blocks)));
    if let Some((_, reused)) = &prior {
        cache.count_reused(*reused);
    }
    let ids = Some(ids);
    let recent =
        Recent { text: Arc::clone(shared), read: parsed.clone(), groups: Arc::clone(&groups), ids, opening, cap };
    cache.remember(recent, prior.as_ref().map(|(request, _)| request));
    Ok((parsed, groups))
}

fn with_groups(parsed: JsonConversation) -> (JsonConversation, Arc<Groups>) {
    let groups = Arc::new(Groups::build(&parsed.conversation.blocks));
    (parsed, groups)
}

/// `bytes` as text, or the violation on `field` that says where they are not UTF-8.
fn utf8<'a>(bytes: &'a [u8], field: &str) -> Result<&'a str, Vec<Violation>> {
    utf8_text(bytes).map_err(|description| vec![Violation { index: 0, field: field.to_owned(), description }])
}

/// Blocks probed before a request is scanned.
const PROBED: usize = 2;

/// Of `candidates`, the request whose blocks `text` starts with the most of (at least the probed
/// ones), and how many: a block whose whole span (from the start of the text) is the same bytes
/// is the same block at the same place.
fn longest_shared_prefix(text: &[u8], candidates: Vec<Arc<Recent>>) -> Option<(Arc<Recent>, usize)> {
    candidates
        .into_iter()
        .map(|request| {
            let common = common_prefix(text, (*request.text).as_ref());
            let reused = request.read.spans.partition_point(|&(start, len)| start + len <= common);
            (request, reused)
        })
        .filter(|&(_, reused)| reused >= PROBED)
        .max_by_key(|&(_, reused)| reused)
}

/// How many bytes `a` and `b` start with in common, compared a slice at a time (memcmp), in
/// smaller slices once they differ, the last few byte by byte.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let len = a.len().min(b.len());
    let mut at = 0;
    for step in [4096, 64] {
        while at + step <= len && a[at..at + step] == b[at..at + step] {
            at += step;
        }
    }
    at + a[at..len].iter().zip(&b[at..len]).take_while(|(x, y)| x == y).count()
}

/// The key of the text in each span.
fn keys(text: &[u8], spans: &[Span]) -> Vec<u128> {
    spans.iter().map(|&span| key(text, span)).collect()
}

fn key(text: &[u8], (start, len): Span) -> u128 {
    xxh3_128(&text[start..start + len])
}

/// `parse_json_blocks`; the blocks that may be stored put in `cache`, and the request kept as a
/// recent one.
fn read_whole(
    shared: &SharedText,
    text: &str,
    cap: CharCap,
    field: &str,
    cache: &BlockCache,
) -> Result<(JsonConversation, Arc<Groups>), Vec<Violation>> {
    let (parsed, groups) = parse_json_blocks(text, cap, field).map(with_groups)?;
    let conv = &parsed.conversation;
    let mut changed: FxHashSet<usize> = conv.cuts.iter().map(|c| c.index).collect();
    changed.extend(conv.over_cap.iter().map(|o| o.index));
    let storable: Vec<usize> =
        (0..conv.blocks.len()).filter(|&i| !changed.contains(&i) && !named_by_place(&conv.blocks[i], i)).collect();
    let cost = text.len() + storable.len() * ENTRY_OVERHEAD;
    if cost * 2 > cache.capacity_bytes.load(Ordering::Relaxed) / 2 {
        return Ok((parsed, groups)); // many small blocks: as above
    }
    let spans: Vec<Span> = storable.iter().map(|&i| parsed.spans[i]).collect();
    let keys = keys(text.as_bytes(), &spans);
    if conv.blocks.len() >= PROBED {
        let opening = std::array::from_fn(|i| key(text.as_bytes(), parsed.spans[i]));
        let recent = Recent {
            text: Arc::clone(shared),
            read: parsed.clone(),
            groups: Arc::clone(&groups),
            ids: None,
            opening,
            cap,
        };
        cache.remember(recent, None);
    }
    cache.put_many(storable.iter().zip(keys).map(|(&i, key)| (key, Arc::clone(&conv.blocks[i]), parsed.spans[i].1)));
    Ok((parsed, groups))
}

/// The conversation from the `known` blocks (of a recent request under the same cap, or none),
/// then the rest, cached (`found`) or read one at a time, each through the char cap as a whole
/// read takes it, with the blocks read (by index, uncut: to store) and the hashes of all their ids
/// (`known_ids`: those of the known blocks, when the recent request has them); None where only the
/// whole read gives the right answer: a violation, a duplicate id.
fn from_cache(
    text: &str,
    known: JsonConversation,
    known_ids: Option<(IdHashes, usize)>,
    found: Vec<Option<Arc<Block>>>,
    cap: CharCap,
) -> Option<(JsonConversation, Vec<Read>, IdHashes)> {
    let JsonConversation { conversation: Conversation { blocks, mut cuts, mut over_cap }, spans } = known;
    // A copy: the recent request's list stays as it is.
    let mut blocks = Arc::unwrap_or_clone(blocks);
    blocks.reserve(found.len());
    let mut read = Vec::new();
    for cached in found {
        let index = blocks.len();
        let (start, len) = spans[index];
        let object = &text[start..start + len];
        let block = match cached {
            Some(block) => block,
            None => {
                let block = with_node(object, |node| parse_block(node, index, "blocks").ok()).map(Arc::new)?;
                if !named_by_place(&block, index) {
                    read.push((index, Arc::clone(&block)));
                }
                block
            }
        };
        if fits_cap(&block, cap) {
            blocks.push(block);
            continue;
        }
        let capped = with_node(object, |node| capped(node, (*block).clone(), index, "blocks", cap).ok())?;
        blocks.push(capped.push_into(&mut cuts, &mut over_cap));
    }
    let ids = unique_id_hashes(&blocks, known_ids)?;
    let conversation = Conversation { blocks: Arc::new(blocks), cuts, over_cap };
    Some((JsonConversation { conversation, spans }, read, ids))
}

/// A block read from its text, at its index, as read (before any cut).
type Read = (usize, Arc<Block>);

/// `f` of the node of one block's JSON text, read on its own; None if the text is not one block
/// (or has a repeated key).
fn with_node<T>(object: &str, f: impl FnOnce(&TapeNode) -> Option<T>) -> Option<T> {
    let array = format!("[{object}]");
    let document = read_blocks(&array).ok().filter(|d| d.repeated.is_empty() && d.elements.len() == 1)?;
    f(&TapeNode { tape: &document.tape, at: document.elements[0] })
}

/// A block without an id is named `#<index>`: read elsewhere it is another block.
fn named_by_place(block: &Block, index: usize) -> bool {
    block.id.strip_prefix('#').and_then(|n| n.parse::<usize>().ok()) == Some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(n: usize) -> String {
        let blocks: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"id":"m{i}","role":"{}","content":"turn {i}: \"quoted\" {{braces}}"}}"#,
                    ["user", "assistant"][i % 2]
                )
            })
            .collect();
        format!("[{}]", blocks.join(", "))
    }

    fn shared(text: &str) -> SharedText {
        Arc::new(text.to_owned())
    }

    fn same(a: &JsonConversation, b: &JsonConversation) {
        assert_eq!(a.spans, b.spans);
        assert_eq!(a.conversation.blocks, b.conversation.blocks);
        assert_eq!(a.conversation.cuts, b.conversation.cuts);
        assert_eq!(a.conversation.over_cap, b.conversation.over_cap);
    }

    #[test]
    fn a_resent_history_is_read_from_the_cache_and_gives_the_same_conversation() {
        let cache = BlockCache::new(1 << 20);
        let first = chat(40);
        same(
            &parse_json_blocks_cached(&shared(&first), 1000, "blocks", &cache).unwrap(),
            &parse_json_blocks(&first, 1000, "blocks").unwrap(),
        );
        assert_eq!(cache.stats().entries, 40);
        // The next turn: two blocks more, the rest hits and is shared, not read again.
        let next = chat(42);
        let cached = parse_json_blocks_cached(&shared(&next), 1000, "blocks", &cache).unwrap();
        same(&cached, &parse_json_blocks(&next, 1000, "blocks").unwrap());
        let again = parse_json_blocks_cached(&shared(&next), 1000, "blocks", &cache).unwrap();
        assert!(Arc::ptr_eq(&cached.conversation.blocks[3], &again.conversation.blocks[3]));
        let stats = cache.stats();
        // The first read: the two probed blocks missed. Then the 40 blocks of the first request
        // taken as they are (hits), the two new ones missed; then the same request again.
        assert_eq!((stats.hits, stats.misses, stats.entries), (40 + 42, 2 + 2, 42));
    }

    #[test]
    fn a_request_extending_a_recent_one_takes_its_blocks_by_bytes() {
        let cache = BlockCache::new(1 << 20);
        let check = |text: &str| {
            let cached = read_json_conversation(&shared(text), 1000, "blocks", &cache);
            match (&cached, parse_json_blocks(text, 1000, "blocks")) {
                (Ok((cached, groups)), Ok(whole)) => {
                    same(cached, &whole);
                    assert_eq!(**groups, Groups::build(&whole.conversation.blocks));
                }
                (cached, whole) => assert_eq!(cached.as_ref().err(), whole.as_ref().err(), "{text}"),
            }
            cached.map(|(parsed, _)| parsed)
        };
        let first = check(&chat(30)).unwrap();
        // Two chats opening alike (the same system prompt and first turn), then apart.
        let other = chat(30).replace("turn 20:", "other 20:");
        check(&other).unwrap();
        let next = check(&chat(32)).unwrap();
        assert!(Arc::ptr_eq(&first.conversation.blocks[25], &next.conversation.blocks[25]));
        let before = cache.stats();
        // The same bytes again: nothing read, nothing looked up.
        let again = check(&chat(32)).unwrap();
        assert!(Arc::ptr_eq(&next.conversation.blocks[31], &again.conversation.blocks[31]));
        assert_eq!((cache.stats().hits - before.hits, cache.stats().misses), (32, before.misses));
        // A block edited in the middle: the blocks before it are taken, the rest found or read.
        check(&chat(32).replace("turn 17:", "turn seventeen:")).unwrap();
        // After blocks shared byte for byte, what is wrong is what the whole read says.
        let full = chat(32);
        for bad in [
            full.replacen(']', "]]", 1),
            full.replacen(']', " ", 1),
            full.replacen(']', r#",{"id":"m0","role":"user","content":"again"}]"#, 1),
            full.replacen(']', r#",{"id":"x","role":"nobody","content":"?"}]"#, 1),
            full.replacen(']', ",]", 1),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
        // Under another cap the recent request is not taken (its blocks may be cut); under that
        // cap, its next turn takes the cut blocks and their cuts as they are.
        let cut = |text: &str| {
            let cached = parse_json_blocks_cached(&shared(text), 12, "blocks", &cache).unwrap();
            let whole = parse_json_blocks(text, 12, "blocks").unwrap();
            assert!(!whole.conversation.cuts.is_empty());
            same(&cached, &whole);
        };
        cut(&full);
        let before = cache.stats();
        cut(&chat(33));
        assert_eq!(cache.stats().hits - before.hits, 32, "{:?}", cache.stats());
    }

    #[test]
    fn a_recent_request_over_half_its_bound_is_still_taken_by_the_next_turn() {
        // Long blocks, so that their text is most of what they cost.
        let long = |n: usize| chat(n).replace("turn ", &"a long turn ".repeat(60));
        let text = long(40);
        // Recent requests get a quarter of the bound, and this one takes two thirds of that.
        let cache = BlockCache::new(4 * (2 * text.len() + 40 * RECENT_OVERHEAD) * 3 / 2);
        parse_json_blocks_cached(&shared(&text), 1000, "blocks", &cache).unwrap();
        for n in 41..45 {
            let before = cache.stats();
            parse_json_blocks_cached(&shared(&long(n)), 1000, "blocks", &cache).unwrap();
            assert_eq!(cache.stats().hits - before.hits, n as u64 - 1, "turn {n}: {:?}", cache.stats());
            assert_eq!(cache.recent().requests.len(), 1, "turn {n} is held in place of the one before");
        }
    }

    #[test]
    fn common_prefix_at_every_step() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for at in [0, 1, 63, 64, 65, 4095, 4096, 4097, 4160, 9_999] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_eq!(common_prefix(&a, &b), at);
            assert_eq!(common_prefix(&a[..at], &a), at, "a prefix of the other");
        }
        assert_eq!(common_prefix(&a, &a), a.len());
    }

    #[test]
    fn what_depends_on_the_request_is_as_a_whole_read_gives_it() {
        let cache = BlockCache::new(1 << 20);
        let text = chat(8);
        parse_json_blocks_cached(&shared(&text), 1000, "blocks", &cache).unwrap();
        // A block without an id is named by its place: never stored, always right.
        let unnamed = r#"[{"role":"user","content":"a"},{"role":"user","content":"a"}]"#;
        for _ in 0..2 {
            let ids: Vec<String> = parse_json_blocks_cached(&shared(unnamed), 1000, "blocks", &cache)
                .unwrap()
                .conversation
                .blocks
                .iter()
                .map(|b| b.id.clone())
                .collect();
            assert_eq!(ids, ["#0", "#1"]);
        }
        // Cached blocks under a smaller cap are cut, as a whole read cuts them (found, then cut).
        same(
            &parse_json_blocks_cached(&shared(&text), 5, "blocks", &cache).unwrap(),
            &parse_json_blocks(&text, 5, "blocks").unwrap(),
        );
        // A cached block sent twice: the duplicate id is reported as the whole read reports it.
        let twice = text.replacen('[', &format!("[{},", &text[1..text.find('}').unwrap() + 1]), 1);
        assert_eq!(
            parse_json_blocks_cached(&shared(&twice), 1000, "blocks", &cache).unwrap_err(),
            parse_json_blocks(&twice, 1000, "blocks").unwrap_err()
        );
        // A new block with a violation, among cached ones.
        let bad = text.replacen("]", r#", {"id":"x","role":"nobody","content":"?"}]"#, 1);
        assert_eq!(
            parse_json_blocks_cached(&shared(&bad), 1000, "blocks", &cache).unwrap_err(),
            parse_json_blocks(&bad, 1000, "blocks").unwrap_err()
        );
    }

    #[test]
    fn the_bound_holds_and_zero_turns_the_cache_off() {
        // A generation holds about 20 blocks; each chat has 4.
        let cache = BlockCache::new(2 * 20 * (ENTRY_OVERHEAD + 70));
        let chats: Vec<String> = (0..30).map(|c| chat(4).replace("\"id\":\"m", &format!("\"id\":\"c{c}m"))).collect();
        for text in &chats {
            for _ in 0..2 {
                same(
                    &parse_json_blocks_cached(&shared(text), 1000, "blocks", &cache).unwrap(),
                    &parse_json_blocks(text, 1000, "blocks").unwrap(),
                );
            }
            assert!(cache.stats().entries <= 2 * 20, "{:?}", cache.stats());
        }
        let before = cache.stats();
        parse_json_blocks_cached(&shared(&chats[29]), 1000, "blocks", &cache).unwrap();
        assert_eq!(cache.stats().hits - before.hits, 4, "the latest chat is still there");
        // A request too large for the bound is read whole and stores nothing.
        let large = chat(400);
        let entries = cache.stats().entries;
        same(
            &parse_json_blocks_cached(&shared(&large), 1000, "blocks", &cache).unwrap(),
            &parse_json_blocks(&large, 1000, "blocks").unwrap(),
        );
        assert_eq!(cache.stats().entries, entries);
        let text = &chats[0];
        cache.configure(0);
        parse_json_blocks_cached(&shared(text), 1000, "blocks", &cache).unwrap();
        assert_eq!(cache.stats().entries, 0);
        cache.clear();
        assert_eq!(cache.stats(), BlockCacheStats::default());
    }
}
