//! Block and text token counts, in parallel once a batch holds enough text to pay for it.

use crate::block::Block;
use crate::profile::Profile;
use rayon::prelude::*;

/// DESIGN.md §4: framing + text pieces + participant name + tool-call names and arguments +
/// images, each piece counted on its own.
pub fn block_tokens(profile: &Profile, block: &Block) -> u64 {
    let text: u64 = block.pieces.iter().map(|p| profile.text_tokens(p)).sum();
    let calls: u64 = block.calls.iter().map(|c| profile.text_tokens(&c.name) + profile.text_tokens(&c.arguments)).sum();
    let images: u64 = block.images.iter().map(|i| profile.image_tokens(i)).sum();
    let name = block.name.as_deref().map_or(0, |n| profile.name_tokens(n));
    profile.block_overhead(block.role) + text + name + calls + images
}

/// Maps `count` over `items`, across the thread pool when their total size (by `bytes`) is worth
/// the hand-off for this profile, on the calling thread otherwise.
pub fn batch<T: Sync>(
    profile: &Profile,
    items: &[T],
    bytes: impl Fn(&T) -> usize,
    count: impl Fn(&T) -> u64 + Sync + Send,
) -> Vec<u64> {
    let threshold = profile.parallel_min_bytes();
    // Stop summing as soon as the threshold is reached: the sum itself is a pass over the batch.
    let mut total = 0;
    let parallel = items.len() > 1
        && items.iter().any(|item| {
            total += bytes(item);
            total >= threshold
        });
    if parallel {
        items.par_iter().map(count).collect()
    } else {
        items.iter().map(count).collect()
    }
}

/// Tokens of each block, in order. Takes references so a caller can count any selection.
pub fn count_blocks(profile: &Profile, blocks: &[&Block]) -> Vec<u64> {
    batch(profile, blocks, |b| b.text_bytes(), |b| block_tokens(profile, b))
}

/// Text tokens of each text, in order.
#[cfg(test)]
fn count_texts(profile: &Profile, texts: &[&str]) -> Vec<u64> {
    batch(profile, texts, |t| t.len(), |t| profile.text_tokens(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{Image, Kind, Role, ToolCall};
    use crate::profile::profile_by_name;

    fn block(role: Role, pieces: &[&str]) -> Block {
        Block {
            id: "b".to_owned(),
            role,
            kind: Kind::Message,
            name: None,
            pieces: pieces.iter().map(|p| (*p).to_owned()).collect(),
            calls: Vec::new(),
            result_ids: Vec::new(),
            images: Vec::new(),
            pinned: false,
            mandatory: false,
            injected: false,
            relevance: None,
            manual_excluded: false,
        }
    }

    #[test]
    fn heuristic_block_is_the_documented_sum() {
        let h = profile_by_name("heuristic").unwrap();
        let mut b = block(Role::Assistant, &["abcd", "日本語"]);
        b.calls.push(ToolCall { id: "c".to_owned(), name: "search".to_owned(), arguments: "{}".to_owned() });
        b.images.push(Image::default());
        b.name = Some("ignored by the heuristic".to_owned());
        assert_eq!(block_tokens(&h, &b), 4 + 1 + 2 + 2 + 1 + 765);
    }

    #[test]
    fn openai_block_counts_name_and_role_framing() {
        let p = profile_by_name("o200k_base").unwrap();
        let mut b = block(Role::User, &["Hello world"]);
        assert_eq!(block_tokens(&p, &b), 4 + 2);
        b.name = Some("alice".to_owned());
        assert_eq!(block_tokens(&p, &b), 4 + 2 + 1 + p.text_tokens("alice"));
    }

    #[test]
    fn parallel_and_serial_counts_agree() {
        let p = profile_by_name("cl100k_base").unwrap();
        let texts: Vec<String> =
            (0..2000).map(|i| format!("message {i}: the quick brown fox {}", "ü".repeat(i % 7))).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let batched = count_texts(&p, &refs);
        let serial: Vec<u64> = refs.iter().map(|t| p.text_tokens(t)).collect();
        assert_eq!(batched, serial);
    }
}
