// The matmul kernels' output write (gemv_rows, matmul, matmul_tiled): y[o] = s, plus the bias of output
// row `row` (BIAS), or added to y (ACCUMULATE: the residual stream). The including kernel binds y and,
// with BIAS, bias.
fn write_y(o: u32, row: u32, s: f32) {
#if BIAS
    let v = s + bias[row];
#else
    let v = s;
#endif
#if ACCUMULATE
    y[o] += v;
#else
    y[o] = v;
#endif
}
