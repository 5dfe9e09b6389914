//! Matching of special / added tokens in raw text before BPE (TOKENIZER.md §4.1).
//!
//! Candidates are indexed by their first char, each list sorted longest first, so a scan costs
//! one hash lookup per char plus a few `starts_with` checks where a candidate could begin.
//! The scan is leftmost-longest (HF's added-vocabulary semantics); for Qwen's `<…>`-shaped
//! tokens this is identical to llama.cpp's "longest token first over all fragments".

use std::collections::HashMap;

/// One piece of the input after special-token splitting.
#[derive(Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

struct Candidate {
    text: String,
    id: u32,
    /// CONTROL / UNKNOWN tokens are matched only with `parse_special`; USER_DEFINED always.
    control: bool,
}

pub struct SpecialMatcher {
    by_first: HashMap<char, Vec<Candidate>>,
}

impl SpecialMatcher {
    /// `specials`: (text, id, is_control). Empty texts are ignored.
    pub fn new(specials: impl IntoIterator<Item = (String, u32, bool)>) -> Self {
        let mut by_first: HashMap<char, Vec<Candidate>> = HashMap::new();
        for (text, id, control) in specials {
            let Some(first) = text.chars().next() else {
                continue;
            };
            by_first.entry(first).or_default().push(Candidate { text, id, control });
        }
        for list in by_first.values_mut() {
            // Longest first; ties by id so the choice is deterministic.
            list.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        }
        SpecialMatcher { by_first }
    }

    /// Split `text` into raw-text fragments and special-token ids.
    pub fn split<'a>(&self, text: &'a str, parse_special: bool, out: &mut Vec<Fragment<'a>>) {
        let mut raw_start = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let Some(c) = rest.chars().next() else {
                break;
            };
            let hit = self.by_first.get(&c).and_then(|list| {
                list.iter()
                    .find(|cand| (parse_special || !cand.control) && rest.starts_with(&cand.text))
            });
            match hit {
                Some(cand) => {
                    if raw_start < pos {
                        out.push(Fragment::Text(&text[raw_start..pos]));
                    }
                    out.push(Fragment::Token(cand.id));
                    pos += cand.text.len();
                    raw_start = pos;
                }
                None => pos += c.len_utf8(),
            }
        }
        if raw_start < text.len() {
            out.push(Fragment::Text(&text[raw_start..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_longest_first_and_respects_control() {
        let m = SpecialMatcher::new([
            ("<|im_end|>".to_string(), 2, true),
            ("<think>".to_string(), 3, false),
            ("<|im".to_string(), 9, true),
        ]);
        let mut out = Vec::new();
        m.split("a<|im_end|>b<think>", true, &mut out);
        assert_eq!(
            out,
            [
                Fragment::Text("a"),
                Fragment::Token(2),
                Fragment::Text("b"),
                Fragment::Token(3)
            ]
        );
        out.clear();
        m.split("a<|im_end|>b<think>", false, &mut out);
        assert_eq!(out, [Fragment::Text("a<|im_end|>b"), Fragment::Token(3)]);
    }
}
