//! `contextshift._core`: thin PyO3 bindings over `contextshift-core`.
//!
//! Every entry point copies its inputs into owned Rust data, does the work with the GIL
//! released, and maps errors to the specific exceptions of `contextshift.errors`. A Rust
//! panic becomes `contextshift.errors.InternalError` here, at the boundary: pyo3's own
//! `PanicException` derives from `BaseException`, which servers such as grpcio do not answer.

mod convert;

use contextshift_core::cache::{self, CacheStats};
use contextshift_core::count::{batch, block_count, count_texts_fresh, tools_tokens, BlockCount};
use contextshift_core::json_doc::parse_json_blocks;
use contextshift_core::plan::pinned_cap as plan_pinned_cap;
use contextshift_core::plan::Protection;
use contextshift_core::reasoning;
use contextshift_core::relevance::bm25;
use contextshift_core::tools::{parse_json_tools, parse_tools};
use contextshift_core::verbatim;
use contextshift_core::wire;
use contextshift_core::{
    builtin_profiles, clear_caches, count_blocks, parse_block, parse_conversation, plan_removal, profile_by_name,
    protection, rewrite_block as core_rewrite_block, Block, CharCap, CharCut, Groups, Node, OverCap, PlanInput,
    Profile, ProfileError, ProfileInfo, Reason, Repair, Retention, Rewrite, Role, Shape, Violation,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use serde_json::Value;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

pyo3::import_exception!(contextshift.errors, InvalidBlocks);
pyo3::import_exception!(contextshift.errors, InvalidOptions);
pyo3::import_exception!(contextshift.errors, InvalidTools);
pyo3::import_exception!(contextshift.errors, TokenBudgetExceeded);
pyo3::import_exception!(contextshift.errors, InternalError);

/// Runs `f`, turning a panic into `InternalError` with the panic message.
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(InternalError::new_err(format!("contextshift core panicked: {message}")))
    })
}

/// The list argument `name` is not a list at all.
fn not_a_list(name: &str, description: String) -> PyErr {
    InvalidBlocks::new_err((vec![(name.to_owned(), description)],))
}

fn invalid_blocks(violations: Vec<Violation>) -> PyErr {
    InvalidBlocks::new_err((field_pairs(violations),))
}

fn field_pairs(violations: Vec<Violation>) -> Vec<(String, String)> {
    violations.into_iter().map(|v| (v.field, v.description)).collect()
}

/// JSON text given as `str` or UTF-8 `bytes` (None for anything else), or what is wrong with it.
fn json_text(text: &Bound<'_, PyAny>) -> Result<Option<String>, String> {
    if let Ok(s) = text.cast::<PyString>() {
        Ok(Some(s.to_str().map_err(|e| format!("not Unicode text: {e}"))?.to_owned()))
    } else if let Ok(b) = text.cast::<PyBytes>() {
        let text = simdutf8::compat::from_utf8(b.as_bytes()).map_err(|e| format!("not UTF-8: {e}"))?;
        Ok(Some(text.to_owned()))
    } else {
        Ok(None)
    }
}

/// The char cap of a conversation: `max_block_chars` for every block, and a tool result's own
/// cap when one is given.
fn char_cap(max_block_chars: usize, tool_result_max_chars: Option<usize>) -> CharCap {
    CharCap { block: max_block_chars, tool_result: tool_result_max_chars.unwrap_or(max_block_chars) }
}

/// The profile `name` (loaded on first use, without the GIL: a vocabulary or a tokenizer.json
/// takes a while); an unknown or unloadable profile is `InvalidOptions` on field `profile`.
fn profile_named(py: Python<'_>, name: &str) -> PyResult<Arc<Profile>> {
    py.detach(|| profile_by_name(name))
        .map_err(|e: ProfileError| InvalidOptions::new_err((vec![("profile".to_owned(), e.to_string())],)))
}

