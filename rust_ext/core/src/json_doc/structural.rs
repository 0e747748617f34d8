//! The structural reader: the fast path for well-formed text. Blocks are dense with short
//! strings (26 bytes on average in the benchmark's conversation, most under 16), so reading them
//! byte by byte was a cost per token (whitespace, separators, one scan per string) more than per
//! byte. Here the text is first classified 64 bytes at a time with SIMD compares into bit masks,
//! as simdjson does: which bytes are quotes that end or begin a string, which are escapes inside
//! one, which are `{}[]:,` outside strings, and where each number or literal begins. The reader
//! then walks those positions (a `tzcnt` each) and never looks at whitespace or at the inside of
//! a string without escapes.
//!
//! It writes the same tape as the precise reader (`reader.rs`), through the same code for keys,
//! escapes, numbers and literals. It only has to accept well-formed text the way the precise
//! reader does: on anything it does not expect, it stops and the precise reader reads the rest
//! from the element it was in, so every error message and position is the precise reader's
//! (`check_against_serde_json` holds both to serde_json).

use super::reader::{Place, Reader};
use super::{Kind, Span, MAX_DEPTH};

/// One 64-byte chunk classified: bit `i` stands for byte `i`.
#[derive(Clone, Copy, Default)]
struct Masks {
    quote: u64,
    backslash: u64,
    /// `{ } [ ] : ,`
    op: u64,
    /// What ends a number or literal: whitespace (space, tab, line feed, carriage return), `op`
    /// and `quote`.
    delimiter: u64,
    /// Bytes below 0x20, which no string may hold unescaped.
    control: u64,
}

/// The widest SIMD the machine has, found once per document.
#[derive(Clone, Copy)]
enum Simd {
    #[cfg(target_arch = "x86_64")]
    Sse2,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// Structural positions of a text in order, classified a chunk at a time as they are needed.
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    /// Offset of the chunk `bits` belongs to.
    base: usize,
    /// Its structural positions not yet taken.
    bits: u64,
    /// Offset of the next chunk to classify.
    next: usize,
    /// 1 when the next chunk's first byte is escaped (the chunk ended in an odd run of `\`).
    escaped_carry: u64,
    /// All ones when the next chunk begins inside a string.
    string_carry: u64,
    /// 1 when the last chunk ended inside a number or literal.
    scalar_carry: u64,
    simd: Simd,
    /// A control character inside a string: no structural is given from that chunk on, so the
    /// reader stops and the precise reader says what is wrong.
    broken: bool,
}

impl<'a> Cursor<'a> {
    /// A cursor over `bytes`, or None where there is no SIMD path (the precise reader reads).
    pub(super) fn new(bytes: &'a [u8]) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            let simd = if std::is_x86_feature_detected!("avx2") { Simd::Avx2 } else { Simd::Sse2 };
            Some(Cursor {
                bytes,
                base: 0,
                bits: 0,
                next: 0,
                escaped_carry: 0,
                string_carry: 0,
                scalar_carry: 0,
                simd,
                broken: false,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = bytes;
            None
        }
    }

    /// The next structural position; None at the end of the text or once `broken`.
    #[inline(always)]
    pub(super) fn next(&mut self) -> Option<usize> {
        while self.bits == 0 {
            if self.next >= self.bytes.len() || self.broken {
                return None;
            }
            self.classify_next();
        }
        let at = self.base + self.bits.trailing_zeros() as usize;
        self.bits &= self.bits - 1;
        Some(at)
    }

    /// Whether the text ended with no structural left, as opposed to a broken string.
    pub(super) fn finished(&mut self) -> bool {
        self.next().is_none() && !self.broken
    }

    #[inline(never)]
    fn classify_next(&mut self) {
        let start = self.next;
        let mut padded = [b' '; 64];
        let chunk: &[u8; 64] = match self.bytes.get(start..start + 64) {
            Some(chunk) => chunk.try_into().expect("64 bytes"),
            None => {
                // The last chunk, padded with spaces, which are never structural.
                padded[..self.bytes.len() - start].copy_from_slice(&self.bytes[start..]);
                &padded
            }
        };
        self.base = start;
        self.next = start + 64;
        match self.simd {
            #[cfg(target_arch = "x86_64")]
            Simd::Sse2 => self.take(x86::masks_sse2(chunk)),
            // SAFETY: `new` chose AVX2 only where the CPU has it.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { self.take_avx2(chunk) },
        }
    }

    /// `take` with the masks made by AVX2, inlined into one function.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn take_avx2(&mut self, chunk: &[u8; 64]) {
        self.take(x86::masks_avx2(chunk));
    }

