//! contextshift-core: the hot path of contextshift, free of any Python types so that
//! `cargo test` runs without an interpreter. The PyO3 bindings in `rust_ext/src` are a thin
//! layer over these functions.
//!
//! The exact behaviour is specified in `docs/semantics.md`.

pub mod audit_blocks;
pub mod block;
pub mod block_cache;
#[cfg(feature = "counting")]
pub mod cache;
#[cfg(feature = "counting")]
pub mod count;
#[cfg(feature = "counting")]
pub mod counter;
pub mod group;
pub mod image;
pub mod image_header;
pub mod json_doc;
pub mod json_spans;
pub mod json_text;
pub mod parse;
pub mod plan;
#[cfg(feature = "postgres")]
pub mod postgres_group;
#[cfg(feature = "counting")]
pub mod profile;
pub mod reasoning;
pub mod relevance;
#[cfg(feature = "sqlite")]
pub mod sqlite_group;
pub mod store_group;
pub mod stored_blocks;
pub mod tools;
pub mod verbatim;
pub mod wire;

pub use block::{Block, Image, Kind, Reasoning, ReasoningSource, Role, ToolCall};
#[cfg(feature = "counting")]
pub use count::{block_tokens, count_blocks, mostly_uncounted};
pub use group::Groups;
pub use parse::{
    extend_conversation, parse_block, parse_conversation, rewrite_block, CharCap, CharCut, Conversation, IdHashes,
    Node, OverCap, Rewrite, Shape, Violation,
};
pub use plan::{pinned_cap, plan_removal, protection, BudgetExceeded, Plan, PlanInput, Protection, Reason, Repair};
#[cfg(feature = "counting")]
pub use profile::{builtin_profiles, clear_caches, profile_by_name, Profile, ProfileError, ProfileInfo};
pub use reasoning::{ReasoningRule, Retention};
