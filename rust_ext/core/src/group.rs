//! Tool-call groups: blocks that share any call id (issued or answered) are one group,
//! however far apart (union-find), and a Responses reasoning item joins the output items that
//! follow it. Groups are numbered by their earliest member.

use crate::block::{Block, Role};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Groups {
    /// Group number of each block.
    pub group_of: Vec<usize>,
    /// Members of group `g` are `members[starts[g]..starts[g + 1]]`, ascending.
    starts: Vec<usize>,
    members: Vec<usize>,
    /// Group `g` has a member that issues a call / that answers one.
    issues: Vec<bool>,
    answers: Vec<bool>,
    /// The group of each call id its blocks issue or answer, once a next turn has needed it: built
    /// then, and handed on to the groups extended from these (a chat's next turns then read no
    /// block before their own). Taken, not shared: groups extended twice build it again.
    calls: Mutex<Option<CallIndex>>,
}

type CallIndex = FxHashMap<Box<str>, usize>;

impl Clone for Groups {
    fn clone(&self) -> Groups {
        Groups {
            group_of: self.group_of.clone(),
            starts: self.starts.clone(),
            members: self.members.clone(),
            issues: self.issues.clone(),
            answers: self.answers.clone(),
            calls: Mutex::new(None),
        }
    }
}

/// The same groups of the same blocks (the call index is what they know of them, not what they are).
impl PartialEq for Groups {
    fn eq(&self, other: &Groups) -> bool {
        (&self.group_of, &self.starts, &self.members, &self.issues, &self.answers)
            == (&other.group_of, &other.starts, &other.members, &other.issues, &other.answers)
    }
}

impl Eq for Groups {}

/// The call ids `block` issues and answers.
fn call_ids(block: &Block) -> impl Iterator<Item = &str> {
    block.calls.iter().map(|c| c.id.as_str()).chain(block.result_ids.iter().map(String::as_str))
}

impl Groups {
    pub fn build(blocks: &[Arc<Block>]) -> Groups {
        let n = blocks.len();
        let mut parent: Vec<usize> = (0..n).collect();
        let ids = blocks.iter().map(|b| b.calls.len() + b.result_ids.len()).sum();
        let mut first_with_id: FxHashMap<&str, usize> = FxHashMap::with_capacity_and_hasher(ids, Default::default());
        for (i, block) in blocks.iter().enumerate() {
            for id in call_ids(block) {
                match first_with_id.entry(id) {
                    Entry::Occupied(first) => union(&mut parent, i, *first.get()),
                    Entry::Vacant(slot) => {
                        slot.insert(i);
                    }
                }
            }
        }

        // A Responses reasoning item goes with the output items of its response: the assistant
        // blocks after it, up to a block of another role or the next reasoning item. The API
        // refuses either half without the other.
        for i in (0..n).filter(|&i| blocks[i].is_reasoning_item()) {
            let run =
                blocks[i + 1..].iter().take_while(|b| b.role == Role::Assistant && !b.is_reasoning_item()).count();
            for j in i + 1..=i + run {
                union(&mut parent, i, j);
            }
        }

        // Number groups in order of their earliest member.
        let mut number_of_root = vec![usize::MAX; n];
        let mut group_of = Vec::with_capacity(n);
        let mut sizes = Vec::new();
        for i in 0..n {
            let root = find(&mut parent, i);
            if number_of_root[root] == usize::MAX {
                number_of_root[root] = sizes.len();
                sizes.push(0);
            }
            let g = number_of_root[root];
            group_of.push(g);
            sizes[g] += 1;
        }
        let mut starts = Vec::with_capacity(sizes.len() + 1);
        starts.push(0);
        for size in &sizes {
            starts.push(starts.last().copied().unwrap_or(0) + size);
        }
        let mut fill = starts.clone();
        let mut members = vec![0; n];
        let mut issues = vec![false; sizes.len()];
        let mut answers = vec![false; sizes.len()];
        for (i, &g) in group_of.iter().enumerate() {
            members[fill[g]] = i;
            fill[g] += 1;
            issues[g] |= !blocks[i].calls.is_empty();
            answers[g] |= !blocks[i].result_ids.is_empty();
        }
        Groups { group_of, starts, members, issues, answers, calls: Mutex::new(None) }
    }

