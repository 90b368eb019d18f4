// Streaming read bandwidth probe: every thread sums UNROLL vec4<u32> loads per step of a grid-stride
// loop over the buffer and writes one value, so no load can be optimised away.
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

const UNROLL: u32 = {{UNROLL}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = arrayLength(&src);
    let stride = nwg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < n; i += stride * UNROLL) {
        for (var u = 0u; u < UNROLL; u++) {
            let j = i + u * stride;
            if (j < n) { acc ^= src[j]; }
        }
    }
    out[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
