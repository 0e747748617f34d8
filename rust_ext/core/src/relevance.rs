//! Lexical relevance of blocks to a query (the `vector-recall` strategy's fallback when a block
//! has neither a given relevance nor an embedding): Okapi BM25 over the candidate blocks.

use rustc_hash::FxHashMap;

/// BM25's term-frequency saturation and length normalization (the usual defaults).
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// CJK scripts are written without spaces: each of their characters is a term of its own.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK Extension A
        | 0x4E00..=0x9FFF    // CJK Unified Ideographs
        | 0xF900..=0xFAFF    // CJK Compatibility Ideographs
        | 0x20000..=0x2FFFF) // CJK Extensions B and later
}

/// Lower-cased terms: runs of letters and digits, and single CJK characters.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if is_cjk(c) {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            out.push(c.to_string());
        } else if c.is_alphanumeric() {
            current.extend(c.to_lowercase());
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The BM25 score of each document against `query`, with document frequencies taken over
/// `documents` themselves and Lucene's always-positive idf, `ln(1 + (N - df + 0.5) / (df + 0.5))`,
/// divided by the most the query's terms found among the documents can score, `Σ idf·(k1 + 1)`
/// over the terms some document holds (each repeated without end; a term no document holds
/// cannot tell them apart): 0 for a document sharing no term with the query (or a query without
/// terms), towards 1 for one holding every such term, rare terms weighing more. On that 0-to-1
/// scale it ranks with a caller's relevance and with embeddings' cosines; the order among
/// documents is plain BM25's. Each distinct query term counts once.
pub fn bm25(query: &str, documents: &[&str]) -> Vec<f64> {
    let mut query_terms = terms(query);
    query_terms.sort_unstable();
    query_terms.dedup();
    let documents: Vec<Vec<String>> = documents.iter().map(|d| terms(d)).collect();
    let n = documents.len() as f64;
    let average_length = documents.iter().map(Vec::len).sum::<usize>() as f64 / n.max(1.0);
    let frequencies: Vec<FxHashMap<&str, u32>> = documents
        .iter()
        .map(|doc| {
            let mut tf = FxHashMap::default();
            for term in doc {
                *tf.entry(term.as_str()).or_insert(0) += 1;
            }
            tf
        })
        .collect();
    let df: Vec<f64> = query_terms
        .iter()
        .map(|term| frequencies.iter().filter(|tf| tf.contains_key(term.as_str())).count() as f64)
        .collect();
    let idf: Vec<f64> = df.iter().map(|df| (1.0 + (n - df + 0.5) / (df + 0.5)).ln()).collect();
    let bound: f64 = idf.iter().zip(&df).filter(|(_, &df)| df > 0.0).map(|(idf, _)| idf * (K1 + 1.0)).sum();
    frequencies
        .iter()
        .zip(&documents)
        .map(|(tf, doc)| {
            if bound <= 0.0 {
                return 0.0; // no query terms (an empty sum of floats is -0.0)
            }
            let norm = K1 * (1.0 - B + B * doc.len() as f64 / average_length.max(1.0));
            let score = query_terms.iter().zip(&idf).fold(0.0, |sum, (term, idf)| {
                let f = f64::from(tf.get(term.as_str()).copied().unwrap_or(0));
                sum + idf * f * (K1 + 1.0) / (f + norm)
            });
            score / bound
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_split_words_lowercase_and_cjk_characters() {
        assert_eq!(terms("Hello, WORLD-42 東京へ"), ["hello", "world", "42", "東", "京", "へ"]);
        assert!(terms("  ...  ").is_empty());
    }

    #[test]
    fn matching_documents_outscore_others_and_rare_terms_weigh_more() {
        let docs = ["the dragon guards the northern pass", "the tavern serves ale", "the the the", "a dragon"];
        let scores = bm25("Where is the dragon?", &docs);
        assert!(scores[0] > scores[1] && scores[0] > scores[2], "{scores:?}");
        // "the" is in three documents, "dragon" in two: one "dragon" outweighs three "the".
        assert!(scores[3] > scores[2], "{scores:?}");
        assert_eq!(bm25("unrelated words", &docs), [0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn empty_inputs_score_a_positive_zero() {
        for scores in [bm25("", &["a b"]), bm25("...", &["a b", "c"]), bm25("a", &[""]), bm25("x", &["a"])] {
            assert!(scores.iter().all(|&s| s == 0.0 && s.is_sign_positive()), "{scores:?}");
        }
        assert!(bm25("a", &[]).is_empty());
    }

    #[test]
    fn scores_are_on_a_zero_to_one_scale_in_bm25_order() {
        let docs = ["dragon dragon dragon lair", "the dragon", "a tavern", "dragon lair map"];
        let scores = bm25("dragon lair", &docs);
        assert!(scores.iter().all(|&s| (0.0..1.0).contains(&s)), "{scores:?}");
        assert!(scores[0] > scores[3] && scores[3] > scores[1] && scores[1] > scores[2], "{scores:?}");
        assert_eq!(scores[2], 0.0);
        // Every term once, at the average length: 1 / (k1 + 1) of the bound; a query term no
        // document holds changes nothing.
        for query in ["red blue", "where are red and blue"] {
            let even = bm25(query, &["red blue", "blue red"]);
            assert!((even[0] - 1.0 / (K1 + 1.0)).abs() < 1e-12, "{query}: {even:?}");
        }
    }
}
