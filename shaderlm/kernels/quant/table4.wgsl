// 4-bit indices into a table of 16 signed bytes (IQ4_NL, IQ4_XS): the decoder that includes this sets
// KV0..KV3, the table as bytes, 4 a word.

// A word of 4 indices (bytes 0..15) -> the word of their 4 table values (int8 bytes): each byte picks
// its table word with two selects (no array indexing) and its byte with a shift.
fn kv_bytes(v: u32) -> u32 {
    let i = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
    let b4 = (i & vec4<u32>(4u)) != vec4<u32>(0u);
    let t = select(select(vec4<u32>(KV0), vec4<u32>(KV1), b4), select(vec4<u32>(KV2), vec4<u32>(KV3), b4),
                   i >= vec4<u32>(8u));
    let b = ((t >> ((i & vec4<u32>(3u)) * 8u)) & vec4<u32>(255u)) << vec4<u32>(0u, 8u, 16u, 24u);
    return b.x | b.y | b.z | b.w;
}

#include quant/nibble_values
