//! CPU reference backend (placeholder until implemented).
pub struct CpuBackend;
impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}
