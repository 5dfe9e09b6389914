//! f16 copies ("shadows") of f32 activations, for the tensor-core products of the fast prefill
//! path (`ops/gemm.rs`), which read their activations in f16.
//!
//! A copy has one or two planes: `hi = f16(x)` always, and `lo = f16(x - hi)` when a product
//! with F16 or BF16 weights reads it (kernels-cuda/gemm_q.cu multiplies both planes for those
//! formats, whose weights are exact in f16: the activations then keep ~f32 precision). The lo
//! plane is made only on demand, by the same conversion kernel, so files of quantized weights
//! (Q4_K_M, Q8_0) pay nothing for it; a copy made without it gains it when a split-format
//! product asks (the conversion runs again and writes both planes, hi unchanged).
//!
//! The projections of a layer share their input (q/k/v/z/beta/alpha all read the normed hidden
//! state; gate and up read the FFN's input), so an activation is converted once and its copy
//! reused until the f32 tensor is written again. Kernels that produce an activation for a product
//! anyway (the SwiGLU of the FFN) write the copy themselves and register it.
//!
//! The same table remembers which producer kernel (`ops/matvec_tc.rs` `Producer`: the decode
//! norms and the like, which can prepare their output for the tensor-core decode products) wrote
//! an activation, so that the products reading it teach that kind of kernel their layouts.
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
use super::op::Args;
use super::ops::matvec_tc::{Producer, TcFormat, TcX};
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
/// The slots' lo planes: workspaces of their own, so that adding a lo plane to a kept copy never
/// reallocates (and loses) its hi plane.
const LO_NAMES: [&str; SLOTS] = [
    "f16 activations 0 lo",
    "f16 activations 1 lo",
    "f16 activations 2 lo",
    "f16 activations 3 lo",
];
/// The prepared copies for the tensor-core decode products (`ops/matvec_tc.rs`), kept in slots of
/// their own by the same rules, one per (tensor, format): a few more, since a layer of mixed
/// formats (Q4_K_M's Q6_K products) may prepare one tensor twice.
const TC_SLOTS: usize = 6;
const TC_NAMES: [&str; TC_SLOTS] = ["mvtc x 0", "mvtc x 1", "mvtc x 2", "mvtc x 3", "mvtc x 4", "mvtc x 5"];

/// The f16 planes of an activation as a tensor-core product reads them (row-major like the f32
/// tensor): `hi = f16(x)` and, when made, `lo = f16(x - hi)` (0 when not).
#[derive(Clone, Copy, Debug)]
pub(crate) struct F16Planes {
    pub hi: DevPtr,
    pub lo: DevPtr,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    /// Buffer id of the f32 tensor this slot holds a copy of (0: none).
    owner: u64,
    /// Elements copied.
    elems: usize,
    /// Whether the lo plane was made too.
    lo: bool,
    /// The layout of a prepared copy (tensor-core slots only).
    tc: Option<TcFormat>,
    /// For least-recently-used replacement.
    used: u64,
}

/// Writers remembered at once (`Inner::produced_by`): a layer has at most two producer outputs
/// live (the normed hidden state, the mixer's output before its projection).
const MADE_BY: usize = 4;

#[derive(Default)]
pub(crate) struct Shadows {
    slots: [Slot; SLOTS],
    /// The prepared copies (`tc_x_of`).
    tc: [Slot; TC_SLOTS],
    /// Which producer kernel wrote a tensor's current values (by buffer id), by the same
    /// validity rules, oldest replaced first: a product that reads the tensor teaches the
    /// producer its layout (`matvec_tc::read_by`).
    made_by: [Option<(u64, Producer)>; MADE_BY],
    /// The next `made_by` entry to replace.
    made_next: usize,
    tick: u64,
}

/// `pf::CvtParams` (kernels-cuda/gemm_q.cu).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CvtParams {
    x: u64,
    y: u64,
    lo: u64,
    n: i64,
}

/// Which copies: the f16 ones (`slots`) or the prepared ones of the tensor-core decode products
/// (`tc`). Both kinds follow the same rules; only their slots and memory differ.
#[derive(Clone, Copy)]
enum Kind {
    F16,
    Tc,
}

impl Shadows {
    fn of(&mut self, kind: Kind) -> &mut [Slot] {
        match kind {
            Kind::F16 => &mut self.slots,
            Kind::Tc => &mut self.tc,
        }
    }

