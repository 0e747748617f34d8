//! pyo3's `Py_3_*` cfgs for this crate: CPython's string internals are read directly only where
//! the interpreter still exposes them (convert.rs).
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