/// `reason`'s code as an interned Python str, made once per code (a plan has a decision per block).
fn reason_str(py: Python<'_>, reason: Reason) -> &Bound<'_, PyString> {
    static CODES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
    let codes =
        CODES.get_or_init(py, || Reason::ALL.iter().map(|r| PyString::intern(py, r.as_str()).unbind()).collect());
    codes[reason as usize].bind(py)
}

/// Pauses Python's cyclic garbage collector while it lives. Building one decision object per
/// block (100k for a long history) would otherwise trigger collections that walk the caller's
/// whole heap, again and again: measured, 71 ms instead of 12 ms at 100k blocks. The objects
/// built meanwhile hold only strings and ints, so they cannot form cycles.
struct GcPause {
    was_enabled: bool,
}

impl GcPause {
    fn new(_py: Python<'_>) -> Self {
        // SAFETY: the GIL is held (the `Python` token proves it).
        GcPause { was_enabled: unsafe { pyo3::ffi::PyGC_Disable() } == 1 }
    }
}

impl Drop for GcPause {
    fn drop(&mut self) {
        if self.was_enabled {
            // SAFETY: dropped in the same GIL-holding scope that created it.
            unsafe { pyo3::ffi::PyGC_Enable() };
        }
    }
}

/// A parsed request: blocks (after the char cap), the cuts made, the blocks whose reasoning is
/// over the cap, and the tool-call groups.
#[pyclass(frozen, module = "contextshift._core")]
struct Conversation {
    blocks: Vec<Block>,
    cuts: Vec<CharCut>,
    over_cap: Vec<OverCap>,
    groups: Groups,
    /// The input when it came as JSON text, and where each block lies in it: the source of
    /// `json_messages` and `messages_json`.
    json: Option<JsonSource>,
}

struct JsonSource {
    text: String,
    spans: Vec<(usize, usize)>,
}

impl JsonSource {
    fn block_text(&self, index: usize) -> PyResult<&str> {
        let &(start, len) =
            self.spans.get(index).ok_or_else(|| PyValueError::new_err(format!("index {index} out of range")))?;
        Ok(&self.text[start..start + len])
    }
}

/// A vector with its Python tuple, made on the first read and the same tuple after. Strategies
/// index these in loops: a new list per read made those loops quadratic (a 100k-block
/// `summarize` took minutes, `clear-tool-results` 39 s). Rust code reads it as a slice.
struct Tupled<T> {
    items: Vec<T>,
    tuple: PyOnceLock<Py<PyTuple>>,
}

impl<T> From<Vec<T>> for Tupled<T> {
    fn from(items: Vec<T>) -> Self {
        Tupled { items, tuple: PyOnceLock::new() }
    }
}

impl<T> FromIterator<T> for Tupled<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        items.into_iter().collect::<Vec<T>>().into()
    }
}

impl<T> std::ops::Deref for Tupled<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<T> Tupled<T> {
    fn tuple<'py>(&self, py: Python<'py>) -> PyResult<Py<PyTuple>>
    where
        T: IntoPyObject<'py> + Clone,
    {
        let made =
            self.tuple.get_or_try_init(py, || PyTuple::new(py, self.items.iter().cloned()).map(Bound::unbind))?;
        Ok(made.clone_ref(py))
    }
}

/// Block token counts of one conversation under one profile, with its reasoning: each block's
/// reasoning tokens, whether the provider's rule counts them (`retention`), whether the rule lets
/// them be left out, and how they are known.
#[pyclass(frozen, module = "contextshift._core")]
struct Counts {
    profile: Arc<Profile>,
    retention: Retention,
    /// Per block: its tokens in the prompt (its reasoning included when counted).
    tokens: Tupled<u64>,
    reasoning: Tupled<u64>,
    counted: Tupled<bool>,
    clearable: Tupled<bool>,
    basis: Tupled<&'static str>,
    /// Indices of the blocks that carry reasoning (usually few).
    reasoning_blocks: Tupled<usize>,
}

impl Counts {
    fn new(profile: Arc<Profile>, retention: Retention, blocks: &[Block], counts: &[BlockCount]) -> Self {
        let n = blocks.len();
        let reasoning_blocks: Vec<usize> = (0..n).filter(|&i| !blocks[i].reasoning.is_empty()).collect();
        let counted = retention.counted(blocks);
        // Per-block reasoning figures, filled in for the few blocks that carry reasoning.
        let (mut reasoning, mut clearable, mut basis) = (vec![0; n], vec![false; n], vec![""; n]);
        let rule = profile.reasoning_rule();
        for &i in &reasoning_blocks {
            reasoning[i] = counts[i].reasoning;
            clearable[i] = rule.clearable(&blocks[i]);
            basis[i] = reasoning::basis(&blocks[i]);
        }
        Counts {
            tokens: counts.iter().zip(&counted).map(|(c, &counted)| c.total(counted)).collect(),
            reasoning: reasoning.into(),
            clearable: clearable.into(),
            basis: basis.into(),
            reasoning_blocks: reasoning_blocks.into(),
            counted: counted.into(),
            profile,
            retention,
        }
    }