    /// The structural positions of the chunk `masks` classify, and the carries to the next one.
    #[inline(always)]
    fn take(&mut self, masks: Masks) {
        let escaped = escaped_bits(masks.backslash, &mut self.escaped_carry);
        let quotes = masks.quote & !escaped;
        // Inside a string: from an opening quote (included) to its closing quote (excluded).
        let in_string = prefix_xor(quotes) ^ self.string_carry;
        self.string_carry = ((in_string as i64) >> 63) as u64;
        if masks.control & in_string != 0 {
            self.broken = true;
            self.bits = 0;
            return;
        }
        let outside = !in_string;
        let scalar = !masks.delimiter & outside;
        let scalar_starts = scalar & !((scalar << 1) | self.scalar_carry);
        self.scalar_carry = scalar >> 63;
        self.bits = (masks.op & outside) | quotes | scalar_starts | (masks.backslash & in_string);
    }
}

/// Each bit set from the lowest up to and including each set bit of `x`, alternately: bit `i`
/// is the parity of the set bits at or below `i`.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// The bytes escaped by a backslash: each one after an odd run of backslashes (simdjson's
/// branch-free method: subtracting the runs from the odd bits flips the codes of runs that start
/// on an even byte). `carry` is 1 when the chunk before ended in an odd run, and is updated.
#[inline(always)]
fn escaped_bits(backslash: u64, carry: &mut u64) -> u64 {
    const ODD: u64 = 0xAAAA_AAAA_AAAA_AAAA;
    if backslash == 0 {
        return std::mem::take(carry);
    }
    let potential = backslash & !*carry;
    let codes = ((potential << 1) | ODD).wrapping_sub(potential) ^ ODD;
    let escaped = codes ^ (backslash | *carry);
    let escape = codes & backslash;
    *carry = escape >> 63;
    escaped
}

/// Whether `byte` may end a number or literal: what follows one must not continue it.
fn ends_scalar(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b'[' | b']' | b'{' | b'}' | b'"')
}

