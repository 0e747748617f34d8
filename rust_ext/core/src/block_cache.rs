//! Blocks already read from JSON, looked up by the text they were read from. A chat backend or an
//! agent loop sends its whole history every turn: a block whose JSON text was read before is not
//! read again, and its parsed form is shared (`Arc`) by every conversation that holds it.
//!
//! A request's blocks are found by a structural scan (`json_doc::object_spans`), each span hashed
//! (XXH3-128: a false hit needs a 128-bit collision) and looked up under one lock. Only text the
//! reader has read is ever a key, and only a block read without a violation whose parsed form does
//! not depend on its place is stored (a block without an id is named by its index), so a
//! conversation read from the cache is the one `parse_json_blocks` gives. Anything the cache
//! path does not handle (the char cap cuts a block, a duplicate id, a violation, text that is not
//! an array of objects, a request mostly new) is read whole by `parse_json_blocks`, which also
//! fills the cache. Two generations within a memory bound, as the count cache keeps them.

use crate::block::Block;
use crate::json_doc::{parse_json_blocks, read_blocks, JsonConversation, TapeNode};
use crate::json_spans::{first_object_spans, object_spans, Span};
use crate::parse::{fits_cap, parse_block, CharCap, Conversation, Violation};
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
    capacity_bytes: AtomicUsize,
}

/// Lookups try `current`, then `previous` (moving a hit into `current`); when `current` holds
/// half the bound it becomes `previous` and the old `previous` is dropped.
#[derive(Default)]
struct Generations {
    current: FxHashMap<u128, (Arc<Block>, usize)>,
    previous: FxHashMap<u128, (Arc<Block>, usize)>,
    current_bytes: usize,
    hits: u64,
    misses: u64,
}

impl Generations {
    fn get(&mut self, key: u128, generation_bytes: usize) -> Option<Arc<Block>> {
        if let Some((block, _)) = self.current.get(&key) {
            return Some(Arc::clone(block));
        }
        let (block, bytes) = self.previous.remove(&key)?;
        self.insert(key, Arc::clone(&block), bytes, generation_bytes);
        Some(block)
    }

    fn insert(&mut self, key: u128, block: Arc<Block>, bytes: usize, generation_bytes: usize) {
        if self.current_bytes + bytes > generation_bytes {
            self.previous = std::mem::take(&mut self.current);
            self.current_bytes = 0;
        }
        if bytes <= generation_bytes && self.current.insert(key, (block, bytes)).is_none() {
            self.current_bytes += bytes;
        }
    }
}

impl BlockCache {
    pub fn new(capacity_bytes: usize) -> Self {
        BlockCache { generations: Mutex::default(), capacity_bytes: AtomicUsize::new(capacity_bytes) }
    }

    /// Each key's block, if cached; one lock for all of them.
    fn get_many(&self, keys: &[u128]) -> Vec<Option<Arc<Block>>> {
        let generation_bytes = self.capacity_bytes.load(Ordering::Relaxed) / 2;
        let mut generations = self.lock();
        let found: Vec<Option<Arc<Block>>> = keys.iter().map(|&key| generations.get(key, generation_bytes)).collect();
        let hits = found.iter().filter(|b| b.is_some()).count();
        generations.hits += hits as u64;
        generations.misses += (keys.len() - hits) as u64;
        found
    }

    /// Stores blocks read from text of the given lengths.
    fn put_many(&self, entries: impl Iterator<Item = (u128, Arc<Block>, usize)>) {
        let generation_bytes = self.capacity_bytes.load(Ordering::Relaxed) / 2;
        if generation_bytes == 0 {
            return;
        }
        let mut generations = self.lock();
        for (key, block, text_bytes) in entries {
            generations.insert(key, block, text_bytes + ENTRY_OVERHEAD, generation_bytes);
        }
    }

    /// Sets the memory bound, dropping every entry; zero turns the cache off.
    pub fn configure(&self, capacity_bytes: usize) {
        self.capacity_bytes.store(capacity_bytes, Ordering::Relaxed);
        let mut generations = self.lock();
        let (hits, misses) = (generations.hits, generations.misses);
        *generations = Generations { hits, misses, ..Generations::default() };
    }

    /// Drops every entry and zeroes the counters.
    pub fn clear(&self) {
        *self.lock() = Generations::default();
    }

