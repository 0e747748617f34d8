//! Readers of `blocks_json` side by side, in one run: contextshift's own (a strict single-pass
//! reader onto a tape, with each block's span), the same tape written by serde_json's lexer, and
//! the parsers the reader could be built on instead, and the block cache's scan and its blocks
//! found (the cache filled by the warm-up call: the same request again). Each reads the same
//! documents: the shipped examples/support-chat.json, its blocks repeated with fresh ids to about
//! 48 KiB (the gRPC benchmark's size) and to 10k blocks.
//!
//! `cargo run --release -p contextshift-benches --bin json-readers -- [--quick] [--json PATH] [--only NAME]`
//! (part of `make benchmark`). Prints microseconds per document (median of samples) and MB/s.

mod serde_tape;

use contextshift_core::block_cache::{parse_json_blocks_cached, BlockCache, SharedText};
use contextshift_core::json_doc::{parse_json_blocks, read_blocks};
use contextshift_core::json_spans::object_spans;
use serde_json::value::RawValue;
use serde_json::Value;
use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const EXAMPLE: &str = include_str!("../../../examples/support-chat.json");

/// The example's blocks repeated until `blocks` blocks, ids made unique.
fn document(blocks: usize) -> String {
    let example: Vec<Value> = serde_json::from_str(EXAMPLE).expect("the example is a JSON array");
    let repeated: Vec<Value> = (0..blocks)
        .map(|i| {
            let mut block = example[i % example.len()].clone();
            block["id"] = Value::String(format!("b{i}"));
            block
        })
        .collect();
    serde_json::to_string(&repeated).expect("values serialize")
}

/// Median seconds per call of `f`, over samples of at least `sample` each.
fn median_seconds(f: &mut dyn FnMut(), samples: usize, sample: Duration) -> f64 {
    f(); // warm up
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let (start, mut calls) = (Instant::now(), 0u32);
            while calls == 0 || start.elapsed() < sample {
                f();
                calls += 1;
            }
            start.elapsed().as_secs_f64() / f64::from(calls)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

type Contender = (&'static str, fn(&str));

const CONTENDERS: &[Contender] = &[
    ("contextshift: its own reader onto a tape, with spans", |text| {
        black_box(read_blocks(text).expect("valid"));
    }),
    ("serde_json onto the same tape, with spans (serde_tape.rs)", |text| {
        black_box(serde_tape::read(text).expect("valid"));
    }),
    ("serde_json: Vec<&RawValue> (spans only)", |text| {
        black_box(serde_json::from_str::<Vec<&RawValue>>(text).expect("valid"));
    }),
    ("serde_json: Vec<Value>", |text| {
        black_box(serde_json::from_str::<Vec<Value>>(text).expect("valid"));
    }),
    ("sonic-rs: Value", |text| {
        black_box(sonic_rs::from_str::<sonic_rs::Value>(text).expect("valid"));
    }),
    ("sonic-rs: each element's span (to_array_iter)", |text| {
        for element in sonic_rs::to_array_iter(text) {
            black_box(element.expect("valid").as_raw_str());
        }
    }),
    ("sonic-rs: each element's span, then its Value", |text| {
        for element in sonic_rs::to_array_iter(text) {
            let element = element.expect("valid");
            black_box(sonic_rs::from_str::<sonic_rs::Value>(element.as_raw_str()).expect("valid"));
        }
    }),
    ("simd-json: BorrowedValue (on a copy: it parses in place)", |text| {
        let mut bytes = text.as_bytes().to_vec();
        black_box(simd_json::to_borrowed_value(&mut bytes).expect("valid"));
    }),
    ("contextshift: each block's span by structure (json_spans)", |text| {
        black_box(object_spans(text).expect("an array of objects"));
    }),
    ("contextshift: blocks (parse_json_blocks)", |text| {
        black_box(parse_json_blocks(text, 50_000, "blocks_json").expect("valid"));
    }),
    ("contextshift: blocks, none found: read and stored (a new cache)", |text| {
        let cache = BlockCache::new(1 << 30);
        black_box(parse_json_blocks_cached(&shared(text), 50_000, "blocks_json", &cache).expect("valid"));
    }),
    ("contextshift: blocks, the same request again (a recent one's bytes)", |text| {
        static CACHE: OnceLock<BlockCache> = OnceLock::new();
        let cache = CACHE.get_or_init(|| BlockCache::new(1 << 30)); // the warm-up call fills it
        black_box(parse_json_blocks_cached(&shared(text), 50_000, "blocks_json", cache).expect("valid"));
    }),
];

/// The document as the block cache holds a request's text: shared, copied once (found again by
/// where the caller's text lies, so that no copy nor comparison is timed).
fn shared(text: &str) -> SharedText {
    type Held = Vec<((usize, usize), SharedText)>;
    static DOCUMENTS: OnceLock<std::sync::Mutex<Held>> = OnceLock::new();
    let mut documents = DOCUMENTS.get_or_init(Default::default).lock().expect("not poisoned");
    let place = (text.as_ptr() as usize, text.len());
    if let Some((_, held)) = documents.iter().find(|(at, _)| *at == place) {
        return Arc::clone(held);
    }
    let held: SharedText = Arc::new(text.to_owned());
    documents.push((place, Arc::clone(&held)));
    held
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value_of = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let json_path = value_of("--json");
    // Only the readers whose name contains this (for a profiler).
    let only = value_of("--only").map_or("", String::as_str);
    let (samples, sample) = if quick { (3, Duration::from_millis(20)) } else { (15, Duration::from_millis(100)) };
    let mut rows = Vec::new();
    for blocks in [200, 10_000] {
        let text = document(blocks);
        // Both tape writers read the same elements of the same document.
        let (ours, theirs) = (read_blocks(&text).expect("valid"), serde_tape::read(&text).expect("valid"));
        assert!(ours.spans == theirs.spans && theirs.strings() > 0, "the readers disagree");
        println!("{blocks} blocks, {:.1} KiB", text.len() as f64 / 1024.0);
        println!("  {:<60} {:>12} {:>9}", "reader", "us/document", "MB/s");
        for (name, read) in CONTENDERS.iter().filter(|(name, _)| name.contains(only)) {
            let seconds = median_seconds(&mut || read(&text), samples, sample);
            let mb_per_s = text.len() as f64 / seconds / 1e6;
            println!("  {name:<60} {:>12.1} {mb_per_s:>9.0}", seconds * 1e6);
            rows.push(serde_json::json!({
                "blocks": blocks, "bytes": text.len(), "reader": name, "seconds": seconds, "mb_per_s": mb_per_s,
            }));
        }
    }
    if let Some(path) = json_path {
        std::fs::write(path, serde_json::to_string_pretty(&rows).expect("rows serialize"))
            .expect("writable --json path");
    }
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
