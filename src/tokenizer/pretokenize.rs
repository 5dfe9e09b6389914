//! The Qwen pre-tokenizer (TOKENIZER.md §3.2) as a hand-written scanner.
//!
//! The reference regexes need a look-ahead (`\s+(?!\S)`), and the crate has no regex engine
//! anyway, so the alternatives are tried in order over code points exactly as the regex would
//! (including its backtracking outcomes), like llama.cpp's custom splitters.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

use super::PreTokenizer;

const L: u8 = 1;
const M: u8 = 2;
const N: u8 = 4;
const WS: u8 = 8;

/// Class bits of one code point: L, M, N by general category; WS = Unicode White_Space.
#[inline]
fn class_of(c: char) -> u8 {
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            L
        } else if c.is_ascii_digit() {
            N
        } else if c.is_ascii_whitespace() || c == '\x0b' {
            // ASCII White_Space is \t \n \x0b \x0c \r and space; is_ascii_whitespace lacks \x0b.
            WS
        } else {
            0
        };
    }
    if c.is_whitespace() {
        return WS;
    }
    match get_general_category(c) {
        Gc::UppercaseLetter | Gc::LowercaseLetter | Gc::TitlecaseLetter | Gc::ModifierLetter | Gc::OtherLetter => L,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark => M,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => N,
        _ => 0,
    }
}

/// Case folding as the reference regex engine applies it to `(?i:'s|'t|'re|'ve|'m|'ll|'d)`.
/// Besides ASCII upper case, the only code point that folds to one of the letters s t r e v m l d
/// is U+017F LATIN SMALL LETTER LONG S (→ `s`; checked over all code points against HF
/// `tokenizers`/Oniguruma): `"'ſa"` splits as `'ſ`, `a`. llama.cpp spells the group `'[sS]|…` and
/// differs here; we follow the HF reference. (Other non-ASCII folds, e.g. KELVIN SIGN → `k`,
/// target letters no contraction uses.)
#[inline]
fn fold_case(c: char) -> char {
    if c == '\u{17f}' {
        's'
    } else {
        c.to_ascii_lowercase()
    }
}

/// Split `text` into pre-tokens, appending them to `out` (every byte of `text` lands in exactly
/// one piece, in order).
pub fn split<'a>(text: &'a str, variant: PreTokenizer, out: &mut Vec<&'a str>) {
    if text.is_empty() {
        return;
    }
    // qwen35 treats combining marks as part of words; qwen2 treats them as punctuation.
    let word_bits = match variant {
        PreTokenizer::Qwen2 => L,
        PreTokenizer::Qwen35 => L | M,
    };
    let offs: Vec<usize> = text.char_indices().map(|(o, _)| o).collect();
    let chars: Vec<char> = text.chars().collect();
    let cls: Vec<u8> = chars.iter().map(|&c| class_of(c)).collect();
    let n = chars.len();
    let is_word = |i: usize| cls[i] & word_bits != 0;
    // Punctuation class: not WS, not a word char, not a number.
    let is_punct = |i: usize| cls[i] & (WS | N | word_bits) == 0;
    let is_crlf = |i: usize| chars[i] == '\r' || chars[i] == '\n';

    let mut p = 0;
    while p < n {
        let end = next_end(p, n, &chars, &cls, &is_word, &is_punct, &is_crlf);
        let start_b = offs[p];
        let end_b = if end < n { offs[end] } else { text.len() };
        out.push(&text[start_b..end_b]);
        p = end;
    }
}

