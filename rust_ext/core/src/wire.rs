//! The protobuf wire format, as far as the gRPC layer needs it in Rust: writing varint and
//! length-delimited fields, and taking one length-delimited field out of an encoded message (so
//! a large `blocks_json` goes to the JSON parser as bytes, never through a Python `str`).

use std::fmt;

fn put_varint_raw(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint field (int64, uint64, bool); proto3 omits the default 0.
pub fn put_varint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        put_varint_raw(out, u64::from(field) << 3);
        put_varint_raw(out, value);
    }
}

/// The key and length of a length-delimited field whose `len` payload bytes follow.
pub fn put_field_header(out: &mut Vec<u8>, field: u32, len: usize) {
    put_varint_raw(out, u64::from(field) << 3 | 2);
    put_varint_raw(out, len as u64);
}

/// A length-delimited field (string, bytes, embedded message), written even when empty.
pub fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_field_header(out, field, bytes.len());
    out.extend_from_slice(bytes);
}

/// Why an encoded message could not be read.
#[derive(Debug, PartialEq, Eq)]
pub struct WireError {
    /// Byte offset of the field that could not be read.
    pub offset: usize,
    pub reason: &'static str,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None // more than ten bytes
}

/// An encoded message split around one of its length-delimited fields.
#[derive(Debug, PartialEq, Eq)]
pub struct Split<'a> {
    /// The message without any occurrence of the field.
    pub rest: Vec<u8>,
    /// The field's payload: its last occurrence, as protobuf parsers read a singular field.
    pub value: Option<&'a [u8]>,
}

/// Takes the length-delimited field `field` out of the encoded `message`, checking the framing
/// of every field on the way (the rest is left for a protobuf parser to read).
pub fn split_field(message: &[u8], field: u32) -> Result<Split<'_>, WireError> {
    let mut rest = Vec::with_capacity(message.len().min(4096));
    let mut value = None;
    let mut pos = 0;
    while pos < message.len() {
        let start = pos;
        let error = |reason| WireError { offset: start, reason };
        let key = read_varint(message, &mut pos).ok_or(error("malformed field key"))?;
        let (number, wire_type) = (key >> 3, key & 7);
        if number == 0 {
            return Err(error("field number 0"));
        }
        let payload_start;
        match wire_type {
            0 => {
                read_varint(message, &mut pos).ok_or(error("malformed varint"))?;
                payload_start = pos;
            }
            1 | 5 => {
                pos += if wire_type == 1 { 8 } else { 4 };
                payload_start = pos;
            }
            2 => {
                let len = read_varint(message, &mut pos).ok_or(error("malformed length"))?;
                payload_start = pos;
                pos = usize::try_from(len).ok().and_then(|len| pos.checked_add(len)).unwrap_or(usize::MAX);
            }
            _ => return Err(error("unsupported wire type (groups are not used by this API)")),
        }
        if pos > message.len() {
            return Err(error("field runs past the end of the message"));
        }
        if number == u64::from(field) && wire_type == 2 {
            value = Some(&message[payload_start..pos]);
        } else {
            rest.extend_from_slice(&message[start..pos]);
        }
    }
    Ok(Split { rest, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(fields: &[(u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (field, bytes) in fields {
            put_bytes(&mut out, *field, bytes);
        }
        out
    }

    #[test]
    fn takes_out_the_last_occurrence_and_keeps_the_rest() {
        let mut encoded = message(&[(1, b"a"), (2, b"first"), (3, b"")]);
        put_varint(&mut encoded, 9, 300);
        encoded.extend(message(&[(2, b"second")]));
        let split = split_field(&encoded, 2).unwrap();
        assert_eq!(split.value, Some(&b"second"[..]));
        let mut expected = message(&[(1, b"a"), (3, b"")]);
        put_varint(&mut expected, 9, 300);
        assert_eq!(split.rest, expected);
    }

    #[test]
    fn absent_field_and_fixed_width_fields() {
        let mut encoded = vec![(4 << 3) | 1];
        encoded.extend([0u8; 8]);
        encoded.push((5 << 3) | 5);
        encoded.extend([0u8; 4]);
        let split = split_field(&encoded, 2).unwrap();
        assert_eq!(split, Split { rest: encoded.clone(), value: None });
        assert_eq!(split_field(&[], 2).unwrap(), Split { rest: vec![], value: None });
    }

    #[test]
    fn framing_errors_name_the_offset() {
        let truncated = &message(&[(1, b"ok"), (2, b"cut short")])[..8];
        assert_eq!(
            split_field(truncated, 2),
            Err(WireError { offset: 4, reason: "field runs past the end of the message" })
        );
        assert_eq!(split_field(&[0x08], 2).unwrap_err().reason, "malformed varint");
        assert_eq!(split_field(&[0x80], 2).unwrap_err().reason, "malformed field key");
        assert_eq!(
            split_field(&[0x0b], 2).unwrap_err().reason,
            "unsupported wire type (groups are not used by this API)"
        );
        assert_eq!(split_field(&[0x02, 0x00], 2).unwrap_err().reason, "field number 0");
        let huge_length = [0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(split_field(&huge_length, 2).unwrap_err().offset, 0);
    }
}
