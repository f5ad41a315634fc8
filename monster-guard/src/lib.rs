//! Quality-gated admission, signed capability grants, leases and revocation.
