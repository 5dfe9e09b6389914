// The parameters and the device-side position of the one-sequence attention kernels
// (attention.wgsl, attention_split.wgsl; lib_attention.wgsl declares the rest of their bindings).
struct Params {
    n_head: u32,
    group: u32, // query heads per KV head
    d: u32,     // head_dim
    scale: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> pos: array<u32>; // read on the device: replayed steps see the current position
