// RoPE on Q (in place) and K, then K and V into the f16 KV cache at their positions.
// qkv rows: [q (n_heads*hd) | k (n_kv*hd) | v (n_kv*hd)]. Cache rows: pos -> n_kv*hd halves packed in u32
// (PAGED: the pool row of the position in the sequence's pages; BATCH: each batch row its own sequence
// and position: paged.wgsl, batch_rows.wgsl).
#include state
#if PAGED
#include paged
#endif
#if BATCH
#include batch_rows
#endif

struct P { n_heads: u32, n_kv: u32, hd: u32, rope_dim: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;   // rotations per position / (2 pi)
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

#include rope

fn rotate(base: u32, i: u32, pos: u32) -> vec2<f32> {
    let cs = rope_cs(i, pos);
    let ix = pair_index(i);
    let x0 = qkv[base + ix.x];
    let x1 = qkv[base + ix.y];
    return vec2<f32>(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.y;
    if (t >= st.n) { return; }
#if BATCH
    let seq = row_slot(t);
    if (seq == NONE) { return; }
    let pos = row_pos(t, seq);
#else
    let seq = st.seq;
    let pos = st.pos + t;
#endif
    let hd = p.hd;
    let half_hd = hd / 2u;
    let row = t * (p.n_heads + 2u * p.n_kv) * hd;
    let h = wid.x;                       // 0..n_heads-1: query heads; then kv heads
    if (h < p.n_heads) {
        let base = row + h * hd;
        for (var i = li; i < p.rope_dim / 2u; i += 64u) {
            let r = rotate(base, i, pos);
            let ix = pair_index(i);
            qkv[base + ix.x] = r.x;
            qkv[base + ix.y] = r.y;
        }
        return;
    }
    let kh = h - p.n_heads;
    let kbase = row + (p.n_heads + kh) * hd;
    let vbase = row + (p.n_heads + p.n_kv + kh) * hd;
    // rotate K in place (pairs are disjoint across threads), then pack pairs of halves
    for (var i = li; i < p.rope_dim / 2u; i += 64u) {
        let r = rotate(kbase, i, pos);
        let ix = pair_index(i);
        qkv[kbase + ix.x] = r.x;
        qkv[kbase + ix.y] = r.y;
    }
    workgroupBarrier();
    storageBarrier();
#if PAGED
    let co = (kv_row(seq, pos) * p.n_kv + kh) * half_hd;
#else
    let co = (pos * p.n_kv + kh) * half_hd;
#endif
    for (var j = li; j < half_hd; j += 64u) {
        kc[co + j] = pack2x16float(vec2<f32>(qkv[kbase + 2u * j], qkv[kbase + 2u * j + 1u]));
        vc[co + j] = pack2x16float(vec2<f32>(qkv[vbase + 2u * j], qkv[vbase + 2u * j + 1u]));
    }
}
