//! Python objects made sparingly: a per-block tuple made once, the cyclic GC paused while many
//! small objects are built.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// Pauses Python's cyclic garbage collector while it lives. Building one decision object per
/// block (100k for a long history) would otherwise trigger collections that walk the caller's
/// whole heap, again and again, several times the building's own work. The objects
/// built meanwhile hold only strings and ints, so they cannot form cycles.
pub(crate) struct GcPause {
    pub(crate) was_enabled: bool,
}

impl GcPause {
    pub(crate) fn new(_py: Python<'_>) -> Self {
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

/// A vector with its Python tuple, made on the first read and the same tuple after. Strategies
/// index these in loops: a new list per read made those loops quadratic (a 100k-block
/// `summarize` took minutes, `clear-tool-results` 39 s). Rust code reads it as a slice.
pub(crate) struct Tupled<T> {
    pub(crate) items: Vec<T>,
    pub(crate) tuple: PyOnceLock<Py<PyTuple>>,
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
    pub(crate) fn tuple<'py>(&self, py: Python<'py>) -> PyResult<Py<PyTuple>>
    where
        T: IntoPyObject<'py> + Clone,
    {
        let made =
            self.tuple.get_or_try_init(py, || PyTuple::new(py, self.items.iter().cloned()).map(Bound::unbind))?;
        Ok(made.clone_ref(py))
    }
}