    /// Tokens of `block` (block `index` as parsed, or a rewrite of it) by this profile and rule.
    fn block_tokens(&self, index: usize, block: &Block) -> u64 {
        block_count(&self.profile, block).total(self.counted[index])
    }
}

/// The retention rule named `name` (the model registry's), else the profile's own.
fn retention_of(profile: &Profile, name: Option<&str>) -> PyResult<Retention> {
    match name {
        None => Ok(profile.reasoning_rule().retention),
        Some(name) => Retention::parse(name).ok_or_else(|| {
            PyValueError::new_err(format!("unknown reasoning rule {name:?} (all, current_turn or tool_turns)"))
        }),
    }
}

#[pymethods]
impl Counts {
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
    fn replaced(&self, overrides: HashMap<usize, u64>) -> PyResult<Counts> {
        let mut tokens = self.tokens.to_vec();
        for (i, t) in overrides {
            *tokens.get_mut(i).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range")))? = t;
        }
        Ok(Counts {
            profile: self.profile.clone(),
            retention: self.retention,
            tokens: tokens.into(),
            reasoning: self.reasoning.to_vec().into(),
            counted: self.counted.to_vec().into(),
            clearable: self.clearable.to_vec().into(),
            basis: self.basis.to_vec().into(),
            reasoning_blocks: self.reasoning_blocks.to_vec().into(),
        })
    }

    /// Indices of the blocks that carry reasoning, in order.
    #[getter]
    fn reasoning_blocks(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.reasoning_blocks.tuple(py)
    }
}

/// How a conversation is laid out for a strategy: each block's id, role, kind, tool-call group,
/// protection and tool linkage, by index; each field a tuple in Python.
#[pyclass(frozen, module = "contextshift._core")]
struct Layout {
    ids: Tupled<String>,
    roles: Tupled<&'static str>,
    kinds: Tupled<&'static str>,
    /// Tool-call group numbers, in order of each group's earliest member.
    groups: Tupled<usize>,
    /// "system", "mandatory", "pinned" (the current input too) or "" for an unprotected block.
    protection: Tupled<&'static str>,
    /// Whether the block's group has a protected member.
    group_protected: Tupled<bool>,
    /// Whether the block is an orphan tool result's group (excluded unless protected).
    orphan: Tupled<bool>,
    manual_excluded: Tupled<bool>,
    relevance: Tupled<Option<f64>>,
    /// The calls a block issues, `(id, name)`.
    calls: Tupled<Vec<(String, String)>>,
    /// The ids of the calls a block answers.
    result_ids: Tupled<Vec<String>>,
    /// Where each tool-use turn begins (a run of assistant blocks, one of which calls a tool).
    tool_use_turns: Tupled<usize>,
}

#[pymethods]
impl Layout {
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

/// Where each tool-use turn begins: a run of consecutive assistant blocks (one response's items,
/// or one message) of which some block calls a tool.
fn tool_use_turns(blocks: &[Block]) -> Vec<usize> {
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

/// One entry of `messages_json`: a kept block by index, or a message's JSON text to put there.
#[derive(FromPyObject)]
enum MessageItem<'py> {
    Index(usize),
    Json(Bound<'py, PyBytes>),
}

/// A block kept or excluded, with its tokens and a stable reason code.
#[pyclass(frozen, eq, module = "contextshift")]
struct BlockDecision {
    id: Py<PyString>,
    tokens: u64,
    reason: Py<PyString>,
}

impl PartialEq for BlockDecision {
    fn eq(&self, other: &Self) -> bool {
        Python::attach(|py| {
            self.tokens == other.tokens
                && self.id.bind(py).to_str().ok() == other.id.bind(py).to_str().ok()
                && self.reason.bind(py).to_str().ok() == other.reason.bind(py).to_str().ok()
        })
    }
}

#[pymethods]
impl BlockDecision {
    #[new]
    fn new(id: Bound<'_, PyString>, tokens: u64, reason: Bound<'_, PyString>) -> Self {
        BlockDecision { id: id.unbind(), tokens, reason: reason.unbind() }
    }

    #[getter]
    fn id(&self, py: Python<'_>) -> Py<PyString> {
        self.id.clone_ref(py)
    }

    #[getter]
    fn tokens(&self) -> u64 {
        self.tokens
    }

    #[getter]
    fn reason(&self, py: Python<'_>) -> Py<PyString> {
        self.reason.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "BlockDecision(id={}, tokens={}, reason={})",
            self.id.bind(py).repr()?,
            self.tokens,
            self.reason.bind(py).repr()?
        ))
    }
}

