// Two weight bindings of the same format (`W` and `W2`, both `array<vec4<u32>>`): every accessor
// reads the one `wsel` names. The op sets `wsel` uniformly across the workgroup, so the branch
// costs nothing measurable.
var<private> wsel: u32;

fn wq(i: u32) -> vec4<u32> {
    if (wsel == 0u) {
        return W[i];
    }
    return W2[i];
}
