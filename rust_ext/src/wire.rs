//! Protobuf wire helpers for the servicer: one field split off a message, a reply encoded from
//! pieces in one copy, and a stored audit's prompt read back.

use crate::boundary::{guarded, InternalError};
use contextshift_core::audit_blocks::{self, AuditFields};
use contextshift_core::wire;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The encoded protobuf `message` without its length-delimited field `field_number`, and that
/// field's payload (None when absent): a large string field is taken out as bytes before the
/// rest is parsed. ValueError, naming the byte offset, when the message's framing is broken.
#[pyfunction]
pub(crate) fn split_message_field<'py>(
    py: Python<'py>,
    message: &[u8],
    field_number: u32,
) -> PyResult<(Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>)> {
    guarded(|| {
        let split = wire::split_field(message, field_number).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((PyBytes::new(py, &split.rest), split.value.map(|value| PyBytes::new(py, value))))
    })
}

/// What a chat's prompt was, from its encoded ContextAudit (`blocks_field`: the decisions' field
/// number; `summary_id`: the field numbers down to the summary's id): the blocks it kept in order
/// (id, tokens; the summary left out) and those it left out (id, reason), or None when it left
/// nothing out. ValueError, naming the byte offset, when the audit cannot be read.
#[allow(clippy::type_complexity)]
#[pyfunction]
pub(crate) fn read_previous_prompt(
    audit: &[u8],
    blocks_field: u32,
    summary_id: Vec<u32>,
) -> PyResult<Option<(Vec<(String, i64)>, Vec<(String, String)>)>> {
    guarded(|| {
        let at = AuditFields { blocks: blocks_field, summary_id: &summary_id };
        let prompt = audit_blocks::previous_prompt(audit, &at).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(prompt.map(|p| (p.kept, p.excluded)))
    })
}

/// A piece of an encoded message as Python gives it: bytes, or `(field_number, [pieces])`.
#[derive(FromPyObject)]
pub(crate) enum PyPiece<'py> {
    Bytes(Bound<'py, PyBytes>),
    Field(u32, Vec<PyPiece<'py>>),
}

impl PyPiece<'_> {
    pub(crate) fn borrow(&self) -> wire::Piece<'_> {
        match self {
            PyPiece::Bytes(bytes) => wire::Piece::Bytes(bytes.as_bytes()),
            PyPiece::Field(field, pieces) => wire::Piece::Field(*field, pieces.iter().map(PyPiece::borrow).collect()),
        }
    }
}

/// Encodes `pieces` in order (bytes as they are, `(field_number, [pieces])` as a length-delimited
/// field of them) straight into one bytes object: nested reply fields around a large payload
/// cost one copy of it, not one per level. The object is sized once and written without being
/// zeroed first (pyo3's `new_with` zeroes it: a pass over a 50 KB reply for nothing).
#[pyfunction]
pub(crate) fn encode_pieces<'py>(py: Python<'py>, pieces: Vec<PyPiece<'py>>) -> PyResult<Bound<'py, PyBytes>> {
    let pieces: Vec<wire::Piece<'_>> = pieces.iter().map(PyPiece::borrow).collect();
    let len = pieces.iter().map(wire::Piece::len).sum();
    PyBytes::new_with_writer(py, len, |out| {
        for piece in &pieces {
            piece.write(out).map_err(|e| InternalError::new_err(format!("encoding a reply: {e}")))?;
        }
        Ok(())
    })
}
