//! Python objects as a [`Node`] document, so the core parser reads dict blocks in place, and
//! JSON values back into Python objects (messages the char cap rewrote).

use contextshift_core::{Node, Shape};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deeper nesting than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;

pub struct PyNode<'py>(pub Bound<'py, PyAny>);

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".to_owned())
}

impl Node for PyNode<'_> {
    fn shape(&self) -> Shape<'_> {
        let obj = &self.0;
        if obj.is_none() {
            Shape::Null
        } else if let Ok(s) = obj.cast::<PyString>() {
            s.to_str().map(Shape::Str).unwrap_or_else(|_| Shape::Other("str with lone surrogates".to_owned()))
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
        if let Ok(dict) = self.0.cast::<PyDict>() {
            for (key, value) in dict.iter() {
                // Keys that are not str cannot name a field the parser knows.
                if let Ok(Ok(key)) = key.cast::<PyString>().map(|k| k.to_str()) {
                    f(key, PyNode(value));
                }
            }
        }
    }

    fn items(&self) -> Vec<Self> {
        if let Ok(list) = self.0.cast::<PyList>() {
            list.iter().map(PyNode).collect()
        } else if let Ok(tuple) = self.0.cast::<PyTuple>() {
            tuple.iter().map(PyNode).collect()
        } else {
            Vec::new()
        }
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
pub fn sequence<'py>(obj: &Bound<'py, PyAny>) -> Result<Vec<PyNode<'py>>, String> {
    let node = PyNode(obj.clone());
    match node.shape() {
        Shape::List => Ok(node.items()),
        _ => Err(format!("must be a list, got {}", type_name(obj))),
    }
}

fn to_value(node: &PyNode<'_>, path: &mut String, depth: usize) -> Result<Value, String> {
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
