//! f16 copies ("shadows") of f32 activations, for the tensor-core products of the fast prefill
//! path (`ops/gemm.rs`), which read their activations in f16.
//!
//! The projections of a layer share their input (q/k/v/z/beta/alpha all read the normed hidden
//! state; gate and up read the FFN's input), so an activation is converted once and its copy
//! reused until the f32 tensor is written again. Kernels that produce an activation for a product
//! anyway (the SwiGLU of the FFN) write the copy themselves and register it.
//!
//! Validity is tracked on the host, in stream order: every op submitted with a tensor among the
//! ones it may write (`Inner::submit_rw`; plain `submit` counts every tensor it names) drops that
//! tensor's copy, and so does every recorded or replayed step (`step_begin`), whose ops do not
//! pass through `submit` when replayed. A copy is keyed by the buffer's unique id, never reused
//! for another allocation. A few slots are kept, least recently used first out; their memory is a
//! backend workspace each (grown, never shrunk).

use std::sync::atomic::Ordering;

use super::buffer::get;
use super::driver::{cuda_err, DevPtr};
use super::launch::Args;
use super::ops::Launch;
use super::profile::Phase;
use super::Inner;
use crate::backend::Tensor;
use crate::error::Result;

/// Copies kept at once: one layer needs at most three live (the mixer input, the attention or
/// delta-rule output, the FFN hidden state).
const SLOTS: usize = 4;
const SLOT_NAMES: [&str; SLOTS] = [
    "f16 activations 0",
    "f16 activations 1",
    "f16 activations 2",
    "f16 activations 3",
];

#[derive(Clone, Copy, Default)]
struct Slot {
    /// Buffer id of the f32 tensor this slot holds a copy of (0: none).
    owner: u64,
    /// Elements copied.
    elems: usize,
    /// For least-recently-used replacement.
    used: u64,
}

#[derive(Default)]
pub(crate) struct Shadows {
    slots: [Slot; SLOTS],
    tick: u64,
}

/// `pf::CvtParams` (kernels-cuda/gemm_q.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CvtParams {
    x: u64,
    y: u64,
    n: i64,
}

fn buffer_id(t: &Tensor) -> Option<u64> {
    get(t, "shadow", 0).ok().map(|b| b.id)
}

impl Inner {
    /// Forget the copies of every tensor in `ts` (they are about to be written).
    pub(crate) fn shadows_written(&self, ts: &[&Tensor]) {
        if !self.shadows_live.load(Ordering::Acquire) || ts.is_empty() {
            return;
        }
        if let Ok(mut s) = self.shadows.lock() {
            for t in ts {
                if let Some(id) = buffer_id(t) {
                    for slot in s.slots.iter_mut().filter(|sl| sl.owner == id) {
                        slot.owner = 0;
                    }
                }
            }
        }
    }

    /// Forget every copy.
    pub(crate) fn shadows_clear(&self) {
        if !self.shadows_live.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Ok(mut s) = self.shadows.lock() {
            for slot in s.slots.iter_mut() {
                slot.owner = 0;
            }
        }
    }

    /// The valid copy of `x`, if there is one.
    fn shadow_lookup(&self, x: &Tensor) -> Result<Option<DevPtr>> {
        let id = get(x, "shadow", 0)?.id;
        let mut s = self.shadows.lock().map_err(|_| cuda_err("shadow lock poisoned"))?;
        s.tick += 1;
        let tick = s.tick;
        let Some(i) = s.slots.iter().position(|sl| sl.owner == id && sl.elems >= x.numel()) else {
            return Ok(None);
        };
        s.slots[i].used = tick;
        Ok(Some(self.workspace(SLOT_NAMES[i], x.numel() * 2)?))
    }

    /// A slot for a new copy of `x` (its f16 memory): the least recently used one, claimed for
    /// `x` once `shadow_made` is called after the kernel that fills it has been submitted.
    pub(crate) fn shadow_slot(&self, x: &Tensor) -> Result<(usize, DevPtr)> {
        let i = {
            let mut s = self.shadows.lock().map_err(|_| cuda_err("shadow lock poisoned"))?;
            let i = (0..SLOTS).min_by_key(|&i| s.slots[i].used).unwrap_or(0);
            s.slots[i] = Slot::default();
            i
        };
        Ok((i, self.workspace(SLOT_NAMES[i], x.numel() * 2)?))
    }

    /// Slot `slot` now holds the f16 copy of `x` (its kernel is on the stream).
    pub(crate) fn shadow_made(&self, slot: usize, x: &Tensor) -> Result<()> {
        let id = get(x, "shadow", 0)?.id;
        let mut s = self.shadows.lock().map_err(|_| cuda_err("shadow lock poisoned"))?;
        s.tick += 1;
        let tick = s.tick;
        s.slots[slot] = Slot {
            owner: id,
            elems: x.numel(),
            used: tick,
        };
        self.shadows_live.store(true, Ordering::Release);
        Ok(())
    }

    /// The f16 copy of the F32 tensor `x` (row-major like `x`): the kept one, or a new one made
    /// by one conversion kernel (`pf_f32_to_f16`, which rounds to nearest).
    pub(crate) fn f16_of(&self, x: &Tensor) -> Result<DevPtr> {
        if let Some(p) = self.shadow_lookup(x)? {
            return Ok(p);
        }
        let n = x.numel();
        let src = super::buffer::ptr(x, "f16 copy")?;
        let (slot, dst) = self.shadow_slot(x)?;
        self.convert_f16(src, dst, n, Phase::Norms)?;
        self.shadow_made(slot, x)?;
        Ok(dst)
    }

    /// Launch `pf_f32_to_f16` over `n` values (reads nothing any op writes later in the stream
    /// than this launch, so it is submitted without tensors: it must not drop `x`'s copy).
    pub(crate) fn convert_f16(&self, src: DevPtr, dst: DevPtr, n: usize, phase: Phase) -> Result<()> {
        let a = Args::from_pod(&CvtParams {
            x: src,
            y: dst,
            n: n as i64,
        });
        self.kernel_rw(
            Launch {
                name: ("pf_f32_to_f16", ""),
                grid: [(n / 4).div_ceil(256).clamp(1, self.sms() * 8) as u32, 1, 1],
                block: 256,
                smem: 0,
                args: a,
                phase,
            },
            0.0,
            &[],
            &[],
        )
    }
}
