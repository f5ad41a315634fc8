//! The quality probe: argmax of the next token for given token ids or text.
