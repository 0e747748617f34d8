//! Tokenizer profiles. A profile turns text, images and message framing into tokens; the
//! exact BPE profiles of a later issue implement the same trait.

use crate::block::Image;

pub trait Profile: Sync {
    fn name(&self) -> &'static str;
    /// True when counts estimate rather than reproduce the model's tokenizer.
    fn approximate(&self) -> bool;
    fn text_tokens(&self, text: &str) -> u64;
    fn image_tokens(&self, image: &Image) -> u64;
    /// Framing tokens every block costs (role markers, separators).
    fn block_overhead(&self) -> u64;
    /// Tokens the prompt costs once (reply priming).
    fn prompt_overhead(&self) -> u64;
}

/// Exact arithmetic a caller can predict (DESIGN.md §4): `max(1, (3a + 8n + 11) // 12)` for
/// `a` code points below U+0080 and `n` others, 765 per image, 4 per block.
pub struct Heuristic;

pub const HEURISTIC_IMAGE_TOKENS: u64 = 765;
pub const HEURISTIC_BLOCK_OVERHEAD: u64 = 4;

impl Profile for Heuristic {
    fn name(&self) -> &'static str {
        "heuristic"
    }

    fn approximate(&self) -> bool {
        true
    }

    fn text_tokens(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        // In UTF-8 an ASCII code point is one byte below 0x80 and every other code point has
        // exactly one lead byte at or above 0xC0, so two byte counts give both numbers without
        // decoding. Both loops vectorize.
        let bytes = text.as_bytes();
        let ascii = bytes.iter().filter(|&&b| b < 0x80).count() as u64;
        let other = bytes.iter().filter(|&&b| b >= 0xC0).count() as u64;
        (3 * ascii + 8 * other).div_ceil(12).max(1)
    }

    fn image_tokens(&self, _image: &Image) -> u64 {
        HEURISTIC_IMAGE_TOKENS
    }

    fn block_overhead(&self) -> u64 {
        HEURISTIC_BLOCK_OVERHEAD
    }

    fn prompt_overhead(&self) -> u64 {
        0
    }
}

/// Every profile this build knows, by name.
pub static PROFILES: &[&dyn Profile] = &[&Heuristic];

pub fn profile_by_name(name: &str) -> Option<&'static dyn Profile> {
    PROFILES.iter().copied().find(|p| p.name() == name)
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
        assert_eq!(h.text_tokens(""), 0);
        assert_eq!(h.text_tokens("a"), 1); // (3 + 11) // 12
        assert_eq!(h.text_tokens("abcd"), 1); // (12 + 11) // 12
        assert_eq!(h.text_tokens("abcde"), 2); // (15 + 11) // 12
        assert_eq!(h.text_tokens("日本語"), 2); // (24 + 11) // 12
        assert_eq!(h.text_tokens("🙂🙂🙂🙂🙂🙂"), 4); // (48 + 11) // 12
        assert_eq!(h.text_tokens(&"x".repeat(400)), 100); // (1200 + 11) // 12
    }

    #[test]
    fn byte_counting_equals_code_point_counting() {
        for text in [
            "héllo wörld",
            "日本語 and ascii",
            "🙂\u{7f}\u{80}\u{7ff}\u{800}\u{ffff}\u{10000}",
            "é".repeat(97).as_str(),
        ] {
            assert_eq!(Heuristic.text_tokens(text), reference(text), "{text}");
        }
    }

    #[test]
    fn profiles_by_name() {
        assert_eq!(profile_by_name("heuristic").map(|p| p.name()), Some("heuristic"));
        assert!(profile_by_name("nope").is_none());
    }
}
