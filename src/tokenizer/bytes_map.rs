//! GPT-2 `bytes_to_unicode` map (TOKENIZER.md §2): every byte has a printable code point, so
//! byte-level BPE can work on strings that never contain spaces or control characters.

/// Code point of each byte.
const fn build_byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        let cp = if printable {
            b as u32
        } else {
            let cp = 256 + n;
            n += 1;
            cp
        };
        // All values are < 0x144, far from the surrogate range, so this never fails.
        out[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    out
}

static BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// The mapped code point of byte `b`.
#[inline]
pub fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte a mapped code point stands for; `None` for code points outside the map.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    // Printable bytes map to themselves; the other 68 map to U+0100..=U+0143 in byte order.
    if (0x21..=0x7E).contains(&cp) || (0xA1..=0xAC).contains(&cp) || (0xAE..=0xFF).contains(&cp) {
        return Some(cp as u8);
    }
    if (0x100..0x144).contains(&cp) {
        return Some(NON_PRINTABLE[(cp - 0x100) as usize]);
    }
    None
}

/// The 68 non-printable bytes in increasing order (index n ↔ U+0100 + n).
const fn build_non_printable() -> [u8; 68] {
    let mut out = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if !printable {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
}

static NON_PRINTABLE: [u8; 68] = build_non_printable();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_points() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
    }

    #[test]
    fn round_trip_all_bytes() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate mapping for {b}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
