// A batched serving step (BATCH): per row the sequence slot it serves (NONE for a padding row), and
// per slot the position of the token it feeds next.
const NONE: u32 = 0xFFFFFFFFu;
@group(0) @binding(10) var<storage, read> rows: array<u32>;
@group(0) @binding(11) var<storage, read> seq_pos: array<u32>;
