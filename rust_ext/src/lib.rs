//! `contextshift._core`: thin PyO3 bindings over `contextshift-core`.
//!
//! Every entry point copies its inputs into owned Rust data, does the work with the GIL
//! released, and maps errors to the specific exceptions of `contextshift.errors`. A Rust
//! panic becomes `contextshift.errors.InternalError` here, at the boundary: pyo3's own
//! `PanicException` derives from `BaseException`, which servers such as grpcio do not answer.
//!
//! By job: `boundary` (the exceptions, the panic guard, common arguments), `conversation` (a parsed
//! request and its layout), `counting` (counts, profiles, the count cache), `decisions` (a plan and
//! its decisions), `wire` (reply bytes), `objects` (tuples made once, the GC paused) and `convert`
//! (Python objects read as the core's `Node`). Each Python class is a `Py*` type here, named apart
//! from the core's type it wraps.

mod boundary;
mod conversation;
mod convert;
mod counting;
mod decisions;
mod group_writers;
mod objects;
mod recent_dicts;
mod stored;
mod wire;

use crate::boundary::guarded;
use crate::conversation::{block_cache_stats, configure_block_cache, rewrite_block, PyConversation, PyLayout};
use crate::counting::{
    clear_count_cache, configure_count_cache, count_cache_stats, count_items, count_texts_uncached, count_tools,
    describe_profile, profiles, PyCounts, PyProfileDescription,
};
use crate::decisions::{PyBlockDecision, PyPlan};
use crate::wire::{encode_pieces, read_previous_prompt, split_message_field};
use contextshift_core::Reason;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Panics inside the core, so the test suite can prove a panic surfaces as `InternalError`.
#[pyfunction]
fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
    guarded(|| py.detach(|| panic!("deliberate panic for the boundary test")))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConversation>()?;
    m.add_class::<PyCounts>()?;
    m.add_class::<PyPlan>()?;
    m.add_class::<PyBlockDecision>()?;
    m.add_class::<PyLayout>()?;
    m.add_function(wrap_pyfunction!(rewrite_block, m)?)?;
    m.add_function(wrap_pyfunction!(count_items, m)?)?;
    m.add_function(wrap_pyfunction!(count_tools, m)?)?;
    m.add_function(wrap_pyfunction!(count_texts_uncached, m)?)?;
    m.add_function(wrap_pyfunction!(split_message_field, m)?)?;
    m.add_function(wrap_pyfunction!(encode_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(read_previous_prompt, m)?)?;
    m.add_class::<PyProfileDescription>()?;
    m.add_function(wrap_pyfunction!(profiles, m)?)?;
    m.add_function(wrap_pyfunction!(describe_profile, m)?)?;
    m.add_function(wrap_pyfunction!(count_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(configure_count_cache, m)?)?;
    m.add_function(wrap_pyfunction!(clear_count_cache, m)?)?;
    m.add_function(wrap_pyfunction!(block_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(configure_block_cache, m)?)?;
    m.add_class::<stored::PyStoredBlocks>()?;
    m.add_class::<group_writers::PySqliteGroupWriter>()?;
    m.add_class::<group_writers::PyPostgresGroupWriter>()?;
    m.add_function(wrap_pyfunction!(stored::store_messages, m)?)?;
    m.add_function(wrap_pyfunction!(stored::rebuild_messages, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add("REASONS", PyTuple::new(m.py(), Reason::ALL.iter().map(|r| r.as_str()))?)?;
    Ok(())
}

// Blocks are many small strings and vectors; mimalloc serves them markedly faster than glibc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
