//! Byte-level BPE merge loop (TOKENIZER.md §4.2), working on token ids rather than strings.
//!
//! Each merge "a b" is resolved at load time to (id(a), id(b)) → (rank, id(ab)); a pre-token
//! starts as the ids of its single mapped bytes, so the loop never builds strings. Pairs sit in
//! a min-heap keyed by (rank, position) over a linked list of symbols; stale heap entries are
//! detected by re-checking the neighbours' ids when popped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;

use super::bytes_map::byte_to_char;
use crate::{Error, Result};

/// Pieces longer than this are not cached (they are rare and would bloat the cache).
const CACHE_MAX_PIECE: usize = 64;
/// The cache is cleared when it grows past this many entries, bounding memory on long inputs.
const CACHE_MAX_ENTRIES: usize = 200_000;

pub struct Bpe {
    /// (left id, right id) → (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Id of the single-char token of each byte's mapped code point.
    byte_ids: [u32; 256],
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

const NONE: usize = usize::MAX;

/// Heap entry: (rank, left index, right index, left id, right id), smallest first.
type PairEntry = Reverse<(u32, usize, usize, u32, u32)>;

impl Bpe {
    /// Build from merge strings (rank = index). `lookup` maps token text to id. Merges whose
    /// parts or result are not in the vocabulary can never fire and are skipped; their count
    /// is returned so the caller can warn. A vocabulary without a token for each of the 256
    /// byte symbols is refused: text containing a missing byte could not be encoded, and
    /// dropping it would change the text silently.
    pub fn new(merges: &[String], lookup: &HashMap<String, u32>) -> Result<(Bpe, usize)> {
        let byte_ids = byte_ids(lookup)?;
        let mut map = crate::alloc::map_with_capacity(merges.len(), "BPE merges")?;
        let mut skipped = 0usize;
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after position 0 (a part could itself start with ' '
            // in non-byte-level vocabs).
            let split = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
            let Some(i) = split else {
                skipped += 1;
                continue;
            };
            let (a, b) = (&m[..i], &m[i + 1..]);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            match (lookup.get(a), lookup.get(b), lookup.get(joined.as_str())) {
                (Some(&ia), Some(&ib), Some(&ij)) => {
                    // Keep the first (lowest) rank if a pair is listed twice.
                    map.entry((ia, ib)).or_insert((rank as u32, ij));
                }
                _ => skipped += 1,
            }
        }
        let bpe = Bpe {
            merges: map,
            byte_ids,
            cache: Mutex::new(HashMap::new()),
        };
        Ok((bpe, skipped))
    }

    /// Number of usable merges.
    #[cfg(test)]
    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    /// Append the ids of one pre-token to `out`.
    pub fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        let cacheable = piece.len() <= CACHE_MAX_PIECE;
        if cacheable {
            // A poisoned lock only means another thread panicked mid-insert; the map itself is
            // still a valid cache, so keep using it.
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        self.merge_loop(piece.as_bytes(), out);
        if cacheable {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= CACHE_MAX_ENTRIES {
                cache.clear();
            }
            cache.insert(piece.to_owned(), out[start..].to_vec());
        }
    }

    fn merge_loop(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let n = bytes.len();
        let mut syms: Vec<Sym> = bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                id: self.byte_ids[b as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            })
            .collect();
        if n == 1 {
            out.push(syms[0].id);
            return;
        }

        // Lowest rank first, ties broken by the leftmost position, as HF and llama.cpp do.
        let mut heap: BinaryHeap<PairEntry> = BinaryHeap::with_capacity(n);
        let try_push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if let Some(&(rank, _)) = self.merges.get(&(syms[l].id, syms[r].id)) {
                heap.push(Reverse((rank, l, r, syms[l].id, syms[r].id)));
            }
        };
        for i in 0..n - 1 {
            try_push(&mut heap, &syms, i, i + 1);
        }

        while let Some(Reverse((_, l, r, lid, rid))) = heap.pop() {
            // Stale if either side has merged since (ids change) or is gone.
            if !syms[l].alive || !syms[r].alive || syms[l].next != r {
                continue;
            }
            if syms[l].id != lid || syms[r].id != rid {
                continue;
            }
            let Some(&(_, merged)) = self.merges.get(&(lid, rid)) else {
                continue;
            };
            syms[l].id = merged;
            syms[r].alive = false;
            let rn = syms[r].next;
            syms[l].next = rn;
            if rn != NONE {
                syms[rn].prev = l;
            }
            let lp = syms[l].prev;
            if lp != NONE {
                try_push(&mut heap, &syms, lp, l);
            }
            if rn != NONE {
                try_push(&mut heap, &syms, l, rn);
            }
        }

        let mut i = 0;
        while i != NONE {
            out.push(syms[i].id);
            i = syms[i].next;
        }
    }
}

/// The id of each byte's single-symbol token; an error naming the first byte without one.
fn byte_ids(lookup: &HashMap<String, u32>) -> Result<[u32; 256]> {
    let mut ids = [0u32; 256];
    let mut buf = [0u8; 4];
    for (b, slot) in ids.iter_mut().enumerate() {
        let c = byte_to_char(b as u8);
        *slot = *lookup.get(&*c.encode_utf8(&mut buf)).ok_or_else(|| {
            Error::Tokenizer(format!(
                "the vocabulary has no token for byte {b:#04x} (symbol '{c}'); a byte-level BPE \
                 vocabulary needs one for each of the 256 bytes"
            ))
        })?;
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 256 byte symbols (ids 0..256), then `words` (ids from 256).
    fn vocab(words: &[&str]) -> HashMap<String, u32> {
        (0..=255u8)
            .map(|b| byte_to_char(b).to_string())
            .chain(words.iter().map(|w| w.to_string()))
            .enumerate()
            .map(|(i, w)| (w, i as u32))
            .collect()
    }

    fn id(v: &HashMap<String, u32>, w: &str) -> u32 {
        v[w]
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        let v = vocab(&["ab", "bc", "abc", "aa"]);
        let merges: Vec<String> = ["b c", "a b", "a bc", "a a"].iter().map(|s| s.to_string()).collect();
        let (bpe, skipped) = Bpe::new(&merges, &v).unwrap();
        assert_eq!((bpe.n_merges(), skipped), (4, 0));
        let enc = |s: &str| {
            let mut out = Vec::new();
            bpe.encode_piece(s, &mut out);
            out
        };
        // "b c" (rank 0) beats "a b" (rank 1), then "a bc" completes the word.
        assert_eq!(enc("abc"), [id(&v, "abc")]);
        assert_eq!(enc("ab"), [id(&v, "ab")]);
        // Equal ranks: leftmost pair first → "aa" + "a".
        assert_eq!(enc("aaa"), [id(&v, "aa"), id(&v, "a")]);
        // Cached result is identical.
        assert_eq!(enc("aaa"), [id(&v, "aa"), id(&v, "a")]);
    }

    #[test]
    fn skips_merges_outside_vocab() {
        let v = vocab(&[]);
        let merges = vec!["a b".to_string(), "nospace".to_string()];
        let (bpe, skipped) = Bpe::new(&merges, &v).unwrap();
        assert_eq!((bpe.n_merges(), skipped), (0, 2));
    }

    #[test]
    fn every_byte_needs_a_token() {
        let mut v = vocab(&[]);
        v.remove(&byte_to_char(b'\n').to_string());
        let e = Bpe::new(&[], &v).err().expect("a byte without a token is refused");
        assert!(e.to_string().contains("byte 0x0a"), "{e}");
    }
}
