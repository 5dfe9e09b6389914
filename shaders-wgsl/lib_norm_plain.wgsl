// The RMS norms without the packed-dot planes (lib_norm_dot.wgsl): nothing after the output.
fn norm_finish(base: u32, li: u32) {}
