//! Network setup: raising `lo` and addressing `eth0` inside the sliver with plain ioctls (no `ip`
//! binary is needed inside), and the host end of a veth pair (which shells out to the host's
//! iproute2 `ip`, the one external dependency, documented in `--help`).

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::error::{Result, SwerveError};

fn step_err(step: String) -> impl FnOnce(Errno) -> SwerveError {
    move |errno| SwerveError::Step { step, errno }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    r
}

fn inet_socket() -> Result<OwnedFd> {
    socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(step_err("socket(AF_INET, SOCK_DGRAM)".into()))
}

/// Sets IFF_UP (and IFF_RUNNING) on interface `name`.
pub fn link_up(name: &str) -> Result<()> {
    let sock = inet_socket()?;
    let mut r = ifreq(name);
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own; the fd is a valid socket.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut r) })
        .map_err(step_err(format!("ioctl(SIOCGIFFLAGS, {name})")))?;
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the initialised one.
    unsafe {
        r.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &r) })
        .map_err(step_err(format!("ioctl(SIOCSIFFLAGS, {name}, IFF_UP)")))?;
    Ok(())
}

fn sockaddr_in(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) on Linux.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Gives interface `name` the address `ip/prefix` and raises it.
pub fn set_ipv4(name: &str, ip: Ipv4Addr, prefix: u8) -> Result<()> {
    let sock = inet_socket()?;
    let mut r = ifreq(name);
    r.ifr_ifru.ifru_addr = sockaddr_in(ip);
    // SAFETY: SIOCSIFADDR reads the ifreq we own.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR as _, &r) })
        .map_err(step_err(format!("ioctl(SIOCSIFADDR, {name}, {ip})")))?;
    let mask = Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0));
    let mut r = ifreq(name);
    r.ifr_ifru.ifru_netmask = sockaddr_in(mask);
    // SAFETY: SIOCSIFNETMASK reads the ifreq we own.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK as _, &r) })
        .map_err(step_err(format!("ioctl(SIOCSIFNETMASK, {name}, {mask})")))?;
    link_up(name)
}

/// Host side of a veth pair: creates `host_if` with peer `eth0` inside `pid`'s network namespace,
/// addresses and raises `host_if`. Uses the host's `ip` (iproute2).
pub fn veth_host(host_if: &str, pid: i32, host_ip: Ipv4Addr, prefix: u8) -> Result<()> {
    let pid = pid.to_string();
    let addr = format!("{host_ip}/{prefix}");
    let cmds: [Vec<&str>; 3] = [
        vec![
            "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ],
        vec!["addr", "add", &addr, "dev", host_if],
        vec!["link", "set", host_if, "up"],
    ];
    for args in cmds {
        let step = format!("ip {}", args.join(" "));
        let out = Command::new("ip")
            .args(&args)
            .output()
            .map_err(|e| SwerveError::StepOther {
                step: step.clone(),
                reason: format!("{e} (--net veth needs iproute2's `ip` on the host)"),
            })?;
        if !out.status.success() {
            return Err(SwerveError::StepOther {
                step,
                reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}
