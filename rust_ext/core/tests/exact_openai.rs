//! The bundled OpenAI profiles count exactly as tiktoken does (tiktoken-rs: tiktoken's algorithm
//! over OpenAI's own rank files) on the shipped corpus, special-token spellings included as
//! ordinary text.

use contextshift_core::profile_by_name;
use serde_json::Value;

fn corpus() -> Vec<(String, String)> {
    let data: Value = serde_json::from_str(include_str!("../../../tests/data/tokenizer_corpus.json")).unwrap();
    data["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_owned(), c["text"].as_str().unwrap().to_owned()))
        .collect()
}

fn check(profile: &str, reference: &tiktoken_rs::CoreBPE) {
    let p = profile_by_name(profile).unwrap();
    for (name, text) in corpus() {
        let expected = reference.encode_ordinary(&text).len() as u64;
        assert_eq!(p.text_tokens(&text), expected, "{profile} on {name}");
        // A second count comes from the cache and must not differ.
        assert_eq!(p.text_tokens(&text), expected, "{profile} on {name}, cached");
    }
}

#[test]
fn o200k_base_equals_tiktoken() {
    check("o200k_base", &tiktoken_rs::o200k_base().unwrap());
}

#[test]
fn cl100k_base_equals_tiktoken() {
    check("cl100k_base", &tiktoken_rs::cl100k_base().unwrap());
}