/// End (exclusive, in code points) of the pre-token starting at `p`.
fn next_end(
    p: usize,
    n: usize,
    chars: &[char],
    cls: &[u8],
    is_word: &impl Fn(usize) -> bool,
    is_punct: &impl Fn(usize) -> bool,
    is_crlf: &impl Fn(usize) -> bool,
) -> usize {
    let c = chars[p];

    // 1. Contractions ('s 't 're 've 'm 'll 'd), case-insensitive.
    if c == '\'' && p + 1 < n {
        let c1 = fold_case(chars[p + 1]);
        if matches!(c1, 's' | 't' | 'm' | 'd') {
            return p + 2;
        }
        if p + 2 < n {
            let c2 = fold_case(chars[p + 2]);
            if matches!((c1, c2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return p + 3;
            }
        }
    }

    // 2. Word: optional non-(\r \n L N) prefix, then a run of word chars.
    if !is_crlf(p) && cls[p] & N == 0 {
        let mut e = if is_word(p) {
            p + 1
        } else if p + 1 < n && is_word(p + 1) {
            p + 2
        } else {
            p
        };
        if e > p {
            while e < n && is_word(e) {
                e += 1;
            }
            return e;
        }
    }

    // 3. A single number char (digits are never grouped).
    if cls[p] & N != 0 {
        return p + 1;
    }

    // 4. Punctuation run with an optional leading space, then trailing \r / \n.
    let s = if c == ' ' { p + 1 } else { p };
    if s < n && is_punct(s) {
        let mut e = s + 1;
        while e < n && is_punct(e) {
            e += 1;
        }
        while e < n && is_crlf(e) {
            e += 1;
        }
        return e;
    }

    // 5. Whitespace run.
    if cls[p] & WS != 0 {
        let mut e = p + 1;
        while e < n && cls[e] & WS != 0 {
            e += 1;
        }
        // `\s*[\r\n]+`: up to and including the last line break of the run.
        if let Some(last) = (p..e).rev().find(|&i| is_crlf(i)) {
            return last + 1;
        }
        // `\s+(?!\S)`: leave the last space to prefix the following word/punctuation.
        if e - p > 1 && e < n {
            return e - 1;
        }
        return e;
    }

    // 6. Unreachable with these classes (every char falls in one branch above); kept as a
    // guard so the scanner always advances.
    p + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(text: &str, v: PreTokenizer) -> Vec<&str> {
        let mut out = Vec::new();
        split(text, v, &mut out);
        out
    }

    #[test]
    fn spec_examples() {
        let v = PreTokenizer::Qwen35;
        assert_eq!(sp("Hello world", v), ["Hello", " world"]);
        assert_eq!(sp("x  = 12", v), ["x", " ", " =", " ", "1", "2"]);
        assert_eq!(sp("a\n\n  b", v), ["a", "\n\n", " ", " b"]);
        assert_eq!(sp("don't", v), ["don", "'t"]);
    }

    #[test]
    fn more_cases() {
        let v = PreTokenizer::Qwen2;
        assert_eq!(sp("", v), Vec::<&str>::new());
        assert_eq!(sp("   ", v), ["   "]);
        assert_eq!(sp("a   ", v), ["a", "   "]);
        assert_eq!(sp("WE'VE", v), ["WE", "'VE"]);
        assert_eq!(sp("'n' x", v), ["'n", "'", " x"]);
        assert_eq!(sp("hi!!\n\nyo", v), ["hi", "!!\n\n", "yo"]);
        assert_eq!(sp("\tfoo", v), ["\tfoo"]);
        assert_eq!(sp("a \r\n b", v), ["a", " \r\n", " b"]);
    }

    #[test]
    fn long_s_is_a_contraction_letter() {
        // `(?i:'s)` matches U+017F under Unicode case folding (HF tokenizers does this).
        for v in [PreTokenizer::Qwen2, PreTokenizer::Qwen35] {
            assert_eq!(sp("'\u{17f}a", v), ["'\u{17f}", "a"]);
            assert_eq!(sp("x'\u{17f}t", v), ["x", "'\u{17f}", "t"]);
            assert_eq!(sp("'\u{17f}", v), ["'\u{17f}"]);
        }
    }

    #[test]
    fn marks_differ_between_variants() {
        // 'e' + COMBINING ACUTE: a word in qwen35, word + punctuation in qwen2.
        assert_eq!(sp("e\u{301}x", PreTokenizer::Qwen35), ["e\u{301}x"]);
        assert_eq!(sp("e\u{301}x", PreTokenizer::Qwen2), ["e", "\u{301}x"]);
    }
}
