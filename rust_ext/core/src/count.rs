//! Block and text token counts, in parallel once a batch holds enough text to pay for it.

use crate::block::{Block, MemoSlot};
use crate::cache;
use crate::json_text::to_json_text;
use crate::profile::{Profile, ToolRule};
use crate::tools::Tool;
use rayon::prelude::*;

/// A block's tokens in two parts: everything but its reasoning, and its reasoning, which the
/// provider's rule may leave out of the prompt (`reasoning::Retention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCount {
    pub base: u64,
    pub reasoning: u64,
}

impl BlockCount {
    /// The block's tokens, with its reasoning when the prompt counts it.
    pub fn total(self, reasoning_counted: bool) -> u64 {
        self.base + if reasoning_counted { self.reasoning } else { 0 }
    }
}

/// docs/design.md §4: framing + text pieces + participant name + tool calls (their framing, names and
/// arguments) + images, each piece counted on its own; apart, its reasoning: the tokens the
/// provider reported for it, else its text and encrypted payloads counted as text, plus the
/// profile's reasoning framing.
pub fn block_count(profile: &Profile, block: &Block) -> BlockCount {
    block_count_with(profile, block, |text| profile.text_tokens(text))
}

/// `block_count(..).total(reasoning_counted)`.
pub fn block_tokens(profile: &Profile, block: &Block, reasoning_counted: bool) -> u64 {
    block_count(profile, block).total(reasoning_counted)
}

/// `block_count` with each text's tokens from `text_tokens`, called for every non-empty text the
/// count uses, in the same order every time (so one pass can collect the texts, and a second
/// hand back their counts).
fn block_count_with<'b>(
    profile: &Profile,
    block: &'b Block,
    mut text_tokens: impl FnMut(&'b str) -> u64,
) -> BlockCount {
    let mut tokens = |text: &'b str| if text.is_empty() { 0 } else { text_tokens(text) };
    let text: u64 = block.pieces.iter().map(|p| tokens(p)).sum();
    let calls: u64 = block.calls.iter().map(|c| profile.call_overhead() + tokens(&c.name) + tokens(&c.arguments)).sum();
    let images: u64 = block.images.iter().map(|i| profile.image_tokens(i)).sum();
    let name = block.name.as_deref().map_or(0, |name| profile.name_tokens_with(name, &mut tokens));
    let base = profile.block_overhead(block.role) + text + name + calls + images;
    if block.reasoning.is_empty() {
        return BlockCount { base, reasoning: 0 };
    }
    let reasoning = block.reasoning_tokens.unwrap_or_else(|| {
        block.reasoning.iter().flat_map(|r| r.texts.iter().chain(&r.opaque)).map(|t| tokens(t)).sum()
    });
    BlockCount { base, reasoning: reasoning + profile.reasoning_rule().overhead }
}

/// Blocks counted together: their texts looked up in the count cache at once (see
/// `Profile::texts_tokens`), then each block's count assembled from them.
fn block_counts_batched(profile: &Profile, blocks: &[&Block]) -> Vec<BlockCount> {
    let mut texts = Vec::new();
    for block in blocks {
        block_count_with(profile, block, |text| {
            texts.push(text);
            0
        });
    }
    let mut counts = profile.texts_tokens(&texts).into_iter();
    blocks
        .iter()
        .map(|block| block_count_with(profile, block, |_| counts.next().expect("one count per text collected")))
        .collect()
}

/// Blocks per cache lookup batch: enough for the probes to overlap, few enough for their keys to
/// stay in the L1 cache.
const LOOKUP_BATCH: usize = 256;

/// Tokens the tool definitions sent with a prompt take, by the profile's rule (`ToolRule`).
pub fn tools_tokens(profile: &Profile, tools: &[Tool]) -> u64 {
    // Counted only by the rules that use it (the OpenAI formula reads the functions' fields).
    let json_text = || tools.iter().map(|tool| profile.text_tokens(&tool.json)).sum::<u64>();
    match profile.tool_rule() {
        ToolRule::JsonText => json_text(),
        ToolRule::AnthropicToolUse { system_prompt } if !tools.is_empty() => system_prompt + json_text(),
        ToolRule::AnthropicToolUse { .. } => 0,
        ToolRule::OpenAiFunctions { func_init } => openai_functions(profile, tools, func_init),
    }
}

