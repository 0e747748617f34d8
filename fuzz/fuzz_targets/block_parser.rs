//! The block parser over JSON text: never a crash, and the same blocks, char-cap cuts and
//! violations whether the text is read onto the reader's tape or into serde_json values (the two
//! `Node` documents the parser reads; the Python route is a third, covered by the property tests),
//! and whether or not it goes through the block cache (one cache for the whole run, so blocks
//! stored from one input are found in others; each input after itself less its last block, as a
//! chat's next turn), with the tool-call groups `Groups::build` gives.
#![no_main]

use contextshift_core::block_cache::{parse_json_blocks_cached, read_json_conversation, BlockCache, SharedText};
use contextshift_core::json_doc::{parse_json_blocks, read_blocks, JsonConversation};
use contextshift_core::json_spans::object_spans;
use contextshift_core::parse::Violation;
use contextshift_core::parse_conversation;
use contextshift_core::Groups;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::sync::Arc;

/// Small, so that the char cap's cut-and-rewrite path runs often.
const MAX_BLOCK_CHARS: usize = 40;

/// Numbers the two documents read differently by design: an integer beyond i64 is a float on
/// the tape (docs/semantics.md §1) and an unsigned integer in serde_json.
fn has_big_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_u64() && !n.is_i64(),
        Value::Array(items) => items.iter().any(has_big_integer),
        Value::Object(map) => map.values().any(has_big_integer),
        _ => false,
    }
}

/// The block cache gives what a whole read gives, stored or not, under a cap that cuts and one
/// that does not.
fn check_cached(text: &str) {
    static CACHE: std::sync::OnceLock<BlockCache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(|| BlockCache::new(1 << 20));
    let shared: SharedText = Arc::new(text.to_owned());
    // The text without its last two elements, then without its last one (when it has enough), as
    // a chat's turns before: each then starts with the bytes of a recent request, and the text
    // itself with those of one that extended another (whose ids' hashes it carries on).
    let spans = object_spans(text).unwrap_or_default();
    let shorter: Vec<String> = [3, 2]
        .iter()
        .filter(|&&less| spans.len() > less)
        .map(|&less| {
            let (start, len) = spans[spans.len() - less];
            format!("{}]", &text[..start + len])
        })
        .collect();
    for cap in [MAX_BLOCK_CHARS, 100_000] {
        for shorter in &shorter {
            let whole = parse_json_blocks(shorter, cap, "blocks_json");
            same(
                &parse_json_blocks_cached(&(Arc::new(shorter.clone()) as SharedText), cap, "blocks_json", cache),
                &whole,
                shorter,
            );
        }
        let whole = parse_json_blocks(text, cap, "blocks_json");
        for _ in 0..2 {
            let cached = read_json_conversation(&shared, cap, "blocks_json", cache);
            if let (Ok((_, groups)), Ok(whole)) = (&cached, &whole) {
                assert_eq!(**groups, Groups::build(&whole.conversation.blocks), "{text:?}");
            }
            same(&cached.map(|(parsed, _)| parsed), &whole, text);
        }
    }
}

fn same(a: &Result<JsonConversation, Vec<Violation>>, b: &Result<JsonConversation, Vec<Violation>>, text: &str) {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.spans, b.spans, "{text:?}");
            assert_eq!(a.conversation.blocks, b.conversation.blocks, "{text:?}");
            assert_eq!(a.conversation.cuts, b.conversation.cuts, "{text:?}");
            assert_eq!(a.conversation.over_cap, b.conversation.over_cap, "{text:?}");
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "{text:?}"),
        _ => panic!("{text:?}: cached {:?}, whole {:?}", a.is_ok(), b.is_ok()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    check_cached(text);
    let from_tape = parse_json_blocks(text, MAX_BLOCK_CHARS, "blocks_json");
    if let Ok(parsed) = &from_tape {
        let conversation = &parsed.conversation;
        assert_eq!(conversation.blocks.len(), parsed.spans.len());
        for (i, block) in conversation.blocks.iter().enumerate() {
            // Reasoning is never cut: a block whose reasoning alone leaves no room is not cut at
            // all, and the plan leaves it out whole.
            if conversation.over_cap.iter().any(|o| o.index == i) {
                assert!(block.reasoning_chars() + 11 > MAX_BLOCK_CHARS);
                continue;
            }
            assert!(block.char_count() <= MAX_BLOCK_CHARS, "the char cap let {} through", block.char_count());
        }
    }
    // serde_json values collapse repeated keys, which the tape route refuses.
    let Ok(document) = read_blocks(text) else { return };
    let Ok(values) = serde_json::from_str::<Vec<Value>>(text) else { return };
    if !document.repeated.is_empty() || values.iter().any(has_big_integer) {
        return;
    }
    let nodes: Vec<&Value> = values.iter().collect();
    let from_values = parse_conversation(&nodes, MAX_BLOCK_CHARS, "blocks");
    match (from_tape, from_values) {
        (Ok(tape), Ok(values)) => {
            assert_eq!(tape.conversation.blocks, values.blocks, "{text:?}");
            assert_eq!(tape.conversation.cuts, values.cuts, "{text:?}");
            assert_eq!(tape.conversation.over_cap, values.over_cap, "{text:?}");
        }
        (Err(tape), Err(values)) => assert_eq!(tape, values, "{text:?}"),
        (tape, values) => panic!("{text:?}: tape {tape:?}, values {values:?}"),
    }
});
