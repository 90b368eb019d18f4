// A decoder's 4-bit indices as the signed bytes of their values, 16 at a time, and their dot with f32 x:
// over kv_bytes (a word of 4 indices -> the word of their values), which the including decoder
// provides (quant/table4's lookup, or MXFP4's arithmetic).
#if WIDE
// 16 indices (the nibble at bit sh of each byte of q) -> their table values as signed bytes.
fn kv16(q: vec4<u32>, sh: u32) -> vec4<u32> {
    let n = nib(q, sh);
    return vec4<u32>(kv_bytes(n.x), kv_bytes(n.y), kv_bytes(n.z), kv_bytes(n.w));
}
#if !INT_DOT
fn dot_i8(b: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    return dot(i8x4(b.x), x0) + dot(i8x4(b.y), x1) + dot(i8x4(b.z), x2) + dot(i8x4(b.w), x3);
}
#endif
#endif