/// The outcome of the removal plan: indices in block order, and the decisions, which become
/// Python objects only when asked for (a server encodes them straight from here).
#[pyclass(frozen, module = "contextshift._core")]
struct Plan {
    conversation: Py<Conversation>,
    kept: Tupled<usize>,
    excluded: Tupled<usize>,
    #[pyo3(get)]
    total: u64,
    /// What the repair did (contextshift_core::repair).
    repair: Repair,
    /// Per block.
    tokens: Vec<u64>,
    reasons: Vec<Reason>,
    kept_decisions: PyOnceLock<Py<PyList>>,
    excluded_decisions: PyOnceLock<Py<PyList>>,
}

impl Plan {
    fn decisions(&self, py: Python<'_>, indices: &[usize]) -> PyResult<Py<PyList>> {
        let blocks = &self.conversation.get().blocks;
        let _paused = GcPause::new(py);
        let items = indices.iter().map(|&i| {
            let id = PyString::new(py, &blocks[i].id).unbind();
            let reason = reason_str(py, self.reasons[i]).clone().unbind();
            let decision = Py::new(py, BlockDecision { id, tokens: self.tokens[i], reason })?;
            // It holds two strs and an int, so it can be in no cycle: out of the collector's
            // sight, 100k decisions no longer bring on full collections of the caller's heap.
            // SAFETY: the GIL is held and the object is fully initialised.
            unsafe { pyo3::ffi::PyObject_GC_UnTrack(decision.as_ptr().cast()) };
            Ok(decision)
        });
        Ok(PyList::new(py, items.collect::<PyResult<Vec<_>>>()?)?.unbind())
    }
}

#[pymethods]
impl Plan {
    /// Indices of the kept blocks, in order.
    #[getter]
    fn kept(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.kept.tuple(py)
    }

    /// Indices of the excluded blocks, in order.
    #[getter]
    fn excluded(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        self.excluded.tuple(py)
    }

    /// The prompt's tokens after the cut, before the repair (stage 5).
    #[getter]
    fn cut_tokens(&self) -> u64 {
        self.repair.cut_tokens
    }

    /// The tokens of the blocks the repair removed.
    #[getter]
    fn repair_removed(&self) -> u64 {
        self.repair.removed_tokens
    }

    /// The user turn the repair kept as the anchor (ANCHOR_USER_TURN), if any.
    #[getter]
    fn anchor(&self) -> Option<usize> {
        self.repair.anchor
    }

    #[getter]
    fn kept_decisions(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let list = self.kept_decisions.get_or_try_init(py, || self.decisions(py, &self.kept))?;
        Ok(list.clone_ref(py))
    }

    #[getter]
    fn excluded_decisions(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let list = self.excluded_decisions.get_or_try_init(py, || self.decisions(py, &self.excluded))?;
        Ok(list.clone_ref(py))
    }

    /// The kept blocks that carry reasoning: `(index, id, reasoning tokens, counted, basis)` by the
    /// counts the plan was made with (see `Counts`).
    #[allow(clippy::type_complexity)]
    fn reasoning(&self, counts: &Counts) -> Vec<(usize, String, u64, bool, &'static str)> {
        let blocks = &self.conversation.get().blocks;
        counts
            .reasoning_blocks
            .iter()
            .filter(|&&i| self.kept.binary_search(&i).is_ok())
            .map(|&i| (i, blocks[i].id.clone(), counts.reasoning[i], counts.counted[i], counts.basis[i]))
            .collect()
    }

    /// Every block's decision in input order, with whether it was kept: what an audit records.
    fn ordered_decisions(&self, py: Python<'_>) -> PyResult<Vec<(Py<BlockDecision>, bool)>> {
        let kept = self.kept_decisions(py)?;
        let excluded = self.excluded_decisions(py)?;
        let (mut kept, mut excluded) = (kept.bind(py).iter(), excluded.bind(py).iter());
        let n = self.kept.len() + self.excluded.len();
        let mut next_kept = self.kept.iter().peekable();
        (0..n)
            .map(|i| {
                let is_kept = next_kept.next_if(|&&k| k == i).is_some();
                let source = if is_kept { kept.next() } else { excluded.next() };
                let decision = source.ok_or_else(|| PyValueError::new_err("decisions out of step"))?;
                Ok((decision.cast_into::<BlockDecision>()?.unbind(), is_kept))
            })
            .collect()
    }