/// The cookbook's `num_tokens_for_tools` (see `ToolRule::OpenAiFunctions`) over the functions;
/// built-in tools (web search, ...) count as their JSON text. Beyond the formula, which reads only
/// a property's type, description and enum, each other keyword of a property schema (`items`,
/// `properties`, `anyOf`, `default`, ...) adds the tokens of its name and JSON text.
fn openai_functions(profile: &Profile, tools: &[Tool], func_init: u64) -> u64 {
    const PROP_INIT: i64 = 3;
    const PROP_KEY: i64 = 3;
    const ENUM_INIT: i64 = -3;
    const ENUM_ITEM: i64 = 3;
    const FUNC_END: i64 = 12;
    let tokens = |text: &str| profile.text_tokens(text) as i64;
    let text_of = |value: &serde_json::Value| value.as_str().map_or_else(|| to_json_text(value), str::to_owned);
    let no_period = |text: &str| text.strip_suffix('.').unwrap_or(text).to_owned();
    let mut total = 0i64;
    let mut functions = false;
    for tool in tools {
        if !tool.function {
            total += tokens(&tool.json);
            continue;
        }
        functions = true;
        total += func_init as i64 + tokens(&format!("{}:{}", tool.name, no_period(&tool.description)));
        if !tool.properties.is_empty() {
            total += PROP_INIT;
        }
        for (key, schema) in &tool.properties {
            total += PROP_KEY;
            let kind = schema.get("type").map(text_of).unwrap_or_default();
            let description = schema.get("description").map(text_of).unwrap_or_default();
            if let Some(items) = schema.get("enum").and_then(|e| e.as_array()) {
                total += ENUM_INIT + items.iter().map(|item| ENUM_ITEM + tokens(&text_of(item))).sum::<i64>();
            }
            total += tokens(&format!("{key}:{kind}:{}", no_period(&description)));
            let others = schema.as_object().into_iter().flatten();
            for (keyword, value) in others.filter(|(k, _)| !matches!(k.as_str(), "type" | "description" | "enum")) {
                total += tokens(keyword) + tokens(&to_json_text(value));
            }
        }
    }
    if functions {
        total += FUNC_END;
    }
    total.max(0) as u64
}

/// Maps `count` over `items`, across the thread pool when their total size (by `bytes`) is worth
/// the hand-off for this profile, on the calling thread otherwise.
pub fn batch<T: Sync, R: Send>(
    profile: &Profile,
    items: &[T],
    bytes: impl Fn(&T) -> usize,
    count: impl Fn(&T) -> R + Sync + Send,
) -> Vec<R> {
    let threshold = profile.parallel_min_bytes();
    // Stop summing as soon as the threshold is reached: the sum itself is a pass over the batch.
    let mut total = 0;
    let parallel = items.len() > 1
        && items.iter().any(|item| {
            total += bytes(item);
            total >= threshold
        });
    if parallel {
        items.par_iter().map(count).collect()
    } else {
        items.iter().map(count).collect()
    }
}

/// Tokens of each block, in order. Takes references so a caller can count any selection. While
/// the count cache is on, a block counted before under this profile (one found in the block cache)
/// takes its count from its memo, and a block counted now leaves one: under any profile, as even
/// the heuristic's count of a block's text costs more than reading its memo (in a slot of its
/// own, so that a server counting with both keeps both).
pub fn count_blocks(profile: &Profile, blocks: &[&Block]) -> Vec<BlockCount> {
    let cached = profile.uses_cache();
    let count = |blocks: &[&Block]| {
        if cached {
            count_blocks_cached(profile, blocks)
        } else {
            batch(profile, blocks, |b| b.text_bytes(), |b| block_count(profile, b))
        }
    };
    if !cache::global().enabled() {
        return count(blocks);
    }
    let (salt, slot) = (profile.salt(), if cached { MemoSlot::CountCached } else { MemoSlot::Uncached });
    let mut counts: Vec<Option<BlockCount>> = blocks
        .iter()
        .map(|b| b.counted.get(slot, salt).map(|(base, reasoning)| BlockCount { base, reasoning }))
        .collect();
    let missing: Vec<&Block> = blocks.iter().zip(&counts).filter(|(_, c)| c.is_none()).map(|(b, _)| *b).collect();
    if cached {
        // The count cache's stats count what it spared; a profile without the cache never had it.
        cache::global().add_memo_hits(blocks.len() - missing.len());
    }
    if !missing.is_empty() {
        let mut fresh = count(&missing).into_iter();
        for (block, count) in blocks.iter().zip(&mut counts).filter(|(_, c)| c.is_none()) {
            let found = fresh.next().expect("one count per block missing");
            block.counted.set(slot, salt, found.base, found.reasoning);
            *count = Some(found);
        }
    }
    counts.into_iter().map(|c| c.expect("every block counted")).collect()
}

