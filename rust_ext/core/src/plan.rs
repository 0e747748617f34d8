//! Protection, the pinned cap, and the removal plan (orphans, oldest-first removal by whole
//! groups, then the repair of the child module `repair`). docs/semantics.md §4–5.

mod repair;

use crate::block::{Block, Kind, Role};
use crate::group::Groups;
use repair::repair_start;
pub use repair::Repair;
use std::sync::Arc;

/// Why a block is protected; decides its kept reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    None,
    System,
    Mandatory,
    /// Pinned by the caller, or the current input.
    Pinned,
}

/// Declares `Reason` from one list of variants and their stable codes: the enum, `Reason::ALL`
/// (its length counted by the compiler) and `as_str` cannot disagree, and a new code is one line.
macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident => $code:literal,)+) => {
        /// Stable codes of a block's decision or of a truncation (docs/design.md §6), the one
        /// vocabulary of the project: Python's `contextshift.reasons.Reason` is checked against
        /// `ALL` by a test. The core gives the decisions' reasons; Python gives the summary block's
        /// and how a strategy cut a block.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Reason {
            $($(#[$doc])* $variant,)+
        }

        impl Reason {
            /// Every reason, in declaration order: `reason as usize` is its index.
            pub const ALL: [Reason; [$($code),+].len()] = [$(Reason::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $code,)+
                }
            }
        }
    };
}

reasons! {
    ProtectedSystem => "PROTECTED_SYSTEM",
    Pinned => "PINNED",
    Mandatory => "MANDATORY",
    Fits => "FITS",
    BudgetOldestFirst => "BUDGET_OLDEST_FIRST",
    ToolGroup => "TOOL_GROUP",
    ManualExcluded => "MANUAL_EXCLUDED",
    LowRelevance => "LOW_RELEVANCE",
    OrphanToolResult => "ORPHAN_TOOL_RESULT",
    LeadingAssistant => "LEADING_ASSISTANT",
    /// Kept: the user turn the repair brought back so the history starts on a user turn.
    AnchorUserTurn => "ANCHOR_USER_TURN",
    Summarized => "SUMMARIZED",
    /// Also a truncation's how: the character caps cut the block.
    CharCap => "CHAR_CAP",
    UnpinnedByCap => "UNPINNED_BY_CAP",
    PluginExcluded => "PLUGIN_EXCLUDED",
    /// Its reasoning alone is over the char cap and reasoning is never cut: left out whole.
    ReasoningOverCap => "REASONING_OVER_CAP",
    /// Kept: the summary block a strategy inserted (made in Python).
    Summary => "SUMMARY",
    /// Truncations' hows (made in Python): `clear-tool-results` cleared a result or a call's
    /// input, a plugin strategy rewrote the block.
    ToolResultCleared => "TOOL_RESULT_CLEARED",
    ToolInputCleared => "TOOL_INPUT_CLEARED",
    PluginReplaced => "PLUGIN_REPLACED",
    /// A truncation's how (made in Python): the reasoning of an old turn was left out
    /// (`keep_reasoning_turns`).
    ReasoningCleared => "REASONING_CLEARED",
}

impl Reason {
    /// The reason with this stable code.
    pub fn parse(code: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == code)
    }
}

/// Pins that count against `pinned_cap`: pinned blocks not already protected as system or
/// mandatory.
fn counts_as_pin(block: &Block) -> bool {
    block.pinned && !block.mandatory && !block.is_system_protected()
}

/// Stage 3: the injected pins to drop, oldest first, until pinned tokens are at most `limit`.
/// The most recent pin always stays.
pub fn pinned_cap(blocks: &[Arc<Block>], tokens: &[u64], limit: f64) -> Vec<usize> {
    let pins: Vec<usize> = (0..blocks.len()).filter(|&i| counts_as_pin(&blocks[i])).collect();
    let mut pinned: u64 = pins.iter().map(|&i| tokens[i]).sum();
    let mut unpinned = Vec::new();
    let Some((_latest, older)) = pins.split_last() else { return unpinned };
    for &i in older {
        if pinned as f64 <= limit {
            break;
        }
        if blocks[i].injected {
            pinned -= tokens[i];
            unpinned.push(i);
        }
    }
    unpinned
}