    /// The decisions as protobuf wire bytes: the repeated message fields `kept_field` and
    /// `excluded_field`, whose message is `{string id = 1; int64 tokens = 2; string reason = 3}`
    /// (`contextshift.v1.BlockDecision`). A reply merges them in instead of a Python message per
    /// block.
    fn encode_decisions<'py>(&self, py: Python<'py>, kept_field: u32, excluded_field: u32) -> Bound<'py, PyBytes> {
        let blocks = &self.conversation.get().blocks;
        let mut out = Vec::with_capacity(blocks.len() * 32);
        let mut message = Vec::with_capacity(64);
        for (field, indices) in [(kept_field, &*self.kept), (excluded_field, &*self.excluded)] {
            for &i in indices {
                message.clear();
                wire::put_bytes(&mut message, 1, blocks[i].id.as_bytes());
                wire::put_varint(&mut message, 2, self.tokens[i]);
                wire::put_bytes(&mut message, 3, self.reasons[i].as_str().as_bytes());
                wire::put_bytes(&mut out, field, &message);
            }
        }
        PyBytes::new(py, &out)
    }

    /// Every block's decision in input order, as protobuf wire bytes: the repeated message field
    /// `field` of `{string id = 1; int64 tokens = 2; string reason = 3; bool kept = 4}`
    /// (`contextshift.v1.AuditBlock`), the order `ordered_decisions` gives. What an audit records,
    /// with no Python object per block.
    fn encode_ordered_decisions<'py>(&self, py: Python<'py>, field: u32) -> PyResult<Bound<'py, PyBytes>> {
        guarded(|| {
            let blocks = &self.conversation.get().blocks;
            let mut kept = vec![false; blocks.len()];
            for &i in self.kept.iter() {
                kept[i] = true;
            }
            let mut out = Vec::with_capacity(blocks.len() * 34);
            let mut message = Vec::with_capacity(64);
            for (i, block) in blocks.iter().enumerate() {
                message.clear();
                wire::put_bytes(&mut message, 1, block.id.as_bytes());
                wire::put_varint(&mut message, 2, self.tokens[i]);
                wire::put_bytes(&mut message, 3, self.reasons[i].as_str().as_bytes());
                if kept[i] {
                    wire::put_varint(&mut message, 4, 1);
                }
                wire::put_bytes(&mut out, field, &message);
            }
            Ok(PyBytes::new(py, &out))
        })
    }
}

impl Conversation {
    /// `indices` as a mask over the blocks.
    fn mask(&self, indices: Vec<usize>) -> PyResult<Vec<bool>> {
        let mut mask = vec![false; self.blocks.len()];
        for i in indices {
            *mask.get_mut(i).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range")))? = true;
        }
        Ok(mask)
    }

