// The gated FFN's activation: ACT_GELU, tanh-approximated GELU (Gemma); otherwise SiLU (Llama's SwiGLU).
fn act(g: f32) -> f32 {
#if ACT_GELU
    return 0.5 * g * (1.0 + tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0)));
#else
    return g / (1.0 + exp(-g));
#endif
}

// The gated FFN's output from its gate and up values: act(g) * u; with ACT_OAI gpt-oss's clamped
// SwiGLU, (min(g, LIMIT) * sigmoid(ALPHA * min(g, LIMIT))) * (clamp(u, -LIMIT, LIMIT) + 1).
fn glu_act(g: f32, u: f32) -> f32 {
#if ACT_OAI
    let gc = min(g, {{LIMIT}});
    return gc / (1.0 + exp(-{{ALPHA}} * gc)) * (clamp(u, -{{LIMIT}}, {{LIMIT}}) + 1.0);
#else
    return act(g) * u;
#endif
}
