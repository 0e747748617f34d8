//! A plan (`Plan`) and its per-block decisions (`BlockDecision`), and their wire encodings.

use crate::boundary::{guarded, reason_str};
use crate::counting::PyCounts;
use crate::objects::{GcPause, Tupled};
use contextshift_core::wire;
use contextshift_core::{Block, Plan, Reason, Repair};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::sync::Arc;

/// A block kept or excluded, with its tokens and a stable reason code.
#[pyclass(frozen, eq, module = "contextshift", name = "BlockDecision")]
pub(crate) struct PyBlockDecision {
    pub(crate) id: Py<PyString>,
    pub(crate) tokens: u64,
    pub(crate) reason: Py<PyString>,
}

impl PartialEq for PyBlockDecision {
    fn eq(&self, other: &Self) -> bool {
        Python::attach(|py| {
            self.tokens == other.tokens
                && self.id.bind(py).to_str().ok() == other.id.bind(py).to_str().ok()
                && self.reason.bind(py).to_str().ok() == other.reason.bind(py).to_str().ok()
        })
    }
}

#[pymethods]
impl PyBlockDecision {
    #[new]
    fn new(id: Bound<'_, PyString>, tokens: u64, reason: Bound<'_, PyString>) -> Self {
        PyBlockDecision { id: id.unbind(), tokens, reason: reason.unbind() }
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
#[pyclass(frozen, module = "contextshift._core", name = "Plan")]
pub(crate) struct PyPlan {
    /// The conversation's blocks (its shared list, not a copy).
    blocks: Arc<Vec<Arc<Block>>>,
    kept: Tupled<usize>,
    excluded: Tupled<usize>,
    #[pyo3(get)]
    total: u64,
    /// What the repair did (contextshift_core::plan::Repair).
    repair: Repair,
    /// Per block.
    tokens: Vec<u64>,
    reasons: Vec<Reason>,
    kept_decisions: PyOnceLock<Py<PyList>>,
    excluded_decisions: PyOnceLock<Py<PyList>>,
}

impl PyPlan {
    /// The plan the core made for `blocks`, whose tokens (per block) it was made with.
    pub(crate) fn new(blocks: Arc<Vec<Arc<Block>>>, plan: Plan, tokens: Vec<u64>) -> Self {
        let (kept, excluded): (Vec<usize>, Vec<usize>) = (0..blocks.len()).partition(|&i| plan.kept[i]);
        PyPlan {
            blocks,
            kept: kept.into(),
            excluded: excluded.into(),
            total: plan.total,
            repair: plan.repair,
            tokens,
            reasons: plan.reasons,
            kept_decisions: PyOnceLock::new(),
            excluded_decisions: PyOnceLock::new(),
        }
    }

    fn decisions(&self, py: Python<'_>, indices: &[usize]) -> PyResult<Py<PyList>> {
        let blocks = &self.blocks;
        let _paused = GcPause::new(py);
        let items = indices.iter().map(|&i| {
            let id = PyString::new(py, &blocks[i].id).unbind();
            let reason = reason_str(py, self.reasons[i]).clone().unbind();
            let decision = Py::new(py, PyBlockDecision { id, tokens: self.tokens[i], reason })?;
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
impl PyPlan {
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
    /// counts the plan was made with (see `PyCounts`).
    #[allow(clippy::type_complexity)]
    fn reasoning(&self, counts: &PyCounts) -> Vec<(usize, String, u64, bool, &'static str)> {
        let blocks = &self.blocks;
        counts
            .reasoning_blocks
            .iter()
            .filter(|&&i| self.kept.binary_search(&i).is_ok())
            .map(|&i| (i, blocks[i].id.clone(), counts.reasoning[i], counts.counted[i], counts.basis[i]))
            .collect()
    }

    /// The images of the kept blocks, in order: `(index, id, image, tokens, width, height, basis)`
    /// with `image` its place among the block's images, its tokens by the profile of `counts`, the
    /// size it was priced at (0 by 0 when unknown) and how that is known: "given", "header" (read
    /// from the header of the image sent inline) or "unknown" (contextshift_core::image).
    #[allow(clippy::type_complexity)]
    fn images(&self, counts: &PyCounts) -> Vec<(usize, String, usize, u64, u64, u64, &'static str)> {
        let blocks = &self.blocks;
        let mut out = Vec::new();
        for &i in counts.image_blocks.iter().filter(|&&i| self.kept.binary_search(&i).is_ok()) {
            let Some(block) = blocks.get(i) else { continue }; // counts of another conversation
            for (k, image) in block.images.iter().enumerate() {
                let (size, basis) = image.priced_size();
                let (width, height) = size.unwrap_or((0, 0));
                let tokens = counts.profile.image_tokens(image);
                out.push((i, block.id.clone(), k, tokens, width, height, basis.as_str()));
            }
        }
        out
    }

    /// Every block's decision in input order, with whether it was kept: what an audit records.
    fn ordered_decisions(&self, py: Python<'_>) -> PyResult<Vec<(Py<PyBlockDecision>, bool)>> {
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
                Ok((decision.cast_into::<PyBlockDecision>()?.unbind(), is_kept))
            })
            .collect()
    }

    /// The decisions as protobuf wire bytes: the repeated message fields `kept_field` and
    /// `excluded_field`, whose message is `{string id = 1; int64 tokens = 2; string reason = 3}`
    /// (`contextshift.v1.BlockDecision`). A reply merges them in instead of a Python message per
    /// block.
    fn encode_decisions<'py>(&self, py: Python<'py>, kept_field: u32, excluded_field: u32) -> Bound<'py, PyBytes> {
        let blocks = &self.blocks;
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
            let blocks = &self.blocks;
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
