//! WGSL sources and the compute-pipeline cache, keyed by (shader, variant).
//!
//! A shader's source is `common.wgsl` + (for a weight-format variant `v`) `dequant_<v>.wgsl` +
//! the op's own file. The dequant snippet defines the block geometry (`QK`, `BLOCK_BYTES`) and
//! `fn deq(block_byte: u32, i: u32) -> f32` over the op's weight binding `W: array<u32>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{gpu_err, ops};
use crate::error::Result;

const COMMON: &str = include_str!("../../../shaders-wgsl/common.wgsl");
const WEIGHTS: &str = include_str!("../../../shaders-wgsl/weights.wgsl");

pub(crate) struct PipelineCache {
    map: Mutex<HashMap<(String, String), Arc<wgpu::ComputePipeline>>>,
}

fn lookup(name: &str) -> Option<&'static str> {
    ops::SHADERS
        .iter()
        .flat_map(|group| group.iter())
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
}

/// The full WGSL source of `shader` in `variant`.
pub(crate) fn source(shader: &str, variant: &str) -> Result<String> {
    let body = lookup(shader).ok_or_else(|| gpu_err(format!("unknown shader '{shader}'")))?;
    let mut src = String::from(COMMON);
    if !variant.is_empty() {
        let name = format!("dequant_{variant}");
        let deq = lookup(&name).ok_or_else(|| gpu_err(format!("no WGSL dequantizer '{name}'")))?;
        src.push_str(WEIGHTS);
        src.push_str(deq);
    }
    src.push_str(body);
    Ok(src)
}

impl PipelineCache {
    pub(crate) fn new() -> Self {
        PipelineCache {
            map: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn get(&self, device: &wgpu::Device, shader: &str, variant: &str) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = (shader.to_string(), variant.to_string());
        let mut map = self.map.lock().map_err(|_| gpu_err("pipeline cache poisoned"))?;
        if let Some(p) = map.get(&key) {
            return Ok(Arc::clone(p));
        }
        let src = source(shader, variant)?;
        let label = format!("{shader}/{variant}");
        // Natively a compile error is caught here; the browser cannot wait for an error scope,
        // so there it reaches the device's error callback and fails the next read.
        #[cfg(not(target_arch = "wasm32"))]
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(gpu_err(format!("shader {label} failed to compile: {e}")));
        }
        let p = Arc::new(pipeline);
        map.insert(key, Arc::clone(&p));
        Ok(p)
    }
}
