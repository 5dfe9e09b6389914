//! The scheduler's decisions, as pure functions of the batch's state: which slot a request gets,
//! whose prompt runs its next chunk, where that chunk ends, and how to pick the token of each
//! decode row. `batch.rs` carries them out on the model.
//!
//! One step of the model thread is at most one prompt chunk (of one request) followed by one
//! decode step of every request that is decoding. A prompt therefore delays the decoders by one
//! chunk per step, never by its whole length, and prompts that wait take turns chunk by chunk,
//! so a short prompt behind a long one starts decoding after a few chunks, not after the long one.

/// Free sequence slots of the pool. The lowest free slot is taken first, so a lightly loaded
/// server keeps reusing the same few slots.
#[derive(Debug, Clone)]
pub struct SlotTable {
    /// Free slots, highest first (the lowest is popped).
    free: Vec<usize>,
    n: usize,
}

impl SlotTable {
    pub fn new(n: usize) -> SlotTable {
        SlotTable {
            free: (0..n).rev().collect(),
            n,
        }
    }

    pub fn take(&mut self) -> Option<usize> {
        self.free.pop()
    }

    /// Give `slot` back. Giving back a slot twice or one out of range is ignored (a bug upstream
    /// must not hand one slot to two sequences).
    pub fn give(&mut self, slot: usize) {
        if slot < self.n && !self.free.contains(&slot) {
            let at = self.free.partition_point(|&s| s > slot);
            self.free.insert(at, slot);
        }
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }
}

/// Whose prompt runs the next chunk: among the requests with prompt work (`waiting`, request
/// ids in any order), the first after `last` (the previous chunk's request) in id order,
/// wrapping around. Round robin: every waiting prompt gets one chunk in turn.
pub fn next_turn(waiting: &[u64], last: Option<u64>) -> Option<u64> {
    let after = waiting.iter().copied().filter(|&id| last.is_none_or(|l| id > l)).min();
    after.or_else(|| waiting.iter().copied().min())
}

/// Where the next prompt chunk ends, given `done` tokens consumed of `target`: at most `ubatch`
/// tokens on, and at the first snapshot point past `done` (the state there is stored before
/// going on). `points` ascending. The chunks are those `Engine::generate` runs for the same
/// prompt alone, so a prompt computes the same state in a batch as alone.
pub fn chunk_end(done: usize, target: usize, points: &[usize], ubatch: usize) -> usize {
    let end = done.saturating_add(ubatch.max(1)).min(target);
    match points.iter().copied().find(|&p| p > done) {
        Some(p) if p < end => p,
        _ => end.max(done),
    }
}

/// How a decode step picks its rows' tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Argmax of every row on the device (one small read), when every row is greedy.
    DeviceArgmax,
    /// Every row's logits come back and each request's own sampler picks.
    HostSamplers,
}

/// `greedy`: whether each row's request decodes greedily.
pub fn pick(greedy: impl IntoIterator<Item = bool>) -> Pick {
    if greedy.into_iter().all(|g| g) {
        Pick::DeviceArgmax
    } else {
        Pick::HostSamplers
    }
}

