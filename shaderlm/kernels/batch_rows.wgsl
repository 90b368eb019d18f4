// A batched serving step (BATCH): per row the sequence slot it serves (NONE for a padding row), and
// per slot the position of the token it feeds next.
// RAGGED (a prompt pass over several sequences): `rows` holds RSEQS entries of (first row, rows, slot,
// first position), one a sequence in the pass, then per row its (slot, position).
const NONE: u32 = 0xFFFFFFFFu;
@group(0) @binding(10) var<storage, read> rows: array<u32>;
@group(0) @binding(11) var<storage, read> seq_pos: array<u32>;

#if RAGGED
const RSEQS: u32 = {{RSEQS}}u;
fn row_slot(t: u32) -> u32 { return rows[4u * RSEQS + 2u * t]; }
fn row_pos(t: u32, s: u32) -> u32 { return rows[4u * RSEQS + 2u * t + 1u]; }
#else
fn row_slot(t: u32) -> u32 { return rows[t]; }
fn row_pos(t: u32, s: u32) -> u32 { return seq_pos[s]; }
#endif
