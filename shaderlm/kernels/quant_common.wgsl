// Shared by the quant/*.wgsl decoders. The including kernel declares:
//   @binding(..) var<storage, read> w: array<WeightWord>;   the weight words (one row-chunk of a
//                tensor): u32, or vec4<u32> with WIDE (the decode GEMV's 16-byte loads) or W4 (the GEMMs')
//   a `p` (uniform, or const in gemv.wgsl) with field dbase: u32   first word of the split-off field
//   array (read from p where needed: a private copy made NVIDIA's Vulkan compiler spill)
// Each decoder defines QK (elements per block), QW (u32 words per block in the main region) and
//   fn dq8(blk: u32, j: u32) -> V8   elements [8j, 8j+8) of block `blk`, in GGUF element order.
// Quantized types also define, for the 8-bit prefill GEMM (matmul_q8.wgsl):
//   fn iq8(blk: u32, j: u32) -> IQ8   the same elements as bytes q with value d * q + m (one (d, m)
//                                    for each run of QuantType.iq8_run elements); m is 0 for the types
//                                    whose QuantType.iq8_min is False (offsets folded into signed q)
// Decoders with a WIDE part (main region a multiple of 16 bytes) also define, for gemv.wgsl:
//   WQK (elements per wide block), CPB (chunks per wide block), both also in formats/quants.py,
//   fn x_chunk(r: XRow, b, c) -> array<vec4<f32>, N>   the x values chunk c of block b multiplies
//                                 (x_runs2 / x_runs4 below, of their vec4 offsets)
// With WIDE the including kernel also declares struct XRow and fn xv(r: XRow, i: u32) -> vec4<f32>,
// x's vec4 i of row r (gemv.wgsl: with the folded RMSNorm's weights, and zeros past a row's end).
//   struct CW, fn chunk_load(blk, c) -> CW   the raw words chunk c of block blk needs (loads only)
//   fn chunk_dot(cw: CW, c, xr) -> f32       sum over the chunk of weight * x
// and, where QuantType.int8_dot, under INT_DOT: fn x_quant(xr) -> XQ2 / XQ4 (xq2 / xq4 below) and a
//   chunk_dot(cw, c, xq) over those instead.
// Where QuantType.raw8, under W4 (w as vec4s: the GEMMs, whose warps span rows):
//   struct Raw8, fn raw8(blk, j) -> Raw8   the words dq8(blk, j) reads, in as few loads as the layout allows
//   fn dq8_raw(r: Raw8, j) -> V8            dq8 of those words
// Where QuantType.raw32, under RAW32 (with W4: matmul_few, which loads a run's words a trip ahead):
//   struct Raw32, fn raw32(blk, s) -> Raw32  the words of run s (32 elements) of block blk
//   fn dq32(r: Raw32, s) -> IQ32             those elements as iq8 gives them, 16 bytes a half

// word j (0..3) of v, by selects (a dynamic index into a vector can put it in local memory)
fn word_of(v: vec4<u32>, j: u32) -> u32 {
    return select(select(v.x, v.y, j == 1u), select(v.z, v.w, j == 3u), j >= 2u);
}

#if WIDE || W4
alias WeightWord = vec4<u32>;
fn word(i: u32) -> u32 { return word_of(w[i >> 2u], i & 3u); }
#else
alias WeightWord = u32;
fn word(i: u32) -> u32 { return w[i]; }
#endif
// words i and i + 1 (i even): with vec4s, in one 16-byte load
#if WIDE || W4
fn words2(i: u32) -> vec2<u32> {
    let v = w[i >> 2u];
    return select(v.xy, v.zw, (i & 2u) != 0u);
}
#else
fn words2(i: u32) -> vec2<u32> { return vec2<u32>(w[i], w[i + 1u]); }
#endif

// 1.5 * 2^23: adding it to a float leaves round(v) in the low mantissa bits; an integer s below 2^22 in
// magnitude added to its bits reads as RND + s
const RND: f32 = 12582912.0;

