//! Dropping a process's capabilities to a mask, with raw syscalls only (safe between fork and
//! exec: no allocation, no lock).

/// Linux capability numbers (`linux/capability.h`) the policy and its callers name.
pub mod cap {
    pub const CHOWN: u32 = 0;
    pub const DAC_OVERRIDE: u32 = 1;
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const FOWNER: u32 = 3;
    pub const FSETID: u32 = 4;
    pub const NET_BIND_SERVICE: u32 = 10;
    pub const NET_RAW: u32 = 13;
    pub const SYS_MODULE: u32 = 16;
    pub const SYS_RAWIO: u32 = 17;
    pub const SYS_PTRACE: u32 = 19;
    pub const SYS_PACCT: u32 = 20;
    pub const SYS_ADMIN: u32 = 21;
    pub const SYS_BOOT: u32 = 22;
    pub const SYS_TIME: u32 = 25;
    pub const SYSLOG: u32 = 34;
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Reduces this process's capability sets to `allowed` (bit N = capability N, intersected
/// with what it has): bounding (where CAP_SETPCAP allows; without it the bit stays but cannot
/// be regained through exec under no_new_privs), ambient, inheritable, permitted, effective.
/// Sets no_new_privs first. Returns how many bounding-set bits could not be dropped (0 when
/// the caller held CAP_SETPCAP).
pub fn drop_to(allowed: u64) -> std::io::Result<u32> {
    let last_errno = std::io::Error::last_os_error;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(last_errno());
    }
    let mut kept_in_bounding = 0;
    for n in 0..64u32 {
        if allowed & (1u64 << n) != 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, n as libc::c_ulong, 0, 0, 0) };
        if present < 0 {
            break; // EINVAL: past the kernel's last capability.
        }
        if present == 1 {
            // SAFETY: as above.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, n as libc::c_ulong, 0, 0, 0) } != 0 {
                kept_in_bounding += 1;
            }
        }
        // SAFETY: as above. Lowering an ambient capability is always allowed.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
                n as libc::c_ulong,
                0,
                0,
            )
        };
    }
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData structs (version 3) into `data`, which has room for them.
    if unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    } != 0
    {
        return Err(last_errno());
    }
    for (i, d) in data.iter_mut().enumerate() {
        let keep = (allowed >> (32 * i)) as u32;
        d.effective &= keep;
        d.permitted &= keep;
        d.inheritable &= keep;
    }
    // SAFETY: capset reads the header and two CapData structs; lowering sets is always allowed.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(last_errno());
    }
    Ok(kept_in_bounding)
}
