// The planes binding of lib_norm_dot.wgsl for norms whose own bindings end at 4.
@group(0) @binding(5) var<storage, read_write> xq: array<vec4<u32>>;