    pub fn stats(&self) -> BlockCacheStats {
        let generations = self.lock();
        BlockCacheStats {
            hits: generations.hits,
            misses: generations.misses,
            entries: generations.current.len() + generations.previous.len(),
            capacity_bytes: self.capacity_bytes.load(Ordering::Relaxed),
        }
    }

    /// A poisoned lock only means a thread panicked between two map operations; each is whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.generations.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
    text: &str,
    cap: impl Into<CharCap>,
    field: &str,
    cache: &BlockCache,
) -> Result<JsonConversation, Vec<Violation>> {
    let cap = cap.into();
    // A request whose blocks cost more than half a generation (their text, twice: the parsed
    // form's overhead is about as much again for chat-sized blocks) would push out what others
    // left and then itself, and be read whole every time with the cost of filling on top.
    if text.len() * 4 > cache.capacity_bytes.load(Ordering::Relaxed) / 2 {
        return parse_json_blocks(text, cap, field);
    }
    // A request whose first blocks are new is read whole, without a scan of its own (the same
    // system prompt opening many chats is why two are probed).
    let probe = first_object_spans(text, PROBED).unwrap_or_default();
    if probe.len() < PROBED || cache.get_many(&keys(text, &probe)).iter().any(Option::is_none) {
        return read_whole(text, cap, field, cache);
    }
    let Some(spans) = object_spans(text) else { return read_whole(text, cap, field, cache) };
    let keys = keys(text, &spans);
    let found = cache.get_many(&keys);
    let new = found.iter().filter(|b| b.is_none()).count();
    if new * MOSTLY_NEW > spans.len() {
        return read_whole(text, cap, field, cache);
    }
    match from_cache(text, &spans, found, cap) {
        Some((conversation, read)) => {
            cache.put_many(read.into_iter().map(|i| (keys[i], Arc::clone(&conversation.blocks[i]), spans[i].1)));
            Ok(JsonConversation { conversation, spans })
        }
        None => read_whole(text, cap, field, cache),
    }
}

/// Blocks probed before a request is scanned.
const PROBED: usize = 2;

/// The key of the text in each span.
fn keys(text: &str, spans: &[Span]) -> Vec<u128> {
    spans.iter().map(|&(start, len)| xxh3_128(&text.as_bytes()[start..start + len])).collect()
}

/// `parse_json_blocks`, and the blocks that may be stored put in `cache`.
fn read_whole(text: &str, cap: CharCap, field: &str, cache: &BlockCache) -> Result<JsonConversation, Vec<Violation>> {
    let parsed = parse_json_blocks(text, cap, field)?;
    let conv = &parsed.conversation;
    let mut changed: FxHashSet<usize> = conv.cuts.iter().map(|c| c.index).collect();
    changed.extend(conv.over_cap.iter().map(|o| o.index));
    let storable: Vec<usize> =
        (0..conv.blocks.len()).filter(|&i| !changed.contains(&i) && !named_by_place(&conv.blocks[i], i)).collect();
    let cost = text.len() + storable.len() * ENTRY_OVERHEAD;
    if cost * 2 > cache.capacity_bytes.load(Ordering::Relaxed) / 2 {
        return Ok(parsed); // many small blocks: as above
    }
    let spans: Vec<Span> = storable.iter().map(|&i| parsed.spans[i]).collect();
    let keys = keys(text, &spans);
    cache.put_many(storable.iter().zip(keys).map(|(&i, key)| (key, Arc::clone(&conv.blocks[i]), parsed.spans[i].1)));
    Ok(parsed)
}

/// The conversation from cached blocks and the new ones read one at a time, with the indices of
/// those read (to store); None where only the whole read gives the right answer: a violation, a
/// block the char cap changes, a duplicate id.
fn from_cache(
    text: &str,
    spans: &[Span],
    found: Vec<Option<Arc<Block>>>,
    cap: CharCap,
) -> Option<(Conversation, Vec<usize>)> {
    let mut blocks = Vec::with_capacity(found.len());
    let mut read = Vec::new();
    for (index, cached) in found.into_iter().enumerate() {
        let block = match cached {
            Some(block) => block,
            None => {
                let (start, len) = spans[index];
                let block = read_one(&text[start..start + len], index)?;
                if !named_by_place(&block, index) {
                    read.push(index);
                }
                block
            }
        };
        if !fits_cap(&block, cap) {
            return None;
        }
        blocks.push(block);
    }
    let mut ids: FxHashSet<&str> = FxHashSet::with_capacity_and_hasher(blocks.len(), Default::default());
    if !blocks.iter().all(|b| ids.insert(b.id.as_str())) {
        return None;
    }
    Some((Conversation { blocks, cuts: Vec::new(), over_cap: Vec::new() }, read))
}

