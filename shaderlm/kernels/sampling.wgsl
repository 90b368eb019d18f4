// A sequence's settings (ops.sample_params): the sampler's, and how many of the most likely tokens its
// logprobs rows give (sample.wgsl's LOGPROBS). One per serving slot, or the single stream's uniform.
struct Sampling { vocab: u32, top_k: u32, temperature: f32, top_p: f32, seed: u32, top_logprobs: u32, _b: u32, _c: u32 }
