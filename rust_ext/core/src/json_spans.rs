//! Where each object of a JSON array lies, found from structure alone, 64 bytes at a time (the
//! first stage of simdjson's design): a mask of each byte class (`\`, `"`, `{`, `}`) per block of
//! 64 bytes, the escaped bytes from the few backslashes, which bytes are inside strings by a
//! prefix XOR of the unescaped quotes, and the braces outside strings walked bit by bit.
//!
//! It reads nothing: for valid JSON the spans are those `json_doc::read_blocks` gives (the
//! differential check `check_against_serde_json`, and so the fuzz target `json_reader`, holds it
//! to that); for other text they may be spans of invalid JSON. So a span is only trusted as the
//! key of text the reader has read (`block_cache`). The block cache's scan is most of a shift from
//! JSON whose blocks were all seen before: read byte by byte (memchr between quotes) it was most of
//! such a shift, so it scans 64 bytes at a time (benchmarks/rust `json-readers` compares the two).

/// A byte range of the input: offset and length.
pub type Span = (usize, usize);

/// The span of each element of `text` (any bytes: only their structure is read), an array of
/// objects; None for anything but `[ {...}, ... ]` (JSON whitespace allowed between) or an
/// object left open.
pub fn object_spans<T: AsRef<[u8]> + ?Sized>(text: &T) -> Option<Vec<Span>> {
    scan(text.as_ref(), 0, usize::MAX)
}

/// The spans of the first `n` elements (fewer if there are fewer), the rest of the text unread.
pub fn first_object_spans<T: AsRef<[u8]> + ?Sized>(text: &T, n: usize) -> Option<Vec<Span>> {
    scan(text.as_ref(), 0, n)
}

/// The spans of the elements after the one that ends just before `from` (a span's end), as
/// `object_spans` gives them: the text before `from` is taken as scanned.
pub fn object_spans_after<T: AsRef<[u8]> + ?Sized>(text: &T, from: usize) -> Option<Vec<Span>> {
    scan(text.as_ref(), from, usize::MAX)
}

/// The spans from `from` on: 0, or the end of an element (outside any string, at depth 0, an
/// element before it).
fn scan(bytes: &[u8], from: usize, limit: usize) -> Option<Vec<Span>> {
    let rest = bytes.get(from..)?;
    let mut spans = Vec::with_capacity(limit.min(rest.len() / 256));
    let after_element = from > 0;
    // Where the text between elements began (`[` or `,` are checked there), the open element's
    // start, its brace depth.
    let (mut gap_start, mut start, mut depth) = (from, 0usize, 0usize);
    let (mut escape_carry, mut string_carry) = (0u64, 0u64);
    let mut padded = [b' '; 64];
    for (block_index, chunk) in rest.chunks(64).enumerate() {
        let base = from + block_index * 64;
        let block: &[u8; 64] = match chunk.try_into() {
            Ok(full) => full,
            Err(_) => {
                padded[..chunk.len()].copy_from_slice(chunk);
                &padded
            }
        };
        let masks = Masks::of(block);
        let escaped = escaped_bytes(masks.backslash, &mut escape_carry);
        let quotes = masks.quote & !escaped;
        let in_string = prefix_xor(quotes) ^ string_carry;
        string_carry = 0u64.wrapping_sub(in_string >> 63);
        let mut braces = (masks.open | masks.close) & !in_string;
        while braces != 0 {
            let at = base + braces.trailing_zeros() as usize;
            braces &= braces - 1;
            if bytes[at] == b'{' {
                if depth == 0 {
                    if !separated(&bytes[gap_start..at], spans.is_empty() && !after_element) {
                        return None;
                    }
                    start = at;
                }
                depth += 1;
            } else {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    spans.push((start, at + 1 - start));
                    if spans.len() == limit {
                        return Some(spans);
                    }
                    gap_start = at + 1;
                }
            }
        }
    }
    if depth != 0 || string_carry != 0 {
        return None;
    }
    let tail = trim_whitespace(&bytes[gap_start..]);
    let closed = if spans.is_empty() && !after_element {
        matches!(tail, [b'[', inner @ .., b']'] if trim_whitespace(inner).is_empty())
    } else {
        tail == b"]"
    };
    closed.then_some(spans)
}

/// Whether the text before an element is what JSON allows there: `[` before the first, `,`
/// before any other, and whitespace.
fn separated(gap: &[u8], first: bool) -> bool {
    trim_whitespace(gap) == if first { b"[" } else { b"," }
}

fn trim_whitespace(mut text: &[u8]) -> &[u8] {
    while let [b' ' | b'\n' | b'\r' | b'\t', rest @ ..] = text {
        text = rest;
    }
    while let [rest @ .., b' ' | b'\n' | b'\r' | b'\t'] = text {
        text = rest;
    }
    text
}

