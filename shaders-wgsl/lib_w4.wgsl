// Four weight bindings of the same format (`W`, `W2`, `W3`, `W4`, each `array<vec4<u32>>`): every
// accessor reads the one `wsel` (0 to 3) names. The op sets `wsel` uniformly across the
// workgroup, so the branches cost nothing measurable.
var<private> wsel: u32;

fn wq(i: u32) -> vec4<u32> {
    if (wsel == 0u) {
        return W[i];
    }
    if (wsel == 1u) {
        return W2[i];
    }
    if (wsel == 2u) {
        return W3[i];
    }
    return W4[i];
}