/// The number of slots `rill serve` uses without `--parallel`: `preferred`, lowered to what fits
/// `available` bytes (when the device reports them) after `reserved` bytes (the prefix cache's
/// budget), at `per_slot` bytes each; at least 1 (the pool's allocation then says whether even
/// that fits).
pub fn default_slots(preferred: usize, per_slot: u64, available: Option<u64>, reserved: u64) -> usize {
    let fit = match available {
        Some(a) if per_slot > 0 => usize::try_from(a.saturating_sub(reserved) / per_slot).unwrap_or(usize::MAX),
        _ => preferred,
    };
    preferred.min(fit).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_lowest_first_and_reused() {
        let mut t = SlotTable::new(3);
        assert_eq!((t.take(), t.take()), (Some(0), Some(1)));
        t.give(0);
        t.give(0); // twice: still one free place
        t.give(7); // out of range: ignored
        assert_eq!(t.free(), 2);
        assert_eq!((t.take(), t.take(), t.take()), (Some(0), Some(2), None));
        t.give(2);
        t.give(1);
        assert_eq!((t.take(), t.free()), (Some(1), 1));
    }

    #[test]
    fn turns_go_round_in_id_order() {
        assert_eq!(next_turn(&[], None), None);
        assert_eq!(next_turn(&[5, 3, 9], None), Some(3));
        assert_eq!(next_turn(&[5, 3, 9], Some(3)), Some(5));
        assert_eq!(next_turn(&[5, 3, 9], Some(5)), Some(9));
        assert_eq!(next_turn(&[5, 3, 9], Some(9)), Some(3));
        // The last one left (finished or cancelled): the next in order still comes.
        assert_eq!(next_turn(&[3, 9], Some(5)), Some(9));
        // Alone: its own turn again.
        assert_eq!(next_turn(&[4], Some(4)), Some(4));
    }

    #[test]
    fn a_long_prompt_and_short_ones_alternate() {
        // Request 1 has 10 chunks, 2 and 3 one each: they finish after the second and third
        // chunk, not after the tenth.
        let mut left = vec![(1u64, 10), (2, 1), (3, 1)];
        let (mut last, mut order) = (None, Vec::new());
        while !left.is_empty() {
            let ids: Vec<u64> = left.iter().map(|&(id, _)| id).collect();
            let id = next_turn(&ids, last).unwrap();
            order.push(id);
            last = Some(id);
            for e in left.iter_mut().filter(|e| e.0 == id) {
                e.1 -= 1;
            }
            left.retain(|e| e.1 > 0);
        }
        assert_eq!(&order[..4], &[1, 2, 3, 1]);
        assert_eq!(order.len(), 12);
    }

    #[test]
    fn chunks_stop_at_ubatch_snapshot_points_and_the_target() {
        assert_eq!(chunk_end(0, 1000, &[], 512), 512);
        assert_eq!(chunk_end(512, 1000, &[], 512), 1000);
        assert_eq!(chunk_end(0, 1000, &[100, 700], 512), 100);
        assert_eq!(chunk_end(100, 1000, &[100, 700], 512), 612);
        assert_eq!(chunk_end(612, 1000, &[100, 700], 512), 700);
        assert_eq!(chunk_end(700, 1000, &[100, 700], 512), 1000);
        // A point at the target ends the chunk there too; nothing left: no progress.
        assert_eq!(chunk_end(0, 40, &[40], 512), 40);
        assert_eq!(chunk_end(40, 40, &[40], 512), 40);
        // ubatch 0 is read as 1.
        assert_eq!(chunk_end(3, 10, &[], 0), 4);
    }

    #[test]
    fn chunks_cover_the_prompt_like_one_prefill_per_snapshot_point() {
        // Engine::generate prefills up to each point, then the rest, each in ubatch pieces.
        let (target, points, ub) = (1300, [5usize, 600, 601], 256);
        let mut want = Vec::new();
        let mut from = 0;
        for &p in points.iter().chain([target].iter()) {
            let mut at = from;
            while at < p {
                at = (at + ub).min(p);
                want.push(at);
            }
            from = p;
        }
        let (mut got, mut done) = (Vec::new(), 0);
        while done < target {
            done = chunk_end(done, target, &points, ub);
            got.push(done);
        }
        assert_eq!(got, want);
    }

    #[test]
    fn device_argmax_only_when_every_row_is_greedy() {
        assert_eq!(pick([true, true]), Pick::DeviceArgmax);
        assert_eq!(pick([true, false, true]), Pick::HostSamplers);
        assert_eq!(pick(std::iter::empty()), Pick::DeviceArgmax);
    }

    #[test]
    fn default_slots_fit_the_memory_left_after_the_cache() {
        const G: u64 = 1 << 30;
        assert_eq!(default_slots(8, G, None, 2 * G), 8);
        assert_eq!(default_slots(8, G, Some(80 * G), 2 * G), 8);
        assert_eq!(default_slots(8, G, Some(7 * G), 2 * G), 5);
        assert_eq!(default_slots(8, G, Some(G), 2 * G), 1);
        assert_eq!(default_slots(8, 0, Some(G), 0), 8);
    }
}
