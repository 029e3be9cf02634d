//! Chunking keeps every word in order, never exceeds the word limit, and cuts on sentence
//! boundaries when sentences are short enough.

use engram_rag::chunk::{chunk_text, sentences, DEFAULT_CHUNK_WORDS};
use proptest::prelude::*;

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

proptest! {
    #[test]
    fn chunks_keep_every_word_in_order_within_the_limit(
        parts in prop::collection::vec(("[a-zA-Z]{1,8}", prop::sample::select(vec![" ", ". ", "! ", "? ", "\n", "\n\n", ", "])), 0..400),
        max in 1usize..130,
    ) {
        let text: String = parts.iter().map(|(w, sep)| format!("{w}{sep}")).collect();
        let chunks = chunk_text(&text, max);
        let joined: Vec<&str> = chunks.iter().flat_map(|c| words(c)).collect();
        prop_assert_eq!(joined, words(&text));
        for c in &chunks {
            let n = words(c).len();
            prop_assert!(n >= 1 && n <= max, "chunk of {} words, limit {}", n, max);
        }
    }
}

#[test]
fn chunks_end_on_sentence_boundaries() {
    let s: String = (0..56).map(|i| format!("Sentence number {i} has exactly seven words. ")).collect();
    let chunks = chunk_text(&s, DEFAULT_CHUNK_WORDS);
    assert_eq!(chunks.len(), 4, "56 sentences of 7 words, 14 per chunk of <= 100 words");
    for c in &chunks {
        assert!(c.ends_with("words."), "{c:?} ends inside a sentence");
        assert_eq!(words(c).len(), 98);
    }
}

#[test]
fn lines_end_sentences_and_long_sentences_are_cut() {
    assert_eq!(sentences("Subject: lunch\nHi Bob. See you?  Yes!\n\n"), vec!["Subject: lunch", "Hi Bob.", "See you?", "Yes!"]);
    let long = vec!["word"; 250].join(" ");
    let chunks = chunk_text(&format!("Short one. {long}. Tail."), 100);
    let sizes: Vec<usize> = chunks.iter().map(|c| words(c).len()).collect();
    assert_eq!(sizes, vec![2, 100, 100, 50, 1]);
}
