// The planes binding of lib_norm_dot.wgsl for norms whose own bindings end at 3 (rms_norm).
@group(0) @binding(4) var<storage, read_write> xq: array<vec4<u32>>;
