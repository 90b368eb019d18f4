// Shared by the quant/*.wgsl decoders. The including kernel declares:
//   @binding(..) var<storage, read> w: array<u32>;   the weight words (one row-chunk of a tensor),
//                or array<vec4<u32>> with WIDE (the decode GEMV's 16-byte loads)
//   a `p` (uniform, or const in gemv.wgsl) with field dbase: u32   first word of the split-off field
//   array (read from p where needed: a private copy made NVIDIA's Vulkan compiler spill)
// Each decoder defines QK (elements per block), QW (u32 words per block in the main region) and
//   fn dq8(blk: u32, j: u32) -> V8   elements [8j, 8j+8) of block `blk`, in GGUF element order.
// Decoders with a WIDE part (main region a multiple of 16 bytes) also define, for gemv.wgsl:
//   WQK (elements per wide block), CPB (chunks per wide block), both also in formats/quants.py,
//   fn x_chunk(r: XRow, b, c) -> array<vec4<f32>, N>   the x values chunk c of block b multiplies
//                                 (gemv.wgsl's x_runs2 / x_runs4 of their vec4 offsets)
//   struct CW, fn chunk_load(blk, c) -> CW   the raw words chunk c of block blk needs (loads only)
//   fn chunk_dot(cw: CW, c, xr) -> f32       sum over the chunk of weight * x

#if WIDE
fn word(i: u32) -> u32 {
    let v = w[i >> 2u];
    let j = i & 3u;
    return select(select(v.x, v.y, j == 1u), select(v.z, v.w, j == 3u), j >= 2u);
}
#else
fn word(i: u32) -> u32 { return w[i]; }
#endif

// WIDE helpers. Every index into an array or vector below is a constant: naga passes arrays by value
// and NVIDIA's compiler put dynamically indexed ones in local memory (10x slower GEMVs, measured).
#if WIDE
// Sum of the 4 lanes of v (x runs' sums, for the min/offset terms).
fn hsum(v: vec4<f32>) -> f32 { return dot(v, vec4<f32>(1.0)); }

// 16 4-bit quants (nibble at bit `sh` of each byte of q) dotted with 16 x values.
fn dot_nib(q: vec4<u32>, sh: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    let m = 0x0F0F0F0Fu;
    return dot(u8x4((q.x >> sh) & m), x0) + dot(u8x4((q.y >> sh) & m), x1)
         + dot(u8x4((q.z >> sh) & m), x2) + dot(u8x4((q.w >> sh) & m), x3);
}

// 16 quants with extra high bits: nibble at bit `sh` of q's bytes | ((h's bytes >> hsh) & hmask) << 4.
fn dot_nib_hi(q: vec4<u32>, sh: u32, h: vec4<u32>, hsh: u32, hmask: u32,
              x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    let m = 0x0F0F0F0Fu;
    return dot(u8x4(((q.x >> sh) & m) | (((h.x >> hsh) & hmask) << 4u)), x0)
         + dot(u8x4(((q.y >> sh) & m) | (((h.y >> hsh) & hmask) << 4u)), x1)
         + dot(u8x4(((q.z >> sh) & m) | (((h.z >> hsh) & hmask) << 4u)), x2)
         + dot(u8x4(((q.w >> sh) & m) | (((h.w >> hsh) & hmask) << 4u)), x3);
}
#endif

struct V8 { a: vec4<f32>, b: vec4<f32> }

// Bytes to floats without int-to-float conversions (a quarter-rate instruction on NVIDIA, and the
// GEMVs' bottleneck there): byte b placed in the mantissa of 2^23 reads as 2^23 + b exactly.
const MAGIC: u32 = 0x4B000000u;      // 2^23 as f32 bits
fn u8x4(v: u32) -> vec4<f32> {
    let m = vec4<u32>(v & 255u, (v >> 8u) & 255u, (v >> 16u) & 255u, v >> 24u) | vec4<u32>(MAGIC);
    return bitcast<vec4<f32>>(m) - vec4<f32>(8388608.0);
}

fn i8x4(v: u32) -> vec4<f32> {
    // flip the sign bits: signed byte s becomes s + 128 unsigned
    return u8x4(v ^ 0x80808080u) - vec4<f32>(128.0);
}

// Scale of block `blk` from the split f16 array (two halves per word).
fn split_d(blk: u32) -> f32 {
    let v = word(p.dbase + (blk >> 1u));
    return unpack2x16float(select(v, v >> 16u, (blk & 1u) == 1u)).x;
}


// Q4_K / Q5_K packed 6-bit scales and mins.
// ggml get_scale_min_k4 on the scale words a (bytes 0-3), b (4-7), c (8-11):
//   s < 4:  sc = byte s & 63,                       mn = byte s+4 & 63
//   s >= 4: sc = (byte s+4 & 15) | (byte s-4 >> 6) << 4,   mn = (byte s+4 >> 4) | (byte s >> 6) << 4
// Returns vec2(sc, mn).
fn k4_scale_min(a: u32, b: u32, c: u32, s: u32) -> vec2<u32> {
    let sh = (s & 3u) * 8u;
    let lo = vec2<u32>((a >> sh) & 63u, (b >> sh) & 63u);
    let hi = vec2<u32>(((c >> sh) & 15u) | ((a >> (sh + 2u)) & 0x30u),
                       ((c >> (sh + 4u)) & 15u) | ((b >> (sh + 2u)) & 0x30u));
    return select(hi, lo, s < 4u);
}

// Q4_K / Q5_K chunk c's two sub-blocks (2 (c >> 1) in the low nibbles, the next in the high ones) from
// the block's first vec4 h: (d * sc_lo, d * sc_hi, dmin * mn_lo, dmin * mn_hi).
fn k4_chunk_scales(h: vec4<u32>, c: u32) -> vec4<f32> {
    let dm = unpack2x16float(h.x);
    let s0 = (c >> 1u) * 2u;
    let a = k4_scale_min(h.y, h.z, h.w, s0);
    let b = k4_scale_min(h.y, h.z, h.w, s0 + 1u);
    return vec4<f32>(dm.x * f32(a.x), dm.x * f32(b.x), dm.y * f32(a.y), dm.y * f32(b.y));
}
