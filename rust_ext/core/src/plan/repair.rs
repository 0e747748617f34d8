//! Stage 5, the repair (docs/semantics.md §4.5): once a strategy removed history, the history
//! must start on a user turn, as providers expect.
//!
//! 1. The leading groups: the unprotected groups led by an assistant turn that the history would
//!    begin with, one after another (an agent loop's tool calls and their results). None: done.
//! 2. When a user turn is still kept before the current input (the last block with role user),
//!    the leading groups go (`LEADING_ASSISTANT`): a few turns of a chat.
//! 3. Otherwise removing them would empty an agent loop down to its current input. The latest
//!    user turn the budget removed before the current input comes back as the anchor
//!    (`ANCHOR_USER_TURN`); leading groups before it go, and its tokens are paid by removing the
//!    oldest kept groups after it (`BUDGET_OLDEST_FIRST`) down to the plan's limit (the budget,
//!    or the target once a shift is needed). With no such turn, or no room for it under that
//!    limit even with every removable group gone, step 2's removal applies.
//!
//! A user turn is a `message` block with role user alone in its group (an Anthropic user block
//! carrying tool results belongs to its call and is no turn of its own).

use super::{Planner, Reason};
use crate::block::{Kind, Role};

/// What the repair did: what a warning reports when it removed much of what the cut kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repair {
    /// Prompt tokens after the cut, before the repair.
    pub cut_tokens: u64,
    /// Tokens of the blocks the repair removed (leading groups, groups paying for the anchor).
    pub removed_tokens: u64,
    /// The block kept as the anchor.
    pub anchor: Option<usize>,
}

impl Planner<'_> {
    fn is_user_turn(&self, i: usize) -> bool {
        let block = &self.input.blocks[i];
        let groups = self.input.groups;
        block.kind == Kind::Message && block.role == Role::User && groups.members(groups.group_of[i]).len() == 1
    }

    /// Step 1: the leading groups in order, and the first kept history block after them.
    fn leading_groups(&self) -> (Vec<usize>, Option<usize>) {
        let groups = self.input.groups;
        let mut leading = Vec::new();
        let mut is_leading: Vec<bool> = Vec::new(); // per group, allocated once there is one
        for (i, block) in self.input.blocks.iter().enumerate() {
            let g = groups.group_of[i];
            let in_leading = is_leading.get(g).copied().unwrap_or(false);
            if !self.kept[i] || block.kind != Kind::Message || block.role == Role::System || in_leading {
                continue;
            }
            if block.role != Role::Assistant || self.group_protected[g] {
                return (leading, Some(i));
            }
            if is_leading.is_empty() {
                is_leading = vec![false; groups.len()];
            }
            is_leading[g] = true;
            leading.push(g);
        }
        (leading, None)
    }

    /// Step 3's anchor: the latest user turn before `current` the budget removed, if the plan's
    /// `limit` affords it with every kept unprotected group gone.
    fn anchor(&self, current: usize, limit: u64) -> Option<usize> {
        let a = (0..current)
            .rev()
            .find(|&i| !self.kept[i] && self.reasons[i] == Reason::BudgetOldestFirst && self.is_user_turn(i))?;
        let groups = self.input.groups;
        let removable: u64 = (0..self.input.blocks.len())
            .filter(|&i| self.kept[i] && !self.group_protected[groups.group_of[i]])
            .map(|i| self.input.tokens[i])
            .sum();
        (self.total + self.input.tokens[a] - removable <= limit).then_some(a)
    }
}

/// Runs the repair on a plan whose cut brought the total to at most `limit`.
pub(super) fn repair_start(planner: &mut Planner, limit: u64) -> Repair {
    let cut_tokens = planner.total;
    let (leading, first) = planner.leading_groups();
    if leading.is_empty() {
        return Repair { cut_tokens, ..Repair::default() }; // the history starts well already
    }
    let current = planner.input.blocks.iter().rposition(|b| b.role == Role::User);
    let user_turn_kept =
        current.is_some_and(|c| (first.unwrap_or(c)..c).any(|i| planner.kept[i] && planner.is_user_turn(i)));
    let anchor = match current {
        Some(c) if !user_turn_kept => planner.anchor(c, limit),
        _ => None,
    };
    let groups = planner.input.groups;
    let mut added = 0;
    match anchor {
        None => {
            for g in leading {
                planner.exclude(g, Reason::LeadingAssistant);
            }
        }
        Some(a) => {
            for g in leading.into_iter().filter(|&g| groups.members(g)[0] < a) {
                planner.exclude(g, Reason::LeadingAssistant);
            }
            planner.kept[a] = true;
            planner.reasons[a] = Reason::AnchorUserTurn;
            added = planner.input.tokens[a];
            planner.total += added;
            planner.remove_oldest(limit, Some(groups.group_of[a]));
        }
    }
    Repair { cut_tokens, removed_tokens: cut_tokens + added - planner.total, anchor }
}
