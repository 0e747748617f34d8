//! The parsed form of one block: only what counting, grouping and planning need.

use std::fmt;
use std::sync::OnceLock;

/// Who speaks. `developer` is read as `System`; Responses items without a role take it from
/// their type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            "tool" => Some(Role::Tool),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// What a block is for; decides protection (`System`, `Character`) and strategy treatment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    System,
    Character,
    Persona,
    Lorebook,
    Memory,
    Summary,
    Message,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "system" => Some(Kind::System),
            "character" => Some(Kind::Character),
            "persona" => Some(Kind::Persona),
            "lorebook" => Some(Kind::Lorebook),
            "memory" => Some(Kind::Memory),
            "summary" => Some(Kind::Summary),
            "message" => Some(Kind::Message),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::System => "system",
            Kind::Character => "character",
            Kind::Persona => "persona",
            Kind::Lorebook => "lorebook",
            Kind::Memory => "memory",
            Kind::Summary => "summary",
            Kind::Message => "message",
        }
    }
}

/// Strings a block mostly has one of (its text pieces, the call ids it answers): that one is kept
/// inline, with no allocation of its own (a block's allocations were most of building it).
pub type Strings = smallvec::SmallVec<[String; 1]>;

/// A tool call the block issues. `arguments` is the JSON text the model sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// An image part; detail and size are kept for profiles that price images by them
/// (`crate::image`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    pub detail: Option<String>,
    pub width: Option<u64>,
    pub height: Option<u64>,
    /// Without a width and height given: the size in the header of the image, when it is sent
    /// inline as a PNG, JPEG, GIF or WebP (`crate::image_header`).
    pub header_size: Option<(u64, u64)>,
}

/// Where a block's reasoning comes from: decides whether it is signed and whether a provider lets
/// it be left out (docs/semantics.md §1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningSource {
    /// An OpenAI Responses `reasoning` item: its summary and content text, its `encrypted_content`.
    ResponsesItem,
    /// An Anthropic `thinking` part, covered by its `signature`.
    Thinking,
    /// An Anthropic `redacted_thinking` part: encrypted `data`.
    RedactedThinking,
    /// A chat message's `reasoning_content` (DeepSeek, Moonshot, Qwen) or `reasoning` (vLLM) text.
    Content,
}

impl ReasoningSource {
    /// Signed or encrypted: the provider refuses it changed, so it is never cut or rewritten.
    pub fn signed(self) -> bool {
        self != ReasoningSource::Content
    }
}

/// One piece of reasoning a block carries. Never cut by the char cap, never part of the block's
/// text (summaries and relevance do not read it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reasoning {
    pub source: ReasoningSource,
    /// Reasoning text as sent (thinking, summaries, reasoning_content), each counted on its own.
    pub texts: Strings,
    /// Encrypted payloads (`encrypted_content`, redacted `data`): counted as text, an estimate,
    /// since no provider publishes what they cost.
    pub opaque: Strings,
}

/// A block's token count (base, reasoning) under the first profile that counted it of each
/// `MemoSlot`, keyed by the profile's cache salt: a block shared through the block cache is
/// counted once, not once per request, also where a server counts with an exact profile and the
/// heuristic alike. Not part of what the block is: every memo compares equal, and a clone starts
/// empty.
#[derive(Default)]
pub struct CountMemo([OnceLock<(u128, u64, u64)>; 2]);

/// Which of a memo's two counts: a profile whose counts go through the count cache (an exact
/// tokenizer), or one whose do not (the heuristic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoSlot {
    CountCached = 0,
    Uncached = 1,
}

impl CountMemo {
    /// The count stored under `salt`.
    pub fn get(&self, slot: MemoSlot, salt: u128) -> Option<(u64, u64)> {
        self.0[slot as usize].get().filter(|(s, _, _)| *s == salt).map(|&(_, base, reasoning)| (base, reasoning))
    }

    /// Stores a count unless one (of any profile of the slot) is there.
    pub fn set(&self, slot: MemoSlot, salt: u128, base: u64, reasoning: u64) {
        let _ = self.0[slot as usize].set((salt, base, reasoning));
    }
}

impl Clone for CountMemo {
    fn clone(&self) -> Self {
        CountMemo::default()
    }
}

impl PartialEq for CountMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for CountMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CountMemo")
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// The given id, or `#<index>` when the block has none.
    pub id: String,
    pub role: Role,
    pub kind: Kind,
    /// The participant name (OpenAI `name`), which some chat formats render and charge for.
    pub name: Option<String>,
    /// Text pieces in reading order; each is counted on its own.
    pub pieces: Strings,
    pub calls: Vec<ToolCall>,
    /// Ids of the calls this block answers (every spelling found).
    pub result_ids: Strings,
    pub images: Vec<Image>,
    pub pinned: bool,
    pub mandatory: bool,
    pub injected: bool,
    pub relevance: Option<f64>,
    /// `meta.manualExcluded`: the caller asks the `manual` strategy to leave this block out.
    pub manual_excluded: bool,
    /// Reasoning in reading order (usually none, or one).
    pub reasoning: Vec<Reasoning>,
    /// `meta.reasoning_tokens`: the tokens the provider reported for this block's reasoning,
    /// counted instead of its text.
    pub reasoning_tokens: Option<u64>,
    pub counted: CountMemo,
}

impl Block {
    /// Kind `system` or `character`, or the plain system prompt (role system, kind message).
    pub fn is_system_protected(&self) -> bool {
        matches!(self.kind, Kind::System | Kind::Character) || (self.role == Role::System && self.kind == Kind::Message)
    }

    /// Code points of the text pieces and the reasoning text: what `max_block_chars` limits.
    pub fn char_count(&self) -> usize {
        self.pieces.iter().map(|p| p.chars().count()).sum::<usize>() + self.reasoning_chars()
    }

    /// Code points of the reasoning text, which the char cap never cuts.
    pub fn reasoning_chars(&self) -> usize {
        self.reasoning.iter().flat_map(|r| &r.texts).map(|t| t.chars().count()).sum()
    }

    /// Bytes of the reasoning text and, with `opaque`, of its encrypted payloads.
    pub fn reasoning_bytes(&self, opaque: bool) -> usize {
        if self.reasoning.is_empty() {
            return 0; // most blocks: no iterator to set up
        }
        let texts: usize = self.reasoning.iter().flat_map(|r| &r.texts).map(String::len).sum();
        let payloads: usize = self.reasoning.iter().flat_map(|r| &r.opaque).map(String::len).sum();
        texts + if opaque { payloads } else { 0 }
    }

    /// An OpenAI Responses `reasoning` item: it belongs with the output items after it.
    pub fn is_reasoning_item(&self) -> bool {
        self.reasoning.iter().any(|r| r.source == ReasoningSource::ResponsesItem)
    }

    /// Bytes of text a profile counts in this block: what decides whether counting is parallel.
    pub fn text_bytes(&self) -> usize {
        let calls: usize = self.calls.iter().map(|c| c.name.len() + c.arguments.len()).sum();
        self.pieces.iter().map(String::len).sum::<usize>()
            + calls
            + self.reasoning_bytes(true)
            + self.name.as_ref().map_or(0, String::len)
    }
}
