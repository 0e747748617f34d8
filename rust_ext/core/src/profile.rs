//! Tokenizer profiles: a text counter plus the chat format's framing (message, name and prompt
//! overheads, image rule), with what a caller needs to judge the numbers (exactness, source,
//! licence). Profiles load on first use and live for the process; counts go through the shared
//! count cache (`cache.rs`).

use crate::block::{Image, Role};
use crate::cache;
use crate::counter::{Bpe, Heuristic, HfJson, TextCounter};
use crate::image::ImageRule;
use crate::reasoning::{ReasoningRule, Retention};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exactness {
    /// The model's own tokenizer, and the framing its vendor publishes or its chat template spells.
    Exact,
    /// The model's own tokenizer for text; message framing is a generic estimate.
    TextExact,
    Approximate,
}

impl Exactness {
    pub fn as_str(self) -> &'static str {
        match self {
            Exactness::Exact => "exact",
            Exactness::TextExact => "text-exact",
            Exactness::Approximate => "approximate",
        }
    }
}

/// The tokens a chat format adds around the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// Tokens framing one message, by role: system, user, assistant, tool.
    pub message: [u64; 4],
    /// Tokens a participant `name` adds beyond its own text; `None` when the format drops names.
    pub name: Option<u64>,
    /// Tokens the prompt costs once: begin-of-text and the reply priming.
    pub prompt: u64,
    pub images: ImageRule,
    /// Tokens framing each tool call a message issues, beyond its name and arguments.
    pub call: u64,
    /// How the tool definitions sent with the prompt are counted.
    pub tools: ToolRule,
    /// Which reasoning sent back the provider counts, and which it accepts left out.
    pub reasoning: ReasoningRule,
}

/// How a chat format charges for the tool definitions sent with a prompt (`count::tools_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolRule {
    /// OpenAI's function-definition formula: the cookbook "How to count tokens with tiktoken",
    /// section "Counting tokens for chat completions with tool calls" (`num_tokens_for_tools`).
    /// Per function `func_init` + tokens of `name:description`; when it has properties, 3, then
    /// per property 3 + tokens of `key:type:description` (a trailing period dropped from each
    /// description), and an enum -3 + per item 3 + its tokens; 12 once after the functions.
    OpenAiFunctions { func_init: u64 },
    /// Anthropic: the tool-use system prompt its pricing page lists (with `tool_choice` auto),
    /// once when there are tools, plus each definition's JSON text.
    AnthropicToolUse { system_prompt: u64 },
    /// Each definition's JSON text: the chat template's own rendering is not read.
    JsonText,
}

impl ToolRule {
    pub fn describe(&self) -> String {
        match self {
            ToolRule::OpenAiFunctions { func_init } => {
                format!("OpenAI cookbook num_tokens_for_tools (func_init {func_init}, prop 3, enum -3 + 3 per item, end 12)")
            }
            ToolRule::AnthropicToolUse { system_prompt } => {
                format!("Anthropic tool-use system prompt ({system_prompt}) + each definition's JSON text")
            }
            ToolRule::JsonText => "each definition's JSON text".to_owned(),
        }
    }
}

impl Framing {
    pub fn message_overhead(&self, role: Role) -> u64 {
        self.message[match role {
            Role::System => 0,
            Role::User => 1,
            Role::Assistant => 2,
            Role::Tool => 3,
        }]
    }
}

/// What a profile is, for listings (ListTokenizerProfiles) and results.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileInfo {
    pub name: String,
    pub exactness: Exactness,
    /// Where the vocabulary comes from.
    pub source: String,
    pub licence: String,
    pub vocab_size: Option<u64>,
    pub framing: Framing,
    /// Where the framing numbers come from.
    pub framing_source: String,
}

impl ProfileInfo {
    pub fn approximate(&self) -> bool {
        self.exactness == Exactness::Approximate
    }
}

pub struct Profile {
    info: ProfileInfo,
    counter: Box<dyn TextCounter>,
    /// Mixed into the count cache's keys, so two profiles never share an entry.
    salt: u128,
}

