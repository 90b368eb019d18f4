// The serving engine's KV cache (PAGED): pages of PAGE positions from one pool per layer, and per
// sequence slot a table of its pages, so short and long sequences share the memory. A batched
// decode step (BATCH) also has per row the slot it serves (rows; NONE for a padding row) and per
// slot the position of the token it feeds next (seq_pos). The including kernel declares the
// bindings it uses among these three.
const PAGE: u32 = {{PAGE}}u;
const MAXP: u32 = {{MAXP}}u;        // table entries per slot
const NONE: u32 = 0xFFFFFFFFu;

// The pool row of position pos of the sequence in slot s.
fn kv_row(s: u32, pos: u32) -> u32 { return pages[s * MAXP + pos / PAGE] * PAGE + pos % PAGE; }
