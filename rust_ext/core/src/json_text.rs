//! JSON text of tool arguments as the model sees them: `", "` and `": "` separators, keys in
//! the given order, non-ASCII unescaped (the same text as Python's `json.dumps(v,
//! ensure_ascii=False)`).

use serde_json::ser::Formatter;
use serde_json::Value;
use std::io;

struct SpacedFormatter;

impl Formatter for SpacedFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

pub fn to_json_text(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, SpacedFormatter);
    serde::Serialize::serialize(value, &mut ser).expect("serializing a Value into memory cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_json_dumps() {
        let v = json!({"b": [1, true, null], "a": {"x": "é\n\"q\""}});
        assert_eq!(to_json_text(&v), r#"{"b": [1, true, null], "a": {"x": "é\n\"q\""}}"#);
        assert_eq!(to_json_text(&json!([])), "[]");
        assert_eq!(to_json_text(&json!({})), "{}");
        assert_eq!(to_json_text(&json!("\u{1f}")), "\"\\u001f\"");
    }
}
