//! The process-wide count cache: text token counts keyed by (profile, content hash), within a
//! memory bound, the entries not used for longest out first. A chat that resends its history
//! recounts only what is new, and a text counted by one request (a shift, a CountTokens) is free
//! for the next.
//!
//! Keys are 128-bit XXH3 hashes of the text (taken once, where the text is read: `text_key`) mixed
//! with the profile's salt, so no text is stored and a text hashed for one profile is looked up
//! under any other without hashing it again; a false hit needs a 128-bit collision. The cache is sharded so parallel counting
//! threads rarely wait on one another. Each shard keeps two generations of plain hash maps
//! instead of an LRU list: a hit costs one probe and writes nothing (an LRU relinks three list
//! nodes per hit, a cache miss each on a large cache); an entry used in the current generation
//! or the one before survives the next turnover, so the bound still drops the least recently
//! used generation first.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed};

const SHARDS: usize = 16;

/// Bytes one entry may cost: a hash table slot of the 16-byte key and 4-byte count (32 bytes
/// aligned, and a control byte), in a table at most 7/8 full that may just have doubled.
pub const ENTRY_BYTES: usize = 80;

/// Default bound: 64 MiB, at least 800,000 cached texts. `CONTEXTSHIFT_COUNT_CACHE_BYTES`
/// overrides it at start; `configure` changes it at run time.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Texts found, and blocks whose whole count was found in their memo.
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub capacity_bytes: usize,
}

impl CacheStats {
    pub fn hit_ratio(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            0.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }
}

pub struct CountCache {
    shards: Vec<Mutex<Shard>>,
    capacity_bytes: AtomicUsize,
    /// Blocks whose count came from their memo (`count::count_blocks`): hits of whole blocks.
    memo_hits: AtomicU64,
}

/// Two generations of entries: lookups try `current`, then `previous` (moving a hit into
/// `current`); when `current` holds `generation` entries it becomes `previous`, and the old
/// `previous` is dropped. At most `2 * generation` entries, the shard's share of the bound.
#[derive(Default)]
struct Shard {
    current: FxHashMap<u128, u32>,
    previous: FxHashMap<u128, u32>,
    generation: usize,
    // Counted under the shard's lock, so the counting threads share no counter.
    hits: u64,
    misses: u64,
}

impl Shard {
    fn with_capacity(capacity_bytes: usize) -> Shard {
        let mut shard = Shard::default();
        shard.resize(capacity_bytes);
        shard
    }

    fn resize(&mut self, capacity_bytes: usize) {
        self.generation = (capacity_bytes / ENTRY_BYTES / SHARDS / 2).max(1);
        if self.current.len() > self.generation || self.previous.len() > self.generation {
            self.previous.clear();
            self.current.clear();
        }
    }

    fn get(&mut self, key: u128) -> Option<u32> {
        if let Some(&count) = self.current.get(&key) {
            return Some(count);
        }
        let count = self.previous.remove(&key)?;
        self.insert(key, count);
        Some(count)
    }

    fn insert(&mut self, key: u128, count: u32) {
        if self.current.len() >= self.generation {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, count);
    }

    /// Stores a text's count after a miss; a count beyond u32 (a text of gigabytes) is not
    /// worth a slot.
    fn store(&mut self, key: u128, tokens: u64) {
        if let Ok(small) = u32::try_from(tokens) {
            self.insert(key, small);
        }
    }

    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    fn clear(&mut self) {
        self.current = FxHashMap::default();
        self.previous = FxHashMap::default();
        (self.hits, self.misses) = (0, 0);
    }
}

/// A text's hash, the same under every profile: taken once where the text is read.
pub type TextKey = u128;

pub fn text_key(text: &str) -> TextKey {
    xxh3_128(text.as_bytes())
}

/// What makes a profile's keys its own: a text's key under it is `text_key ^ salt`.
pub fn salt(cache_id: u64) -> u128 {
    xxh3_128_with_seed(b"contextshift count cache", cache_id)
}

/// The shard a key lives in.
fn shard_of(key: u128) -> usize {
    (key as usize) % SHARDS
}

