//! Which reasoning a provider keeps in the prompt it bills, and which it lets a caller leave out
//! (docs/semantics.md §2.1). A profile names its provider's rule; docs/profiles.md lists the sources.

use crate::block::{Block, ReasoningSource, Role};
use std::sync::Arc;

/// Which reasoning sent back is part of the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// All of it (the rule where a provider publishes none: what is sent is counted).
    All,
    /// Only the current turn's: reasoning after the last user block that is not a tool result;
    /// the provider drops earlier reasoning (OpenAI Responses, Anthropic up to Claude Sonnet 4.5,
    /// Qwen's chat template).
    CurrentTurn,
    /// Only the reasoning of turns that called a tool: a turn (from a user block that is not a tool
    /// result to the next) without tool calls has its reasoning ignored (DeepSeek thinking mode).
    ToolTurns,
}

impl Retention {
    pub const ALL: [Retention; 3] = [Retention::All, Retention::CurrentTurn, Retention::ToolTurns];

    pub fn parse(name: &str) -> Option<Retention> {
        Retention::ALL.into_iter().find(|r| r.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Retention::All => "all",
            Retention::CurrentTurn => "current_turn",
            Retention::ToolTurns => "tool_turns",
        }
    }

    /// Per block: whether its reasoning is part of the prompt.
    pub fn counted(self, blocks: &[Arc<Block>]) -> Vec<bool> {
        match self {
            Retention::All => vec![true; blocks.len()],
            Retention::CurrentTurn => {
                let start = blocks.iter().rposition(|b| starts_turn(b)).map_or(0, |i| i + 1);
                (0..blocks.len()).map(|i| i >= start).collect()
            }
            Retention::ToolTurns => {
                let mut counted = vec![false; blocks.len()];
                let mut start = 0;
                for end in (1..=blocks.len()).filter(|&e| e == blocks.len() || starts_turn(&blocks[e])) {
                    let turn = start..end;
                    let called = blocks[turn.clone()].iter().any(|b| !b.calls.is_empty());
                    counted[turn].fill(called);
                    start = end;
                }
                counted
            }
        }
    }
}

/// A user block that answers no tool call begins a turn (a user message of tool results, as
/// Anthropic sends them, continues the turn's tool loop).
fn starts_turn(block: &Block) -> bool {
    block.role == Role::User && block.result_ids.is_empty()
}

/// A provider's reasoning rule: what it counts, what its chat format adds around reasoning, and
/// what it accepts left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningRule {
    pub retention: Retention,
    /// Tokens a block's counted reasoning costs beyond its text (the chat template's tags).
    pub overhead: u64,
    /// Anthropic `thinking` / `redacted_thinking` parts of earlier turns may be left out.
    pub clear_thinking: bool,
    /// `reasoning_content` of earlier turns may be left out (the provider does not ask it back).
    pub clear_content: bool,
    /// Where the rule comes from.
    pub source: &'static str,
}

impl ReasoningRule {
    /// Whether `block`'s reasoning may be left out by a rewrite (`keep_reasoning_turns`): only
    /// what the provider accepts missing (a Responses item never: its output items name it), and
    /// only when the block keeps some content of its own.
    pub fn clearable(&self, block: &Block) -> bool {
        if block.reasoning.is_empty() {
            return false;
        }
        let has_content = !(block.pieces.is_empty()
            && block.calls.is_empty()
            && block.images.is_empty()
            && block.result_ids.is_empty());
        has_content
            && block.reasoning.iter().all(|r| match r.source {
                ReasoningSource::ResponsesItem => false,
                ReasoningSource::Thinking | ReasoningSource::RedactedThinking => self.clear_thinking,
                ReasoningSource::Content => self.clear_content,
            })
    }
}

/// How a block's reasoning tokens are known: "" (no reasoning), "reported" (`meta.reasoning_tokens`),
/// "estimated" (an encrypted payload counted as text) or "text" (its text as sent).
pub fn basis(block: &Block) -> &'static str {
    if block.reasoning.is_empty() {
        ""
    } else if block.reasoning_tokens.is_some() {
        "reported"
    } else if block.reasoning.iter().any(|r| !r.opaque.is_empty()) {
        "estimated"
    } else {
        "text"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_values;
    use serde_json::json;

    fn counted(retention: Retention, values: serde_json::Value) -> Vec<bool> {
        retention.counted(&parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks)
    }

    fn loop_of_two_turns() -> serde_json::Value {
        json!([
            {"role": "user", "content": "first"},
            {"role": "assistant", "reasoning_content": "r1", "content": "answer"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "reasoning_content": "r2", "tool_calls": [{"id": "c", "name": "f"}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "again"}]},
            {"role": "assistant", "reasoning_content": "r3", "content": "done"}
        ])
    }

    #[test]
    fn current_turn_starts_after_the_last_user_block_that_is_no_tool_result() {
        let got = counted(Retention::CurrentTurn, loop_of_two_turns());
        assert_eq!(got, [false, false, false, true, true, true, true]);
        assert_eq!(counted(Retention::CurrentTurn, json!([{"role": "assistant"}])), [true]);
    }

    #[test]
    fn tool_turns_count_the_turns_that_called_a_tool() {
        let got = counted(Retention::ToolTurns, loop_of_two_turns());
        assert_eq!(got, [false, false, true, true, true, true, true]);
        let greeting = json!([{"role": "assistant", "reasoning_content": "hi"}, {"role": "user", "content": "q"}]);
        assert_eq!(counted(Retention::ToolTurns, greeting), [false, false]);
    }

    #[test]
    fn retention_names_round_trip() {
        for r in Retention::ALL {
            assert_eq!(Retention::parse(r.as_str()), Some(r));
        }
        assert_eq!(Retention::parse("some"), None);
    }
}
