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

pub(crate) struct Kernels {
    modules: Vec<(&'static str, Module)>,
    cache: RwLock<HashMap<(&'static str, &'static str), Func>>,
    smem_optin: u32,
}

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

    /// The kernel `prefix` + `suffix` (e.g. `matvec_` + `Q4_K`), looked up in every module once.
    pub(crate) fn get(&self, prefix: &'static str, suffix: &'static str) -> Result<Func> {
        let key = (prefix, suffix);
        if let Some(f) = self
            .cache
            .read()
            .map_err(|_| cuda_err("kernel cache poisoned"))?
            .get(&key)
        {
            return Ok(*f);
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
        if prefix.starts_with("matvec") {
            set_max_dynamic_smem(f, MATVEC_SMEM_MAX.min(self.smem_optin))?;
        }
        let f = Func(f);
        self.cache
            .write()
            .map_err(|_| cuda_err("kernel cache poisoned"))?
            .insert(key, f);
        Ok(f)
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
