//! Splits a KNOT into per-node shards and plans node layer ranges by node RAM.