impl CountCache {
    pub fn new(capacity_bytes: usize) -> Self {
        CountCache {
            // The maps grow as entries arrive; nothing of the bound is allocated up front.
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::with_capacity(capacity_bytes))).collect(),
            capacity_bytes: AtomicUsize::new(capacity_bytes),
            memo_hits: AtomicU64::new(0),
        }
    }

    /// Whether counts are cached (a zero bound turns the cache, and the blocks' memos, off).
    pub fn enabled(&self) -> bool {
        self.capacity_bytes.load(Ordering::Relaxed) > 0
    }

    /// Counts `n` blocks whose count came from their memo among the hits.
    pub fn add_memo_hits(&self, n: usize) {
        if n > 0 {
            self.memo_hits.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The count of `text` (whose `text_key` is `key`) under the profile with `salt`, computing
    /// and storing it on a miss. With a zero capacity the cache is off and every call counts.
    pub fn get_or_count(&self, salt: u128, key: TextKey, text: &str, count: impl FnOnce(&str) -> u64) -> u64 {
        if self.capacity_bytes.load(Ordering::Relaxed) == 0 {
            return count(text);
        }
        let key = key ^ salt;
        let shard = &self.shards[shard_of(key)];
        {
            let mut shard = lock(shard);
            if let Some(hit) = shard.get(key) {
                shard.hits += 1;
                return u64::from(hit);
            }
            shard.misses += 1;
        }
        let tokens = count(text);
        lock(shard).store(key, tokens);
        tokens
    }

    /// Whether the count of a text (whose `text_key` is `key`) under the profile with `salt` is
    /// cached; its entry, the hits and the misses stay as they were.
    pub fn holds(&self, salt: u128, key: TextKey) -> bool {
        let key = key ^ salt;
        let shard = lock(&self.shards[shard_of(key)]);
        shard.current.contains_key(&key) || shard.previous.contains_key(&key)
    }

    /// `get_or_count` for each of `texts` (whose `text_key`s are `keys`), in order, with the same
    /// counts, entries and hit and miss totals. Each shard is locked once and probed for all of
    /// its keys in a row: a probe of a large cache is a memory miss, and probes that follow one
    /// another (with no hashing and no lock's atomic between them) wait on their misses together.
    pub fn get_or_count_many(
        &self,
        salt: u128,
        keys: &[TextKey],
        texts: &[&str],
        count: impl Fn(&str) -> u64,
    ) -> Vec<u64> {
        if self.capacity_bytes.load(Ordering::Relaxed) == 0 {
            return texts.iter().map(|t| count(t)).collect();
        }
        let keys: Vec<u128> = keys.iter().map(|&key| key ^ salt).collect();
        // The text indices grouped by shard (a counting sort): shard s holds by_shard[starts[s]..starts[s + 1]].
        let mut starts = [0usize; SHARDS + 1];
        for &key in &keys {
            starts[shard_of(key) + 1] += 1;
        }
        for s in 0..SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut by_shard = vec![0usize; keys.len()];
        let mut fill = starts;
        for (i, &key) in keys.iter().enumerate() {
            let s = shard_of(key);
            by_shard[fill[s]] = i;
            fill[s] += 1;
        }
        let mut tokens = vec![0u64; texts.len()];
        let mut missed = Vec::new();
        for (s, shard) in self.shards.iter().enumerate() {
            let indices = &by_shard[starts[s]..starts[s + 1]];
            if indices.is_empty() {
                continue;
            }
            let mut shard = lock(shard);
            let before = missed.len();
            for &i in indices {
                match shard.get(keys[i]) {
                    Some(hit) => tokens[i] = u64::from(hit),
                    None => missed.push(i),
                }
            }
            shard.hits += (indices.len() - (missed.len() - before)) as u64;
        }
        // Counted outside the locks, as `get_or_count` does; a text missed twice is counted once
        // and its second lookup is a hit, as it would be one after the other.
        let mut counted: FxHashMap<u128, u64> = FxHashMap::default();
        for i in missed {
            let key = keys[i];
            let shard = &self.shards[shard_of(key)];
            if let Some(&known) = counted.get(&key) {
                tokens[i] = known;
                lock(shard).hits += 1;
                continue;
            }
            let found = count(texts[i]);
            counted.insert(key, found);
            tokens[i] = found;
            let mut shard = lock(shard);
            shard.misses += 1;
            shard.store(key, found);
        }
        tokens
    }

    /// Sets the memory bound (dropping every entry if the shards hold more than it allows).
    /// Zero turns the cache off.
    pub fn configure(&self, capacity_bytes: usize) {
        self.capacity_bytes.store(capacity_bytes, Ordering::Relaxed);
        for shard in &self.shards {
            let mut shard = lock(shard);
            shard.resize(capacity_bytes);
            if capacity_bytes == 0 {
                let (hits, misses) = (shard.hits, shard.misses);
                shard.clear();
                (shard.hits, shard.misses) = (hits, misses);
            }
        }
    }

    /// Drops every entry and zeroes the counters.
    pub fn clear(&self) {
        for shard in &self.shards {
            lock(shard).clear();
        }
        self.memo_hits.store(0, Ordering::Relaxed);
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats {
            capacity_bytes: self.capacity_bytes.load(Ordering::Relaxed),
            hits: self.memo_hits.load(Ordering::Relaxed),
            ..CacheStats::default()
        };
        for shard in &self.shards {
            let shard = lock(shard);
            stats.hits += shard.hits;
            stats.misses += shard.misses;
            stats.entries += shard.len();
        }
        stats
    }
}

/// A poisoned shard only means a counting thread panicked mid-`put`; the map itself is intact.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The cache every profile of this process shares.
pub fn global() -> &'static CountCache {
    static CACHE: OnceLock<CountCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        CountCache::new(crate::block_cache::bound_from_env("CONTEXTSHIFT_COUNT_CACHE_BYTES", DEFAULT_CAPACITY_BYTES))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn hits_skip_the_count_and_profiles_do_not_share_entries() {
        let cache = CountCache::new(1 << 20);
        let calls = Cell::new(0);
        let count = |t: &str| {
            calls.set(calls.get() + 1);
            t.len() as u64
        };
        let hello = text_key("hello");
        assert_eq!(cache.get_or_count(salt(1), hello, "hello", count), 5);
        assert_eq!(cache.get_or_count(salt(1), hello, "hello", count), 5);
        assert_eq!(cache.get_or_count(salt(2), hello, "hello", count), 5);
        assert_eq!(calls.get(), 2);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (1, 2, 2));
        assert!((stats.hit_ratio() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn many_at_once_give_what_one_at_a_time_give() {
        let texts: Vec<String> = (0..500).map(|i| format!("text {}", i % 170)).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let one = CountCache::new(1 << 20);
        let many = CountCache::new(1 << 20);
        for round in 0..2 {
            // The first round misses (and repeats texts within the batch), the second hits.
            let expected: Vec<u64> =
                texts.iter().map(|t| one.get_or_count(salt(3), text_key(t), t, |t| t.len() as u64)).collect();
            let calls = Cell::new(0);
            let keys: Vec<TextKey> = texts.iter().map(|t| text_key(t)).collect();
            let got = many.get_or_count_many(salt(3), &keys, &texts, |t| {
                calls.set(calls.get() + 1);
                t.len() as u64
            });
            assert_eq!(got, expected, "round {round}");
            assert_eq!(calls.get(), if round == 0 { 170 } else { 0 });
            assert_eq!(many.stats(), one.stats(), "round {round}");
        }
        many.configure(0);
        let abc = text_key("abc");
        assert_eq!(many.get_or_count_many(salt(3), &[abc, abc], &["abc", "abc"], |t| t.len() as u64), vec![3, 3]);
        assert_eq!(many.stats().entries, 0, "a zero bound stores nothing");
    }

    #[test]
    fn the_memory_bound_holds_and_drops_what_was_not_used() {
        let cache = CountCache::new(SHARDS * ENTRY_BYTES * 2); // two entries per shard
        for i in 0..1000 {
            let text = i.to_string();
            cache.get_or_count(salt(7), text_key(&text), &text, |t| t.len() as u64);
        }
        assert!(cache.stats().entries <= SHARDS * 2);
        // A text in use survives any number of others passing through its shard.
        let big = CountCache::new(SHARDS * ENTRY_BYTES * 8);
        let calls = Cell::new(0);
        for i in 0..2000 {
            big.get_or_count(salt(7), text_key("kept in use"), "kept in use", |_| {
                calls.set(calls.get() + 1);
                1
            });
            let text = i.to_string();
            big.get_or_count(salt(7), text_key(&text), &text, |t| t.len() as u64);
        }
        assert_eq!(calls.get(), 1);
        assert!(big.stats().entries <= SHARDS * 8);
        cache.configure(0);
        assert_eq!(cache.stats().entries, 0);
        let calls = Cell::new(0);
        for _ in 0..3 {
            cache.get_or_count(salt(7), text_key("x"), "x", |_| {
                calls.set(calls.get() + 1);
                1
            });
        }
        assert_eq!(calls.get(), 3, "a zero bound turns the cache off");
        cache.clear();
        assert_eq!(cache.stats(), CacheStats { capacity_bytes: 0, ..CacheStats::default() });
    }
}
