//! The two protobuf wire types the gRPC replies need built in Rust (varint and length-delimited).

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint field (int64, uint64, bool); proto3 omits the default 0.
pub fn put_varint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        varint(out, u64::from(field) << 3);
        varint(out, value);
    }
}

/// A length-delimited field (string, bytes, embedded message), written even when empty.
pub fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field) << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}
