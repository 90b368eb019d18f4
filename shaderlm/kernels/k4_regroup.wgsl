// Q4_K / Q5_K block headers regrouped in place, once, right after upload (gpu/weights.py). The header
// (a block's first 16 bytes: d | dmin << 16, then 12 bytes of 6-bit scales and mins packed as ggml's
// get_scale_min_k4 reads them) becomes, bit for bit the same information:
//   word p (0..3): bytes (sc[2p], sc[2p+1], mn[2p], mn[2p+1]) in their low 6 bits, and as the top
//   2 bits of byte j, bits 8j + 2p and 8j + 2p + 1 of d | dmin << 16 (quant_common.wgsl's k4_dmin).
// A decode-GEMV lane then gets its chunk's two scales and two mins from one word: unpacking the
// GGUF form in every GEMV cost a measurable share of a Q4_K_M decode step.
struct P { blocks: u32, qw: u32, row: u32, _a: u32 }     // row: blocks per grid row (x)
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> w: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x + gid.y * p.row;
    if (b >= p.blocks) { return; }
    let o = b * p.qw;
    let d = w[o];
    let a = w[o + 1u];            // scale bytes 0-3: sc 0-3 (low 6 bits), top bits of sc 4-7
    let m = w[o + 2u];            // bytes 4-7: mn 0-3, top bits of mn 4-7
    let c = w[o + 3u];            // bytes 8-11: low nibbles sc 4-7, high nibbles mn 4-7
    let sc_lo = a & 0x3F3F3F3Fu;
    let mn_lo = m & 0x3F3F3F3Fu;
    let sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2u) & 0x30303030u);
    let mn_hi = ((c >> 4u) & 0x0F0F0F0Fu) | ((m >> 2u) & 0x30303030u);
    let m2 = vec4<u32>(0x03030303u);
    let top = ((vec4<u32>(d) >> vec4<u32>(0u, 2u, 4u, 6u)) & m2) << vec4<u32>(6u);
    w[o] = (sc_lo & 0xFFFFu) | (mn_lo << 16u) | top.x;
    w[o + 1u] = (sc_lo >> 16u) | (mn_lo & 0xFFFF0000u) | top.y;
    w[o + 2u] = (sc_hi & 0xFFFFu) | (mn_hi << 16u) | top.z;
    w[o + 3u] = (sc_hi >> 16u) | (mn_hi & 0xFFFF0000u) | top.w;
}