/// Protection of every block. `unpinned[i]` marks pins the pinned cap removed.
pub fn protection(blocks: &[Arc<Block>], protect_current_input: bool, unpinned: &[bool]) -> Vec<Protection> {
    let current_input = if protect_current_input { blocks.iter().rposition(|b| b.role == Role::User) } else { None };
    blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if b.is_system_protected() {
                Protection::System
            } else if b.mandatory {
                Protection::Mandatory
            } else if (b.pinned && !unpinned[i]) || current_input == Some(i) {
                Protection::Pinned
            } else {
                Protection::None
            }
        })
        .collect()
}

/// What the plan decided for every block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kept: Vec<bool>,
    pub reasons: Vec<Reason>,
    /// Prompt tokens by the running total (the caller recounts independently).
    pub total: u64,
    /// What the stage-5 repair did (nothing when it did not run).
    pub repair: Repair,
}

/// Protected blocks alone do not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetExceeded {
    pub protected_tokens: u64,
    pub budget: u64,
}

pub struct PlanInput<'a> {
    pub blocks: &'a [Arc<Block>],
    pub tokens: &'a [u64],
    pub groups: &'a Groups,
    pub protection: &'a [Protection],
    pub unpinned: &'a [bool],
    pub budget: u64,
    /// Once a shift is needed (the prompt is over `budget`), removal goes on down to this many
    /// tokens (hysteresis: `target_ratio × budget`); at most `budget`.
    pub target: u64,
    pub prompt_overhead: u64,
    pub start_on_user: bool,
    /// Groups a strategy excludes whatever the budget (by any member, with the earliest member's
    /// reason); protected groups are never excluded.
    pub forced: &'a [(usize, Reason)],
    /// Groups a strategy removes first, in this order, while the prompt is over the target; then
    /// the oldest-first walk goes on.
    pub ranked: &'a [(usize, Reason)],
}

impl<'a> PlanInput<'a> {
    /// The input of the plain `truncate` strategy.
    #[allow(clippy::too_many_arguments)]
    pub fn truncate(
        blocks: &'a [Arc<Block>],
        tokens: &'a [u64],
        groups: &'a Groups,
        protection: &'a [Protection],
        unpinned: &'a [bool],
        budget: u64,
        prompt_overhead: u64,
        start_on_user: bool,
    ) -> Self {
        PlanInput {
            blocks,
            tokens,
            groups,
            protection,
            unpinned,
            budget,
            target: budget,
            prompt_overhead,
            start_on_user,
            forced: &[],
            ranked: &[],
        }
    }
}

/// The plan being made: its fields are private to this module and its child `repair`.
struct Planner<'a> {
    input: &'a PlanInput<'a>,
    kept: Vec<bool>,
    reasons: Vec<Reason>,
    total: u64,
    /// Per group: some member is protected.
    group_protected: Vec<bool>,
}

impl Planner<'_> {
    /// Excludes a whole group: its earliest member carries `reason`, the others `TOOL_GROUP`.
    fn exclude(&mut self, g: usize, reason: Reason) {
        for (k, &i) in self.input.groups.members(g).iter().enumerate() {
            self.kept[i] = false;
            self.reasons[i] = if k == 0 { reason } else { Reason::ToolGroup };
            self.total -= self.input.tokens[i];
        }
    }

    /// Excludes the oldest kept unprotected groups (`BUDGET_OLDEST_FIRST`), skipping `spared`,
    /// while the total is over `limit`; whether it excluded any.
    fn remove_oldest(&mut self, limit: u64, spared: Option<usize>) -> bool {
        let groups = self.input.groups;
        let mut removed = false;
        for g in 0..groups.len() {
            if self.total <= limit {
                break;
            }
            if self.group_protected[g] || !self.kept[groups.members(g)[0]] || Some(g) == spared {
                continue;
            }
            self.exclude(g, Reason::BudgetOldestFirst);
            removed = true;
        }
        removed
    }
}

