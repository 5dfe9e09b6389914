//! What the browser needs of the wgpu backend besides awaited reads (readback.rs): device errors,
//! which arrive through callbacks instead of error scopes that could be waited on.

use std::sync::{Arc, Mutex};

/// Keep the first uncaptured error and the loss of the device; the next read reports it.
pub(super) fn error_sink(device: &wgpu::Device) -> Arc<Mutex<Option<String>>> {
    let slot: Arc<Mutex<Option<String>>> = Arc::default();
    let keep = |slot: &Arc<Mutex<Option<String>>>| {
        let slot = Arc::clone(slot);
        move |msg: String| {
            if let Ok(mut s) = slot.lock() {
                s.get_or_insert(msg);
            }
        }
    };
    let on_error = keep(&slot);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| on_error(e.to_string())));
    let on_lost = keep(&slot);
    device.set_device_lost_callback(move |reason, msg| on_lost(format!("device lost ({reason:?}): {msg}")));
    slot
}
