//! Block token counts, in parallel for large batches.

use crate::block::Block;
use crate::profile::Profile;
use rayon::prelude::*;

/// Below this many blocks, counting stays on the calling thread: the work is smaller than the
/// cost of waking the pool.
const PARALLEL_MIN_BLOCKS: usize = 256;

pub fn block_tokens(profile: &dyn Profile, block: &Block) -> u64 {
    let text: u64 = block.pieces.iter().map(|p| profile.text_tokens(p)).sum();
    let calls: u64 = block.calls.iter().map(|c| profile.text_tokens(&c.name) + profile.text_tokens(&c.arguments)).sum();
    let images: u64 = block.images.iter().map(|i| profile.image_tokens(i)).sum();
    profile.block_overhead() + text + calls + images
}

/// Tokens of each block, in order. Takes references so a caller can count any selection.
pub fn count_blocks(profile: &dyn Profile, blocks: &[&Block]) -> Vec<u64> {
    if blocks.len() >= PARALLEL_MIN_BLOCKS {
        blocks.par_iter().map(|b| block_tokens(profile, b)).collect()
    } else {
        blocks.iter().map(|b| block_tokens(profile, b)).collect()
    }
}
