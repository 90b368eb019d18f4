// kv_at: the cache row holding position `pos` of the sequence in slot s, in a paged KV cache (PAGED,
// paged.wgsl) or a sequence's own cache (the position itself).
#if PAGED
#include paged
#endif

fn kv_at(s: u32, pos: u32) -> u32 {
#if PAGED
    return kv_row(s, pos);
#else
    return pos;
#endif
}
