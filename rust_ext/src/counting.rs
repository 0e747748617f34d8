//! Counting: a conversation's `Counts`, counting texts, blocks and tool definitions, the profiles
//! and the count cache.

use crate::boundary::{field_pairs, guarded, invalid_blocks, json_text, not_a_list, profile_named, InvalidTools};
use crate::convert;
use crate::objects::Tupled;
use contextshift_core::cache::{self, CacheStats};
use contextshift_core::count::{batch, block_count, count_texts_fresh, tools_tokens, BlockCount};
use contextshift_core::reasoning;
use contextshift_core::tools::{parse_json_tools, parse_tools};
use contextshift_core::{
    builtin_profiles, clear_caches, parse_block, Block, Node, Profile, ProfileInfo, Retention, Role, Shape, Violation,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::collections::HashMap;
use std::sync::Arc;

/// Block token counts of one conversation under one profile, with its reasoning: each block's
/// reasoning tokens, whether the provider's rule counts them (`retention`), whether the rule lets
/// them be left out, and how they are known.
#[pyclass(frozen, module = "contextshift._core", name = "Counts")]
pub(crate) struct PyCounts {
    pub(crate) profile: Arc<Profile>,
    pub(crate) retention: Retention,
    /// Per block: its tokens in the prompt (its reasoning included when counted).
    pub(crate) tokens: Tupled<u64>,
    pub(crate) reasoning: Tupled<u64>,
    pub(crate) counted: Tupled<bool>,
    pub(crate) clearable: Tupled<bool>,
    pub(crate) basis: Tupled<&'static str>,
    /// Indices of the blocks that carry reasoning (usually few).
    pub(crate) reasoning_blocks: Tupled<usize>,
    /// Indices of the blocks that carry images (usually few).
    pub(crate) image_blocks: Arc<[usize]>,
}

impl PyCounts {
    pub(crate) fn new(
        profile: Arc<Profile>,
        retention: Retention,
        blocks: &[Arc<Block>],
        counts: &[BlockCount],
    ) -> Self {
        let n = blocks.len();
        let (mut reasoning_blocks, mut image_blocks) = (Vec::new(), Vec::new());
        for (i, block) in blocks.iter().enumerate() {
            if !block.reasoning.is_empty() {
                reasoning_blocks.push(i);
            }
            if !block.images.is_empty() {
                image_blocks.push(i);
            }
        }
        let counted = retention.counted(blocks);
        // Per-block reasoning figures, filled in for the few blocks that carry reasoning.
        let (mut reasoning, mut clearable, mut basis) = (vec![0; n], vec![false; n], vec![""; n]);
        let rule = profile.reasoning_rule();
        for &i in &reasoning_blocks {
            reasoning[i] = counts[i].reasoning;
            clearable[i] = rule.clearable(&blocks[i]);
            basis[i] = reasoning::basis(&blocks[i]);
        }
        PyCounts {
            tokens: counts.iter().zip(&counted).map(|(c, &counted)| c.total(counted)).collect(),
            reasoning: reasoning.into(),
            clearable: clearable.into(),
            basis: basis.into(),
            reasoning_blocks: reasoning_blocks.into(),
            image_blocks: image_blocks.into(),
            counted: counted.into(),
            profile,
            retention,
        }
    }

    /// Tokens of `block` (block `index` as parsed, or a rewrite of it) by this profile and rule.
    pub(crate) fn block_tokens(&self, index: usize, block: &Block) -> u64 {
        block_count(&self.profile, block).total(self.counted[index])
    }
}

/// The retention rule named `name` (the model registry's), else the profile's own.
pub(crate) fn retention_of(profile: &Profile, name: Option<&str>) -> PyResult<Retention> {
    match name {
        None => Ok(profile.reasoning_rule().retention),
        Some(name) => Retention::parse(name).ok_or_else(|| {
            PyValueError::new_err(format!("unknown reasoning rule {name:?} (all, current_turn or tool_turns)"))
        }),
    }
}

#[pymethods]
impl PyCounts {
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.tokens.tuple(py)
    }

    #[getter]
    fn profile(&self) -> &str {
        self.profile.name()
    }

    /// The reasoning rule counted by: "all", "current_turn" or "tool_turns".
    #[getter]
    fn reasoning_rule(&self) -> &'static str {
        self.retention.as_str()
    }

    /// Per block: its reasoning's tokens, counted in `tokens` or not.
    #[getter]
    fn reasoning(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.reasoning.tuple(py)
    }

    /// Per block: whether `tokens` counts its reasoning (the provider keeps it in the prompt).
    #[getter]
    fn reasoning_counted(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.counted.tuple(py)
    }

    /// Per block: whether its reasoning may be left out (the provider accepts it missing).
    #[getter]
    fn reasoning_clearable(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.clearable.tuple(py)
    }

    /// Per block: how its reasoning tokens are known ("text", "estimated", "reported"; "" for none).
    #[getter]
    fn reasoning_basis(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.basis.tuple(py)
    }

    /// The same counts with some blocks' tokens replaced (`{index: tokens}`): a strategy that
    /// rewrote those blocks plans with what they cost now.
    fn replaced(&self, overrides: HashMap<usize, u64>) -> PyResult<PyCounts> {
        let mut tokens = self.tokens.to_vec();
        for (i, t) in overrides {
            *tokens.get_mut(i).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range")))? = t;
        }
        Ok(PyCounts {
            profile: self.profile.clone(),
            retention: self.retention,
            tokens: tokens.into(),
            reasoning: self.reasoning.to_vec().into(),
            counted: self.counted.to_vec().into(),
            clearable: self.clearable.to_vec().into(),
            basis: self.basis.to_vec().into(),
            reasoning_blocks: self.reasoning_blocks.to_vec().into(),
            image_blocks: Arc::clone(&self.image_blocks),
        })
    }

    /// Indices of the blocks that carry reasoning, in order.
    #[getter]
    fn reasoning_blocks(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.reasoning_blocks.tuple(py)
    }
}