impl Profile {
    pub fn new(info: ProfileInfo, counter: Box<dyn TextCounter>) -> Profile {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Profile { info, counter, salt: cache::salt(NEXT_ID.fetch_add(1, Ordering::Relaxed)) }
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn approximate(&self) -> bool {
        self.info.approximate()
    }

    pub fn info(&self) -> &ProfileInfo {
        &self.info
    }

    pub fn text_tokens(&self, text: &str) -> u64 {
        if text.is_empty() {
            0
        } else if self.counter.cacheable() {
            cache::global().get_or_count(self.salt, cache::text_key(text), text, |t| self.counter.count(t))
        } else {
            self.counter.count(text)
        }
    }

    /// `text_tokens` of each of `texts`, in order, the count cache probed for all of them at once
    /// (see `CountCache::get_or_count_many`).
    pub fn texts_tokens(&self, texts: &[&str]) -> Vec<u64> {
        // An empty text is 0 tokens and never cached, as in `text_tokens`.
        if !self.uses_cache() || texts.iter().any(|t| t.is_empty()) {
            return texts.iter().map(|t| self.text_tokens(t)).collect();
        }
        let keys: Vec<cache::TextKey> = texts.iter().map(|t| cache::text_key(t)).collect();
        cache::global().get_or_count_many(self.salt, &keys, texts, |t| self.counter.count(t))
    }

    /// What keys this profile's entries in the count cache and block count memos.
    pub fn salt(&self) -> u128 {
        self.salt
    }

    /// Whether counts go through the count cache (the counter is far slower than hashing).
    pub fn uses_cache(&self) -> bool {
        self.counter.cacheable()
    }

    /// `text_tokens` without the count cache: the tokenizer's own work.
    pub fn text_tokens_fresh(&self, text: &str) -> u64 {
        if text.is_empty() {
            0
        } else {
            self.counter.count(text)
        }
    }

    pub fn image_tokens(&self, image: &Image) -> u64 {
        self.info.framing.images.tokens(image)
    }

    /// Framing tokens a block of `role` costs (role markers, separators).
    pub fn block_overhead(&self, role: Role) -> u64 {
        self.info.framing.message_overhead(role)
    }

    /// Tokens of a participant name: its text plus the format's per-name cost, or nothing when
    /// the format does not render names.
    pub fn name_tokens(&self, name: &str) -> u64 {
        self.name_tokens_with(name, |text| self.text_tokens(text))
    }

    /// `name_tokens` with the name's text tokens from `text_tokens` (called only when the format
    /// renders names).
    pub fn name_tokens_with<'t>(&self, name: &'t str, text_tokens: impl FnOnce(&'t str) -> u64) -> u64 {
        self.info.framing.name.map_or(0, |per_name| per_name + text_tokens(name))
    }

    /// Tokens the prompt costs once (begin-of-text, reply priming).
    pub fn prompt_overhead(&self) -> u64 {
        self.info.framing.prompt
    }

    /// Tokens framing one tool call in a message, beyond its name and arguments.
    pub fn call_overhead(&self) -> u64 {
        self.info.framing.call
    }

    pub fn tool_rule(&self) -> ToolRule {
        self.info.framing.tools
    }

    pub fn reasoning_rule(&self) -> ReasoningRule {
        self.info.framing.reasoning
    }

    pub fn parallel_min_bytes(&self) -> usize {
        self.counter.parallel_min_bytes()
    }
}

fn loaded() -> std::sync::MutexGuard<'static, HashMap<String, Arc<Profile>>> {
    static LOADED: OnceLock<Mutex<HashMap<String, Arc<Profile>>>> = OnceLock::new();
    LOADED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Empties the count cache, the block cache and every loaded tokenizer's own memo: the next
/// count of any text is computed from scratch, and the next block read from JSON is read.
pub fn clear_caches() {
    cache::global().clear();
    crate::block_cache::global().clear();
    for profile in loaded().values() {
        profile.counter.clear_memo();
    }
}

/// Why a profile name gave no profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileError {
    Unknown(String),
    /// A known profile that cannot load here (a missing or broken file).
    Unavailable(String),
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileError::Unknown(name) => {
                write!(
                    f,
                    "unknown profile {name:?} (known: {}, or hf:<path to tokenizer.json>)",
                    BUILTINS.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")
                )
            }
            ProfileError::Unavailable(why) => f.write_str(why),
        }
    }
}