    /// `(index, reason code)` pairs, checked.
    fn reasoned(&self, pairs: Vec<(usize, String)>) -> PyResult<Vec<(usize, Reason)>> {
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

    fn selected(&self, indices: &[usize]) -> PyResult<Vec<&Block>> {
        indices
            .iter()
            .map(|&i| self.blocks.get(i).ok_or_else(|| PyValueError::new_err(format!("index {i} out of range"))))
            .collect()
    }

    fn json_source(&self) -> PyResult<&JsonSource> {
        self.json.as_ref().ok_or_else(|| PyValueError::new_err("conversation was not read from JSON"))
    }

    fn cut_messages(&self) -> HashMap<usize, &Value> {
        self.cuts.iter().map(|c| (c.index, &c.message)).collect()
    }
}

#[pymethods]
impl Conversation {
    /// `tool_result_max_chars`: a lower cap for blocks that answer a tool call (None: off).
    #[new]
    #[pyo3(signature = (blocks, max_block_chars, tool_result_max_chars=None))]
    fn new(
        py: Python<'_>,
        blocks: &Bound<'_, PyAny>,
        max_block_chars: usize,
        tool_result_max_chars: Option<usize>,
    ) -> PyResult<Self> {
        guarded(|| {
            let nodes = convert::sequence(blocks).map_err(|e| not_a_list("blocks", e))?;
            let cap = char_cap(max_block_chars, tool_result_max_chars);
            // Reading Python objects needs the GIL; grouping does not.
            let conv = parse_conversation(&nodes, cap, "blocks").map_err(invalid_blocks)?;
            let groups = py.detach(|| Groups::build(&conv.blocks));
            Ok(Conversation { blocks: conv.blocks, cuts: conv.cuts, over_cap: conv.over_cap, groups, json: None })
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
            py.detach(|| {
                let cap = char_cap(max_block_chars, tool_result_max_chars);
                let parsed = parse_json_blocks(&text, cap, "blocks_json")?;
                let conv = parsed.conversation;
                let groups = Groups::build(&conv.blocks);
                let json = Some(JsonSource { text, spans: parsed.spans });
                Ok(Conversation { blocks: conv.blocks, cuts: conv.cuts, over_cap: conv.over_cap, groups, json })
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
            let cut_messages = self.cut_messages();
            let mut out = Vec::with_capacity(json.text.len() + 2);
            out.push(b'[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                match item {
                    MessageItem::Json(text) => out.extend_from_slice(text.as_bytes()),
                    MessageItem::Index(i) => match cut_messages.get(i) {
                        Some(message) => out.extend_from_slice(message.to_string().as_bytes()),
                        None => out.extend_from_slice(json.block_text(*i)?.as_bytes()),
                    },
                }
            }
            out.push(b']');
            Ok(PyBytes::new(py, &out))
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
    ) -> PyResult<Counts> {
        guarded(|| {
            let profile = profile_named(py, profile)?;
            let retention = retention_of(&profile, reasoning)?;
            let Some(known) = known else {
                let counts = py.detach(|| count_blocks(&profile, &self.blocks.iter().collect::<Vec<_>>()));
                return Ok(Counts::new(profile, retention, &self.blocks, &counts));
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
            for (count, block) in counts.iter_mut().zip(&self.blocks) {
                if !block.reasoning.is_empty() {
                    *count = None;
                }
            }
            let missing: Vec<usize> = (0..counts.len()).filter(|&i| counts[i].is_none()).collect();
            let counted =
                py.detach(|| count_blocks(&profile, &missing.iter().map(|&i| &self.blocks[i]).collect::<Vec<_>>()));
            for (&i, count) in missing.iter().zip(counted) {
                counts[i] = Some(count);
            }
            let counts: Vec<BlockCount> = counts.into_iter().map(Option::unwrap_or_default).collect();
            Ok(Counts::new(profile, retention, &self.blocks, &counts))
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
    fn pinned_cap(&self, counts: &Counts, limit: f64) -> PyResult<Vec<usize>> {
        guarded(|| Ok(plan_pinned_cap(&self.blocks, &counts.tokens, limit)))
    }

    /// Stages 4–5: orphans out, then the blocks whose reasoning is over the char cap and the
    /// strategy's `forced` groups (`(index, reason)`, whatever the budget), then while over budget
    /// its `ranked` groups in order and the oldest groups, down to `target` (default `budget`),
    /// then the leading-assistant repair. Raises `TokenBudgetExceeded` when protected blocks alone
    /// exceed `budget`.
    #[pyo3(signature = (counts, budget, unpinned, protect_current_input, start_on_user, *, target=None, forced=Vec::new(), ranked=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        counts: &Counts,
        budget: u64,
        unpinned: Vec<usize>,
        protect_current_input: bool,
        start_on_user: bool,
        target: Option<u64>,
        forced: Vec<(usize, String)>,
        ranked: Vec<(usize, String)>,
    ) -> PyResult<Plan> {
        let this = slf.get();
        guarded(|| {
            let n = this.blocks.len();
            if counts.tokens.len() != n {
                return Err(PyValueError::new_err(format!("{} counts for {n} blocks", counts.tokens.len())));
            }
            let unpinned_mask = this.mask(unpinned)?;
            let over_cap = this.over_cap.iter().map(|o| (o.index, Reason::ReasoningOverCap));
            let forced: Vec<(usize, Reason)> = over_cap.chain(this.reasoned(forced)?).collect();
            let ranked = this.reasoned(ranked)?;
            let plan = py.detach(|| {
                let protection = protection(&this.blocks, protect_current_input, &unpinned_mask);
                plan_removal(&PlanInput {
                    target: target.unwrap_or(budget),
                    forced: &forced,
                    ranked: &ranked,
                    ..PlanInput::truncate(
                        &this.blocks,
                        &counts.tokens,
                        &this.groups,
                        &protection,
                        &unpinned_mask,
                        budget,
                        counts.profile.prompt_overhead(),
                        start_on_user,
                    )
                })
            });
            let plan = plan.map_err(|e| TokenBudgetExceeded::new_err((e.protected_tokens, e.budget)))?;
            let (kept, excluded): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| plan.kept[i]);
            Ok(Plan {
                conversation: slf.clone().unbind(),
                kept: kept.into(),
                excluded: excluded.into(),
                total: plan.total,
                repair: plan.repair,
                tokens: counts.tokens.to_vec(),
                reasons: plan.reasons,
                kept_decisions: PyOnceLock::new(),
                excluded_decisions: PyOnceLock::new(),
            })
        })
    }

    /// Stage 6: prompt tokens of the given blocks, counted afresh from their content under the
    /// profile and reasoning rule of `counts`.
    fn recount(&self, py: Python<'_>, counts: &Counts, indices: Vec<usize>) -> PyResult<u64> {
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
    fn count_rewrites(&self, counts: &Counts, items: Vec<(usize, Bound<'_, PyAny>)>) -> PyResult<Vec<u64>> {
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
    fn layout(&self, py: Python<'_>, unpinned: Vec<usize>, protect_current_input: bool) -> PyResult<Layout> {
        guarded(|| {
            let unpinned = self.mask(unpinned)?;
            Ok(py.detach(|| {
                let protection = protection(&self.blocks, protect_current_input, &unpinned);
                let mut group_protected = vec![false; self.groups.len()];
                for (i, p) in protection.iter().enumerate() {
                    group_protected[self.groups.group_of[i]] |= *p != Protection::None;
                }
                let blocks = &self.blocks;
                Layout {
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
    fn cuts<'py>(&self, py: Python<'py>, counts: &Counts) -> PyResult<Vec<(usize, &str, u64, u64, Bound<'py, PyAny>)>> {
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
fn rewrite_block<'py>(
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

/// One item of `count_items`: a text borrowed from its Python string (no copy), or a parsed block.
enum Item<'a> {
    Text(&'a str),
    Block(Box<Block>),
}

/// Token counts of texts (text tokens) and blocks (block tokens) under one profile, each block
/// on its own (its reasoning counted as the rule, or `reasoning`, counts it in a conversation of
/// that block alone). Strings are read in place; the counting runs without the GIL, across cores
/// for a large batch.
#[pyfunction]
#[pyo3(signature = (items, profile, reasoning=None))]
fn count_items(py: Python<'_>, items: &Bound<'_, PyAny>, profile: &str, reasoning: Option<&str>) -> PyResult<Vec<u64>> {
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
                    Ok(block) => parsed.push(Item::Block(Box::new(block))),
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
fn count_tools(py: Python<'_>, tools: &Bound<'_, PyAny>, profile: &str, field: &str) -> PyResult<u64> {
    guarded(|| {
        let profile = profile_named(py, profile)?;
        let invalid = |description| InvalidTools::new_err((vec![(field.to_owned(), description)],));
        let parsed = match json_text(tools).map_err(invalid)? {
            Some(text) => py.detach(|| parse_json_tools(&text, field)),
            None => parse_tools(&convert::sequence(tools).map_err(invalid)?, field),
        };
        let tools = parsed.map_err(|violations| InvalidTools::new_err((field_pairs(violations),)))?;
        Ok(py.detach(|| tools_tokens(&profile, &tools)))
    })
}

/// Text tokens of each text counted afresh (no count cache), on the calling thread or as a batch
/// (across cores once large enough), without the GIL: what a throughput measurement times.
#[pyfunction]
fn count_texts_uncached(py: Python<'_>, texts: &Bound<'_, PyAny>, profile: &str, as_batch: bool) -> PyResult<Vec<u64>> {
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
#[pyclass(frozen, get_all, module = "contextshift._core")]
struct ProfileDescription {
    name: String,
    approximate: bool,
    exactness: &'static str,
    source: String,
    licence: String,
    vocab_size: Option<u64>,
    /// Framing tokens per message, by role (system, user, assistant, tool).
    message_overhead: Vec<(&'static str, u64)>,
    /// Tokens a participant name adds beyond its text; `None` when the format drops names.
    name_overhead: Option<u64>,
    prompt_overhead: u64,
    image_rule: String,
    overhead_source: String,
    /// Which reasoning sent back is counted: "all", "current_turn" or "tool_turns".
    reasoning_rule: &'static str,
    /// The provider's published rule it follows (or that none is published).
    reasoning_source: String,
}

impl From<&ProfileInfo> for ProfileDescription {
    fn from(info: &ProfileInfo) -> Self {
        let framing = &info.framing;
        ProfileDescription {
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

/// The encoded protobuf `message` without its length-delimited field `field_number`, and that
/// field's payload (None when absent): a large string field is taken out as bytes before the
/// rest is parsed. ValueError, naming the byte offset, when the message's framing is broken.
#[pyfunction]
fn split_message_field<'py>(
    py: Python<'py>,
    message: &[u8],
    field_number: u32,
) -> PyResult<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)> {
    guarded(|| {
        let split = wire::split_field(message, field_number).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((PyBytes::new(py, &split.rest), split.value.map(|value| PyBytes::new(py, value))))
    })
}

/// A piece of an encoded message as Python gives it: bytes, or `(field_number, [pieces])`.
#[derive(FromPyObject)]
enum PyPiece<'py> {
    Bytes(Bound<'py, PyBytes>),
    Field(u32, Vec<PyPiece<'py>>),
}

impl PyPiece<'_> {
    fn borrow(&self) -> wire::Piece<'_> {
        match self {
            PyPiece::Bytes(bytes) => wire::Piece::Bytes(bytes.as_bytes()),
            PyPiece::Field(field, pieces) => wire::Piece::Field(*field, pieces.iter().map(PyPiece::borrow).collect()),
        }
    }
}

/// Encodes `pieces` in order (bytes as they are, `(field_number, [pieces])` as a length-delimited
/// field of them) straight into one bytes object: nested reply fields around a large payload
/// cost one copy of it, not one per level.
#[pyfunction]
fn encode_pieces<'py>(py: Python<'py>, pieces: Vec<PyPiece<'py>>) -> PyResult<Bound<'py, PyBytes>> {
    let pieces: Vec<wire::Piece<'_>> = pieces.iter().map(PyPiece::borrow).collect();
    let len = pieces.iter().map(wire::Piece::len).sum();
    PyBytes::new_with(py, len, |mut buffer| {
        for piece in &pieces {
            piece.write(&mut buffer).map_err(|e| InternalError::new_err(format!("encoding a reply: {e}")))?;
        }
        Ok(())
    })
}

/// Every built-in profile, described without loading a vocabulary.
#[pyfunction]
fn profiles() -> Vec<ProfileDescription> {
    builtin_profiles().iter().map(ProfileDescription::from).collect()
}

/// The profile `name` (built-in or `hf:<path>`), loaded: `InvalidOptions` when it cannot be.
#[pyfunction]
fn describe_profile(py: Python<'_>, name: &str) -> PyResult<ProfileDescription> {
    guarded(|| Ok(ProfileDescription::from(profile_named(py, name)?.info())))
}

/// `(hits, misses, entries, capacity_bytes)` of the process-wide count cache.
#[pyfunction]
fn count_cache_stats() -> (u64, u64, usize, usize) {
    let CacheStats { hits, misses, entries, capacity_bytes } = cache::global().stats();
    (hits, misses, entries, capacity_bytes)
}

/// Sets the count cache's memory bound in bytes (0 turns it off).
#[pyfunction]
fn configure_count_cache(capacity_bytes: usize) {
    cache::global().configure(capacity_bytes);
}

/// Empties the count cache (zeroing its counters) and the tokenizers' own memos.
#[pyfunction]
fn clear_count_cache() {
    clear_caches();
}

/// Panics inside the core, so the test suite can prove a panic surfaces as `InternalError`.
#[pyfunction]
fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
    guarded(|| py.detach(|| panic!("deliberate panic for the boundary test")))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Conversation>()?;
    m.add_class::<Counts>()?;
    m.add_class::<Plan>()?;
    m.add_class::<BlockDecision>()?;
    m.add_class::<Layout>()?;
    m.add_function(wrap_pyfunction!(rewrite_block, m)?)?;
    m.add_function(wrap_pyfunction!(count_items, m)?)?;
    m.add_function(wrap_pyfunction!(count_tools, m)?)?;
    m.add_function(wrap_pyfunction!(count_texts_uncached, m)?)?;
    m.add_function(wrap_pyfunction!(split_message_field, m)?)?;
    m.add_function(wrap_pyfunction!(encode_pieces, m)?)?;
    m.add_class::<ProfileDescription>()?;
    m.add_function(wrap_pyfunction!(profiles, m)?)?;
    m.add_function(wrap_pyfunction!(describe_profile, m)?)?;
    m.add_function(wrap_pyfunction!(count_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(configure_count_cache, m)?)?;
    m.add_function(wrap_pyfunction!(clear_count_cache, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add("REASONS", PyTuple::new(m.py(), Reason::ALL.iter().map(|r| r.as_str()))?)?;
    Ok(())
}

// Blocks are many small strings and vectors; mimalloc serves them markedly faster than glibc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
