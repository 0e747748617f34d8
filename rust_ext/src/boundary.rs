//! What every entry point shares: the exceptions of `contextshift.errors`, the guard that turns a
//! panic into `InternalError`, and readers of common arguments (JSON text, the char cap, a profile).

use contextshift_core::json_doc::utf8_text;
use contextshift_core::{profile_by_name, CharCap, Profile, ProfileError, Reason, Violation};
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

pyo3::import_exception!(contextshift.errors, InvalidBlocks);
pyo3::import_exception!(contextshift.errors, InvalidOptions);
pyo3::import_exception!(contextshift.errors, InvalidTools);
pyo3::import_exception!(contextshift.errors, TokenBudgetExceeded);
pyo3::import_exception!(contextshift.errors, InternalError);

/// Runs `f`, turning a panic into `InternalError` with the panic message.
pub(crate) fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
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
pub(crate) fn not_a_list(name: &str, description: String) -> PyErr {
    InvalidBlocks::new_err((vec![(name.to_owned(), description)],))
}

pub(crate) fn invalid_blocks(violations: Vec<Violation>) -> PyErr {
    InvalidBlocks::new_err((field_pairs(violations),))
}

pub(crate) fn field_pairs(violations: Vec<Violation>) -> Vec<(String, String)> {
    violations.into_iter().map(|v| (v.field, v.description)).collect()
}

/// JSON text given as `str` or `bytes`, read in place: the Python object is held, not copied (a
/// 100k-block request is 32 MB), and read without the GIL. Its bytes are as given: `checked`
/// says whether they are UTF-8 (the block reader checks only what it has not seen before).
pub(crate) enum JsonText {
    Str(PyBackedStr),
    Bytes(PyBackedBytes),
}

impl AsRef<[u8]> for JsonText {
    fn as_ref(&self) -> &[u8] {
        match self {
            JsonText::Str(s) => s.as_bytes(),
            JsonText::Bytes(b) => b,
        }
    }
}

impl JsonText {
    /// The text, or where it is not UTF-8 (a `str` always is).
    pub(crate) fn checked(&self) -> Result<&str, String> {
        match self {
            JsonText::Str(s) => Ok(s),
            JsonText::Bytes(b) => utf8_text(b),
        }
    }
}

/// `text` as JSON text when it is a `str` or `bytes` (None for anything else), or what is wrong
/// with it.
pub(crate) fn json_text(text: &Bound<'_, PyAny>) -> Result<Option<JsonText>, String> {
    if let Ok(s) = text.cast::<PyString>() {
        let s = PyBackedStr::try_from(s.clone()).map_err(|e| format!("not Unicode text: {e}"))?;
        Ok(Some(JsonText::Str(s)))
    } else if let Ok(b) = text.cast::<PyBytes>() {
        Ok(Some(JsonText::Bytes(PyBackedBytes::from(b.clone()))))
    } else {
        Ok(None)
    }
}

/// The char cap of a conversation: `max_block_chars` for every block, and a tool result's own
/// cap when one is given.
pub(crate) fn char_cap(max_block_chars: usize, tool_result_max_chars: Option<usize>) -> CharCap {
    CharCap { block: max_block_chars, tool_result: tool_result_max_chars.unwrap_or(max_block_chars) }
}

/// The profile `name` (loaded on first use, without the GIL: a vocabulary or a tokenizer.json
/// takes a while); an unknown or unloadable profile is `InvalidOptions` on field `profile`.
pub(crate) fn profile_named(py: Python<'_>, name: &str) -> PyResult<Arc<Profile>> {
    py.detach(|| profile_by_name(name))
        .map_err(|e: ProfileError| InvalidOptions::new_err((vec![("profile".to_owned(), e.to_string())],)))
}

/// `reason`'s code as an interned Python str, made once per code (a plan has a decision per block).
pub(crate) fn reason_str(py: Python<'_>, reason: Reason) -> &Bound<'_, PyString> {
    static CODES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
    let codes =
        CODES.get_or_init(py, || Reason::ALL.iter().map(|r| PyString::intern(py, r.as_str()).unbind()).collect());
    codes[reason as usize].bind(py)
}