// WIDE helpers. Every index into an array or vector below is a constant: naga passes arrays by value
// and NVIDIA's compiler put dynamically indexed ones in local memory (10x slower GEMVs, measured).
#if WIDE
// x's vec4s a..a+3 and b..b+3 (and c.., d..): the runs a chunk's weights multiply
fn x_runs2(r: XRow, a: u32, b: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(xv(r, a), xv(r, a + 1u), xv(r, a + 2u), xv(r, a + 3u),
                               xv(r, b), xv(r, b + 1u), xv(r, b + 2u), xv(r, b + 3u));
}
fn x_runs4(r: XRow, a: u32, b: u32, c: u32, d: u32) -> array<vec4<f32>, 16> {
    return array<vec4<f32>, 16>(xv(r, a), xv(r, a + 1u), xv(r, a + 2u), xv(r, a + 3u),
                                xv(r, b), xv(r, b + 1u), xv(r, b + 2u), xv(r, b + 3u),
                                xv(r, c), xv(r, c + 1u), xv(r, c + 2u), xv(r, c + 3u),
                                xv(r, d), xv(r, d + 1u), xv(r, d + 2u), xv(r, d + 3u));
}

// Sum of the 4 lanes of v (x runs' sums, for the min/offset terms).
fn hsum(v: vec4<f32>) -> f32 { return dot(v, vec4<f32>(1.0)); }

// 16 4-bit quants as bytes (nibble at bit `sh` of each byte of q), and with extra high bits
// (| ((h's bytes >> hsh) & hmask) << 4): the words both the float and the int8-x dots take.
fn nib(q: vec4<u32>, sh: u32) -> vec4<u32> { return (q >> vec4<u32>(sh)) & vec4<u32>(0x0F0F0F0Fu); }
fn nib_hi(q: vec4<u32>, sh: u32, h: vec4<u32>, hsh: u32, hmask: u32) -> vec4<u32> {
    return nib(q, sh) | (((h >> vec4<u32>(hsh)) & vec4<u32>(hmask)) << vec4<u32>(4u));
}
// 16 unsigned bytes (four words) dotted with 16 x values.
fn dot_u8(b: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    return dot(u8x4(b.x), x0) + dot(u8x4(b.y), x1) + dot(u8x4(b.z), x2) + dot(u8x4(b.w), x3);
}

