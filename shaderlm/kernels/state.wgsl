// Per-step values, written by the host before a submit and advanced on the GPU between decode steps.
struct State {
    pos: u32,        // position of the first token of this batch
    n: u32,          // tokens in this batch (the batch rows of a serving step)
    tok: u32,        // index in the token buffer of the first token of this batch
    out_row0: u32,   // first batch row whose logits are computed (n-1 when only the last is needed)
    seq: u32,        // the sequence's slot in a paged KV cache (paged prefill; 0 otherwise)
}