impl Reader<'_> {
    /// The next element of the top-level array through `cursor` (as `next_element`), or None where
    /// the structural reader stops: the caller then lets the precise reader read from `pos` (the
    /// end of the last element), with the tape as it was.
    pub(super) fn fast_next_element(&mut self, cursor: &mut Cursor) -> Option<Option<(usize, Span)>> {
        let first = match self.place {
            Place::Closed => return Some(None),
            Place::Opened => cursor.next()?,
            Place::Between => {
                let separator = cursor.next()?;
                match self.bytes[separator] {
                    // A `]` after the comma is no value: the precise reader refuses it.
                    b',' => cursor.next()?,
                    b']' => return self.fast_close(cursor),
                    _ => return None,
                }
            }
        };
        if self.place == Place::Opened && self.bytes[first] == b']' {
            return self.fast_close(cursor);
        }
        let at = self.tape.entries.len();
        let end = self.fast_value(cursor, first, 0)?;
        self.pos = end;
        self.place = Place::Between;
        Some(Some((at, (first, end - first))))
    }

    /// After the array's `]`: nothing may follow but whitespace.
    fn fast_close(&mut self, cursor: &mut Cursor) -> Option<Option<(usize, Span)>> {
        if !cursor.finished() {
            return None;
        }
        self.pos = self.bytes.len();
        self.place = Place::Closed;
        Some(None)
    }

    /// The value beginning at structural position `at`; where it ends.
    fn fast_value(&mut self, cursor: &mut Cursor, at: usize, depth: usize) -> Option<usize> {
        match self.bytes[at] {
            b'"' => self.fast_string(cursor, at),
            b'{' if depth < MAX_DEPTH => self.fast_object(cursor, depth),
            b'[' if depth < MAX_DEPTH => self.fast_list(cursor, depth),
            b't' => self.fast_scalar(at, |r| r.literal("true", Kind::True)),
            b'f' => self.fast_scalar(at, |r| r.literal("false", Kind::False)),
            b'n' => self.fast_scalar(at, |r| r.literal("null", Kind::Null)),
            b'-' | b'0'..=b'9' => self.fast_scalar(at, Reader::number),
            _ => None,
        }
    }

    /// The string whose opening quote is at `open`: a span of the input, or (when a backslash
    /// comes before the closing quote) unescaped by the precise reader, whose escapes' positions
    /// are then passed over.
    #[inline(always)]
    fn fast_string(&mut self, cursor: &mut Cursor, open: usize) -> Option<usize> {
        let close = cursor.next()?;
        if self.bytes[close] == b'"' {
            self.push(Kind::Str, (open + 1) as u64, (close - open - 1) as u64);
            return Some(close + 1);
        }
        self.pos = close;
        self.escaped_string(open + 1)?;
        let end = self.pos;
        loop {
            let at = cursor.next()?;
            if at + 1 == end {
                return Some(end);
            }
            if at >= end {
                return None;
            }
        }
    }

    fn fast_scalar(&mut self, at: usize, read: impl FnOnce(&mut Self) -> Option<()>) -> Option<usize> {
        self.pos = at;
        read(self)?;
        match self.bytes.get(self.pos) {
            Some(&byte) if !ends_scalar(byte) => None,
            _ => Some(self.pos),
        }
    }

    fn fast_object(&mut self, cursor: &mut Cursor, depth: usize) -> Option<usize> {
        let (at, first_key) = self.open_object();
        let mut many = None;
        let mut next = cursor.next()?;
        if self.bytes[next] != b'}' {
            loop {
                if self.bytes[next] != b'"' {
                    return None;
                }
                self.fast_string(cursor, next)?;
                self.check_key(at, first_key, &mut many);
                let colon = cursor.next()?;
                if self.bytes[colon] != b':' {
                    return None;
                }
                let value = cursor.next()?;
                self.fast_value(cursor, value, depth + 1)?;
                next = cursor.next()?;
                match self.bytes[next] {
                    b',' => next = cursor.next()?,
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        self.close_container(at, first_key);
        Some(next + 1)
    }

    fn fast_list(&mut self, cursor: &mut Cursor, depth: usize) -> Option<usize> {
        let at = self.tape.entries.len();
        self.push(Kind::List, 0, 0);
        let mut next = cursor.next()?;
        if self.bytes[next] != b']' {
            loop {
                self.fast_value(cursor, next, depth + 1)?;
                next = cursor.next()?;
                match self.bytes[next] {
                    b',' => next = cursor.next()?,
                    b']' => break,
                    _ => return None,
                }
            }
        }
        self.tape.entries[at].a = self.tape.entries.len() as u64;
        Some(next + 1)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Masks;
    use std::arch::x86_64::*;

    /// One 16-byte lane's masks, as the low 16 bits of each field.
    #[inline(always)]
    unsafe fn lane_sse2(v: __m128i) -> [u32; 5] {
        let eq = |c: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8));
        // `[` and `{`, `]` and `}` differ in bit 5 only.
        let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        let brackets = _mm_or_si128(
            _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8)),
            _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8)),
        );
        let op = _mm_or_si128(brackets, _mm_or_si128(eq(b':'), eq(b',')));
        let space = _mm_or_si128(_mm_or_si128(eq(b' '), eq(b'\t')), _mm_or_si128(eq(b'\n'), eq(b'\r')));
        let control = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x1f)), _mm_set1_epi8(0x1f));
        let quote = eq(b'"');
        let delimiter = _mm_or_si128(_mm_or_si128(space, op), quote);
        [quote, eq(b'\\'), op, delimiter, control].map(|m| _mm_movemask_epi8(m) as u32)
    }

    pub(super) fn masks_sse2(chunk: &[u8; 64]) -> Masks {
        let mut masks = Masks::default();
        for lane in 0..4 {
            // SAFETY: SSE2 is part of x86-64; the load reads sixteen bytes inside `chunk`.
            let [quote, backslash, op, delimiter, control] =
                unsafe { lane_sse2(_mm_loadu_si128(chunk.as_ptr().add(16 * lane).cast())) };
            let shift = 16 * lane;
            masks.quote |= u64::from(quote) << shift;
            masks.backslash |= u64::from(backslash) << shift;
            masks.op |= u64::from(op) << shift;
            masks.delimiter |= u64::from(delimiter) << shift;
            masks.control |= u64::from(control) << shift;
        }
        masks
    }

    /// `masks_sse2`'s masks of one 32-byte lane, as the low 32 bits of each. A function of its
    /// own with the feature (no closures: a closure does not take its function's target features,
    /// and LLVM then builds each mask a byte at a time).
    ///
    /// # Safety
    /// The CPU must have AVX2; `offset` is 0 or 32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lane_avx2(chunk: &[u8; 64], offset: usize) -> [u64; 5] {
        // The load reads 32 bytes inside `chunk`, unaligned.
        let v = _mm256_loadu_si256(chunk.as_ptr().add(offset).cast());
        let folded = _mm256_or_si256(v, _mm256_set1_epi8(0x20));
        let brackets = _mm256_or_si256(
            _mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'{' as i8)),
            _mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'}' as i8)),
        );
        let punctuation = _mm256_or_si256(
            _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b':' as i8)),
            _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b',' as i8)),
        );
        let space = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b' ' as i8)),
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\t' as i8)),
            ),
            _mm256_or_si256(
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\n' as i8)),
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\r' as i8)),
            ),
        );
        let control = _mm256_cmpeq_epi8(_mm256_max_epu8(v, _mm256_set1_epi8(0x1f)), _mm256_set1_epi8(0x1f));
        let quote = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8));
        let op = _mm256_or_si256(brackets, punctuation);
        let mask = |m: __m256i| u64::from(_mm256_movemask_epi8(m) as u32);
        [
            mask(quote),
            mask(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8))),
            mask(op),
            mask(_mm256_or_si256(_mm256_or_si256(space, op), quote)),
            mask(control),
        ]
    }

    /// The masks with AVX2: two 32-byte lanes.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn masks_avx2(chunk: &[u8; 64]) -> Masks {
        let [q0, b0, o0, s0, c0] = lane_avx2(chunk, 0);
        let [q1, b1, o1, s1, c1] = lane_avx2(chunk, 32);
        Masks {
            quote: q0 | q1 << 32,
            backslash: b0 | b1 << 32,
            op: o0 | o1 << 32,
            delimiter: s0 | s1 << 32,
            control: c0 | c1 << 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Escaped bytes by the definition: a byte is escaped when an unescaped backslash precedes it.
    fn escaped_naive(bytes: &[u8]) -> Vec<bool> {
        let mut escaped = vec![false; bytes.len()];
        let mut next = false;
        for (i, &b) in bytes.iter().enumerate() {
            escaped[i] = next;
            next = !next && b == b'\\';
        }
        escaped
    }

    #[test]
    fn escaped_bits_match_the_definition_across_chunks() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..20_000 {
            // Backslash runs of every length, across chunk boundaries.
            let bytes: Vec<u8> = (0..192)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    if state % 3 == 0 {
                        b'a'
                    } else {
                        b'\\'
                    }
                })
                .collect();
            let expected = escaped_naive(&bytes);
            let mut carry = 0;
            for (c, chunk) in bytes.chunks(64).enumerate() {
                let backslash = chunk.iter().enumerate().fold(0u64, |m, (i, &b)| m | u64::from(b == b'\\') << i);
                let got = escaped_bits(backslash, &mut carry);
                for i in 0..64 {
                    assert_eq!(got >> i & 1 == 1, expected[64 * c + i], "chunk {c} byte {i}");
                }
            }
        }
    }

    #[test]
    fn simd_masks_agree() {
        for byte in 0..=255u8 {
            for at in [0, 15, 16, 31, 32, 63] {
                let mut chunk = [b'a'; 64];
                chunk[at] = byte;
                let sse2 = x86::masks_sse2(&chunk);
                let expect = |class: fn(u8) -> bool| {
                    chunk.iter().enumerate().fold(0u64, |m, (i, &b)| m | u64::from(class(b)) << i)
                };
                assert_eq!(sse2.quote, expect(|b| b == b'"'));
                assert_eq!(sse2.backslash, expect(|b| b == b'\\'));
                assert_eq!(sse2.op, expect(|b| b"{}[]:,".contains(&b)));
                assert_eq!(sse2.delimiter, expect(|b| b" \t\n\r{}[]:,\"".contains(&b)));
                assert_eq!(sse2.control, expect(|b| b < 0x20));
                let fields = |m: Masks| (m.quote, m.backslash, m.op, m.delimiter, m.control);
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: checked just above.
                    assert_eq!(fields(unsafe { x86::masks_avx2(&chunk) }), fields(sse2));
                }
            }
        }
    }
}
