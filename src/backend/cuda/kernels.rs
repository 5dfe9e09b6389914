//! The embedded kernel modules (one fatbin per `kernels-cuda/*.cu`, compiled by build.rs) and the
//! lookup of kernel functions by name, cached.

use std::collections::HashMap;
use std::sync::RwLock;

use cudarc::driver::sys;

use super::driver::{cuda_err, set_max_dynamic_smem, Module};
use crate::error::Result;

include!(concat!(env!("OUT_DIR"), "/cuda_fatbins.rs"));

/// Largest dynamic shared memory a matvec block asks for (bytes); set on those kernels at their
/// first use. Above the 48 KiB default, below every GPU's opt-in limit since Volta... except that
/// the limit is read from the device and this is clamped to it.
pub(crate) const MATVEC_SMEM_MAX: u32 = 160 * 1024;

/// A kernel function handle. The driver's function handles are plain pointers valid for the
/// module's lifetime.
#[derive(Clone, Copy)]
pub(crate) struct Func(pub sys::CUfunction);
// SAFETY: function handles are usable from any thread of the context.
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

/// Function handles by (prefix, suffix) name, with the dynamic shared memory each is allowed to use.
type FuncCache = HashMap<(&'static str, &'static str), (Func, u32)>;

pub(crate) struct Kernels {
    modules: Vec<(&'static str, Module)>,
    cache: RwLock<FuncCache>,
    smem_optin: u32,
}

/// Dynamic shared memory every kernel may use without asking.
const SMEM_DEFAULT: u32 = 48 * 1024;

impl Kernels {
    /// Load every embedded module (fails on a GPU this build has no code for).
    pub(crate) fn load(smem_optin: u32) -> Result<Kernels> {
        let mut modules = Vec::with_capacity(FATBINS.len());
        for (name, image) in FATBINS {
            modules.push((*name, Module::load(image, name)?));
        }
        Ok(Kernels {
            modules,
            cache: RwLock::new(HashMap::new()),
            smem_optin,
        })
    }

    /// The kernel `prefix` + `suffix` (e.g. `matvec_` + `Q4_K`), looked up in every module once,
    /// for a launch with `smem` bytes of dynamic shared memory: above the 48 KiB default
    /// the kernel's limit is raised (once, to what the launch needs; at most the device's opt-in
    /// limit, else an error naming the kernel).
    pub(crate) fn get_with_smem(&self, prefix: &'static str, suffix: &'static str, smem: u32) -> Result<Func> {
        let key = (prefix, suffix);
        if let Some(&(f, allowed)) = self
            .cache
            .read()
            .map_err(|_| cuda_err("kernel cache poisoned"))?
            .get(&key)
        {
            if smem <= allowed {
                return Ok(f);
            }
            return self.allow_smem(key, f, smem);
        }
        let name = format!("{prefix}{suffix}");
        let mut found = None;
        for (_, m) in &self.modules {
            if let Ok(f) = m.function(&name) {
                found = Some(f);
                break;
            }
        }
        let f = found.ok_or_else(|| cuda_err(format!("kernel {name} not found in the embedded modules")))?;
        let mut allowed = SMEM_DEFAULT;
        if prefix.starts_with("matvec") {
            allowed = MATVEC_SMEM_MAX.min(self.smem_optin);
            set_max_dynamic_smem(f, allowed)?;
        }
        let f = Func(f);
        self.cache
            .write()
            .map_err(|_| cuda_err("kernel cache poisoned"))?
            .insert(key, (f, allowed));
        if smem > allowed {
            return self.allow_smem(key, f, smem);
        }
        Ok(f)
    }

    fn allow_smem(&self, key: (&'static str, &'static str), f: Func, smem: u32) -> Result<Func> {
        if smem > self.smem_optin {
            return Err(cuda_err(format!(
                "kernel {}{} needs {smem} bytes of shared memory, the device allows {}",
                key.0, key.1, self.smem_optin
            )));
        }
        set_max_dynamic_smem(f.0, smem)?;
        self.cache
            .write()
            .map_err(|_| cuda_err("kernel cache poisoned"))?
            .insert(key, (f, smem));
        Ok(f)
    }

    /// Bytes of shared memory per SM, as the occupancy of big-tile kernels is counted: the
    /// opt-in limit of one block plus the 1 KiB the hardware reserves per block (Ampere, Hopper).
    pub(crate) fn smem_per_sm(&self) -> u32 {
        self.smem_optin + 1024
    }

    /// Largest dynamic shared memory a matvec block may use.
    pub(crate) fn matvec_smem_limit(&self) -> u32 {
        MATVEC_SMEM_MAX.min(self.smem_optin)
    }

    /// Names of the loaded modules (for `driver_info`).
    pub(crate) fn module_names(&self) -> Vec<&'static str> {
        self.modules.iter().map(|(n, _)| *n).collect()
    }
}
