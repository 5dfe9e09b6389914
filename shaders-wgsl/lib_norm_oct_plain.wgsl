// The oct exchange of lib_norm_dot.wgsl without subgroups (the browser, RILL_WGPU_PLAIN=1):
// workgroup memory, octs of consecutive local indices.
fn oct_flat(li: u32, lanes: Lanes) -> u32 {
    return li;
}

fn oct_gather(v: vec4<f32>, flat: u32, lanes: Lanes) -> Oct {
    return oct_gather_wg(v, flat);
}