/// Stages 4–5: orphans out, a strategy's forced and ranked groups, then unprotected groups
/// oldest-first until the prompt fits, then the repair (`repair`). Linear in blocks.
pub fn plan_removal(input: &PlanInput) -> Result<Plan, BudgetExceeded> {
    let n = input.blocks.len();
    let groups = input.groups;
    let mut group_protected = vec![false; groups.len()];
    for (i, p) in input.protection.iter().enumerate() {
        group_protected[groups.group_of[i]] |= *p != Protection::None;
    }
    let mut planner = Planner {
        input,
        kept: vec![true; n],
        reasons: vec![Reason::Fits; n],
        total: input.prompt_overhead + input.tokens.iter().sum::<u64>(),
        group_protected,
    };

    for g in 0..groups.len() {
        if groups.is_orphan(g) && !planner.group_protected[g] {
            planner.exclude(g, Reason::OrphanToolResult);
        }
    }

    // A strategy's exclusions take out history (a message block), which the repair below then
    // tidies; dropping a lorebook or memory entry does not.
    let mut removed_any = false;
    // Excludes block `i`'s group for a strategy, unless it is protected or already out.
    let mut exclude = |planner: &mut Planner, i: usize, reason: Reason| {
        let g = groups.group_of[i];
        if !planner.group_protected[g] && planner.kept[groups.members(g)[0]] {
            removed_any |= groups.members(g).iter().any(|&m| input.blocks[m].kind == Kind::Message);
            planner.exclude(g, reason);
        }
    };
    for &(i, reason) in input.forced {
        exclude(&mut planner, i, reason);
    }

    let limit = if planner.total > input.budget { input.target.min(input.budget) } else { input.budget };
    for &(i, reason) in input.ranked {
        if planner.total <= limit {
            break;
        }
        exclude(&mut planner, i, reason);
    }
    removed_any |= planner.remove_oldest(limit, None);
    if planner.total > input.budget {
        return Err(BudgetExceeded { protected_tokens: planner.total, budget: input.budget });
    }

    let repair = if input.start_on_user && removed_any { repair_start(&mut planner, limit) } else { Repair::default() };

    let Planner { kept, mut reasons, total, group_protected, .. } = planner;
    for i in 0..n {
        if kept[i] {
            reasons[i] = match input.protection[i] {
                Protection::System => Reason::ProtectedSystem,
                Protection::Mandatory => Reason::Mandatory,
                Protection::Pinned => Reason::Pinned,
                Protection::None if group_protected[groups.group_of[i]] => Reason::ToolGroup,
                Protection::None if repair.anchor == Some(i) => Reason::AnchorUserTurn,
                Protection::None => Reason::Fits,
            };
        } else if input.unpinned[i] {
            reasons[i] = Reason::UnpinnedByCap;
        }
    }
    Ok(Plan { kept, reasons, total, repair })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::count::count_blocks;
    use crate::parse::parse_values;
    use crate::profile::profile_by_name;
    use serde_json::{json, Value};

    type Decided = Vec<(String, bool, &'static str)>;

    /// Block tokens under the heuristic profile (which counts all reasoning).
    fn heuristic_tokens(blocks: &[Arc<Block>]) -> Vec<u64> {
        let counts =
            count_blocks(&profile_by_name("heuristic").unwrap(), &blocks.iter().map(|b| &**b).collect::<Vec<_>>());
        counts.iter().map(|c| c.total(true)).collect()
    }

    fn plan(values: Value, budget: u64) -> Result<Decided, BudgetExceeded> {
        plan_with(values, budget, budget, &[], &[])
    }

    fn plan_with(
        values: Value,
        budget: u64,
        target: u64,
        forced: &[(usize, Reason)],
        ranked: &[(usize, Reason)],
    ) -> Result<Decided, BudgetExceeded> {
        let blocks = parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        let tokens = heuristic_tokens(&blocks);
        let groups = Groups::build(&blocks);
        let unpinned = vec![false; blocks.len()];
        let protection = protection(&blocks, true, &unpinned);
        let input = PlanInput {
            target,
            forced,
            ranked,
            ..PlanInput::truncate(&blocks, &tokens, &groups, &protection, &unpinned, budget, 0, true)
        };
        let plan = plan_removal(&input)?;
        Ok(blocks.iter().zip(plan.kept).zip(plan.reasons).map(|((b, k), r)| (b.id.clone(), k, r.as_str())).collect())
    }

    fn plan_repair(values: Value, budget: u64) -> Repair {
        let blocks = parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks;
        let tokens = heuristic_tokens(&blocks);
        let groups = Groups::build(&blocks);
        let unpinned = vec![false; blocks.len()];
        let protection = protection(&blocks, true, &unpinned);
        let input = PlanInput::truncate(&blocks, &tokens, &groups, &protection, &unpinned, budget, 0, true);
        plan_removal(&input).unwrap().repair
    }

    fn reasons(decided: &Decided) -> Vec<&'static str> {
        decided.iter().map(|d| d.2).collect()
    }

    // Five blocks of 5 tokens each: 25 in all.
    fn five() -> Value {
        json!([
            {"id": "sys", "role": "system", "content": "s"},
            {"id": "lore", "role": "system", "kind": "lorebook", "content": "l"},
            {"id": "u1", "role": "user", "content": "a"},
            {"id": "a1", "role": "assistant", "content": "b"},
            {"id": "u2", "role": "user", "content": "c"}
        ])
    }

    // An agent loop: a task, three call/result pairs, a final answer and a question; 5 tokens a
    // block (the calls' empty names and arguments cost nothing), 45 in all.
    fn agent_loop() -> Value {
        let mut blocks = vec![json!({"id": "sys", "role": "system", "content": "s"})];
        blocks.push(json!({"id": "task", "role": "user", "content": "t"}));
        for n in 0..3 {
            let call = json!({"id": format!("c{n}"), "name": "", "arguments": ""});
            blocks.push(json!({"id": format!("a{n}"), "role": "assistant", "content": "x", "tool_calls": [call]}));
            blocks
                .push(json!({"id": format!("r{n}"), "role": "tool", "tool_call_id": format!("c{n}"), "content": "y"}));
        }
        blocks.push(json!({"id": "answer", "role": "assistant", "content": "z"}));
        blocks.push(json!({"id": "question", "role": "user", "content": "q"}));
        Value::Array(blocks)
    }

    fn kept_ids(decided: &Decided) -> Vec<&str> {
        decided.iter().filter(|d| d.1).map(|d| d.0.as_str()).collect()
    }

    #[test]
    fn an_agent_loop_keeps_its_latest_user_turn_as_the_anchor() {
        // Budget 35: the cut takes the task and the first pair (15). Removing every assistant
        // turn would leave [sys, question]; the task comes back and the next pair pays for it.
        let got = plan(agent_loop(), 35).unwrap();
        assert_eq!(kept_ids(&got), ["sys", "task", "a2", "r2", "answer", "question"]);
        assert_eq!(
            reasons(&got),
            [
                "PROTECTED_SYSTEM",
                "ANCHOR_USER_TURN",
                "BUDGET_OLDEST_FIRST",
                "TOOL_GROUP",
                "BUDGET_OLDEST_FIRST",
                "TOOL_GROUP",
                "FITS",
                "FITS",
                "FITS",
                "PINNED"
            ]
        );
        let repair = plan_repair(agent_loop(), 35);
        assert_eq!(repair, Repair { cut_tokens: 35, removed_tokens: 10, anchor: Some(1) });
    }

    #[test]
    fn without_room_for_the_anchor_the_leading_turns_go() {
        // Budget 14: only sys and question fit; the task cannot come back.
        let got = plan(agent_loop(), 14).unwrap();
        assert_eq!(kept_ids(&got), ["sys", "question"]);
        // Budget 15: the task fits beside them once every removable group is gone.
        let got = plan(agent_loop(), 15).unwrap();
        assert_eq!(kept_ids(&got), ["sys", "task", "question"]);
        assert_eq!(reasons(&got)[1], "ANCHOR_USER_TURN");
        assert_eq!(reasons(&got)[8], "BUDGET_OLDEST_FIRST");
    }

    #[test]
    fn the_anchor_must_fit_the_target_once_a_shift_is_needed() {
        // sys 5, a task of 20, answer 5, question 5: 35. The cut takes the task (15).
        let values = json!([
            {"id": "sys", "role": "system", "content": "s"},
            {"id": "task", "role": "user", "content": "t".repeat(64)},
            {"id": "answer", "role": "assistant", "content": "z"},
            {"id": "question", "role": "user", "content": "q"}
        ]);
        // Against the budget (34), the task fits once the answer pays for it (30).
        let plain = plan_with(values.clone(), 34, 34, &[], &[]).unwrap();
        assert_eq!(kept_ids(&plain), ["sys", "task", "question"]);
        // With a target of 20 it would end over the target: the answer goes as before.
        let down = plan_with(values, 34, 20, &[], &[]).unwrap();
        assert_eq!(kept_ids(&down), ["sys", "question"]);
        assert_eq!(reasons(&down)[2], "LEADING_ASSISTANT");
    }

    #[test]
    fn a_kept_user_turn_makes_the_leading_turns_go_as_before() {
        // A user turn between the pairs: the history can start there. The cut takes the task
        // and the first pair (55 -> 40), the repair the second pair.
        let mut values = agent_loop();
        values.as_array_mut().unwrap().insert(6, json!({"id": "more", "role": "user", "content": "m"}));
        let got = plan(values.clone(), 40).unwrap();
        assert_eq!(kept_ids(&got), ["sys", "more", "a2", "r2", "answer", "question"]);
        assert_eq!(reasons(&got)[4], "LEADING_ASSISTANT");
        assert_eq!(plan_repair(values, 40), Repair { cut_tokens: 40, removed_tokens: 10, anchor: None });
    }

    #[test]
    fn a_user_turn_that_carries_tool_results_is_no_anchor() {
        // Anthropic: the results come in user blocks, grouped with their calls; the task is the
        // only user turn, and the current input is the last result (its group protected).
        let values = json!([
            {"id": "task", "role": "user", "content": "t"},
            {"id": "a0", "role": "assistant", "content": [{"type": "tool_use", "id": "c0", "name": "", "input": {}}]},
            {"id": "r0", "role": "user", "content": [{"type": "tool_result", "tool_use_id": "c0", "content": "y"}]},
            {"id": "a1", "role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "", "input": {}}]},
            {"id": "r1", "role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "y"}]},
            {"id": "a2", "role": "assistant", "content": [{"type": "tool_use", "id": "c2", "name": "", "input": {}}]},
            {"id": "r2", "role": "user", "content": [{"type": "tool_result", "tool_use_id": "c2", "content": "y"}]}
        ]);
        let tokens = { heuristic_tokens(&parse_values(values.as_array().unwrap(), 50_000, "blocks").unwrap().blocks) };
        let all: u64 = tokens.iter().sum();
        // Room for all but the first pair: the cut takes the task and that pair, the task comes
        // back in the room the pair left.
        let budget = all - tokens[1] - tokens[2];
        let got = plan(values.clone(), budget).unwrap();
        assert_eq!(kept_ids(&got), ["task", "a1", "r1", "a2", "r2"]);
        assert_eq!(reasons(&got)[..3], ["ANCHOR_USER_TURN", "BUDGET_OLDEST_FIRST", "TOOL_GROUP"]);
        // One token less: the next pair pays for it.
        let got = plan(values, budget - 1).unwrap();
        assert_eq!(kept_ids(&got), ["task", "a2", "r2"]);
    }

    #[test]
    fn a_chat_whose_cut_left_only_the_question_gets_no_anchor() {
        // No leading assistant turn to remove: the repair has nothing to do.
        let got = plan(five(), 10).unwrap();
        assert_eq!(kept_ids(&got), ["sys", "u2"]);
    }

    #[test]
    fn target_applies_only_once_a_shift_is_needed() {
        // Fits the budget: the target does not cut.
        let fits = plan_with(five(), 25, 10, &[], &[]).unwrap();
        assert!(fits.iter().all(|d| d.1));
        // Over the budget (24): removal goes on down to the target (15), not just under 24 (then
        // the repair keeps u1 as the anchor, so the history starts on a user turn, and pays for
        // it with the assistant turn, down to the target again).
        let cut = plan_with(five(), 24, 15, &[], &[]).unwrap();
        assert_eq!(
            reasons(&cut),
            ["PROTECTED_SYSTEM", "BUDGET_OLDEST_FIRST", "ANCHOR_USER_TURN", "BUDGET_OLDEST_FIRST", "PINNED"]
        );
        // Protected blocks over the target but within the budget still succeed.
        let floor = plan_with(five(), 24, 1, &[], &[]).unwrap();
        assert_eq!(reasons(&floor)[0], "PROTECTED_SYSTEM");
        assert_eq!(floor.iter().filter(|d| d.1).count(), 2);
    }

    #[test]
    fn forced_groups_go_even_when_everything_fits_and_never_protected_ones() {
        let got =
            plan_with(five(), 100, 100, &[(3, Reason::ManualExcluded), (0, Reason::ManualExcluded)], &[]).unwrap();
        assert_eq!(reasons(&got), ["PROTECTED_SYSTEM", "FITS", "FITS", "MANUAL_EXCLUDED", "PINNED"]);
    }

    #[test]
    fn ranked_groups_go_first_while_over_then_oldest_first() {
        // 25 tokens, budget 20: the ranked lorebook entry alone is enough.
        let got = plan_with(five(), 20, 20, &[], &[(1, Reason::LowRelevance)]).unwrap();
        assert_eq!(reasons(&got), ["PROTECTED_SYSTEM", "LOW_RELEVANCE", "FITS", "FITS", "PINNED"]);
        // Budget 14: then history, oldest first.
        let more = plan_with(five(), 14, 14, &[], &[(1, Reason::LowRelevance)]).unwrap();
        assert_eq!(
            reasons(&more),
            ["PROTECTED_SYSTEM", "LOW_RELEVANCE", "BUDGET_OLDEST_FIRST", "BUDGET_OLDEST_FIRST", "PINNED"]
        );
        // A ranked lorebook entry alone does not trigger the leading-assistant repair.
        let lore_only = plan_with(
            json!([
                {"id": "lore", "role": "system", "kind": "lorebook", "content": "l"},
                {"id": "greet", "role": "assistant", "content": "hello"},
                {"id": "u", "role": "user", "content": "c"}
            ]),
            12,
            12,
            &[],
            &[(0, Reason::LowRelevance)],
        )
        .unwrap();
        assert_eq!(reasons(&lore_only), ["LOW_RELEVANCE", "FITS", "PINNED"]);
    }

    #[test]
    fn reasons_parse_from_their_codes() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
            assert_eq!(reason as usize, i); // the bindings index their strs by it
        }
        assert_eq!(Reason::parse("NOPE"), None);
    }

    // Every block below costs 4 + 1 = 5 tokens (a short text).
    #[test]
    fn removes_oldest_groups_until_it_fits_and_repairs_the_start() {
        // The cut (30 -> 15) leaves a2 first; removing it would leave no user turn before u2, so
        // u1 comes back as the anchor and a2 pays for it.
        let got = plan(
            json!([
                {"id": "sys", "role": "system", "content": "s"},
                {"id": "u1", "role": "user", "content": "a"},
                {"id": "a1", "role": "assistant", "content": "b", "tool_calls": [{"id": "c1", "name": "", "arguments": ""}]},
                {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "c"},
                {"id": "a2", "role": "assistant", "content": "d"},
                {"id": "u2", "role": "user", "content": "e"}
            ]),
            16,
        )
        .unwrap();
        assert_eq!(
            got,
            [
                ("sys".into(), true, "PROTECTED_SYSTEM"),
                ("u1".into(), true, "ANCHOR_USER_TURN"),
                ("a1".into(), false, "BUDGET_OLDEST_FIRST"),
                ("t1".into(), false, "TOOL_GROUP"),
                ("a2".into(), false, "BUDGET_OLDEST_FIRST"),
                ("u2".into(), true, "PINNED"),
            ]
        );
    }

    #[test]
    fn orphans_go_even_when_everything_fits() {
        let got = plan(
            json!([{"id": "t", "role": "tool", "toolCallId": "gone"}, {"id": "u", "role": "user", "content": "x"}]),
            1000,
        )
        .unwrap();
        assert_eq!(got[0], ("t".into(), false, "ORPHAN_TOOL_RESULT"));
        assert_eq!(got[1], ("u".into(), true, "PINNED"));
    }

    #[test]
    fn protected_alone_over_budget_fails_with_numbers() {
        let err = plan(json!([{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]), 9).unwrap_err();
        assert_eq!(err, BudgetExceeded { protected_tokens: 10, budget: 9 });
    }

    #[test]
    fn pinned_cap_unpins_oldest_injected_but_never_the_latest() {
        let blocks = parse_values(
            json!([
                {"role": "user", "pinned": true, "injected": true},
                {"role": "user", "pinned": true},
                {"role": "user", "pinned": true, "injected": true},
                {"role": "user", "pinned": true, "injected": true}
            ])
            .as_array()
            .unwrap(),
            50_000,
            "blocks",
        )
        .unwrap()
        .blocks;
        assert_eq!(pinned_cap(&blocks, &[10, 10, 10, 10], 15.0), [0, 2]);
        assert_eq!(pinned_cap(&blocks, &[10, 10, 10, 10], 40.0), Vec::<usize>::new());
    }
}
