//! The inference engine (kernels, forward pass, KV cache, tokenizer) and the HTTP station that serves it.
