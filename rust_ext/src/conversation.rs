//! `Conversation`: a parsed request (blocks, cuts, groups, the JSON it came as) and what strategies
//! read of it (`Layout`), and `rewrite_block`.

use crate::boundary::{
    char_cap, guarded, invalid_blocks, json_text, not_a_list, profile_named, InternalError, JsonText,
    TokenBudgetExceeded,
};
use crate::convert;
use crate::counting::{retention_of, PyCounts};
use crate::decisions::PyPlan;
use crate::objects::Tupled;
use crate::recent_dicts;
use contextshift_core::block_cache::{self, read_json_conversation, SharedText};
use contextshift_core::count::BlockCount;
use contextshift_core::group::tool_use_turns;
use contextshift_core::plan::pinned_cap as plan_pinned_cap;
use contextshift_core::plan::Protection;
use contextshift_core::relevance::bm25;
use contextshift_core::verbatim;
use contextshift_core::{
    count_blocks, parse_block, plan_removal, protection, rewrite_block as core_rewrite_block, Block, CharCut, Groups,
    OverCap, PlanInput, Reason, Rewrite,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// `(hits, misses, entries, capacity_bytes)` of the process-wide block cache (blocks read from
/// JSON, looked up by their text).
#[pyfunction]
pub(crate) fn block_cache_stats() -> (u64, u64, usize, usize) {
    let stats = block_cache::global().stats();
    (stats.hits, stats.misses, stats.entries, stats.capacity_bytes)
}

/// Sets the block cache's memory bound in bytes, dropping what it holds (0 turns it off).
#[pyfunction]
pub(crate) fn configure_block_cache(capacity_bytes: usize) {
    block_cache::global().configure(capacity_bytes);
    recent_dicts::clear();
}

/// A parsed request: blocks (after the char cap), the cuts made, the blocks whose reasoning is
/// over the cap, and the tool-call groups.
#[pyclass(frozen, module = "contextshift._core", name = "Conversation")]
pub(crate) struct PyConversation {
    /// Shared with the recent request it was read as (block_cache, recent_dicts).
    pub(crate) blocks: Arc<Vec<Arc<Block>>>,
    pub(crate) cuts: Vec<Arc<CharCut>>,
    pub(crate) over_cap: Vec<OverCap>,
    /// Shared with the block cache's recent requests (for a conversation read from JSON).
    pub(crate) groups: Arc<Groups>,
    /// The input when it came as JSON text, and where each block lies in it: the source of
    /// `json_messages` and `messages_json`.
    pub(crate) json: Option<JsonSource>,
}

pub(crate) struct JsonSource {
    /// Shared with the block cache, which may hold it for the next request's reading. UTF-8: a
    /// source is made only of text the block reader has read, which it checks.
    text: Arc<JsonText>,
    pub(crate) spans: Vec<(usize, usize)>,
}

impl JsonSource {
    pub(crate) fn block_text(&self, index: usize) -> PyResult<&str> {
        let &(start, len) =
            self.spans.get(index).ok_or_else(|| PyValueError::new_err(format!("index {index} out of range")))?;
        let bytes: &[u8] = (*self.text).as_ref();
        // SAFETY: UTF-8 (see the field `text`; a Python `str` or `bytes` never changes), and a span
        // runs from a block's `{` to its `}`, so both ends are char boundaries. Not sliced as a
        // str: its boundary checks read each block's first and last bytes ahead of the copy that
        // reads them (a cache miss each, 8% of a 4 MB reply's shift).
        Ok(unsafe { std::str::from_utf8_unchecked(&bytes[start..start + len]) })
    }
}

/// How a conversation is laid out for a strategy: each block's id, role, kind, tool-call group,
/// protection and tool linkage, by index; each field a tuple in Python.
#[pyclass(frozen, module = "contextshift._core", name = "Layout")]
pub(crate) struct PyLayout {
    pub(crate) ids: Tupled<String>,
    pub(crate) roles: Tupled<&'static str>,
    pub(crate) kinds: Tupled<&'static str>,
    /// Tool-call group numbers, in order of each group's earliest member.
    pub(crate) groups: Tupled<usize>,
    /// "system", "mandatory", "pinned" (the current input too) or "" for an unprotected block.
    pub(crate) protection: Tupled<&'static str>,
    /// Whether the block's group has a protected member.
    pub(crate) group_protected: Tupled<bool>,
    /// Whether the block is an orphan tool result's group (excluded unless protected).
    pub(crate) orphan: Tupled<bool>,
    pub(crate) manual_excluded: Tupled<bool>,
    pub(crate) relevance: Tupled<Option<f64>>,
    /// The calls a block issues, `(id, name)`.
    pub(crate) calls: Tupled<Vec<(String, String)>>,
    /// The ids of the calls a block answers.
    pub(crate) result_ids: Tupled<Vec<String>>,
    /// Where each tool-use turn begins (a run of assistant blocks, one of which calls a tool).
    pub(crate) tool_use_turns: Tupled<usize>,
}

#[pymethods]
impl PyLayout {
    #[getter]
    fn ids(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.ids.tuple(py)
    }
    #[getter]
    fn roles(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.roles.tuple(py)
    }
    #[getter]
    fn kinds(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.kinds.tuple(py)
    }
    #[getter]
    fn groups(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.groups.tuple(py)
    }
    #[getter]
    fn protection(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.protection.tuple(py)
    }
    #[getter]
    fn group_protected(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.group_protected.tuple(py)
    }
    #[getter]
    fn orphan(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.orphan.tuple(py)
    }
    #[getter]
    fn manual_excluded(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.manual_excluded.tuple(py)
    }
    #[getter]
    fn relevance(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.relevance.tuple(py)
    }
    #[getter]
    fn calls(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.calls.tuple(py)
    }
    #[getter]
    fn result_ids(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.result_ids.tuple(py)
    }
    #[getter]
    fn tool_use_turns(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.tool_use_turns.tuple(py)
    }
}

/// One entry of `messages_json`: a kept block by index, or a message's JSON text to put there.
#[derive(FromPyObject)]
pub(crate) enum MessageItem<'py> {
    Index(usize),
    Json(Bound<'py, PyBytes>),
}

impl PyConversation {
    /// `indices` as a mask over the blocks.
    pub(crate) fn mask(&self, indices: Vec<usize>) -> PyResult<Vec<bool>> {
        let mut mask = vec![false; self.blocks.len()];
        for i in indices {
            *mask.get_mut(i).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range")))? = true;
        }
        Ok(mask)
    }

    /// `(index, reason code)` pairs, checked.
    pub(crate) fn reasoned(&self, pairs: Vec<(usize, String)>) -> PyResult<Vec<(usize, Reason)>> {
        pairs
            .into_iter()
            .map(|(i, code)| {
                if i >= self.blocks.len() {
                    return Err(PyValueError::new_err(format!("index {i} out of range")));
                }
                let reason =
                    Reason::parse(&code).ok_or_else(|| PyValueError::new_err(format!("unknown reason {code:?}")))?;
                Ok((i, reason))
            })
            .collect()
    }

    pub(crate) fn selected(&self, indices: &[usize]) -> PyResult<Vec<&Block>> {
        indices
            .iter()
            .map(|&i| {
                self.blocks.get(i).map(|b| &**b).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range")))
            })
            .collect()
    }

    pub(crate) fn json_source(&self) -> PyResult<&JsonSource> {
        self.json.as_ref().ok_or_else(|| PyValueError::new_err("conversation was not read from JSON"))
    }

    pub(crate) fn cut_messages(&self) -> HashMap<usize, &Value> {
        self.cuts.iter().map(|c| (c.index, &c.message)).collect()
    }
}

#[pymethods]
impl PyConversation {
    /// `tool_result_max_chars`: a lower cap for blocks that answer a tool call (None: off).
    /// `profile`: the profile the blocks will be counted with, if known (see `recent_dicts::read`).
    #[new]
    #[pyo3(signature = (blocks, max_block_chars, tool_result_max_chars=None, profile=None))]
    fn new(
        py: Python<'_>,
        blocks: &Bound<'_, PyAny>,
        max_block_chars: usize,
        tool_result_max_chars: Option<usize>,
        profile: Option<&str>,
    ) -> PyResult<Self> {
        guarded(|| {
            let nodes = convert::sequence(blocks).map_err(|e| not_a_list("blocks", e))?;
            let cap = char_cap(max_block_chars, tool_result_max_chars);
            let counted_with = profile.map(|name| profile_named(py, name)).transpose()?;
            let (conv, groups) =
                recent_dicts::read(py, &nodes, cap, counted_with.as_deref()).map_err(invalid_blocks)?;
            Ok(PyConversation { blocks: conv.blocks, cuts: conv.cuts, over_cap: conv.over_cap, groups, json: None })
        })
    }

    /// Parses a JSON array of blocks (the caller's own message JSON), entirely without the GIL.
    #[staticmethod]
    #[pyo3(signature = (text, max_block_chars, tool_result_max_chars=None))]
    fn from_json(
        py: Python<'_>,
        text: &Bound<'_, PyAny>,
        max_block_chars: usize,
        tool_result_max_chars: Option<usize>,
    ) -> PyResult<Self> {
        guarded(|| {
            let text = json_text(text)
                .and_then(|text| text.ok_or_else(|| "must be str or bytes".to_owned()))
                .map_err(|e| not_a_list("blocks_json", e))?;
            let text = Arc::new(text);
            py.detach(|| {
                let cap = char_cap(max_block_chars, tool_result_max_chars);
                let shared: SharedText = Arc::clone(&text) as SharedText;
                let (parsed, groups) = read_json_conversation(&shared, cap, "blocks_json", block_cache::global())?;
                let conv = parsed.conversation;
                let json = Some(JsonSource { text, spans: parsed.spans });
                Ok(PyConversation { blocks: conv.blocks, cuts: conv.cuts, over_cap: conv.over_cap, groups, json })
            })
            .map_err(invalid_blocks)
        })
    }

    /// The messages of the given blocks, for a conversation read by `from_json`, as dicts: the
    /// parsed JSON, with the char cap's cut text in place.
    fn json_messages<'py>(&self, py: Python<'py>, indices: Vec<usize>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        guarded(|| {
            let json = self.json_source()?;
            let cut_messages = self.cut_messages();
            indices
                .iter()
                .map(|&i| match cut_messages.get(&i) {
                    Some(message) => convert::value_to_py(py, message),
                    None => {
                        let value: Value = serde_json::from_str(json.block_text(i)?)
                            .map_err(|e| InternalError::new_err(format!("block {i} no longer parses: {e}")))?;
                        convert::value_to_py(py, &value)
                    }
                })
                .collect()
        })
    }

    /// The same messages as one JSON array text in UTF-8: each block's own text from the input
    /// (the char cap's cut blocks re-serialized), so nothing is re-encoded. An item given as
    /// bytes is a message's JSON text put in its place (a rewritten block, a summary).
    fn messages_json<'py>(&self, py: Python<'py>, items: Vec<MessageItem<'py>>) -> PyResult<Bound<'py, PyBytes>> {
        guarded(|| {
            let json = self.json_source()?;
            let cut_texts: HashMap<usize, String> =
                self.cuts.iter().map(|c| (c.index, c.message.to_string())).collect();
            let parts = items
                .iter()
                .map(|item| match item {
                    MessageItem::Json(text) => Ok(text.as_bytes()),
                    MessageItem::Index(i) => match cut_texts.get(i) {
                        Some(text) => Ok(text.as_bytes()),
                        None => json.block_text(*i).map(str::as_bytes),
                    },
                })
                .collect::<PyResult<Vec<&[u8]>>>()?;
            // Written straight into the bytes object, sized once and not zeroed first: the kept
            // text is copied once.
            let len = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().max(1) + 1;
            PyBytes::new_with_writer(py, len, |out| {
                out.write_bytes(b"[")?;
                for (k, part) in parts.iter().enumerate() {
                    if k > 0 {
                        out.write_bytes(b",")?;
                    }
                    out.write_bytes(part)?;
                }
                out.write_bytes(b"]")
            })
        })
    }

    fn __len__(&self) -> usize {
        self.blocks.len()
    }

    /// The id of block `index` (given, or `#<index>`).
    fn block_id(&self, index: usize) -> PyResult<&str> {
        self.blocks
            .get(index)
            .map(|b| b.id.as_str())
            .ok_or_else(|| PyValueError::new_err(format!("index {index} out of range")))
    }

    /// Block tokens under `profile`, its reasoning counted by the profile's rule or by `reasoning`
    /// (a rule's name, the model registry's). `known` gives counts already known for this profile
    /// (stored with a chat's history) for the first blocks, None where not: only the other blocks,
    /// those the char cap cut (a known count is of the whole block) and those with reasoning (whose
    /// count depends on the turns after them) are counted.
    #[pyo3(signature = (profile, known=None, reasoning=None))]
    fn count(
        &self,
        py: Python<'_>,
        profile: &str,
        known: Option<Vec<Option<u64>>>,
        reasoning: Option<&str>,
    ) -> PyResult<PyCounts> {
        guarded(|| {
            let profile = profile_named(py, profile)?;
            let retention = retention_of(&profile, reasoning)?;
            let Some(known) = known else {
                let counts =
                    py.detach(|| count_blocks(&profile, &self.blocks.iter().map(|b| &**b).collect::<Vec<_>>()));
                return Ok(PyCounts::new(profile, retention, &self.blocks, &counts));
            };
            if known.len() > self.blocks.len() {
                return Err(PyValueError::new_err(format!(
                    "{} known counts for {} blocks",
                    known.len(),
                    self.blocks.len()
                )));
            }
            let mut counts: Vec<Option<BlockCount>> =
                known.into_iter().map(|k| k.map(|base| BlockCount { base, reasoning: 0 })).collect();
            counts.resize(self.blocks.len(), None);
            for cut in &self.cuts {
                counts[cut.index] = None;
            }
            for (count, block) in counts.iter_mut().zip(self.blocks.iter()) {
                if !block.reasoning.is_empty() {
                    *count = None;
                }
            }
            let missing: Vec<usize> = (0..counts.len()).filter(|&i| counts[i].is_none()).collect();
            let counted =
                py.detach(|| count_blocks(&profile, &missing.iter().map(|&i| &*self.blocks[i]).collect::<Vec<_>>()));
            for (&i, count) in missing.iter().zip(counted) {
                counts[i] = Some(count);
            }
            let counts: Vec<BlockCount> = counts.into_iter().map(Option::unwrap_or_default).collect();
            Ok(PyCounts::new(profile, retention, &self.blocks, &counts))
        })
    }

    /// The given blocks' own JSON text from the input, as it came (before any char cap cut), for
    /// a conversation read by `from_json`.
    fn json_texts(&self, indices: Vec<usize>) -> PyResult<Vec<&str>> {
        guarded(|| {
            let json = self.json_source()?;
            indices.iter().map(|&i| json.block_text(i)).collect()
        })
    }

    /// Stage 3: indices of the injected pins to unpin so pins take at most `limit` tokens.
    fn pinned_cap(&self, counts: &PyCounts, limit: f64) -> PyResult<Vec<usize>> {
        guarded(|| Ok(plan_pinned_cap(&self.blocks, &counts.tokens, limit)))
    }

    /// Stages 4–5: orphans out, then the blocks whose reasoning is over the char cap and the
    /// strategy's `forced` groups (`(index, reason)`, whatever the budget), then while over budget
    /// its `ranked` groups in order and the oldest groups, down to `target` (default `budget`),
    /// then the leading-assistant repair. Raises `TokenBudgetExceeded` when protected blocks alone
    /// exceed `budget`.
    #[pyo3(signature = (counts, *, budget, unpinned=Vec::new(), protect_current_input=true, start_on_user=true, target=None, forced=Vec::new(), ranked=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        py: Python<'_>,
        counts: &PyCounts,
        budget: u64,
        unpinned: Vec<usize>,
        protect_current_input: bool,
        start_on_user: bool,
        target: Option<u64>,
        forced: Vec<(usize, String)>,
        ranked: Vec<(usize, String)>,
    ) -> PyResult<PyPlan> {
        guarded(|| {
            let n = self.blocks.len();
            if counts.tokens.len() != n {
                return Err(PyValueError::new_err(format!("{} counts for {n} blocks", counts.tokens.len())));
            }
            let unpinned_mask = self.mask(unpinned)?;
            let over_cap = self.over_cap.iter().map(|o| (o.index, Reason::ReasoningOverCap));
            let forced: Vec<(usize, Reason)> = over_cap.chain(self.reasoned(forced)?).collect();
            let ranked = self.reasoned(ranked)?;
            let plan = py.detach(|| {
                let protection = protection(&self.blocks, protect_current_input, &unpinned_mask);
                plan_removal(&PlanInput {
                    target: target.unwrap_or(budget),
                    forced: &forced,
                    ranked: &ranked,
                    ..PlanInput::truncate(
                        &self.blocks,
                        &counts.tokens,
                        &self.groups,
                        &protection,
                        &unpinned_mask,
                        budget,
                        counts.profile.prompt_overhead(),
                        start_on_user,
                    )
                })
            });
            let plan = plan.map_err(|e| TokenBudgetExceeded::new_err((e.protected_tokens, e.budget)))?;
            Ok(PyPlan::new(Arc::clone(&self.blocks), plan, counts.tokens.to_vec()))
        })
    }

    /// Stage 6: prompt tokens of the given blocks, counted afresh from their content under the
    /// profile and reasoning rule of `counts`.
    fn recount(&self, py: Python<'_>, counts: &PyCounts, indices: Vec<usize>) -> PyResult<u64> {
        guarded(|| {
            let selected = self.selected(&indices)?;
            let profile = &counts.profile;
            Ok(py.detach(|| {
                let fresh = count_blocks(profile, &selected);
                let tokens: u64 = fresh.iter().zip(&indices).map(|(c, &i)| c.total(counts.counted[i])).sum();
                profile.prompt_overhead() + tokens
            }))
        })
    }

    /// Tokens of rewritten blocks (`(index, message)`: block `index` sent as `message`), counted
    /// as `counts` counts that block (its reasoning by the same rule).
    fn count_rewrites(&self, counts: &PyCounts, items: Vec<(usize, Bound<'_, PyAny>)>) -> PyResult<Vec<u64>> {
        guarded(|| {
            items
                .iter()
                .map(|(i, message)| {
                    if *i >= self.blocks.len() {
                        return Err(PyValueError::new_err(format!("index {i} out of range")));
                    }
                    let block =
                        parse_block(&convert::PyNode(message.as_borrowed()), *i, "blocks").map_err(invalid_blocks)?;
                    Ok(counts.block_tokens(*i, &block))
                })
                .collect()
        })
    }

    /// Blocks over the char cap whose reasoning alone leaves no room (reasoning is never cut):
    /// `(index, reasoning characters, cap)`. Plans leave them out whole unless protected.
    #[getter]
    fn over_cap(&self) -> Vec<(usize, usize, usize)> {
        self.over_cap.iter().map(|o| (o.index, o.reasoning_chars, o.cap)).collect()
    }

    /// The layout strategies see: ids, roles, kinds, groups, protection and tool linkage.
    #[pyo3(signature = (unpinned, *, protect_current_input))]
    fn layout(&self, py: Python<'_>, unpinned: Vec<usize>, protect_current_input: bool) -> PyResult<PyLayout> {
        guarded(|| {
            let unpinned = self.mask(unpinned)?;
            Ok(py.detach(|| {
                let protection = protection(&self.blocks, protect_current_input, &unpinned);
                let mut group_protected = vec![false; self.groups.len()];
                for (i, p) in protection.iter().enumerate() {
                    group_protected[self.groups.group_of[i]] |= *p != Protection::None;
                }
                let blocks = &self.blocks;
                PyLayout {
                    ids: blocks.iter().map(|b| b.id.clone()).collect(),
                    roles: blocks.iter().map(|b| b.role.as_str()).collect(),
                    kinds: blocks.iter().map(|b| b.kind.as_str()).collect(),
                    groups: self.groups.group_of.clone().into(),
                    protection: protection
                        .iter()
                        .map(|p| match p {
                            Protection::None => "",
                            Protection::System => "system",
                            Protection::Mandatory => "mandatory",
                            Protection::Pinned => "pinned",
                        })
                        .collect(),
                    group_protected: self.groups.group_of.iter().map(|&g| group_protected[g]).collect(),
                    orphan: self.groups.group_of.iter().map(|&g| self.groups.is_orphan(g)).collect(),
                    manual_excluded: blocks.iter().map(|b| b.manual_excluded).collect(),
                    relevance: blocks.iter().map(|b| b.relevance).collect(),
                    calls: blocks
                        .iter()
                        .map(|b| b.calls.iter().map(|c| (c.id.clone(), c.name.clone())).collect())
                        .collect(),
                    result_ids: blocks.iter().map(|b| b.result_ids.to_vec()).collect(),
                    tool_use_turns: tool_use_turns(blocks).into(),
                }
            }))
        })
    }

    /// Each given block's text: its text pieces joined by newlines (no names, calls or images).
    fn texts(&self, indices: Vec<usize>) -> PyResult<Vec<String>> {
        guarded(|| Ok(self.selected(&indices)?.iter().map(|b| b.pieces.join("\n")).collect()))
    }

    /// For each of `needles`, whether the given blocks (their text pieces and calls) or `extra`
    /// texts hold it verbatim, whitespace runs counted as one space: the facts a prompt keeps.
    fn found_in(
        &self,
        py: Python<'_>,
        indices: Vec<usize>,
        needles: Vec<String>,
        extra: Vec<String>,
    ) -> PyResult<Vec<bool>> {
        guarded(|| {
            let blocks = self.selected(&indices)?;
            Ok(py.detach(|| {
                let pieces = blocks.iter().flat_map(|b| {
                    let calls = b.calls.iter().flat_map(|c| [c.name.as_str(), c.arguments.as_str()]);
                    b.pieces.iter().map(String::as_str).chain(calls)
                });
                let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
                verbatim::found_in(extra.iter().map(String::as_str).chain(pieces), &needles)
            }))
        })
    }

    /// BM25 relevance of each given block's text to `query` (document frequencies over these
    /// blocks).
    fn bm25(&self, py: Python<'_>, query: &str, indices: Vec<usize>) -> PyResult<Vec<f64>> {
        guarded(|| {
            let texts: Vec<String> = self.selected(&indices)?.iter().map(|b| b.pieces.join(" ")).collect();
            Ok(py.detach(|| bm25(query, &texts.iter().map(String::as_str).collect::<Vec<_>>())))
        })
    }

    /// Blocks the char cap cut: `(index, id, tokens before, tokens after, the block's message with
    /// the cut text in place)`, counted as `counts` counts them.
    #[allow(clippy::type_complexity)]
    fn cuts<'py>(
        &self,
        py: Python<'py>,
        counts: &PyCounts,
    ) -> PyResult<Vec<(usize, &str, u64, u64, Bound<'py, PyAny>)>> {
        guarded(|| {
            self.cuts
                .iter()
                .map(|cut| {
                    let before = counts.block_tokens(cut.index, &cut.original);
                    let after = counts.block_tokens(cut.index, &self.blocks[cut.index]);
                    Ok((cut.index, cut.original.id.as_str(), before, after, convert::value_to_py(py, &cut.message)?))
                })
                .collect()
        })
    }
}

/// `message` (a block dict) with its text replaced by `text` when given, the arguments of the
/// calls `clear_calls` emptied, and with `clear_reasoning` its reasoning parts and fields removed,
/// in whatever shape the block came (see the core's `rewrite_block`). `InvalidBlocks` when it is
/// not a valid block.
#[pyfunction]
#[pyo3(signature = (message, text, clear_calls=Vec::new(), clear_reasoning=false))]
pub(crate) fn rewrite_block<'py>(
    py: Python<'py>,
    message: &Bound<'py, PyAny>,
    text: Option<&str>,
    clear_calls: Vec<String>,
    clear_reasoning: bool,
) -> PyResult<Bound<'py, PyAny>> {
    guarded(|| {
        let calls: Vec<&str> = clear_calls.iter().map(String::as_str).collect();
        let how = Rewrite { text, clear_calls: &calls, clear_reasoning };
        let value =
            core_rewrite_block(&convert::PyNode(message.as_borrowed()), 0, "message", how).map_err(invalid_blocks)?;
        convert::value_to_py(py, &value)
    })
}