    /// The slot of `kind` for which `keep` holds, marked as just used.
    fn find(&mut self, kind: Kind, keep: impl Fn(&Slot) -> bool) -> Option<usize> {
        self.tick += 1;
        let tick = self.tick;
        let slots = self.of(kind);
        let i = slots.iter().position(keep)?;
        slots[i].used = tick;
        Some(i)
    }

    /// The least recently used slot of `kind`, emptied for a new copy (and marked used now, so
    /// that a kernel writing several copies claims a different slot for each).
    fn claim(&mut self, kind: Kind) -> usize {
        self.tick += 1;
        let used = self.tick;
        let slots = self.of(kind);
        let i = (0..slots.len()).min_by_key(|&i| slots[i].used).unwrap_or(0);
        slots[i] = Slot {
            used,
            ..Slot::default()
        };
        i
    }

    /// Slot `i` of `kind` now holds `slot` (its `used` set to now).
    fn fill(&mut self, kind: Kind, i: usize, slot: Slot) {
        self.tick += 1;
        let used = self.tick;
        self.of(kind)[i] = Slot { used, ..slot };
    }
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
                    let s = &mut *s;
                    for slot in s.slots.iter_mut().chain(s.tc.iter_mut()).filter(|sl| sl.owner == id) {
                        slot.owner = 0;
                    }
                    for m in s.made_by.iter_mut().filter(|m| m.is_some_and(|(o, _)| o == id)) {
                        *m = None;
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
            let s = &mut *s;
            for slot in s.slots.iter_mut().chain(s.tc.iter_mut()) {
                slot.owner = 0;
            }
            s.made_by = Default::default();
        }
    }

    /// The slot holding a valid copy of `x`, if there is one, and whether it has the lo plane.
    fn shadow_lookup(&self, x: &Tensor) -> Result<Option<(usize, bool)>> {
        let id = get(x, "shadow", 0)?.id;
        let mut s = self.shadows()?;
        let found = s.find(Kind::F16, |sl| sl.owner == id && sl.elems >= x.numel());
        Ok(found.map(|i| (i, s.slots[i].lo)))
    }

    fn shadows(&self) -> Result<std::sync::MutexGuard<'_, Shadows>> {
        self.shadows.lock().map_err(|_| cuda_err("shadow lock poisoned"))
    }

    /// Slot `slot` of `kind` now holds a copy of `x` (its kernel is on the stream).
    fn copy_made(&self, kind: Kind, slot: usize, x: &Tensor, lo: bool, tc: Option<TcFormat>) -> Result<()> {
        let owner = get(x, "shadow", 0)?.id;
        let elems = x.numel();
        self.shadows()?.fill(
            kind,
            slot,
            Slot {
                owner,
                elems,
                lo,
                tc,
                used: 0,
            },
        );
        self.shadows_live.store(true, Ordering::Release);
        Ok(())
    }

    /// The memory of slot `i` for `n` values: the hi plane, and the lo plane when `lo`.
    fn shadow_planes(&self, i: usize, n: usize, lo: bool) -> Result<F16Planes> {
        Ok(F16Planes {
            hi: self.workspace(SLOT_NAMES[i], n * 2)?,
            lo: if lo { self.workspace(LO_NAMES[i], n * 2)? } else { 0 },
        })
    }

    /// A slot for a new copy of `x` (its f16 memory, with the lo plane when `lo`): the least
    /// recently used one, claimed for `x` once `shadow_made` is called after the kernel that
    /// fills it has been submitted.
    pub(crate) fn shadow_slot(&self, x: &Tensor, lo: bool) -> Result<(usize, F16Planes)> {
        let i = self.shadows()?.claim(Kind::F16);
        Ok((i, self.shadow_planes(i, x.numel(), lo)?))
    }

    /// Slot `slot` now holds the f16 copy of `x`, with its lo plane when `lo` (its kernel is on
    /// the stream).
    pub(crate) fn shadow_made(&self, slot: usize, x: &Tensor, lo: bool) -> Result<()> {
        self.copy_made(Kind::F16, slot, x, lo, None)
    }

    /// The f16 copy of the F32 tensor `x` (row-major like `x`), with its lo plane when `lo`:
    /// the kept one, or one made by one conversion kernel (`pf_f32_to_f16`, round to nearest).
    /// A kept copy without the lo plane is converted again into the same slot (hi unchanged).
    pub(crate) fn f16_of(&self, x: &Tensor, lo: bool) -> Result<F16Planes> {
        let n = x.numel();
        let (slot, planes) = match self.shadow_lookup(x)? {
            Some((i, has_lo)) if has_lo || !lo => return self.shadow_planes(i, n, has_lo),
            Some((i, _)) => (i, self.shadow_planes(i, n, true)?),
            None => self.shadow_slot(x, lo)?,
        };
        let src = super::buffer::ptr(x, "f16 copy")?;
        self.convert_f16(src, planes.hi, planes.lo, n, Phase::Norms)?;
        self.shadow_made(slot, x, lo)?;
        Ok(planes)
    }

    /// Launch `pf_f32_to_f16` over `n` values into `dst`, and their lo planes into `lo` when it
    /// is non-zero (reads nothing any op writes later in the stream than this launch, so it is
    /// submitted without tensors: it must not drop `x`'s copy).
    pub(crate) fn convert_f16(&self, src: DevPtr, dst: DevPtr, lo: DevPtr, n: usize, phase: Phase) -> Result<()> {
        let a = Args::from_pod(&CvtParams {
            x: src,
            y: dst,
            lo,
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

impl Inner {
    /// The prepared copy of the F32 tensor `x` (rows of `n_in`) in format `f`'s layout for the
    /// tensor-core decode products: the kept one, or one made by one prep kernel into the least
    /// recently used slot. The caller holds the workspace lock until its product is submitted.
    pub(crate) fn tc_x_of(&self, x: &Tensor, n_in: usize, f: TcFormat) -> Result<TcX> {
        let rows = x.numel() / n_in.max(1);
        let id = get(x, "mvtc copy", 0)?.id;
        let kept = self.shadows()?.find(Kind::Tc, |sl| {
            sl.owner == id && sl.elems == x.numel() && sl.tc == Some(f)
        });
        if let Some(i) = kept {
            let base = self.workspace(TC_NAMES[i], f.prep_bytes(rows, n_in))?;
            return Ok(f.planes(base, rows, n_in));
        }
        let (slot, base) = self.tc_slot(x, n_in, f)?;
        let src = super::buffer::ptr(x, "mvtc copy")?;
        let planes = super::ops::matvec_tc::prep(self, f, src, rows, n_in, base)?;
        self.tc_made(slot, x, f)?;
        Ok(planes)
    }

    /// A slot for a new prepared copy of `x` (rows of `n_in`, format `f`'s layout) and its
    /// memory: the least recently used one, claimed for `x` once `tc_made` is called after the
    /// kernel that fills it has been submitted. The caller holds the workspace lock until then.
    pub(crate) fn tc_slot(&self, x: &Tensor, n_in: usize, f: TcFormat) -> Result<(usize, DevPtr)> {
        let i = self.shadows()?.claim(Kind::Tc);
        let rows = x.numel() / n_in.max(1);
        Ok((i, self.workspace(TC_NAMES[i], f.prep_bytes(rows, n_in))?))
    }

    /// Slot `slot` now holds the prepared copy of `x` in format `f`'s layout (its kernel is on
    /// the stream).
    pub(crate) fn tc_made(&self, slot: usize, x: &Tensor, f: TcFormat) -> Result<()> {
        self.copy_made(Kind::Tc, slot, x, false, Some(f))
    }

    /// The producer kernel that wrote the current values of `x`, if one did (`produced_by`).
    pub(crate) fn writer_of(&self, x: &Tensor) -> Option<Producer> {
        if !self.shadows_live.load(Ordering::Acquire) {
            return None;
        }
        let id = buffer_id(x)?;
        let s = self.shadows.lock().ok()?;
        s.made_by.iter().flatten().find(|m| m.0 == id).map(|m| m.1)
    }

    /// `who` has written the current values of `x` (its kernel is on the stream).
    pub(crate) fn produced_by(&self, x: &Tensor, who: Producer) -> Result<()> {
        let id = get(x, "mvtc copy", 0)?.id;
        let mut s = self.shadows()?;
        let i = match s.made_by.iter().position(|m| m.is_some_and(|(o, _)| o == id)) {
            Some(i) => i,
            None => {
                let i = s.made_next;
                s.made_next = (i + 1) % MADE_BY;
                i
            }
        };
        s.made_by[i] = Some((id, who));
        drop(s);
        self.shadows_live.store(true, Ordering::Release);
        Ok(())
    }
}