pub const HF_PREFIX: &str = "hf:";
/// Where the `llama3` profile reads Meta's tokenizer.json (not bundled, see `LLAMA3`).
pub const LLAMA3_ENV: &str = "CONTEXTSHIFT_LLAMA3_TOKENIZER";

type Load = fn() -> Result<Box<dyn TextCounter>, String>;

struct Builtin {
    name: &'static str,
    exactness: Exactness,
    source: &'static str,
    licence: &'static str,
    vocab_size: Option<u64>,
    framing: Framing,
    framing_source: &'static str,
    load: Load,
}

impl Builtin {
    fn info(&self) -> ProfileInfo {
        ProfileInfo {
            name: self.name.to_owned(),
            exactness: self.exactness,
            source: self.source.to_owned(),
            licence: self.licence.to_owned(),
            vocab_size: self.vocab_size,
            framing: self.framing,
            framing_source: self.framing_source.to_owned(),
        }
    }
}

pub const HEURISTIC_IMAGE_TOKENS: u64 = 765;
pub const HEURISTIC_BLOCK_OVERHEAD: u64 = 4;

/// Where a provider publishes no rule for reasoning sent back, all of it is counted (what is sent
/// may be billed), and only what a provider documents as optional is ever left out: Anthropic
/// thinking of earlier turns.
const UNPUBLISHED_REASONING: ReasoningRule = ReasoningRule {
    retention: Retention::All,
    overhead: 0,
    clear_thinking: true,
    clear_content: false,
    source: "no published rule: all reasoning sent is counted; reasoning_content is never left out \
             (DeepSeek and Moonshot refuse tool-call turns without it)",
};

/// OpenAI: "reasoning items from previous turns are ignored and removed, since the model does not
/// reuse reasoning items from previous turns" (cookbook, Better performance from reasoning models
/// using the Responses API); within the turn they are passed back and billed as input.
const OPENAI_REASONING: ReasoningRule = ReasoningRule {
    retention: Retention::CurrentTurn,
    source: "OpenAI cookbook, reasoning items: only the current turn's reasoning items are kept",
    ..UNPUBLISHED_REASONING
};

const HEURISTIC_FRAMING: Framing = Framing {
    message: [HEURISTIC_BLOCK_OVERHEAD; 4],
    name: None,
    prompt: 0,
    images: ImageRule::Flat(HEURISTIC_IMAGE_TOKENS),
    call: 0,
    tools: ToolRule::JsonText,
    reasoning: UNPUBLISHED_REASONING,
};

/// Tool definitions and calls counted generically (as the heuristic does): what a chat template's
/// profile takes, since the template's rendering of tools is not read.
const GENERIC_TOOL_FRAMING: Framing = HEURISTIC_FRAMING;

/// OpenAI's published counting rule ("How to count tokens with tiktoken", num_tokens_from_messages,
/// for gpt-3.5-turbo-0613 onwards, GPT-4, GPT-4o): 3 tokens per message plus the role's own token
/// (system, user, assistant and tool are one token each in both vocabularies), 1 per name on top
/// of its text, and 3 for the reply priming `<|start|>assistant<|message|>`. A tool call is
/// rendered as a message of its own (`<|start|>…<|message|>…<|end|>`), so it costs that message's
/// 3 beyond its name and arguments. Tool definitions: the cookbook's `num_tokens_for_tools` with
/// gpt-4o's constants (o200k_base); cl100k_base takes gpt-4's `func_init`.
const OPENAI_FRAMING: Framing = Framing {
    message: [4; 4],
    name: Some(1),
    prompt: 3,
    images: ImageRule::OpenAiTiles,
    call: 3,
    tools: ToolRule::OpenAiFunctions { func_init: 7 },
    reasoning: OPENAI_REASONING,
};
const OPENAI_FRAMING_SOURCE: &str = "OpenAI cookbook, How to count tokens with tiktoken: 3 per message + role \
                                     token, 1 per name, 3 reply priming, 3 per tool call (a message of its \
                                     own); tool definitions by its num_tokens_for_tools; OpenAI vision guide \
                                     for images";