#if INT_DOT
// INT_DOT: the decode GEMV rounds each 16-element run of x to integers with one f32 scale d and dots
// weight bytes with dot4I8Packed: integer dots replace the per-weight float conversions.
// x_run -> QRun: the run's integer words, d, and s (the run's x sum, for offset/min terms); rdot(w, r) is
// d * (the weight bytes dotted with the run's integers).
//   without X24 (int8 activations, GPUs' default; not exact): int8, d = max|x| / 127; s = d * (sum of the ints).
//   X24 (--exact, and CPU adapters' default, where the type has these decoders): 24-bit fixed point,
//   as accurate as f32 arithmetic (below). s = the f32 sum of the run.
fn abs_max(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>) -> f32 {
    let m = max(max(abs(a), abs(b)), max(abs(c), abs(e)));
    return max(max(m.x, m.y), max(m.z, m.w));
}
#if X24
// X24: x = d * X with d a power of two (so x * (1 / d) is exact) and |X| < 2^22: X rounds x to 22
// bits below the run's largest exponent, an error under 4 f32 ulps of the run's largest element (the
// f32 dot's own rounding is of that order). X is kept as three signed byte digits, X = 65536 q2 +
// 256 q1 + q0 (q0, q1 in [-128, 128), from U = X + 0x8080), so weight bytes of any sign dot each digit
// with dot4I8Packed, and the three dots combine in f32.
struct QRun { q: vec4<u32>, q1: vec4<u32>, q2: vec4<u32>, d: f32, s: f32 }
struct Digits { d0: u32, d1: u32, d2: u32 }
fn x24_word(v: vec4<f32>, inv: f32) -> Digits {
    // bits of v * inv + RND are 0x4B400000 + X: one subtraction makes U = X + 0x8080
    let u = bitcast<vec4<u32>>(v * inv + vec4<f32>(RND)) - vec4<u32>(0x4B400000u - 0x8080u);
    // bytes transposed in two interleaving rounds (each a shift and a mask-merge)
    let m = 0x00FF00FFu;
    let t0 = (u.x & m) | ((u.y << 8u) & ~m);          // x.b0 y.b0 x.b2 y.b2
    let t1 = ((u.x >> 8u) & m) | (u.y & ~m);          // x.b1 y.b1 x.b3 y.b3
    let t2 = (u.z & m) | ((u.w << 8u) & ~m);
    let t3 = ((u.z >> 8u) & m) | (u.w & ~m);
    return Digits(((t0 & 0xFFFFu) | (t2 << 16u)) ^ 0x80808080u, ((t1 & 0xFFFFu) | (t3 << 16u)) ^ 0x80808080u,
                  (t0 >> 16u) | (t2 & 0xFFFF0000u));
}
fn x_run(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>) -> QRun {
    // |x| < 2^(eb - 126): inv = 2^(148 - eb) keeps |X| < 2^22; eb >= 22 keeps inv a normal float
    let eb = max(bitcast<u32>(abs_max(a, b, c, e)) >> 23u, 22u);
    let inv = bitcast<f32>((275u - eb) << 23u);
    let wa = x24_word(a, inv);
    let wb = x24_word(b, inv);
    let wc = x24_word(c, inv);
    let we = x24_word(e, inv);
    return QRun(vec4<u32>(wa.d0, wb.d0, wc.d0, we.d0), vec4<u32>(wa.d1, wb.d1, wc.d1, we.d1),
                vec4<u32>(wa.d2, wb.d2, wc.d2, we.d2), bitcast<f32>((eb - 21u) << 23u), hsum(a + b + c + e));
}
fn rdot(wb: vec4<u32>, r: QRun) -> f32 {
    return r.d * (65536.0 * f32(idot(wb, r.q2)) + f32(256 * idot(wb, r.q1) + idot(wb, r.q)));
}
#else
struct QRun { q: vec4<u32>, d: f32, s: f32 }
fn q8_word(v: vec4<f32>, inv: f32) -> u32 {
    let b = bitcast<vec4<u32>>(v * inv + vec4<f32>(RND)) & vec4<u32>(255u);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}
fn x_run(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>) -> QRun {
    let amax = abs_max(a, b, c, e);
    let inv = select(127.0 / amax, 0.0, amax == 0.0);
    let q = vec4<u32>(q8_word(a, inv), q8_word(b, inv), q8_word(c, inv), q8_word(e, inv));
    let d = amax / 127.0;
    return QRun(q, d, d * f32(idot(q, vec4<u32>(0x01010101u))));
}
fn rdot(wb: vec4<u32>, r: QRun) -> f32 { return r.d * f32(idot(wb, r.q)); }
#endif
struct XQ2 { lo: QRun, hi: QRun }
struct XQ4 { r0: QRun, r1: QRun, r2: QRun, r3: QRun }
fn xq2(xr: array<vec4<f32>, 8>) -> XQ2 {
    return XQ2(x_run(xr[0], xr[1], xr[2], xr[3]), x_run(xr[4], xr[5], xr[6], xr[7]));
}
fn xq4(xr: array<vec4<f32>, 16>) -> XQ4 {
    return XQ4(x_run(xr[0], xr[1], xr[2], xr[3]), x_run(xr[4], xr[5], xr[6], xr[7]),
               x_run(xr[8], xr[9], xr[10], xr[11]), x_run(xr[12], xr[13], xr[14], xr[15]));
}
// 16 signed bytes (a) dotted with 16 signed bytes (b).
fn idot(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}
#endif
#endif

