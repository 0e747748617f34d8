//! Python objects as a [`Node`] document, so the core parser reads dict blocks in place, and
//! JSON values back into Python objects (messages the char cap rewrote).

use contextshift_core::{Node, Shape};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use std::ptr;

/// Deeper nesting than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;

/// A borrowed Python object. Children are read as borrowed references too: no reference count
/// is touched while parsing, so reading a long history does not write to every object it reads
/// (which measurably slowed 100k-block requests). Sound because the GIL is held for the whole
/// parse and nothing in it runs Python code that could change a container.
#[derive(Clone, Copy)]
pub struct PyNode<'a, 'py>(pub Borrowed<'a, 'py, PyAny>);

/// The UTF-8 text of a borrowed str, for as long as the borrow: CPython keeps it in the object.
/// None for a str that cannot be UTF-8 (lone surrogates).
fn utf8<'a>(s: Borrowed<'a, '_, PyString>) -> Option<&'a str> {
    let mut size = 0;
    // SAFETY: the GIL is held and `s` is a str; the buffer lives as long as the object.
    let data = unsafe { ffi::PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut size) };
    if data.is_null() {
        drop(PyErr::take(s.py())); // the encoding error: reported as a violation instead
        return None;
    }
    // SAFETY: CPython returned `size` bytes of valid UTF-8 at `data`.
    Some(unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(data.cast::<u8>(), size as usize)) })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".to_owned())
}

impl Node for PyNode<'_, '_> {
    fn shape(&self) -> Shape<'_> {
        let obj = &self.0;
        // Blocks are mostly exact dicts, strs and lists: one pointer comparison each, before the
        // general checks (subclasses, numbers), which cost several type lookups per node.
        // SAFETY: the GIL is held; only the object's type pointer is read.
        let exact = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
        if exact == ptr::addr_of_mut!(ffi::PyUnicode_Type) {
            // SAFETY: the type check above.
            let s = unsafe { obj.cast_unchecked::<PyString>() };
            return utf8(s).map(Shape::Str).unwrap_or_else(|| Shape::Other("str with lone surrogates".to_owned()));
        }
        if exact == ptr::addr_of_mut!(ffi::PyDict_Type) {
            return Shape::Object;
        }
        if exact == ptr::addr_of_mut!(ffi::PyList_Type) {
            return Shape::List;
        }
        if obj.is_none() {
            Shape::Null
        } else if let Ok(s) = obj.cast::<PyString>() {
            utf8(s).map(Shape::Str).unwrap_or_else(|| Shape::Other("str with lone surrogates".to_owned()))
        } else if let Ok(b) = obj.cast::<PyBool>() {
            Shape::Bool(b.is_true())
        } else if obj.is_instance_of::<PyInt>() {
            obj.extract::<i64>().map(Shape::Int).unwrap_or_else(|_| Shape::Other("integer beyond 64 bits".to_owned()))
        } else if let Ok(f) = obj.cast::<PyFloat>() {
            Shape::Float(f.value())
        } else if obj.is_instance_of::<PyDict>() {
            Shape::Object
        } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            Shape::List
        } else {
            Shape::Other(type_name(obj))
        }
    }

    fn is_null(&self) -> bool {
        self.0.is_none()
    }

    fn for_each_entry(&self, f: &mut dyn FnMut(&str, Self)) {
        if !self.0.is_instance_of::<PyDict>() {
            return;
        }
        let py = self.0.py();
        let (mut pos, mut key, mut value) = (0, ptr::null_mut(), ptr::null_mut());
        // SAFETY: the GIL is held and `self.0` is a dict; PyDict_Next hands out borrowed
        // references that stay valid while the dict is not changed, and the parser runs no
        // Python code.
        while unsafe { ffi::PyDict_Next(self.0.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
            let (key, value) = unsafe { (Borrowed::from_ptr(py, key), Borrowed::from_ptr(py, value)) };
            // Keys that are not str cannot name a field the parser knows.
            if let Some(key) = key.cast::<PyString>().ok().and_then(utf8) {
                f(key, PyNode(value));
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        let py = self.0.py();
        let (len, item): (isize, unsafe extern "C" fn(*mut ffi::PyObject, isize) -> *mut ffi::PyObject) =
            if self.0.is_instance_of::<PyList>() {
                (unsafe { ffi::PyList_Size(self.0.as_ptr()) }, ffi::PyList_GetItem)
            } else if self.0.is_instance_of::<PyTuple>() {
                (unsafe { ffi::PyTuple_Size(self.0.as_ptr()) }, ffi::PyTuple_GetItem)
            } else {
                return Vec::new();
            };
        // SAFETY: the GIL is held, indices are in range, and both calls return borrowed
        // references owned by the container, which nothing changes during the parse.
        (0..len).map(|i| PyNode(unsafe { Borrowed::from_ptr(py, item(self.0.as_ptr(), i)) })).collect()
    }

    fn to_json(&self) -> Result<Value, String> {
        let mut path = String::new();
        to_value(self, &mut path, 0).map_err(|description| {
            if path.is_empty() {
                description
            } else {
                format!("at {path}: {description}")
            }
        })
    }
}

/// The items of a list or tuple argument, or a description of what it is instead.
pub fn sequence<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> Result<Vec<PyNode<'a, 'py>>, String> {
    let node = PyNode(obj.as_borrowed());
    match node.shape() {
        Shape::List => Ok(node.items()),
        _ => Err(format!("must be a list, got {}", type_name(obj))),
    }
}

fn to_value(node: &PyNode<'_, '_>, path: &mut String, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    Ok(match node.shape() {
        Shape::Null => Value::Null,
        Shape::Bool(b) => Value::Bool(b),
        Shape::Int(i) => Value::Number(i.into()),
        Shape::Float(f) => Value::Number(Number::from_f64(f).ok_or_else(|| format!("must be finite, got {f}"))?),
        Shape::Str(s) => Value::String(s.to_owned()),
        Shape::List => {
            let mut list = Vec::new();
            for (j, item) in node.items().iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{j}]"));
                list.push(to_value(item, path, depth + 1)?);
                path.truncate(len);
            }
            Value::Array(list)
        }
        Shape::Object => {
            let mut map = Map::new();
            let mut failure = None;
            node.for_each_entry(&mut |key, value| {
                if failure.is_some() {
                    return;
                }
                let len = path.len();
                path.push('.');
                path.push_str(key);
                match to_value(&value, path, depth + 1) {
                    Ok(value) => {
                        path.truncate(len);
                        map.insert(key.to_owned(), value);
                    }
                    Err(e) => failure = Some(e),
                }
            });
            if let Some(e) = failure {
                return Err(e);
            }
            Value::Object(map)
        }
        Shape::Other(name) => {
            return Err(format!("unsupported type {name} (use str, int, float, bool, None, list or dict)"))
        }
    })
}

pub fn value_to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            PyList::new(py, items.iter().map(|v| value_to_py(py, v)).collect::<PyResult<Vec<_>>>()?)?.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, value_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}