fn bundled(name: &str, nfc: bool) -> Result<Box<dyn TextCounter>, String> {
    let tokenizer = splintr::pretrained::from_pretrained(name)
        .map_err(|e| format!("bundled vocabulary {name} failed to load: {e}"))?;
    match tokenizer.into_backend() {
        splintr::Backend::Bpe(bpe) => Ok(Box::new(Bpe { tokenizer: bpe, nfc })),
        _ => Err(format!("bundled vocabulary {name} is not byte-level BPE")),
    }
}

fn llama3_file() -> Result<Box<dyn TextCounter>, String> {
    let path = std::env::var(LLAMA3_ENV).map_err(|_| {
        format!(
            "profile \"llama3\" needs Meta's tokenizer.json, which is not bundled (Llama 3 Community License): \
             set {LLAMA3_ENV} to its path"
        )
    })?;
    hf_file(&path).map(|t| Box::new(t) as Box<dyn TextCounter>)
}

fn hf_file(path: &str) -> Result<HfJson, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read tokenizer.json {path:?}: {e}"))?;
    HfJson::from_json(&bytes).map_err(|e| format!("{path:?}: {e}"))
}

static BUILTINS: &[Builtin] = &[
    Builtin {
        name: "heuristic",
        exactness: Exactness::Approximate,
        source: "arithmetic, docs/semantics.md §2: max(1, ceil(ascii/4 + other/1.5)) code points",
        licence: "Apache-2.0 (contextshift)",
        vocab_size: None,
        framing: HEURISTIC_FRAMING,
        framing_source: "docs/semantics.md §2: 4 per block, 765 per image, no prompt overhead",
        load: || Ok(Box::new(Heuristic)),
    },
    Builtin {
        name: "anthropic",
        exactness: Exactness::Approximate,
        source: "heuristic text count: Anthropic publishes no tokenizer for current Claude models",
        licence: "Apache-2.0 (contextshift)",
        vocab_size: None,
        // Tool use: "Tool use system prompt token count" in Anthropic's pricing documentation, 346
        // for tool_choice auto or none (Claude Opus 4 and 4.1, Sonnet 4 and 4.5, Sonnet 3.7).
        // Thinking: "previous thinking blocks are automatically stripped from the context window
        // calculation", only the current tool-use loop's count (context windows guide); the
        // models that keep every turn's thinking (Claude Opus 4.5, Sonnet 4.6 and later) count
        // all of it through the model registry.
        framing: Framing {
            images: ImageRule::AnthropicArea,
            tools: ToolRule::AnthropicToolUse { system_prompt: 346 },
            reasoning: ReasoningRule {
                retention: Retention::CurrentTurn,
                source: "Anthropic context windows guide: thinking of earlier turns is stripped from the \
                         context; thinking of turns before the current tool-use loop may be omitted",
                ..UNPUBLISHED_REASONING
            },
            ..HEURISTIC_FRAMING
        },
        framing_source: "heuristic framing; Anthropic vision guide for images (width*height/750); tool use: \
                         Anthropic pricing, tool-use system prompt 346 (tool_choice auto)",
        load: || Ok(Box::new(Heuristic)),
    },
    Builtin {
        name: "o200k_base",
        exactness: Exactness::Exact,
        source: "OpenAI o200k_base ranks (tiktoken), bundled by the splintr-vocab-o200k crate",
        licence: "MIT (tiktoken)",
        vocab_size: Some(200_019),
        framing: OPENAI_FRAMING,
        framing_source: OPENAI_FRAMING_SOURCE,
        load: || bundled("o200k_base", false),
    },
    Builtin {
        name: "cl100k_base",
        exactness: Exactness::Exact,
        source: "OpenAI cl100k_base ranks (tiktoken), bundled by the splintr-vocab-cl100k crate",
        licence: "MIT (tiktoken)",
        vocab_size: Some(100_277),
        framing: Framing { tools: ToolRule::OpenAiFunctions { func_init: 10 }, ..OPENAI_FRAMING },
        framing_source: OPENAI_FRAMING_SOURCE,
        load: || bundled("cl100k_base", false),
    },
    Builtin {
        name: "qwen",
        exactness: Exactness::Exact,
        source: "Qwen2/2.5/3 byte-level BPE (from Qwen/Qwen3-8B), bundled by the splintr-vocab-qwen crate",
        licence: "Apache-2.0 (Qwen)",
        vocab_size: Some(151_669),
        // ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` is 5 tokens around the content; a tool
        // result also sits in `<tool_response>\n…\n</tool_response>` (4 more, one fewer when the
        // content ends in punctuation that merges with the newline: never an under-count).
        // Reasoning: the template renders `reasoning_content` only after the last user query (not a
        // <tool_response>), as `<think>\n…\n</think>\n\n`: 5 tokens (both tags are single tokens),
        // one fewer when the reasoning ends in punctuation that merges with the newline.
        framing: Framing {
            message: [5, 5, 5, 9],
            name: None,
            prompt: 3,
            images: ImageRule::Flat(HEURISTIC_IMAGE_TOKENS),
            reasoning: ReasoningRule {
                retention: Retention::CurrentTurn,
                overhead: 5,
                clear_thinking: true,
                clear_content: true,
                source: "Qwen3 chat template: reasoning_content only after the last user query, in \
                         <think> tags (at most 5 tokens); earlier reasoning is not rendered",
            },
            ..GENERIC_TOOL_FRAMING
        },
        framing_source: "Qwen chat template (ChatML): 5 per message, +4 tool_response tags, reply priming \
                         <|im_start|>assistant\\n = 3; images: no text-tokenizer rule, 765 flat",
        load: || bundled("qwen3", true),
    },
    Builtin {
        name: "deepseek_v3",
        exactness: Exactness::Exact,
        source: "DeepSeek V3/R1 byte-level BPE, bundled by the splintr-vocab-deepseek crate",
        licence: "MIT (DeepSeek V3)",
        vocab_size: Some(128_815),
        // `<｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜>{reply}<｜end▁of▁sentence｜>`;
        // a tool result is wrapped in the four tool-output markers.
        // Reasoning: DeepSeek API, thinking mode: a turn's reasoning_content takes part in the context
        // when the turn called tools (and must then be sent back, else 400); otherwise it is ignored.
        framing: Framing {
            message: [0, 1, 2, 4],
            name: None,
            prompt: 2,
            images: ImageRule::Flat(HEURISTIC_IMAGE_TOKENS),
            reasoning: ReasoningRule {
                retention: Retention::ToolTurns,
                overhead: 0,
                clear_thinking: false,
                clear_content: false,
                source: "DeepSeek API, thinking mode: reasoning of turns that called tools is in the context \
                         and must be sent back; other turns' reasoning is ignored",
            },
            ..GENERIC_TOOL_FRAMING
        },
        framing_source: "DeepSeek V3 chat template: system 0, user 1, assistant 2, tool 4; BOS + \
                         <｜Assistant｜> priming = 2; images: 765 flat",
        load: || bundled("deepseek_v3", false),
    },
    Builtin {
        name: "mistral_tekken",
        exactness: Exactness::Exact,
        source: "Mistral Tekken (V3) ranks, bundled by the splintr-vocab-mistral crate",
        licence: "Apache-2.0 (Mistral)",
        vocab_size: Some(131_072),
        // V7 instruct format: `<s>[SYSTEM_PROMPT]…[/SYSTEM_PROMPT][INST]…[/INST]…</s>`,
        // tool results in `[TOOL_RESULTS]…[/TOOL_RESULTS]`.
        framing: Framing {
            message: [2, 2, 1, 2],
            name: None,
            prompt: 1,
            images: ImageRule::Flat(HEURISTIC_IMAGE_TOKENS),
            ..GENERIC_TOOL_FRAMING
        },
        framing_source: "Mistral instruct format (mistral-common, V7 Tekken): system 2, user 2, assistant 1 \
                         (</s>), tool 2; BOS = 1, no reply priming; images: 765 flat",
        load: || bundled("mistral_v3", false),
    },
    Builtin {
        name: "llama3",
        exactness: Exactness::Exact,
        source: "Meta Llama 3 tokenizer.json, read from the file named by CONTEXTSHIFT_LLAMA3_TOKENIZER \
                 (not bundled)",
        licence: "Llama 3 Community License (user-supplied file; nothing of it ships with contextshift)",
        vocab_size: Some(128_256),
        // `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>`
        framing: Framing {
            message: [5, 5, 5, 5],
            name: None,
            prompt: 5,
            images: ImageRule::Flat(HEURISTIC_IMAGE_TOKENS),
            ..GENERIC_TOOL_FRAMING
        },
        framing_source: "Llama 3 chat template: 5 per message; <|begin_of_text|> + \
                         <|start_header_id|>assistant<|end_header_id|>\\n\\n priming = 5; images: 765 flat",
        load: llama3_file,
    },
];

