// Reports the subgroup size the driver picked for a 64-wide workgroup.
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_size) sgs: u32) {
    if (li == 0u) { out[0] = sgs; }
}