/// Blocks looked at by `mostly_uncounted`, spread over the list.
const SAMPLED: usize = 16;

/// Whether `count_blocks` under `profile` will count most of `blocks` with its tokenizer (their
/// texts not in the count cache), judged on a few of them: the call is then the tokenizer's work,
/// and reading its blocks once more costs a small part of it. False for a profile whose counts
/// are not cached (a count costs about what a read does) and with the count cache off.
pub fn mostly_uncounted<B: std::ops::Deref<Target = Block>>(profile: &Profile, blocks: &[B]) -> bool {
    if !profile.uses_cache() || !cache::global().enabled() || blocks.is_empty() {
        return false;
    }
    let step = blocks.len().div_ceil(SAMPLED);
    let sampled = blocks.iter().step_by(step);
    let uncounted = sampled
        .clone()
        .filter(|block| {
            let mut held = true;
            block_count_with(profile, block, |text| {
                held &= cache::global().holds(profile.salt(), cache::text_key(text));
                0
            });
            !held
        })
        .count();
    2 * uncounted > sampled.count()
}

/// `count_blocks` through the count cache, text by text.
fn count_blocks_cached(profile: &Profile, blocks: &[&Block]) -> Vec<BlockCount> {
    // Fewer blocks make smaller batches, so a few large blocks counted cold still spread over
    // the pool (sizing batches by their text instead reads every block once more: slower).
    let per_batch = (blocks.len() / (4 * rayon::current_num_threads())).clamp(1, LOOKUP_BATCH);
    let chunks: Vec<&[&Block]> = blocks.chunks(per_batch).collect();
    let bytes = |chunk: &&[&Block]| chunk.iter().map(|b| b.text_bytes()).sum();
    let counted = |chunk: &&[&Block]| block_counts_batched(profile, chunk);
    batch(profile, &chunks, bytes, counted).concat()
}

