//! A chat's stored blocks (`contextshift_core::stored_blocks`) for the store: what a chat holds,
//! what an audit's messages add and drop, and the messages rebuilt from its segments. The work
//! runs without the GIL: it reads, hashes and compresses the prompt's whole text.

use crate::boundary::guarded;
use contextshift_core::stored_blocks::{self, decompress_segment, Hash, Refs, Stored, StoredError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::sync::Arc;

pyo3::import_exception!(contextshift.audit.store, StoreDamaged);

fn damaged(error: StoredError) -> PyErr {
    StoreDamaged::new_err(error.to_string())
}

fn hash_bytes(py: Python<'_>, hash: Hash) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &hash.to_le_bytes())
}

fn hash_of(bytes: &[u8]) -> PyResult<Hash> {
    let array: [u8; 16] = bytes.try_into().map_err(|_| damaged(StoredError("a segment hash is not 16 bytes")))?;
    Ok(u128::from_le_bytes(array))
}

/// The blocks a chat has stored for its audit: its segments and their blocks. Immutable.
#[pyclass(frozen, name = "StoredBlocks", module = "contextshift._core")]
pub(crate) struct PyStoredBlocks {
    stored: Arc<Stored>,
}

#[pymethods]
impl PyStoredBlocks {
    /// None stored (a chat's first audit, or one stored whole).
    #[new]
    fn new() -> Self {
        PyStoredBlocks { stored: Arc::default() }
    }

    /// What an audit's message references say its chat holds.
    #[staticmethod]
    fn from_refs(refs: &[u8]) -> PyResult<Self> {
        Ok(PyStoredBlocks { stored: Arc::new(Refs::parse(refs).map_err(damaged)?.stored) })
    }

    /// The blocks held.
    fn __len__(&self) -> usize {
        self.stored.len()
    }

    /// The segments' hashes, as the store keys their rows.
    fn segment_hashes<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.stored.segment_hashes().map(|hash| hash_bytes(py, hash)).collect()
    }
}

/// What an audit whose final messages are `messages` (a JSON array; None: no messages stored)
/// stores, given what its chat has stored (`stored`): its references (None: the array is stored
/// whole, see `stored_blocks::split_array`, or not at all), the segment it adds (none or one: hash
/// and data), the hashes of the chat's segments it deletes, and what the chat holds after it.
#[allow(clippy::type_complexity)]
#[pyfunction]
pub(crate) fn store_messages<'py>(
    py: Python<'py>,
    messages: Option<PyBackedBytes>,
    stored: &PyStoredBlocks,
) -> PyResult<(
    Option<Bound<'py, PyBytes>>,
    Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>,
    Vec<Bound<'py, PyBytes>>,
    PyStoredBlocks,
)> {
    guarded(|| {
        let known = Arc::clone(&stored.stored);
        let written = messages.and_then(|text| py.detach(|| stored_blocks::store(&text, &known)));
        let Some(written) = written else {
            let gone = known.segment_hashes().map(|hash| hash_bytes(py, hash)).collect();
            return Ok((None, Vec::new(), gone, PyStoredBlocks::new()));
        };
        let new = written.new.iter().map(|(hash, data)| (hash_bytes(py, *hash), PyBytes::new(py, data))).collect();
        let gone = written.gone.iter().map(|hash| hash_bytes(py, *hash)).collect();
        let held = PyStoredBlocks { stored: written.stored };
        Ok((Some(PyBytes::new(py, &written.refs)), new, gone, held))
    })
}

/// The messages array `refs` names, from the chat's stored segments (hash, data): those it needs
/// are decompressed, every block checked against its hash. `StoreDamaged` when one is missing or
/// does not read back.
#[pyfunction]
pub(crate) fn rebuild_messages<'py>(
    py: Python<'py>,
    refs: PyBackedBytes,
    segments: Vec<(PyBackedBytes, PyBackedBytes)>,
) -> PyResult<Bound<'py, PyBytes>> {
    guarded(|| {
        let by_hash = segments
            .iter()
            .map(|(hash, data)| Ok((hash_of(hash)?, &**data)))
            .collect::<PyResult<HashMap<Hash, &[u8]>>>()?;
        let rebuilt = py.detach(|| {
            let refs = Refs::parse(&refs)?;
            let texts = refs
                .stored
                .segment_hashes()
                .filter_map(|hash| by_hash.get(&hash).map(|data| Ok((hash, decompress_segment(data)?))))
                .collect::<Result<_, StoredError>>()?;
            refs.rebuild(&texts)
        });
        Ok(PyBytes::new(py, &rebuilt.map_err(damaged)?))
    })
}