    /// The groups of `blocks`, which start with the blocks these groups are of, when each block
    /// after those is a group of its own or joins one group through its call ids (and is not a
    /// reasoning item nor an assistant block that may follow one): the same as `build`, reading
    /// only the blocks after (and, the first time, the call ids of those before). None otherwise.
    pub fn extended(&self, blocks: &[Arc<Block>]) -> Option<Groups> {
        let before = self.group_of.len();
        let follows_output = |i: usize| {
            blocks[i].role == Role::Assistant
                && i > 0
                && (blocks[i - 1].role == Role::Assistant || blocks[i - 1].is_reasoning_item())
        };
        if blocks.len() < before || (before..blocks.len()).any(|i| blocks[i].is_reasoning_item() || follows_output(i)) {
            return None;
        }
        let taken = self.calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        // Needed only if a new block has call ids; else handed on if there was one.
        let needed = || (before..blocks.len()).any(|i| call_ids(&blocks[i]).next().is_some());
        let mut calls = taken.or_else(|| needed().then(|| self.call_index(&blocks[..before])));
        let mut groups = self.clone();
        for (i, block) in blocks.iter().enumerate().skip(before) {
            let mut joined = None;
            for &g in call_ids(block).filter_map(|id| calls.as_ref()?.get(id)) {
                match joined {
                    Some(h) if h != g => return None, // joins two groups: built anew
                    _ => joined = Some(g),
                }
            }
            let g = match joined {
                Some(g) => {
                    // The latest member: last of its group.
                    groups.members.insert(groups.starts[g + 1], i);
                    groups.starts[g + 1..].iter_mut().for_each(|start| *start += 1);
                    g
                }
                None => {
                    groups.members.push(i);
                    groups.starts.push(groups.members.len());
                    groups.issues.push(false);
                    groups.answers.push(false);
                    groups.issues.len() - 1
                }
            };
            groups.group_of.push(g);
            groups.issues[g] |= !block.calls.is_empty();
            groups.answers[g] |= !block.result_ids.is_empty();
            if let Some(calls) = &mut calls {
                for id in call_ids(block) {
                    calls.entry(id.into()).or_insert(g);
                }
            }
        }
        groups.calls = Mutex::new(calls);
        Some(groups)
    }

    /// The group of each call id of `blocks`, the blocks these groups are of.
    fn call_index(&self, blocks: &[Arc<Block>]) -> CallIndex {
        let mut calls = CallIndex::default();
        for (block, &g) in blocks.iter().zip(&self.group_of) {
            for id in call_ids(block) {
                calls.entry(id.into()).or_insert(g);
            }
        }
        calls
    }

    pub fn len(&self) -> usize {
        self.issues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.issues.is_empty()
    }

    pub fn members(&self, g: usize) -> &[usize] {
        &self.members[self.starts[g]..self.starts[g + 1]]
    }

    /// Some member answers a call and none issues one: its results have nothing to answer.
    pub fn is_orphan(&self, g: usize) -> bool {
        self.answers[g] && !self.issues[g]
    }
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]]; // path halving
        i = parent[i];
    }
    i
}

/// Union toward the smaller index (keeps trees shallow enough with path halving, and is
/// deterministic).
fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        parent[hi] = lo;
    }
}

