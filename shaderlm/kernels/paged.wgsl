// The serving engine's KV cache (PAGED): pages of PAGE positions from one pool per layer, and per
// sequence slot a table of its pages, so short and long sequences share the memory.
const PAGE: u32 = {{PAGE}}u;
const MAXP: u32 = {{MAXP}}u;        // table entries per slot
@group(0) @binding(12) var<storage, read> pages: array<u32>;

// The pool row of position pos of the sequence in slot s.
fn kv_row(s: u32, pos: u32) -> u32 { return pages[s * MAXP + pos / PAGE] * PAGE + pos % PAGE; }
