// One block of x (32 values, eight vec4s) rounded for the int8 GEMMs, in the layout quantize_q8.wgsl
// writes: bytes q = round(127 x / max|x|) with max|x| per 16 values (each half) or, with RUN32, per block;
// the words into xq, each half's scale d = max|x| / 127 into xd and its d * sum(q) into xs. The
// including kernel binds xq (vec4<u32>), xd and xs (vec2<f32>). Shared by quantize_q8.wgsl and the
// decode attention's rounded output (attention_decode.wgsl's Q8OUT): the same bits either way.
const ONES: u32 = 0x01010101u;

fn round_block(b: u32, v: array<vec4<f32>, 8>) {
    var m0 = vec4<f32>(0.0);
    var m1 = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        m0 = max(m0, abs(v[i]));
        m1 = max(m1, abs(v[i + 4u]));
    }
    var a0 = max(max(m0.x, m0.y), max(m0.z, m0.w));
    var a1 = max(max(m1.x, m1.y), max(m1.z, m1.w));
#if RUN32
    a0 = max(a0, a1);
    a1 = a0;
#endif
    let inv0 = select(1.0 / a0, 0.0, a0 == 0.0);
    let inv1 = select(1.0 / a1, 0.0, a1 == 0.0);
    var q: array<u32, 8>;
    for (var i = 0u; i < 4u; i++) {       // round(127 * x / max|x|)
        q[i] = pack4x8snorm(v[i] * inv0);
        q[i + 4u] = pack4x8snorm(v[i + 4u] * inv1);
    }
    let d = vec2<f32>(a0, a1) / 127.0;
    let lo = dot4I8Packed(q[0], ONES) + dot4I8Packed(q[1], ONES) + dot4I8Packed(q[2], ONES) + dot4I8Packed(q[3], ONES);
    let hi = dot4I8Packed(q[4], ONES) + dot4I8Packed(q[5], ONES) + dot4I8Packed(q[6], ONES) + dot4I8Packed(q[7], ONES);
    xq[b * 2u] = vec4<u32>(q[0], q[1], q[2], q[3]);
    xq[b * 2u + 1u] = vec4<u32>(q[4], q[5], q[6], q[7]);
    xd[b] = d;
    xs[b] = d * vec2<f32>(f32(lo), f32(hi));
}
