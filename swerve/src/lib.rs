//! The sliver launcher: runs a command in fresh namespaces + chroot, only for an admitted base.