/// One item of `count_items`: a text borrowed from its Python string (no copy), or a parsed block.
pub(crate) enum Item<'a> {
    Text(&'a str),
    Block(Arc<Block>),
}

/// Token counts of texts (text tokens) and blocks (block tokens) under one profile, each block
/// on its own (its reasoning counted as the rule, or `reasoning`, counts it in a conversation of
/// that block alone). Strings are read in place; the counting runs without the GIL, across cores
/// for a large batch.
#[pyfunction]
#[pyo3(signature = (items, profile, reasoning=None))]
pub(crate) fn count_items(
    py: Python<'_>,
    items: &Bound<'_, PyAny>,
    profile: &str,
    reasoning: Option<&str>,
) -> PyResult<Vec<u64>> {
    guarded(|| {
        let profile = profile_named(py, profile)?;
        let retention = retention_of(&profile, reasoning)?;
        let nodes = convert::sequence(items).map_err(|e| not_a_list("items", e))?;
        let mut violations = Vec::new();
        let mut parsed = Vec::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            match node.shape() {
                Shape::Str(text) => parsed.push(Item::Text(text)),
                Shape::Object => match parse_block(node, i, "items") {
                    Ok(block) => parsed.push(Item::Block(Arc::new(block))),
                    Err(v) => violations.extend(v),
                },
                other => violations.push(Violation {
                    index: i,
                    field: format!("items[{i}]"),
                    description: format!("must be a str or a block dict, got {}", other.type_name()),
                }),
            }
        }
        if !violations.is_empty() {
            return Err(invalid_blocks(violations));
        }
        Ok(py.detach(|| {
            batch(
                &profile,
                &parsed,
                |item| match item {
                    Item::Text(text) => text.len(),
                    Item::Block(block) => block.text_bytes(),
                },
                |item| match item {
                    Item::Text(text) => profile.text_tokens(text),
                    Item::Block(block) => {
                        let counted = retention.counted(std::slice::from_ref(block))[0];
                        block_count(&profile, block).total(counted)
                    }
                },
            )
        }))
    })
}

/// Tokens the tool definitions `tools` (JSON text, or a list of dicts) take under `profile`, by
/// its tool rule; errors (`InvalidTools`) name fields from `field` (`tools_json[2].function.name`).
#[pyfunction]
pub(crate) fn count_tools(py: Python<'_>, tools: &Bound<'_, PyAny>, profile: &str, field: &str) -> PyResult<u64> {
    guarded(|| {
        let profile = profile_named(py, profile)?;
        let invalid = |description| InvalidTools::new_err((vec![(field.to_owned(), description)],));
        let parsed = match json_text(tools).map_err(invalid)? {
            Some(text) => py.detach(|| match text.checked() {
                Ok(text) => parse_json_tools(text, field),
                Err(description) => Err(vec![Violation { index: 0, field: field.to_owned(), description }]),
            }),
            None => parse_tools(&convert::sequence(tools).map_err(invalid)?, field),
        };
        let tools = parsed.map_err(|violations| InvalidTools::new_err((field_pairs(violations),)))?;
        Ok(py.detach(|| tools_tokens(&profile, &tools)))
    })
}