/// One block's JSON text read as the block at `index`; None if anything is wrong with it.
fn read_one(object: &str, index: usize) -> Option<Arc<Block>> {
    let array = format!("[{object}]");
    let document = read_blocks(&array).ok().filter(|d| d.repeated.is_empty() && d.elements.len() == 1)?;
    let node = TapeNode { tape: &document.tape, at: document.elements[0] };
    parse_block(&node, index, "blocks").ok().map(Arc::new)
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
            &parse_json_blocks_cached(&first, 1000, "blocks", &cache).unwrap(),
            &parse_json_blocks(&first, 1000, "blocks").unwrap(),
        );
        assert_eq!(cache.stats().entries, 40);
        // The next turn: two blocks more, the rest hits and is shared, not read again.
        let next = chat(42);
        let cached = parse_json_blocks_cached(&next, 1000, "blocks", &cache).unwrap();
        same(&cached, &parse_json_blocks(&next, 1000, "blocks").unwrap());
        let again = parse_json_blocks_cached(&next, 1000, "blocks", &cache).unwrap();
        assert!(Arc::ptr_eq(&cached.conversation.blocks[3], &again.conversation.blocks[3]));
        let stats = cache.stats();
        // Lookups: the two first blocks probed each time (missed the first), then every block.
        assert_eq!((stats.hits, stats.misses, stats.entries), (2 + 40 + 2 + 42, 2 + 2, 42));
    }

    #[test]
    fn what_depends_on_the_request_is_read_whole() {
        let cache = BlockCache::new(1 << 20);
        let text = chat(8);
        parse_json_blocks_cached(&text, 1000, "blocks", &cache).unwrap();
        // A block without an id is named by its place: never stored, always right.
        let unnamed = r#"[{"role":"user","content":"a"},{"role":"user","content":"a"}]"#;
        for _ in 0..2 {
            let ids: Vec<String> = parse_json_blocks_cached(unnamed, 1000, "blocks", &cache)
                .unwrap()
                .conversation
                .blocks
                .iter()
                .map(|b| b.id.clone())
                .collect();
            assert_eq!(ids, ["#0", "#1"]);
        }
        // Cached blocks under a smaller cap are cut, as a whole read cuts them.
        same(
            &parse_json_blocks_cached(&text, 5, "blocks", &cache).unwrap(),
            &parse_json_blocks(&text, 5, "blocks").unwrap(),
        );
        // A cached block sent twice: the duplicate id is reported as the whole read reports it.
        let twice = text.replacen('[', &format!("[{},", &text[1..text.find('}').unwrap() + 1]), 1);
        assert_eq!(
            parse_json_blocks_cached(&twice, 1000, "blocks", &cache).unwrap_err(),
            parse_json_blocks(&twice, 1000, "blocks").unwrap_err()
        );
        // A new block with a violation, among cached ones.
        let bad = text.replacen("]", r#", {"id":"x","role":"nobody","content":"?"}]"#, 1);
        assert_eq!(
            parse_json_blocks_cached(&bad, 1000, "blocks", &cache).unwrap_err(),
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
                    &parse_json_blocks_cached(text, 1000, "blocks", &cache).unwrap(),
                    &parse_json_blocks(text, 1000, "blocks").unwrap(),
                );
            }
            assert!(cache.stats().entries <= 2 * 20, "{:?}", cache.stats());
        }
        let before = cache.stats();
        parse_json_blocks_cached(&chats[29], 1000, "blocks", &cache).unwrap();
        assert_eq!(cache.stats().hits - before.hits, 2 + 4, "the latest chat is still there");
        // A request too large for the bound is read whole and stores nothing.
        let large = chat(400);
        let entries = cache.stats().entries;
        same(
            &parse_json_blocks_cached(&large, 1000, "blocks", &cache).unwrap(),
            &parse_json_blocks(&large, 1000, "blocks").unwrap(),
        );
        assert_eq!(cache.stats().entries, entries);
        let text = &chats[0];
        cache.configure(0);
        parse_json_blocks_cached(text, 1000, "blocks", &cache).unwrap();
        assert_eq!(cache.stats().entries, 0);
        cache.clear();
        assert_eq!(cache.stats(), BlockCacheStats::default());
    }
}
