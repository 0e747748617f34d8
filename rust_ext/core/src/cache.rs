//! The process-wide count cache: text token counts keyed by (profile, content hash), least
//! recently used out first, within a memory bound. A chat that resends its history recounts only
//! what is new, and a text counted by one request (a shift, a CountTokens) is free for the next.
//!
//! Keys are 128-bit XXH3 hashes of the text seeded with the profile's cache id, so no text is
//! stored; a false hit needs a 128-bit collision. The cache is sharded so parallel counting
//! threads rarely wait on one another.

use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use xxhash_rust::xxh3::xxh3_128_with_seed;

const SHARDS: usize = 16;

/// Bytes one entry costs: the 16-byte key and 4-byte count, plus the LRU list links and hash
/// table slot (measured layout of `lru::LruCache<u128, u32>`, rounded up).
pub const ENTRY_BYTES: usize = 64;

/// Default bound: 64 MiB, about a million cached texts. `CONTEXTSHIFT_COUNT_CACHE_BYTES`
/// overrides it at start; `configure` changes it at run time.
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
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
    shards: Vec<Mutex<LruCache<u128, u32>>>,
    capacity_bytes: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn shard_capacity(capacity_bytes: usize) -> NonZeroUsize {
    NonZeroUsize::new(capacity_bytes / ENTRY_BYTES / SHARDS).unwrap_or(NonZeroUsize::MIN)
}

impl CountCache {
    pub fn new(capacity_bytes: usize) -> Self {
        let per_shard = shard_capacity(capacity_bytes);
        CountCache {
            // Unbounded maps sized by `resize` would allocate the whole bound up front; an LRU
            // with a cap grows as entries arrive.
            shards: (0..SHARDS).map(|_| Mutex::new(LruCache::new(per_shard))).collect(),
            capacity_bytes: AtomicUsize::new(capacity_bytes),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The count of `text` under the profile with `cache_id`, computing and storing it on a miss.
    /// With a zero capacity the cache is off and every call counts.
    pub fn get_or_count(&self, cache_id: u64, text: &str, count: impl FnOnce(&str) -> u64) -> u64 {
        if self.capacity_bytes.load(Ordering::Relaxed) == 0 {
            return count(text);
        }
        let key = xxh3_128_with_seed(text.as_bytes(), cache_id);
        let shard = &self.shards[(key as usize) % SHARDS];
        if let Some(&hit) = lock(shard).get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return u64::from(hit);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let tokens = count(text);
        // A count beyond u32 (a text of gigabytes) is not worth a slot.
        if let Ok(small) = u32::try_from(tokens) {
            lock(shard).put(key, small);
        }
        tokens
    }

    /// Sets the memory bound, evicting least recently used entries if it shrank. Zero turns the
    /// cache off.
    pub fn configure(&self, capacity_bytes: usize) {
        self.capacity_bytes.store(capacity_bytes, Ordering::Relaxed);
        let per_shard = shard_capacity(capacity_bytes);
        for shard in &self.shards {
            let mut shard = lock(shard);
            shard.resize(per_shard);
            if capacity_bytes == 0 {
                shard.clear();
            }
        }
    }

    /// Drops every entry and zeroes the counters.
    pub fn clear(&self) {
        for shard in &self.shards {
            lock(shard).clear();
        }
        self.hits.store(0, Ordering::Relaxed);
        self.misses.store(0, Ordering::Relaxed);
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.shards.iter().map(|s| lock(s).len()).sum(),
            capacity_bytes: self.capacity_bytes.load(Ordering::Relaxed),
        }
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
        let bytes = std::env::var("CONTEXTSHIFT_COUNT_CACHE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_CAPACITY_BYTES);
        CountCache::new(bytes)
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
        assert_eq!(cache.get_or_count(1, "hello", count), 5);
        assert_eq!(cache.get_or_count(1, "hello", count), 5);
        assert_eq!(cache.get_or_count(2, "hello", count), 5);
        assert_eq!(calls.get(), 2);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (1, 2, 2));
        assert!((stats.hit_ratio() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_memory_bound_evicts_least_recently_used() {
        let cache = CountCache::new(SHARDS * ENTRY_BYTES * 2); // two entries per shard
        for i in 0..1000 {
            cache.get_or_count(7, &i.to_string(), |t| t.len() as u64);
        }
        assert!(cache.stats().entries <= SHARDS * 2);
        cache.configure(0);
        assert_eq!(cache.stats().entries, 0);
        let calls = Cell::new(0);
        for _ in 0..3 {
            cache.get_or_count(7, "x", |_| {
                calls.set(calls.get() + 1);
                1
            });
        }
        assert_eq!(calls.get(), 3, "a zero bound turns the cache off");
        cache.clear();
        assert_eq!(cache.stats(), CacheStats { capacity_bytes: 0, ..CacheStats::default() });
    }
}
