//! Byte-level BPE tokenizer built from the model's own metadata.
