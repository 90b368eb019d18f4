// The int8 GEMMs' parameters and bindings (matmul_q8.wgsl, matmul_few.wgsl): the weight words w, x as
// quantize_q8.wgsl writes it (words xq, scales xd and, for types with mins (MINS), sums xs), the output
// y and, with BIAS, the bias. max_tokens: x's rows at most, what the host's buffers hold (and a slice of
// matmul_q8's PARTIALS).
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, first_from_state: u32, max_tokens: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> w: array<WeightWord>;      // vec4s with W4 (the types with raw8)
@group(0) @binding(3) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> xd: array<vec2<f32>>;
#if MINS
@group(0) @binding(5) var<storage, read> xs: array<vec2<f32>>;
#endif
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(7) var<storage, read> bias: array<f32>;
#endif