/// Text tokens of each text, in order, counted afresh (the count cache is neither read nor
/// filled): on the calling thread, or as a batch (across the pool once it holds enough text). What
/// a throughput measurement needs (`contextshift bench-profiles`).
pub fn count_texts_fresh(profile: &Profile, texts: &[&str], as_batch: bool) -> Vec<u64> {
    if as_batch {
        batch(profile, texts, |t| t.len(), |t| profile.text_tokens_fresh(t))
    } else {
        texts.iter().map(|t| profile.text_tokens_fresh(t)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Image, Kind, Role, Strings, ToolCall};
    use crate::profile::profile_by_name;

    fn block(role: Role, pieces: &[&str]) -> Block {
        Block {
            id: "b".to_owned(),
            role,
            kind: Kind::Message,
            name: None,
            pieces: pieces.iter().map(|p| (*p).to_owned()).collect(),
            calls: Vec::new(),
            result_ids: Strings::new(),
            images: Vec::new(),
            pinned: false,
            mandatory: false,
            injected: false,
            relevance: None,
            manual_excluded: false,
            reasoning: Vec::new(),
            reasoning_tokens: None,
            counted: Default::default(),
        }
    }

    #[test]
    fn heuristic_block_is_the_documented_sum() {
        let h = profile_by_name("heuristic").unwrap();
        let mut b = block(Role::Assistant, &["abcd", "日本語"]);
        b.calls.push(ToolCall { id: "c".to_owned(), name: "search".to_owned(), arguments: "{}".to_owned() });
        b.images.push(Image::default());
        b.name = Some("ignored by the heuristic".to_owned());
        assert_eq!(block_tokens(&h, &b, true), 4 + 1 + 2 + 2 + 1 + 765);
    }

    #[test]
    fn openai_block_counts_name_and_role_framing() {
        let p = profile_by_name("o200k_base").unwrap();
        let mut b = block(Role::User, &["Hello world"]);
        assert_eq!(block_tokens(&p, &b, true), 4 + 2);
        b.name = Some("alice".to_owned());
        assert_eq!(block_tokens(&p, &b, true), 4 + 2 + 1 + p.text_tokens("alice"));
    }

    /// The worked example of the OpenAI cookbook "How to count tokens with tiktoken", section 7
    /// "Counting tokens for chat completions with tool calls" (github.com/openai/openai-cookbook,
    /// examples/How_to_count_tokens_with_tiktoken.ipynb): the API counted 101 prompt tokens for
    /// gpt-4o and gpt-4o-mini (o200k_base), 105 for gpt-3.5-turbo and gpt-4 (cl100k_base).
    #[test]
    fn openai_cookbook_tools_example() {
        let tools = serde_json::json!([{
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "description": "Get the current weather in a given location",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                        "unit": {
                            "type": "string",
                            "description": "The unit of temperature to return",
                            "enum": ["celsius", "fahrenheit"]
                        }
                    },
                    "required": ["location"]
                }
            }
        }]);
        let tools = crate::tools::parse_tools(&tools.as_array().unwrap().iter().collect::<Vec<_>>(), "tools").unwrap();
        let messages = [
            block(Role::System, &["You are a helpful assistant that can answer to questions about the weather."]),
            block(Role::User, &["What's the weather like in San Francisco?"]),
        ];
        for (profile, api_count) in [("o200k_base", 101), ("cl100k_base", 105)] {
            let p = profile_by_name(profile).unwrap();
            let prompt: u64 = messages.iter().map(|b| block_tokens(&p, b, true)).sum::<u64>() + p.prompt_overhead();
            assert_eq!(prompt + tools_tokens(&p, &tools), api_count, "{profile}");
        }
    }

    #[test]
    fn tool_rules_by_profile() {
        let tools = serde_json::json!([
            {"name": "get", "description": "Gets.", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
            {"type": "web_search"}
        ]);
        let tools = crate::tools::parse_tools(&tools.as_array().unwrap().iter().collect::<Vec<_>>(), "tools").unwrap();
        let h = profile_by_name("heuristic").unwrap();
        let json_text: u64 = tools.iter().map(|t| h.text_tokens(&t.json)).sum();
        assert_eq!(tools_tokens(&h, &tools), json_text);
        assert_eq!(tools_tokens(&profile_by_name("anthropic").unwrap(), &tools), 346 + json_text);
        assert_eq!(tools_tokens(&profile_by_name("anthropic").unwrap(), &[]), 0);
        let o = profile_by_name("o200k_base").unwrap();
        // get: 7 + "get:Gets" + 3 + (3 + "q:string:"), web_search: its JSON text, then 12.
        let expected =
            7 + o.text_tokens("get:Gets") + 3 + 3 + o.text_tokens("q:string:") + o.text_tokens(&tools[1].json) + 12;
        assert_eq!(tools_tokens(&o, &tools), expected);
        assert_eq!(tools_tokens(&o, &[]), 0);
    }

    #[test]
    fn reasoning_counts_apart_by_what_is_known() {
        let values = serde_json::json!([
            {"role": "assistant", "reasoning_content": "abcd", "content": "x"},
            {"type": "reasoning", "summary": [], "encrypted_content": "abcdefgh"},
            {"role": "assistant", "reasoning_content": "abcd", "meta": {"reasoning_tokens": 500}}
        ]);
        let blocks = crate::parse::parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        let refs: Vec<&Block> = blocks.iter().map(|b| &**b).collect();
        let h = profile_by_name("heuristic").unwrap();
        let heuristic = [(5, 1), (4, 2), (4, 500)].map(|(base, reasoning)| BlockCount { base, reasoning });
        assert_eq!(count_blocks(&h, &refs), heuristic);
        assert_eq!(heuristic[0].total(false), 5);
        // Qwen's template wraps counted reasoning in <think> tags: 5 tokens more.
        let q = profile_by_name("qwen").unwrap();
        let qwen = count_blocks(&q, &refs);
        assert_eq!(qwen[2].reasoning, 505);
        assert_eq!(qwen[0].reasoning, q.text_tokens("abcd") + 5);
    }

    #[test]
    fn a_block_keeps_a_count_of_an_exact_profile_and_of_the_heuristic() {
        let values = serde_json::json!([{"role": "user", "content": "the quick brown fox, again and again"}]);
        let blocks = crate::parse::parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        let block: &Block = &blocks[0];
        let (h, o, c) = ["heuristic", "o200k_base", "cl100k_base"].map(|name| profile_by_name(name).unwrap()).into();
        let fresh = |p: &Profile| block_count(p, block);
        for _ in 0..2 {
            for p in [&h, &o, &c] {
                assert_eq!(count_blocks(p, &[block]), [fresh(p)]);
            }
        }
        for (p, slot) in [(&h, MemoSlot::Uncached), (&o, MemoSlot::CountCached)] {
            assert_eq!(block.counted.get(slot, p.salt()), Some((fresh(p).base, fresh(p).reasoning)));
        }
        // One count per slot: the second exact profile is counted through the count cache.
        assert_eq!(block.counted.get(MemoSlot::CountCached, c.salt()), None);
    }

    #[test]
    fn blocks_are_mostly_uncounted_until_their_texts_are_counted() {
        // Texts of this test alone: the count cache is the process's, shared by every test.
        let texts: Vec<String> = (0..40).map(|i| format!("mostly_uncounted block {i} of a test")).collect();
        let owned: Vec<Block> = texts.iter().map(|t| block(Role::User, &[t.as_str()])).collect();
        let blocks: Vec<&Block> = owned.iter().collect();
        let (o, h) = (profile_by_name("o200k_base").unwrap(), profile_by_name("heuristic").unwrap());
        assert!(mostly_uncounted(&o, &blocks));
        assert!(!mostly_uncounted(&h, &blocks), "the heuristic's counts are not cached: never");
        count_blocks(&o, &blocks[..30]);
        assert!(!mostly_uncounted(&o, &blocks), "three in four counted");
        assert!(!mostly_uncounted(&o, &[] as &[&Block]));
    }

    #[test]
    fn tool_calls_carry_the_openai_call_framing_and_the_heuristic_none() {
        let mut b = block(Role::Assistant, &[]);
        b.calls.push(ToolCall { id: "c".to_owned(), name: "get".to_owned(), arguments: "{}".to_owned() });
        let o = profile_by_name("o200k_base").unwrap();
        assert_eq!(block_tokens(&o, &b, true), 4 + 3 + o.text_tokens("get") + o.text_tokens("{}"));
        assert_eq!(block_tokens(&profile_by_name("heuristic").unwrap(), &b, true), 4 + 1 + 1);
    }

    #[test]
    fn blocks_counted_together_match_each_counted_alone() {
        // Names, tool calls, empty and repeated texts, over several lookup batches, serial (a few
        // blocks) and across the pool; cold, then from the cache.
        let p = profile_by_name("o200k_base").unwrap();
        let blocks: Vec<Block> = (0..3 * LOOKUP_BATCH + 7)
            .map(|i| {
                let text = format!("turn {}: {}", i % 40, "ß".repeat(i % 5));
                let mut b = block(Role::Assistant, &[&text, "", "same text"]);
                if i % 3 == 0 {
                    b.name = Some(format!("user{}", i % 4));
                }
                if i % 4 == 0 {
                    b.calls.push(ToolCall {
                        id: format!("c{i}"),
                        name: "search".into(),
                        arguments: format!("{{\"q\":{i}}}"),
                    });
                }
                b
            })
            .collect();
        let big = "a long message, ".repeat(4000);
        let blocks: Vec<Block> = blocks.into_iter().chain((0..4).map(|_| block(Role::User, &[&big]))).collect();
        let refs: Vec<&Block> = blocks.iter().collect();
        for _ in 0..2 {
            let alone: Vec<BlockCount> = refs.iter().map(|b| block_count(&p, b)).collect();
            assert_eq!(count_blocks(&p, &refs), alone);
            assert_eq!(count_blocks(&p, &refs[..5]), alone[..5]);
        }
    }

    #[test]
    fn parallel_and_serial_counts_agree() {
        let p = profile_by_name("cl100k_base").unwrap();
        let texts: Vec<String> =
            (0..2000).map(|i| format!("message {i}: the quick brown fox {}", "ü".repeat(i % 7))).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let batched = count_texts_fresh(&p, &refs, true);
        let serial: Vec<u64> = refs.iter().map(|t| p.text_tokens(t)).collect();
        assert_eq!(batched, serial);
        assert_eq!(count_texts_fresh(&p, &refs, false), serial);
    }
}
