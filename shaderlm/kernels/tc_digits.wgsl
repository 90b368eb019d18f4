// The tensor-core GEMM's 16-bit grid (matmul_tc.wgsl): a row of W or a token of x as X = round(v / step)
// with step = max|v| / LIM, written as two int8 digits X = 256 hi + lo (hi = (X + 128) >> 8 stays in
// int8 for |X| <= LIM; lo in [-128, 128)).
const LIM: f32 = 32639.0;

// four values' digits as (hi, lo) words of packed int8; inv = LIM / max|v| (|v| <= max|v|, so |X| <= LIM).
// Rounding adds 1.5 * 2^23 and reads the integer from the bits: no conversion instruction.
fn digits(v: vec4<f32>, inv: f32) -> vec2<u32> {
    let x = bitcast<vec4<i32>>(v * inv + vec4<f32>(12582912.0)) - vec4<i32>(0x4B400000);
    let hi = (x + vec4<i32>(128)) >> vec4<u32>(8u);
    return vec2<u32>(pack4xI8(hi), pack4xI8(x - (hi << vec4<u32>(8u))));
}
