//! Text counters: how many tokens a piece of text is, under one tokenizer. The heuristic scan,
//! bundled BPE vocabularies (splintr), and Hugging Face `tokenizer.json` files (tokenizers).

use tokenizers::Tokenizer as HfTokenizer;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

pub trait TextCounter: Send + Sync {
    fn count(&self, text: &str) -> u64;
    /// Whether counts are worth caching: true when hashing a text is far cheaper than counting it.
    fn cacheable(&self) -> bool;
    /// Bytes of text below which a batch stays on the calling thread, because the work is smaller
    /// than waking the thread pool.
    fn parallel_min_bytes(&self) -> usize;
    /// Forgets what the tokenizer memoizes internally (splintr's pre-token cache), so the next
    /// count is cold.
    fn clear_memo(&self) {}
}

/// `max(1, (3a + 8n + 11) // 12)` for `a` code points below U+0080 and `n` others
/// (docs/semantics.md §2).
pub struct Heuristic;

/// Bytes summed per lane before the 8-bit lane counters are widened (255 would overflow).
const HEURISTIC_LANES: usize = 32;
const HEURISTIC_STRIPE: usize = HEURISTIC_LANES * 255;

impl Heuristic {
    /// Code points below U+0080 and code points at or above it. In UTF-8 an ASCII code point is
    /// one byte below 0x80 and every other code point has exactly one lead byte at or above 0xC0,
    /// so counting bytes needs no decoding. Counting both classes in one pass into 32 byte-wide
    /// lanes lets the compiler keep the loop in vector registers: a memory-bandwidth scan. What
    /// is left over (most of a short message) goes eight bytes at a time rather than one.
    pub fn code_points(bytes: &[u8]) -> (u64, u64) {
        let (mut ascii, mut other) = (0u64, 0u64);
        for stripe in bytes.chunks(HEURISTIC_STRIPE) {
            let mut a = [0u8; HEURISTIC_LANES];
            let mut o = [0u8; HEURISTIC_LANES];
            let mut lanes = stripe.chunks_exact(HEURISTIC_LANES);
            for chunk in &mut lanes {
                for i in 0..HEURISTIC_LANES {
                    a[i] += u8::from(chunk[i] < 0x80);
                    o[i] += u8::from(chunk[i] >= 0xC0);
                }
            }
            ascii += a.iter().map(|&x| u64::from(x)).sum::<u64>();
            other += o.iter().map(|&x| u64::from(x)).sum::<u64>();
            let (tail_ascii, tail_other) = Heuristic::code_points_short(lanes.remainder());
            ascii += tail_ascii;
            other += tail_other;
        }
        (ascii, other)
    }