/// The bytes an odd run of backslashes escapes, from the backslashes of a block (rare: walked
/// one by one); `carry` is whether the block's first byte is escaped, and is set for the next.
fn escaped_bytes(backslashes: u64, carry: &mut u64) -> u64 {
    let mut escaped = *carry;
    let mut rest = backslashes & !escaped;
    *carry = 0;
    while rest != 0 {
        let at = rest.trailing_zeros();
        if at == 63 {
            *carry = 1;
        } else {
            escaped |= 1 << (at + 1);
        }
        // The escaped byte (a backslash or not) starts nothing.
        rest &= (rest - 1) & !escaped;
    }
    escaped
}

/// Bit i set when an odd number of bits at or below i are set: which bytes lie between an
/// opening quote (included) and its closing quote (excluded).
fn prefix_xor(mut bits: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        bits ^= bits << shift;
    }
    bits
}

/// One bit per byte of a 64-byte block, for each byte class the scan follows.
struct Masks {
    backslash: u64,
    quote: u64,
    open: u64,
    close: u64,
}

impl Masks {
    #[cfg(target_arch = "x86_64")]
    fn of(block: &[u8; 64]) -> Masks {
        use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
        let mut masks = Masks { backslash: 0, quote: 0, open: 0, close: 0 };
        for (part, bytes) in block.chunks_exact(16).enumerate() {
            // SAFETY: SSE2 is part of x86-64; each load reads exactly the sixteen bytes of
            // `bytes` and needs no alignment.
            let [backslash, quote, open, close] = unsafe {
                let v = _mm_loadu_si128(bytes.as_ptr().cast());
                [b'\\', b'"', b'{', b'}']
                    .map(|class| _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(class as i8))) as u16 as u64)
            };
            let shift = 16 * part;
            masks.backslash |= backslash << shift;
            masks.quote |= quote << shift;
            masks.open |= open << shift;
            masks.close |= close << shift;
        }
        masks
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn of(block: &[u8; 64]) -> Masks {
        let mask = |class: u8| block.iter().enumerate().fold(0u64, |m, (i, &b)| m | (u64::from(b == class) << i));
        Masks { backslash: mask(b'\\'), quote: mask(b'"'), open: mask(b'{'), close: mask(b'}') }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_of_objects_across_blocks_with_escapes_and_braces_in_strings() {
        let objects = [
            r#"{"id":"a","content":"x \"{ not a brace }\" \\"}"#.to_owned(),
            format!(r#"{{"id":"b","content":"{}\\\\","n":{{"deep":[1,{{"x":2}}]}}}}"#, "y".repeat(200)),
            format!(r#"{{"id":"c","content":"{}\"}}"}}"#, "\\\\".repeat(40)),
        ];
        for separator in [",", " ,\n\t", ",  "] {
            let text = format!(" [\n{}] \n", objects.join(separator));
            let spans = object_spans(&text).expect("an array of objects");
            let found: Vec<&str> = spans.iter().map(|&(s, l)| &text[s..s + l]).collect();
            assert_eq!(found, objects.iter().map(String::as_str).collect::<Vec<_>>());
        }
        let text = format!("[{}]", objects.join(","));
        assert_eq!(first_object_spans(&text, 2).unwrap(), object_spans(&text).unwrap()[..2]);
        assert_eq!(first_object_spans("[{}, oops", 1), Some(vec![(1, 2)]), "the rest is not read");
        let all = object_spans(&text).unwrap();
        for (k, &(start, len)) in all.iter().enumerate() {
            assert_eq!(object_spans_after(&text, start + len).unwrap(), all[k + 1..], "after element {k}");
        }
        assert_eq!(object_spans_after("[{}]]", 3), None, "the rest is checked as the whole scan checks it");
        assert_eq!(object_spans_after("[{} {}]", 3), None);
        assert_eq!(object_spans_after("[{}", 3), None);
        assert_eq!(object_spans("[]"), Some(vec![]));
        assert_eq!(object_spans(" [ \n ] "), Some(vec![]));
    }

    #[test]
    fn anything_else_has_no_spans() {
        for text in [
            "",
            "[",
            "]",
            "{}",
            "[{}",
            "[{}]]",
            "[{} {}]",
            "[{},]",
            "[,{}]",
            "[{}],",
            "[1]",
            "[{}, 1]",
            "[\"{}\"]",
            "[{\"a\":\"}]",
            "[{}}]",
            "[{\"a\":\"\\\"}]",
            "x[{}]",
            "[{}]x",
            "[[]]",
        ] {
            assert_eq!(object_spans(text), None, "{text:?}");
        }
    }

    #[test]
    fn an_escape_at_the_end_of_a_block_escapes_the_next_blocks_first_byte() {
        for pad in 0..70 {
            let object = format!(r#"{{"a":"{}\"}}\\","b":"}}"}}"#, "p".repeat(pad));
            let text = format!("[{object}]");
            assert_eq!(object_spans(&text), Some(vec![(1, object.len())]), "pad {pad}");
        }
    }
}