/// Where each tool-use turn begins: a run of consecutive assistant blocks (one response's items,
/// or one message) of which some block calls a tool.
pub fn tool_use_turns(blocks: &[Arc<Block>]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let run = blocks[i..].iter().take_while(|b| b.role == Role::Assistant).count();
        if blocks[i..i + run].iter().any(|b| !b.calls.is_empty()) {
            starts.push(i);
        }
        i += run.max(1);
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_values;
    use serde_json::json;

    fn groups(values: serde_json::Value) -> Groups {
        Groups::build(&parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks)
    }

    #[test]
    fn a_tool_use_turn_is_a_run_of_assistant_blocks_that_calls_a_tool() {
        let values = json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "thinking"},
            {"role": "assistant", "tool_calls": [{"id": "a"}]},
            {"role": "tool", "tool_call_id": "a"},
            {"role": "assistant", "content": "no call"},
            {"role": "user", "content": "again"},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"}
        ]);
        let blocks = parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        assert_eq!(tool_use_turns(&blocks), [1, 6]);
    }

    #[test]
    fn parallel_calls_with_spread_results_form_one_group() {
        let g = groups(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}, {"id": "c"}]},
            {"role": "tool", "tool_call_id": "a"},
            {"role": "user", "content": "meanwhile"},
            {"role": "tool", "meta": {"callId": "c"}},
            {"role": "tool", "toolCallId": "b"},
            {"role": "tool", "tool_use_id": "zzz"}
        ]));
        assert_eq!(g.group_of, [0, 1, 1, 2, 1, 1, 3]);
        assert_eq!(g.members(1), [1, 2, 4, 5]);
        assert!(!g.is_orphan(1));
        assert!(g.is_orphan(3));
        assert!(!g.is_orphan(0));
    }

    #[test]
    fn a_reasoning_item_joins_the_output_items_of_its_response() {
        // The shape of OpenAI's function-calling loop: reasoning, its calls, their outputs, then
        // reasoning and the answer message; a user turn and the next reasoning item end a run.
        let g = groups(json!([
            {"role": "user", "content": "weather in Paris and Bogota?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "15C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "18C"},
            {"type": "reasoning", "id": "rs_2", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris 15C"}]},
            {"role": "user", "content": "thanks"},
            {"type": "reasoning", "id": "rs_3", "summary": []},
            {"type": "reasoning", "id": "rs_4", "summary": []},
            {"role": "assistant", "content": "bye"}
        ]));
        assert_eq!(g.group_of, [0, 1, 1, 1, 1, 1, 2, 2, 3, 4, 5, 5]);
    }

    #[test]
    fn groups_extended_by_blocks_of_their_own_are_the_groups_built() {
        let values = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "15C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "15C"}]},
            {"role": "assistant", "content": "anything else?"},
            {"role": "user", "content": "no"},
            {"role": "assistant", "content": "bye"},
            {"role": "assistant", "tool_calls": [{"id": "a"}]},
            {"role": "tool", "tool_call_id": "a"},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": "welcome"}
        ]);
        let blocks = parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        let mut extended = 0;
        for before in 0..=blocks.len() {
            for after in before..=blocks.len() {
                let built = Groups::build(&blocks[..after]);
                if let Some(groups) = Groups::build(&blocks[..before]).extended(&blocks[..after]) {
                    assert_eq!(groups, built, "{before} then {after}");
                    extended += 1;
                }
            }
        }
        // A user turn, then the assistant's answer, after a user turn: extended, not rebuilt; so
        // is a tool's result, which joins its call's group, and the blocks after it.
        assert!(Groups::build(&blocks[..7]).extended(&blocks[..9]).is_some());
        assert!(Groups::build(&blocks[..11]).extended(&blocks[..13]).is_some());
        assert!(Groups::build(&blocks[..10]).extended(&blocks[..13]).is_some());
        assert!(extended >= 29, "{extended}");
        // Extended turn after turn, the call index handed on each time.
        let mut twice = 0;
        for a in 0..=blocks.len() {
            for b in a..=blocks.len() {
                for c in b..=blocks.len() {
                    let once = Groups::build(&blocks[..a]).extended(&blocks[..b]);
                    if let Some(groups) = once.and_then(|once| once.extended(&blocks[..c])) {
                        assert_eq!(groups, Groups::build(&blocks[..c]), "{a} then {b} then {c}");
                        twice += 1;
                    }
                }
            }
        }
        assert!(twice >= 50, "{twice}");
    }

    #[test]
    fn ids_chain_groups_together() {
        // b answers a's call and issues its own, answered by c: one group.
        let g = groups(json!([
            {"role": "assistant", "tool_calls": [{"id": "x"}]},
            {"role": "assistant", "toolCallId": "x", "tool_calls": [{"id": "y"}]},
            {"role": "tool", "tool_call_id": "y"}
        ]));
        assert_eq!(g.group_of, [0, 0, 0]);
        assert_eq!(g.len(), 1);
    }
}
