// Reductions. Kernels set `red_lane = local_invocation_index` first and define WG.
//  wg_sum / wg_max: over the whole workgroup (every thread must call them: they hold barriers).
//  lane_sum / lane_max: over the threads that cooperate on one row. With subgroups that is one
//  subgroup (any size: 8 on lavapipe, 32 NVIDIA, 32/64 AMD): subgroupAdd, no barriers. Without,
//  the row is the whole workgroup and these are wg_sum / wg_max.
var<workgroup> red_buf: array<f32, {{WG}}>;
var<private> red_lane: u32;

fn wg_sum(v: f32) -> f32 {
    red_buf[red_lane] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (red_lane < s) { red_buf[red_lane] += red_buf[red_lane + s]; }
        workgroupBarrier();
    }
    let r = red_buf[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32) -> f32 {
    red_buf[red_lane] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (red_lane < s) { red_buf[red_lane] = max(red_buf[red_lane], red_buf[red_lane + s]); }
        workgroupBarrier();
    }
    let r = red_buf[0];
    workgroupBarrier();
    return r;
}

#if SUBGROUPS
fn lane_sum(v: f32) -> f32 { return subgroupAdd(v); }
#else
fn lane_sum(v: f32) -> f32 { return wg_sum(v); }
#endif
