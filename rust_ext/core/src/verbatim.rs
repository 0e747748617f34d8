//! Which strings a text holds verbatim: the facts of a summarized history still in the prompt
//! (the plan's `facts_kept`). Runs of whitespace count as one space on both sides, so a date a
//! summary wrote on one line is found where a block wrapped it.

use aho_corasick::AhoCorasick;

/// `text` with each run of whitespace as one space.
fn spaced(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
        } else {
            out.push(c);
            in_space = false;
        }
    }
    out
}

/// For each needle, whether any of `texts` holds it (whitespace runs as one space); one pass
/// over the texts for all needles. An empty needle is never found.
pub fn found_in<'a>(texts: impl IntoIterator<Item = &'a str>, needles: &[&str]) -> Vec<bool> {
    let mut found = vec![false; needles.len()];
    let patterns: Vec<String> = needles.iter().map(|n| spaced(n)).collect();
    let Ok(automaton) = AhoCorasick::new(patterns.iter().filter(|p| !p.is_empty())) else { return found };
    // The automaton numbers the non-empty patterns only.
    let index: Vec<usize> = (0..needles.len()).filter(|&k| !patterns[k].is_empty()).collect();
    let mut left = index.len();
    for text in texts {
        if left == 0 {
            break;
        }
        for m in automaton.find_overlapping_iter(&spaced(text)) {
            let k = index[m.pattern().as_usize()];
            if !found[k] {
                found[k] = true;
                left -= 1;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_needle_once_across_texts_whatever_the_spacing() {
        let texts = ["fixed CVE-2021-28041 on Fri, 25 Feb\n   2022", "see core.hooksPath"];
        let needles = ["CVE-2021-28041", "Fri, 25 Feb 2022", "core.hooksPath", "hooks", "CVE-2021-2804x", ""];
        assert_eq!(found_in(texts, &needles), [true, true, true, true, false, false]);
    }

    #[test]
    fn overlapping_needles_are_all_found() {
        assert_eq!(found_in(["1:9.2p1-2+deb12u5"], &["9.2p1", "1:9.2p1-2+deb12u5", "deb12u5"]), [true; 3]);
    }
}
