//! The protobuf wire format, as far as the gRPC layer needs it in Rust: writing varint and
//! length-delimited fields, walking an encoded message's fields, and taking one length-delimited
//! field out of it (so a large `blocks_json` goes to the JSON parser as bytes, never through a
//! Python `str`).

use std::fmt;
use std::io::{self, Write};
use std::ops::Range;

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

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// Part of an encoded message: bytes as they are, or a length-delimited field (an embedded
/// message, string or bytes) whose payload is the pieces in order. A reply built from pieces is
/// written in one pass into a buffer of its exact size, each leaf copied once.
pub enum Piece<'a> {
    Bytes(&'a [u8]),
    Field(u32, Vec<Piece<'a>>),
}

impl Piece<'_> {
    /// The encoded length.
    pub fn len(&self) -> usize {
        match self {
            Piece::Bytes(bytes) => bytes.len(),
            Piece::Field(field, pieces) => {
                let payload: usize = pieces.iter().map(Piece::len).sum();
                varint_len(u64::from(*field) << 3 | 2) + varint_len(payload as u64) + payload
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the encoding to `out` (a `Vec`, or a slice of at least `len()` bytes).
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Piece::Bytes(bytes) => out.write_all(bytes),
            Piece::Field(field, pieces) => {
                let mut header = Vec::with_capacity(20);
                put_field_header(&mut header, *field, pieces.iter().map(Piece::len).sum());
                out.write_all(&header)?;
                pieces.iter().try_for_each(|piece| piece.write(out))
            }
        }
    }
}

/// Why an encoded message could not be read.
#[derive(Debug, PartialEq, Eq)]
pub struct WireError {
    /// Byte offset of the field that could not be read.
    pub offset: usize,
    pub reason: &'static str,
}

impl WireError {
    /// This error of a message that lies `base` bytes into an enclosing one, at its offset there.
    pub fn within(self, base: usize) -> WireError {
        WireError { offset: base + self.offset, reason: self.reason }
    }
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

/// One field of an encoded message: its number, its value, and where it lies (key included).
pub struct Field<'a> {
    pub number: u32,
    pub value: Value<'a>,
    pub span: Range<usize>,
}

/// A field's value by its wire type (fixed-width fields are not read: this API uses none).
pub enum Value<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// The fields of an encoded message in order, each checked for framing; the first broken one
/// ends the walk with its error.
pub fn fields(message: &[u8]) -> impl Iterator<Item = Result<Field<'_>, WireError>> + '_ {
    let mut pos = 0;
    let mut broken = false;
    std::iter::from_fn(move || {
        if broken || pos >= message.len() {
            return None;
        }
        let field = next_field(message, &mut pos);
        broken = field.is_err();
        Some(field)
    })
}

fn next_field<'a>(message: &'a [u8], pos: &mut usize) -> Result<Field<'a>, WireError> {
    let start = *pos;
    let error = |reason| WireError { offset: start, reason };
    let key = read_varint(message, pos).ok_or(error("malformed field key"))?;
    let (number, wire_type) = (key >> 3, key & 7);
    if number == 0 {
        return Err(error("field number 0"));
    }
    let number = u32::try_from(number).map_err(|_| error("field number too large"))?;
    let value = match wire_type {
        0 => Value::Varint(read_varint(message, pos).ok_or(error("malformed varint"))?),
        1 | 5 => {
            *pos += if wire_type == 1 { 8 } else { 4 };
            Value::Fixed
        }
        2 => {
            let len = read_varint(message, pos).ok_or(error("malformed length"))?;
            let end = usize::try_from(len).ok().and_then(|len| pos.checked_add(len)).unwrap_or(usize::MAX);
            let payload = message.get(*pos..end).ok_or(error("field runs past the end of the message"))?;
            *pos = end;
            Value::Bytes(payload)
        }
        _ => return Err(error("unsupported wire type (groups are not used by this API)")),
    };
    if *pos > message.len() {
        return Err(error("field runs past the end of the message"));
    }
    Ok(Field { number, value, span: start..*pos })
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
    for found in fields(message) {
        let found = found?;
        match found.value {
            Value::Bytes(payload) if found.number == field => value = Some(payload),
            _ => rest.extend_from_slice(&message[found.span]),
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
    fn pieces_nest_fields_with_their_exact_lengths() {
        let long = vec![b'x'; 300]; // a two-byte length
        let piece = Piece::Field(
            2,
            vec![
                Piece::Bytes(b"head"),
                Piece::Field(11, vec![Piece::Bytes(b""), Piece::Field(2, vec![Piece::Bytes(&long)])]),
            ],
        );
        let mut inner = Vec::new();
        put_bytes(&mut inner, 2, &long);
        let mut middle = Vec::new();
        put_bytes(&mut middle, 11, &inner);
        let mut expected = Vec::new();
        put_bytes(&mut expected, 2, &[&b"head"[..], &middle].concat());
        let mut out = Vec::new();
        piece.write(&mut out).unwrap();
        assert_eq!(out, expected);
        assert_eq!(piece.len(), expected.len());
        let mut exact = vec![0; piece.len()];
        piece.write(&mut exact.as_mut_slice()).unwrap();
        assert_eq!(exact, expected);
        assert!(piece.write(&mut vec![0; piece.len() - 1].as_mut_slice()).is_err());
        assert!(Piece::Bytes(b"").is_empty() && !Piece::Field(1, vec![]).is_empty());
        assert_eq!((varint_len(0), varint_len(127), varint_len(128), varint_len(u64::MAX)), (1, 1, 2, 10));
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
