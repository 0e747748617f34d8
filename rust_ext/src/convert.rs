//! Python objects <-> owned JSON values. Converting up front lets the core work on owned data
//! with the GIL released, and gives dict blocks and JSON text (`blocks_json`) one parser.

use contextshift_core::Violation;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deeper nesting than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;

fn sequence_items<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Result<Vec<Bound<'py, PyAny>>, Vec<Violation>> {
    if let Ok(list) = obj.cast::<PyList>() {
        Ok(list.iter().collect())
    } else if let Ok(tuple) = obj.cast::<PyTuple>() {
        Ok(tuple.iter().collect())
    } else {
        let type_name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        Err(vec![Violation {
            index: 0,
            field: name.to_owned(),
            description: format!("must be a list, got {type_name}"),
        }])
    }
}

/// A list of block dicts as JSON values; every block that cannot be represented is a violation.
pub fn blocks_to_values(obj: &Bound<'_, PyAny>, name: &str) -> Result<Vec<Value>, Vec<Violation>> {
    let mut values = Vec::new();
    let mut violations = Vec::new();
    for (index, item) in sequence_items(obj, name)?.iter().enumerate() {
        let mut path = format!("{name}[{index}]");
        match to_value(item, &mut path, 0) {
            Ok(value) => values.push(value),
            Err(description) => violations.push(Violation { index, field: path, description }),
        }
    }
    if violations.is_empty() {
        Ok(values)
    } else {
        Err(violations)
    }
}

pub enum Item {
    Text(String),
    Block(Value),
}

/// `count_tokens` input: each item a str or a block dict.
pub fn items_to_values(obj: &Bound<'_, PyAny>) -> Result<Vec<Item>, Vec<Violation>> {
    let mut items = Vec::new();
    let mut violations = Vec::new();
    for (index, item) in sequence_items(obj, "items")?.iter().enumerate() {
        let mut path = format!("items[{index}]");
        if let Ok(text) = item.cast::<PyString>() {
            match text.to_str() {
                Ok(s) => items.push(Item::Text(s.to_owned())),
                Err(_) => violations.push(Violation { index, field: path, description: "not valid Unicode".into() }),
            }
        } else if item.is_instance_of::<PyDict>() {
            match to_value(item, &mut path, 0) {
                Ok(value) => items.push(Item::Block(value)),
                Err(description) => violations.push(Violation { index, field: path, description }),
            }
        } else {
            let type_name = item.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            violations.push(Violation {
                index,
                field: path,
                description: format!("must be a str or a block dict, got {type_name}"),
            });
        }
    }
    if violations.is_empty() {
        Ok(items)
    } else {
        Err(violations)
    }
}

/// Converts one Python value. On error `path` names the offending field.
fn to_value(obj: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    if obj.is_none() {
        Ok(Value::Null)
    } else if let Ok(s) = obj.cast::<PyString>() {
        s.to_str().map(|s| Value::String(s.to_owned())).map_err(|_| "not valid Unicode (lone surrogate)".to_owned())
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            Ok(Value::Number(i.into()))
        } else if let Ok(u) = obj.extract::<u64>() {
            Ok(Value::Number(u.into()))
        } else {
            Err("integer out of the 64-bit range".to_owned())
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        Number::from_f64(f.value()).map(Value::Number).ok_or_else(|| format!("must be finite, got {}", f.value()))
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(dict.len());
        for (key, value) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(format!("has a non-string key {}", key.repr().map(|r| r.to_string()).unwrap_or_default()));
            };
            let key = key.to_str().map_err(|_| "has a key that is not valid Unicode".to_owned())?;
            let len = path.len();
            path.push('.');
            path.push_str(key);
            let value = to_value(&value, path, depth + 1)?;
            path.truncate(len);
            map.insert(key.to_owned(), value);
        }
        Ok(Value::Object(map))
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> =
            obj.try_iter().map_err(|e| e.to_string())?.collect::<PyResult<_>>().map_err(|e| e.to_string())?;
        let mut list = Vec::with_capacity(items.len());
        for (j, item) in items.iter().enumerate() {
            let len = path.len();
            path.push_str(&format!("[{j}]"));
            list.push(to_value(item, path, depth + 1)?);
            path.truncate(len);
        }
        Ok(Value::Array(list))
    } else {
        let type_name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        Err(format!("unsupported type {type_name} (use str, int, float, bool, None, list or dict)"))
    }
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