struct V8 { a: vec4<f32>, b: vec4<f32> }
// 8 elements as two words of bytes q, each in [-128, 127]: element = d * q + m.
struct IQ8 { q: vec2<u32>, d: f32, m: f32 }
// A run of 32 elements as bytes q (a: elements 0..15, b: 16..31) with (d, m) for each half (the same
// for types whose runs are 32 long): element = d * q + m.
struct IQ32 { a: vec4<u32>, b: vec4<u32>, d: vec2<f32>, m: vec2<f32> }

// Bytes q in [0, 2 off) of a word as the signed bytes q - off: each byte plus 128 - off stays below
// 256 (no carry into the next), and flipping its top bit subtracts 128.
fn signed_bytes(q: vec2<u32>, off: u32) -> vec2<u32> {
    return (q + vec2<u32>((128u - off) * 0x01010101u)) ^ vec2<u32>(0x80808080u);
}

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


// Q4_K / Q5_K block header h (its first 16 bytes) as k4_regroup.wgsl regroups it at upload: word p
// (0..3) holds sub-blocks 2p and 2p+1, bytes (sc[2p], sc[2p+1], mn[2p], mn[2p+1]) in their low 6 bits;
// the bytes' top 2 bits carry d | dmin << 16 (bits 8j + 2p, +1 in byte j of word p).
fn k4_dmin(h: vec4<u32>) -> vec2<f32> {
    return unpack2x16float(((h.x >> 6u) & 0x03030303u) | ((h.y >> 4u) & 0x0C0C0C0Cu) |
                           ((h.z >> 2u) & 0x30303030u) | (h.w & 0xC0C0C0C0u));
}
// Sub-block pair `pair`'s word: bytes (sc, sc', mn, mn'), the top bits cleared.
fn k4_pair(h: vec4<u32>, pair: u32) -> u32 {
    return word_of(h, pair) & 0x3F3F3F3Fu;
}

// (d * sc[s], dmin * mn[s]) of sub-block s of the Q4_K / Q5_K block at word o (the dq8 decoders).
fn k4_sub_scales(o: u32, s: u32) -> vec2<f32> {
    return k4_scales(vec4<u32>(word(o), word(o + 1u), word(o + 2u), word(o + 3u)), s);
}
// The same from the block's 4 header words h.
fn k4_scales(h: vec4<u32>, s: u32) -> vec2<f32> {
    let v = k4_pair(h, s >> 1u) >> ((s & 1u) * 8u);          // sc at byte s & 1, mn two bytes up
    return k4_dmin(h) * vec2<f32>(f32(v & 255u), f32((v >> 16u) & 255u));
}
// (d * sc, dmin * mn) applied to a run's bytes q
fn k4_values(q: vec2<u32>, sm: vec2<f32>) -> V8 { return V8(u8x4(q.x) * sm.x - sm.y, u8x4(q.y) * sm.x - sm.y); }

#if WIDE
// Q4_K / Q5_K chunk c (0..7) of wide block b: x elements 16 (c & 1) .. +16 of sub-blocks 2 (c >> 1)
// (the qs low nibbles) and the next one (the high nibbles).
fn k4_x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> {
    let o = b * 64u + (c >> 1u) * 16u + (c & 1u) * 4u;
    return x_runs2(r, o, o + 8u);
}
#endif

// Q4_K / Q5_K chunk c's two sub-blocks (2 (c >> 1) in the low nibbles, the next in the high ones) from
// the block's first vec4 h: (d * sc_lo, d * sc_hi, dmin * mn_lo, dmin * mn_hi).
fn k4_chunk_scales(h: vec4<u32>, c: u32) -> vec4<f32> {
    let dm = k4_dmin(h);
    let m = k4_pair(h, c >> 1u);
    // each byte converted on its own: faster than the 2^23 trick, a vector shift-and-mask or
    // unpack4xU8 (docs/performance.md)
    let v = vec4<f32>(f32(m & 255u), f32((m >> 8u) & 255u), f32((m >> 16u) & 255u), f32(m >> 24u));
    return vec4<f32>(dm.x, dm.x, dm.y, dm.y) * v;
}
