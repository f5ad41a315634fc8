//! Proves split inference equals monolithic inference, bit for bit.
