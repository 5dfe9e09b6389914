// attention_combine_gate.wgsl without planes: nothing to write.
fn att_planes(row: u32, li: u32, y: vec4<f32>) {}
