// Log-sum-exp partials of a serving step's logits rows, for the batched sampler's LOGPROBS
// (sample.wgsl): workgroup (part, b) reads part `part` of batch row b, WG x U vec4s (each thread's U
// loads issued before any is used), and writes the part's largest logit m and the sum of exp(v - m)
// over it. The sampler then combines a row's PARTS pairs, where its single workgroup would otherwise
// pass over the whole row alone (a vocabulary's exps on one multiprocessor).
#include reduce

const WG: u32 = {{WG}}u;
const U: u32 = {{U}}u;
const VOCAB: u32 = {{VOCAB}}u;
const N4: u32 = (VOCAB + 3u) / 4u;           // a row's vec4s (rows of whole vec4s)
const PARTS: u32 = {{PARTS}}u;
const NONE: u32 = 0xFFFFFFFFu;
const LOWEST: f32 = -3.4e38;

@group(0) @binding(0) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> rows: array<u32>;
@group(0) @binding(2) var<storage, read_write> parts: array<vec2<f32>>;

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    red_lane = li;
    let b = wid.y;
    if (rows[b] == NONE) { return; }          // a padding row (the same for the whole workgroup)
    let first = wid.x * WG * U + li;
#unroll U u
    let j$u = first + $uu * WG;
    let live$u = vec4<u32>(4u * j$u) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(VOCAB);
    let v$u = select(vec4<f32>(LOWEST), logits[b * N4 + min(j$u, N4 - 1u)], live$u);
#end
    var m4 = vec4<f32>(LOWEST);
#unroll U u
    m4 = max(m4, v$u);
#end
    let m = wg_max(max(max(m4.x, m4.y), max(m4.z, m4.w)));
    var s4 = vec4<f32>(0.0);
#unroll U u
    s4 += select(vec4<f32>(0.0), exp(v$u - vec4<f32>(m)), live$u);
#end
    let s = wg_sum(s4.x + s4.y + s4.z + s4.w);
    if (li == 0u) { parts[b * PARTS + wid.x] = vec2<f32>(m, s); }
}
