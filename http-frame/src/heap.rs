//! Giving the allocator's free pages back to the kernel when a server goes idle.

/// Asks the allocator to give freed pages back, for a server that just went idle: glibc keeps
/// what its worker threads freed in per-thread arenas otherwise (the soak's station stayed ~80%
/// above its start RSS). musl returns large frees by itself.
pub fn return_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap under its locks; no pointer of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}