    /// `code_points` of fewer than `HEURISTIC_LANES` bytes, a word at a time: in each byte of a
    /// word, bit 7 clear is an ASCII byte, and bits 7 and 6 set a lead byte. The last word is
    /// padded with zero bytes, which would count as ASCII and are taken off.
    fn code_points_short(bytes: &[u8]) -> (u64, u64) {
        const HIGH: u64 = 0x8080_8080_8080_8080;
        debug_assert!(bytes.len() < HEURISTIC_LANES);
        // At most four words: each byte lane of the sums stays below 8, a byte's worth.
        let (mut a, mut o) = (0u64, 0u64);
        let mut add = |word: u64| {
            a += (!word & HIGH) >> 7;
            o += (word & (word << 1) & HIGH) >> 7;
        };
        let mut words = bytes.chunks_exact(8);
        for chunk in &mut words {
            add(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        add(u64::from_le_bytes(last));
        // The sum of a word's eight byte lanes lands in its top byte.
        let lanes = |sum: u64| sum.wrapping_mul(0x0101_0101_0101_0101) >> 56;
        (lanes(a) - (8 - rest.len()) as u64, lanes(o))
    }
}

impl TextCounter for Heuristic {
    fn count(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        let (ascii, other) = Heuristic::code_points(text.as_bytes());
        (3 * ascii + 8 * other).div_ceil(12).max(1)
    }

    fn cacheable(&self) -> bool {
        false // the scan is as fast as hashing
    }

    fn parallel_min_bytes(&self) -> usize {
        4 << 20
    }
}

/// A bundled byte-level BPE vocabulary, counted by splintr. Special-token spellings in the text
/// (`<|endoftext|>`, `<|im_start|>`) are counted as the ordinary text they are: a user who types
/// them sends characters, not control tokens.
pub struct Bpe {
    pub tokenizer: splintr::Tokenizer,
    /// Normalize to NFC first, as the model's own tokenizer.json does (Qwen).
    pub nfc: bool,
}

/// BPE costs ~10 ns a byte, so a few kilobytes already pay for a thread hand-off.
const BPE_PARALLEL_MIN_BYTES: usize = 16 << 10;

impl TextCounter for Bpe {
    fn count(&self, text: &str) -> u64 {
        if self.nfc && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            return self.tokenizer.encode_ordinary(&text.nfc().collect::<String>()).len() as u64;
        }
        self.tokenizer.encode_ordinary(text).len() as u64
    }

    fn cacheable(&self) -> bool {
        true
    }

    fn parallel_min_bytes(&self) -> usize {
        BPE_PARALLEL_MIN_BYTES
    }

    fn clear_memo(&self) {
        self.tokenizer.clear_cache();
    }
}

/// A Hugging Face `tokenizer.json`, counted by the `tokenizers` crate. Loaded without its
/// special added tokens, so special-token spellings in text count as ordinary text as for the
/// bundled profiles; non-special added tokens are vocabulary and stay.
pub struct HfJson(pub HfTokenizer);

impl HfJson {
    pub fn from_json(bytes: &[u8]) -> Result<HfJson, String> {
        let mut value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not a tokenizer.json: {e}"))?;
        if let Some(added) = value.get_mut("added_tokens").and_then(|a| a.as_array_mut()) {
            added.retain(|t| t.get("special").and_then(|s| s.as_bool()) != Some(true));
        }
        serde_json::from_value::<HfTokenizer>(value).map(HfJson).map_err(|e| format!("not a tokenizer.json: {e}"))
    }

    pub fn vocab_size(&self) -> u64 {
        self.0.get_vocab_size(true) as u64
    }
}

impl TextCounter for HfJson {
    fn count(&self, text: &str) -> u64 {
        // Encoding fails only on truncation or padding settings, which counting never enables.
        let encoding = self.0.encode_fast(text, false).unwrap_or_else(|e| panic!("tokenizer.json encode failed: {e}"));
        encoding.len() as u64
    }

    fn cacheable(&self) -> bool {
        true
    }

    fn parallel_min_bytes(&self) -> usize {
        BPE_PARALLEL_MIN_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(text: &str) -> u64 {
        let ascii = text.chars().filter(|c| (*c as u32) < 0x80).count() as u64;
        let other = text.chars().count() as u64 - ascii;
        if text.is_empty() {
            0
        } else {
            (3 * ascii + 8 * other).div_ceil(12).max(1)
        }
    }

    #[test]
    fn heuristic_worked_examples() {
        let h = Heuristic;
        assert_eq!(h.count(""), 0);
        assert_eq!(h.count("a"), 1); // (3 + 11) // 12
        assert_eq!(h.count("abcd"), 1); // (12 + 11) // 12
        assert_eq!(h.count("abcde"), 2); // (15 + 11) // 12
        assert_eq!(h.count("日本語"), 2); // (24 + 11) // 12
        assert_eq!(h.count("🙂🙂🙂🙂🙂🙂"), 4); // (48 + 11) // 12
        assert_eq!(h.count(&"x".repeat(400)), 100); // (1200 + 11) // 12
    }

    #[test]
    fn byte_counting_equals_code_point_counting() {
        let long_mixed = "héllo 日本語 🙂 ".repeat(2000); // crosses several stripes and lanes
        for text in [
            "héllo wörld",
            "日本語 and ascii",
            "🙂\u{7f}\u{80}\u{7ff}\u{800}\u{ffff}\u{10000}",
            "é".repeat(97).as_str(),
            "a".repeat(HEURISTIC_STRIPE + 33).as_str(),
            long_mixed.as_str(),
        ] {
            assert_eq!(Heuristic.count(text), reference(text), "{text}");
        }
        // Every prefix up to three lanes: each length of the word-at-a-time remainder and of
        // its zero padding, with lead and continuation bytes at every offset.
        let mixed = "aé日🙂\u{7f}\u{80}b".repeat(8);
        for end in (0..=mixed.len()).filter(|&end| mixed.is_char_boundary(end)) {
            assert_eq!(Heuristic.count(&mixed[..end]), reference(&mixed[..end]), "{end}");
        }
    }
}
