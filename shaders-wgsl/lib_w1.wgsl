// One weight binding: the op declares `W: array<vec4<u32>>`.
fn wq(i: u32) -> vec4<u32> {
    return W[i];
}