/// Every built-in profile, described without loading any vocabulary.
pub fn builtin_profiles() -> Vec<ProfileInfo> {
    BUILTINS.iter().map(Builtin::info).collect()
}

fn hf_profile(path: &str) -> Result<Profile, String> {
    let tokenizer = hf_file(path)?;
    let info = ProfileInfo {
        name: format!("{HF_PREFIX}{path}"),
        exactness: Exactness::TextExact,
        source: format!("Hugging Face tokenizer.json at {path}, read by the tokenizers crate"),
        licence: "the file's own (user-supplied)".to_owned(),
        vocab_size: Some(tokenizer.vocab_size()),
        framing: HEURISTIC_FRAMING,
        framing_source: "generic: the chat template is not read; 4 per message, 765 per image".to_owned(),
    };
    Ok(Profile::new(info, Box::new(tokenizer)))
}

/// The profile called `name`: a built-in name or `hf:<path>`. Loaded once per process.
pub fn profile_by_name(name: &str) -> Result<Arc<Profile>, ProfileError> {
    if let Some(profile) = loaded().get(name) {
        return Ok(Arc::clone(profile));
    }
    // Load outside the lock: a vocabulary takes tens of milliseconds, a tokenizer.json longer,
    // and other profiles must stay reachable meanwhile. A racing load of the same name is
    // discarded below.
    let profile = if let Some(path) = name.strip_prefix(HF_PREFIX) {
        hf_profile(path).map_err(ProfileError::Unavailable)?
    } else {
        let builtin = BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| ProfileError::Unknown(name.to_owned()))?;
        Profile::new(builtin.info(), (builtin.load)().map_err(ProfileError::Unavailable)?)
    };
    Ok(Arc::clone(loaded().entry(name.to_owned()).or_insert_with(|| Arc::new(profile))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heuristic_profile_keeps_its_arithmetic() {
        let h = profile_by_name("heuristic").unwrap();
        assert!(h.approximate());
        assert_eq!(h.text_tokens("abcde"), 2);
        assert_eq!(h.block_overhead(Role::Tool), 4);
        assert_eq!(h.name_tokens("alice"), 0);
        assert_eq!(h.prompt_overhead(), 0);
        assert_eq!(h.image_tokens(&Image::default()), 765);
        assert!(Arc::ptr_eq(&h, &profile_by_name("heuristic").unwrap()), "loaded once");
    }

    #[test]
    fn unknown_and_unavailable_profiles_say_why() {
        assert_eq!(profile_by_name("nope").err(), Some(ProfileError::Unknown("nope".to_owned())));
        let missing = profile_by_name("hf:/no/such/tokenizer.json").err().unwrap();
        assert!(matches!(&missing, ProfileError::Unavailable(why) if why.contains("cannot read")), "{missing}");
    }

    #[test]
    fn openai_framing_follows_the_cookbook() {
        let p = profile_by_name("o200k_base").unwrap();
        // Each role name is one token, so every message costs 3 + 1.
        for role in ["system", "user", "assistant", "tool"] {
            assert_eq!(p.text_tokens(role), 1, "{role}");
        }
        assert_eq!(p.block_overhead(Role::User), 4);
        assert_eq!(p.name_tokens("alice"), 1 + p.text_tokens("alice"));
        assert_eq!(p.prompt_overhead(), 3);
    }

    #[test]
    fn bundled_vocabulary_sizes_are_as_listed() {
        for (profile, vocab) in [
            ("o200k_base", "o200k_base"),
            ("cl100k_base", "cl100k_base"),
            ("qwen", "qwen3"),
            ("deepseek_v3", "deepseek_v3"),
            ("mistral_tekken", "mistral_v3"),
        ] {
            let listed = BUILTINS.iter().find(|b| b.name == profile).unwrap().vocab_size;
            let loaded = u64::from(splintr::pretrained::base_vocab_size_by_name(vocab).unwrap());
            assert_eq!(listed, Some(loaded), "{profile}");
        }
    }
}