/// Text tokens of each text counted afresh (no count cache), on the calling thread or as a batch
/// (across cores once large enough), without the GIL: what a throughput measurement times.
#[pyfunction]
#[pyo3(signature = (texts, profile, *, as_batch))]
pub(crate) fn count_texts_uncached(
    py: Python<'_>,
    texts: &Bound<'_, PyAny>,
    profile: &str,
    as_batch: bool,
) -> PyResult<Vec<u64>> {
    guarded(|| {
        let profile = profile_named(py, profile)?;
        let nodes = convert::sequence(texts).map_err(|e| not_a_list("texts", e))?;
        let texts = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| match node.shape() {
                Shape::Str(text) => Ok(text),
                other => Err(not_a_list(&format!("texts[{i}]"), format!("must be a str, got {}", other.type_name()))),
            })
            .collect::<PyResult<Vec<&str>>>()?;
        Ok(py.detach(|| count_texts_fresh(&profile, &texts, as_batch)))
    })
}

/// A profile as listings show it: what it is, how exact, where its vocabulary and overheads come
/// from, and under which licence.
#[pyclass(frozen, get_all, module = "contextshift._core", name = "ProfileDescription")]
pub(crate) struct PyProfileDescription {
    pub(crate) name: String,
    pub(crate) approximate: bool,
    pub(crate) exactness: &'static str,
    pub(crate) source: String,
    pub(crate) licence: String,
    pub(crate) vocab_size: Option<u64>,
    /// Framing tokens per message, by role (system, user, assistant, tool).
    pub(crate) message_overhead: Vec<(&'static str, u64)>,
    /// Tokens a participant name adds beyond its text; `None` when the format drops names.
    pub(crate) name_overhead: Option<u64>,
    pub(crate) prompt_overhead: u64,
    pub(crate) image_rule: String,
    pub(crate) overhead_source: String,
    /// Which reasoning sent back is counted: "all", "current_turn" or "tool_turns".
    pub(crate) reasoning_rule: &'static str,
    /// The provider's published rule it follows (or that none is published).
    pub(crate) reasoning_source: String,
}

impl From<&ProfileInfo> for PyProfileDescription {
    fn from(info: &ProfileInfo) -> Self {
        let framing = &info.framing;
        PyProfileDescription {
            name: info.name.clone(),
            approximate: info.approximate(),
            exactness: info.exactness.as_str(),
            source: info.source.clone(),
            licence: info.licence.clone(),
            vocab_size: info.vocab_size,
            message_overhead: [Role::System, Role::User, Role::Assistant, Role::Tool]
                .into_iter()
                .map(|role| (role.as_str(), framing.message_overhead(role)))
                .collect(),
            name_overhead: framing.name,
            prompt_overhead: framing.prompt,
            image_rule: framing.images.describe(),
            overhead_source: info.framing_source.clone(),
            reasoning_rule: framing.reasoning.retention.as_str(),
            reasoning_source: framing.reasoning.source.to_owned(),
        }
    }
}

/// Every built-in profile, described without loading a vocabulary.
#[pyfunction]
pub(crate) fn profiles() -> Vec<PyProfileDescription> {
    builtin_profiles().iter().map(PyProfileDescription::from).collect()
}

/// The profile `name` (built-in or `hf:<path>`), loaded: `InvalidOptions` when it cannot be.
#[pyfunction]
pub(crate) fn describe_profile(py: Python<'_>, name: &str) -> PyResult<PyProfileDescription> {
    guarded(|| Ok(PyProfileDescription::from(profile_named(py, name)?.info())))
}

/// `(hits, misses, entries, capacity_bytes)` of the process-wide count cache.
#[pyfunction]
pub(crate) fn count_cache_stats() -> (u64, u64, usize, usize) {
    let CacheStats { hits, misses, entries, capacity_bytes } = cache::global().stats();
    (hits, misses, entries, capacity_bytes)
}

/// Sets the count cache's memory bound in bytes (0 turns it off).
#[pyfunction]
pub(crate) fn configure_count_cache(capacity_bytes: usize) {
    cache::global().configure(capacity_bytes);
}

/// Empties the count cache (zeroing its counters) and the tokenizers' own memos.
#[pyfunction]
pub(crate) fn clear_count_cache() {
    clear_caches();
    crate::recent_dicts::clear(); // its blocks hold counts too
}
